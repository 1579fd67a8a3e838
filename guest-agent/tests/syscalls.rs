//! System calls the agent makes per exec and per MiB transferred, measured
//! with `strace -f` around a host-mode agent. Prints the numbers; asserts
//! the project's goals (<= 20 agent syscalls per exec beyond the command's
//! own clone/exec/wait, <= 4 per MiB moved). Skipped (with a message)
//! where strace is missing. `SHOAL_KEEP_TRACE=FILE` keeps the trace.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Agent, PseudoRandom, TempDir};
use guest_agent::client::{Client, ExecRequest, UploadOptions};

const EXECS: usize = 100;
const MIB: u64 = 64;

/// Syscalls of one traced phase.
#[derive(Default, Debug)]
struct Phase {
    /// The agent's own syscalls, by name.
    agent: BTreeMap<String, usize>,
    /// `fcntl(fd, F_GETFD)` before each close: std's debug-build check in
    /// `OwnedFd::drop`, absent from release builds (not counted above).
    debug_checks: usize,
    /// Syscalls of children before (and including) their successful execve.
    pre_exec: BTreeMap<String, usize>,
    /// Syscalls of the commands after their exec.
    command: usize,
}

impl Phase {
    fn agent_total(&self) -> usize {
        self.agent.values().sum()
    }
    fn pre_exec_total(&self) -> usize {
        self.pre_exec.values().sum()
    }
}

fn mark(c: &Client, name: &str) {
    // A stat of a path that does not exist shows up in the trace.
    let _ = c.stat(format!("/shoal-mark-{name}"));
}

/// Splits `PID rest` lines; returns None for non-syscall lines.
fn split(line: &str) -> Option<(u32, &str)> {
    let (pid, rest) = line.split_once(' ')?;
    let pid = pid.parse().ok()?;
    let rest = rest.trim_start();
    if rest.starts_with("---") || rest.starts_with("+++") {
        return None;
    }
    Some((pid, rest))
}

fn analyse(trace: &str, phase: &str) -> Phase {
    let lines: Vec<&str> = trace.lines().collect();
    // The process that exec'd the agent (under unshare it is not the first).
    let agent_pid = lines
        .iter()
        .filter_map(|l| split(l))
        .find(|(_, rest)| rest.starts_with("execve(") && rest.contains("shoal-agent"))
        .map(|(p, _)| p)
        .unwrap();
    let start = lines
        .iter()
        .position(|l| l.contains(&format!("/shoal-mark-{phase}-start")))
        .expect("start marker in trace");
    let end = lines
        .iter()
        .position(|l| l.contains(&format!("/shoal-mark-{phase}-end")))
        .expect("end marker in trace");
    let mut p = Phase::default();
    let mut execd = std::collections::HashSet::new();
    for line in &lines[start + 1..end] {
        let Some((pid, rest)) = split(line) else {
            continue;
        };
        let resumed = rest.starts_with("<...");
        let name = if resumed {
            rest.trim_start_matches("<... ")
                .split(' ')
                .next()
                .unwrap_or("?")
        } else {
            rest.split('(').next().unwrap_or("?")
        }
        .to_string();
        if pid == agent_pid {
            if rest.starts_with("fcntl(") && rest.contains("F_GETFD") {
                p.debug_checks += 1;
                continue;
            }
            if !resumed {
                *p.agent.entry(name).or_default() += 1;
            }
            continue;
        }
        if execd.contains(&pid) {
            if !resumed {
                p.command += 1;
            }
            continue;
        }
        if !resumed {
            *p.pre_exec.entry(name.clone()).or_default() += 1;
        }
        if name == "execve" && rest.trim_end().ends_with("= 0") {
            execd.insert(pid);
        }
    }
    p
}

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
    if unsafe { libc::getuid() } != 0 {
        eprintln!("SKIPPED: guest mode needs root (namespaces)");
        return;
    }
    measure(true);
}

fn measure(guest: bool) {
    let ok = std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED: strace not installed (apt-get install strace)");
        return;
    }
    let tmp = TempDir::new("strace");
    let trace_path = tmp.path().join("trace.txt");
    let tp = trace_path.display().to_string();
    // Guest mode mounts a tmpfs over /tmp: keep its socket elsewhere.
    let dir = TempDir::new_in(Path::new(env!("CARGO_TARGET_TMPDIR")), "sys");
    let mut agent = Agent::start_in(dir, |argv| {
        let mut v: Vec<String> = ["strace", "-f", "-qq", "-o", &tp]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if guest {
            v.extend(
                [
                    "unshare",
                    "--pid",
                    "--fork",
                    "--mount",
                    "--uts",
                    "--cgroup",
                    "--propagation",
                    "private",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
        }
        v.extend(argv);
        v
    });
    let c = agent.client();
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

    let file = agent.dir.path().join("upload.bin");
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
    while agent.child.try_wait().unwrap().is_none() {
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

    let e = analyse(&trace, "exec");
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
    let up = analyse(&trace, "upload");
    let down = analyse(&trace, "download");
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
