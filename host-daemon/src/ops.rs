//! The operations on one sandbox that everything else is made of: its
//! row, admission, starting its VM through the backend (then watched),
//! killing it, the ready template it comes from, and its agent
//! connection. [`crate::lifecycle`] builds create, pause, resume and
//! snapshot on them.

use super::db::{SandboxRow, State, TemplateRow};
use super::{admission, blocking, watch, within, ApiError, ApiResult, Daemon, Live};
use agent_client::{AsyncClient, ClientError};
use shoal_api::TemplateState;
use shoal_runtime::backend::Source;
use shoal_runtime::fresh::{entropy, unix_nanos};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest guest the API accepts (MiB).
pub const MAX_MEMORY_MIB: u32 = 64 * 1024;
/// Most vCPUs the API accepts.
pub const MAX_VCPUS: u32 = 32;

/// A sandbox as the API shows it.
pub use shoal_api::Sandbox as SandboxView;

impl From<SandboxRow> for SandboxView {
    fn from(r: SandboxRow) -> Self {
        SandboxView {
            id: r.id,
            template: r.template,
            kind: r.kind.as_str().to_string(),
            state: r.state,
            vcpus: r.vcpus,
            memory_mib: r.memory_mib,
            pid: r.pid,
            created_at: r.created_at,
            last_active: r.last_active,
            ttl_s: r.ttl_s,
            idle_timeout_s: r.idle_timeout_s,
            metadata: r.metadata,
            env: r.env,
            error: r.error,
            keep_running: r.keep_running,
            pause_at_ttl: r.pause_at_ttl,
            guest_addr: r.net.as_ref().map(|n| n.guest_addr),
            network: r.net.map(|n| n.policy),
            from_pool: None,
            priority: r.priority,
            smt_isolation: None,
            warnings: vec![],
        }
    }
}

/// The row of sandbox `id` (pooled sandboxes are not visible).
pub fn row(d: &Daemon, id: &str) -> ApiResult<SandboxRow> {
    match d.db(|db| db.sandbox(id))? {
        Some(r) if r.state != State::Pooled => Ok(r),
        _ => Err(ApiError::NotFound(format!("no sandbox '{id}'"))),
    }
}

/// Admission check and insert, atomically (`count`: a user request, so a
/// refusal is counted in the metrics).
pub fn admit_and_insert(d: &Daemon, r: &SandboxRow, count: bool) -> ApiResult<()> {
    let avail = admission::available_mib();
    let free_disk = admission::free_disk_mib(&d.cfg.state_dir);
    let res = d.db(|db| {
        let mut u = db.usage()?;
        // A paused sandbox resuming already holds its reservation and its
        // files: it needs no more free disk.
        u.disk_mib = db.reserved_disk_mib(Some(&r.id))?;
        let free_disk = match db.sandbox(&r.id)? {
            Some(_) => u64::MAX,
            None => free_disk,
        };
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
        if ok.is_ok() {
            db.put_sandbox(r)?;
        }
        Ok(ok)
    })?;
    res.map_err(|e| {
        if count {
            d.metrics.refused(e.reason());
            tracing::warn!(sandbox = %r.id, "admission refused: {e}");
        }
        ApiError::Refused(e)
    })
}

/// Starts the VM of `row` (already inserted) from `from` through the
/// daemon's backend, waits until it runs, records it as `state` and starts
/// watching it. With `freeze` (and unless the sandbox is `keep_running`)
/// its vCPUs are paused at once, before the guest has done anything: on
/// PVM hosts a freshly restored guest's first moments cost the host far
/// more than its restore, and nothing needs to run until the first
/// request.
pub async fn start_vmm(
    d: &Arc<Daemon>,
    row: SandboxRow,
    from: Source,
    state: State,
    freeze: bool,
) -> ApiResult<SandboxRow> {
    start_vmm_with(d, row, from, state, freeze, None).await
}

