//! `shoal-vmm`: boots one microVM and runs it until the guest stops.
//!
//! Exit status: 0 when the guest reboots or powers off, 3 on a triple fault,
//! 124 when `--timeout` expires, 1 on any set-up or guest error (one line on
//! stderr), 2 on bad flags.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmm::seccomp::{Filters, Violation};
use vmm::{
    BootSource, CpuProfile, DiskConfig, ExitReason, PmemConfig, RestoreOptions, RunOptions,
    SerialOutput, Vm, VmConfig, VsockConfig,
};

#[derive(Parser, Debug)]
#[command(
    name = "shoal-vmm",
    version,
    about = "Shoal microVM monitor: boots one KVM microVM"
)]
struct Args {
    /// Report what this host offers (KVM type, userfaultfd, ...) and exit.
    #[arg(long)]
    check_host: bool,
    /// With --check-host: print JSON.
    #[arg(long, requires = "check_host")]
    json: bool,
    /// Whole VM configuration as a JSON file (excludes the flags below).
    #[arg(long, conflicts_with_all = ["kernel", "cmdline", "initrd", "disk", "pmem", "restore", "net", "balloon"])]
    config: Option<PathBuf>,
    /// Start from the snapshot in this directory instead of booting.
    #[arg(long, conflicts_with_all = ["kernel", "cmdline", "initrd", "disk", "pmem", "net", "balloon"])]
    restore: Option<PathBuf>,
    /// With --restore: the file for the snapshot's next virtio-blk disk, in
    /// place of the saved path (repeatable: /dev/vda, /dev/vdb, ...). A
    /// writable disk belongs to the guest's state: give each restored VM
    /// its own copy of the file as it was at the snapshot.
    #[arg(long, value_name = "PATH", requires = "restore")]
    restore_disk: Vec<PathBuf>,
    /// virtio-vsock: host socket for CONNECT <port> connections into the guest
    /// (with --restore/--prewarm: this VM's socket instead of the saved one).
    #[arg(long)]
    vsock_uds: Option<PathBuf>,
    /// Guest context id of the vsock device.
    #[arg(long, default_value_t = 3)]
    vsock_cid: u32,
    /// Serve the control protocol (pause, resume, snapshot, restore, shutdown, stats) here.
    #[arg(long)]
    api_sock: Option<PathBuf>,
    /// Create an empty VM (--memory, --vcpus) and wait on --api-sock for a
    /// `restore` request; keep the VM for further restores when the guest stops.
    #[arg(long, requires = "api_sock", conflicts_with_all = ["kernel", "config", "restore", "pmem", "net", "balloon"])]
    prewarm: bool,
    /// With --prewarm: end when the first restored guest stops, as a VMM
    /// restored with --restore does (a sandbox's VMM made ahead), instead of
    /// waiting for another `restore`.
    #[arg(long, requires = "prewarm")]
    once: bool,
    /// Uncompressed ELF kernel (vmlinux).
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// Kernel command line; words after " -- " go to the guest's init.
    #[arg(long)]
    cmdline: Option<String>,
    /// initrd / initramfs image.
    #[arg(long)]
    initrd: Option<PathBuf>,
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1)]
    vcpus: u8,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 128)]
    memory: u32,
    /// virtio-blk disk: PATH or PATH,ro (repeatable; /dev/vda, /dev/vdb, ...).
    #[arg(long)]
    disk: Vec<String>,
    /// virtio-pmem device: a read-only image (a multiple of 2 MiB) mapped
    /// into the guest for DAX, shared with every VM using it (repeatable;
    /// /dev/pmem0, /dev/pmem1, ...). `fd:N=PATH`: the image is the
    /// inherited descriptor N (PATH only names it, in snapshots).
    #[arg(long, value_name = "PATH")]
    pmem: Vec<PathBuf>,
    /// virtio-net device on a TAP: `fd:N,mac=MAC` (an inherited TAP
    /// descriptor) or `tap=NAME,mac=MAC`, then optional `rx_bps=N`,
    /// `rx_pps=N`, `tx_bps=N`, `tx_pps=N` (token-bucket limits, bytes and
    /// frames per second). None: the guest has no network device.
    #[arg(long, value_name = "SPEC")]
    net: Option<String>,
    /// virtio-balloon device (after the net device): `on` (statistics and
    /// free page reporting), or a comma list of `deflate_on_oom`,
    /// `no_stats`, `no_reporting`, `stats_s=N` (new guest stats every N
    /// seconds). Its target is set over --api-sock
    /// (`{"op":"balloon","target_mib":N}`). None: no balloon.
    #[arg(long, value_name = "SPEC")]
    balloon: Option<String>,
    /// With --restore or --prewarm: the TAP, MAC and limits of the
    /// snapshot's net device (same syntax as --net). Required for a
    /// snapshot with a net device, refused for one without.
    #[arg(long, value_name = "SPEC")]
    restore_net: Option<String>,
    /// Serial console: stdout, null, or file:PATH.
    #[arg(long, default_value = "stdout")]
    serial: String,
    /// Most bytes of console output kept.
    #[arg(long)]
    serial_limit: Option<u64>,
    /// CPU profile: auto, host or pvm.
    #[arg(long, default_value = "auto")]
    cpu_profile: String,
    /// Stop the guest after this many seconds (exit status 124).
    #[arg(long)]
    timeout: Option<f64>,
    /// Print timing (monotonic clock) of VMM start, first guest entry and exit to stderr.
    #[arg(long)]
    timings: bool,
    /// An inherited file descriptor (e.g. a pipe) to write "ready\n" to and
    /// close once the vCPUs run (pre-warmed: once the control socket
    /// serves), so a supervisor can wait without polling.
    #[arg(long, value_name = "FD")]
    ready_fd: Option<i32>,
    /// Run without seccomp filters (for debugging and A/B benchmarks; by
    /// default every VMM thread runs under its role's filter, and a call
    /// outside it kills the VMM with SIGSYS).
    #[arg(long)]
    no_seccomp: bool,
    /// Print each thread role's allowed syscalls (role: count: names) and exit.
    #[arg(long)]
    print_seccomp: bool,
    /// Test hook: the first thread of this role (main, vcpu, events, api)
    /// makes a forbidden call right after installing its filter.
    #[arg(long, hide = true, value_name = "ROLE", conflicts_with = "no_seccomp")]
    seccomp_selftest: Option<vmm::seccomp::Role>,
    /// Debugging aid: let calls outside the filters through and have the
    /// kernel log them (audit type 1326 in dmesg) instead of killing.
    #[arg(long, hide = true, conflicts_with = "no_seccomp")]
    seccomp_log_only: bool,
}

