//! `shoal bench load`: shoald under load, through its HTTP API.
//!
//! 1. create → exec → destroy cycles at each concurrency level (p50/p99 of
//!    each step and of the cycle, sandboxes/s, errors);
//! 2. the create rate from a warm template: a burst served by the warm
//!    pool, and a burst restored on demand (pool off);
//! 3. idle capacity: sandboxes created (no exec) until admission refuses,
//!    or the cap is reached; host memory then, and whether the last ones
//!    still answer.

use crate::stats::{summarize, Summary};
use serde::Serialize;
use shoal_client::{api, ClientError, DaemonClient};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadOpts {
    /// Template name to create from.
    pub template: String,
    /// Concurrency levels for the cycle test.
    pub concurrency: Vec<usize>,
    /// Cycles per level: max(this, the level).
    pub min_cycles: usize,
    /// The exec step's argv (empty: no exec).
    pub exec: Vec<String>,
    /// Creates in each create-rate burst.
    pub burst: usize,
    /// Concurrency of the bursts and of the idle fill.
    pub burst_concurrency: usize,
    /// Stop the idle fill here even if admission still admits.
    pub idle_max: usize,
}

/// One concurrency level.
#[derive(Debug, Serialize)]
pub struct Level {
    /// Concurrent clients.
    pub concurrency: usize,
    /// Cycles attempted.
    pub cycles: usize,
    /// Cycles that failed (any step).
    pub errors: usize,
    /// First few error messages.
    pub error_samples: Vec<String>,
    /// Completed cycles per second.
    pub sandboxes_per_s: f64,
    /// Create latency (ms).
    pub create_ms: Option<Summary>,
    /// Exec latency (ms; includes the first agent connection).
    pub exec_ms: Option<Summary>,
    /// Destroy latency (ms).
    pub destroy_ms: Option<Summary>,
    /// Whole cycle (ms).
    pub cycle_ms: Option<Summary>,
    /// The samples behind `cycle_ms` (figures only).
    #[serde(skip)]
    pub cycle_samples: Vec<f64>,
}

/// A create burst.
#[derive(Debug, Serialize)]
pub struct Burst {
    /// From the warm pool or restored on demand.
    pub source: String,
    /// Creates.
    pub n: usize,
    /// Failed creates.
    pub errors: usize,
    /// Creates per second.
    pub per_s: f64,
    /// Create latency (ms).
    pub create_ms: Option<Summary>,
    /// Pool hits among them.
    pub pool_hits: usize,
    /// The samples behind `create_ms` (figures only).
    #[serde(skip)]
    pub create_samples: Vec<f64>,
}

/// Idle capacity.
#[derive(Debug, Serialize)]
pub struct Idle {
    /// Sandboxes held at once.
    pub held: usize,
    /// Why the fill stopped: the refusal (status and message) or the cap.
    pub stopped_by: String,
    /// Host MemAvailable before and at the peak (MiB).
    pub mem_available_before_mib: u64,
    /// At the peak.
    pub mem_available_peak_mib: u64,
    /// (before - peak) / held, KiB.
    pub host_kib_per_sandbox: u64,
    /// Seconds to fill.
    pub fill_s: f64,
    /// Of 5 sandboxes picked across the fill, how many answered an exec.
    pub probes_ok: usize,
    /// Requests that failed below the admission limit (not refusals).
    pub errors_below_limit: usize,
    /// Host load average (1 min) at the peak.
    pub load1_at_peak: f64,
}

/// The report.
#[derive(Debug, Serialize)]
pub struct LoadReport {
    /// "load".
    pub bench: &'static str,
    /// Host KVM type.
    pub host_kvm: &'static str,
    /// Milliseconds.
    pub unit: &'static str,
    /// The exec step.
    pub exec: Vec<String>,
    /// Cycle levels.
    pub levels: Vec<Level>,
    /// Create bursts.
    pub create_rate: Vec<Burst>,
    /// Idle capacity.
    pub idle: Option<Idle>,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn create(c: &DaemonClient, tpl: &str) -> Result<api::Sandbox, ClientError> {
    c.create(&api::CreateSandbox::from_template(tpl))
}

fn destroy(c: &DaemonClient, id: &str) -> Result<(), ClientError> {
    c.kill(id)
}

fn exec(c: &DaemonClient, id: &str, argv: &[String]) -> Result<(), ClientError> {
    let v = c.exec(
        id,
        &api::ExecRequest::argv(argv.iter().cloned()).with_timeout(600.0),
    )?;
    if v.exit_code != Some(0) {
        return Err(ClientError::Protocol(format!("exec: {v:?}")));
    }
    Ok(())
}

/// Runs `n` jobs on `k` threads; `f(i)` returns Err(message) on failure.
pub(crate) fn parallel(
    n: usize,
    k: usize,
    f: &(dyn Fn(usize) -> Result<(), String> + Sync),
) -> Vec<String> {
    let next = AtomicUsize::new(0);
    let errs = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..k.min(n).max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                if let Err(e) = f(i) {
                    errs.lock().unwrap_or_else(|e| e.into_inner()).push(e);
                }
            });
        }
    });
    errs.into_inner().unwrap_or_else(|e| e.into_inner())
}

