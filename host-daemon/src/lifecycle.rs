//! A sandbox's lifecycle, over the operations of [`crate::ops`]: create
//! (from a warm pool or by restoring the template), made running for a
//! request (resumed if paused, thawed if frozen), pause (state to disk,
//! the VM process ends), resume (explicit, or on the next request) and
//! snapshot of a running sandbox into a template, through the daemon's
//! backend.

use super::db::{self, SandboxRow, State, TemplateRow};
use super::ops::{
    admit_and_insert, check_name, ready_template, row, start_vmm, start_vmm_with, SandboxView,
};
use super::{blocking, ApiError, ApiResult, Daemon, Live};
use shoal_api::{CreateSandbox, SnapshotRequest, TemplateState};
use shoal_runtime::backend::Source;
use shoal_runtime::fresh::random_id;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Checks a create's network: its policy must parse (400 with hostnet's
/// message) and be one this daemon can enforce (DNS needs its forwarder).
fn check_network(
    d: &Daemon,
    net: &shoal_api::NetworkSpec,
) -> ApiResult<shoal_hostnet::EgressPolicy> {
    let p = network_policy(net)?;
    d.net.check(&p)?;
    Ok(p)
}

/// A template fits a create only with a network device exactly when the
/// create asks for a network (each networked sandbox restores onto its
/// own slot; a template without the device cannot get one).
fn check_template_net(t: &TemplateRow, networked: bool) -> ApiResult<()> {
    match (t.net, networked) {
        (true, false) => Err(ApiError::BadRequest(format!(
            "template '{}' has a network device: give 'network' (an empty allow_out \
             reaches nothing)",
            t.name
        ))),
        (false, true) => Err(ApiError::BadRequest(format!(
            "template '{}' has no network device: create from an image with 'network', or \
             from a template made with \"network\": true",
            t.name
        ))),
        _ => Ok(()),
    }
}

pub use super::net::network_policy;

