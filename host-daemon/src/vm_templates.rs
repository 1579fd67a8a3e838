//! Templates of a kind other than the daemon's default (the `vm` kind:
//! QEMU q35 guests): `POST /v1/templates` with `"kind"`. They go through
//! the same registration, build, admission and sandbox paths as the
//! default kind's, a network included (a networked template boots on a
//! slot lent for the boot, each sandbox restores onto its own); what that
//! kind does not have (layers, a choice of upper layer, warm pools, VMM
//! stock) is refused.

use crate::db::{self, TemplateRow};
use crate::{templates, ApiError, ApiResult, Daemon};
use shoal_api::{CreateTemplate, RootRequest, TemplateState};
use shoal_runtime::backend::Kind;
use shoal_runtime::sandbox::TemplateSpec;
use std::sync::Arc;

use crate::auth::Principal;
use crate::vm_disk::CheckedDisk;

/// Guest memory of a `vm` template that names none (MiB): a q35 guest
/// with our kernel wants more than a microVM's 128.
pub const VM_DEFAULT_MEMORY_MIB: u32 = 256;

/// The kind `kind` names when it is not the daemon's default (`None`:
/// the default's path); 400 for a kind that is unknown or that this
/// daemon does not run.
pub fn other_kind(d: &Daemon, kind: Option<&str>) -> ApiResult<Option<Kind>> {
    let Some(name) = kind else {
        return Ok(None);
    };
    let kind = Kind::parse(name).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "kind '{name}': expected one of {}",
            d.kinds().join(", ")
        ))
    })?;
    if kind == d.backend.kind() {
        return Ok(None);
    }
    d.backend_of(kind)?;
    Ok(Some(kind))
}

/// Registers template `req` of `kind` and builds it in the background
/// (from the tiny image, or from `disk`: [`crate::vm_disk`]).
pub fn create(
    d: &Arc<Daemon>,
    req: CreateTemplate,
    kind: Kind,
    who: &Principal,
    disk: Option<CheckedDisk>,
) -> ApiResult<TemplateRow> {
    let refuse = |what: &str| {
        Err(ApiError::BadRequest(format!(
            "a {kind} template takes no {what}"
        )))
    };
    if disk.is_none() && req.image != "tiny" {
        return Err(ApiError::BadRequest(format!(
            "image '{}': a {kind} template boots the tiny image only",
            req.image
        )));
    }
    if !req.layers.is_empty() {
        return refuse("layers");
    }
    if req.upper_size_mib.is_some() || req.upper_disk_mib.is_some() {
        return refuse("upper layer size or scratch disk");
    }
    // A network is configured by the agent after each restore (issue 18):
    // a guest without it cannot have one.
    if req.network && req.agent == Some(false) {
        return Err(ApiError::BadRequest(format!(
            "a {kind} template without the agent takes no network (the agent configures \
             the guest's link)"
        )));
    }
    let (vcpus, mem) = (
        req.vcpus.unwrap_or(1),
        req.memory_mib.unwrap_or(VM_DEFAULT_MEMORY_MIB),
    );
    match &disk {
        None => templates::check_shape(&req.image, vcpus, mem)?,
        Some(_) => templates::check_size(vcpus, mem)?,
    }
    crate::inputs::check_servable(&d.cfg.limits, vcpus, mem)?;
    crate::inputs::check_disk_servable(&d.cfg.limits, mem, None)?;
    // Never a derived (daemon-made) name: those are the default kind's.
    let owner = crate::template_names::owner_for_create(who, &req.name, "")?;
    let vcpus8 = u8::try_from(vcpus).map_err(|_| {
        ApiError::BadRequest(format!(
            "vcpus {vcpus}: expected 1..={}",
            crate::ops::MAX_VCPUS
        ))
    })?;
    let t = TemplateRow {
        name: req.name.clone(),
        source: match &disk {
            None => format!("image:{}", req.image),
            Some(c) => format!("disk:{}", c.view.path),
        },
        kind,
        vcpus,
        memory_mib: mem,
        dir: d.cfg.new_template_dir(&req.name),
        state: TemplateState::Building,
        error: None,
        created_at: db::now(),
        owned: true,
        owner: Some(owner),
        image: None,
        root: RootRequest::default(),
        net: req.network,
        disk: disk.as_ref().map(|c| c.view.clone()),
    };
    // The backend boots its configured image or the template's disk: no
    // layers to open. Without the agent, exec and files go through the
    // guest's serial console.
    let spec = TemplateSpec {
        vm_disk: disk.map(|c| c.disk),
        serial_console: req.agent == Some(false),
        ..TemplateSpec::new(&req.image, vcpus8, mem)
    };
    templates::register_and_build(d, t, spec, Vec::new())
}
