//! `shoal bench image`: container sandboxes of an OCI image, measured on
//! this host with a peer in the same run.
//!
//! 1. **Pull + convert.** A multi-layer image (~150 MB of
//!    random-but-compressible 1 MiB files, gzip layers, built here: no
//!    internet) is pushed to a loopback `docker-registry`; then, runs
//!    alternating, Shoal's image store pulls and converts it
//!    ([`image_store::registry::pull`]: layers fetched in parallel, each
//!    streamed through digest checks into a directory and packed with
//!    `mkfs.erofs`) and the peer chain does the same with Debian's tools:
//!    `skopeo copy docker://REF oci:DIR`, `tar -xzf` of each layer blob,
//!    `mkfs.erofs` of each layer directory (bookworm's erofs-utils 1.5 has
//!    no `--tar`). Wall time and bytes written (process I/O accounting).
//! 2. **First and next sandboxes** on a private shoald: `POST /v1/images`,
//!    the first `POST /v1/sandboxes {"image"}` (template boot + snapshot),
//!    then N more one at a time (restores), each removed.
//! 3. **Idle density**: sandboxes of the image created and held until
//!    admission refuses or `--idle-max`; host memory per sandbox
//!    (MemAvailable drop, and the VMMs' PSS).
//! 4. **Shared reads** ([`crate::image_mem`]): N VMs restored from the
//!    image's container template each read the same files, with the
//!    layers shared on pmem (one host copy) and with a per-sandbox copy of
//!    the layers (the peer); host memory of each arm.
//!
//! Guest work (boot, reads) is emulated on PVM hosts (~3000x slower ring
//! 0): sizes are options and the notes say what is guest-bound.

