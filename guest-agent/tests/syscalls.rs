//! System calls the agent makes per exec and per MiB transferred, measured
//! with `strace -f` around a host-mode agent. Prints the numbers; asserts
//! the project's goals (<= 20 agent syscalls per exec beyond the command's
//! own clone/exec/wait, <= 4 per MiB moved). Fails with a clear message
//! where strace is missing. `SHOAL_KEEP_TRACE=FILE` keeps the trace.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_client::syscount::{analyse, mark};
use agent_client::{ExecRequest, UploadOptions};
use common::{Agent, PseudoRandom, TempDir};

const EXECS: usize = 100;
const MIB: u64 = 64;

fn per(n: usize, d: f64) -> String {
    format!("{:.2}", n as f64 / d)
}

#[test]
fn agent_syscalls_per_exec_and_per_mib() {
    measure(false);
}

/// The same as PID 1 in namespaces (guest mode: one cgroup per exec and
/// oom_score_adj reset in the child, the cgroup removed by the agent).
#[test]
fn guest_mode_agent_syscalls_per_exec_and_per_mib() {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    assert_eq!(
        uid, 0,
        "guest mode needs root (namespaces): run the tests as root"
    );
    measure(true);
}

fn measure(guest: bool) {
    let ok = std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "strace is needed to count syscalls: apt-get install strace"
    );
    let tmp = TempDir::new("strace");
    let trace_path = tmp.path().join("trace.txt");
    let tp = trace_path.display().to_string();
    let strace = |argv: Vec<String>| {
        let mut v: Vec<String> = ["strace", "-f", "-qq", "-o", &tp]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(argv);
        v
    };
    // Guest mode: PID 1 in namespaces, its socket and the uploaded file on
    // the tmpfs it mounts over /tmp in its own mount namespace.
    let (mut pid1, mut host_agent, c, file) = if guest {
        let agent = common::start_pid1(strace, std::process::Stdio::inherit());
        let c = agent.client();
        (Some(agent), None, c, PathBuf::from("/tmp/upload.bin"))
    } else {
        let agent = Agent::start_with(strace);
        let c = agent.client();
        let file = agent.dir.path().join("upload.bin");
        (None, Some(agent), c, file)
    };
    let truecmd = if Path::new("/bin/true").exists() {
        "/bin/true"
    } else {
        "/usr/bin/true"
    };
    let req = ExecRequest::argv([truecmd]);
    for _ in 0..10 {
        assert!(c.exec_simple(&req).unwrap().result.success());
    }
    mark(&c, "exec-start");
    for _ in 0..EXECS {
        assert!(c.exec_simple(&req).unwrap().result.success());
    }
    mark(&c, "exec-end");

    let len = MIB << 20;
    // Warm the file path and the buffers once.
    c.write_file(&file, b"warm", 0o644).unwrap();
    mark(&c, "upload-start");
    let n = c
        .upload(
            &mut PseudoRandom::new(1, len),
            &file,
            UploadOptions::default(),
        )
        .unwrap();
    mark(&c, "upload-end");
    assert_eq!(n, len);
    mark(&c, "download-start");
    assert_eq!(c.download(&file, &mut std::io::sink()).unwrap(), len);
    mark(&c, "download-end");

    c.poweroff().unwrap();
    let t0 = Instant::now();
    let mut exited = || match (&mut pid1, &mut host_agent) {
        (Some(p), _) => p.child.try_wait().unwrap().is_some(),
        (None, Some(a)) => a.child.try_wait().unwrap().is_some(),
        (None, None) => true,
    };
    while !exited() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "strace did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    if guest {
        common::remove_user_cgroup();
    }
    let trace = std::fs::read_to_string(&trace_path).unwrap();
    if let Ok(keep) = std::env::var("SHOAL_KEEP_TRACE") {
        std::fs::write(keep, &trace).unwrap();
    }

    let e = analyse(&trace, "exec").expect("exec phase in trace");
    let n = EXECS as f64;
    let clones =
        e.agent.get("clone").copied().unwrap_or(0) + e.agent.get("clone3").copied().unwrap_or(0);
    // One wait4 per exec reaps the command; the one that finds nothing
    // more to reap is the agent's own.
    let waits = e.agent.get("wait4").copied().unwrap_or(0).min(EXECS);
    let agent_own = e.agent_total() - clones - waits;
    let mode = if guest {
        "guest mode: PID 1 in namespaces"
    } else {
        "host mode"
    };
    println!("== agent syscalls per exec of {truecmd} ({EXECS} execs, one connection, {mode})");
    for (name, count) in &e.agent {
        println!("  {name:<16} {}", per(*count, n));
    }
    println!(
        "  total {} = clone {} + reaping wait4 {} + the agent's own {}",
        per(e.agent_total(), n),
        per(clones, n),
        per(waits, n),
        per(agent_own, n)
    );
    println!(
        "  child before exec (its own pid, incl. execve): {} {:?}",
        per(e.pre_exec_total(), n),
        e.pre_exec
            .iter()
            .map(|(k, v)| format!("{k}={}", per(*v, n)))
            .collect::<Vec<_>>()
    );
    println!("  the command itself after exec: {}", per(e.command, n));
    if e.debug_checks > 0 {
        println!(
            "  (not counted: {} fcntl(F_GETFD) per exec from std's debug-build OwnedFd drop check)",
            per(e.debug_checks, n)
        );
    }

    let mib = MIB as f64;
    let up = analyse(&trace, "upload").expect("upload phase in trace");
    let down = analyse(&trace, "download").expect("download phase in trace");
    for (what, p) in [("upload", &up), ("download", &down)] {
        println!(
            "== agent syscalls per MiB {what}ed ({MIB} MiB): {} {:?}",
            per(p.agent_total(), mib),
            p.agent
                .iter()
                .map(|(k, v)| format!("{k}={}", per(*v, mib)))
                .collect::<Vec<_>>()
        );
    }

    assert!(
        agent_own as f64 / n <= 20.0,
        "agent syscalls per exec: {}",
        per(agent_own, n)
    );
    assert!(up.agent_total() as f64 / mib <= 4.0, "per MiB uploaded");
    assert!(down.agent_total() as f64 / mib <= 4.0, "per MiB downloaded");
}
