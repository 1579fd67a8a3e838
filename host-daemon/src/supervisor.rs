//! Supervision: TTLs and idle timeouts are swept periodically, and on
//! start the daemon reattaches to the VMs that outlived it or reclaims
//! what is left of the others, through its backend (each VM it keeps is
//! then watched: [`crate::watch`]).

use super::db::{self, State};
use super::watch::{reclaim, watch};
use super::{lifecycle, ops, Daemon, Live};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Failed sandboxes are listed this long, then forgotten.
const FAILED_KEPT_S: f64 = 3600.0;

/// How often the sweep looks for left-over VMM cgroups.
pub const CGROUP_SWEEP: std::time::Duration = std::time::Duration::from_secs(30);

/// Enforces TTLs and idle timeouts (and removes left-over VMM cgroups),
/// forever.
pub async fn sweep_loop(d: Arc<Daemon>) {
    let mut cgroups_swept = std::time::Instant::now();
    loop {
        tokio::time::sleep(d.cfg.sweep_interval).await;
        // VMM cgroups left by jailers killed while this daemon runs (at a
        // start, a restart's recovery removes them at once).
        if cgroups_swept.elapsed() >= CGROUP_SWEEP {
            cgroups_swept = std::time::Instant::now();
            let bs: Vec<_> = d.backends.values().cloned().collect();
            let n = tokio::task::spawn_blocking(move || {
                bs.iter()
                    .map(|b| b.sweep_cgroups(shoal_runtime::backend::microvm::CGROUP_AGE))
                    .sum::<usize>()
            })
            .await
            .unwrap_or(0);
            if n > 0 {
                tracing::info!(removed = n, "left-over VMM cgroups removed");
            }
        }
        let rows = match d.db(|db| db.list_sandboxes(&db::Filter::default())) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("sweep: {e}");
                continue;
            }
        };
        let now = db::now();
        d.net.sweep(&d).await;
        for r in rows {
            let d = d.clone();
            let ttl_reached =
                r.ttl_s > 0 && now > r.created_at + r.ttl_s as f64 && r.state != State::Failed;
            if ttl_reached && r.pause_at_ttl {
                if r.state == State::Running {
                    tokio::spawn(async move { pause_at_ttl(&d, &r).await });
                }
            } else if ttl_reached {
                tokio::spawn(async move {
                    let why = format!("TTL of {} s reached", r.ttl_s);
                    if let Err(e) = ops::kill(&d, &r.id, &why).await {
                        tracing::warn!(sandbox = %r.id, "TTL kill: {e}");
                    }
                });
            } else if r.state == State::Running
                && r.idle_timeout_s > 0
                && now > r.last_active + r.idle_timeout_s as f64
                && d.live(&r.id)
                    .is_some_and(|l| l.busy.load(Ordering::Acquire) == 0)
            {
                tokio::spawn(async move {
                    d.event(
                        &r.id,
                        "idle",
                        &format!("idle for {} s: pausing", r.idle_timeout_s),
                    );
                    if let Err(e) = lifecycle::pause(&d, &r.id).await {
                        tracing::warn!(sandbox = %r.id, "idle pause: {e}");
                        d.event(
                            &r.id,
                            "idle",
                            &format!("pause failed ({e}); retried when idle again"),
                        );
                        // Tried again after another idle timeout, not every sweep.
                        let _ = d.db(|db| db.touch(&r.id, db::now()));
                    }
                });
            } else if r.state == State::Failed && now > r.last_active + FAILED_KEPT_S {
                let _ = d.db(|db| db.delete_sandbox(&r.id));
            }
        }
    }
}

/// A `pause_at_ttl` sandbox's TTL is reached: it is paused (to disk) and
/// its TTL cleared, so that a resume is not paused again at once. If it
/// cannot be paused it is killed, as any sandbox at its TTL.
async fn pause_at_ttl(d: &Arc<Daemon>, r: &db::SandboxRow) {
    d.event(
        &r.id,
        "ttl",
        &format!("TTL of {} s reached: pausing (pause_at_ttl)", r.ttl_s),
    );
    // Cleared first: whoever sees it paused sees no TTL, and no later
    // sweep takes it up again while it is being paused.
    if let Err(e) = d.db(|db| db.set_limits(&r.id, Some(0), None)) {
        tracing::warn!(sandbox = %r.id, "TTL pause: clearing the TTL: {e}");
    }
    match lifecycle::pause(d, &r.id).await {
        Ok(_) => {}
        Err(e) => {
            let why = format!("TTL of {} s reached and the pause failed ({e})", r.ttl_s);
            if let Err(e) = ops::kill(d, &r.id, &why).await {
                tracing::warn!(sandbox = %r.id, "TTL kill: {e}");
            }
        }
    }
}

