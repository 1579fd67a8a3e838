//! Seccomp on real guests: every thread of a running VMM (restored, and
//! pre-warmed then restored) runs under its role's filter (`Seccomp: 2`),
//! the guest's lifecycle works under the filters, and a forbidden call
//! from a thread of any role kills the VMM with SIGSYS, reported as a
//! seccomp kill. Needs /dev/kvm, the guest artifacts and the `shoal-vmm`
//! binary (`SHOAL_VMM`, or the workspace build).

#[allow(dead_code)] // this binary uses part of the harness
mod daemon_harness;

use daemon_harness::{alive, wait_for, Daemon};
use shoal_client::api::{CreateSandbox, EventQuery, SandboxState};
use shoal_runtime::vm::exit_cause;
use shoal_runtime::vmm_process::{Io, Serial, VmmProcess};
use shoal_test_support::{sh, tiny_template, RunningSandbox};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};
use vmm_api::Client;

const CALL: Duration = Duration::from_secs(120);

fn vmm() -> PathBuf {
    shoal_images::artifacts::vmm_binary().expect("the shoal-vmm binary")
}

/// One task of a process: its name, seccomp mode and number of filters.
#[derive(Debug)]
struct Task {
    name: String,
    mode: u32,
    filters: u32,
}

fn tasks(pid: u32) -> Vec<Task> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the VMM's tasks") {
        let Ok(status) = std::fs::read_to_string(e.unwrap().path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        out.push(Task {
            name: field("Name:"),
            mode: field("Seccomp:").parse().unwrap_or(0),
            filters: field("Seccomp_filters:").parse().unwrap_or(0),
        });
    }
    out
}

/// Every task of `pid` is in seccomp filter mode, and the VMM's threads
/// (main, vCPUs, events, control socket) are all there (a thread started
/// a moment ago may not have its name yet: waits up to 10 s for that).
fn assert_all_filtered(pid: u32, vcpus: usize) -> Vec<Task> {
    let named = |t: &[Task]| t.iter().filter(|x| x.name.starts_with("vcpu")).count() == vcpus;
    let end = Instant::now() + Duration::from_secs(10);
    let mut t = tasks(pid);
    while !named(&t) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        t = tasks(pid);
    }
    for want in ["shoal-vmm", "events", "api", "api-conn"] {
        assert!(t.iter().any(|x| x.name == want), "no {want} thread: {t:?}");
    }
    let n = t.iter().filter(|x| x.name.starts_with("vcpu")).count();
    assert_eq!(n, vcpus, "vCPU threads: {t:?}");
    for x in &t {
        assert_eq!(
            x.mode, 2,
            "thread {} has Seccomp: {} ({t:?})",
            x.name, x.mode
        );
        assert!(x.filters >= 1, "{t:?}");
    }
    t
}

