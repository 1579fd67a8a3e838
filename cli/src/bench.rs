//! `shoal bench ...`.

use crate::image_path;
use anyhow::{bail, Context, Result};
use shoal_bench::boot::{self as bootbench, BootBenchOpts};
use shoal_bench::plot::{self, Out, PlotError};
use shoal_images::artifacts;
use shoal_runtime::launch::{BootSpec, RootKind};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub fn restore(
    restores: usize,
    concurrency: &str,
    rate_restores: usize,
    pss_vms: usize,
    jail: bool,
    memory: u32,
    out: &Output,
) -> Result<()> {
    let vmm = artifacts::vmm_binary()?;
    let jail = match jail {
        true => {
            let jailer = shoal_runtime::jail::JailConfig::find_jailer(&vmm)
                .context("no shoal-jailer beside the VMM (cargo build --release -p shoal-jailer, or SHOAL_JAILER)")?;
            let uids =
                std::env::temp_dir().join(format!("shoal-bench-uids-{}", std::process::id()));
            Some(shoal_runtime::jail::JailConfig::new(&jailer, &vmm, &uids)?)
        }
        false => None,
    };
    let concurrency = concurrency
        .split(',')
        .map(|k| {
            k.trim()
                .parse::<usize>()
                .with_context(|| format!("bad concurrency {k:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let work = std::env::temp_dir().join(format!("shoal-bench-restore-{}", std::process::id()));
    let opts = shoal_bench::restore::RestoreBenchOpts {
        spec: BootSpec {
            kernel: artifacts::kernel()?,
            root: image_path("tiny")?,
            root_kind: RootKind::default(),
            cmdline: artifacts::base_cmdline(),
            init_args: vec![],
            memory_mib: memory,
            vcpus: 1,
            vsock_uds: None,
            extra_pmem: vec![],
            upper_disk: None,
            upper_size_mib: None,
        },
        vmm,
        workdir: work.clone(),
        restores,
        concurrency,
        rate_restores,
        pss_vms,
        jail,
    };
    let report = shoal_bench::restore::run(&opts, &mut |l| eprintln!("{l}"));
    let _ = std::fs::remove_dir_all(&work);
    let report = report?;
    out.emit(&report.render(), &report, plot::benches::restore)
}

pub fn boot(
    runs: Option<usize>,
    image: &str,
    memory: u32,
    no_qemu: bool,
    out: &Output,
) -> Result<()> {
    let hw = vmm::host::kvm_kind() == vmm::host::KvmKind::Hardware;
    let runs = runs.unwrap_or(if hw { 20 } else { 5 });
    let spec = BootSpec {
        kernel: artifacts::kernel()?,
        root: image_path(image)?,
        // The QEMU peer boots from virtio-blk: so does Shoal here, for a
        // like-for-like comparison.
        root_kind: RootKind::Blk,
        cmdline: artifacts::base_cmdline(),
        init_args: vec!["@reboot".into()],
        memory_mib: memory,
        vcpus: 1,
        vsock_uds: None,
        extra_pmem: vec![],
        upper_disk: None,
        upper_size_mib: None,
    };
    let opts = BootBenchOpts {
        spec,
        vmm: artifacts::vmm_binary()?,
        runs,
        qemu: !no_qemu,
        // The peer boots the same words, except the clocksource: QEMU's
        // guests are never restored, and with kvm-clock QEMU's guest idled
        // without finishing its boot on a PVM host (5+ minutes, seen once).
        qemu_kernel_args: vmm::vm::profile_kernel_args(None)?
            .split_whitespace()
            .filter(|w| !w.starts_with("clocksource="))
            .collect::<Vec<_>>()
            .join(" "),
        timeout: Duration::from_secs(if hw { 30 } else { 300 }),
    };
    let report = bootbench::run(&opts, &mut |l| eprintln!("{l}"))?;
    out.emit(&report.render(), &report, plot::benches::boot)?;
    if report.rows.is_empty() {
        bail!("no successful boots");
    }
    Ok(())
}

pub fn exec(execs: usize, restores: usize, bytes: u64, out: &Output) -> Result<()> {
    let host_agent = artifacts::vmm_binary()
        .ok()
        .and_then(|v| v.parent().map(|d| d.join("shoal-agent")))
        .filter(|p| p.is_file());
    let opts = shoal_bench::exec::ExecBenchOpts {
        template: shoal_runtime::sandbox::TemplateSpec::new("tiny", 1, 128),
        execs,
        restores,
        bytes,
        host_agent,
    };
    let report = shoal_bench::exec::run(&opts, &mut |l| eprintln!("{l}"))?;
    out.emit(&report.render(), &report, plot::benches::exec)
}

/// `shoal bench pmem` options.
pub struct PmemArgs {
    pub vms: String,
    pub read_bytes: Option<u64>,
    pub read_files: usize,
    pub concurrency: usize,
    pub write_bytes: u64,
    pub memory: u32,
    pub workdir: Option<PathBuf>,
}

pub fn pmem(a: PmemArgs, out: &Output) -> Result<()> {
    use shoal_bench::pmem::{self as pb, PmemBenchOpts};
    let hw = vmm::host::kvm_kind() == vmm::host::KvmKind::Hardware;
    let vm_counts = a
        .vms
        .split(',')
        .map(|k| {
            k.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .with_context(|| format!("bad VM count {k:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    // Not /tmp: often tmpfs, where disk-write figures would mean nothing.
    let work = a.workdir.unwrap_or_else(|| {
        shoal_runtime::sandbox::state_dir().join(format!("bench-pmem-{}", std::process::id()))
    });
    let mut o = PmemBenchOpts::new(
        artifacts::kernel()?,
        image_path("tiny")?,
        artifacts::vmm_binary()?,
        artifacts::base_cmdline(),
        work.clone(),
    );
    o.vm_counts = vm_counts;
    o.read_bytes = a
        .read_bytes
        .unwrap_or(if hw { 50_000_000 } else { 5_000_000 });
    o.read_files = a.read_files.max(1);
    o.concurrency = a.concurrency.max(1);
    o.write_bytes = a.write_bytes;
    o.memory_mib = a.memory;
    let report = pb::run(&o, &mut |l| eprintln!("{l}"));
    let _ = std::fs::remove_dir_all(&work);
    let report = report?;
    out.emit(&report.render(), &report, plot::benches::pmem)
}

/// `shoal bench load` settings.
pub struct LoadArgs {
    pub image: String,
    pub concurrency: String,
    pub cycles: usize,
    pub exec: Vec<String>,
    pub burst: usize,
    pub burst_concurrency: usize,
    pub idle_max: usize,
    pub daemon_args: String,
}

/// A private shoald on a temporary state directory, stopped (with every
/// VMM it left) when dropped.
pub(crate) struct PrivateDaemon {
    child: std::process::Child,
    pub(crate) dir: PathBuf,
}

impl PrivateDaemon {
    /// Starts `shoald` (beside this program) on a new state directory
    /// for bench `name`, with `args`, and waits until it answers.
    pub(crate) fn start(
        name: &str,
        args: &str,
    ) -> Result<(shoal_client::DaemonClient, PrivateDaemon)> {
        let dir = std::env::temp_dir().join(format!("shoal-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let bin = std::env::current_exe()?.with_file_name("shoald");
        let log = std::fs::File::create(dir.join("shoald.log"))?;
        let child = std::process::Command::new(&bin)
            .arg("--state-dir")
            .arg(&dir)
            .args(args.split_whitespace())
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let c = shoal_client::DaemonClient::unix(dir.join("shoald.sock"));
        let p = PrivateDaemon { child, dir };
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while !c.ping() {
            if std::time::Instant::now() > end {
                bail!("the private shoald did not come up");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("private shoald on {}", c.target_display());
        Ok((c, p))
    }
}

impl PrivateDaemon {
    /// The daemon's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        // SAFETY: SIGTERM to our own child.
        unsafe { libc::kill(self.child.id().cast_signed(), libc::SIGTERM) };
        let _ = self.child.wait();
        let qemus = shoal_runtime::vm::processes_under(&self.dir, "qemu-system-x86_64");
        for p in shoal_runtime::vm::vmms_under(&self.dir)
            .into_iter()
            .chain(qemus)
        {
            p.kill();
            p.wait_gone(Duration::from_secs(2));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn load(g: &crate::daemon_cmds::Global, a: &LoadArgs, out: &Output) -> Result<()> {
    let concurrency = a
        .concurrency
        .split(',')
        .map(|k| {
            k.trim()
                .parse::<usize>()
                .with_context(|| format!("bad concurrency {k:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut private = None;
    let c = match &g.daemon {
        Some(_) => crate::daemon_client::connect(g.daemon.as_deref())?,
        None => {
            let (c, p) = PrivateDaemon::start("load", &a.daemon_args)?;
            private = Some(p);
            c
        }
    };
    // The template (booted once and cached), then a warm-up sandbox.
    let name = format!("{}-1c-128m", a.image);
    crate::daemon_cmds::image_template(g, &c, &a.image, 1, 128, &Default::default())?;
    let sb = c.create(&shoal_client::api::CreateSandbox {
        vcpus: Some(1),
        memory_mib: Some(128),
        ..shoal_client::api::CreateSandbox::from_image(&a.image)
    })?;
    let _ = c.kill(&sb.id);
    let opts = shoal_bench::load::LoadOpts {
        template: name,
        concurrency,
        min_cycles: a.cycles,
        exec: a.exec.clone(),
        burst: a.burst,
        burst_concurrency: a.burst_concurrency,
        idle_max: a.idle_max,
    };
    let report = shoal_bench::load::run(&c, &opts, &mut |l| eprintln!("{l}"));
    drop(private);
    out.emit(&report.render(), &report, plot::benches::load)
}

/// Where a bench writes its JSON report and its figures.
pub struct Output<'a> {
    json: &'a Path,
    plot: Option<&'a Path>,
}

impl<'a> Output<'a> {
    /// The report goes to `json`; the figures to `plot`, or beside the
    /// report when `None` (the current directory for a bare file name).
    pub fn new(json: &'a Path, plot: Option<&'a Path>) -> Self {
        Self { json, plot }
    }

    fn plot_dir(&self) -> &Path {
        match self.plot {
            Some(d) => d,
            None => self
                .json
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
        }
    }

    /// Prints a bench's table, writes its JSON report, then its figures
    /// (`figures` draws them).
    pub(crate) fn emit<R: serde::Serialize>(
        &self,
        table: &str,
        report: &R,
        figures: fn(&R, &Out) -> Result<Vec<PathBuf>, PlotError>,
    ) -> Result<()> {
        print!("{table}");
        let json = self.json;
        std::fs::write(json, serde_json::to_string_pretty(report)?)
            .with_context(|| format!("cannot write {}", json.display()))?;
        eprintln!("wrote {}", json.display());
        let files = figures(report, &Out::for_json(self.plot_dir(), json))
            .context("cannot draw the figures (the JSON report is written)")?;
        wrote_figures(&files);
        Ok(())
    }
}

fn wrote_figures(files: &[PathBuf]) {
    for f in files {
        eprintln!("wrote {}", f.display());
    }
}

/// `shoal bench plot FILE.json`: draws a generic plot document.
pub fn plot_doc(out: &Output) -> Result<()> {
    let files = plot::doc::draw_file(out.json, out.plot_dir())?;
    wrote_figures(&files);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_go_beside_the_report_unless_told() {
        let dir = |json: &str, plot: Option<&str>| {
            Output::new(Path::new(json), plot.map(Path::new))
                .plot_dir()
                .to_path_buf()
        };
        assert_eq!(dir("bench-boot.json", None), Path::new("."));
        assert_eq!(dir("/r/bench-boot.json", None), Path::new("/r"));
        assert_eq!(dir("/r/bench-boot.json", Some("/figs")), Path::new("/figs"));
    }

    #[test]
    fn the_report_then_its_figures() {
        let d = tempfile::tempdir().unwrap();
        let json = d.path().join("bench-x.json");
        let figs = d.path().join("figs");
        let out = Output::new(&json, Some(&figs));
        let doc = plot::Doc {
            title: "t".into(),
            series: vec![plot::Series::new("shoal", vec![1.0, 2.0])],
            ..Default::default()
        };
        out.emit("", &doc, plot::doc::draw).unwrap();
        assert!(std::fs::read_to_string(&json)
            .unwrap()
            .contains("\"shoal\""));
        assert!(figs.join("bench-x-cdf.png").is_file());
        // A figure that cannot be drawn fails the command, the JSON written.
        let bad = plot::Doc {
            title: "t".into(),
            ..Default::default()
        };
        let e = out.emit("", &bad, plot::doc::draw).unwrap_err();
        assert!(format!("{e:#}").contains("nothing to draw"), "{e:#}");
        assert!(std::fs::read_to_string(&json)
            .unwrap()
            .contains("\"title\""));
    }
}

/// `shoal bench fork`.
#[derive(clap::Args, Clone)]
pub struct ForkArgs {
    /// Root image of the template (tiny or base), 1 vCPU, 128 MiB.
    #[arg(long, default_value = "tiny")]
    pub image: String,
    /// Clone counts (comma-separated, each 1 to 100).
    #[arg(long, default_value = "1,10,100")]
    pub counts: String,
    /// Concurrent clients of the peer's creates and of the execs.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Extra arguments of the private shoald the benchmark runs.
    #[arg(long, default_value = "--no-pools")]
    pub daemon_args: String,
    /// Where to write the JSON report.
    #[arg(long = "out", default_value = "bench-fork.json")]
    pub out: PathBuf,
    /// Skip the exec phase (time to all answering an exec, memory after it).
    #[arg(long)]
    pub no_exec: bool,
}

/// `shoal bench fork`: on a private shoald (its sandboxes' VMMs are read
/// for their memory).
pub fn fork(g: &crate::daemon_cmds::Global, a: &ForkArgs, out: &Output) -> Result<()> {
    if g.daemon.is_some() {
        bail!("bench fork runs a private shoald (it reads its VMMs' memory): drop --daemon");
    }
    let counts = a
        .counts
        .split(',')
        .map(|k| {
            k.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=100).contains(n))
                .with_context(|| format!("bad clone count {k:?} (1 to 100)"))
        })
        .collect::<Result<Vec<_>>>()?;
    let (c, private) = PrivateDaemon::start("fork", &a.daemon_args)?;
    let template = format!("{}-1c-128m", a.image);
    crate::daemon_cmds::image_template(g, &c, &a.image, 1, 128, &Default::default())?;
    let opts = shoal_bench::fork::ForkBenchOpts {
        template,
        counts,
        clients: a.clients.max(1),
        sandboxes_dir: private.dir.join("sandboxes"),
        settle: Duration::from_secs(4),
        no_exec: a.no_exec,
    };
    let report = shoal_bench::fork::run(&c, &opts, &mut |l| eprintln!("{l}"));
    drop(private);
    let report = report?;
    out.emit(
        &report.render(),
        &report,
        shoal_bench::fork::ForkReport::plot,
    )
}
