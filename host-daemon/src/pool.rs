//! Warm pools: per template, a target number of sandboxes restored ahead
//! of time, refilled in the background.
//!
//! A pool holds fully restored sandboxes whose agent is already connected
//! and past `post_restore` (fresh entropy and clock per clone), rather
//! than pre-warmed empty VMMs waiting for a `restore` request: handing one
//! out is then a database update (microseconds), and the first exec pays
//! neither the restore (~1 ms pre-warmed, ~11 ms cold here) nor the agent
//! connection and post-restore round trip (tens of ms of emulated guest
//! kernel time on PVM hosts). An idle restored sandbox costs ~1-2 MiB of
//! host memory (its template's clean pages are shared), so holding them is
//! cheap; they count against admission like any sandbox.
//!
//! Refills wait while a burst of creates is being served from a pool
//! ([`hold`]): a refill is a restore plus the agent's hand-shake, CPU that
//! a burst's creates would otherwise share with it (on a 2-core host, 4
//! refills beside a burst of 50 creates stretched its tail). A refill
//! starts once no create took a pooled sandbox for [`QUIET`], or after
//! [`MAX_HOLD`] of a steady stream of them, so pools are never starved.

use super::db::{self, SandboxRow, State};
use super::{ops, ApiError, Daemon};
use shoal_runtime::backend::Source;
use shoal_runtime::fresh::random_id;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Restores in flight per pool at most.
const PARALLEL: usize = 4;

/// A pause in pool hits this long ends a burst.
pub const QUIET: Duration = Duration::from_millis(40);

/// Refills wait for a burst at most this long.
pub const MAX_HOLD: Duration = Duration::from_millis(400);

/// How much longer refills wait, `since_hit` after the last create served
/// from a pool and `held` after they began waiting: `None` to go on.
pub fn hold(since_hit: Option<Duration>, held: Duration) -> Option<Duration> {
    let since = since_hit?;
    if since >= QUIET || held >= MAX_HOLD {
        return None;
    }
    Some((QUIET - since).min(MAX_HOLD - held))
}

/// Waits while creates are being served from pools ([`hold`]).
async fn wait_for_quiet(d: &Daemon) {
    let t0 = std::time::Instant::now();
    loop {
        let hit = d.pool_hit_ms.load(Ordering::Acquire);
        let since =
            (hit != 0).then(|| Duration::from_millis(super::freeze::now_ms().saturating_sub(hit)));
        match hold(since, t0.elapsed()) {
            Some(w) => tokio::time::sleep(w).await,
            None => return,
        }
    }
}

