//! The fake backend behaves like a VM process: a real agent serves, a
//! freeze stops it, pausing ends it and leaves a state file, a kill ends
//! it for real.

use super::*;
use crate::vmm_net::NetLimits;
use agent_client::{Client, ClientError, ExecRequest};

fn backend(_root: &Path) -> Fake {
    Fake::new(shoal_test_support::host_agent())
}

fn echo(vm: &dyn SandboxVm, word: &str) -> Result<String, ClientError> {
    let c = Client::connect_retry(&vm.agent(), Duration::from_secs(5))?;
    c.set_timeout(Some(Duration::from_secs(2)));
    let out = c.exec_simple(&ExecRequest::argv(["echo", word]))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn readable(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(fd),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe {
        libc::poll(
            &mut p,
            1,
            i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX),
        ) == 1
    }
}

#[test]
fn lifecycle_of_a_fake_sandbox() {
    let root = tempfile::tempdir().unwrap();
    let b = backend(root.path());
    let tpl = root.path().join("templates/tiny");
    b.build_template(TemplateSpec::new("tiny", 1, 128), &[], &tpl)
        .unwrap();
    assert!(tpl.join(TEMPLATE_MARKER).is_file());
    let dir = root.path().join("sandboxes/a");
    let vm = b
        .restore(&dir, &Source::Template(tpl.clone()), None)
        .unwrap();
    assert_eq!(vm.kind(), Kind::Fake);
    assert_eq!(echo(&*vm, "one").unwrap(), "one\n");
    assert!(!vm.stats().unwrap().frozen);

    // Frozen: the process is stopped and the agent does not answer until
    // it is thawed.
    vm.freeze().unwrap();
    assert!(vm.stats().unwrap().frozen);
    let (tx, rx) = std::sync::mpsc::channel();
    let v = vm.clone();
    std::thread::spawn(move || tx.send(echo(&*v, "two").map_err(|e| e.to_string())));
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a frozen agent answered"
    );
    vm.thaw().unwrap();
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("an answer once thawed");
    assert_eq!(got.unwrap(), "two\n");

    // A reattach finds it from its state alone.
    let again = b.reattach(&dir, &vm.state()).unwrap();
    assert_eq!((again.vm.pid(), again.frozen), (vm.pid(), false));

    // Paused to disk: the process ends, its state file stays.
    let exit = vm.exit_fd().unwrap();
    let paused = vm.pause_to_disk().unwrap();
    assert!(readable(&exit, Duration::from_secs(5)), "the process ended");
    assert!(!vm.alive());
    assert!(dir.join(PAUSED_STATE).is_file());
    assert!(b.can_resume(&dir, &paused));
    assert!(matches!(
        b.reattach(&dir, &paused),
        Err(BackendError::NoSource(_))
    ));
    let vm2 = b
        .restore(&dir, &Source::Paused(paused.clone()), None)
        .unwrap();
    assert_ne!(vm2.pid(), vm.pid());
    assert_eq!(echo(&*vm2, "three").unwrap(), "three\n");

    // Snapshot into a template, which restores like any other.
    let snap = root.path().join("templates/snap");
    vm2.snapshot(&snap).unwrap();
    assert!(!vm2.stats().unwrap().frozen, "it goes on running");
    let vm3 = b
        .restore(
            &root.path().join("sandboxes/b"),
            &Source::Template(snap),
            None,
        )
        .unwrap();
    assert_eq!(echo(&*vm3, "four").unwrap(), "four\n");

    // Killed: a real exit, seen on its pidfd; it is then gone for reattach.
    let exit = vm2.exit_fd().unwrap();
    vm2.kill();
    assert!(readable(&exit, Duration::from_secs(5)));
    vm2.reap();
    assert!(matches!(
        b.reattach(&dir, &vm2.state()),
        Err(BackendError::Gone(p)) if p == vm2.pid()
    ));
    vm3.destroy(Duration::from_secs(2));
    assert!(!vm3.alive());
}

#[test]
fn faults_strays_and_bad_sources() {
    let root = tempfile::tempdir().unwrap();
    let b = backend(root.path());
    let tpl = root.path().join("templates/tiny");
    b.build_template(TemplateSpec::new("tiny", 1, 128), &[], &tpl)
        .unwrap();
    let sbs = root.path().join("sandboxes");
    b.faults().fail_next(Op::Restore, 1);
    assert!(matches!(
        b.restore(&sbs.join("a"), &Source::Template(tpl.clone()), None),
        Err(BackendError::Injected(_))
    ));
    assert!(matches!(
        b.restore(&sbs.join("a"), &Source::Template(root.path().into()), None),
        Err(BackendError::NoSource(_))
    ));
    let keep = b
        .restore(&sbs.join("k"), &Source::Template(tpl.clone()), None)
        .unwrap();
    let stray = b
        .restore(&sbs.join("s"), &Source::Template(tpl.clone()), None)
        .unwrap();

    // A failed pause leaves it stopped, as a VMM after a failed snapshot;
    // a thaw continues it.
    b.faults().fail_next(Op::Pause, 1);
    assert!(keep.pause_to_disk().is_err());
    assert!(keep.stats().unwrap().frozen);
    keep.thaw().unwrap();
    assert_eq!(echo(&*keep, "ok").unwrap(), "ok\n");
    b.faults().fail_next(Op::Snapshot, 1);
    let snap = root.path().join("templates/bad");
    assert!(keep.snapshot(&snap).is_err());
    assert!(!snap.exists() && !keep.stats().unwrap().frozen);

    let keep_pid = keep.pid();
    assert_eq!(b.reclaim_strays(&sbs, &|p| p == keep_pid), 1);
    assert!(!stray.alive() && keep.alive());
    // A state that is not this backend's is refused, not guessed at.
    let other = BackendState::from_stored(r#"{"state":"running","pid":1}"#);
    assert!(matches!(
        b.reattach(&sbs, &other),
        Err(BackendError::State { .. })
    ));
    keep.destroy(Duration::from_secs(2));
}

#[test]
fn a_networked_restore_needs_its_netns() {
    let root = tempfile::tempdir().unwrap();
    let b = backend(root.path());
    let tpl = root.path().join("templates/tiny-net");
    b.build_template(TemplateSpec::new("tiny", 1, 128), &[], &tpl)
        .unwrap();
    let tap = Arc::new(std::fs::File::open("/dev/null").unwrap());
    let mut net = NetAttach {
        netns: root.path().join("no-such-netns"),
        tap,
        mac: [0x02, 0x5a, 10, 213, 0, 6],
        limits: NetLimits::default(),
    };
    let e = b
        .restore(
            &root.path().join("sandboxes/a"),
            &Source::Template(tpl.clone()),
            Some(&net),
        )
        .unwrap_err();
    assert!(e.to_string().contains("no-such-netns"), "{e}");
    // The host's own netns stands in for a slot's: the fake VM runs.
    net.netns = "/proc/self/ns/net".into();
    let vm = b
        .restore(
            &root.path().join("sandboxes/b"),
            &Source::Template(tpl),
            Some(&net),
        )
        .unwrap();
    assert_eq!(echo(&*vm, "up").unwrap(), "up\n");
    vm.destroy(Duration::from_secs(10));
}
