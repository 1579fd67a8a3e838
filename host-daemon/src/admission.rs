//! Admission: a new VMM is admitted only while the reserved guest memory
//! and vCPUs stay within the host's size times an overcommit ratio, the
//! host still has real memory available, the sandbox count is under its
//! cap, and the disk every sandbox may fill (its scratch disk, and its
//! memory when paused: paused sandboxes hold theirs, [`disk_need_mib`])
//! stays within the disk budget and leaves the reserve free on the state
//! filesystem. A full host answers 429 (quota: retry after removing
//! sandboxes) or 503 (the host itself is short of memory or disk) instead
//! of degrading every sandbox on it.

use super::db::Usage;
use std::path::Path;

/// Limits, from the daemon's command line (the type `GET /v1/stats`
/// shows).
pub use shoal_api::Limits;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The reservation quota is full (HTTP 429).
    #[error("{0}")]
    Quota(String),
    /// The host is short of real memory (HTTP 503).
    #[error("{0}")]
    HostPressure(String),
}

impl Refusal {
    /// Label for the refusals metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Quota(m) if m.contains("disk") => "disk_quota",
            Refusal::Quota(m) if m.contains("memory") => "memory_quota",
            Refusal::Quota(m) if m.contains("vCPU") => "cpu_quota",
            Refusal::Quota(_) => "max_sandboxes",
            Refusal::HostPressure(m) if m.contains("disk") => "host_disk",
            Refusal::HostPressure(_) => "host_memory",
        }
    }
}

/// Whether one more VMM of `vcpus` and `memory_mib` fits, given `usage`
/// and the host's MemAvailable (`available_mib`).
pub fn admit(
    l: &Limits,
    usage: &Usage,
    vcpus: u64,
    memory_mib: u64,
    available_mib: u64,
) -> Result<(), Refusal> {
    if usage.vms + 1 > l.max_vms {
        return Err(Refusal::Quota(format!(
            "host is full: {} sandboxes hold a VMM (limit {}); remove some or retry later",
            usage.vms, l.max_vms
        )));
    }
    if usage.memory_mib + memory_mib > l.memory_budget_mib() {
        return Err(Refusal::Quota(format!(
            "host is full: guest memory reserved {} MiB + {} MiB requested exceeds {} MiB \
             ({} MiB host x {} overcommit); remove sandboxes or retry later",
            usage.memory_mib,
            memory_mib,
            l.memory_budget_mib(),
            l.host_memory_mib,
            l.memory_overcommit
        )));
    }
    if usage.vcpus + vcpus > l.vcpu_budget() {
        return Err(Refusal::Quota(format!(
            "host is full: {} vCPUs reserved + {} requested exceeds {} ({} CPUs x {} overcommit); \
             remove sandboxes or retry later",
            usage.vcpus,
            vcpus,
            l.vcpu_budget(),
            l.host_cpus,
            l.cpu_overcommit
        )));
    }
    if available_mib < l.min_available_mib {
        return Err(Refusal::HostPressure(format!(
            "host memory is low: {available_mib} MiB available, below the {} MiB floor; \
             not starting more sandboxes",
            l.min_available_mib
        )));
    }
    Ok(())
}

/// The disk a sandbox of `memory_mib` with a scratch disk of
/// `upper_disk_mib` may fill on the state filesystem: the disk, and its
/// memory when paused.
pub fn disk_need_mib(memory_mib: u32, upper_disk_mib: Option<u32>) -> u64 {
    u64::from(memory_mib) + u64::from(upper_disk_mib.unwrap_or(0))
}

