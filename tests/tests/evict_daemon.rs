//! shoald's eviction policy on real, jailed VMMs: with `--evict-idle-s 3`
//! an idle sandbox's private guest memory leaves host RAM (its VMM maps
//! the eviction file, its resident memory falls, `/metrics` counts it)
//! while a busy one (an exec in flight) is left alone; the evicted
//! sandbox's data reads back intact.

// Shared with tests/daemon.rs, which uses all of it.
#[allow(dead_code)]
mod daemon_harness;

use daemon_harness::Daemon;
use shoal_client::api::{CreateSandbox, Sandbox};
use std::time::{Duration, Instant};

/// The VMM's own pid (the API's is its jailer's).
fn vmm_pid(d: &Daemon, sb: &Sandbox) -> i32 {
    let jailer = sb.pid.unwrap_or_else(|| panic!("no pid: {sb:?}"));
    let dir = d.dir.join("sandboxes").join(&sb.id);
    shoal_runtime::jail::vmm_pid(jailer, &dir)
        .unwrap_or_else(|| panic!("no VMM under jailer {jailer}: is the daemon jailing?"))
}

/// Mappings of the VMM's (unnamed) eviction file.
fn evict_mappings(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("/#") && l.ends_with("(deleted)"))
        .count()
}

fn rss_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// A counter's value in the exposition text.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

#[test]
fn the_daemon_evicts_an_idle_sandbox_and_not_a_busy_one() {
    shoal_test_support::require_root("the daemon jails its VMMs");
    let d = Daemon::start(&["--evict-idle-s", "3", "--freeze-idle-ms", "1000"]);
    // The busy one first: an exec in flight from just after its create
    // to the end of the checks.
    let busy = d.create(CreateSandbox::default());
    let bp = vmm_pid(&d, &busy);
    let m0 = d.metrics();
    std::thread::scope(|s| {
        let running = s.spawn(|| d.sh(&busy.id, "sleep 50; echo done").stdout);
        let idle = d.create(CreateSandbox::default());
        let fill = "for i in 1 2 3 4; do cat /bin/busybox; done > /tmp/data && sha256sum /tmp/data";
        let want = d.sh(&idle.id, fill).stdout;
        // The busy one's exec is in flight by now (seconds since it was
        // sent); on a loaded host its request may have reached the daemon
        // only after the busy sandbox had been idle for 3 s and was
        // evicted once: from here on it must not be evicted (again).
        let busy_before = evict_mappings(bp);
        let ip = vmm_pid(&d, &idle);
        let rss0 = rss_kib(ip);
        let end = Instant::now() + Duration::from_secs(20);
        while evict_mappings(ip) == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(250));
        }
        let rss1 = rss_kib(ip);
        eprintln!("idle sandbox's VMM: RSS {rss0} -> {rss1} KiB");
        assert!(
            evict_mappings(ip) > 0,
            "the idle sandbox was not evicted within 20 s\n{}",
            d.metrics()
        );
        assert!(
            rss0.saturating_sub(rss1) >= 4 * 1024,
            "its RSS fell by {} KiB only",
            rss0.saturating_sub(rss1)
        );
        assert_eq!(
            evict_mappings(bp),
            busy_before,
            "the busy sandbox (an exec in flight) was evicted"
        );
        // The evicted sandbox's data reads back.
        assert_eq!(d.sh(&idle.id, "sha256sum /tmp/data").stdout, want);
        assert_eq!(running.join().unwrap(), "done\n");
    });
    let m1 = d.metrics();
    let passes = metric(&m1, "shoal_evict_passes_total") - metric(&m0, "shoal_evict_passes_total");
    let pages = metric(&m1, "shoal_evict_pages_total") - metric(&m0, "shoal_evict_pages_total");
    eprintln!("{passes} evictions, {pages} pages");
    assert!(passes >= 1 && pages * 4096 >= 4 << 20, "{m1}");
    assert_eq!(metric(&m1, "shoal_evict_failures_total"), 0, "{m1}");
    // New templates have a balloon by default.
    assert!(m1.contains("\nshoal_balloon_new_templates 1\n"), "{m1}");
}