fn monotonic_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // The monotonic clock is never negative.
    u128::from(ts.tv_sec.unsigned_abs()) * 1_000_000_000 + u128::from(ts.tv_nsec.unsigned_abs())
}

fn parse_disk(s: &str) -> Result<DiskConfig> {
    let (path, ro) = match s.rsplit_once(',') {
        Some((p, "ro")) => (p, true),
        Some((p, "rw")) => (p, false),
        Some((_, o)) => bail!("--disk {s}: unknown option '{o}' (expected ro or rw)"),
        None => (s, false),
    };
    if path.is_empty() {
        bail!("--disk needs a path");
    }
    Ok(DiskConfig {
        path: path.into(),
        read_only: ro,
    })
}

/// `--pmem PATH`, or `--pmem fd:N=PATH` (the image is inherited
/// descriptor N, named PATH).
fn parse_pmem(p: &std::path::Path) -> Result<PmemConfig> {
    let Some(rest) = p.to_str().and_then(|s| s.strip_prefix("fd:")) else {
        return Ok(PmemConfig {
            path: p.into(),
            fd: None,
        });
    };
    let (n, name) = rest
        .split_once('=')
        .with_context(|| format!("--pmem {rest}: expected fd:N=PATH"))?;
    let fd: i32 = n
        .parse()
        .with_context(|| format!("--pmem fd:{n}: not a descriptor number"))?;
    anyhow::ensure!(
        fd > 2 && !name.is_empty(),
        "--pmem fd:{n}={name}: expected a descriptor of 3 or above and a name"
    );
    Ok(PmemConfig {
        path: name.into(),
        fd: Some(fd),
    })
}

/// `--net` / `--restore-net SPEC`.
fn parse_net(s: &str) -> Result<vmm::NetDeviceConfig> {
    s.parse().map_err(|e| anyhow::anyhow!("--net {s}: {e}"))
}

fn serial_output(s: &str) -> Result<SerialOutput> {
    Ok(match s {
        "stdout" => SerialOutput::Stdout,
        "null" => SerialOutput::Null,
        s => match s.strip_prefix("file:") {
            Some(p) if !p.is_empty() => SerialOutput::File(p.into()),
            _ => bail!("--serial {s}: expected stdout, null or file:PATH"),
        },
    })
}

fn build_config(a: &Args) -> Result<VmConfig> {
    if let Some(p) = &a.config {
        return Ok(VmConfig::from_json_file(p)?);
    }
    let kernel = a
        .kernel
        .clone()
        .context("no kernel: pass --kernel PATH or --config FILE")?;
    let mut c = VmConfig::linux(kernel);
    if let BootSource::Linux {
        cmdline, initrd, ..
    } = &mut c.boot
    {
        if let Some(s) = &a.cmdline {
            cmdline.clone_from(s);
        }
        initrd.clone_from(&a.initrd);
    }
    c.vcpus = a.vcpus;
    c.memory_mib = a.memory;
    c.disks = a
        .disk
        .iter()
        .map(|d| parse_disk(d))
        .collect::<Result<_>>()?;
    c.pmem = a
        .pmem
        .iter()
        .map(|p| parse_pmem(p))
        .collect::<Result<_>>()?;
    c.serial = serial_output(&a.serial)?;
    if let Some(l) = a.serial_limit {
        c.serial_limit_bytes = l;
    }
    c.vsock = a.vsock_uds.clone().map(|uds_path| VsockConfig {
        cid: a.vsock_cid,
        uds_path,
    });
    c.net = a.net.as_deref().map(parse_net).transpose()?;
    c.balloon = a
        .balloon
        .as_deref()
        .map(|s| s.parse().map_err(|e| anyhow::anyhow!("--balloon {s}: {e}")))
        .transpose()?;
    c.cpu_profile = match a.cpu_profile.as_str() {
        "auto" => None,
        p => Some(p.parse::<CpuProfile>().map_err(anyhow::Error::msg)?),
    };
    c.validate()?;
    Ok(c)
}