/// [`start_vmm`], into `stocked` (a VMM of the stock started for `row`'s
/// directory) where one is given and `from` is a template.
pub async fn start_vmm_with(
    d: &Arc<Daemon>,
    mut row: SandboxRow,
    from: Source,
    state: State,
    freeze: bool,
    stocked: Option<Box<dyn shoal_runtime::backend::StockedVm>>,
) -> ApiResult<SandboxRow> {
    let freeze = freeze && !row.keep_running && d.cfg.freeze_after.is_some();
    let t0 = Instant::now();
    let permit = tokio::time::timeout(Duration::from_secs(60), d.restores.acquire())
        .await
        .map_err(|_| {
            ApiError::Refused(super::admission::Refusal::HostPressure(
                "too many restores queued for 60 s; retry later".into(),
            ))
        })??;
    let (backend, dir) = (d.backend_of(row.kind)?, row.dir.clone());
    let (d2, id, networked) = (d.clone(), row.id.clone(), row.net.is_some());
    let priority = row.priority;
    let res = blocking("restore", Duration::from_secs(90), move || {
        // A networked sandbox restores onto its slot's TAP: a stocked VMM
        // given to it was made on that slot (its TAP and netns); any other
        // VMM is started with them.
        let vm = match (stocked, &from) {
            (Some(s), Source::Template(t)) => s.restore(t),
            (s, _) => {
                if let Some(s) = s {
                    s.discard();
                }
                let net = match networked {
                    true => Some(d2.net.attach(&id)?),
                    false => None,
                };
                backend.restore(&dir, &from, net.as_ref())
            }
        }
        .map_err(|source| ApiError::Backend {
            context: "restore failed",
            source,
        })?;
        // Its class before it runs anything asked of it (a stocked VMM's
        // threads were made before the class was known).
        let class = super::cpu_class::apply_vm(vm.as_ref(), priority);
        let frozen = freeze && vm.freeze().is_ok();
        Ok((vm, frozen, class))
    })
    .await;
    drop(permit);
    let (vm, frozen, class) = match res {
        Ok(p) => p,
        Err(e) => {
            d.event(&row.id, "restore_failed", &e.to_string());
            return Err(e);
        }
    };
    d.metrics.restore.observe(t0.elapsed().as_secs_f64());
    let live = d
        .live(&row.id)
        .unwrap_or_else(|| Arc::new(Live::new(&row.id, &row.dir, None, true)));
    live.set_vm(Some(vm.clone()));
    super::cpu_class::settle(d, &live, priority, class);
    *live.frozen.lock().await = frozen;
    // Nothing runs in a fresh guest until it is asked to: it may be frozen
    // at once (the next request continues it in ~1 ms).
    live.last_active_ms.store(0, Ordering::Release);
    live.keep_running.store(row.keep_running, Ordering::Release);
    live.needs_post_restore.store(true, Ordering::Release);
    live.expect_exit.store(false, Ordering::Release);
    // Killed while it was starting: do not resurrect it.
    let still = d.db(|db| db.sandbox(&row.id))?;
    if still.is_none_or(|r| r.state == State::Failed) {
        vm.kill();
        return Err(ApiError::Conflict(format!(
            "sandbox '{}' was removed while starting",
            row.id
        )));
    }
    row.kind = vm.kind();
    row.pid = Some(vm.pid());
    row.backend_state = Some(vm.state());
    row.state = state;
    row.needs_post_restore = true;
    d.db(|db| db.put_sandbox(&row))?;
    d.insert_live(live.clone());
    watch::watch(d.clone(), live, vm);
    Ok(row)
}

pub fn check_name(what: &str, n: &str) -> ApiResult<()> {
    if n.is_empty()
        || n.len() > 64
        || !n
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        || n.starts_with('.')
    {
        return Err(ApiError::BadRequest(format!(
            "{what} name {n:?}: use 1-64 letters, digits, '-', '_' or '.'"
        )));
    }
    Ok(())
}

/// A ready template by name.
pub fn ready_template(d: &Daemon, name: &str) -> ApiResult<TemplateRow> {
    match d.db(|db| db.template(name))? {
        None => Err(ApiError::NotFound(format!(
            "no template '{name}' (see GET /v1/templates)"
        ))),
        Some(t) if d.backend_for(t.kind).is_none() => Err(ApiError::Conflict(format!(
            "template '{name}' is of kind {}; this daemon runs {} sandboxes",
            t.kind,
            d.kinds().join(", ")
        ))),
        Some(t) if t.state == TemplateState::Ready => Ok(t),
        Some(t) if t.state == TemplateState::Building => Err(ApiError::Conflict(format!(
            "template '{name}' is still being built"
        ))),
        Some(t) => Err(ApiError::Conflict(format!(
            "template '{name}' failed: {}",
            t.error.unwrap_or_default()
        ))),
    }
}

