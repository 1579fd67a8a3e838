//! `shoal bench image`: an OCI image from a loopback registry, pulled and
//! converted next to skopeo + tar + mkfs.erofs, its first and next
//! sandboxes, idle density and shared reads (see [`shoal_bench::image`]).

use crate::bench::{Output, PrivateDaemon};
use anyhow::{bail, Context, Result};
use shoal_bench::image::{self as ib, ImageReport};
use shoal_bench::image_mem::{self, MemOpts};
use std::path::PathBuf;
use std::time::Duration;

/// `shoal bench image`.
#[derive(clap::Args, Clone)]
pub struct ImageArgs {
    /// Image size (MB of files, tar) built and pushed to the registry.
    #[arg(long, default_value_t = 150)]
    pub size_mb: u64,
    /// Its layers.
    #[arg(long, default_value_t = 3)]
    pub layers: usize,
    /// Pull + convert runs per system (alternating).
    #[arg(long, default_value_t = 3)]
    pub pull_runs: usize,
    /// Sandboxes created after the first one (restores), one at a time.
    #[arg(long, default_value_t = 20)]
    pub next: usize,
    /// Most idle sandboxes to hold (0 skips; the goal is 1,000: on a
    /// PVM host a smaller count is extrapolated, and the report says so).
    #[arg(long, default_value_t = 1000)]
    pub idle_max: usize,
    /// Clients creating the idle sandboxes.
    #[arg(long, default_value_t = 8)]
    pub idle_clients: usize,
    /// VMs per arm of the shared-read test (0 skips).
    #[arg(long, default_value_t = 50)]
    pub mem_vms: usize,
    /// Bytes each of them reads (default: 50 MB on hardware KVM, 2 MB on
    /// PVM hosts, where a guest reads ~1 MB/s).
    #[arg(long)]
    pub read_bytes: Option<u64>,
    /// Guests reading at once.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Guest memory (MiB).
    #[arg(long, default_value_t = 128)]
    pub memory: u32,
    /// Skip the pull + convert comparison.
    #[arg(long)]
    pub no_pull: bool,
    /// Scratch directory (not tmpfs; default: under the state dir).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Extra arguments of the private shoald.
    #[arg(long, default_value = "--no-pools")]
    pub daemon_args: String,
    /// Where to write the JSON report.
    #[arg(long = "out", default_value = "bench-image.json")]
    pub out: PathBuf,
}

/// Runs it (registry, private shoald, daemon-less VMs for the shared reads).
pub fn run(g: &crate::daemon_cmds::Global, a: &ImageArgs, out: &Output) -> Result<()> {
    if g.daemon.is_some() {
        bail!("bench image runs a private shoald (it reads its VMMs' memory): drop --daemon");
    }
    let kvm = vmm::host::kvm_kind();
    let pvm = kvm.as_str() != "hardware";
    let read_bytes = a
        .read_bytes
        .unwrap_or(if pvm { 2_000_000 } else { 50_000_000 });
    let work = ib::workdir(a.workdir.clone());
    let r = run_in(a, out, &work, kvm, read_bytes);
    let _ = std::fs::remove_dir_all(&work);
    r
}

fn run_in(
    a: &ImageArgs,
    out: &Output,
    work: &std::path::Path,
    kvm: vmm::host::KvmKind,
    read_bytes: u64,
) -> Result<()> {
    let pvm = kvm.as_str() != "hardware";
    let progress = &mut |l: &str| eprintln!("{l}");
    let mut notes = Vec::new();
    let prep = ib::prepare(
        work,
        a.size_mb * 1_000_000,
        a.layers,
        read_bytes,
        5,
        progress,
    )?;
    let pull = if a.no_pull {
        None
    } else {
        progress(&format!(
            "pull + convert, {} runs per system (peer first)",
            a.pull_runs
        ));
        Some(ib::pull_section(
            &work.join("pull"),
            &prep.policy,
            &prep.reference,
            a.pull_runs,
            progress,
        )?)
    };
    if pull.is_some() {
        notes.push(
            "pull: shoal verifies every blob's digest and diff_id while it streams, fetches the \
             layers in parallel, packs each with mkfs.erofs (the peer's flags) into a raw file and \
             copies it padded to 2 MiB (DAX alignment); the peer translates no OCI whiteouts (the \
             test image has none)"
                .into(),
        );
    }
    let (c, private) = PrivateDaemon::start("image", &a.daemon_args)?;
    progress("first and next sandboxes of the image (private shoald)");
    let first = ib::first_section(&c, &prep.reference, a.next, a.memory, progress)?;
    let idle = (a.idle_max > 0).then(|| {
        progress(&format!("idle sandboxes (up to {})", a.idle_max));
        ib::idle_section(
            &c,
            &prep.reference,
            a.memory,
            a.idle_max,
            a.idle_clients,
            &private.dir,
            progress,
        )
    });
    let mut memory = None;
    if a.mem_vms > 0 {
        progress(&format!(
            "shared reads: {} VMs per arm, each reads {:.1} MB",
            a.mem_vms,
            read_bytes as f64 / 1e6
        ));
        let store = image_store::Store::new(&private.dir.join("images"));
        let img = store
            .resolve(&prep.reference)
            .context("the daemon's store lost the image")?;
        let o = MemOpts {
            vmm: shoal_images::artifacts::vmm_binary()?,
            artifacts: shoal_images::artifacts::Layout::default_location(),
            layers_dir: store.dir().join("layers"),
            layers: img.layer_files.clone(),
            workdir: work.join("mem"),
            vms: a.mem_vms,
            concurrency: a.concurrency.max(1),
            memory_mib: a.memory,
            read_bytes,
            script: format!("cat {}/* > /dev/null", shoal_bench::image_oci::READ_DIR),
            guest_timeout: Duration::from_secs(600),
        };
        let (m, tpl_ms) = image_mem::run(&o, progress)?;
        notes.push(format!(
            "shared reads: daemon-less container template booted in {:.1} s",
            tpl_ms / 1e3
        ));
        memory = Some(m);
    }
    drop(private);
    drop(prep.registry);
    if pvm {
        notes.push(format!(
            "host KVM is {}: guest ring 0 is emulated (~3000x slower); the first sandbox's \
             template boot, each restore's time to agent-ready and the guests' reads are \
             guest-bound here; pull+convert, host memory and density are host-side figures",
            kvm.as_str()
        ));
    }
    if let Some(i) = idle.as_ref().filter(|i| i.goal_extrapolated) {
        notes.push(format!(
            "idle: capped at {} by --idle-max; {} sandboxes at {:.2} MiB each fit in the {} MiB \
             MemAvailable before the fill (an extrapolation, not a measurement)",
            i.held,
            i.extrapolated_capacity,
            i.host_kib_per_sandbox as f64 / 1024.0,
            i.mem_available_before_mib
        ));
    }
    let report = ImageReport {
        bench: "image",
        host_kvm: kvm.as_str(),
        unit: "ms; KiB",
        command: std::env::args().collect::<Vec<_>>().join(" "),
        image: prep.image,
        pull,
        first: Some(first),
        idle,
        memory,
        notes,
    };
    out.emit(&report.render(), &report, ImageReport::plot)
}
