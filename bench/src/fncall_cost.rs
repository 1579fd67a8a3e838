//! The guest's own work per FnCall call, so that the figures of this
//! host (software KVM, where every guest syscall and page fault is
//! emulated) can be projected to hardware KVM, where they run natively.
//!
//! A python call runs in a clone of a snapshot taken while the runner
//! (`runner.py`) waits for its call, so a call's guest work is exactly what
//! the runner does from reading the call to its end marker. That work is
//! replayed here on the host, call by call, with the very same runner and
//! a python3 of the same minor version (Debian bookworm's 3.11 in the
//! guest): the runner is started, and once it has printed its ready marker
//! (the snapshot point) the call is written to it. Two runs per problem:
//! one under `strace -f -c` attached at the ready marker (the system calls
//! of the call alone), one untraced for CPU time (user + system, from the
//! process's scheduler runtime at the marker and its rusage at exit) and
//! minor page faults. Not in it: the guest agent relaying the call over
//! vsock (a few dozen syscalls), and numpy's import where the host lacks
//! numpy (the guest imports it before the snapshot: it is not per call).

use crate::stats::{summarize, Summary};
use serde::Serialize;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// What the runner prints once it waits for its call.
const READY: &[u8] = b"\0SHOAL-FNCALL-READY\n";
/// The nonce of the replayed calls' end markers.
const NONCE: &str = "cost";

/// Options.
#[derive(Debug, Clone)]
pub struct CostOpts {
    /// The host's python3.
    pub python: String,
    /// `strace` (its absence skips the syscall counts, and says so).
    pub strace: PathBuf,
    /// The runner's source (shoald's `PYTHON_RUNNER`).
    pub runner: String,
    /// Per call.
    pub timeout: Duration,
}

/// The section of the report.
#[derive(Debug, Clone, Serialize)]
pub struct GuestCost {
    /// How it was measured.
    pub method: String,
    /// The interpreter replayed.
    pub python: String,
    /// Calls replayed.
    pub calls: usize,
    /// Calls that failed to replay (why, the first few).
    pub failures: Vec<String>,
    /// System calls of one call (strace's total).
    pub syscalls_per_call: Option<Summary>,
    /// CPU (user + system) of one call, ms, run natively.
    pub cpu_ms_per_call: Option<Summary>,
    /// Minor page faults of one call.
    pub minor_faults_per_call: Option<Summary>,
    /// The most frequent system calls over all calls.
    pub top_syscalls: Vec<(String, u64)>,
    /// The hardware-KVM goal, 500 isolated calls/s per host core,
    /// is 2 ms of host CPU per call for everything; this is what the
    /// guest's own work (median CPU) leaves of it for the restore, the
    /// agent and the daemon.
    pub budget_left_ms_at_500_per_core: Option<f64>,
}

/// Why one replay failed.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    /// A program could not be started.
    #[error("starting {0}: {1}")]
    Spawn(String, std::io::Error),
    /// I/O with the runner.
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    /// The runner did not get there in time.
    #[error("the runner did not {0} within {1:?}")]
    Timeout(&'static str, Duration),
    /// strace's summary had no total.
    #[error("strace's summary has no total line: {0:?}")]
    Summary(String),
}

/// One replayed call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replay {
    /// System calls by name (traced runs).
    pub syscalls: Vec<(String, u64)>,
    /// Their total (traced runs).
    pub total_syscalls: u64,
    /// CPU ms (untraced runs).
    pub cpu_ms: f64,
    /// Minor faults (untraced runs).
    pub minor_faults: u64,
}

/// strace `-c`'s table: (name, calls) per row, and the total.
pub fn parse_strace_summary(text: &str) -> Result<(Vec<(String, u64)>, u64), CostError> {
    let mut rows = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors], name.
        if !(5..=6).contains(&f.len()) || f[0].parse::<f64>().is_err() {
            continue;
        }
        let Ok(calls) = f[3].parse::<u64>() else {
            continue;
        };
        let name = f[f.len() - 1];
        if name == "total" {
            return Ok((rows, calls));
        }
        rows.push((name.to_string(), calls));
    }
    Err(CostError::Summary(text.chars().take(400).collect()))
}

/// Reads the child's stdout on a thread, in chunks.
fn reader(mut r: impl Read + Send + 'static) -> Receiver<Vec<u8>> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 << 10];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits until `seen` holds `marker` (reading more from `rx`).
fn wait_for(
    rx: &Receiver<Vec<u8>>,
    seen: &mut Vec<u8>,
    marker: &[u8],
    what: &'static str,
    timeout: Duration,
) -> Result<(), CostError> {
    let end = Instant::now() + timeout;
    while !seen.windows(marker.len()).any(|w| w == marker) {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(b) => seen.extend_from_slice(&b),
            Err(_) => return Err(CostError::Timeout(what, timeout)),
        }
    }
    Ok(())
}

