//! Fork: a running sandbox snapshotted once and restored into N live
//! clones that continue from that instant.
//!
//! - Admission first: each clone is admitted and recorded (`starting`) as
//!   any create is, before the source is touched; when none fits, the
//!   first refusal is the answer and the source was never paused.
//! - The snapshot: the source's vCPUs are paused while its state, memory
//!   and (with a disk upper layer) scratch disk are written into a
//!   directory of the fork's own (`forks/SOURCE-ID`), then continued. Its
//!   agent connection is closed first, as for a snapshot into a template
//!   (no connection may be open in a snapshot).
//! - The clones: restored from that directory concurrently (queued behind
//!   the daemon's restore bound like creates). Each maps the snapshot's
//!   memory file copy-on-write (clean pages shared in the host's page
//!   cache, written ones its own), gets its own copy of the scratch disk
//!   (a tmpfs upper layer is guest memory, so it is copied-on-write with
//!   it), and fresh entropy and clock on its first agent connection (the
//!   post-restore every restore gets). They inherit the source's
//!   template, shape, environment, TTL, idle timeout and labels (the
//!   request may give other labels) and get new ids.
//! - The directory is removed as soon as every clone is restored: a
//!   running clone keeps its mapping of the (unlinked) memory file, and
//!   neither its state nor its pause snapshots name the directory
//!   ([`Source::Snapshot`]), so removing the source or the fork's
//!   directory breaks no clone. Directories left by a daemon that stopped
//!   mid-fork are removed on start ([`recover`]).
//!
//! The work runs in a task of its own, so a caller that goes away does
//! not leave clones half started.

use super::db::{self, SandboxRow, State};
use super::lifecycle::ensure_running;
use super::ops::{start_vmm, SandboxView};
use super::{admission, blocking, inputs, ApiError, ApiResult, Daemon};
use shoal_api::{ErrorDetail, ForkRequest, Forked, MAX_FORK_COUNT};
use shoal_runtime::backend::Source;
use shoal_runtime::fresh::random_id;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Forks sandbox `id` into `req.count` clones.
pub async fn fork(d: &Arc<Daemon>, id: &str, req: ForkRequest) -> ApiResult<Forked> {
    if req.count == 0 || req.count > MAX_FORK_COUNT {
        return Err(ApiError::BadRequest(format!(
            "count {}: fork makes 1 to {MAX_FORK_COUNT} clones",
            req.count
        )));
    }
    if let Some(m) = &req.metadata {
        inputs::check_map(m, &inputs::METADATA)?;
    }
    let (d, id) = (d.clone(), id.to_string());
    tokio::spawn(async move { run(&d, &id, req).await })
        .await
        .map_err(|source| ApiError::Task {
            what: "fork".into(),
            source,
        })?
}

/// How many clones `req` asks for.
fn rows_asked(req: &ForkRequest) -> usize {
    usize::try_from(req.count).unwrap_or(usize::MAX)
}

/// The row of a clone of `src`.
fn clone_row(d: &Daemon, src: &SandboxRow, req: &ForkRequest, now: f64) -> SandboxRow {
    let id = random_id();
    SandboxRow {
        dir: d.cfg.sandboxes_dir().join(&id),
        id,
        template: src.template.clone(),
        kind: src.kind,
        state: State::Starting,
        vcpus: src.vcpus,
        memory_mib: src.memory_mib,
        pid: None,
        backend_state: None,
        created_at: now,
        last_active: now,
        ttl_s: src.ttl_s,
        idle_timeout_s: src.idle_timeout_s,
        metadata: req.metadata.clone().unwrap_or_else(|| src.metadata.clone()),
        env: src.env.clone(),
        needs_post_restore: true,
        keep_running: src.keep_running,
        pause_at_ttl: src.pause_at_ttl,
        error: None,
        // A clone of a networked sandbox would need its own slot: `run`
        // refuses to fork one.
        net: None,
        priority: src.priority,
    }
}

/// Admits and records the clones `rows` in turn, as
/// [`admit_and_insert`](crate::ops::admit_and_insert)
/// does each (the same checks against the usage as recorded), in one hold
/// of the database and with one reading of the host's memory and disk,
/// until one is refused: those admitted, and the refusal.
fn admit_clones(
    d: &Daemon,
    rows: Vec<SandboxRow>,
) -> ApiResult<(Vec<SandboxRow>, Option<admission::Refusal>)> {
    let avail = admission::available_mib();
    let free_disk = admission::free_disk_mib(&d.cfg.state_dir);
    d.db(|db| {
        let mut admitted = Vec::with_capacity(rows.len());
        for r in rows {
            let u = db.usage()?;
            let upper = db
                .template(&r.template)?
                .and_then(|t| t.root.upper_disk_mib);
            let need = admission::disk_need_mib(r.memory_mib, upper);
            let ok = admission::admit(
                &d.cfg.limits,
                &u,
                u64::from(r.vcpus),
                u64::from(r.memory_mib),
                avail,
            )
            .and_then(|()| admission::admit_disk(&d.cfg.limits, &u, need, free_disk));
            match ok {
                Ok(()) => {
                    db.put_sandbox(&r)?;
                    admitted.push(r);
                }
                Err(e) => return Ok((admitted, Some(e))),
            }
        }
        Ok((admitted, None))
    })
}

/// Forgets a clone that was admitted but not started.
async fn drop_clone(d: &Daemon, id: &str) {
    let _ = d.db(|db| db.delete_sandbox(id));
    d.remove_live(id);
    crate::remove_vm_dir(d.cfg.sandboxes_dir().join(id)).await;
}

/// Removes a fork's snapshot directory.
async fn remove_snapshot(dir: PathBuf) {
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
}