use crate::hostmem::{meminfo_kib, pss_kib};
use crate::image_oci::{layout_layers, run_tool};
pub use crate::image_oci::{BuiltImage, OciError};
use crate::image_report::capacity;
pub use crate::image_report::{FirstSection, IdleSection, ImageReport, PullRun, PullSection, Step};
use crate::load::parallel;
use crate::stats::summarize;
use image_store::registry::{pull, PullOptions};
use image_store::Store;
use shoal_client::{api, ClientError, DaemonClient};
pub use shoal_test_support::registry::Registry;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use crate::image_report::{COPIES, PEER, SHARED, SHOAL};

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageBenchError {
    /// Registry, image, peer tools.
    #[error(transparent)]
    Oci(#[from] OciError),
    /// Shoal's pull.
    #[error("shoal pull: {0}")]
    Pull(#[from] image_store::registry::PullError),
    /// The daemon.
    #[error("shoald: {0}")]
    Daemon(#[from] ClientError),
    /// The shared-read VMs.
    #[error(transparent)]
    Mem(#[from] crate::image_mem::MemError),
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> OciError {
    let what = what.to_string();
    move |e| OciError::Io(what, e)
}

pub use crate::image_oci::written_so_far;

/// Bytes of the regular files under `dir`.
pub fn du(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => n += du(&e.path()),
            Ok(t) if t.is_file() => n += e.metadata().map_or(0, |m| m.len()),
            _ => {}
        }
    }
    n
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// One Shoal pull+convert of `reference` into a new store at `dir`.
pub fn shoal_pull(dir: &Path, reference: &str) -> Result<PullRun, ImageBenchError> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(io(dir.display()))?;
    let w0 = written_so_far();
    let t = Instant::now();
    let img = pull(&Store::new(dir), reference, &PullOptions::default())?;
    let wall_ms = ms(t);
    let erofs_bytes = img
        .layer_files
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    Ok(PullRun {
        system: SHOAL.into(),
        wall_ms,
        written_bytes: written_so_far().saturating_sub(w0),
        erofs_bytes,
        intermediate_bytes: du(dir).saturating_sub(erofs_bytes),
        steps: vec![Step {
            name: "image_store::registry::pull".into(),
            ms: wall_ms,
        }],
    })
}

/// The peer's commands, for the report (`DIR`, `REF`, `N`, `HEX`).
pub fn peer_commands() -> Vec<String> {
    vec![
        "skopeo --policy POLICY copy --quiet --src-tls-verify=false docker://REF oci:DIR/oci:bench"
            .into(),
        "for each layer N (blob HEX, lowest first): mkdir DIR/root-N && tar -xzf \
         DIR/oci/blobs/sha256/HEX -C DIR/root-N"
            .into(),
        "for each layer N: mkfs.erofs --quiet -E noinline_data --preserve-mtime DIR/layer-N.erofs \
         DIR/root-N (the flags Shoal's packer passes; bookworm's erofs-utils 1.5 has no --tar)"
            .into(),
    ]
}

/// One peer pull+convert of `reference` into `dir`.
pub fn peer_pull(dir: &Path, policy: &Path, reference: &str) -> Result<PullRun, ImageBenchError> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(io(dir.display()))?;
    let w0 = written_so_far();
    let t0 = Instant::now();
    let mut steps = Vec::new();
    let layout = dir.join("oci");
    let t = Instant::now();
    run_tool(
        Command::new("skopeo")
            .arg("--policy")
            .arg(policy)
            .args(["copy", "--quiet", "--src-tls-verify=false"])
            .arg(format!("docker://{reference}"))
            .arg(format!("oci:{}:bench", layout.display())),
    )?;
    steps.push(Step {
        name: "skopeo copy".into(),
        ms: ms(t),
    });
    let layers = layout_layers(&layout)?;
    let t = Instant::now();
    for (i, hex) in layers.iter().enumerate() {
        let root = dir.join(format!("root-{i}"));
        std::fs::create_dir_all(&root).map_err(io(root.display()))?;
        run_tool(
            Command::new("tar")
                .arg("-xzf")
                .arg(layout.join("blobs/sha256").join(hex))
                .arg("-C")
                .arg(&root),
        )?;
    }
    steps.push(Step {
        name: "tar -xzf (each layer)".into(),
        ms: ms(t),
    });
    let t = Instant::now();
    let mut erofs_bytes = 0;
    for i in 0..layers.len() {
        let out = dir.join(format!("layer-{i}.erofs"));
        run_tool(
            Command::new("mkfs.erofs")
                .args(["--quiet", "-E", "noinline_data", "--preserve-mtime"])
                .arg(&out)
                .arg(dir.join(format!("root-{i}"))),
        )?;
        erofs_bytes += std::fs::metadata(&out).map_or(0, |m| m.len());
    }
    steps.push(Step {
        name: "mkfs.erofs (each layer)".into(),
        ms: ms(t),
    });
    Ok(PullRun {
        system: PEER.into(),
        wall_ms: ms(t0),
        written_bytes: written_so_far().saturating_sub(w0),
        erofs_bytes,
        intermediate_bytes: du(dir).saturating_sub(erofs_bytes),
        steps,
    })
}

/// `runs` pull+convert runs of each system, alternating (peer first),
/// each into a fresh directory under `work` (removed after).
pub fn pull_section(
    work: &Path,
    policy: &Path,
    reference: &str,
    runs: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<PullSection, ImageBenchError> {
    let mut all = Vec::new();
    for i in 0..runs.max(1) {
        let p = peer_pull(&work.join("peer"), policy, reference)?;
        progress(&format!(
            "  run {i}: peer {:.0} ms ({})",
            p.wall_ms,
            p.steps
                .iter()
                .map(|s| format!("{} {:.0} ms", s.name, s.ms))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        all.push(p);
        let _ = std::fs::remove_dir_all(work.join("peer"));
        let s = shoal_pull(&work.join("shoal"), reference)?;
        progress(&format!("  run {i}: shoal {:.0} ms", s.wall_ms));
        all.push(s);
        let _ = std::fs::remove_dir_all(work.join("shoal"));
    }
    Ok(PullSection::new(all, peer_commands(), SHOAL, PEER))
}

fn create(c: &DaemonClient, image: &str, mem: u32) -> Result<api::Sandbox, ClientError> {
    c.create(&api::CreateSandbox {
        vcpus: Some(1),
        memory_mib: Some(mem),
        ..api::CreateSandbox::from_image(image)
    })
}

/// Pulls `image` into the daemon's store, creates the first sandbox of it
/// (its template is built), then `next` more one at a time (each removed).
pub fn first_section(
    c: &DaemonClient,
    image: &str,
    next: usize,
    mem: u32,
    progress: &mut dyn FnMut(&str),
) -> Result<FirstSection, ImageBenchError> {
    let t = Instant::now();
    c.pull_image(&api::PullImage {
        reference: image.into(),
        insecure: None,
    })?;
    let daemon_pull_ms = ms(t);
    progress(&format!(
        "  daemon pull {daemon_pull_ms:.0} ms; first sandbox (template boot + snapshot)..."
    ));
    let t = Instant::now();
    // A create waits at most 120 s for the template; a PVM boot can take
    // longer: ask again until it is built (15 minutes at most).
    let sb = loop {
        match create(c, image, mem) {
            Err(ClientError::Api { status: 504, .. }) if t.elapsed() < Duration::from_secs(900) => {
                progress(&format!(
                    "  still building after {:.0} s",
                    t.elapsed().as_secs_f64()
                ));
            }
            r => break r?,
        }
    };
    let first_ms = ms(t);
    c.kill(&sb.id)?;
    progress(&format!("  first sandbox {first_ms:.0} ms; {next} more"));
    let mut samples = Vec::with_capacity(next);
    for _ in 0..next {
        let t = Instant::now();
        let sb = create(c, image, mem)?;
        samples.push(ms(t));
        c.kill(&sb.id)?;
    }
    Ok(FirstSection {
        daemon_pull_ms,
        first_ms,
        next_ms: summarize(&samples),
        next_samples: samples,
    })
}

fn available_mib() -> u64 {
    u64::try_from(meminfo_kib("MemAvailable:")).unwrap_or(0) / 1024
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Idle sandboxes of `image` created by `clients` threads until
/// admission refuses or `max` are held; `state_dir` is the daemon's (its
/// VMMs are read for their PSS).
pub fn idle_section(
    c: &DaemonClient,
    image: &str,
    mem: u32,
    max: usize,
    clients: usize,
    state_dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> IdleSection {
    let before = available_mib();
    let ids = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let why = Mutex::new(format!("the --idle-max cap ({max})"));
    let t0 = Instant::now();
    let errs = parallel(max, clients, &|_| {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        match create(c, image, mem) {
            Ok(sb) => {
                let mut v = lock(&ids);
                v.push(sb.id);
                if v.len() % 50 == 0 {
                    eprintln!("  {} idle sandboxes", v.len());
                }
                Ok(())
            }
            Err(ClientError::Api {
                status,
                code: Some(code),
                message,
            }) if code.retryable() => {
                if !stop.swap(true, Ordering::AcqRel) {
                    *lock(&why) = format!("HTTP {status}: {message}");
                }
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    });
    let fill_s = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(3));
    let peak = available_mib();
    let vmms = shoal_runtime::vm::vmms_under(state_dir);
    let pss: u64 = vmms
        .iter()
        .filter_map(|p| u32::try_from(p.pid).ok())
        .map(|p| pss_kib(p).1)
        .sum();
    let ids = ids.into_inner().unwrap_or_else(|e| e.into_inner());
    progress(&format!(
        "  holding {} idle sandboxes ({} VMMs found); probing up to 5 with an exec",
        ids.len(),
        vmms.len()
    ));
    let probes: Vec<&String> = (0..5.min(ids.len()))
        .filter_map(|i| ids.get(i * ids.len().saturating_sub(1) / 4))
        .collect();
    let probe_errs = parallel(probes.len(), 5, &|i| {
        let r = c
            .exec(
                probes[i],
                &api::ExecRequest::argv(["/bin/true".to_string()]).with_timeout(600.0),
            )
            .map_err(|e| e.to_string())?;
        (r.exit_code == Some(0))
            .then_some(())
            .ok_or_else(|| format!("exec: {r:?}"))
    });
    progress("  removing them");
    parallel(ids.len(), 8, &|i| {
        c.kill(&ids[i]).map_err(|e| e.to_string())
    });
    let held = ids.len();
    let per = (before.saturating_sub(peak) * 1024) / held.max(1) as u64;
    let cap = capacity(before, per);
    let capped = !lock(&why).starts_with("HTTP");
    IdleSection {
        held,
        stopped_by: why.into_inner().unwrap_or_else(|e| e.into_inner()),
        mem_available_before_mib: before,
        mem_available_peak_mib: peak,
        host_kib_per_sandbox: per,
        vmms_found: vmms.len(),
        vmm_pss_kib_mean: pss / vmms.len().max(1) as u64,
        fill_s,
        probes_ok: probes.len() - probe_errs.len(),
        probes: probes.len(),
        errors: errs.len(),
        extrapolated_capacity: cap,
        goal_1000: held >= 1000 || (capped && cap >= 1000),
        goal_extrapolated: held < 1000 && capped,
    }
}

/// Where the work goes: `dir` (not tmpfs).
pub fn workdir(dir: Option<PathBuf>) -> PathBuf {
    dir.unwrap_or_else(|| {
        shoal_runtime::sandbox::state_dir().join(format!("bench-image-{}", std::process::id()))
    })
}

/// The registry and the image pushed to it.
pub struct Prepared {
    /// The registry (stopped on drop).
    pub registry: Registry,
    /// `127.0.0.1:PORT/bench/image:v1`.
    pub reference: String,
    /// skopeo's policy file.
    pub policy: PathBuf,
    /// What was built.
    pub image: BuiltImage,
}

/// Starts a registry under `work`, builds the image (`total` bytes in
/// `layers` layers, the read set in the top one) and pushes it.
pub fn prepare(
    work: &Path,
    total: u64,
    layers: usize,
    read_bytes: u64,
    read_files: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Prepared, ImageBenchError> {
    std::fs::create_dir_all(work).map_err(io(work.display()))?;
    let registry = Registry::try_start(&work.join("registry")).map_err(OciError::Tool)?;
    let layout = work.join("layout");
    let _ = std::fs::remove_dir_all(&layout);
    let t = Instant::now();
    let image =
        crate::image_oci::write_image(&layout, "v1", total, layers, read_bytes, read_files)?;
    let policy = crate::image_oci::policy(work)?;
    let reference = registry.reference("bench/image:v1");
    shoal_test_support::registry::try_push(work, &layout, "v1", &reference)
        .map_err(OciError::Tool)?;
    let _ = std::fs::remove_dir_all(&layout);
    progress(&format!(
        "image {reference}: {} layers, {} files, {:.1} MB tar, {:.1} MB gzip (built and pushed in \
         {:.1} s)",
        image.layers,
        image.files,
        image.tar_bytes as f64 / 1e6,
        image.blob_bytes as f64 / 1e6,
        t.elapsed().as_secs_f64()
    ));
    Ok(Prepared {
        registry,
        reference,
        policy,
        image,
    })
}
