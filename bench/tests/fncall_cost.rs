//! The FnCall guest-cost replay against the real runner and the host's
//! python3 and strace (as root, as CI runs: strace attaches to a process
//! it did not start).

use shoal_bench::fncall_cost::{measure, replay, CostOpts};
use std::time::Duration;

fn opts() -> CostOpts {
    assert!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } == 0,
        "this test attaches strace to a running runner: run it as root"
    );
    CostOpts {
        python: "python3".into(),
        strace: "strace".into(),
        runner: include_str!("../../host-daemon/src/fncall/runner.py").into(),
        timeout: Duration::from_secs(60),
    }
}

#[test]
fn each_calls_own_syscalls_cpu_and_faults_are_counted_from_the_snapshot_point() {
    let o = opts();
    let dir = tempfile::tempdir().unwrap();
    let runner = dir.path().join("runner.py");
    std::fs::write(&runner, &o.runner).unwrap();
    let small = replay("x = 1", &runner, &o, true).unwrap();
    let busy = replay(
        "import os\nfor _ in range(2000):\n    os.getppid()",
        &runner,
        &o,
        true,
    )
    .unwrap();
    let of = |r: &shoal_bench::fncall_cost::Replay, n: &str| {
        r.syscalls
            .iter()
            .find(|(k, _)| k == n)
            .map_or(0, |(_, c)| *c)
    };
    // The interpreter's start and imports are before the snapshot point:
    // a trivial call is a small number of syscalls, not thousands.
    assert!(
        small.total_syscalls > 3 && small.total_syscalls < 1500,
        "{small:?}"
    );
    assert!(of(&small, "getppid") < 5, "{small:?}");
    assert!(of(&busy, "getppid") >= 2000, "{busy:?}");
    // The total counts every call's syscalls (the 2000 getppid and the rest);
    // what is not getppid stays in the trivial call's range. (Not "busy ≥
    // small + 2000": the runner's own syscalls vary a little between calls.)
    let rest = busy.total_syscalls.saturating_sub(of(&busy, "getppid"));
    assert!(
        busy.total_syscalls >= of(&busy, "getppid") + 3 && rest < 1500,
        "{busy:?} vs {small:?}"
    );
    // Untraced: CPU and faults of the call alone.
    let cpu = replay("sum(i * i for i in range(2_000_000))", &runner, &o, false).unwrap();
    let idle = replay("x = 1", &runner, &o, false).unwrap();
    assert!(cpu.cpu_ms > idle.cpu_ms, "{cpu:?} vs {idle:?}");
    let big = replay(
        "b = bytearray(64 << 20)\nb[::4096] = b'x' * (len(b) // 4096)",
        &runner,
        &o,
        false,
    )
    .unwrap();
    assert!(
        big.minor_faults > idle.minor_faults + 10_000,
        "64 MiB touched: {big:?} vs {idle:?}"
    );
}

#[test]
fn failing_and_hanging_calls_are_reported_not_hung_on() {
    let mut o = opts();
    o.timeout = Duration::from_secs(5);
    let programs = vec![
        ("ok".to_string(), "print('hi')".to_string()),
        ("raises".to_string(), "raise ValueError('x')".to_string()),
        (
            "hangs".to_string(),
            "import time\ntime.sleep(60)".to_string(),
        ),
    ];
    let c = measure(&programs, &o, &mut |_| {});
    // The raising call still ends with its marker (status 1): measured.
    assert_eq!(c.calls, 2, "{c:?}");
    assert!(c.failures.iter().all(|f| f.starts_with("hangs")), "{c:?}");
    assert!(!c.failures.is_empty());
    let s = c.syscalls_per_call.as_ref().expect("syscalls counted");
    assert_eq!(s.n, 2);
    assert!(c.cpu_ms_per_call.is_some() && c.minor_faults_per_call.is_some());
    assert!(!c.top_syscalls.is_empty());
}