/// Creates a sandbox.
pub async fn create(d: &Arc<Daemon>, mut req: CreateSandbox) -> ApiResult<SandboxView> {
    let t0 = Instant::now();
    let policy = match &req.network {
        Some(net) => Some(check_network(d, net)?),
        None => None,
    };
    let networked = policy.is_some();
    let spec = req.network.clone();
    let root = req.root();
    let tpl = match (&req.template, &req.image) {
        (Some(_), Some(_)) => {
            return Err(ApiError::BadRequest(
                "give either 'template' or 'image', not both".into(),
            ))
        }
        (None, None) => {
            return Err(ApiError::BadRequest(
                "give 'template' (a template name) or 'image' (tiny, base, or an OCI image \
                 pulled with `shoal image pull`)"
                    .into(),
            ))
        }
        (Some(t), None) => {
            if req.vcpus.is_some() || req.memory_mib.is_some() || !root.is_default() {
                return Err(ApiError::BadRequest(
                    "'vcpus', 'memory_mib', 'layers', 'upper_size_mib' and 'upper_disk_mib' \
                     come from the template; give them with 'image'"
                        .into(),
                ));
            }
            let t = ready_template(d, t)?;
            check_template_net(&t, networked)?;
            // A snapshot of a container sandbox: its image's env too.
            if t.image.is_some() {
                if let Some(config) = super::containers::config_of(d, &t.name).await? {
                    req.env = super::containers::merged_env(&config, std::mem::take(&mut req.env));
                    super::inputs::check_map(&req.env, &super::inputs::ENV)?;
                }
            }
            t
        }
        (None, Some(img)) if super::containers::is_builtin(img) => {
            let vcpus = req.vcpus.unwrap_or(1);
            let mem = req.memory_mib.unwrap_or(128);
            super::templates::image_template(d, img, vcpus, mem, &root, networked).await?
        }
        // An OCI image of the image store: its env under the request's.
        (None, Some(img)) => {
            let vcpus = req.vcpus.unwrap_or(1);
            let mem = req.memory_mib.unwrap_or(128);
            let (t, config) =
                super::containers::oci_template(d, img, vcpus, mem, &root, networked).await?;
            req.env = super::containers::merged_env(&config, std::mem::take(&mut req.env));
            super::inputs::check_map(&req.env, &super::inputs::ENV)?;
            t
        }
    };
    for k in req.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(ApiError::BadRequest(format!("bad environment name {k:?}")));
        }
    }
    let now = db::now();
    let id = random_id();
    let mut row = SandboxRow {
        dir: d.cfg.sandboxes_dir().join(&id),
        id,
        template: tpl.name.clone(),
        kind: tpl.kind,
        state: State::Starting,
        vcpus: tpl.vcpus,
        memory_mib: tpl.memory_mib,
        pid: None,
        backend_state: None,
        created_at: now,
        last_active: now,
        ttl_s: req.ttl_s,
        idle_timeout_s: req.idle_timeout_s,
        metadata: req.metadata,
        env: req.env,
        needs_post_restore: true,
        keep_running: req.keep_running,
        pause_at_ttl: req.pause_at_ttl,
        error: None,
        net: None,
        priority: req.priority,
    };
    if let (Some(policy), Some(spec)) = (policy, spec) {
        // No warm pool: each networked sandbox restores onto its own slot,
        // into a VMM stocked with that slot if there is one.
        let (slot, has_policy, stocked) = networked_slot(d, &tpl, &policy).await?;
        if let Some(e) = &stocked {
            row.id.clone_from(&e.id);
            row.dir.clone_from(&e.dir);
        }
        row.net = Some(db::SandboxNet {
            slot: slot.index(),
            guest_addr: slot.guest_ip(),
            policy: spec,
        });
        if let Err(e) = admit_and_insert(d, &row, true) {
            super::stock::discard(stocked.into_iter().collect());
            super::net::remove_slot(slot).await;
            return Err(e);
        }
        d.net.hold(&row.id, slot);
        // The policy goes in while the VM restores (unless the slot was
        // made with it).
        let id = row.id.clone();
        let apply = async {
            match has_policy {
                true => Ok(()),
                false => d.net.set_policy(&id, policy).await,
            }
        };
        let (applied, made) =
            tokio::join!(apply, restore_new(d, row, &tpl, stocked.map(|e| e.vm), t0));
        return match (applied, made) {
            (Ok(()), made) => made,
            (Err(e), Ok(v)) => {
                if let Err(k) = super::ops::kill(d, &v.id, &format!("network policy: {e}")).await {
                    tracing::warn!(sandbox = %v.id, "{k}");
                }
                Err(e)
            }
            (Err(_), Err(e)) => Err(e),
        };
    }
    if let Some(r) = d.db(|db| db.take_pooled(&tpl.name, &row))? {
        if let Some(live) = d.live(&r.id) {
            // Restored before its class was known.
            super::cpu_class::reapply(d, &live, r.priority).await;
            live.keep_running.store(r.keep_running, Ordering::Release);
            if r.keep_running {
                drop(super::freeze::busy(&live).await?);
            }
        }
        d.metrics.pool_hits.fetch_add(1, Ordering::Relaxed);
        d.pool_hit_ms
            .store(super::freeze::now_ms().max(1), Ordering::Release);
        d.pool_wake.notify_one();
        d.metrics.create.observe(t0.elapsed().as_secs_f64());
        d.event(
            &r.id,
            "created",
            &format!("from the warm pool of '{}'", r.template),
        );
        let mut v = SandboxView::from(r);
        v.from_pool = Some(true);
        super::cpu_class::annotate(d, &mut v);
        return Ok(v);
    }
    d.metrics.pool_misses.fetch_add(1, Ordering::Relaxed);
    // A VMM started ahead for this template, if the stock has one: the
    // sandbox takes the id (and directory) it was started for.
    // (Only the default kind's VMMs are stocked.)
    let stocked = (tpl.kind == d.backend.kind())
        .then(|| d.stock.take(&tpl))
        .flatten();
    // (A networked template's VMM never serves a sandbox without network.)
    let stocked = match stocked {
        Some(e) if e.slot.is_some() => {
            super::stock::discard(vec![e]);
            None
        }
        e => e,
    };
    if let Some(e) = &stocked {
        row.id.clone_from(&e.id);
        row.dir.clone_from(&e.dir);
    }
    if let Err(e) = admit_and_insert(d, &row, true) {
        super::stock::discard(stocked.into_iter().collect());
        return Err(e);
    }
    restore_new(d, row, &tpl, stocked.map(|e| e.vm), t0).await
}

