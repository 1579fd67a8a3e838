//! Cold-memory eviction with a real guest on /dev/kvm: a clone of the
//! `tiny` template (the balloon test's, so one boot serves both) writes a
//! file into its tmpfs (guest RAM) and checksums it; the `evict` request
//! pushes the clone's private pages out of host RAM (to an eviction file
//! on this host, which has no swap: see `vmm/src/vm/evict.rs`), the VMM's
//! resident memory falls by about that much and the guest RAM it still
//! holds privately is at most 1 MiB; the guest reads the same checksum
//! afterwards; and a diff snapshot, a full snapshot (pause to disk and
//! fork) and a pause/evict/resume of the evicted sandbox all keep it.

use shoal_runtime::sandbox::{self, TemplateSpec};
use shoal_runtime::vmm_balloon::BalloonOptions;
use shoal_test_support::{kvm_serial, sh, RunningSandbox};
use std::path::Path;
use std::time::Duration;
use vmm_api::EvictInfo;

const MIB: u64 = 1 << 20;
/// Guest memory of the template (the balloon test's template).
const MEM_MIB: u64 = 256;

fn template() -> std::path::PathBuf {
    let spec = TemplateSpec {
        balloon: Some(BalloonOptions {
            stats_interval_s: 1,
            ..BalloonOptions::default()
        }),
        ..TemplateSpec::new("tiny", 1, u32::try_from(MEM_MIB).unwrap())
    };
    sandbox::template(&spec, &mut |l| eprintln!("{l}"))
        .unwrap_or_else(|e| panic!("the tiny template with a balloon: {e}"))
}

fn api(r: &RunningSandbox) -> vmm_api::Client {
    vmm_api::Client::new(&r.sb.api_sock, Duration::from_secs(60))
}

fn evict(r: &RunningSandbox) -> EvictInfo {
    let e = api(r).evict(&r.sb.dir).expect("evict request");
    eprintln!("evict: {e:?}");
    e
}

/// A field of /proc/PID/smaps_rollup, in KiB.
fn rollup_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in smaps_rollup: {s}"))
}

/// Private (anonymous) KiB the VMM holds inside guest RAM: the mappings
/// of `/proc/PID/smaps` that overlap the template's memory file's range.
fn guest_private_kib(pid: u32, memory: &Path) -> u64 {
    let memory = memory.canonicalize().unwrap();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut base = None;
    for l in smaps.lines() {
        let mut f = l.split_whitespace();
        let Some((s, _)) = f.next().and_then(|r| r.split_once('-')) else {
            continue;
        };
        let off = f.nth(1);
        if off == Some("00000000") && f.nth(2).is_some_and(|p| Path::new(p) == memory) {
            base = u64::from_str_radix(s, 16).ok();
        }
    }
    let base = base.unwrap_or_else(|| panic!("{} is not mapped at 0", memory.display()));
    let end = base + MEM_MIB * MIB;
    let (mut inside, mut kib) = (false, 0);
    for l in smaps.lines() {
        let first = l.split_whitespace().next().unwrap_or("");
        if let Some((s, e)) = first.split_once('-') {
            if let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) {
                inside = s < end && e > base && e - s <= MEM_MIB * MIB;
                continue;
            }
        }
        if inside {
            if let Some(v) = l.strip_prefix("Anonymous:") {
                kib += v.split_whitespace().next().unwrap().parse::<u64>().unwrap();
            }
        }
    }
    kib
}

/// The checksum of the guest's file.
fn sum(c: &agent_client::Client) -> String {
    let (out, err, st) = sh(c, "sha256sum /tmp/data");
    assert_eq!(
        st,
        agent_client::ExitStatus::Exited(0),
        "sha256sum: {out}{err}"
    );
    out.split_whitespace().next().unwrap().to_string()
}

#[test]
fn an_evicted_sandbox_leaves_host_ram_and_keeps_its_data_through_snapshots() {
    let _one = kvm_serial();
    let tpl = template();
    let (r, c) = RunningSandbox::start(&tpl);
    let pid = r.vmm_pid();

    // About 16 MiB of data in guest RAM (tmpfs), private to this clone.
    let (out, err, st) = sh(
        &c,
        "for i in 1 2 3 4 5 6 7 8; do cat /bin/busybox; done > /tmp/data && \
         wc -c < /tmp/data",
    );
    assert_eq!(st, agent_client::ExitStatus::Exited(0), "fill: {out}{err}");
    let data: u64 = out.trim().parse().unwrap();
    assert!(data >= 8 * MIB, "only {data} bytes written");
    let want = sum(&c);
    let memory = tpl.join("memory");
    let (rss0, priv0) = (rollup_kib(pid, "Rss"), guest_private_kib(pid, &memory));

    let e = evict(&r);
    let (rss1, priv1) = (rollup_kib(pid, "Rss"), guest_private_kib(pid, &memory));
    eprintln!(
        "{} MiB of data: VMM RSS {rss0} -> {rss1} KiB, private guest RAM {priv0} -> {priv1} KiB",
        data / MIB
    );
    assert_eq!(e.mode, "file", "this host has no swap: {e:?}");
    assert!(e.pages * 4096 >= data, "{e:?} for {data} bytes");
    assert_eq!(e.skipped_pages, 0, "{e:?}");
    assert!(
        rss0.saturating_sub(rss1) * 1024 >= data,
        "RSS fell by {} KiB only, for {data} bytes evicted",
        rss0.saturating_sub(rss1)
    );
    assert!(
        priv1 <= 1024,
        "{priv1} KiB of guest RAM still private to the VMM after eviction"
    );
    assert!(e.file_bytes >= data, "{e:?}");

    // The guest reads the same bytes (and runs).
    assert_eq!(sum(&c), want, "the data changed across eviction");
    let e2 = evict(&r);
    assert!(
        e2.faulted_back_pages * 4096 >= data,
        "the checksum read the data back: {e2:?}"
    );

    // Paused, evicted, resumed.
    api(&r).pause().expect("pause");
    let e3 = evict(&r);
    api(&r).resume().expect("resume");
    assert_eq!(e3.total_passes, 3, "{e3:?}");
    assert_eq!(
        sum(&c),
        want,
        "the data changed across pause, evict, resume"
    );

    // A diff snapshot (over the template) of the evicted sandbox, restored.
    evict(&r);
    let diff = tempfile::tempdir().unwrap();
    let info = api(&r).snapshot(diff.path(), true).expect("diff snapshot");
    api(&r).resume().expect("resume after the diff snapshot");
    eprintln!("diff snapshot: {} MiB of pages", info.memory_bytes / MIB);
    assert!(info.memory_bytes >= data, "{info:?}");
    {
        let (_r2, c2) = RunningSandbox::start(diff.path());
        assert_eq!(sum(&c2), want, "restored from the diff snapshot");
    }

    // A full snapshot (pause to disk, forks) of the evicted sandbox.
    evict(&r);
    drop(c);
    let full = tempfile::tempdir().unwrap();
    api(&r).snapshot(full.path(), false).expect("snapshot");
    drop(r);
    let (r3, c3) = RunningSandbox::start(full.path());
    assert_eq!(sum(&c3), want, "restored from the full snapshot");
    // A fork of it (its data is in the snapshot's memory file now: shared,
    // not private) evicts what it wrote since, and keeps its data.
    let e4 = evict(&r3);
    assert!(e4.pages > 0 && e4.skipped_pages == 0, "{e4:?}");
    assert_eq!(sum(&c3), want, "the fork's data after its eviction");
    let (out, _, _) = sh(&c3, "echo alive");
    assert_eq!(out, "alive\n");
}