/// Refills pools, forever.
pub async fn run(d: Arc<Daemon>) {
    let mut inflight: HashMap<String, Arc<AtomicUsize>> = HashMap::new();
    loop {
        tokio::select! {
            _ = d.pool_wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        wait_for_quiet(&d).await;
        let (pools, counts) = match d.db(|db| Ok((db.pools()?, db.pooled_counts()?))) {
            Ok(x) => x,
            Err(e) => {
                tracing::error!("pool: {e}");
                continue;
            }
        };
        for (tpl, target) in pools {
            let fl = inflight.entry(tpl.clone()).or_default().clone();
            let have =
                usize::try_from(counts.get(&tpl).copied().unwrap_or(0)).unwrap_or(usize::MAX);
            let busy = fl.load(Ordering::Acquire);
            let want = (target as usize).saturating_sub(have + busy);
            for _ in 0..want.min(PARALLEL.saturating_sub(busy)) {
                fl.fetch_add(1, Ordering::AcqRel);
                let (d, tpl, fl) = (d.clone(), tpl.clone(), fl.clone());
                tokio::spawn(async move {
                    let ok = fill_one(&d, &tpl).await;
                    fl.fetch_sub(1, Ordering::AcqRel);
                    if ok {
                        d.pool_wake.notify_one();
                    } else {
                        // Refused or failed: back off before the next try.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                });
            }
            if have > target as usize && busy == 0 {
                trim(&d, &tpl, have - target as usize).await;
            }
        }
    }
}

async fn trim(d: &Arc<Daemon>, tpl: &str, n: usize) {
    let f = db::Filter {
        state: Some(State::Pooled),
        template: Some(tpl.into()),
        ..Default::default()
    };
    let rows = d.db(|db| db.list_sandboxes(&f)).unwrap_or_default();
    for r in rows.into_iter().rev().take(n) {
        let _ = ops::kill(d, &r.id, "pool above target").await;
    }
}

/// Restores one sandbox into the pool of `tpl`; false if it could not.
async fn fill_one(d: &Arc<Daemon>, tpl: &str) -> bool {
    let Ok(t) = ops::ready_template(d, tpl) else {
        return false;
    };
    let now = db::now();
    let mut id = random_id();
    let stocked = (t.kind == d.backend.kind())
        .then(|| d.stock.take(&t))
        .flatten();
    if let Some(e) = &stocked {
        id.clone_from(&e.id);
    }
    let row = SandboxRow {
        dir: d.cfg.sandboxes_dir().join(&id),
        id: id.clone(),
        template: t.name.clone(),
        kind: t.kind,
        state: State::Starting,
        vcpus: t.vcpus,
        memory_mib: t.memory_mib,
        pid: None,
        backend_state: None,
        created_at: now,
        last_active: now,
        ttl_s: 0,
        idle_timeout_s: 0,
        metadata: Default::default(),
        env: Default::default(),
        needs_post_restore: true,
        keep_running: false,
        pause_at_ttl: false,
        error: None,
        net: None,
        // Pooled sandboxes run at the default class; a create that
        // takes one gives it its own (`cpu_class::reapply`).
        priority: shoal_api::Priority::Latency,
    };
    let admitted = ops::admit_and_insert(d, &row, false);
    let stocked = match admitted {
        Ok(()) => stocked.map(|e| e.vm),
        Err(_) => {
            super::stock::discard(stocked.into_iter().collect());
            None
        }
    };
    match admitted {
        Ok(()) => {}
        Err(ApiError::Refused(e)) => {
            tracing::debug!(template = tpl, "pool refill refused: {e}");
            return false;
        }
        Err(e) => {
            tracing::warn!(template = tpl, "pool refill: {e}");
            return false;
        }
    }
    let res = async {
        let from = Source::Template(t.dir.clone());
        let r = ops::start_vmm_with(d, row, from, State::Starting, false, stocked).await?;
        let live = d
            .live(&r.id)
            .ok_or_else(|| ApiError::Internal("pooled sandbox vanished".into()))?;
        let _busy = super::freeze::busy(&live).await?;
        ops::agent(d, &live).await?;
        d.db(|db| {
            // Only a sandbox still starting joins the pool (not one killed
            // meanwhile).
            if db
                .sandbox(&r.id)?
                .is_some_and(|x| x.state == State::Starting)
            {
                db.set_state(&r.id, State::Pooled, None)?;
            }
            Ok(())
        })
    }
    .await;
    match res {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(sandbox = %id, template = tpl, "pool refill failed: {e}");
            let _ = ops::kill(d, &id, "pool refill failed").await;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_wait_for_a_burst_to_pass_but_not_forever() {
        let ms = Duration::from_millis;
        // No create ever took from a pool, or the last one is long past.
        assert_eq!(hold(None, ms(0)), None);
        assert_eq!(hold(Some(QUIET), ms(0)), None);
        assert_eq!(hold(Some(ms(10_000)), ms(0)), None);
        // Mid-burst: until the quiet gap after the last hit.
        assert_eq!(hold(Some(ms(0)), ms(0)), Some(QUIET));
        assert_eq!(hold(Some(ms(15)), ms(100)), Some(QUIET - ms(15)));
        // A steady stream: never past MAX_HOLD in all.
        assert_eq!(hold(Some(ms(1)), MAX_HOLD - ms(5)), Some(ms(5)));
        assert_eq!(hold(Some(ms(1)), MAX_HOLD), None);
    }
}