fn level(c: &DaemonClient, o: &LoadOpts, k: usize) -> Level {
    let n = o.min_cycles.max(k);
    let lat = Mutex::new((Vec::new(), Vec::new(), Vec::new(), Vec::new()));
    let t0 = Instant::now();
    let errs = parallel(n, k, &|_| {
        let t = Instant::now();
        let sb = create(c, &o.template).map_err(|e| format!("create: {e}"))?;
        let tc = ms(t);
        let id = sb.id;
        let te = Instant::now();
        let r = if o.exec.is_empty() {
            Ok(())
        } else {
            exec(c, &id, &o.exec).map_err(|e| format!("exec: {e}"))
        };
        let tx = ms(te);
        let td = Instant::now();
        let d = destroy(c, &id).map_err(|e| format!("destroy: {e}"));
        let tdd = ms(td);
        r?;
        d?;
        let mut l = lat.lock().unwrap_or_else(|e| e.into_inner());
        l.0.push(tc);
        l.1.push(tx);
        l.2.push(tdd);
        l.3.push(ms(t));
        Ok(())
    });
    let secs = t0.elapsed().as_secs_f64();
    let (a, b, d, cy) = lat.into_inner().unwrap_or_else(|e| e.into_inner());
    Level {
        concurrency: k,
        cycles: n,
        errors: errs.len(),
        error_samples: errs.into_iter().take(5).collect(),
        sandboxes_per_s: cy.len() as f64 / secs,
        create_ms: summarize(&a),
        exec_ms: summarize(&b),
        destroy_ms: summarize(&d),
        cycle_ms: summarize(&cy),
        cycle_samples: cy,
    }
}

fn pool(c: &DaemonClient, tpl: &str, target: usize) -> Result<(), ClientError> {
    let target = u32::try_from(target)
        .map_err(|_| ClientError::Protocol(format!("pool target {target} too large")))?;
    c.set_pool(tpl, target).map(drop)
}

fn pool_ready(c: &DaemonClient) -> u64 {
    c.pools()
        .ok()
        .and_then(|v| v.first().map(|p| p.ready))
        .unwrap_or(0)
}

fn burst(c: &DaemonClient, o: &LoadOpts, source: &str) -> Burst {
    let ids = Mutex::new(Vec::new());
    let lat = Mutex::new(Vec::new());
    let hits = AtomicUsize::new(0);
    let t0 = Instant::now();
    let errs = parallel(o.burst, o.burst_concurrency, &|_| {
        let t = Instant::now();
        let sb = create(c, &o.template).map_err(|e| e.to_string())?;
        lat.lock().unwrap_or_else(|e| e.into_inner()).push(ms(t));
        if sb.from_pool == Some(true) {
            hits.fetch_add(1, Ordering::Relaxed);
        }
        ids.lock().unwrap_or_else(|e| e.into_inner()).push(sb.id);
        Ok(())
    });
    let secs = t0.elapsed().as_secs_f64();
    let ids = ids.into_inner().unwrap_or_else(|e| e.into_inner());
    let _ = pool(c, &o.template, 0);
    parallel(ids.len(), 8, &|i| {
        destroy(c, &ids[i]).map_err(|e| e.to_string())
    });
    let lat = lat.into_inner().unwrap_or_else(|e| e.into_inner());
    Burst {
        source: source.into(),
        n: o.burst,
        errors: errs.len(),
        per_s: lat.len() as f64 / secs,
        create_ms: summarize(&lat),
        pool_hits: hits.load(Ordering::Relaxed),
        create_samples: lat,
    }
}