/// The slot of a networked create of `tpl` with `policy`: a stocked VMM's
/// (made on a slot of its own) if one is ready, else one from the pool;
/// whether it has `policy` already; and the stocked VMM's entry (its slot
/// taken out).
async fn networked_slot(
    d: &Arc<Daemon>,
    tpl: &TemplateRow,
    policy: &shoal_hostnet::EgressPolicy,
) -> ApiResult<(Arc<shoal_hostnet::Slot>, bool, Option<super::stock::Entry>)> {
    d.net.check(policy)?;
    let stocked = (tpl.kind == d.backend.kind())
        .then(|| d.stock.take(tpl))
        .flatten();
    match stocked {
        Some(mut e) if e.slot.is_some() => {
            let slot = e.slot.take().expect("checked just above");
            // The pool's next slots (for the stock's refill) get it too.
            d.net.prepare(policy);
            // (getifaddrs: no process run.)
            let ready = slot.has_policy(policy).unwrap_or(false);
            Ok((slot, ready, Some(e)))
        }
        other => {
            super::stock::discard(other.into_iter().collect());
            let (slot, ready) = d.net.take(d, policy).await?;
            Ok((slot, ready, None))
        }
    }
}

/// The end of a create that restores: the VMM from `tpl` (into `stocked`
/// where given) for `row` (inserted); on a failure the row, the live side,
/// the directory and the slot go.
async fn restore_new(
    d: &Arc<Daemon>,
    row: SandboxRow,
    tpl: &TemplateRow,
    stocked: Option<Box<dyn shoal_runtime::backend::StockedVm>>,
    t0: Instant,
) -> ApiResult<SandboxView> {
    let id = row.id.clone();
    let from = Source::Template(tpl.dir.clone());
    let into = match stocked.is_some() {
        true => " into a stocked VMM",
        false => "",
    };
    let r = match start_vmm_with(d, row, from, State::Running, true, stocked).await {
        Ok(r) => r,
        Err(e) => {
            let _ = d.db(|db| db.delete_sandbox(&id));
            d.remove_live(&id);
            d.net.release(&id).await;
            let dir = d.cfg.sandboxes_dir().join(&id);
            tokio::spawn(crate::remove_vm_dir(dir));
            return Err(e);
        }
    };
    d.metrics.create.observe(t0.elapsed().as_secs_f64());
    let how = match &r.net {
        Some(n) => format!(
            "restored from '{}'{into} onto network slot {}",
            r.template, n.slot
        ),
        None => format!("restored from '{}'{into}", r.template),
    };
    d.event(&r.id, "created", &how);
    let mut v = SandboxView::from(r);
    v.from_pool = Some(false);
    super::cpu_class::annotate(d, &mut v);
    Ok(v)
}

