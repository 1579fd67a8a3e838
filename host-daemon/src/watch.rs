//! Every sandbox's VM process is watched through a pidfd, so a death is
//! noticed at once: the sandbox is marked failed (a pooled one dropped)
//! and what it had is reclaimed.

use super::db::{self, State};
use super::{Daemon, Live};
use shoal_runtime::backend::SandboxVm;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Watches `vm` (the VM of `live`) until its process exits.
pub fn watch(d: Arc<Daemon>, live: Arc<Live>, vm: Arc<dyn SandboxVm>) {
    tokio::spawn(async move {
        let afd = vm.exit_fd().and_then(|fd| {
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
                while vm.alive() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        exited(&d, &live, &vm).await;
    });
}

async fn exited(d: &Arc<Daemon>, live: &Arc<Live>, vm: &Arc<dyn SandboxVm>) {
    let status = vm.reap();
    if !live.is_current(vm) || live.expect_exit.load(Ordering::Acquire) {
        return; // the daemon's doing (kill, pause), or an older VM
    }
    d.metrics.vmm_deaths.fetch_add(1, Ordering::Relaxed);
    live.set_vm(None);
    *live.client.lock().await = None;
    let why = format!(
        "VMM (pid {}) exited unexpectedly: {}",
        vm.pid(),
        shoal_runtime::vm::with_exit_cause(status, &vm.last_words())
    );
    reclaim(d, &live.id, &why).await;
}

/// Marks a sandbox failed (a pooled one is just dropped) and removes its
/// files and live side.
pub async fn reclaim(d: &Arc<Daemon>, id: &str, why: &str) {
    let row = d.db(|db| db.sandbox(id)).ok().flatten();
    d.remove_live(id);
    let Some(r) = row else { return };
    tracing::info!(sandbox = id, event = "failed", "{why}");
    let res = d.db(|db| {
        if r.state == State::Pooled {
            db.delete_sandbox(id)?;
        } else {
            db.set_state(id, State::Failed, Some(why))?;
            db.touch(id, db::now())?;
        }
        // Under the same lock: whoever sees the state sees the event.
        if let Err(e) = db.event(id, "failed", why) {
            tracing::warn!("event log: {e}");
        }
        Ok(())
    });
    if let Err(e) = res {
        tracing::error!(sandbox = id, "recording a failure: {e}");
    }
    let dir = r.dir.clone();
    crate::remove_vm_dir(dir).await;
    if r.state == State::Pooled {
        d.pool_wake.notify_one();
    }
}