/// Whether a sandbox needing `need_mib` of disk fits: `usage.disk_mib`
/// (what the others reserve) plus it within the disk quota (the budget
/// times `disk_overcommit`), and it leaves `l.min_free_disk_mib` of the
/// filesystem's `free_mib` free (`u64::MAX`: not checked).
pub fn admit_disk(l: &Limits, usage: &Usage, need_mib: u64, free_mib: u64) -> Result<(), Refusal> {
    if l.disk_budget_mib > 0 && usage.disk_mib + need_mib > l.disk_quota_mib() {
        return Err(Refusal::Quota(format!(
            "host is full: disk reserved {} MiB + {need_mib} MiB requested exceeds the disk \
             quota of {} MiB ({} MiB budget x {} overcommit; paused sandboxes hold theirs); \
             remove sandboxes or retry later",
            usage.disk_mib,
            l.disk_quota_mib(),
            l.disk_budget_mib,
            l.disk_overcommit
        )));
    }
    if free_mib < need_mib + l.min_free_disk_mib {
        return Err(Refusal::HostPressure(format!(
            "host disk is low: {free_mib} MiB free on the state filesystem, {need_mib} MiB \
             needed and {} MiB kept free; not starting more sandboxes",
            l.min_free_disk_mib
        )));
    }
    Ok(())
}

/// Whether the state filesystem's `free_mib` can take the pause of a
/// sandbox of `memory_mib` (at most all its memory is written) and still
/// keep `l.min_free_disk_mib` free. With an overcommitted disk quota the
/// reservation alone does not promise the space, so every pause asks.
pub fn admit_pause(l: &Limits, memory_mib: u32, free_mib: u64) -> Result<(), Refusal> {
    let need = u64::from(memory_mib);
    if free_mib < need.saturating_add(l.min_free_disk_mib) {
        return Err(Refusal::HostPressure(format!(
            "host disk is low: {free_mib} MiB free on the state filesystem, up to {need} MiB \
             needed for the pause and {} MiB kept free; the sandbox keeps running",
            l.min_free_disk_mib
        )));
    }
    Ok(())
}

/// Free space for unprivileged users on the filesystem of `p` (MiB;
/// `u64::MAX` when it cannot be read: nothing is refused for it).
pub fn free_disk_mib(p: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return u64::MAX;
    };
    // SAFETY: statvfs with a NUL-terminated path and a zeroed struct it
    // fills; its result is checked.
    let (r, st) = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c.as_ptr(), &mut st), st)
    };
    if r != 0 {
        return u64::MAX;
    }
    #[allow(clippy::useless_conversion)] // c_ulong / fsblkcnt_t widths differ by target
    let (blocks, size) = (u64::from(st.f_bavail), u64::from(st.f_frsize));
    blocks.saturating_mul(size) >> 20
}

/// Disk the files under `dir` hold (MiB; allocated blocks, so a sparse
/// disk counts what it holds).
pub fn du_mib(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(d: &Path, depth: u32) -> u64 {
        let Ok(rd) = std::fs::read_dir(d) else {
            return 0;
        };
        let mut n = 0u64;
        for e in rd.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() && depth < 4 {
                n += walk(&e.path(), depth + 1);
            } else if m.is_file() {
                n += m.blocks() * 512;
            }
        }
        n
    }
    walk(dir, 0) >> 20
}

