//! `shoal bench fork`: fork a running sandbox into N live clones through
//! shoald, against N creates from the same template in the same run.
//!
//! For each N, each system in turn ("fork": one `POST .../fork` of a
//! source sandbox that has run a command; "create": N `POST /v1/sandboxes`
//! from the source's template, a few clients at once):
//! 1. time from the request to all N sandboxes running (the reply);
//! 2. host memory of the N idle sandboxes at once (they are frozen from
//!    the restore on, so nothing has run in them yet): each VMM's PSS, and
//!    its anonymous part (the pages it owns: guest pages written since the
//!    restore, its heap), and the drop in the host's MemAvailable over N
//!    (noisy on a shared host);
//! 3. time from the request to all N answering an exec (`true`, issued as
//!    soon as they run; the memory readings of step 2 are not counted),
//!    and each one's exec latency;
//! 4. PSS again once they are idle after that exec.
//!
//! Ratios are fork / create at each N. Goals (this issue's): fork(100)
//! running within 1 s, and at most 1 MiB of host memory (PSS) per idle
//! clone.

use crate::hostmem::{meminfo_kib, pss_kib};
use crate::load::parallel;
use crate::plot::{self, Out, PlotError, Series, XySeries};
use crate::stats::{summarize, Summary};
use serde::Serialize;
use shoal_client::{api, DaemonClient};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The goal for fork(100): all running within this (ms).
pub const RUNNING_GOAL_MS: f64 = 1000.0;
/// The goal for an idle clone's host memory (PSS, KiB).
pub const MEMORY_GOAL_KIB: f64 = 1024.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct ForkBenchOpts {
    /// Template of the source and of the peer's creates.
    pub template: String,
    /// Clone counts.
    pub counts: Vec<usize>,
    /// Concurrent clients of the peer's creates and of the execs.
    pub clients: usize,
    /// The daemon's sandboxes directory (to find each sandbox's VMM).
    pub sandboxes_dir: PathBuf,
    /// Wait this long after the execs before the second memory reading
    /// (longer than the daemon's freeze delay).
    pub settle: Duration,
    /// Skip the exec phase (steps 3 and 4).
    pub no_exec: bool,
}

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum ForkBenchError {
    /// A daemon call failed.
    #[error("{what}: {source}")]
    Daemon {
        /// The call.
        what: String,
        /// Its error.
        source: shoal_client::ClientError,
    },
}

/// One system at one N.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// "fork" or "create" (the peer).
    pub system: String,
    /// Sandboxes asked for.
    pub n: usize,
    /// Sandboxes made.
    pub made: usize,
    /// Why the others were not (first few).
    pub errors: Vec<String>,
    /// Request to all made running (ms).
    pub running_ms: f64,
    /// Of which the source's snapshot (fork only; from the daemon's
    /// `forked` event).
    pub snapshot_ms: Option<f64>,
    /// Request to all made answering an exec (ms), the memory readings
    /// in between not counted (0: not measured).
    pub exec_ms: f64,
    /// Execs that failed.
    pub exec_errors: usize,
    /// Each sandbox's exec latency from the start of the exec phase (ms).
    pub exec_latency_ms: Option<Summary>,
    /// Mean PSS of the idle sandboxes' VMMs before any exec (KiB).
    pub idle_pss_kib: f64,
    /// Mean anonymous PSS of those VMMs (KiB).
    pub idle_pss_anon_kib: f64,
    /// Drop of the host's MemAvailable over the made sandboxes (KiB each;
    /// noisy on a shared host; includes the fork's snapshot in the page
    /// cache).
    pub avail_drop_kib: f64,
    /// Mean PSS once idle after one exec (KiB; 0: not measured).
    pub after_exec_pss_kib: f64,
    /// VMMs whose memory was read (of `made`).
    pub vmms_read: usize,
    /// Raw per-sandbox exec latencies (ms), for the figures.
    #[serde(skip)]
    pub exec_samples: Vec<f64>,
}

/// fork / create at one N.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// Sandboxes.
    pub n: usize,
    /// Of the time to all running.
    pub running: f64,
    /// Of the time to all answering an exec.
    pub exec: f64,
    /// Of the idle PSS per sandbox.
    pub idle_pss: f64,
}

