//! Pause (state to disk, the VMM process ends), resume (explicit, or on
//! the next request) and snapshot of a running sandbox into a template.

use super::db::{self, State, TemplateRow};
use super::ops::{admit_and_insert, check_name, ensure_running, row, start_vmm, SandboxView};
use super::{blocking, ApiError, ApiResult, Daemon};
use shoal_api::{SnapshotRequest, TemplateState};
use shoal_images::layers;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmm::api::{self as vmm_api, Request};

fn vmm_call(sock: &Path, req: &Request, t: Duration) -> ApiResult<vmm_api::Response> {
    vmm_api::call(sock, req, t).map_err(|source| ApiError::Vmm {
        context: "VMM",
        source,
    })
}

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
    d.db(|db| db.set_state(id, State::Pausing, None))?;
    // No agent connection may be open in the snapshot.
    *live.client.lock().await = None;
    live.expect_exit.store(true, Ordering::Release);
    let p = live.proc();
    let paths = live.paths.clone();
    let res = blocking("pause", Duration::from_secs(180), move || {
        let snap = paths.new_snapshot();
        let t = Duration::from_secs(120);
        vmm_call(
            &paths.api_sock,
            &Request::Snapshot {
                dir: snap.clone(),
                diff: false,
            },
            t,
        )?;
        let _ = vmm_api::call(&paths.api_sock, &Request::Shutdown, Duration::from_secs(5));
        if let Some(p) = p {
            p.wait_gone(Duration::from_secs(5));
        }
        for e in std::fs::read_dir(&paths.dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if n.starts_with("snap-") && e.path() != snap {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let _ = std::fs::remove_file(&paths.api_sock);
        let _ = std::fs::remove_file(&paths.vsock);
        Ok(())
    })
    .await;
    if let Err(e) = res {
        // The VM may still run: continue it, or call it failed.
        live.expect_exit.store(false, Ordering::Release);
        let resumed = vmm_api::call(
            &live.paths.api_sock,
            &Request::Resume,
            Duration::from_secs(5),
        );
        let st = if resumed.is_ok() {
            State::Running
        } else {
            State::Failed
        };
        d.db(|db| db.set_state(id, st, Some(&format!("pause failed: {e}"))))?;
        return Err(e);
    }
    live.set_proc(None);
    d.db(|db| db.set_state(id, State::Paused, None))?;
    d.event(id, "paused", "state saved to disk; VMM ended");
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
    let snap = live.paths.latest_snapshot().ok_or_else(|| {
        ApiError::Internal(format!("sandbox '{id}' is paused but has no snapshot"))
    })?;
    r.state = State::Starting;
    admit_and_insert(d, &r, true)?;
    let t0 = Instant::now();
    match start_vmm(d, r, snap, State::Running, true).await {
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
    let name = req
        .template
        .unwrap_or_else(|| format!("snap-{id}-{}", db::now() as u64));
    check_name("template", &name)?;
    if d.db(|db| db.template(&name))?.is_some() {
        return Err(ApiError::Conflict(format!("template '{name}' exists")));
    }
    let (r, live, _busy) = ensure_running(d, id).await?;
    let _g = live.op.lock().await;
    *live.client.lock().await = None;
    let dir = d.cfg.templates_dir().join(&name);
    let sock = live.paths.api_sock.clone();
    let sandbox_dir = live.paths.dir.clone();
    let dir2 = dir.clone();
    blocking("snapshot", Duration::from_secs(180), move || {
        let t = Duration::from_secs(120);
        let res = vmm_call(
            &sock,
            &Request::Snapshot {
                dir: dir2.clone(),
                diff: false,
            },
            t,
        )
        .and_then(|_| {
            // The scratch disk as it is at the snapshot (the VM stays
            // paused until the copy is made): the template's own, which
            // each sandbox restored from it copies in turn.
            match layers::scratch_disk(&sandbox_dir) {
                Some(disk) => layers::clone_file(&disk, &dir2.join(layers::SCRATCH_DISK))
                    .map(drop)
                    .map_err(ApiError::ScratchDisk),
                None => Ok(()),
            }
        });
        let resumed = vmm_call(&sock, &Request::Resume, t);
        if res.is_err() {
            let _ = std::fs::remove_dir_all(&dir2);
        }
        res.and(resumed).map(|_| ())
    })
    .await?;
    // Layers and upper layer as the sandbox's template had them.
    let from = d.db(|db| db.template(&r.template))?;
    let t = TemplateRow {
        name: name.clone(),
        source: format!("sandbox:{id}"),
        vcpus: r.vcpus,
        memory_mib: r.memory_mib,
        dir,
        state: TemplateState::Ready,
        error: None,
        created_at: db::now(),
        owned: true,
        layers: from.as_ref().map(|f| f.layers.clone()).unwrap_or_default(),
        upper_size_mib: from.as_ref().and_then(|f| f.upper_size_mib),
        upper_disk_mib: from.as_ref().and_then(|f| f.upper_disk_mib),
    };
    d.db(|db| db.put_template(&t))?;
    d.event(id, "snapshot", &format!("template '{name}'"));
    Ok(t)
}