/// A /proc/meminfo field in KiB.
pub fn meminfo_kib(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Host MemAvailable in MiB.
pub fn available_mib() -> u64 {
    meminfo_kib("MemAvailable").unwrap_or(0) / 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            host_memory_mib: 1024,
            host_cpus: 2,
            memory_overcommit: 2.0,
            cpu_overcommit: 4.0,
            min_available_mib: 100,
            max_vms: 10,
            disk_budget_mib: 0,
            min_free_disk_mib: 0,
            disk_overcommit: 1.0,
        }
    }

    fn usage(vms: u64, vcpus: u64, mem: u64) -> Usage {
        Usage {
            vms,
            vcpus,
            memory_mib: mem,
            ..Default::default()
        }
    }

    #[test]
    fn admits_within_budget() {
        assert_eq!(admit(&limits(), &usage(0, 0, 0), 1, 128, 5000), Ok(()));
        assert_eq!(admit(&limits(), &usage(7, 7, 1920), 1, 128, 5000), Ok(()));
    }

    #[test]
    fn refuses_with_clear_reasons() {
        let l = limits();
        let e = admit(&l, &usage(1, 1, 2000), 1, 128, 5000).unwrap_err();
        assert!(
            matches!(&e, Refusal::Quota(m) if m.contains("2048 MiB")),
            "{e}"
        );
        assert_eq!(e.reason(), "memory_quota");
        let e = admit(&l, &usage(1, 8, 0), 1, 128, 5000).unwrap_err();
        assert_eq!(e.reason(), "cpu_quota");
        let e = admit(&l, &usage(10, 0, 0), 1, 128, 5000).unwrap_err();
        assert_eq!(e.reason(), "max_sandboxes");
        let e = admit(&l, &usage(0, 0, 0), 1, 128, 50).unwrap_err();
        assert!(matches!(e, Refusal::HostPressure(_)));
        assert_eq!(e.reason(), "host_memory");
    }

    #[test]
    fn disk_counts_every_reservation_and_keeps_the_reserve_free() {
        let l = Limits {
            disk_budget_mib: 1000,
            min_free_disk_mib: 100,
            ..limits()
        };
        let with_disk = |d| Usage {
            disk_mib: d,
            ..usage(0, 0, 0)
        };
        assert_eq!(disk_need_mib(128, Some(512)), 640);
        assert_eq!(admit_disk(&l, &with_disk(360), 640, 5000), Ok(()));
        let e = admit_disk(&l, &with_disk(361), 640, 5000).unwrap_err();
        assert!(
            matches!(&e, Refusal::Quota(m) if m.contains("1000 MiB")),
            "{e}"
        );
        assert_eq!(e.reason(), "disk_quota");
        let e = admit_disk(&l, &with_disk(0), 640, 739).unwrap_err();
        assert!(matches!(e, Refusal::HostPressure(_)), "{e}");
        assert_eq!(e.reason(), "host_disk");
        let unbudgeted = Limits {
            disk_budget_mib: 0,
            ..l
        };
        assert_eq!(
            admit_disk(&unbudgeted, &with_disk(1 << 40), 640, 740),
            Ok(())
        );
    }

    #[test]
    fn an_overcommitted_disk_reserves_more_but_checks_real_space() {
        let l = Limits {
            disk_budget_mib: 1000,
            min_free_disk_mib: 100,
            disk_overcommit: 4.0,
            ..limits()
        };
        let with_disk = |d| Usage {
            disk_mib: d,
            ..usage(0, 0, 0)
        };
        assert_eq!(admit_disk(&l, &with_disk(3360), 640, 5000), Ok(()));
        let e = admit_disk(&l, &with_disk(3361), 640, 5000).unwrap_err();
        assert!(
            matches!(&e, Refusal::Quota(m) if m.contains("4000 MiB") && m.contains("x 4")),
            "{e}"
        );
        // Real free space still decides, whatever the quota says.
        let e = admit_disk(&l, &with_disk(0), 640, 739).unwrap_err();
        assert_eq!(e.reason(), "host_disk");
        // A pause needs room for all its memory and the reserve.
        assert_eq!(admit_pause(&l, 128, 228), Ok(()));
        let e = admit_pause(&l, 128, 227).unwrap_err();
        assert!(
            matches!(&e, Refusal::HostPressure(m) if m.contains("keeps running")),
            "{e}"
        );
        assert_eq!(e.reason(), "host_disk");
        assert_eq!(
            admit_pause(&l, 128, u64::MAX),
            Ok(()),
            "unreadable: not checked"
        );
    }

    #[test]
    fn measures_disk() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("sparse")).unwrap();
        f.set_len(1 << 30).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/full"), vec![1u8; 3 << 20]).unwrap();
        let n = du_mib(dir.path());
        assert!(
            (3..5).contains(&n),
            "{n} MiB: a sparse file counts what it holds"
        );
        let free = free_disk_mib(dir.path());
        assert!(free > 0 && free < u64::MAX, "{free}");
    }

    #[test]
    fn reads_meminfo() {
        assert!(meminfo_kib("MemTotal").unwrap() > 0);
        assert!(meminfo_kib("Nope").is_none());
    }
}
