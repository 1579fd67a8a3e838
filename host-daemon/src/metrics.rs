//! Prometheus metrics, written in the text exposition format by hand:
//! counters and latency histograms kept here, gauges read at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Histogram bucket upper bounds, seconds.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// A latency histogram.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, secs: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(micros(secs), Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{b}\"}} {}",
                self.counts[i].load(Ordering::Relaxed)
            );
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(
            out,
            "{name}_sum {}\n{name}_count {n}",
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
    }
}

/// The daemon's metrics.
#[derive(Default)]
pub struct Metrics {
    /// Sandbox create latency (request to ready).
    pub create: Histogram,
    /// Exec latency (one-shot and streamed, to the exit).
    pub exec: Histogram,
    /// VMM restore latency (spawn to control socket answering).
    pub restore: Histogram,
    /// Creates served from a warm pool.
    pub pool_hits: AtomicU64,
    /// Creates that restored on demand.
    pub pool_misses: AtomicU64,
    /// VMMs that died unexpectedly.
    pub vmm_deaths: AtomicU64,
    /// CPU classes that could not be applied to a VMM's threads.
    pub class_failures: AtomicU64,
    /// Cold-memory eviction ([`crate::evict`]).
    pub evict: crate::evict::EvictCounters,
    /// Connections of the Unix socket listener.
    pub unix_conns: std::sync::Arc<Conns>,
    /// Connections of the TCP listener.
    pub tcp_conns: std::sync::Arc<Conns>,
    refusals: Mutex<BTreeMap<&'static str, u64>>,
    requests: Mutex<BTreeMap<u16, u64>>,
}

/// One listener's connections ([`crate::listen`]).
#[derive(Default)]
pub struct Conns {
    /// Open now.
    pub open: AtomicU64,
    /// Ended by a timeout (a late request head, a stalled body or reader).
    pub timed_out: AtomicU64,
}

