//! Supervision: every VMM is watched through a pidfd, so a death is
//! noticed at once (marked failed, reclaimed); TTLs and idle timeouts are
//! swept periodically; and on start the daemon reattaches to the VMMs that
//! outlived it or reclaims what is left of the others.

use super::db::{self, State};
use super::{ops, Daemon, Live};
use shoal_runtime::vm;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use vmm_api::{Client, VmState};

/// Watches `p` (the VMM of `live`) until it exits.
pub fn watch(d: Arc<Daemon>, live: Arc<Live>, p: vm::Proc) {
    tokio::spawn(async move {
        let afd = p.pidfd().and_then(|fd| {
            // SAFETY: the AsyncFd owns the OwnedFd, which stays open and
            // unchanged until the AsyncFd is dropped.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                .map_err(|e| e.into_parts().1)
        });
        match afd {
            Ok(afd) => {
                let _ = afd.readable().await;
            }
            Err(_) => {
                // No pidfd (old kernel, or already gone): poll.
                while p.alive() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        exited(&d, &live, p).await;
    });
}

async fn exited(d: &Arc<Daemon>, live: &Arc<Live>, p: vm::Proc) {
    p.reap();
    if live.proc() != Some(p) || live.expect_exit.load(Ordering::Acquire) {
        return; // the daemon's doing (kill, pause), or an older VMM
    }
    d.metrics.vmm_deaths.fetch_add(1, Ordering::Relaxed);
    live.set_proc(None);
    *live.client.lock().await = None;
    let why = format!(
        "VMM (pid {}) exited unexpectedly: {}",
        p.pid,
        vm::log_tail(&live.paths)
    );
    reclaim(d, &live.id, &why).await;
}

/// Marks a sandbox failed (a pooled one is just dropped) and removes its
/// files and live side.
pub async fn reclaim(d: &Arc<Daemon>, id: &str, why: &str) {
    let row = d.db(|db| db.sandbox(id)).ok().flatten();
    d.remove_live(id);
    let Some(r) = row else { return };
    let res = d.db(|db| {
        if r.state == State::Pooled {
            db.delete_sandbox(id)?;
        } else {
            db.set_state(id, State::Failed, Some(why))?;
            db.touch(id, db::now())?;
        }
        Ok(())
    });
    if let Err(e) = res {
        tracing::error!(sandbox = id, "recording a failure: {e}");
    }
    let dir = r.dir.clone();
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    d.event(id, "failed", why);
    if r.state == State::Pooled {
        d.pool_wake.notify_one();
    }
}

/// Failed sandboxes are listed this long, then forgotten.
const FAILED_KEPT_S: f64 = 3600.0;

/// Enforces TTLs and idle timeouts, forever.
pub async fn sweep_loop(d: Arc<Daemon>) {
    loop {
        tokio::time::sleep(d.cfg.sweep_interval).await;
        let rows = match d.db(|db| db.list_sandboxes(&db::Filter::default())) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("sweep: {e}");
                continue;
            }
        };
        let now = db::now();
        for r in rows {
            let d = d.clone();
            if r.ttl_s > 0 && now > r.created_at + r.ttl_s as f64 && r.state != State::Failed {
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
                    if let Err(e) = ops::pause(&d, &r.id).await {
                        tracing::warn!(sandbox = %r.id, "idle pause: {e}");
                    }
                });
            } else if r.state == State::Failed && now > r.last_active + FAILED_KEPT_S {
                let _ = d.db(|db| db.delete_sandbox(&r.id));
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
        match r.state {
            State::Paused => {
                let live = Arc::new(Live::new(&r.id, &r.dir, None, true));
                if live.paths.latest_snapshot().is_some() {
                    keep_dirs.insert(r.dir.clone());
                    d.insert_live(live);
                    rec.paused += 1;
                } else {
                    let _ =
                        d.db(|db| db.set_state(&r.id, State::Failed, Some("paused state lost")));
                }
            }
            State::Failed => {}
            State::Running | State::Pooled | State::Starting | State::Pausing => {
                let p = r
                    .pid
                    .zip(r.pid_start)
                    .map(|(pid, start)| vm::Proc { pid, start });
                let sock = r.dir.join("api.sock");
                let usable: Option<bool> = match p {
                    Some(p) if p.alive() && matches!(r.state, State::Running | State::Pooled) => {
                        tokio::task::spawn_blocking(move || {
                            // Running, or frozen (vCPUs paused by the freezer).
                            let st = Client::new(&sock, Duration::from_secs(3)).stats();
                            match st.map(|s| s.state) {
                                Ok(VmState::Running) => Some(false),
                                Ok(VmState::Paused) => Some(true),
                                Ok(VmState::Empty) | Err(_) => None,
                            }
                        })
                        .await
                        .unwrap_or(None)
                    }
                    _ => None,
                };
                match (p, usable) {
                    (Some(p), Some(frozen)) => {
                        let live =
                            Arc::new(Live::new(&r.id, &r.dir, Some(p), r.needs_post_restore));
                        *live.frozen.lock().await = frozen;
                        live.keep_running.store(r.keep_running, Ordering::Release);
                        d.insert_live(live.clone());
                        watch(d.clone(), live, p);
                        keep_dirs.insert(r.dir.clone());
                        tracked.insert(p.pid);
                        d.event(&r.id, "reattached", &format!("VMM pid {}", p.pid));
                        rec.reattached += 1;
                    }
                    _ => {
                        if let Some(p) = p {
                            p.kill();
                            p.wait_gone(Duration::from_secs(2));
                        }
                        let why = format!(
                            "VMM lost while the daemon was down (state was {})",
                            r.state.as_str()
                        );
                        reclaim(d, &r.id, &why).await;
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
    for p in vm::vmms_under(&d.cfg.sandboxes_dir()) {
        if !tracked.contains(&p.pid) {
            p.kill();
            p.wait_gone(Duration::from_secs(2));
            rec.stray_vmms += 1;
        }
    }
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
