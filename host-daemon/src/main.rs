//! `shoald`: the Shoal host daemon (the library `shoald`).

use anyhow::{bail, Result};
use clap::Parser;
use shoal_runtime::backend::microvm::MicroVm;
use shoald::{self as daemon, admission::Limits, Config, Daemon};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

mod net_args;
mod vm_kind;

#[derive(Parser)]
#[command(
    name = "shoald",
    version,
    about = "Shoal host daemon: sandboxes over an HTTP/JSON API"
)]
struct Args {
    /// State directory (database, API socket `shoald.sock`, sandboxes).
    /// Default: $SHOAL_STATE/daemon or ~/.cache/shoal/daemon.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Installed guest kernel and images (DIR/vmlinux, DIR/cmdline,
    /// DIR/images/{tiny,base}.erofs; `shoal artifacts build` installs
    /// them). Default: SHOAL_ARTIFACTS, else <binaries>/../share/shoal,
    /// else ~/.cache/shoal/artifacts.
    #[arg(long, value_name = "DIR")]
    artifacts: Option<PathBuf>,
    /// The only directory layer files may come from (`layers` in a
    /// create's request: image names, or erofs files under this
    /// directory). Default: STATE_DIR/layers.
    #[arg(long, value_name = "DIR")]
    layers_dir: Option<PathBuf>,
    /// Also listen on TCP (e.g. 127.0.0.1:7070); needs --token-file.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// File holding the bearer token TCP clients must send: one line (the
    /// token), or `NAME:TOKEN` lines, one per tenant (templates are their
    /// maker's; the token named `admin` may change anyone's). Must be
    /// owned by the daemon's user and not readable by group or others.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// On TCP, serve SandboxFusion's `POST /run_code` and `GET /v1/ping`
    /// without a token (as SandboxFusion does: for a private network);
    /// every other route still needs one. Without this flag those two
    /// take the token as a bearer token or as the password of HTTP Basic
    /// auth (`SANDBOX_FUSION_ENDPOINT=http://fusion:TOKEN@HOST:PORT`).
    #[arg(long)]
    run_code_without_token: bool,
    /// A request's head must arrive within this many seconds (also how
    /// long an idle keep-alive connection is kept).
    #[arg(long, default_value_t = 10)]
    header_timeout_s: u64,
    /// A request body or response making no progress this many seconds
    /// ends its connection.
    #[arg(long, default_value_t = 120)]
    idle_timeout_s: u64,
    /// Open connections per listener (Unix socket, TCP) at most; more wait
    /// to be accepted.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Largest upload (MiB; streamed).
    #[arg(long, default_value_t = 16 * 1024)]
    max_upload_mib: u64,
    /// Guest memory reservable per MiB of host memory.
    #[arg(long, default_value_t = 8.0)]
    memory_overcommit: f64,
    /// vCPUs reservable per host CPU (idle sandboxes use a few % of a CPU).
    #[arg(long, default_value_t = 1024.0)]
    cpu_overcommit: f64,
    /// Refuse new sandboxes (503) below this much host MemAvailable (MiB).
    #[arg(long, default_value_t = 1024)]
    min_available_mib: u64,
    /// Most sandboxes holding a VMM at once.
    #[arg(long, default_value_t = 4000)]
    max_sandboxes: u64,
    /// Disk sandboxes and templates may reserve on the state filesystem
    /// (MiB; each reserves its memory, for a pause or its snapshot, and its
    /// scratch disk). Default: what is free at start plus what sandboxes
    /// and templates hold, less the reserve.
    #[arg(long)]
    disk_budget_mib: Option<u64>,
    /// Refuse sandboxes (503) that would leave less than this free on the
    /// state filesystem (MiB).
    #[arg(long, default_value_t = 2048)]
    min_free_disk_mib: u64,
    /// Disk reservable per MiB of the disk budget: a reservation is the
    /// most a sandbox could write (all its memory in a pause, a full
    /// scratch disk), but a pause writes only what the guest changed since
    /// its template and scratch disks are sparse. Real free space is
    /// checked before every create, pause and fork either way.
    #[arg(long, default_value_t = 4.0)]
    disk_overcommit: f64,
    /// Host memory to plan with (MiB; default: MemTotal).
    #[arg(long)]
    host_memory_mib: Option<u64>,
    /// Seconds allowed to reach a sandbox's agent.
    #[arg(long, default_value_t = 60)]
    agent_timeout: u64,
    /// Seconds one call into a sandbox's agent (an exec's start, a file
    /// operation's frame) may take before it fails with 504.
    #[arg(long, default_value_t = 120)]
    agent_call_timeout: u64,
    /// Pause the vCPUs of a sandbox after this many ms without requests
    /// (continued on the next one; 0: never). Idle guests cost ~1% of a
    /// CPU each on PVM hosts. A guest reports the memory it freed ~2 s
    /// after the free (Linux's page reporting delay) and reporting takes it
    /// guest time: a sandbox frozen sooner keeps that memory until it runs
    /// again.
    #[arg(long, default_value_t = 5000)]
    freeze_idle_ms: u64,
    /// Give new templates no virtio-balloon (by default each gets one with
    /// free page reporting and deflate-on-OOM: pages a guest frees go back
    /// to the host at once). Templates built before keep what they have.
    #[arg(long)]
    no_balloon: bool,
    /// Evict the private guest memory of a sandbox idle this many seconds
    /// (frozen or not) out of host RAM: to swap where the host has it,
    /// else to a file in its directory (`shoal doctor` says which); 0: never.
    #[arg(long, default_value_t = 120)]
    evict_idle_s: u64,
    /// Evict only while host MemAvailable is under this percentage of
    /// MemTotal (100: whatever the pressure).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u8).range(1..=100))]
    evict_below_available_pct: u8,
    /// Evictions per minute across the host, at most.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    evict_per_minute: u32,
    /// VMM restores in flight at most (default: 2 per CPU); more creates queue.
    #[arg(long)]
    max_restores: Option<usize>,
    /// Do not refill warm pools.
    #[arg(long)]
    no_pools: bool,
    /// VMMs started ahead per template (jailed and pre-warmed: a create the
    /// warm pool does not serve then pays only the restore); 0: none.
    #[arg(long, default_value_t = 1)]
    vmm_stock: usize,
    /// Most bytes per stream (stdout, stderr) a one-shot exec returns
    /// (MiB); the rest is dropped and the result says `truncated`.
    #[arg(long, default_value_t = 16)]
    exec_output_limit_mib: usize,
    /// Agent calls one sandbox may have in flight; more are refused (429).
    #[arg(long, default_value_t = 1024)]
    max_agent_calls: usize,
    /// Log as JSON lines (default: key=value text).
    #[arg(long)]
    log_json: bool,
    /// The most bytes of one image layer pulled, compressed and
    /// uncompressed (a larger one fails its pull).
    #[arg(long, default_value_t = image_store::layer::DEFAULT_MAX_LAYER_BYTES)]
    max_layer_bytes: u64,
    /// Registry credentials for pulls: a Docker `config.json` (default:
    /// $DOCKER_CONFIG/config.json or ~/.docker/config.json when there).
    #[arg(long, value_name = "FILE")]
    registry_auth_file: Option<PathBuf>,
    /// Cap on the image store's layers and the merged layers made of them
    /// (bytes): after a pull, the least-recently-used layers no image in
    /// use needs are evicted, with their images and the merged layers only
    /// they needed (default: no cap).
    #[arg(long, value_name = "BYTES")]
    image_store_max_bytes: Option<u64>,
    /// Do not run the `vm` kind (QEMU q35 guests), even where this host
    /// has QEMU, our kernel and the tiny image (by default it runs them
    /// there; elsewhere a `vm` template is refused with 400).
    #[arg(long)]
    no_vm: bool,
    #[command(flatten)]
    net: net_args::NetArgs,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let sub = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    if a.log_json {
        sub.json().init();
    } else {
        sub.init();
    }
    let tcp = match (a.listen, &a.token_file) {
        (None, _) => None,
        (Some(_), None) => {
            bail!("--listen needs --token-file (TCP clients must send a bearer token)")
        }
        (Some(addr), Some(f)) => {
            let t = daemon::auth::Tokens::load(f)?.with_open_fusion(a.run_code_without_token);
            if a.run_code_without_token {
                tracing::warn!(%addr, "POST /run_code needs no token on TCP (--run-code-without-token)");
            }
            Some((addr, t))
        }
    };
    // Each VMM costs the daemon a pidfd and a few short-lived sockets.
    raise_nofile();
    // The installed guest kernel and images templates boot from (the
    // daemon only reads them; see shoal_images::artifacts).
    let artifacts = a
        .artifacts
        .map(shoal_images::artifacts::Layout::at)
        .unwrap_or_else(shoal_images::artifacts::Layout::default_location);
    let state_dir = a.state_dir.unwrap_or_else(daemon::default_state_dir);
    std::fs::create_dir_all(&state_dir)?;
    let disk_budget_mib = a.disk_budget_mib.unwrap_or_else(|| {
        let free = daemon::admission::free_disk_mib(&state_dir);
        // What sandboxes and templates hold is reserved again by them.
        let held = daemon::admission::du_mib(&state_dir.join("sandboxes"))
            + daemon::admission::du_mib(&state_dir.join("templates"));
        free.saturating_add(held)
            .saturating_sub(a.min_free_disk_mib)
            .max(1)
    });
    let cfg = Config {
        state_dir,
        limits: Limits {
            host_memory_mib: a
                .host_memory_mib
                .unwrap_or_else(|| daemon::admission::meminfo_kib("MemTotal").unwrap_or(0) / 1024),
            host_cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
            memory_overcommit: a.memory_overcommit,
            cpu_overcommit: a.cpu_overcommit,
            min_available_mib: a.min_available_mib,
            max_vms: a.max_sandboxes,
            disk_budget_mib,
            min_free_disk_mib: a.min_free_disk_mib,
            disk_overcommit: a.disk_overcommit,
        },
        agent_timeout: Duration::from_secs(a.agent_timeout),
        sweep_interval: Duration::from_secs(1),
        pools: !a.no_pools,
        max_restores: a
            .max_restores
            .unwrap_or_else(|| 2 * std::thread::available_parallelism().map_or(1, |n| n.get())),
        freeze_after: (a.freeze_idle_ms > 0).then(|| Duration::from_millis(a.freeze_idle_ms)),
        agent: daemon::agent_limits::AgentLimits {
            exec_output_limit: a.exec_output_limit_mib.saturating_mul(1 << 20),
            max_in_flight: a.max_agent_calls,
            call_timeout: Duration::from_secs(a.agent_call_timeout.max(1)),
            ..Default::default()
        },
        http: daemon::listen::HttpLimits {
            header_timeout: Duration::from_secs(a.header_timeout_s.max(1)),
            idle_timeout: Duration::from_secs(a.idle_timeout_s.max(1)),
            max_connections: a.max_connections.max(1),
            max_upload: a.max_upload_mib.saturating_mul(1 << 20),
            ..Default::default()
        },
        layers_dir: a.layers_dir,
        vmm_stock: a.vmm_stock,
        images: daemon::images::ImageOptions {
            limits: image_store::layer::LayerLimits::both(a.max_layer_bytes),
            auth_file: a.registry_auth_file,
            max_bytes: a.image_store_max_bytes,
        },
        net: a.net.options()?,
        evict: daemon::evict::EvictPolicy {
            idle: (a.evict_idle_s > 0).then(|| Duration::from_secs(a.evict_idle_s)),
            below_available_pct: a.evict_below_available_pct,
            per_minute: a.evict_per_minute,
            ..Default::default()
        },
        balloon: (!a.no_balloon).then(daemon::balloon::default_options),
    };
    let missing: Vec<String> = artifacts
        .status()
        .into_iter()
        .filter(|(_, _, present)| !present)
        .map(|(_, p, _)| p.display().to_string())
        .collect();
    tracing::info!(
        dir = %artifacts.dir.display(),
        from = artifacts.origin.describe(),
        "guest kernel and images"
    );
    if !missing.is_empty() {
        tracing::warn!(
            "missing: {} (image templates that need them fail until they are installed: \
             `shoal artifacts build` from a Shoal checkout)",
            missing.join(", ")
        );
    }
    let vmm = shoal_images::artifacts::vmm_binary()?;
    // Every sandbox VMM through shoal-jailer when running as root
    // (SHOAL_JAIL=0 to run them unjailed).
    let jail =
        shoal_runtime::jail::JailConfig::auto(&vmm, &cfg.state_dir).map_err(anyhow::Error::msg)?;
    match &jail {
        Some(j) => tracing::info!(jailer = %j.jailer.display(), "VMMs run jailed"),
        None => tracing::warn!("VMMs run unjailed (not root, or SHOAL_JAIL=0)"),
    }
    let mut extra: Vec<Arc<dyn shoal_runtime::backend::SandboxBackend>> = Vec::new();
    match a.no_vm {
        true => tracing::info!("the vm kind is off (--no-vm)"),
        false => match vm_kind::backend(&artifacts) {
            Ok(q) => {
                tracing::info!("the vm kind runs (QEMU q35)");
                extra.push(Arc::new(q));
            }
            Err(e) => tracing::warn!("the vm kind is off: {e:#}"),
        },
    }
    let backend = Arc::new(MicroVm::new(vmm, artifacts).with_jail(jail));
    let d = Daemon::open_with(cfg, backend, extra).map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(2048)
        .build()?;
    rt.block_on(daemon::serve(d, tcp))
        .map_err(anyhow::Error::msg)?;
    // Blocking calls still stuck on a dead guest must not hold us up.
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}