/// Stops a VM now (SIGKILL: the guest has nothing to save) and forgets
/// the live side; the supervisor reaps the process.
async fn stop_live(live: &Live) {
    live.expect_exit.store(true, Ordering::Release);
    *live.client.lock().await = None;
    if let Some(vm) = live.vm() {
        vm.kill();
    }
}

/// Kills a sandbox and removes everything it had.
pub async fn kill(d: &Arc<Daemon>, id: &str, reason: &str) -> ApiResult<()> {
    let r = d
        .db(|db| db.sandbox(id))?
        .ok_or_else(|| ApiError::NotFound(format!("no sandbox '{id}'")))?;
    if let Some(live) = d.live(id) {
        let _g = live.op.lock().await;
        stop_live(&live).await;
        d.remove_live(id);
    }
    // The row and its "killed" event go under one lock: whoever sees the
    // sandbox gone also sees why (the directory below may take retries).
    tracing::info!(sandbox = id, event = "killed", "{reason}");
    d.db(|db| {
        db.delete_sandbox(id)?;
        if let Err(e) = db.event(id, "killed", reason) {
            tracing::warn!("event log: {e}");
        }
        Ok(())
    })?;
    d.net.release(id).await;
    let dir = r.dir.clone();
    crate::remove_vm_dir(dir).await;
    // The last sandbox of a deleted template lets its directory go.
    if d.db(|db| db.template(&r.template))?.is_none() {
        let _ = super::template_dirs::sweep_dirs(d);
    }
    Ok(())
}

/// The agent connection of a running sandbox (connecting, and after a
/// restore sending fresh entropy and time, on first use). One tokio
/// connection per sandbox carries all its requests: no thread. Calls that
/// waited while an attempt to connect failed fail with it at once, so a
/// guest that never answers costs each queued call nothing more than the
/// one attempt (not one agent timeout per call, in turn).
pub async fn agent(d: &Daemon, live: &Live) -> ApiResult<AsyncClient> {
    let asked = Instant::now();
    let mut g = live.client.lock().await;
    if let Some(c) = g.as_ref().filter(|c| !c.is_closed()) {
        return Ok(c.clone());
    }
    let failed = live
        .connect_failed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some((_, why)) = failed.filter(|(at, _)| *at >= asked) {
        return Err(ApiError::Sandbox(why));
    }
    let res = connect(d, live).await;
    if let Err(e) = &res {
        *live
            .connect_failed
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), e.to_string()));
    }
    let c = res?;
    *g = Some(c.clone());
    Ok(c)
}

async fn connect(d: &Daemon, live: &Live) -> ApiResult<AsyncClient> {
    let post = live.needs_post_restore.load(Ordering::Acquire);
    // Only a sandbox holding a slot has a link to configure (no database
    // read on the first connection of the others).
    let net = match post && d.net.slot(&live.id).is_some() {
        true => d
            .db(|db| db.sandbox(&live.id))?
            .and_then(|r| crate::net_guest::guest_net(&d.cfg.net.pool, &r)),
        false => None,
    };
    let t = d.cfg.agent_timeout;
    let transport = live
        .vm()
        .ok_or_else(|| ApiError::Internal(format!("sandbox '{}' has no VM", live.id)))?
        .agent();
    let connect = async {
        let c = AsyncClient::connect_retry(&transport, d.cfg.agent.client_config(t), t).await?;
        if post {
            // The first connection after a restore: clones never share
            // randomness or a stale clock.
            c.post_restore(entropy(), unix_nanos()).await?;
            // Then a networked sandbox's link: its slot's MAC, address,
            // route and resolver (a clone never keeps its template's).
            if let Some(n) = &net {
                c.net_configure(n).await?;
            }
        }
        Ok::<_, ClientError>(c)
    };
    let c = within(
        "connecting to the sandbox agent",
        t + Duration::from_secs(5),
        async {
            connect.await.map_err(|source| ApiError::AgentUnreachable {
                id: live.id.clone(),
                source,
            })
        },
    )
    .await?;
    if post {
        live.needs_post_restore.store(false, Ordering::Release);
        d.db(|db| {
            if let Some(mut r) = db.sandbox(&live.id)? {
                r.needs_post_restore = false;
                db.put_sandbox(&r)?;
            }
            Ok(())
        })?;
    }
    Ok(c)
}
