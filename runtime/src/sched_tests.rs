use super::*;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A process with a main thread and `n` more, and one more thread every
/// 100 ms for 2 s (so some are started after a class is applied).
fn threaded(n: usize) -> Child {
    let code = format!(
        "import threading, time\n\
         for _ in range({n}): threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n\
         for _ in range(20):\n\
         \ttime.sleep(0.1)\n\
         \tthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n\
         time.sleep(30)\n"
    );
    Command::new("python3")
        .args(["-c", &code])
        .spawn()
        .expect("python3 (the tests' threaded process)")
}

fn wait_threads(pid: i32, n: usize) {
    let end = Instant::now() + Duration::from_secs(10);
    while threads(pid).map_or(0, |t| t.len()) < n {
        assert!(Instant::now() < end, "pid {pid} never had {n} threads");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn policies(pid: i32) -> Vec<i32> {
    threads(pid)
        .unwrap()
        .into_iter()
        .filter_map(policy)
        .collect()
}

#[test]
fn best_effort_makes_every_thread_idle_and_new_threads_inherit_it() {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run the tests as root");
    let mut c = threaded(3);
    let pid = i32::try_from(c.id()).unwrap();
    wait_threads(pid, 4);
    let a = apply(pid, Class::BestEffort).unwrap();
    assert!(a.changed >= 4, "{a:?}");
    assert!(policies(pid).iter().all(|p| *p == libc::SCHED_IDLE));
    // Threads started afterwards inherit it.
    let before = threads(pid).unwrap().len();
    wait_threads(pid, before + 3);
    let p = policies(pid);
    assert!(p.iter().all(|p| *p == libc::SCHED_IDLE), "{p:?}");
    // Applying again changes nothing.
    assert_eq!(apply(pid, Class::BestEffort).unwrap().changed, 0);
    // And back to normal (root may leave SCHED_IDLE).
    let a = apply(pid, Class::Latency).unwrap();
    assert!(a.changed >= before, "{a:?}");
    assert!(policies(pid).iter().all(|p| *p == libc::SCHED_OTHER));
    assert_eq!(a.core_cookie, *core_sched() == CoreSched::On);
    c.kill().unwrap();
    c.wait().unwrap();
    // A process that is gone is an error, not a silent success.
    assert!(matches!(
        apply(pid, Class::BestEffort),
        Err(SchedError::Tasks { .. })
    ));
}

#[test]
fn core_scheduling_is_probed_and_explained() {
    assert_eq!(probe(0, Some("1\n")), CoreSched::On);
    assert_eq!(probe(0, Some("0\n")), CoreSched::NoSmt);
    assert_eq!(probe(0, None), CoreSched::On);
    let off = probe(libc::EINVAL, Some("1"));
    assert!(!off.isolates());
    assert!(off.describe().contains("CONFIG_SCHED_CORE"), "{off:?}");
    assert_eq!(off.code(), "no_sched_core");
    assert_eq!(probe(libc::EPERM, None).code(), "prctl_error");
    assert_eq!(CoreSched::NoSmt.code(), "no_smt");
    assert!(probe(libc::EPERM, None).describe().starts_with("off: "));
    assert!(CoreSched::NoSmt.isolates() && CoreSched::On.isolates());
    // This host's answer is one of them, and the same every time.
    let here = core_sched();
    assert_eq!(here, core_sched());
    // The development hosts' kernel has no CONFIG_SCHED_CORE.
    if get_cookie_errno() == libc::EINVAL {
        assert!(!here.isolates());
    }
}