/// The sandbox, running: a paused one is resumed first.
pub async fn ensure_running(
    d: &Arc<Daemon>,
    id: &str,
) -> ApiResult<(SandboxRow, Arc<Live>, super::freeze::Busy)> {
    for _ in 0..3 {
        let r = row(d, id)?;
        match r.state {
            State::Running => {
                let live = d
                    .live(id)
                    .ok_or_else(|| ApiError::Internal(format!("sandbox '{id}' has no VMM")))?;
                let now = db::now();
                if now - r.last_active > 1.0 {
                    d.db(|db| db.touch(id, now))?;
                }
                let busy = super::freeze::busy(&live).await?;
                return Ok((r, live, busy));
            }
            State::Paused | State::Pausing => {
                resume(d, id).await?;
            }
            State::Starting => {
                return Err(ApiError::Conflict(format!("sandbox '{id}' is starting")))
            }
            State::Failed => {
                return Err(ApiError::Conflict(format!(
                    "sandbox '{id}' failed: {}",
                    r.error.unwrap_or_default()
                )))
            }
            State::Pooled => return Err(ApiError::NotFound(format!("no sandbox '{id}'"))),
        }
    }
    Err(ApiError::Conflict(format!(
        "sandbox '{id}' keeps changing state; retry"
    )))
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
    let vm = live
        .vm()
        .ok_or_else(|| ApiError::Internal(format!("sandbox '{id}' has no VM")))?;
    let free = super::admission::free_disk_mib(&d.cfg.state_dir);
    if let Err(e) = super::admission::admit_pause(&d.cfg.limits, r.memory_mib, free) {
        d.metrics.refused(e.reason());
        return Err(ApiError::Refused(e));
    }
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

/// Snapshots a running sandbox into a new template of `owner` (the
/// sandbox goes on).
pub async fn snapshot(
    d: &Arc<Daemon>,
    id: &str,
    req: SnapshotRequest,
    owner: &crate::auth::Principal,
) -> ApiResult<TemplateRow> {
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
        owner: Some(owner.id()),
        // A container sandbox's snapshot keeps its image (exec defaults).
        image: from.as_ref().and_then(|f| f.image.clone()),
        // A snapshot of a sandbox of a disk's template is over that disk.
        disk: from.as_ref().and_then(|f| f.disk.clone()),
        root: from.map(|f| f.root).unwrap_or_default(),
        // A networked sandbox's snapshot has its net device: its sandboxes
        // are networked ones, each on its own slot.
        net: r.net.is_some(),
    };
    super::templates::insert_template(d, &t)?;
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

/// New limits for a sandbox (`PATCH`): a TTL counted from now (0: none),
/// stored as seconds from its creation (rounded up), and an idle timeout;
/// the sweeps read them from the database, so they hold across restarts.
pub fn update_limits(
    d: &Daemon,
    id: &str,
    req: shoal_api::UpdateSandbox,
) -> ApiResult<SandboxView> {
    let r = row(d, id)?;
    let ttl = req.ttl_s.map(|n| match n {
        0 => 0,
        n => {
            let age = Duration::try_from_secs_f64((db::now() - r.created_at).max(0.0))
                .unwrap_or_default();
            let age = age.as_secs() + u64::from(age.subsec_nanos() > 0);
            age.saturating_add(n)
        }
    });
    d.db(|db| db.set_limits(id, ttl, req.idle_timeout_s))?;
    let what = |v: Option<u64>, s: &str| v.map(|v| format!("{s} {v} s"));
    let detail: Vec<String> = [
        what(req.ttl_s, "TTL from now"),
        what(req.idle_timeout_s, "idle timeout"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !detail.is_empty() {
        d.event(id, "limits", &detail.join(", "));
    }
    Ok(SandboxView::from(row(d, id)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::NetworkSpec;

    #[test]
    fn a_bad_policy_is_a_400_with_hostnets_message() {
        let e = network_policy(&NetworkSpec::allowing(["10.0.0.0/33"])).unwrap_err();
        assert_eq!(e.status(), 400, "{e}");
        assert!(e.to_string().starts_with("network: "), "{e}");
        assert!(e.to_string().contains("10.0.0.0/33"), "{e}");
        // The API documents hostnet's cap.
        assert_eq!(
            shoal_api::MAX_POLICY_ENTRIES,
            shoal_hostnet::policy::MAX_ENTRIES
        );
        let many = NetworkSpec::allowing(vec!["1.2.3.4"; shoal_api::MAX_POLICY_ENTRIES + 1]);
        assert_eq!(network_policy(&many).unwrap_err().status(), 400);
    }

    #[test]
    fn dns_needs_the_daemons_forwarder() {
        use crate::net::{NetOptions, Networks};
        use crate::net_dns::DnsListen;
        let spec = NetworkSpec {
            allow_out: vec![
                "pypi.org".into(),
                "*.debian.org".into(),
                "10.1.2.0/24:443".into(),
            ],
            deny_out: vec!["10.1.2.3".into()],
            allow_dns: true,
        };
        let p = network_policy(&spec).unwrap();
        // A daemon with `--net-dns off` refuses DNS before anything is set
        // up; with `auto` the set-up says whether the forwarder runs.
        let off = Networks::new(NetOptions {
            dns: DnsListen::Off,
            ..NetOptions::default()
        });
        let e = off.check(&p).unwrap_err();
        assert_eq!(e.status(), 400, "{e}");
        assert!(e.to_string().contains("--net-dns off"), "{e}");
        let no_dns = NetworkSpec {
            allow_dns: false,
            ..spec
        };
        assert!(off.check(&network_policy(&no_dns).unwrap()).is_ok());
        assert!(Networks::new(NetOptions::default()).check(&p).is_ok());
    }
}