/// Values read at scrape time.
pub struct Gauges {
    /// Sandboxes per state.
    pub by_state: Vec<(&'static str, u64)>,
    /// Pool target and current size per template.
    pub pools: Vec<(String, u64, u64)>,
    /// Host MemTotal and MemAvailable, bytes.
    pub host_memory: (u64, u64),
    /// Reserved guest memory (bytes) and vCPUs.
    pub reserved: (u64, u64),
    /// Budgets: guest memory (bytes) and vCPUs.
    pub budget: (u64, u64),
    /// Sandboxes whose vCPUs are paused while idle.
    pub frozen: u64,
    /// The VMM stock ([`crate::stock`]): VMMs ready, creates served from
    /// it, creates that found it empty, entries found dead.
    pub stock: (u64, u64, u64, u64),
    /// Sandboxes holding a VMM per CPU class.
    pub by_priority: Vec<(&'static str, u64)>,
    /// Whether latency sandboxes are kept off each other's SMT siblings,
    /// and the reason code when not (`no_sched_core`, `prctl_error`).
    pub smt_isolation: (bool, &'static str),
}

impl Metrics {
    /// Counts a refusal.
    pub fn refused(&self, reason: &'static str) {
        *self
            .refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(reason)
            .or_default() += 1;
    }

    /// Counts a response by status.
    pub fn response(&self, status: u16) {
        *self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(status)
            .or_default() += 1;
    }

    /// The exposition text.
    pub fn render(&self, g: &Gauges) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "# HELP shoal_sandboxes Sandboxes by state.\n# TYPE shoal_sandboxes gauge"
        );
        for (s, n) in &g.by_state {
            let _ = writeln!(o, "shoal_sandboxes{{state=\"{s}\"}} {n}");
        }
        let _ = writeln!(
            o,
            "# HELP shoal_pool_size Warm sandboxes ready per template.\n# TYPE shoal_pool_size gauge"
        );
        for (t, _, n) in &g.pools {
            let _ = writeln!(o, "shoal_pool_size{{template=\"{t}\"}} {n}");
        }
        let _ = writeln!(
            o,
            "# HELP shoal_pool_target Warm pool target size per template.\n# TYPE shoal_pool_target gauge"
        );
        for (t, target, _) in &g.pools {
            let _ = writeln!(o, "shoal_pool_target{{template=\"{t}\"}} {target}");
        }
        let _ = writeln!(
            o,
            "# HELP shoal_sandboxes_by_priority Sandboxes holding a VMM per CPU class.\n\
             # TYPE shoal_sandboxes_by_priority gauge"
        );
        for (p, n) in &g.by_priority {
            let _ = writeln!(o, "shoal_sandboxes_by_priority{{priority=\"{p}\"}} {n}");
        }
        let (iso, why) = g.smt_isolation;
        let _ = writeln!(
            o,
            "# HELP shoal_smt_isolation Whether latency sandboxes' vCPUs are kept off SMT \
             siblings running other sandboxes (core scheduling); 0 says why in `reason`.\n\
             # TYPE shoal_smt_isolation gauge\nshoal_smt_isolation{{reason=\"{why}\"}} {}",
            u8::from(iso)
        );
        let gauge = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut o,
            "shoal_host_memory_total_bytes",
            "Host MemTotal.",
            g.host_memory.0,
        );
        gauge(
            &mut o,
            "shoal_host_memory_available_bytes",
            "Host MemAvailable.",
            g.host_memory.1,
        );
        gauge(
            &mut o,
            "shoal_reserved_guest_memory_bytes",
            "Guest memory reserved by sandboxes holding a VMM.",
            g.reserved.0,
        );
        gauge(
            &mut o,
            "shoal_reserved_vcpus",
            "vCPUs reserved.",
            g.reserved.1,
        );
        gauge(
            &mut o,
            "shoal_sandboxes_frozen",
            "Idle sandboxes whose vCPUs are paused until their next request.",
            g.frozen,
        );
        gauge(
            &mut o,
            "shoal_admission_memory_budget_bytes",
            "Guest memory admission admits (host x overcommit).",
            g.budget.0,
        );
        gauge(
            &mut o,
            "shoal_admission_vcpu_budget",
            "vCPUs admission admits.",
            g.budget.1,
        );
        let _ = writeln!(
            o,
            "# HELP shoal_http_connections Open API connections per listener.\n\
             # TYPE shoal_http_connections gauge"
        );
        let listeners = [("unix", &self.unix_conns), ("tcp", &self.tcp_conns)];
        for (l, c) in listeners {
            let n = c.open.load(Ordering::Relaxed);
            let _ = writeln!(o, "shoal_http_connections{{listener=\"{l}\"}} {n}");
        }
        let _ = writeln!(
            o,
            "# HELP shoal_http_timeouts_total API connections ended by a timeout (late \
             request head, stalled body or reader).\n# TYPE shoal_http_timeouts_total counter"
        );
        for (l, c) in listeners {
            let n = c.timed_out.load(Ordering::Relaxed);
            let _ = writeln!(o, "shoal_http_timeouts_total{{listener=\"{l}\"}} {n}");
        }
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            &mut o,
            "shoal_pool_hits_total",
            "Creates served from a warm pool.",
            self.pool_hits.load(Ordering::Relaxed),
        );
        counter(
            &mut o,
            "shoal_pool_misses_total",
            "Creates that restored on demand.",
            self.pool_misses.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            o,
            "# HELP shoal_vmm_stock VMMs started ahead of their sandboxes, ready.\n\
             # TYPE shoal_vmm_stock gauge\nshoal_vmm_stock {}",
            g.stock.0
        );
        counter(
            &mut o,
            "shoal_vmm_stock_hits_total",
            "Creates and pool refills served by a stocked VMM.",
            g.stock.1,
        );
        counter(
            &mut o,
            "shoal_vmm_stock_misses_total",
            "Creates and pool refills that found no stocked VMM.",
            g.stock.2,
        );
        counter(
            &mut o,
            "shoal_vmm_stock_dead_total",
            "Stocked VMMs found dead and discarded.",
            g.stock.3,
        );
        counter(
            &mut o,
            "shoal_cpu_class_failures_total",
            "CPU classes (SCHED_IDLE, normal policy) that could not be applied to a VMM's threads.",
            self.class_failures.load(Ordering::Relaxed),
        );
        counter(
            &mut o,
            "shoal_vmm_deaths_total",
            "VMM processes that died unexpectedly.",
            self.vmm_deaths.load(Ordering::Relaxed),
        );
        self.evict.write(&mut o);
        let _ = writeln!(
            o,
            "# HELP shoal_admission_refusals_total Requests refused by admission.\n\
             # TYPE shoal_admission_refusals_total counter"
        );
        for (r, n) in self
            .refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(o, "shoal_admission_refusals_total{{reason=\"{r}\"}} {n}");
        }
        let _ = writeln!(
            o,
            "# HELP shoal_http_responses_total API responses by status.\n\
             # TYPE shoal_http_responses_total counter"
        );
        for (s, n) in self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(o, "shoal_http_responses_total{{status=\"{s}\"}} {n}");
        }
        self.create.write(
            &mut o,
            "shoal_create_seconds",
            "Sandbox create latency (request to running).",
        );
        self.exec.write(
            &mut o,
            "shoal_exec_seconds",
            "Exec latency (request to exit).",
        );
        self.restore.write(
            &mut o,
            "shoal_restore_seconds",
            "VMM restore latency (spawn to control socket answering).",
        );
        o
    }
}

/// Seconds as whole microseconds (0 for a negative or NaN time).
fn micros(secs: f64) -> u64 {
    std::time::Duration::try_from_secs_f64(secs)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_exposition() {
        let m = Metrics::default();
        m.create.observe(0.003);
        m.refused("memory_quota");
        m.response(429);
        let g = Gauges {
            by_state: vec![("running", 3)],
            pools: vec![("tiny".into(), 4, 2)],
            host_memory: (100, 50),
            reserved: (10, 1),
            budget: (1000, 100),
            frozen: 0,
            stock: (1, 2, 3, 0),
            by_priority: vec![("latency", 2), ("best_effort", 1)],
            smt_isolation: (false, "no_sched_core"),
        };
        let t = m.render(&g);
        assert!(t.contains("shoal_sandboxes{state=\"running\"} 3"));
        assert!(t.contains("shoal_pool_size{template=\"tiny\"} 2"));
        assert!(t.contains("shoal_create_seconds_bucket{le=\"0.005\"} 1"));
        assert!(t.contains("shoal_create_seconds_bucket{le=\"0.0025\"} 0"));
        assert!(t.contains("shoal_create_seconds_count 1"));
        assert!(t.contains("shoal_admission_refusals_total{reason=\"memory_quota\"} 1"));
        assert!(t.contains("shoal_http_responses_total{status=\"429\"} 1"));
        assert!(t.contains("\nshoal_vmm_stock 1\n"));
        assert!(t.contains("shoal_vmm_stock_misses_total 3"));
        assert!(t.contains("shoal_sandboxes_by_priority{priority=\"best_effort\"} 1"));
        assert!(t.contains("\nshoal_smt_isolation{reason=\"no_sched_core\"} 0\n"));
        assert!(t.contains("\nshoal_cpu_class_failures_total 0\n"));
    }
}