/// What recovery found.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Recovery {
    /// VMMs reattached.
    pub reattached: usize,
    /// Sandboxes whose VMM was gone or unusable (reclaimed, marked failed).
    pub reclaimed: usize,
    /// Paused sandboxes kept.
    pub paused: usize,
    /// Directories with no sandbox, removed.
    pub stray_dirs: usize,
    /// VMM processes with no sandbox, killed.
    pub stray_vmms: usize,
}

/// On start: reattach to VMMs still running, reclaim the rest.
pub async fn recover(d: &Arc<Daemon>) -> Recovery {
    let mut rec = Recovery::default();
    let all = db::Filter {
        include_pooled: true,
        ..Default::default()
    };
    let rows = d.db(|db| db.list_sandboxes(&all)).unwrap_or_default();
    let mut keep_dirs = HashSet::new();
    let mut tracked = HashSet::new();
    for r in rows {
        let lost = |what: &str| {
            format!(
                "VMM lost while the daemon was down (state was {}): {what}",
                r.state.as_str()
            )
        };
        let backend = match d.backend_for(r.kind) {
            Some(b) => b,
            None => {
                if r.state != State::Failed {
                    // A kind this daemon does not run (now): it cannot run
                    // or reattach it.
                    let why = format!(
                        "a {} sandbox, and this daemon runs {} sandboxes",
                        r.kind,
                        d.kinds().join(", ")
                    );
                    let _ = d.db(|db| db.set_state(&r.id, State::Failed, Some(&why)));
                    keep_dirs.insert(r.dir.clone());
                    rec.reclaimed += 1;
                }
                continue;
            }
        };
        let (dir, state) = (r.dir.clone(), r.backend_state.clone());
        match r.state {
            State::Paused => {
                let ok = tokio::task::spawn_blocking(move || {
                    state.is_some_and(|s| backend.can_resume(&dir, &s))
                })
                .await
                .unwrap_or(false);
                if ok {
                    keep_dirs.insert(r.dir.clone());
                    d.insert_live(Arc::new(Live::new(&r.id, &r.dir, None, true)));
                    rec.paused += 1;
                } else {
                    let _ =
                        d.db(|db| db.set_state(&r.id, State::Failed, Some("paused state lost")));
                }
            }
            State::Failed => {}
            State::Starting | State::Pausing => {
                // Half started or half paused: whatever runs is unusable.
                let _ = tokio::task::spawn_blocking(move || {
                    if let Some(s) = state {
                        backend.discard(&dir, &s);
                    }
                })
                .await;
                reclaim(d, &r.id, &lost("it was not running")).await;
                rec.reclaimed += 1;
            }
            State::Running | State::Pooled => {
                let found = tokio::task::spawn_blocking(move || match state {
                    Some(s) => backend.reattach(&dir, &s).map_err(|e| e.to_string()),
                    None => Err("no backend state recorded".into()),
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
                match found {
                    Ok(found) => {
                        let vm = found.vm;
                        let live = Arc::new(Live::new(
                            &r.id,
                            &r.dir,
                            Some(vm.clone()),
                            r.needs_post_restore,
                        ));
                        *live.frozen.lock().await = found.frozen;
                        live.keep_running.store(r.keep_running, Ordering::Release);
                        d.insert_live(live.clone());
                        keep_dirs.insert(r.dir.clone());
                        tracked.insert(vm.pid());
                        d.event(&r.id, "reattached", &format!("VMM pid {}", vm.pid()));
                        // Its threads kept their policy; its cgroup's
                        // weight is written again, and threads checked.
                        super::cpu_class::reapply(d, &live, r.priority).await;
                        watch(d.clone(), live, vm);
                        rec.reattached += 1;
                    }
                    Err(e) => {
                        reclaim(d, &r.id, &lost(&e)).await;
                        rec.reclaimed += 1;
                    }
                }
            }
        }
    }
    for e in std::fs::read_dir(d.cfg.sandboxes_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        if !keep_dirs.contains(&e.path()) {
            let _ = std::fs::remove_dir_all(e.path());
            rec.stray_dirs += 1;
        }
    }
    let (bs, root): (Vec<_>, _) = (
        d.backends.values().cloned().collect(),
        d.cfg.sandboxes_dir(),
    );
    rec.stray_vmms = tokio::task::spawn_blocking(move || {
        bs.iter()
            .map(|b| b.reclaim_strays(&root, &|pid| tracked.contains(&pid)))
            .sum::<usize>()
    })
    .await
    .unwrap_or(0);
    tracing::info!(
        reattached = rec.reattached,
        reclaimed = rec.reclaimed,
        paused = rec.paused,
        stray_dirs = rec.stray_dirs,
        stray_vmms = rec.stray_vmms,
        "recovered state"
    );
    rec
}
