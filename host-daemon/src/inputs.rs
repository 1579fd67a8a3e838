//! Bounds on what a request may ask for, checked before anything is done
//! for it: a sandbox's metadata and environment (kept in the state
//! database, sent with every exec, listed by every `GET`), and shapes this
//! host could never admit (answered at once with the reason, instead of
//! building a template for them first).

use crate::admission::Limits;
use crate::{ApiError, ApiResult};
use std::collections::BTreeMap;

/// Bounds of a string map.
#[derive(Debug, Clone, Copy)]
pub struct MapBounds {
    /// What the map is, in messages.
    pub what: &'static str,
    /// Most keys.
    pub keys: usize,
    /// Longest key (bytes).
    pub key_bytes: usize,
    /// Longest value (bytes).
    pub value_bytes: usize,
    /// Most bytes of keys and values together.
    pub total_bytes: usize,
}

/// A sandbox's metadata: labels to find it by.
pub const METADATA: MapBounds = MapBounds {
    what: "metadata",
    keys: 64,
    key_bytes: 128,
    value_bytes: 1024,
    total_bytes: 16 * 1024,
};

/// A sandbox's environment (every exec gets it; well within one agent
/// message with the exec's own).
pub const ENV: MapBounds = MapBounds {
    what: "env",
    keys: 256,
    key_bytes: 256,
    value_bytes: 32 * 1024,
    total_bytes: 256 * 1024,
};

/// Checks `m` against `b` (400 with the bound passed).
pub fn check_map(m: &BTreeMap<String, String>, b: &MapBounds) -> ApiResult<()> {
    let w = b.what;
    if m.len() > b.keys {
        return Err(ApiError::BadRequest(format!(
            "{w}: {} keys, at most {}",
            m.len(),
            b.keys
        )));
    }
    let mut total = 0usize;
    for (k, v) in m {
        if k.is_empty() || k.len() > b.key_bytes {
            return Err(ApiError::BadRequest(format!(
                "{w} key of {} bytes: expected 1..={} bytes",
                k.len(),
                b.key_bytes
            )));
        }
        if v.len() > b.value_bytes {
            let shown: String = k.chars().take(32).collect();
            return Err(ApiError::BadRequest(format!(
                "{w} value of {shown:?}: {} bytes, at most {}",
                v.len(),
                b.value_bytes
            )));
        }
        total += k.len() + v.len();
    }
    if total > b.total_bytes {
        return Err(ApiError::BadRequest(format!(
            "{w}: {total} bytes in all, at most {}",
            b.total_bytes
        )));
    }
    Ok(())
}

/// Refuses (400) a sandbox shape this host could never admit, with the
/// limit it passes: more guest memory than the host has or than the
/// memory budget, more vCPUs than the host has CPUs or than the vCPU
/// budget. (A host short of memory right now is admission's 503.)
pub fn check_servable(l: &Limits, vcpus: u32, memory_mib: u32) -> ApiResult<()> {
    let mem = u64::from(memory_mib);
    let most_mem = l.host_memory_mib.min(l.memory_budget_mib());
    if mem > most_mem {
        return Err(ApiError::BadRequest(format!(
            "memory_mib {memory_mib}: this host can run sandboxes of at most {most_mem} MiB \
             ({} MiB of memory, a budget of {} MiB)",
            l.host_memory_mib,
            l.memory_budget_mib()
        )));
    }
    let most_cpus = l.host_cpus.min(l.vcpu_budget());
    if u64::from(vcpus) > most_cpus {
        return Err(ApiError::BadRequest(format!(
            "vcpus {vcpus}: this host can run sandboxes of at most {most_cpus} vCPUs \
             ({} CPUs, a budget of {} vCPUs)",
            l.host_cpus,
            l.vcpu_budget()
        )));
    }
    Ok(())
}