fn idle(c: &DaemonClient, o: &LoadOpts, progress: &mut dyn FnMut(&str)) -> Idle {
    let before = available_mib();
    let ids = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let why = Mutex::new(String::from("the --idle-max cap"));
    let t0 = Instant::now();
    let errs = parallel(o.idle_max, o.burst_concurrency, &|_| {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        match create(c, &o.template) {
            Ok(sb) => {
                let mut v = ids.lock().unwrap_or_else(|e| e.into_inner());
                v.push(sb.id);
                if v.len() % 100 == 0 {
                    eprintln!("  {} idle sandboxes", v.len());
                }
                Ok(())
            }
            Err(ClientError::Api {
                status,
                code: Some(code),
                message,
            }) if code.retryable() => {
                if !stop.swap(true, Ordering::AcqRel) {
                    *why.lock().unwrap_or_else(|e| e.into_inner()) =
                        format!("HTTP {status}: {message}");
                }
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    });
    let fill_s = t0.elapsed().as_secs_f64();
    // Let the last restores settle before reading memory.
    std::thread::sleep(Duration::from_secs(3));
    let peak = available_mib();
    let load1 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0);
    let ids = ids.into_inner().unwrap_or_else(|e| e.into_inner());
    progress(&format!(
        "  holding {} idle sandboxes; probing 5 with an exec",
        ids.len()
    ));
    let probes: Vec<&String> = (0..5)
        .filter_map(|i| ids.get(i * ids.len().saturating_sub(1) / 4))
        .collect();
    let probe_errs = parallel(probes.len(), 5, &|i| {
        exec(c, probes[i], &["true".to_string()]).map_err(|e| e.to_string())
    });
    progress("  removing them");
    parallel(ids.len(), 8, &|i| {
        destroy(c, &ids[i]).map_err(|e| e.to_string())
    });
    Idle {
        held: ids.len(),
        stopped_by: why.into_inner().unwrap_or_else(|e| e.into_inner()),
        mem_available_before_mib: before,
        mem_available_peak_mib: peak,
        host_kib_per_sandbox: (before.saturating_sub(peak) * 1024) / ids.len().max(1) as u64,
        fill_s,
        probes_ok: probes.len() - probe_errs.len(),
        errors_below_limit: errs.len(),
        load1_at_peak: load1,
    }
}

/// Runs the benchmark against the daemon behind `c`.
pub fn run(c: &DaemonClient, o: &LoadOpts, progress: &mut dyn FnMut(&str)) -> LoadReport {
    let mut levels = Vec::new();
    for &k in &o.concurrency {
        progress(&format!(
            "cycles at concurrency {k} ({} cycles)",
            o.min_cycles.max(k)
        ));
        let l = level(c, o, k);
        progress(&format!(
            "  {:.1} sandboxes/s, {} errors, cycle p50 {:.0} ms",
            l.sandboxes_per_s,
            l.errors,
            l.cycle_ms.as_ref().map_or(0.0, |s| s.median)
        ));
        levels.push(l);
    }
    let mut create_rate = Vec::new();
    if o.burst > 0 {
        progress(&format!(
            "create burst from the warm pool ({} creates)",
            o.burst
        ));
        let _ = pool(c, &o.template, o.burst);
        let end = Instant::now() + Duration::from_secs(600);
        while usize::try_from(pool_ready(c)).unwrap_or(usize::MAX) < o.burst && Instant::now() < end
        {
            std::thread::sleep(Duration::from_millis(200));
        }
        create_rate.push(burst(c, o, "warm pool"));
        progress(&format!(
            "create burst restored on demand ({} creates)",
            o.burst
        ));
        create_rate.push(burst(c, o, "restore on demand"));
    }
    let idle = (o.idle_max > 0).then(|| {
        progress(&format!("idle capacity (up to {})", o.idle_max));
        idle(c, o, progress)
    });
    LoadReport {
        bench: "load",
        host_kvm: vmm::host::kvm_kind().as_str(),
        unit: "ms",
        exec: o.exec.clone(),
        levels,
        create_rate,
        idle,
    }
}

impl LoadReport {
    /// A table for people.
    pub fn render(&self) -> String {
        let f = |s: &Option<Summary>| {
            s.as_ref()
                .map_or("-".into(), |s| format!("{:.1}/{:.1}", s.median, s.p99))
        };
        let mut o = format!(
            "load benchmark (host KVM: {}), exec {:?}; latencies p50/p99 ms\n{:>5} {:>6} {:>6} {:>9} {:>14} {:>14} {:>14} {:>14}\n",
            self.host_kvm, self.exec, "CONC", "CYCLES", "ERRORS", "SBX/S", "CREATE", "EXEC", "DESTROY", "CYCLE"
        );
        for l in &self.levels {
            o.push_str(&format!(
                "{:>5} {:>6} {:>6} {:>9.1} {:>14} {:>14} {:>14} {:>14}\n",
                l.concurrency,
                l.cycles,
                l.errors,
                l.sandboxes_per_s,
                f(&l.create_ms),
                f(&l.exec_ms),
                f(&l.destroy_ms),
                f(&l.cycle_ms)
            ));
        }
        for b in &self.create_rate {
            o.push_str(&format!(
                "create burst, {}: {} creates, {:.0}/s, p50/p99 {} ms, {} pool hits, {} errors\n",
                b.source,
                b.n,
                b.per_s,
                f(&b.create_ms),
                b.pool_hits,
                b.errors
            ));
        }
        if let Some(i) = &self.idle {
            o.push_str(&format!(
                "idle: held {} sandboxes (stopped by {}); MemAvailable {} -> {} MiB ({} KiB each); \
                 filled in {:.1} s; load1 {:.1}; probes ok {}/5; errors below the limit {}\n",
                i.held, i.stopped_by, i.mem_available_before_mib, i.mem_available_peak_mib,
                i.host_kib_per_sandbox, i.fill_s, i.load1_at_peak, i.probes_ok, i.errors_below_limit
            ));
        }
        o
    }
}

/// The host's MemAvailable in MiB.
fn available_mib() -> u64 {
    u64::try_from(crate::hostmem::meminfo_kib("MemAvailable")).unwrap_or(0) / 1024
}
