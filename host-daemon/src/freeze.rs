//! Freezing idle sandboxes: after a short time with no API activity and no
//! operation in flight, a sandbox's vCPUs are paused (its VMM process and
//! memory stay; nothing is written to disk) and the next request continues
//! them first, in about a millisecond.
//!
//! Why: an idle guest is not free. Its kernel still takes timer and
//! housekeeping interrupts; on PVM hosts (software KVM: every guest
//! kernel instruction emulated) that measured ~1% of a host CPU per idle
//! 128 MiB guest, so 200 idle sandboxes would fill a 2-core host. Frozen,
//! they cost no CPU. The price: a sandbox nobody is talking to does not
//! run background work until the next request (execs, streams and file
//! transfers in flight keep it thawed). `--freeze-idle-ms 0` turns it off.

use super::{blocking, ApiError, ApiResult, Daemon, Live};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Marks an operation in flight on a sandbox (it is not frozen meanwhile).
pub struct Busy(Arc<Live>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.last_active_ms.store(now_ms(), Ordering::Release);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Milliseconds on the monotonic clock.
pub fn now_ms() -> u64 {
    u64::try_from(shoal_runtime::launch::monotonic_ns() / 1_000_000).unwrap_or(u64::MAX)
}

/// Marks an operation in flight and continues the vCPUs if frozen.
pub async fn busy(live: &Arc<Live>) -> ApiResult<Busy> {
    live.busy.fetch_add(1, Ordering::AcqRel);
    let now = now_ms();
    live.last_active_ms.store(now, Ordering::Release);
    live.cpu.on_request(now);
    let guard = Busy(live.clone());
    let mut frozen = live.frozen.lock().await;
    if *frozen {
        if let Some(vm) = live.vm() {
            blocking("thaw", Duration::from_secs(10), move || {
                vm.thaw().map_err(|source| ApiError::Backend {
                    context: "continuing a frozen sandbox",
                    source,
                })
            })
            .await?;
        }
        *frozen = false;
    }
    Ok(guard)
}

/// Freezes idle sandboxes, forever (every 250 ms).
pub async fn run(d: Arc<Daemon>, after: Duration) {
    let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let lives: Vec<Arc<Live>> = d
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let now = now_ms();
        for l in lives {
            let Some(vm) = l.vm() else {
                continue;
            };
            if l.keep_running.load(Ordering::Acquire)
                || l.busy.load(Ordering::Acquire) > 0
                || now.saturating_sub(l.last_active_ms.load(Ordering::Acquire)) < after_ms
            {
                continue;
            }
            let Ok(mut frozen) = l.frozen.try_lock() else {
                continue;
            };
            if *frozen
                || l.busy.load(Ordering::Acquire) > 0
                || l.expect_exit.load(Ordering::Acquire)
            {
                continue;
            }
            let res = tokio::task::spawn_blocking(move || vm.freeze()).await;
            match res {
                Ok(Ok(_)) => *frozen = true,
                Ok(Err(e)) => tracing::debug!(sandbox = %l.id, "freeze: {e}"),
                Err(e) => tracing::debug!(sandbox = %l.id, "freeze: {e}"),
            }
        }
    }
}

/// How many sandboxes are frozen now.
pub fn frozen_count(d: &Daemon) -> u64 {
    d.live
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .filter(|l| l.frozen.try_lock().is_ok_and(|f| *f))
        .count() as u64
}
