//! Pause (state to disk, the VM process ends), resume (explicit, or on
//! the next request) and snapshot of a running sandbox into a template,
//! through the daemon's backend.

use super::db::{self, State, TemplateRow};
use super::ops::{admit_and_insert, check_name, ensure_running, row, start_vmm, SandboxView};
use super::{blocking, ApiError, ApiResult, Daemon};
use shoal_api::{SnapshotRequest, TemplateState};
use shoal_runtime::backend::Source;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pauses: snapshot into the sandbox's directory, then the VMM ends.
pub async fn pause(d: &Arc<Daemon>, id: &str) -> ApiResult<SandboxView> {
    let live = d
        .live(id)
        .ok_or_else(|| ApiError::NotFound(format!("no sandbox '{id}'")))?;
    let _g = live.op.lock().await;
    let r = row(d, id)?;
    match r.state {
        State::Paused => return Ok(r.into()),
        State::Running => {}
        s => {
            return Err(ApiError::Conflict(format!(
                "sandbox '{id}' is {}; only a running sandbox can be paused",
                s.as_str()
            )))
        }
    }
    let vm = live
        .vm()
        .ok_or_else(|| ApiError::Internal(format!("sandbox '{id}' has no VM")))?;
    d.db(|db| db.set_state(id, State::Pausing, None))?;
    // No agent connection may be open in the snapshot.
    *live.client.lock().await = None;
    live.expect_exit.store(true, Ordering::Release);
    let vm2 = vm.clone();
    let res = blocking("pause", Duration::from_secs(180), move || {
        vm2.pause_to_disk().map_err(|source| ApiError::Backend {
            context: "pause",
            source,
        })
    })
    .await;
    let paused = match res {
        Ok(s) => s,
        Err(e) => {
            // The VM may still run: continue it, or call it failed.
            live.expect_exit.store(false, Ordering::Release);
            let thawed = tokio::task::spawn_blocking(move || vm.thaw()).await;
            let st = if matches!(thawed, Ok(Ok(()))) {
                State::Running
            } else {
                State::Failed
            };
            d.db(|db| db.set_state(id, st, Some(&format!("pause failed: {e}"))))?;
            return Err(e);
        }
    };
    live.set_vm(None);
    d.db(|db| db.set_paused(id, &paused))?;
    d.event(id, "paused", "state saved to disk; VM process ended");
    Ok(row(d, id)?.into())
}

/// Resumes a paused sandbox from its snapshot.
pub async fn resume(d: &Arc<Daemon>, id: &str) -> ApiResult<SandboxView> {
    let live = d
        .live(id)
        .ok_or_else(|| ApiError::NotFound(format!("no sandbox '{id}'")))?;
    let _g = live.op.lock().await;
    let mut r = row(d, id)?;
    match r.state {
        State::Running => return Ok(r.into()),
        State::Paused => {}
        s => {
            return Err(ApiError::Conflict(format!(
                "sandbox '{id}' is {}; only a paused sandbox can be resumed",
                s.as_str()
            )))
        }
    }
    let paused = r.backend_state.clone().ok_or_else(|| {
        ApiError::Internal(format!("sandbox '{id}' is paused but has no saved state"))
    })?;
    r.state = State::Starting;
    admit_and_insert(d, &r, true)?;
    let t0 = Instant::now();
    match start_vmm(d, r, Source::Paused(paused), State::Running, true).await {
        Ok(r) => {
            d.event(
                id,
                "resumed",
                &format!("in {:.1} ms", t0.elapsed().as_secs_f64() * 1e3),
            );
            Ok(r.into())
        }
        Err(e) => {
            d.db(|db| db.set_state(id, State::Failed, Some(&format!("resume failed: {e}"))))?;
            Err(e)
        }
    }
}

/// Snapshots a running sandbox into a new template (the sandbox goes on).
pub async fn snapshot(d: &Arc<Daemon>, id: &str, req: SnapshotRequest) -> ApiResult<TemplateRow> {
    let name = req.template.unwrap_or_else(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        format!("snap-{id}-{secs}")
    });
    check_name("template", &name)?;
    let (r, live, _busy) = ensure_running(d, id).await?;
    // Layers and upper layer as the sandbox's template had them.
    let from = d.db(|db| db.template(&r.template))?;
    // Registered first (building), so that its name is taken and its
    // directory is known to be in use while the snapshot is written.
    let mut t = TemplateRow {
        name: name.clone(),
        source: format!("sandbox:{id}"),
        kind: r.kind,
        vcpus: r.vcpus,
        memory_mib: r.memory_mib,
        dir: d.cfg.new_template_dir(&name),
        state: TemplateState::Building,
        error: None,
        created_at: db::now(),
        owned: true,
        layers: from.as_ref().map(|f| f.layers.clone()).unwrap_or_default(),
        upper_size_mib: from.as_ref().and_then(|f| f.upper_size_mib),
        upper_disk_mib: from.as_ref().and_then(|f| f.upper_disk_mib),
    };
    let inserted = d.db(|db| {
        if db.template(&name)?.is_some() {
            return Ok(false);
        }
        db.put_template(&t)?;
        Ok(true)
    })?;
    if !inserted {
        return Err(ApiError::Conflict(format!("template '{name}' exists")));
    }
    let _g = live.op.lock().await;
    *live.client.lock().await = None;
    let dir = t.dir.clone();
    let vm = live
        .vm()
        .ok_or_else(|| ApiError::Internal(format!("sandbox '{id}' has no VM")));
    let dir2 = dir.clone();
    let res = match vm {
        Ok(vm) => {
            blocking("snapshot", Duration::from_secs(180), move || {
                vm.snapshot(&dir2).map_err(|source| ApiError::Backend {
                    context: "snapshot",
                    source,
                })
            })
            .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = res {
        let _ = d.db(|db| db.delete_template(&name));
        let _ = std::fs::remove_dir_all(&dir);
        return Err(e);
    }
    t.state = TemplateState::Ready;
    d.db(|db| db.put_template(&t))?;
    d.event(id, "snapshot", &format!("template '{name}'"));
    Ok(t)
}
