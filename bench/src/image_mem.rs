//! Part 4 of `shoal bench image`: host memory of N sandboxes of one OCI
//! image reading the same files, with the image's erofs layers shared on
//! virtio-pmem (the normal path: one host copy, DAX in the guests) and
//! with a per-sandbox copy of the layers (the peer: what a system that
//! gives every sandbox its own root image pays).
//!
//! The container template is built daemon-less the way shoald builds it
//! ([`build_from_layout`]: the agent layer as the root, the image's
//! layers over it, `shoal.container=1`), pinning the store's layer files
//! into the template's directory. Restored VMMs reopen those paths, so for
//! the peer each VM's own byte-identical copy of every layer is linked
//! into place just before its restore (a restore accepts a copy: the pmem
//! fingerprint checks content samples, size, and a same-inode mtime): each
//! VM then maps its own inode and its reads fill its own host page cache.
//! The agent layer (Shoal's, not the image's) stays shared in both arms.
//!
//! Host memory of an arm = the VMMs' private memory (Pss_Anon +
//! Pss_Shmem) + the growth of the host page cache of every file involved
//! (template memory, agent layer, layers or copies; `mincore`). The files
//! are evicted first; each VM's layer files are evicted again after its
//! restore (dropping the pages the restore's fingerprint read, which no
//! guest maps), so both arms count what the guests read.

use crate::hostmem::{cached_kib, evict, pss_kib};
use crate::image_oci::written_so_far;
use crate::image_report::{MemRow, MemSection, COPIES, SHARED};
use crate::stats::summarize;
use agent_client::{Client, ClientError, ExecRequest, ExitStatus};
use shoal_images::artifacts::{Layout, CONTAINER_IMAGE};
use shoal_images::layer_files::{open_layer, Layer};
use shoal_runtime::backend::microvm_template::{build_from_layout, BuildError};
use shoal_runtime::sandbox::TemplateSpec;
use shoal_runtime::template::{self, Restored, TemplateError};
use shoal_runtime::vmm_process::{Io, Serial, VmmProcess};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Options.
#[derive(Debug, Clone)]
pub struct MemOpts {
    /// Our VMM.
    pub vmm: PathBuf,
    /// Installed guest artifacts (kernel, agent layer).
    pub artifacts: Layout,
    /// The store's layers directory.
    pub layers_dir: PathBuf,
    /// The image's layer files in it, lowest first.
    pub layers: Vec<PathBuf>,
    /// Scratch (not tmpfs).
    pub workdir: PathBuf,
    /// VMs per arm.
    pub vms: usize,
    /// Guests reading at once.
    pub concurrency: usize,
    /// Guest memory (MiB).
    pub memory_mib: u32,
    /// Bytes of the read set (for the report).
    pub read_bytes: u64,
    /// The guest's read command (`sh -c`).
    pub script: String,
    /// Per-guest deadline.
    pub guest_timeout: Duration,
}