/// The goals, and whether this run met them.
#[derive(Debug, Clone, Serialize)]
pub struct Goals {
    /// fork(100): request to all running (ms), if measured.
    pub fork100_running_ms: Option<f64>,
    /// Its goal.
    pub running_goal_ms: f64,
    /// Met.
    pub running_met: Option<bool>,
    /// Idle PSS per clone at the largest N (KiB).
    pub idle_pss_kib: Option<f64>,
    /// Its goal.
    pub memory_goal_kib: f64,
    /// Met.
    pub memory_met: Option<bool>,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct ForkReport {
    /// "fork".
    pub bench: &'static str,
    /// Host KVM type.
    pub host_kvm: &'static str,
    /// Milliseconds (memory in KiB).
    pub unit: &'static str,
    /// The template.
    pub template: String,
    /// Host CPUs.
    pub host_cpus: usize,
    /// Load average (1 min) before and after.
    pub load1: (f64, f64),
    /// Every run.
    pub runs: Vec<Run>,
    /// fork / create per N.
    pub ratios: Vec<Ratio>,
    /// The goals.
    pub goals: Goals,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Mean (PSS, anonymous PSS) in KiB of the VMMs of sandboxes `ids`, and
/// how many were read.
fn memory(dir: &Path, ids: &[String]) -> (f64, f64, usize) {
    let (mut pss, mut anon, mut n) = (0u64, 0u64, 0usize);
    for id in ids {
        for p in shoal_runtime::vm::vmms_under(&dir.join(id)) {
            let Ok(pid) = u32::try_from(p.pid) else {
                continue;
            };
            let (a, t) = pss_kib(pid);
            if t > 0 {
                pss += t;
                anon += a;
                n += 1;
            }
        }
    }
    let mean = |x: u64| if n == 0 { 0.0 } else { x as f64 / n as f64 };
    (mean(pss), mean(anon), n)
}

fn daemon<T>(what: &str, r: Result<T, shoal_client::ClientError>) -> Result<T, ForkBenchError> {
    r.map_err(|source| ForkBenchError::Daemon {
        what: what.into(),
        source,
    })
}

/// Execs `true` in every sandbox of `ids`: (latencies from the start, errors).
fn exec_all(c: &DaemonClient, ids: &[String], clients: usize) -> (Vec<f64>, Vec<String>) {
    let t0 = Instant::now();
    let lat = Mutex::new(Vec::new());
    let req = api::ExecRequest::argv(["true"]).with_timeout(600.0);
    let errs = parallel(ids.len(), clients, &|i| {
        let r = c.exec(&ids[i], &req).map_err(|e| format!("exec: {e}"))?;
        if r.exit_code != Some(0) {
            return Err(format!("exec: {r:?}"));
        }
        lat.lock().unwrap_or_else(|e| e.into_inner()).push(ms(t0));
        Ok(())
    });
    (lat.into_inner().unwrap_or_else(|e| e.into_inner()), errs)
}

fn kill_all(c: &DaemonClient, ids: &[String], clients: usize) {
    parallel(ids.len(), clients, &|i| {
        c.kill(&ids[i]).map_err(|e| e.to_string())
    });
}

/// Makes `n` sandboxes as `system` does: (ids, errors, ms to all running).
fn make(
    c: &DaemonClient,
    o: &ForkBenchOpts,
    system: &str,
    src: &str,
    n: usize,
) -> Result<(Vec<String>, Vec<String>, f64), ForkBenchError> {
    let t0 = Instant::now();
    if system == "fork" {
        let count = u32::try_from(n).unwrap_or(u32::MAX);
        let f = daemon("fork", c.fork(src, &api::ForkRequest::new(count)))?;
        let t = ms(t0);
        let ids = f.sandboxes.into_iter().map(|s| s.id).collect();
        let errs = f.failed.into_iter().map(|e| e.message).collect();
        return Ok((ids, errs, t));
    }
    let ids = Mutex::new(Vec::new());
    let errs = parallel(n, o.clients, &|_| {
        let s = c
            .create(&api::CreateSandbox::from_template(&o.template))
            .map_err(|e| format!("create: {e}"))?;
        ids.lock().unwrap_or_else(|e| e.into_inner()).push(s.id);
        Ok(())
    });
    let t = ms(t0);
    Ok((ids.into_inner().unwrap_or_else(|e| e.into_inner()), errs, t))
}

/// The snapshot time of `src`'s last fork, as its `forked` event says
/// ("... snapshot X ms ...").
fn snapshot_ms(c: &DaemonClient, src: &str) -> Option<f64> {
    let q = api::EventQuery {
        sandbox: Some(src.into()),
        ..Default::default()
    };
    let ev = c.events(&q).ok()?;
    let e = ev.iter().rev().find(|e| e.kind == "forked")?;
    let rest = e.detail.split("snapshot ").nth(1)?;
    rest.split(" ms").next()?.parse().ok()
}

/// One system at one N (`src`: the sandbox forked).
fn run_one(
    c: &DaemonClient,
    o: &ForkBenchOpts,
    system: &str,
    src: &str,
    n: usize,
) -> Result<Run, ForkBenchError> {
    let avail0 = meminfo_kib("MemAvailable");
    let (ids, errors, running_ms) = make(c, o, system, src, n)?;
    let (idle_pss_kib, idle_pss_anon_kib, vmms_read) = memory(&o.sandboxes_dir, &ids);
    let avail1 = meminfo_kib("MemAvailable");
    let (lat, exec_errs, exec_ms, after_exec_pss_kib) = if o.no_exec {
        (vec![], vec![], 0.0, 0.0)
    } else {
        let (lat, errs) = exec_all(c, &ids, o.clients);
        let exec_ms = running_ms + lat.iter().copied().fold(0.0, f64::max);
        std::thread::sleep(o.settle);
        (lat, errs, exec_ms, memory(&o.sandboxes_dir, &ids).0)
    };
    kill_all(c, &ids, o.clients);
    let snapshot_ms = match system {
        "fork" => snapshot_ms(c, src),
        _ => None,
    };
    let made = ids.len();
    Ok(Run {
        system: system.into(),
        n,
        made,
        errors: errors.into_iter().take(5).collect(),
        running_ms,
        snapshot_ms,
        exec_ms,
        exec_errors: exec_errs.len(),
        exec_latency_ms: summarize(&lat),
        idle_pss_kib,
        idle_pss_anon_kib,
        avail_drop_kib: if made == 0 {
            0.0
        } else {
            (avail0 - avail1) as f64 / made as f64
        },
        after_exec_pss_kib,
        vmms_read,
        exec_samples: lat,
    })
}

/// Runs the benchmark through the daemon `c`.
pub fn run(
    c: &DaemonClient,
    o: &ForkBenchOpts,
    progress: &mut dyn FnMut(&str),
) -> Result<ForkReport, ForkBenchError> {
    let l0 = load1();
    let mut runs = Vec::new();
    for &n in &o.counts {
        // A source that has run something (its agent connected, its
        // memory no longer the template's).
        let src = daemon(
            "create the source",
            c.create(&api::CreateSandbox::from_template(&o.template)),
        )?;
        let r = daemon(
            "exec in the source",
            c.exec(
                &src.id,
                &api::ExecRequest::shell("echo state > /tmp/state").with_timeout(600.0),
            ),
        )?;
        if r.exit_code != Some(0) {
            progress(&format!("source exec: {r:?}"));
        }
        for system in ["fork", "create"] {
            progress(&format!("{system} x{n} (load {:.1})", load1()));
            let r = run_one(c, o, system, &src.id, n)?;
            progress(&format!(
                "{system} x{n}: {} made, running {:.0} ms, exec {:.0} ms, idle PSS {:.0} KiB",
                r.made, r.running_ms, r.exec_ms, r.idle_pss_kib
            ));
            runs.push(r);
        }
        let _ = c.kill(&src.id);
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let mut ratios = Vec::new();
    for &n in &o.counts {
        let get = |s: &str| runs.iter().find(|r| r.n == n && r.system == s);
        if let (Some(f), Some(p)) = (get("fork"), get("create")) {
            ratios.push(Ratio {
                n,
                running: ratio(f.running_ms, p.running_ms),
                exec: ratio(f.exec_ms, p.exec_ms),
                idle_pss: ratio(f.idle_pss_kib, p.idle_pss_kib),
            });
        }
    }
    let f100 = runs.iter().find(|r| r.system == "fork" && r.n == 100);
    let largest = runs
        .iter()
        .filter(|r| r.system == "fork")
        .max_by_key(|r| r.n);
    let goals = Goals {
        fork100_running_ms: f100.map(|r| r.running_ms),
        running_goal_ms: RUNNING_GOAL_MS,
        running_met: f100.map(|r| r.made == 100 && r.running_ms <= RUNNING_GOAL_MS),
        idle_pss_kib: largest.map(|r| r.idle_pss_kib),
        memory_goal_kib: MEMORY_GOAL_KIB,
        memory_met: largest.map(|r| r.idle_pss_kib <= MEMORY_GOAL_KIB),
    };
    Ok(ForkReport {
        bench: "fork",
        host_kvm: vmm::host::kvm_kind().as_str(),
        unit: "ms",
        template: o.template.clone(),
        host_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        load1: (l0, load1()),
        runs,
        ratios,
        goals,
    })
}

impl ForkReport {
    /// A table for people.
    pub fn render(&self) -> String {
        let mut o = format!(
            "fork benchmark (host KVM: {}, {} CPUs, load1 {:.1} -> {:.1}), template {}\n\
             {:<7} {:>4} {:>5} {:>11} {:>8} {:>11} {:>12} {:>12} {:>12} {:>14}\n",
            self.host_kvm,
            self.host_cpus,
            self.load1.0,
            self.load1.1,
            self.template,
            "SYSTEM",
            "N",
            "MADE",
            "RUNNING_MS",
            "SNAP_MS",
            "EXEC_MS",
            "IDLE_PSS_KiB",
            "IDLE_ANON",
            "AVAIL_DROP",
            "PSS_AFTER_EXEC"
        );
        for r in &self.runs {
            o.push_str(&format!(
                "{:<7} {:>4} {:>5} {:>11.1} {:>8} {:>11.1} {:>12.0} {:>12.0} {:>12.0} {:>14.0}\n",
                r.system,
                r.n,
                r.made,
                r.running_ms,
                r.snapshot_ms.map_or("-".into(), |v| format!("{v:.1}")),
                r.exec_ms,
                r.idle_pss_kib,
                r.idle_pss_anon_kib,
                r.avail_drop_kib,
                r.after_exec_pss_kib
            ));
        }
        for r in &self.ratios {
            o.push_str(&format!(
                "fork/create at N={}: running {:.2}x, exec {:.2}x, idle PSS {:.2}x\n",
                r.n, r.running, r.exec, r.idle_pss
            ));
        }
        let g = &self.goals;
        o.push_str(&format!(
            "goals: fork(100) running {} (<= {:.0} ms: {}), idle PSS per clone {} (<= {:.0} KiB: {})\n",
            g.fork100_running_ms
                .map_or("-".into(), |v| format!("{v:.0} ms")),
            g.running_goal_ms,
            g.running_met.map_or("not measured", |m| if m { "met" } else { "NOT met" }),
            g.idle_pss_kib.map_or("-".into(), |v| format!("{v:.0} KiB")),
            g.memory_goal_kib,
            g.memory_met.map_or("not measured", |m| if m { "met" } else { "NOT met" }),
        ));
        o
    }

    fn line(&self, system: &str, f: impl Fn(&Run) -> f64) -> Vec<(f64, f64)> {
        self.runs
            .iter()
            .filter(|r| r.system == system && r.made > 0 && f(r) > 0.0)
            .map(|r| (r.n as f64, f(r)))
            .collect()
    }

    /// Draws the figures into `out`: time to all running and to all
    /// answering an exec against N, memory per idle sandbox against N,
    /// and the exec latency CDF at the largest N. Returns the files.
    pub fn plot(&self, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
        let peer = "N creates from the template (peer)";
        let sub = format!(
            "fork of a running {} sandbox vs {peer}; load1 {:.1}",
            self.template, self.load1.0
        );
        let mut files = Vec::new();
        // Lines with no point (a phase not measured) are left out, and so
        // is a figure with none.
        let mut draw = |name: &str, fig: plot::Figure, series: Vec<XySeries>| {
            let series: Vec<XySeries> = series
                .into_iter()
                .filter(|s| !s.points.is_empty())
                .collect();
            if series.is_empty() {
                return Ok(());
            }
            let p = out.path(name);
            plot::xy(&p, &fig, &series)?;
            files.push(p);
            Ok::<(), PlotError>(())
        };
        for (name, title, f) in [
            (
                "running",
                "Request to all sandboxes running",
                (|r: &Run| r.running_ms) as fn(&Run) -> f64,
            ),
            (
                "exec",
                "Request to all sandboxes answering an exec",
                |r: &Run| r.exec_ms,
            ),
        ] {
            draw(
                name,
                out.figure(title)
                    .axes("sandboxes (N)", "time (ms)")
                    .subtitle(sub.clone()),
                vec![
                    XySeries::new("shoal fork", self.line("fork", f)),
                    XySeries::new(peer, self.line("create", f)),
                ],
            )?;
        }
        let mib = |v: f64| v / 1024.0;
        draw(
            "memory",
            out.figure("Host memory per idle sandbox (VMM PSS)")
                .axes("sandboxes (N)", "PSS per sandbox (MiB)")
                .subtitle(format!("{sub}; goal for a clone: <= 1 MiB")),
            vec![
                XySeries::new(
                    "shoal fork (idle clone)",
                    self.line("fork", |r| mib(r.idle_pss_kib)),
                ),
                XySeries::new(
                    "create (idle sandbox, peer)",
                    self.line("create", |r| mib(r.idle_pss_kib)),
                ),
                XySeries::new(
                    "shoal fork, after one exec",
                    self.line("fork", |r| mib(r.after_exec_pss_kib)),
                ),
                XySeries::new(
                    "create, after one exec",
                    self.line("create", |r| mib(r.after_exec_pss_kib)),
                ),
            ],
        )?;
        if let Some(n) = self.runs.iter().map(|r| r.n).max() {
            let series: Vec<Series> = self
                .runs
                .iter()
                .filter(|r| r.n == n && !r.exec_samples.is_empty())
                .map(|r| {
                    let label = match r.system.as_str() {
                        "fork" => "shoal fork".to_string(),
                        _ => peer.to_string(),
                    };
                    Series::new(label, r.exec_samples.clone())
                })
                .collect();
            if !series.is_empty() {
                let p = out.path("exec-cdf");
                plot::latency_cdf(
                    &p,
                    &out.figure(format!(
                        "First exec in each of {n} new sandboxes, from the exec phase's start"
                    ))
                    .unit("ms")
                    .subtitle(sub),
                    &series,
                )?;
                files.push(p);
            }
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(system: &str, n: usize, running_ms: f64, exec_ms: f64) -> Run {
        Run {
            system: system.into(),
            n,
            made: n,
            errors: vec![],
            running_ms,
            snapshot_ms: (system == "fork").then_some(200.0),
            exec_ms,
            exec_errors: 0,
            exec_latency_ms: None,
            idle_pss_kib: 600.0,
            idle_pss_anon_kib: 480.0,
            avail_drop_kib: 700.0,
            after_exec_pss_kib: if exec_ms > 0.0 { 1300.0 } else { 0.0 },
            vmms_read: n,
            exec_samples: if exec_ms > 0.0 {
                vec![exec_ms; n]
            } else {
                vec![]
            },
        }
    }

    fn report(exec: bool) -> ForkReport {
        let e = |v: f64| if exec { v } else { 0.0 };
        ForkReport {
            bench: "fork",
            host_kvm: "pvm",
            unit: "ms",
            template: "tiny-1c-128m".into(),
            host_cpus: 2,
            load1: (1.0, 2.0),
            runs: vec![
                run("fork", 1, 300.0, e(1000.0)),
                run("create", 1, 30.0, e(900.0)),
                run("fork", 100, 900.0, e(9000.0)),
                run("create", 100, 800.0, e(8000.0)),
            ],
            ratios: vec![],
            goals: Goals {
                fork100_running_ms: Some(900.0),
                running_goal_ms: RUNNING_GOAL_MS,
                running_met: Some(true),
                idle_pss_kib: Some(600.0),
                memory_goal_kib: MEMORY_GOAL_KIB,
                memory_met: Some(true),
            },
        }
    }

    #[test]
    fn figures_leave_out_phases_not_measured() {
        let dir = tempfile::tempdir().unwrap();
        let out = Out::for_json(dir.path(), Path::new("bench-fork.json"));
        let names = |files: Vec<PathBuf>| -> Vec<String> {
            files
                .iter()
                .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        let all = report(true).plot(&out).unwrap();
        assert_eq!(
            names(all.clone()),
            [
                "bench-fork-running.png",
                "bench-fork-exec.png",
                "bench-fork-memory.png",
                "bench-fork-exec-cdf.png"
            ]
        );
        for f in &all {
            assert!(std::fs::metadata(f).unwrap().len() > 1000, "{f:?}");
        }
        let some = report(false).plot(&out).unwrap();
        assert_eq!(
            names(some),
            ["bench-fork-running.png", "bench-fork-memory.png"]
        );
        let table = report(false).render();
        assert!(
            table.contains("fork(100) running 900 ms (<= 1000 ms: met)"),
            "{table}"
        );
    }
}