/// Opens a host connection to the guest agent's vsock port and reads the
/// muxer's `OK <port>` line (the event thread and a vCPU both take part).
fn vsock_ok(uds: &Path) {
    let mut s = UnixStream::connect(uds).expect("vsock socket");
    s.set_read_timeout(Some(CALL)).unwrap();
    s.write_all(b"CONNECT 5000\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.starts_with("OK "), "vsock answered {line:?}");
}

/// A VMM killed (and reaped) when the test ends, passed or not.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (at most 60 s) for `child` to end.
fn wait_end(child: &mut Child) -> ExitStatus {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("the VMM did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_socket(sock: &Path, child: &mut Child) -> Client {
    let c = Client::new(sock, CALL);
    let end = Instant::now() + Duration::from_secs(60);
    while c.stats().is_err() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the VMM ended before serving: {}", exit_cause(st));
        }
        assert!(Instant::now() < end, "no control socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    c
}

#[test]
fn a_restored_vmm_runs_every_thread_under_seccomp_through_its_lifecycle() {
    let tpl = tiny_template();
    let (sb, agent) = RunningSandbox::start(&tpl);
    let pid = sb.vmm_pid();
    assert_all_filtered(pid, 1);
    // Exec and files through the agent (vsock), under the filters.
    let (out, _, st) = sh(
        &agent,
        "echo hi > /tmp/f && cat /tmp/f && head -c 100000 /dev/urandom | wc -c",
    );
    assert_eq!(st, agent_client::ExitStatus::Exited(0), "{out}");
    assert_eq!(out, "hi\n100000\n");
    let c = Client::new(&sb.sb.api_sock, CALL);
    c.pause().unwrap();
    c.resume().unwrap();
    c.sample().unwrap();
    let dir = tempfile::tempdir().unwrap();
    c.snapshot(&dir.path().join("full"), false).unwrap();
    c.resume().unwrap();
    c.snapshot(&dir.path().join("diff"), true).unwrap();
    c.resume().unwrap();
    let (out, _, _) = sh(&agent, "echo still");
    assert_eq!(out, "still\n");
    assert!(c.stats().is_ok());
    // Every thread, and still alive after all that.
    assert_all_filtered(pid, 1);
}

#[test]
fn a_prewarmed_vmm_runs_every_thread_under_seccomp_after_restores() {
    let tpl = tiny_template();
    let dir = tempfile::tempdir().unwrap();
    let (sock, uds) = (dir.path().join("api.sock"), dir.path().join("v.sock"));
    let child = VmmProcess::prewarm(&vmm())
        .memory_mib(128)
        .vcpus(1)
        .api_sock(&sock)
        .vsock_uds(&uds)
        .serial(Serial::Null)
        .stdout(Io::Null)
        .stderr(Io::Truncate(dir.path().join("vmm.log")))
        .spawn()
        .unwrap()
        .child;
    let mut child = Killed(child);
    let child = &mut child.0;
    let c = wait_socket(&sock, child);
    let pid = child.id();
    // Empty: no vCPU thread yet, the rest filtered.
    for x in tasks(pid) {
        assert_eq!(x.mode, 2, "{x:?}");
    }
    c.restore(&tpl, &[]).unwrap();
    let t = assert_all_filtered(pid, 1);
    // A vCPU thread the (filtered) main thread started for the restore
    // runs under both filters.
    let v = t.iter().find(|x| x.name == "vcpu0").unwrap();
    assert_eq!(v.filters, 2, "{t:?}");
    vsock_ok(&uds);
    c.pause().unwrap();
    c.snapshot(&dir.path().join("snap"), true).unwrap();
    c.resume().unwrap();
    // Restore again into the same VM (old vCPU threads stop, new ones start).
    c.restore(&tpl, &[]).unwrap();
    assert_all_filtered(pid, 1);
    vsock_ok(&uds);
    c.shutdown().unwrap();
    let st = wait_end(child);
    assert!(st.success(), "{}", exit_cause(st));
}

/// Starts `start` (with sockets in `dir`) with its first `role` thread
/// making a forbidden call.
fn selftest(start: VmmProcess, role: &str, dir: &Path) -> Killed {
    let mut cmd = start
        .api_sock(dir.join("api.sock"))
        .vsock_uds(dir.join("v.sock"))
        .serial(Serial::Null)
        .stdout(Io::Null)
        .stderr(Io::Truncate(dir.join("vmm.log")))
        .command()
        .unwrap();
    cmd.args(["--seccomp-selftest", role]);
    Killed(cmd.spawn().unwrap())
}

fn assert_seccomp_kill(st: ExitStatus, what: &str) {
    assert_eq!(st.signal(), Some(libc::SIGSYS), "{what}: {st:?}");
    let why = exit_cause(st);
    assert!(
        why.starts_with("shoal-vmm killed by seccomp (SIGSYS)"),
        "{why}"
    );
}

#[test]
fn a_forbidden_call_from_any_role_kills_the_vmm_with_sigsys() {
    let tpl = tiny_template();
    for role in ["main", "vcpu", "events", "api"] {
        let dir = tempfile::tempdir().unwrap();
        let mut child = selftest(VmmProcess::restore(&vmm(), &tpl), role, dir.path());
        let st = wait_end(&mut child.0);
        assert_seccomp_kill(st, role);
    }
    // Without filters the same call passes and the VM runs.
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = VmmProcess::restore(&vmm(), &tpl)
        .api_sock(dir.path().join("api.sock"))
        .vsock_uds(dir.path().join("v.sock"))
        .serial(Serial::Null)
        .stdout(Io::Null)
        .seccomp(false)
        .command()
        .unwrap();
    let mut child = Killed(cmd.spawn().unwrap());
    let c = wait_socket(&dir.path().join("api.sock"), &mut child.0);
    for x in tasks(child.0.id()) {
        assert_eq!(x.mode, 0, "--no-seccomp: {x:?}");
    }
    c.shutdown().unwrap();
    assert!(wait_end(&mut child.0).success());
    // A vCPU thread started for a restore into a pre-warmed VM.
    let dir = tempfile::tempdir().unwrap();
    let mut child = selftest(
        VmmProcess::prewarm(&vmm()).memory_mib(128),
        "vcpu",
        dir.path(),
    );
    let c = wait_socket(&dir.path().join("api.sock"), &mut child.0);
    // The restore's reply may or may not make it out before the kill.
    let _ = c.restore(&tpl, &[]);
    assert_seccomp_kill(wait_end(&mut child.0), "vcpu after a restore");
}

/// The daemon's word for a VMM that died of SIGSYS: in the sandbox's
/// error and in the event log.
#[test]
fn the_daemon_reports_a_vmm_killed_by_seccomp() {
    let d = Daemon::start(&[]);
    let s = d.create(CreateSandbox::default());
    let p = alive(&s).expect("a running VMM");
    // What the kernel does to a thread calling outside its filter, sent to
    // the process the daemon tracks (as root: the jailer, which dies of
    // it as it would re-raise its VMM's SIGSYS; a jailed VMM is PID 1 of
    // its namespace and ignores a SIGSYS sent from outside, unlike the
    // kernel's seccomp kill).
    // SAFETY: kill(2) on the pid of the VMM this daemon just started.
    assert_eq!(unsafe { libc::kill(p.pid, libc::SIGSYS) }, 0);
    wait_for("the death to be noticed", 10, || {
        d.state(&s.id) == SandboxState::Failed
    });
    let err = d.get(&s.id).unwrap().error.unwrap_or_default();
    assert!(
        err.contains("shoal-vmm killed by seccomp (SIGSYS)"),
        "{err}"
    );
    let events = d.must(
        "events",
        d.c.events(&EventQuery {
            sandbox: Some(s.id.clone()),
            ..Default::default()
        }),
    );
    assert!(
        events
            .iter()
            .any(|e| e.kind == "failed" && e.detail.contains("killed by seccomp (SIGSYS)")),
        "{events:?}"
    );

    // A VMM whose main thread makes a forbidden call as it starts (the
    // template build, which boots a kernel, runs unmodified): the daemon
    // says so.
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("shoal-vmm");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" --kernel \"*) exec {0} \"$@\";; esac\n\
             exec {0} \"$@\" --seccomp-selftest main\n",
            vmm().display()
        ),
    )
    .unwrap();
    let mut perm = std::fs::metadata(&wrapper).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&wrapper, perm).unwrap();
    // The wrapper is a shell script, which a jail (holding only the VMM
    // binary and its libraries) cannot run: this daemon starts its VMMs
    // unjailed; the first half above is the jailed case.
    let d2 = Daemon::start_env(
        &[],
        &[
            ("SHOAL_VMM", wrapper.as_path()),
            ("SHOAL_JAIL", std::path::Path::new("0")),
        ],
    );
    let req = CreateSandbox {
        image: Some("tiny".into()),
        ..Default::default()
    };
    // It reports ready before its main thread's filter goes on, so the
    // create may succeed and the death be noticed after.
    let err = match d2.c.create(&req) {
        Err(e) => e.to_string(),
        Ok(s) => {
            wait_for("the death to be noticed", 30, || {
                d2.state(&s.id) == SandboxState::Failed
            });
            d2.get(&s.id).unwrap().error.unwrap_or_default()
        }
    };
    assert!(
        err.contains("shoal-vmm killed by seccomp (SIGSYS)"),
        "{err}"
    );
}
