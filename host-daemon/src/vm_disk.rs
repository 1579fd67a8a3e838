//! `vm` templates from a caller's own disk (`POST /v1/templates` with
//! `"disk"`): the file is opened the one way this daemon opens files its
//! callers name (beneath its layers directory, no symbolic links:
//! [`shoal_images::layer_files::open_beneath_dir`]), then checked as a base
//! disk ([`qemu_disk::inspect`]: raw or qcow2, no backing or data file),
//! off the async runtime and within [`CHECK_DEADLINE`]. The base is never
//! written: the template and each sandbox get a qcow2 overlay over it.

use crate::{ApiError, ApiResult, Daemon};
use shoal_api::{CreateTemplate, TemplateDisk};
use shoal_images::layer_files::{open_beneath_dir, BeneathError};
use shoal_runtime::backend::qemu_disk::{self, DiskBoot, VmDisk, DEFAULT_INIT, DEFAULT_ROOT};
use shoal_runtime::backend::qemu_launch::QemuTools;
use shoal_runtime::backend::Kind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Longest the checks of a disk may take (`qemu-img info` and `check`).
pub const CHECK_DEADLINE: Duration = Duration::from_secs(60);

/// A disk that passed the checks: what the backend boots and what the API
/// shows (and the database keeps).
#[derive(Debug, Clone)]
pub struct CheckedDisk {
    /// For the backend.
    pub disk: VmDisk,
    /// For the template's row and view.
    pub view: TemplateDisk,
}

/// 400 for disk fields in a request of a kind that takes no disk.
pub fn refuse(req: &CreateTemplate) -> ApiResult<()> {
    let any = req.disk.is_some()
        || req.disk_format.is_some()
        || req.disk_kernel.is_some()
        || req.disk_root.is_some()
        || req.disk_init.is_some();
    match any {
        true => Err(ApiError::BadRequest(
            "disk, disk_format, disk_kernel, disk_root and disk_init are for \"kind\": \"vm\" \
             templates"
                .into(),
        )),
        false => Ok(()),
    }
}

/// How `req` asks its disk to boot (400 for what is not understood).
fn boot_of(req: &CreateTemplate) -> ApiResult<DiskBoot> {
    let bad = |m: String| Err(ApiError::BadRequest(m));
    let boot = match req.disk_kernel.as_deref().unwrap_or("shoal") {
        "shoal" => DiskBoot::Shoal {
            root: req.disk_root.clone().unwrap_or_else(|| DEFAULT_ROOT.into()),
            init: req.disk_init.clone().unwrap_or_else(|| DEFAULT_INIT.into()),
        },
        "none" => {
            if req.disk_root.is_some() || req.disk_init.is_some() {
                return bad("disk_root and disk_init are for disk_kernel \"shoal\"".into());
            }
            DiskBoot::None
        }
        k => return bad(format!("disk_kernel {k:?}: \"shoal\" or \"none\"")),
    };
    boot.check()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(boot)
}

/// Opens and checks `path` from beneath `dir`. Blocking.
pub fn check_disk(
    tools: &QemuTools,
    dir: &Path,
    path: &str,
    format: Option<&str>,
    boot: DiskBoot,
) -> ApiResult<CheckedDisk> {
    let bad = |m: String| ApiError::BadRequest(format!("disk {path:?}: {m}"));
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(bad("give an absolute path".into()));
    }
    let file = open_beneath_dir(dir, p).map_err(|e| match e {
        BeneathError::Outside(d) => bad(format!(
            "not allowed: disks are taken from under the daemon's layers directory {} \
             (no `.` or `..`)",
            d.display()
        )),
        BeneathError::Open(e) => match e.raw_os_error() {
            Some(libc::ENOENT) => bad(format!("no such file (under {})", dir.display())),
            Some(libc::ELOOP) | Some(libc::EXDEV) => {
                bad("a symbolic link on the way: not followed".into())
            }
            _ => bad(e.to_string()),
        },
    })?;
    let info = qemu_disk::inspect(tools, p, &file, format).map_err(|e| match e {
        qemu_disk::DiskError::Bad(m) => ApiError::BadRequest(m),
        e @ qemu_disk::DiskError::Tool(..) => ApiError::Internal(e.to_string()),
    })?;
    let view = TemplateDisk {
        path: path.into(),
        format: info.format.clone(),
        kernel: match &boot {
            DiskBoot::Shoal { .. } => "shoal".into(),
            DiskBoot::None => "none".into(),
        },
        root: match &boot {
            DiskBoot::Shoal { root, .. } => Some(root.clone()),
            DiskBoot::None => None,
        },
        init: match &boot {
            DiskBoot::Shoal { init, .. } => Some(init.clone()),
            DiskBoot::None => None,
        },
    };
    Ok(CheckedDisk {
        disk: VmDisk {
            base: PathBuf::from(path),
            format: info.format,
            boot,
        },
        view,
    })
}

/// The disk of a `POST /v1/templates` of `kind` (not the daemon's
/// default), checked (`None`: it names none), for
/// `crate::vm_templates::create`.
pub async fn checked(
    d: &Arc<Daemon>,
    req: &CreateTemplate,
    kind: Kind,
) -> ApiResult<Option<CheckedDisk>> {
    let Some(path) = req.disk.clone() else {
        refuse(req)?;
        return Ok(None);
    };
    if kind != Kind::Vm {
        return Err(ApiError::BadRequest(format!(
            "a {kind} template takes no disk"
        )));
    }
    if !req.image.is_empty() {
        return Err(ApiError::BadRequest(
            "give an image or a disk, not both".into(),
        ));
    }
    crate::ops::check_name("template", &req.name)?;
    let boot = boot_of(req)?;
    let (dir, format) = (d.cfg.layers_dir(), req.disk_format.clone());
    let job = tokio::task::spawn_blocking(move || {
        check_disk(&QemuTools::default(), &dir, &path, format.as_deref(), boot)
    });
    let checked = match tokio::time::timeout(CHECK_DEADLINE, job).await {
        Err(_) => {
            return Err(ApiError::Timeout(format!(
                "the disk was not checked within {} s",
                CHECK_DEADLINE.as_secs()
            )))
        }
        Ok(r) => r.map_err(|source| ApiError::Task {
            what: "checking the disk".into(),
            source,
        })??,
    };
    Ok(Some(checked))
}