/// Refuses (400) a sandbox whose disk reservation (its memory and scratch
/// disk, [`crate::admission::disk_need_mib`]) exceeds the whole disk
/// budget.
pub fn check_disk_servable(
    l: &Limits,
    memory_mib: u32,
    upper_disk_mib: Option<u32>,
) -> ApiResult<()> {
    let need = crate::admission::disk_need_mib(memory_mib, upper_disk_mib);
    if l.disk_budget_mib > 0 && need > l.disk_budget_mib {
        return Err(ApiError::BadRequest(format!(
            "a sandbox of {memory_mib} MiB with a {} MiB scratch disk reserves {need} MiB of \
             disk; this host's disk budget is {} MiB",
            upper_disk_mib.unwrap_or(0),
            l.disk_budget_mib
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(n: usize, k: usize, v: usize) -> BTreeMap<String, String> {
        (0..n)
            .map(|i| (format!("{i:0k$}"), "v".repeat(v)))
            .collect()
    }

    fn refused(r: ApiResult<()>) -> String {
        let e = r.expect_err("refused");
        assert_eq!(e.status(), 400, "{e}");
        e.to_string()
    }

    #[test]
    fn maps_are_bounded_in_keys_sizes_and_total() {
        check_map(&map(64, 8, 200), &METADATA).unwrap();
        check_map(&BTreeMap::new(), &METADATA).unwrap();
        assert!(refused(check_map(&map(100_000, 8, 1), &METADATA)).contains("100000 keys"));
        assert!(refused(check_map(&map(1, 8, 100 << 20), &METADATA)).contains("at most 1024"));
        assert!(refused(check_map(&map(1, 200, 1), &METADATA)).contains("key of 200 bytes"));
        let empty = BTreeMap::from([(String::new(), "v".to_string())]);
        assert!(refused(check_map(&empty, &ENV)).contains("key of 0 bytes"));
        assert!(refused(check_map(&map(40, 8, 1000), &METADATA)).contains("in all"));
        assert!(refused(check_map(&map(20, 8, 32 * 1024), &ENV)).contains("in all"));
    }

    #[test]
    fn shapes_the_host_cannot_run_are_refused_with_the_limit() {
        let l = Limits {
            host_memory_mib: 24 * 1024,
            host_cpus: 2,
            memory_overcommit: 8.0,
            cpu_overcommit: 1024.0,
            min_available_mib: 1024,
            max_vms: 4000,
            disk_budget_mib: 0,
            min_free_disk_mib: 0,
            disk_overcommit: 1.0,
        };
        check_servable(&l, 2, 24 * 1024).unwrap();
        let m = refused(check_servable(&l, 1, 64 * 1024));
        assert!(m.contains("at most 24576 MiB"), "{m}");
        let m = refused(check_servable(&l, 32, 128));
        assert!(m.contains("at most 2 vCPUs"), "{m}");
        let tight = Limits {
            memory_overcommit: 0.01,
            ..l
        };
        let m = refused(check_servable(&tight, 1, 512));
        assert!(m.contains("at most 245 MiB"), "{m}");
    }

    #[test]
    fn creates_with_unbounded_inputs_or_impossible_shapes_answer_at_once() {
        use crate::listen::tests::{Served, ALICE};
        let s = Served::start(crate::listen::HttpLimits::default());
        let create = |body: &str| {
            let t0 = std::time::Instant::now();
            let r = if body.len() > 1 << 20 {
                // Only the head and a little of the body: the answer
                // comes without the rest (and is not lost to a reset).
                use std::io::Write;
                let mut c = std::net::TcpStream::connect(s.addr).unwrap();
                c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                    .unwrap();
                write!(
                    c,
                    "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\
                     Content-Length: {}\r\n\r\n{}",
                    body.len(),
                    &body[..4096]
                )
                .unwrap();
                crate::listen::tests::answer(&mut c)
            } else {
                s.tcp(Some(ALICE), "POST", "/v1/sandboxes", body)
            };
            assert!(t0.elapsed().as_secs() < 5, "{:?}", t0.elapsed());
            r
        };
        let meta = |n: usize, v: usize| {
            let m: BTreeMap<String, String> =
                (0..n).map(|i| (format!("k{i}"), "v".repeat(v))).collect();
            serde_json::json!({"image": "tiny", "metadata": m}).to_string()
        };
        for (body, status, want) in [
            (meta(100_000, 1), 413, "payload_too_large"),
            (meta(1, 4 << 20), 413, "payload_too_large"),
            (meta(65, 1), 400, "65 keys"),
            (meta(1, 2000), 400, "2000 bytes"),
            (
                serde_json::json!({"image": "tiny", "env": {"A": "x".repeat(40_000)}}).to_string(),
                400,
                "env value",
            ),
            (
                r#"{"image":"tiny","memory_mib":65536}"#.to_string(),
                400,
                "at most 8192 MiB",
            ),
            (
                r#"{"image":"tiny","vcpus":32}"#.to_string(),
                400,
                "at most 4 vCPUs",
            ),
        ] {
            let (st, b) = create(&body);
            assert_eq!(st, status, "{b}");
            assert!(b.contains(want), "{want:?} not in {b}");
        }
        let (st, b) = s.tcp(
            Some(ALICE),
            "POST",
            "/v1/templates",
            r#"{"name":"big","image":"tiny","memory_mib":65536}"#,
        );
        assert_eq!(st, 400, "{b}");
        // An exec's own environment has the same bounds.
        let env: BTreeMap<String, String> =
            (0..300).map(|i| (format!("K{i}"), "v".into())).collect();
        let body = serde_json::json!({"cmd": ["true"], "env": env}).to_string();
        for path in ["exec", "exec/stream"] {
            let (st, b) = s.tcp(
                Some(ALICE),
                "POST",
                &format!("/v1/sandboxes/0123456789ab/{path}"),
                &body,
            );
            assert_eq!(st, 400, "{b}");
            assert!(b.contains("env: 300 keys"), "{b}");
        }
    }
}
