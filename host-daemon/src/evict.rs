//! Cold-memory eviction policy: the guest memory private to an idle
//! sandbox's VMM is pushed out of host RAM (the VMM's `evict` request:
//! to swap where the host has it, else to an eviction file in the
//! sandbox's directory re-mapped over guest RAM; see `vmm/src/vm/evict.rs`)
//! so that a host packed with mostly idle sandboxes holds only what they
//! touch.
//!
//! A sandbox is evicted when it has had no API activity and no operation
//! in flight for [`EvictPolicy::idle`] (frozen sandboxes are idle too), and
//! not again until it has been active since. Limits: host-wide, only while
//! MemAvailable is under [`EvictPolicy::below_available_pct`] of MemTotal
//! (100: always); at most [`EvictPolicy::per_minute`] evictions a minute
//! across the host; each call into a VMM has [`CALL_DEADLINE`]. Counters are
//! in `/metrics` (`shoal_evict_*`).

use super::{blocking, ApiError, Daemon, Live};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest one eviction may take (a VMM of a few GiB writes that much).
pub const CALL_DEADLINE: Duration = Duration::from_secs(60);

/// When idle sandboxes are evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictPolicy {
    /// Idle this long (`None`: eviction off).
    pub idle: Option<Duration>,
    /// Only while host MemAvailable is under this percentage of MemTotal
    /// (100: whatever the pressure).
    pub below_available_pct: u8,
    /// Evictions per minute across the host, at most.
    pub per_minute: u32,
    /// How often idle sandboxes are looked for.
    pub interval: Duration,
}

impl Default for EvictPolicy {
    /// Off (tests); shoald's flags turn it on.
    fn default() -> Self {
        Self {
            idle: None,
            below_available_pct: 100,
            per_minute: 30,
            interval: Duration::from_secs(1),
        }
    }
}

/// Counters, for `/metrics`.
#[derive(Debug, Default)]
pub struct EvictCounters {
    /// Evictions done.
    pub passes: AtomicU64,
    /// Pages (4 KiB) pushed out.
    pub pages: AtomicU64,
    /// Bytes written to eviction files.
    pub written_bytes: AtomicU64,
    /// Evicted pages found back in RAM at a later eviction.
    pub faulted_back_pages: AtomicU64,
    /// Evictions that failed (the VMM refused or did not answer in time).
    pub failures: AtomicU64,
    /// Idle sandboxes left alone because the host had memory to spare.
    pub no_pressure: AtomicU64,
    /// Idle sandboxes left for later by the rate limit.
    pub rate_limited: AtomicU64,
}

impl EvictCounters {
    /// Writes the counters in the exposition format.
    pub fn write(&self, o: &mut String) {
        for (name, help, v) in [
            (
                "passes",
                "Evictions of idle sandboxes' private guest memory.",
                &self.passes,
            ),
            (
                "pages",
                "Guest pages (4 KiB) pushed out of host RAM.",
                &self.pages,
            ),
            (
                "written_bytes",
                "Bytes written to eviction files.",
                &self.written_bytes,
            ),
            (
                "faulted_back_pages",
                "Evicted guest pages found back in host RAM (touched again) at a later eviction.",
                &self.faulted_back_pages,
            ),
            (
                "failures",
                "Evictions that failed or timed out.",
                &self.failures,
            ),
            (
                "no_pressure",
                "Idle sandboxes not evicted because host memory was above the threshold.",
                &self.no_pressure,
            ),
            (
                "rate_limited",
                "Idle sandboxes left for later by the eviction rate limit.",
                &self.rate_limited,
            ),
        ] {
            let _ = writeln!(
                o,
                "# HELP shoal_evict_{name}_total {help}\n# TYPE shoal_evict_{name}_total counter\n\
                 shoal_evict_{name}_total {}",
                v.load(Ordering::Relaxed)
            );
        }
    }
}

/// Whether host memory is under pressure as `p` defines it, from
/// `/proc/meminfo`'s MemTotal and MemAvailable (KiB).
pub fn under_pressure(p: &EvictPolicy, total_kib: u64, available_kib: u64) -> bool {
    p.below_available_pct >= 100
        || available_kib.saturating_mul(100)
            < total_kib.saturating_mul(u64::from(p.below_available_pct))
}

/// Whether `l` is due for eviction at `now_ms`: idle `idle_ms` and active
/// since its last eviction.
pub fn due(l: &Live, now_ms: u64, idle_ms: u64) -> bool {
    let last = l.last_active_ms.load(Ordering::Acquire);
    l.busy.load(Ordering::Acquire) == 0
        && !l.expect_exit.load(Ordering::Acquire)
        && now_ms.saturating_sub(last) >= idle_ms
        && l.evicted_at_ms.load(Ordering::Acquire) <= last
}

