//! `shoal`: the Shoal command-line tool.
//!
//! - `shoal run [--image base|tiny] -- CMD...`: boot a sandbox, run CMD in it,
//!   print its output, exit with its exit code (builds kernel/images if missing).
//! - `shoal doctor [--json]`: what this host offers and what Shoal does about it.
//! - `shoal bench boot`: boot latency and memory against QEMU microvm.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use shoal_host::artifacts;
use shoal_host::bench::boot::{self as bootbench, BootBenchOpts};
use shoal_host::launch::{self, BootSpec, Monitor, EXIT_PREFIX, INIT_MARKER};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "shoal",
    version,
    about = "Shoal: KVM microVM sandboxes for RL agents"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Boot a sandbox, run a command in it, print its output and exit with its code.
    Run {
        /// Root image: base (Debian bookworm with bash, python3) or tiny (busybox).
        #[arg(long, default_value = "base")]
        image: String,
        /// vCPUs.
        #[arg(long, default_value_t = 1)]
        cpus: u8,
        /// Memory in MiB.
        #[arg(long, default_value_t = 256)]
        memory: u32,
        /// Also print the kernel's console messages.
        #[arg(long)]
        verbose: bool,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Report what this host offers (KVM type, nesting, userfaultfd, core
    /// scheduling, vhost-vsock, DAMON, cgroup v2) and what Shoal does about each.
    Doctor {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
    /// Snapshot a running VM (through its control socket) into DIR; the VM stays paused.
    Snapshot {
        /// The VMM's control socket (shoal-vmm --api-sock).
        #[arg(long)]
        sock: PathBuf,
        /// Target directory.
        dir: PathBuf,
    },
    /// Start a VM from a snapshot directory (runs in the foreground).
    Restore {
        /// Snapshot directory.
        dir: PathBuf,
        /// Serve the control socket here.
        #[arg(long)]
        sock: Option<PathBuf>,
    },
    /// Control a running VM.
    Vm {
        #[command(subcommand)]
        op: VmCmd,
    },
}

#[derive(Subcommand)]
enum VmCmd {
    /// Stop the VM's vCPUs.
    Pause {
        /// The VMM's control socket.
        #[arg(long)]
        sock: PathBuf,
    },
    /// Continue a paused VM.
    Resume {
        /// The VMM's control socket.
        #[arg(long)]
        sock: PathBuf,
    },
    /// Counters (JSON).
    Stats {
        /// The VMM's control socket.
        #[arg(long)]
        sock: PathBuf,
    },
    /// End the VM.
    Stop {
        /// The VMM's control socket.
        #[arg(long)]
        sock: PathBuf,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// VMM start to first instruction, console, init and exit; vs QEMU microvm.
    Boot {
        /// Boots per system (>= 20 on hardware KVM; each takes seconds on PVM hosts).
        #[arg(long)]
        runs: Option<usize>,
        /// Root image (tiny or base).
        #[arg(long, default_value = "tiny")]
        image: String,
        /// Guest memory in MiB.
        #[arg(long, default_value_t = 128)]
        memory: u32,
        /// Skip the QEMU peer.
        #[arg(long)]
        no_qemu: bool,
        /// Where to write the JSON report.
        #[arg(long, default_value = "bench-boot.json")]
        json: PathBuf,
    },
    /// Snapshot size/time, restore latency, restore rate and PSS per restored VM.
    Restore {
        /// Sequential restores timed.
        #[arg(long, default_value_t = 100)]
        restores: usize,
        /// Concurrency levels for the rate test (comma-separated).
        #[arg(long, default_value = "1,2,4,8")]
        concurrency: String,
        /// Restores per concurrency level.
        #[arg(long, default_value_t = 200)]
        rate_restores: usize,
        /// Idle VMs kept alive for the PSS measurement.
        #[arg(long, default_value_t = 50)]
        pss_vms: usize,
        /// Guest memory in MiB.
        #[arg(long, default_value_t = 128)]
        memory: u32,
        /// Where to write the JSON report.
        #[arg(long, default_value = "bench-restore.json")]
        json: PathBuf,
    },
}

fn vm_call(sock: &std::path::Path, req: vmm::api::Request) -> Result<i32> {
    let r = vmm::api::call(sock, &req, Duration::from_secs(120))?;
    println!("{}", serde_json::to_string_pretty(&r)?);
    Ok(0)
}

fn bench_restore(
    restores: usize,
    concurrency: &str,
    rate_restores: usize,
    pss_vms: usize,
    memory: u32,
    json: &PathBuf,
) -> Result<()> {
    let concurrency = concurrency
        .split(',')
        .map(|k| {
            k.trim()
                .parse::<usize>()
                .with_context(|| format!("bad concurrency {k:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let work = std::env::temp_dir().join(format!("shoal-bench-restore-{}", std::process::id()));
    let opts = shoal_host::bench::restore::RestoreBenchOpts {
        spec: BootSpec {
            kernel: artifacts::kernel()?,
            root: image_path("tiny")?,
            cmdline: artifacts::base_cmdline(),
            init_args: vec![],
            memory_mib: memory,
            vcpus: 1,
        },
        vmm: artifacts::vmm_binary()?,
        workdir: work.clone(),
        restores,
        concurrency,
        rate_restores,
        pss_vms,
    };
    let report = shoal_host::bench::restore::run(&opts, &mut |l| eprintln!("{l}"));
    let _ = std::fs::remove_dir_all(&work);
    let report = report?;
    print!("{}", report.render());
    std::fs::write(json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    eprintln!("wrote {}", json.display());
    Ok(())
}

fn image_path(name: &str) -> Result<PathBuf> {
    match name {
        "base" | "tiny" => Ok(artifacts::image(&format!("{name}_erofs"))?),
        o => bail!("unknown image '{o}' (expected base or tiny)"),
    }
}

/// Kernel command-line words for init's argv: the kernel splits on spaces
/// and honours double quotes, so words with spaces are quoted and words
/// with quotes or newlines are refused.
fn init_words(cmd: &[String]) -> Result<Vec<String>> {
    cmd.iter()
        .map(|w| {
            if w.contains('"') || w.contains('\n') || w.contains('\0') {
                bail!("command word {w:?}: double quotes, newlines and NUL cannot be passed on the kernel command line");
            }
            Ok(if w.is_empty() || w.contains(char::is_whitespace) {
                format!("\"{w}\"")
            } else {
                w.clone()
            })
        })
        .collect()
}

fn run_cmd(
    image: &str,
    cpus: u8,
    memory: u32,
    verbose: bool,
    timeout: u64,
    command: &[String],
) -> Result<i32> {
    let words = init_words(command)?;
    eprintln!("shoal: preparing kernel and '{image}' image (built once, then cached)...");
    let kernel = artifacts::kernel()?;
    let root = image_path(image)?;
    let vmm = artifacts::vmm_binary()?;
    let mut cmdline = artifacts::base_cmdline();
    if !verbose {
        cmdline.push_str(" quiet");
    }
    let spec = BootSpec {
        kernel,
        root,
        cmdline,
        init_args: words,
        memory_mib: memory,
        vcpus: cpus,
    };
    eprintln!("shoal: booting sandbox ({image}, {cpus} vCPU, {memory} MiB)...");
    let mut in_cmd = false;
    let stdout = std::io::stdout();
    let r = launch::boot(
        &spec,
        &Monitor::Shoal(vmm),
        Duration::from_secs(timeout),
        &mut |line| {
            if line.contains(INIT_MARKER) {
                in_cmd = true;
                eprintln!("shoal: sandbox up; running command");
                if !verbose {
                    return;
                }
            }
            if line.starts_with(EXIT_PREFIX) {
                in_cmd = false;
                if !verbose {
                    return;
                }
            }
            if in_cmd || verbose {
                let _ = writeln!(stdout.lock(), "{line}");
            }
        },
    )?;
    let status = r.status.context("no VMM exit status")?;
    if !status.success() {
        bail!("the VMM failed ({status}); run with --verbose to see the guest console");
    }
    match r.guest_exit {
        Some(c) => Ok(c),
        None => bail!("the guest stopped without reporting the command's exit status"),
    }
}

fn bench_boot(
    runs: Option<usize>,
    image: &str,
    memory: u32,
    no_qemu: bool,
    json: &PathBuf,
) -> Result<()> {
    let hw = vmm::host::kvm_kind() == vmm::host::KvmKind::Hardware;
    let runs = runs.unwrap_or(if hw { 20 } else { 5 });
    let spec = BootSpec {
        kernel: artifacts::kernel()?,
        root: image_path(image)?,
        cmdline: artifacts::base_cmdline(),
        init_args: vec!["@reboot".into()],
        memory_mib: memory,
        vcpus: 1,
    };
    let opts = BootBenchOpts {
        spec,
        vmm: artifacts::vmm_binary()?,
        runs,
        qemu: !no_qemu,
        qemu_kernel_args: vmm::vm::profile_kernel_args(None)?,
        timeout: Duration::from_secs(if hw { 30 } else { 300 }),
    };
    let report = bootbench::run(&opts, &mut |l| eprintln!("{l}"))?;
    print!("{}", report.render());
    std::fs::write(json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    eprintln!("wrote {}", json.display());
    if report.rows.is_empty() {
        bail!("no successful boots");
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Run {
            image,
            cpus,
            memory,
            verbose,
            timeout,
            command,
        } => run_cmd(&image, cpus, memory, verbose, timeout, &command),
        Cmd::Doctor { json } => {
            let r = vmm::host::detect();
            if json {
                serde_json::to_string_pretty(&r)
                    .map(|s| println!("{s}"))
                    .map(|_| 0)
                    .map_err(Into::into)
            } else {
                print!("{}", r.table());
                Ok(0)
            }
        }
        Cmd::Bench {
            which:
                BenchCmd::Boot {
                    runs,
                    image,
                    memory,
                    no_qemu,
                    json,
                },
        } => bench_boot(runs, &image, memory, no_qemu, &json).map(|_| 0),
        Cmd::Bench {
            which:
                BenchCmd::Restore {
                    restores,
                    concurrency,
                    rate_restores,
                    pss_vms,
                    memory,
                    json,
                },
        } => bench_restore(
            restores,
            &concurrency,
            rate_restores,
            pss_vms,
            memory,
            &json,
        )
        .map(|_| 0),
        Cmd::Snapshot { sock, dir } => vm_call(&sock, vmm::api::Request::Snapshot { dir }),
        Cmd::Restore { dir, sock } => (|| {
            let vmm = artifacts::vmm_binary()?;
            let mut c = std::process::Command::new(vmm);
            c.arg("--restore").arg(&dir);
            if let Some(s) = sock {
                c.arg("--api-sock").arg(s);
            }
            let st = c.status().context("cannot start shoal-vmm")?;
            Ok(st.code().unwrap_or(1))
        })(),
        Cmd::Vm { op } => match op {
            VmCmd::Pause { sock } => vm_call(&sock, vmm::api::Request::Pause),
            VmCmd::Resume { sock } => vm_call(&sock, vmm::api::Request::Resume),
            VmCmd::Stats { sock } => vm_call(&sock, vmm::api::Request::Stats),
            VmCmd::Stop { sock } => vm_call(&sock, vmm::api::Request::Shutdown),
        },
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("shoal: error: {e:#}");
            std::process::exit(1);
        }
    }
}
