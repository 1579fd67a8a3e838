//! Deaths noticed and reclaimed, pools filled and refilled, admission,
//! TTL and idle timeouts, and recovery when the daemon restarts.

use crate::harness::*;
use shoal_client::api::{self, ErrorCode, SandboxState};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

#[test]
fn a_vm_that_dies_is_noticed_and_reclaimed() {
    let d = TestDaemon::start();
    let sb = d.create();
    let other = d.create();
    let dir = d.sandboxes_dir().join(&sb.id);
    assert!(dir.is_dir());
    crash(sb.pid.unwrap());
    let f = d.wait_state(&sb.id, SandboxState::Failed, T);
    let why = f.error.unwrap_or_default();
    assert!(why.contains("exited unexpectedly"), "{why}");
    assert_eq!(f.pid, None);
    d.wait_for("its directory to be removed", T, || !dir.exists());
    assert_eq!(d.metric("shoal_vmm_deaths_total"), Some(1.0));
    let (s, _, m) = refused(d.sh(&sb.id, "true").unwrap_err());
    assert!(s == 409 && m.contains("failed"), "{m}");
    // The others are untouched; a killed one is no death.
    assert_eq!(d.sh(&other.id, "echo fine").unwrap().1, "fine\n");
    d.c.kill(&other.id).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(d.metric("shoal_vmm_deaths_total"), Some(1.0));
    assert!(d.event_kinds(&sb.id).iter().any(|k| k == "failed"));
}

#[test]
fn pools_fill_hand_out_and_refill_after_a_death() {
    let d = TestDaemon::start();
    d.c.create_template(&api::CreateTemplate::new("t", "tiny"))
        .unwrap();
    let ready = |n: u64| {
        d.c.pools()
            .unwrap()
            .iter()
            .any(|p| p.template == "t" && p.ready == n)
    };
    let p = d.c.set_pool("t", 2).unwrap();
    assert_eq!(p.target, 2);
    d.wait_for("the pool to fill", T, || ready(2));
    // Its processes settle with it: a member whose fill failed under load
    // (and was replaced) can still be exiting when the count reads 2.
    d.wait_for("the pool's two agents, and no other", T, || {
        d.agent_pids().len() == 2
    });
    // Pooled sandboxes are not listed.
    assert!(d.c.list(&Default::default()).unwrap().is_empty());
    // Handed out from the pool, connected already; the pool refills.
    let sb = d.c.create(&api::CreateSandbox::from_template("t")).unwrap();
    assert_eq!(sb.from_pool, Some(true));
    assert_eq!(d.sh(&sb.id, "echo pooled").unwrap().1, "pooled\n");
    d.wait_for("the pool to refill", T, || {
        ready(2) && d.agent_pids().len() == 3
    });
    assert_eq!(d.metric("shoal_pool_hits_total"), Some(1.0));
    // A pooled VM that dies is dropped and replaced.
    let members: Vec<i32> = d
        .agent_pids()
        .into_iter()
        .filter(|p| Some(*p) != sb.pid)
        .collect();
    assert_eq!(members.len(), 2);
    crash(members[0]);
    d.wait_for("a replacement", T, || {
        let now = d.agent_pids();
        ready(2) && now.len() == 3 && !now.contains(&members[0])
    });
    assert_eq!(d.metric("shoal_vmm_deaths_total"), Some(1.0));
    // Draining the pool ends its members; the handed-out one stays.
    d.c.delete_pool("t").unwrap();
    d.wait_for("the pool to drain", T, || {
        d.agent_pids() == vec![sb.pid.unwrap()]
    });
    assert_eq!(d.sh(&sb.id, "echo kept").unwrap().1, "kept\n");
}

#[test]
fn admission_refuses_a_full_host_with_429_and_low_memory_with_503() {
    let d = TestDaemon::with(Opts {
        max_vms: 2,
        ..Opts::default()
    });
    let a = d.create();
    d.create();
    let (s, code, m) = refused(
        d.c.create(&api::CreateSandbox {
            image: Some("tiny".into()),
            ..Default::default()
        })
        .unwrap_err(),
    );
    assert_eq!((s, code), (429, Some(ErrorCode::HostFull)), "{m}");
    assert!(m.contains("limit 2"), "{m}");
    let m = d.c.metrics().unwrap();
    assert!(
        m.contains("shoal_admission_refusals_total{reason=\"max_sandboxes\"} 1"),
        "{m}"
    );
    // A paused sandbox holds no VM: room for one more.
    d.c.pause(&a.id).unwrap();
    d.create();
    // ... and resuming it would exceed the limit again.
    assert_eq!(refused(d.c.resume(&a.id).unwrap_err()).0, 429);

    let low = TestDaemon::with(Opts {
        min_available_mib: u64::MAX / 4,
        ..Opts::default()
    });
    let (s, code, m) = refused(
        low.c
            .create(&api::CreateSandbox {
                image: Some("tiny".into()),
                ..Default::default()
            })
            .unwrap_err(),
    );
    assert_eq!((s, code), (503, Some(ErrorCode::HostMemoryLow)), "{m}");
    assert!(low.agent_pids().is_empty());
}