/// A token bucket of `per_minute` evictions.
#[derive(Debug)]
pub struct Rate {
    per_minute: u32,
    tokens: f64,
    at_ms: u64,
}

impl Rate {
    /// Full.
    pub fn new(per_minute: u32, now_ms: u64) -> Rate {
        Rate {
            per_minute,
            tokens: f64::from(per_minute),
            at_ms: now_ms,
        }
    }

    /// Takes a token if there is one.
    pub fn take(&mut self, now_ms: u64) -> bool {
        let cap = f64::from(self.per_minute);
        let dt = now_ms.saturating_sub(self.at_ms) as f64 / 60_000.0;
        self.tokens = (self.tokens + dt * cap).min(cap);
        self.at_ms = now_ms;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Evicts one sandbox now, counting what happened.
pub async fn evict_one(d: &Daemon, l: &Arc<Live>) -> Result<Option<vmm_api::EvictInfo>, ApiError> {
    let Some(vm) = l.vm() else {
        return Ok(None);
    };
    let c = &d.metrics.evict;
    let res = blocking("evict", CALL_DEADLINE, move || {
        vm.evict().transpose().map_err(|source| ApiError::Backend {
            context: "evicting a sandbox's memory",
            source,
        })
    })
    .await;
    match &res {
        Ok(Some(e)) => {
            c.passes.fetch_add(1, Ordering::Relaxed);
            c.pages.fetch_add(e.pages, Ordering::Relaxed);
            c.written_bytes
                .fetch_add(e.written_bytes, Ordering::Relaxed);
            c.faulted_back_pages
                .fetch_add(e.faulted_back_pages, Ordering::Relaxed);
        }
        Ok(None) => {}
        Err(_) => {
            c.failures.fetch_add(1, Ordering::Relaxed);
        }
    }
    res
}

/// Evicts idle sandboxes by `p`, forever.
pub async fn run(d: Arc<Daemon>, p: EvictPolicy) {
    let Some(idle) = p.idle else {
        return;
    };
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
    let mut rate = Rate::new(p.per_minute, super::freeze::now_ms());
    loop {
        tokio::time::sleep(p.interval).await;
        let now = super::freeze::now_ms();
        let lives: Vec<Arc<Live>> = d
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|l| due(l, now, idle_ms))
            .cloned()
            .collect();
        if lives.is_empty() {
            continue;
        }
        let kib = super::admission::meminfo_kib;
        let (total, avail) = (
            kib("MemTotal").unwrap_or(0),
            kib("MemAvailable").unwrap_or(0),
        );
        if !under_pressure(&p, total, avail) {
            d.metrics
                .evict
                .no_pressure
                .fetch_add(lives.len() as u64, Ordering::Relaxed);
            continue;
        }
        for l in lives {
            if !rate.take(super::freeze::now_ms()) {
                d.metrics.evict.rate_limited.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // Marked first: an eviction that fails is not retried until
            // the sandbox was active again.
            l.evicted_at_ms
                .store(super::freeze::now_ms(), Ordering::Release);
            match evict_one(&d, &l).await {
                Ok(Some(e)) => tracing::debug!(
                    sandbox = %l.id,
                    pages = e.pages,
                    held_ms = e.held_ms,
                    "evicted"
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(sandbox = %l.id, "evict: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_threshold() {
        let p = EvictPolicy {
            below_available_pct: 20,
            ..Default::default()
        };
        assert!(under_pressure(&p, 1000, 199));
        assert!(!under_pressure(&p, 1000, 200));
        let always = EvictPolicy::default();
        assert!(under_pressure(&always, 1000, 1000));
    }

    #[test]
    fn the_rate_refills_over_a_minute() {
        let mut r = Rate::new(2, 0);
        assert!(r.take(0) && r.take(0));
        assert!(!r.take(1000));
        assert!(r.take(30_000));
        assert!(!r.take(30_000));
    }

    #[test]
    fn due_when_idle_and_active_since_the_last_eviction() {
        let l = Live::new("x", std::path::Path::new("/nonexistent"), None, false);
        l.last_active_ms.store(1000, Ordering::Release);
        assert!(!due(&l, 1500, 1000), "active 0.5 s ago");
        assert!(due(&l, 2000, 1000));
        l.evicted_at_ms.store(2000, Ordering::Release);
        assert!(!due(&l, 9000, 1000), "evicted, not active since");
        l.last_active_ms.store(3000, Ordering::Release);
        assert!(due(&l, 9000, 1000));
        l.busy.store(1, Ordering::Release);
        assert!(!due(&l, 9000, 1000), "an operation in flight");
    }
}