/// The process's scheduler runtime (ns) and minor faults now.
fn runtime_and_faults(pid: u32) -> Result<(u64, u64), CostError> {
    let io = |e| CostError::Io("reading the runner's /proc", e);
    let sched = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).map_err(io)?;
    let ns = sched
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(io)?;
    // Fields after the command's closing parenthesis: state is the 3rd
    // field of the line, minflt the 10th.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let minflt = after
        .split_whitespace()
        .nth(7)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok((ns, minflt))
}

/// Waits for `child` with its rusage: (CPU ns, minor faults) of its life.
fn wait_rusage(child: &mut Child, timeout: Duration) -> Result<(u64, u64), CostError> {
    let end = Instant::now() + timeout;
    let pid = libc::pid_t::try_from(child.id()).unwrap_or(0);
    loop {
        let mut status = 0;
        // SAFETY: all-zero is a valid rusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child with valid out-pointers; WNOHANG
        // returns at once.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            let us = |t: libc::timeval| {
                u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000
                    + u64::try_from(t.tv_usec).unwrap_or(0)
            };
            let faults = u64::try_from(ru.ru_minflt).unwrap_or(0);
            return Ok(((us(ru.ru_utime) + us(ru.ru_stime)) * 1000, faults));
        }
        if r < 0 {
            return Err(CostError::Io(
                "waiting for the runner",
                std::io::Error::last_os_error(),
            ));
        }
        if Instant::now() > end {
            let _ = child.kill();
            return Err(CostError::Timeout("exit", timeout));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The framed call the runner reads.
fn request(program: &str) -> Vec<u8> {
    let body = serde_json::json!({ "code": program, "nonce": NONCE }).to_string();
    let mut out = format!("{:010}", body.len()).into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// Replays `program` once: traced (syscalls) or not (CPU, faults).
pub fn replay(
    program: &str,
    runner: &Path,
    o: &CostOpts,
    traced: bool,
) -> Result<Replay, CostError> {
    let mut child = Command::new(&o.python)
        .arg(runner)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| CostError::Spawn(o.python.clone(), e))?;
    let r = replay_child(&mut child, program, o, traced);
    let _ = child.kill();
    let _ = child.wait();
    r
}

fn replay_child(
    child: &mut Child,
    program: &str,
    o: &CostOpts,
    traced: bool,
) -> Result<Replay, CostError> {
    let pid = child.id();
    let rx = reader(child.stdout.take().expect("piped stdout"));
    let mut seen = Vec::new();
    wait_for(&rx, &mut seen, READY, "get ready", o.timeout)?;
    let (ns0, faults0) = runtime_and_faults(pid)?;
    let out = tempfile::NamedTempFile::new().map_err(|e| CostError::Io("strace's output", e))?;
    let mut strace = None;
    if traced {
        let mut s = Command::new(&o.strace)
            .args(["-f", "-c", "-o"])
            .arg(out.path())
            .args(["-p", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| CostError::Spawn(o.strace.display().to_string(), e))?;
        let err = reader(s.stderr.take().expect("piped stderr"));
        let mut said = Vec::new();
        let attached = wait_for(&err, &mut said, b"attached", "be attached to", o.timeout);
        if let Err(e) = attached {
            let _ = s.kill();
            let _ = s.wait();
            return Err(e);
        }
        strace = Some(s);
    }
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(&request(program))
        .map_err(|e| CostError::Io("writing the call", e))?;
    drop(stdin);
    let end = format!("\0SHOAL-FNCALL-END:{NONCE}:");
    wait_for(&rx, &mut seen, end.as_bytes(), "end its call", o.timeout)?;
    let (ns1, faults1) = wait_rusage(child, o.timeout)?;
    let mut r = Replay {
        cpu_ms: ns1.saturating_sub(ns0) as f64 / 1e6,
        minor_faults: faults1.saturating_sub(faults0),
        ..Default::default()
    };
    if let Some(mut s) = strace {
        let _ = wait_rusage(&mut s, o.timeout)?;
        let text = std::fs::read_to_string(out.path())
            .map_err(|e| CostError::Io("reading strace's summary", e))?;
        (r.syscalls, r.total_syscalls) = parse_strace_summary(&text)?;
    }
    Ok(r)
}

/// Replays every program (twice each) and summarizes.
pub fn measure(
    programs: &[(String, String)],
    o: &CostOpts,
    log: &mut dyn FnMut(&str),
) -> GuestCost {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let runner = dir.path().join("runner.py");
    let mut failures = Vec::new();
    if let Err(e) = std::fs::write(&runner, &o.runner) {
        failures.push(format!("writing the runner: {e}"));
    }
    let can_trace = Command::new(&o.strace)
        .arg("-V")
        .output()
        .is_ok_and(|x| x.status.success());
    if !can_trace {
        failures.push(format!(
            "{} does not run: no syscall counts",
            o.strace.display()
        ));
    }
    let (mut sys, mut cpu, mut faults) = (Vec::new(), Vec::new(), Vec::new());
    let mut by_name: std::collections::BTreeMap<String, u64> = Default::default();
    log(&format!(
        "guest cost: replaying {} calls on the host",
        programs.len()
    ));
    let mut calls = 0;
    for (id, program) in programs {
        let mut ok = true;
        match replay(program, &runner, o, false) {
            Ok(r) => {
                cpu.push(r.cpu_ms);
                faults.push(r.minor_faults as f64);
            }
            Err(e) => {
                ok = false;
                failures.push(format!("{id}: {e}"));
            }
        }
        if can_trace {
            match replay(program, &runner, o, true) {
                Ok(r) => {
                    sys.push(r.total_syscalls as f64);
                    for (n, c) in r.syscalls {
                        *by_name.entry(n).or_default() += c;
                    }
                }
                Err(e) => {
                    ok = false;
                    failures.push(format!("{id} (traced): {e}"));
                }
            }
        }
        calls += usize::from(ok);
    }
    let mut top: Vec<(String, u64)> = by_name.into_iter().collect();
    top.sort_by_key(|e| std::cmp::Reverse(e.1));
    top.truncate(10);
    let cpu_s = summarize(&cpu);
    failures.truncate(5);
    GuestCost {
        method: "runner.py replayed on the host from its ready marker (the snapshot point): \
                 syscalls by strace -f -c attached there, CPU and minor faults untraced"
            .into(),
        python: python_version(&o.python),
        calls,
        failures,
        syscalls_per_call: summarize(&sys),
        budget_left_ms_at_500_per_core: cpu_s.as_ref().map(|s| 2.0 - s.median),
        cpu_ms_per_call: cpu_s,
        minor_faults_per_call: summarize(&faults),
        top_syscalls: top,
    }
}

fn python_version(python: &str) -> String {
    Command::new(python)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| format!("{python}: {e}"))
}

impl GuestCost {
    /// Lines for the table.
    pub fn render(&self) -> String {
        let f = |s: &Option<Summary>| {
            s.as_ref().map_or("-".into(), |s| {
                format!("p50 {:.1}, p99 {:.1}", s.median, s.p99)
            })
        };
        let mut s = format!(
            "guest work per call ({}, {} calls replayed on the host): syscalls {}; cpu ms {}; \
             minor faults {}\n",
            self.python,
            self.calls,
            f(&self.syscalls_per_call),
            f(&self.cpu_ms_per_call),
            f(&self.minor_faults_per_call),
        );
        if let Some(b) = self.budget_left_ms_at_500_per_core {
            s.push_str(&format!(
                "  of the 2 ms per call that 500 calls/s per core allow, the guest's own work \
                 leaves {b:.2} ms for restore, agent and daemon\n"
            ));
        }
        for f in &self.failures {
            s.push_str(&format!("  failed: {f}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_summaries_are_read_with_and_without_errors() {
        let text = "% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 40.00    0.000040           4        10           read
 30.00    0.000030           1        25         3 openat
  0.00    0.000000           0         1           exit_group
------ ----------- ----------- --------- --------- ----------------
100.00    0.000100           2        36         3 total
";
        let (rows, total) = parse_strace_summary(text).unwrap();
        assert_eq!(total, 36);
        assert_eq!(
            rows,
            vec![
                ("read".to_string(), 10),
                ("openat".to_string(), 25),
                ("exit_group".to_string(), 1)
            ]
        );
        assert!(matches!(
            parse_strace_summary(
                "strace: attach: ptrace(PTRACE_SEIZE, 1): Operation not permitted\n"
            ),
            Err(CostError::Summary(_))
        ));
    }

    #[test]
    fn a_call_is_framed_as_the_runner_reads_it() {
        let r = request("print(1)");
        let (len, body) = r.split_at(10);
        let n: usize = std::str::from_utf8(len).unwrap().parse().unwrap();
        assert_eq!(n, body.len());
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["code"], "print(1)");
        assert_eq!(v["nonce"], NONCE);
    }
}