/// Why it failed.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// Opening a layer.
    #[error(transparent)]
    Layer(#[from] shoal_images::layers::LayerError),
    /// Building the template.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// A restore.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The agent.
    #[error("guest agent: {0}")]
    Agent(#[from] ClientError),
    /// A guest command failed.
    #[error("guest `{0}` failed: {1}")]
    Guest(String, String),
    /// A host file operation.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> MemError {
    let what = what.to_string();
    move |e| MemError::Io(what, e)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Vm {
    restored: Restored,
    vsock: PathBuf,
    files: Vec<PathBuf>,
}

impl Vm {
    fn start(o: &MemOpts, tpl: &Path, dir: &Path, i: usize) -> Result<Vm, MemError> {
        let vsock = dir.join(format!("vm{i}.vsock"));
        let restored = template::spawn_restore(
            VmmProcess::restore(&o.vmm, tpl)
                .api_sock(dir.join(format!("vm{i}.api")))
                .vsock_uds(&vsock)
                .serial(Serial::Null)
                .stdout(Io::Null),
        )?;
        Ok(Vm {
            restored,
            vsock,
            files: vec![],
        })
    }

    fn read(&self, o: &MemOpts) -> Result<f64, MemError> {
        let c = Client::connect_vsock_retry(&self.vsock, agent_proto::VSOCK_PORT, o.guest_timeout)?;
        c.post_restore(
            shoal_runtime::fresh::entropy(),
            shoal_runtime::fresh::unix_nanos(),
        )?;
        for f in &self.files {
            evict(f);
        }
        let mut req = ExecRequest::argv(["/bin/sh", "-c", &o.script]);
        req.timeout_ms = u64::try_from(o.guest_timeout.as_millis()).unwrap_or(u64::MAX);
        let t = Instant::now();
        let out = c.exec_simple(&req)?;
        if out.result.status != ExitStatus::Exited(0) {
            return Err(MemError::Guest(
                o.script.clone(),
                format!(
                    "{:?}: {}",
                    out.result.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
            ));
        }
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
}

/// Builds the container template of the image into `dir`.
fn build(o: &MemOpts, dir: &Path) -> Result<(), MemError> {
    let layers = o
        .layers
        .iter()
        .map(|p| open_layer(&o.layers_dir, &p.to_string_lossy()).map(Layer::File))
        .collect::<Result<Vec<_>, _>>()?;
    let spec = TemplateSpec::new(CONTAINER_IMAGE, 1, o.memory_mib);
    build_from_layout(&o.artifacts, &o.vmm, dir, spec, &layers, None)?;
    Ok(())
}

/// Gives VM `i` its own copy of every layer, linked where the template
/// names them; returns the copies.
fn copy_layers(o: &MemOpts, tpl: &Path, dir: &Path, i: usize) -> Result<Vec<PathBuf>, MemError> {
    let mut out = Vec::new();
    for (k, src) in o.layers.iter().enumerate() {
        let mine = dir.join(format!("vm{i}-layer{}.erofs", k + 1));
        std::fs::copy(src, &mine).map_err(io(mine.display()))?;
        let f = std::fs::File::open(&mine).map_err(io(mine.display()))?;
        f.sync_all().map_err(io(mine.display()))?;
        evict(&mine);
        let at = tpl.join(format!("layer{}.erofs", k + 1));
        let tmp = tpl.join(format!("layer{}.erofs.tmp", k + 1));
        let _ = std::fs::remove_file(&tmp);
        std::fs::hard_link(&mine, &tmp).map_err(io(tmp.display()))?;
        std::fs::rename(&tmp, &at).map_err(io(at.display()))?;
        out.push(mine);
    }
    Ok(out)
}

/// One arm: `o.vms` VMs restored and read `o.concurrency` at a time, each
/// paused after its read; memory measured with all of them alive.
fn arm(
    o: &MemOpts,
    tpl: &Path,
    copies: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<MemRow, MemError> {
    let name = if copies { COPIES } else { SHARED };
    let dir = o.workdir.join(format!("run-{name}"));
    std::fs::create_dir_all(&dir).map_err(io(dir.display()))?;
    let shared: Vec<PathBuf> = std::iter::once(tpl.join("memory"))
        .chain(std::iter::once(tpl.join("root.erofs")))
        .chain((1..=o.layers.len()).map(|k| tpl.join(format!("layer{k}.erofs"))))
        .collect();
    for f in &shared {
        evict(f);
    }
    let cache = |files: &[PathBuf]| files.iter().map(|f| cached_kib(f)).sum::<u64>();
    let cached0 = cache(&shared);
    let vms: Mutex<Vec<Vm>> = Mutex::new(Vec::new());
    let times = Mutex::new(Vec::new());
    let errors = AtomicUsize::new(0);
    let first_err = Mutex::new(None);
    let next = AtomicUsize::new(0);
    let restore_lock = Mutex::new(0u64);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..o.concurrency.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= o.vms {
                    break;
                }
                let started = if copies {
                    // Copy, link and restore one VM at a time: the paths
                    // are the template's.
                    let mut written = lock(&restore_lock);
                    let w0 = written_so_far();
                    copy_layers(o, tpl, &dir, i).and_then(|files| {
                        *written += written_so_far().saturating_sub(w0);
                        let mut vm = Vm::start(o, tpl, &dir, i)?;
                        vm.files = files;
                        Ok(vm)
                    })
                } else {
                    Vm::start(o, tpl, &dir, i).map(|mut vm| {
                        vm.files = shared[2..].to_vec();
                        vm
                    })
                };
                let vm = match started {
                    Ok(vm) => vm,
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        lock(&first_err).get_or_insert(e.to_string());
                        continue;
                    }
                };
                match vm.read(o) {
                    Ok(ms) => lock(&times).push(ms),
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        lock(&first_err).get_or_insert(e.to_string());
                    }
                }
                let _ = vmm_api::Client::new(&vm.restored.sock, Duration::from_secs(30)).pause();
                lock(&vms).push(vm);
            });
        }
    });
    if let Some(e) = lock(&first_err).take() {
        progress(&format!("{name}: a VM failed: {e}"));
    }
    std::thread::sleep(Duration::from_millis(500));
    let vms = std::mem::take(&mut *lock(&vms));
    let private: u64 = vms.iter().map(|v| pss_kib(v.restored.child.id()).0).sum();
    let mut files = shared.clone();
    if copies {
        files.extend(vms.iter().flat_map(|v| v.files.iter().cloned()));
    }
    let growth =
        i64::try_from(cache(&files)).unwrap_or(i64::MAX) - i64::try_from(cached0).unwrap_or(0);
    let total = i64::try_from(private).unwrap_or(i64::MAX) + growth;
    let read_samples = lock(&times).clone();
    let row = MemRow {
        arm: name.into(),
        vms: vms.len(),
        errors: errors.load(Ordering::Relaxed),
        vmm_private_kib: private,
        page_cache_kib: growth,
        host_total_kib: total,
        host_per_vm_kib: total as f64 / vms.len().max(1) as f64,
        copy_written_bytes: *lock(&restore_lock),
        read_ms: summarize(&read_samples),
        read_samples,
    };
    progress(&format!(
        "  {name} x{}: host {:.1} MiB (VMM {:.1} MiB + page cache {:.1} MiB), {} errors, {:.0} s",
        row.vms,
        row.host_total_kib as f64 / 1024.0,
        row.vmm_private_kib as f64 / 1024.0,
        row.page_cache_kib as f64 / 1024.0,
        row.errors,
        t0.elapsed().as_secs_f64()
    ));
    for vm in vms {
        let _ = vm.restored.shutdown();
        let _ = std::fs::remove_file(&vm.vsock);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(row)
}

/// Runs both arms; returns the section and the template build time (ms).
pub fn run(o: &MemOpts, progress: &mut dyn FnMut(&str)) -> Result<(MemSection, f64), MemError> {
    let tpl = o.workdir.join("container-template");
    progress("  booting the container template (daemon-less, as shoald builds it)...");
    let t = Instant::now();
    build(o, &tpl)?;
    let tpl_ms = t.elapsed().as_secs_f64() * 1e3;
    progress(&format!("  template ready in {:.1} s", tpl_ms / 1e3));
    let layer_bytes = o
        .layers
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    let rows = vec![
        arm(o, &tpl, false, progress)?,
        arm(o, &tpl, true, progress)?,
    ];
    let _ = std::fs::remove_dir_all(&tpl);
    let m = MemSection {
        read_bytes: o.read_bytes,
        layer_bytes,
        memory_mib: o.memory_mib,
        rows,
        reduction_pct: None,
        goal_70pct: None,
    };
    Ok((m.finish(), tpl_ms))
}