#[test]
fn ttl_kills_and_idle_timeout_pauses() {
    let d = TestDaemon::start();
    let ttl = d.create_with(|r| r.ttl_s = 1);
    let idle = d.create_with(|r| r.idle_timeout_s = 1);
    // Idle for 3 s at most, and kept active by a request every 0.2 s until
    // the others have been handled. (Keeping it active only for a while and
    // with a 1 s timeout raced with a loaded host: it went idle too.)
    let busy = d.create_with(|r| r.idle_timeout_s = 3);
    let (tp, ip) = (ttl.pid.unwrap(), idle.pid.unwrap());
    let done = &std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let (c, id) = (&d.c, &busy.id);
        s.spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                c.exec(id, &api::ExecRequest::shell("true")).unwrap();
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let checks = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            d.wait_for("the TTL kill", T, || {
                d.c.sandbox(&ttl.id).is_err_and(|e| e.is_not_found())
            });
            // (Killed, then reaped: the process may outlive its row briefly.)
            d.wait_for("the TTL'd VM to end", T, || gone(tp));
            assert!(d.event_kinds(&ttl.id).iter().any(|k| k == "killed"));
            let p = d.wait_state(&idle.id, SandboxState::Paused, T);
            assert_eq!(p.pid, None);
            d.wait_for("the idle VM to end", T, || gone(ip));
            assert_eq!(d.get(&busy.id).state, SandboxState::Running);
        }));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Err(p) = checks {
            std::panic::resume_unwind(p);
        }
    });
    // A paused idle sandbox resumes on its next request.
    assert_eq!(d.sh(&idle.id, "echo again").unwrap().1, "again\n");
}

#[test]
fn a_restarted_daemon_reattaches_live_vms_and_reclaims_dead_ones() {
    let mut d = TestDaemon::with(Opts {
        freeze_after: Some(Duration::from_millis(100)),
        ..Opts::default()
    });
    let live = d.create();
    let frozen = d.create();
    let dies = d.create();
    let paused = d.create();
    d.c.pause(&paused.id).unwrap();
    d.sh(&live.id, "echo before").unwrap();
    let lp = live.pid.unwrap();
    d.wait_for("the idle ones frozen", T, || {
        proc_state(lp) == Some('T') && proc_state(frozen.pid.unwrap()) == Some('T')
    });
    d.down();
    // While it is down: one VM dies, a stray VM and a stray directory
    // appear under its sandboxes.
    crash(dies.pid.unwrap());
    let stray_dir = d.sandboxes_dir().join("0123456789ab");
    std::fs::create_dir_all(&stray_dir).unwrap();
    let stray = std::process::Command::new(shoal_test_support::host_agent())
        .arg("--listen")
        .arg(format!("unix:{}/agent.sock", stray_dir.display()))
        .spawn()
        .unwrap();
    let stray_pid = i32::try_from(stray.id()).unwrap();
    d.wait_for("the stray agent to listen", T, || {
        stray_dir.join("agent.sock").exists()
    });
    d.up();

    // The live one: same process, reattached, works (thawed first).
    let r = d.get(&live.id);
    assert_eq!((r.state, r.pid), (SandboxState::Running, Some(lp)));
    assert_eq!(d.sh(&live.id, "echo after").unwrap().1, "after\n");
    assert!(d.event_kinds(&live.id).iter().any(|k| k == "reattached"));
    assert_eq!(d.sh(&frozen.id, "echo thawed").unwrap().1, "thawed\n");
    // The dead one: failed, reclaimed.
    let f = d.get(&dies.id);
    assert_eq!(f.state, SandboxState::Failed);
    assert!(f.error.unwrap_or_default().contains("daemon was down"));
    assert!(!d.sandboxes_dir().join(&dies.id).exists());
    // The paused one is still paused, and resumes.
    assert_eq!(d.get(&paused.id).state, SandboxState::Paused);
    assert_eq!(d.sh(&paused.id, "echo resumed").unwrap().1, "resumed\n");
    // Strays: the process killed, the directory removed.
    d.wait_for("the stray VM to end", T, || gone(stray_pid));
    assert!(!stray_dir.exists());
    drop(stray);
    // A second restart finds the same live ones again.
    d.restart();
    assert_eq!(d.get(&live.id).pid, Some(lp));
    assert_eq!(d.sh(&paused.id, "echo twice").unwrap().1, "twice\n");
    // And a VM killed while a sandbox was half paused is not resurrected.
    assert_eq!(d.get(&dies.id).state, SandboxState::Failed);
}