async fn run(d: &Arc<Daemon>, id: &str, req: ForkRequest) -> ApiResult<Forked> {
    let t0 = Instant::now();
    let (src, live, _busy) = ensure_running(d, id).await?;
    if src.net.is_some() {
        return Err(ApiError::Conflict(format!(
            "sandbox '{id}' has a network: networked sandboxes cannot be forked yet"
        )));
    }
    let now = db::now();
    let rows: Vec<SandboxRow> = (0..req.count)
        .map(|_| clone_row(d, &src, &req, now))
        .collect();
    let (admitted, refusal) = admit_clones(d, rows)?;
    let admit_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut failed: Vec<ErrorDetail> = Vec::new();
    let mut first_err: Option<ApiError> = None;
    if let Some(e) = refusal {
        d.metrics.refused(e.reason());
        tracing::warn!(sandbox = %id, "fork: admission refused: {e}");
        let e = ApiError::Refused(e);
        // Once one is refused the rest would be too (usage only grew).
        let left = rows_asked(&req) - admitted.len();
        failed.extend(std::iter::repeat_n(e.body().error, left));
        first_err = Some(e);
    }
    if admitted.is_empty() {
        return Err(first_err.unwrap_or_else(|| ApiError::Internal("no clone admitted".into())));
    }
    let dir = d.cfg.forks_dir().join(format!("{id}-{}", random_id()));
    let ts = Instant::now();
    if let Err(e) = snapshot(d, &live, &src, &dir).await {
        for r in &admitted {
            drop_clone(d, &r.id).await;
        }
        return Err(e);
    }
    let snap_ms = ts.elapsed().as_secs_f64() * 1e3;
    let tr = Instant::now();
    // Every clone restored concurrently (the restore queue bounds them).
    let mut set = tokio::task::JoinSet::new();
    for (i, row) in admitted.into_iter().enumerate() {
        let (d, from) = (d.clone(), Source::Snapshot(dir.clone()));
        set.spawn(async move {
            let id = row.id.clone();
            (i, id, start_vmm(&d, row, from, State::Running, true).await)
        });
    }
    let mut made: Vec<(usize, SandboxRow)> = Vec::new();
    while let Some(j) = set.join_next().await {
        match j {
            Ok((i, _, Ok(r))) => made.push((i, r)),
            Ok((_, cid, Err(e))) => {
                drop_clone(d, &cid).await;
                failed.push(e.body().error);
                first_err.get_or_insert(e);
            }
            Err(source) => {
                let e = ApiError::Task {
                    what: "restoring a clone".into(),
                    source,
                };
                failed.push(e.body().error);
                first_err.get_or_insert(e);
            }
        }
    }
    let restore_ms = tr.elapsed().as_secs_f64() * 1e3;
    remove_snapshot(dir).await;
    if made.is_empty() {
        return Err(first_err.unwrap_or_else(|| ApiError::Internal("no clone made".into())));
    }
    made.sort_by_key(|(i, _)| *i);
    for (_, r) in &made {
        d.event(&r.id, "created", &format!("forked from '{id}'"));
    }
    d.event(
        id,
        "forked",
        &format!(
            "{} clones in {:.1} ms (admission {admit_ms:.1} ms, snapshot {snap_ms:.1} ms, \
             restores {restore_ms:.1} ms), {} failed",
            made.len(),
            t0.elapsed().as_secs_f64() * 1e3,
            failed.len()
        ),
    );
    Ok(Forked {
        source: id.to_string(),
        sandboxes: made
            .into_iter()
            .map(|(_, r)| SandboxView::from(r))
            .collect(),
        failed,
    })
}

/// Snapshots the running source into `dir` (the source goes on). The
/// snapshot needs the disk of a paused sandbox of its shape (its memory,
/// its scratch disk) on the state file system until the last clone ends.
async fn snapshot(
    d: &Arc<Daemon>,
    live: &super::Live,
    src: &SandboxRow,
    dir: &Path,
) -> ApiResult<()> {
    let upper = d
        .db(|db| db.template(&src.template))?
        .and_then(|t| t.root.upper_disk_mib);
    let need = admission::disk_need_mib(src.memory_mib, upper);
    let free = admission::free_disk_mib(&d.cfg.state_dir);
    if free < need + d.cfg.limits.min_free_disk_mib {
        return Err(ApiError::Refused(admission::Refusal::HostPressure(
            format!(
                "host disk is low: {free} MiB free on the state filesystem, {need} MiB needed \
             for the fork's snapshot; not forking"
            ),
        )));
    }
    let _g = live.op.lock().await;
    // No agent connection may be open in the snapshot.
    *live.client.lock().await = None;
    let vm = live
        .vm()
        .ok_or_else(|| ApiError::Internal(format!("sandbox '{}' has no VM", src.id)))?;
    let out = dir.to_path_buf();
    let res = blocking("fork snapshot", Duration::from_secs(180), move || {
        if let Some(p) = out.parent() {
            std::fs::create_dir_all(p)
                .map_err(|e| ApiError::Internal(format!("cannot create {}: {e}", p.display())))?;
        }
        vm.snapshot(&out).map_err(|source| ApiError::Backend {
            context: "fork snapshot",
            source,
        })
    })
    .await;
    if res.is_err() {
        remove_snapshot(dir.to_path_buf()).await;
    }
    res
}

/// On start: removes the snapshot directories of forks a stopped daemon
/// left (a clone needs its fork's directory only while it is restored).
pub fn recover(d: &Daemon) {
    let dir = d.cfg.forks_dir();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if let Err(err) = std::fs::remove_dir_all(e.path()) {
            tracing::warn!(dir = %e.path().display(), "removing a fork's snapshot: {err}");
        }
    }
}