fn run(a: &Args, start_ns: u128) -> Result<i32> {
    if a.check_host {
        let r = vmm::host::detect();
        if a.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            print!("{}", r.table());
        }
        return Ok(0);
    }
    if a.print_seccomp {
        print!("{}", vmm::seccomp::summary()?);
        return Ok(0);
    }
    let seccomp = (!a.no_seccomp)
        .then(|| {
            let on_violation = if a.seccomp_log_only {
                Violation::Log
            } else {
                Violation::Kill
            };
            Filters::new(on_violation).map(|f| Arc::new(f.with_selftest(a.seccomp_selftest)))
        })
        .transpose()?;
    let ready = a.ready_fd.map(ready_fd).transpose()?;
    let timeout = a
        .timeout
        .map(|t| {
            Duration::try_from_secs_f64(t).map_err(|_| anyhow::anyhow!("--timeout {t}: invalid"))
        })
        .transpose()?;
    let serial = (a.serial != "stdout")
        .then(|| serial_output(&a.serial))
        .transpose()?;
    if a.restore_net.is_some() && a.restore.is_none() && !a.prewarm {
        anyhow::bail!("--restore-net needs --restore or --prewarm");
    }
    if a.prewarm
        && a.restore_net
            .as_deref()
            .is_some_and(|s| s.starts_with("tap="))
    {
        // The restore runs under the main thread's seccomp filter, which
        // does not let a TAP be opened by name.
        anyhow::bail!("--prewarm takes --restore-net fd:N,... (an inherited TAP), not tap=NAME");
    }
    let opts = RestoreOptions {
        serial,
        vsock_uds: a.vsock_uds.clone(),
        disks: a.restore_disk.clone(),
        net: a.restore_net.as_deref().map(parse_net).transpose()?,
    };
    let vm = match &a.restore {
        None if a.prewarm => Vm::prewarmed(a.memory, a.vcpus, None, opts)?,
        Some(dir) => Vm::restore(dir, None, opts)?,
        None => Vm::new(&build_config(a)?, None)?,
    };
    let built = Instant::now();
    let built_ns = monotonic_ns();
    let outcome = vm.run_with(RunOptions {
        timeout,
        api_sock: a.api_sock.clone(),
        keep_alive: a.prewarm && !a.once,
        ready,
        seccomp,
    })?;
    let exit_ns = monotonic_ns();
    if a.timings {
        let at = |i: Option<Instant>| {
            i.map(|i| {
                let d = i.saturating_duration_since(built).as_nanos();
                format!("{}", built_ns + d)
            })
            .unwrap_or_else(|| "none".into())
        };
        eprintln!(
            "SHOAL-TIMING start_ns={start_ns} built_ns={built_ns} first_run_ns={} first_console_ns={} exit_ns={exit_ns}",
            at(outcome.first_run),
            at(outcome.first_console_byte)
        );
    }
    match &outcome.exit {
        ExitReason::Error(e) => eprintln!("shoal-vmm: guest stopped: {e}"),
        ExitReason::TripleFault => eprintln!("shoal-vmm: guest stopped: triple fault"),
        ExitReason::Stopped if timeout.is_some() => {
            eprintln!("shoal-vmm: timeout expired; guest stopped");
            return Ok(124);
        }
        _ => {}
    }
    Ok(outcome.exit.exit_code())
}

/// Takes ownership of the inherited `--ready-fd`, refusing numbers that
/// are not open descriptors or are stdin/stdout/stderr.
fn ready_fd(fd: i32) -> Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    anyhow::ensure!(fd > 2, "--ready-fd {fd}: must be 3 or above");
    // SAFETY: F_GETFD only queries the descriptor's flags.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        anyhow::bail!("--ready-fd {fd}: not an open file descriptor");
    }
    // SAFETY: the descriptor is open, inherited for this purpose, and owned
    // by nothing else in this process.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// One line for an error chain; causes already quoted by the message
/// before them (our error types include their source) are left out.
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if !line.contains(&c) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&c);
        }
    }
    line
}

/// Raises the soft open-file limit to the hard one: a VM's vsock device
/// holds a descriptor per connection (up to 1024 of them).
fn raise_nofile_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn main() {
    let start_ns = monotonic_ns();
    vmm::seccomp::single_malloc_arena();
    raise_nofile_limit();
    let args = Args::parse();
    let code = match run(&args, start_ns) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("shoal-vmm: error: {}", error_line(&e));
            1
        }
    };
    std::process::exit(code);
}
