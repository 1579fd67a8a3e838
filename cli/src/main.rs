//! `shoal`: the Shoal command-line tool.
//!
//! - `shoal run [--image base|tiny] -- CMD...`: run CMD in a fresh sandbox
//!   through the daemon (`shoald`, started on demand), stream its output,
//!   exit with its exit code.
//! - `shoal create|ls|exec|attach|cp|snapshot|fork|net|pause|resume|rm`,
//!   `shoal screen|input` (a vm sandbox's display), `shoal template ...`,
//!   `shoal pool ...`, `shoal stats`: sandboxes through the daemon;
//!   `shoal daemon start|stop|status`: the local daemon itself.
//! - `shoal vm ...`: sandboxes without the daemon (one VMM process each).
//! - `shoal restore`: a snapshot in the foreground.
//! - `shoal image build SRC -o OUT`: a DAX-ready root image (erofs, 4 KiB
//!   blocks, padded to 2 MiB) from `base`, a directory or a tar archive;
//!   `shoal image build base --packages P,Q -o OUT`: a read-only layer of
//!   Debian packages over an image; `shoal image build fncall-cpp -o OUT`:
//!   a built-in layer (`shoal image layers` lists them).
//! - `shoal artifacts build|show`: the guest kernel and images shoald
//!   boots templates from (built from a checkout, installed in a layout).
//! - `shoal fncall -l LANG -c CODE`: one function call (FnCall).
//! - `shoal doctor`: what this host offers and where the guest artifacts
//!   come from. `shoal bench ...`: benchmarks.

mod artifacts_cmd;
mod bench;
mod bench_classes;
mod bench_cmd;
mod bench_density;
mod bench_fncall;
mod bench_image;
mod bench_net;
mod bench_net_host;
mod bench_net_qemu;
mod bench_vm;
mod confinement;
mod daemon_client;
mod daemon_cmds;
mod daemon_ctl;
mod density_mem;
mod density_plan;
mod density_report;
mod display_cmds;
mod fncall_cmd;
mod image_cmd;
mod net_arg;
mod oci_image_cmd;
mod progress;
mod sandbox_cmds;
mod vm_disk_arg;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use shoal_images::artifacts;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "shoal",
    version,
    about = "Shoal: KVM microVM sandboxes for RL agents"
)]
struct Cli {
    #[command(flatten)]
    g: daemon_cmds::Global,
    #[command(subcommand)]
    cmd: Cmd,
}

/// What a sandbox is made of.
#[derive(clap::Args, Clone)]
pub struct SandboxArgs {
    /// Root image: base (Debian bookworm with bash, python3), tiny
    /// (busybox), or an OCI image pulled with `shoal image pull` (a
    /// reference or its id; through the daemon only).
    #[arg(long, default_value = "base")]
    pub image: String,
    /// vCPUs.
    #[arg(long, default_value_t = 1)]
    pub cpus: u8,
    /// Memory in MiB.
    #[arg(long, default_value_t = 256)]
    pub memory: u32,
    #[command(flatten)]
    pub root: RootArgs,
}

/// What a template's root has beyond its image.
#[derive(clap::Args, Clone, Default)]
pub struct RootArgs {
    /// A further read-only layer over the image, lowest first (repeatable;
    /// /dev/pmem1, ...): an image file built with `shoal image build DIR -o
    /// OUT --no-agent` or `shoal image build base --packages P,Q -o OUT`
    /// (the daemon takes files only from its layers directory, `shoald
    /// --layers-dir`), an image name (tiny, base), or a built-in layer
    /// (fncall-python, fncall-cpp, fncall-nodejs, code-interpreter: `shoal
    /// image layers`).
    #[arg(long = "layer", value_name = "IMG")]
    pub layers: Vec<String>,
    /// The overlay's upper layer (where writes go) on tmpfs of this many
    /// MiB (default: half the memory; writes beyond it fail with ENOSPC).
    #[arg(long, value_name = "MIB", conflicts_with = "upper_disk")]
    pub upper_size: Option<u32>,
    /// The upper layer on an ext4 scratch disk of this many MiB instead,
    /// one per sandbox (sparse: the host pays for what the guest writes).
    #[arg(long, value_name = "MIB")]
    pub upper_disk: Option<u32>,
}

impl RootArgs {
    /// Layers as the daemon takes them: image names, or absolute paths
    /// (its working directory is not ours).
    pub fn layers(&self) -> Result<Vec<String>> {
        self.layers
            .iter()
            .map(|l| {
                let p = std::path::Path::new(l);
                if artifacts::is_named_layer(l) && !p.exists() {
                    return Ok(l.clone());
                }
                let abs = std::path::absolute(p).with_context(|| format!("--layer {l}"))?;
                Ok(abs.display().to_string())
            })
            .collect()
    }

    /// The request the daemon takes.
    pub fn request(&self) -> Result<shoal_client::api::RootRequest> {
        Ok(shoal_client::api::RootRequest {
            layers: self.layers()?,
            upper_size_mib: self.upper_size,
            upper_disk_mib: self.upper_disk,
        })
    }
}

/// How to run a command.
#[derive(clap::Args, Clone)]
pub struct ExecArgs {
    /// Environment variable NAME=VALUE (repeatable).
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// Working directory in the guest.
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// Kill the command (and everything it started) after this many seconds.
    #[arg(long)]
    pub timeout: Option<f64>,
    /// The command and its arguments (after `--`; `shoal run --image REF`
    /// of an OCI image with none runs the image's Entrypoint and Cmd).
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command in a fresh sandbox (through the daemon) and exit with
    /// its exit code.
    Run {
        #[command(flatten)]
        sandbox: SandboxArgs,
        #[command(flatten)]
        exec: ExecArgs,
        /// Forward our standard input to the command (read to its end first).
        #[arg(long, short = 'i')]
        stdin: bool,
        /// Without the daemon: restore a VMM here, run, stop it.
        #[arg(long)]
        direct: bool,
        /// When to pull an OCI `--image` first, as `docker run --pull`.
        #[arg(long, value_enum, default_value_t = daemon_cmds::Pull::Missing)]
        pull: daemon_cmds::Pull,
    },
    /// Create a sandbox; prints its id.
    Create {
        #[command(flatten)]
        args: daemon_cmds::CreateArgs,
    },
    /// List sandboxes.
    Ls {
        /// Only this state (running, paused, failed, ...).
        #[arg(long)]
        state: Option<String>,
        /// Only this template.
        #[arg(long)]
        template: Option<String>,
        /// Only with label KEY=VALUE (repeatable).
        #[arg(long = "meta", short = 'm')]
        meta: Vec<String>,
    },
    /// Run a command in a sandbox (a paused one is resumed first).
    Exec {
        /// Sandbox id (`shoal ls`).
        id: String,
        #[command(flatten)]
        exec: ExecArgs,
        /// Forward our standard input to the command (read to its end first).
        #[arg(long, short = 'i')]
        stdin: bool,
        /// Leave it running in the background; prints its id (`shoal attach`).
        #[arg(long, short = 'd')]
        background: bool,
    },
    /// Follow a background command's output (from its start) to its end;
    /// exits with its exit code.
    Attach {
        /// Sandbox id.
        id: String,
        /// Command id (`shoal exec --background`).
        cmd: String,
    },
    /// Copy files: `shoal cp LOCAL ID:/PATH` or `shoal cp ID:/PATH LOCAL`.
    Cp {
        /// Source.
        src: String,
        /// Destination.
        dst: String,
    },
    /// Snapshot a running sandbox into a new template (it keeps running).
    Snapshot {
        /// Sandbox id.
        id: String,
        /// Template name (default snap-ID-TIME).
        #[arg(long)]
        template: Option<String>,
    },
    /// Fork a running sandbox into N live clones (it keeps running); prints their ids.
    Fork(daemon_cmds::ForkArgs),
    /// Change a networked sandbox's egress policy at once
    /// (`allow=pypi.org,10.1.2.0/24:443,deny=10.1.2.3,dns=off`; `""`: nothing out).
    Net {
        /// Sandbox id.
        id: String,
        /// The new policy, as `shoal create --net` takes it.
        policy: String,
    },
    /// Pause a sandbox: its state goes to disk and its VMM ends.
    Pause {
        /// Sandbox id.
        id: String,
    },
    /// Resume a paused sandbox (exec and cp also do).
    Resume {
        /// Sandbox id.
        id: String,
    },
    /// Write a PNG of a vm sandbox's screen.
    Screen(display_cmds::ScreenArgs),
    /// Send keyboard and pointer events to a vm sandbox's display
    /// (`shoal input ID type:ls key:ret move:16384,16384 click:left`).
    Input(display_cmds::InputArgs),
    /// Kill sandboxes and remove everything they had.
    Rm {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Templates: images booted once and snapshotted.
    Template {
        #[command(subcommand)]
        op: TemplateCmd,
    },
    /// Warm pools of restored sandboxes per template.
    Pool {
        #[command(subcommand)]
        op: PoolCmd,
    },
    /// What the daemon holds: sandboxes, reservations, host memory, pools.
    Stats,
    /// One function call: code run in a fresh clone of the language's warm
    /// template (`shoal fncall -l python -c 'print(1)'`); prints its output
    /// and exits as the program did (124: timed out, 125: sandbox error).
    Fncall(fncall_cmd::FnCallArgs),
    /// The local daemon (shoald): start, stop, status.
    Daemon {
        #[command(subcommand)]
        op: daemon_ctl::DaemonCmd,
    },
    /// Sandboxes without the daemon (one VMM process each, driven here).
    Vm {
        #[command(subcommand)]
        op: VmCmd,
    },
    /// Start a VM from a snapshot directory in the foreground.
    Restore {
        /// Snapshot directory.
        dir: PathBuf,
        /// Serve the control socket here.
        #[arg(long)]
        sock: Option<PathBuf>,
        /// vsock host socket for this VM.
        #[arg(long)]
        vsock: Option<PathBuf>,
    },
    /// Report what this host offers (KVM type, nesting, userfaultfd, core
    /// scheduling, vhost-vsock, DAMON, cgroup v2) and what Shoal does about
    /// each, and where the guest kernel and images come from.
    Doctor,
    /// The guest kernel and images shoald boots templates from: an
    /// installed directory (DIR/vmlinux, DIR/cmdline,
    /// DIR/images/{tiny,base}.erofs, DIR/images/tiny.cpio).
    Artifacts {
        #[command(subcommand)]
        op: ArtifactsCmd,
    },
    /// Root images.
    Image {
        #[command(subcommand)]
        op: ImageCmd,
    },
    /// Benchmarks: a table, a JSON report and PNG figures.
    Bench(bench_cmd::BenchArgs),
}

/// `shoal template ...`.
#[derive(Subcommand)]
pub enum TemplateCmd {
    /// Boot an image once and snapshot it (progress shown; cached).
    Create {
        /// Name.
        name: String,
        /// Image: tiny or base (default base; tiny, the only one, for a
        /// vm template).
        #[arg(long)]
        image: Option<String>,
        /// vCPUs.
        #[arg(long, default_value_t = 1)]
        cpus: u32,
        /// Memory in MiB (default 128; 256 for a vm template).
        #[arg(long)]
        memory: Option<u32>,
        /// Kind of its sandboxes: microvm, or vm (a QEMU q35 guest with a
        /// display: `shoal screen`, `shoal input`; no layers or upper layer).
        #[arg(long, value_parser = ["microvm", "vm"])]
        kind: Option<String>,
        /// With `--kind vm`: boot the guest without Shoal's agent, with a
        /// shell on its serial console that exec and files go through.
        #[arg(long)]
        no_agent: bool,
        /// With a network device: its sandboxes are created with `--net`,
        /// each on a network slot of its own.
        #[arg(long)]
        net: bool,
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        disk: Box<vm_disk_arg::VmDiskArgs>,
    },
    /// List templates.
    Ls,
    /// Delete a template and its pool.
    Rm {
        /// Name.
        name: String,
    },
}

/// `shoal pool ...`.
#[derive(Subcommand)]
pub enum PoolCmd {
    /// Keep N restored sandboxes of TEMPLATE ready (0 removes the pool).
    Set {
        /// Template name.
        template: String,
        /// Target size.
        target: u32,
    },
    /// List pools.
    Ls,
    /// Remove a pool and its warm sandboxes.
    Rm {
        /// Template name.
        template: String,
    },
}

#[derive(Subcommand)]
enum ArtifactsCmd {
    /// Build the kernel and images with this checkout's scripts (cached:
    /// instant when nothing changed) and install them.
    Build {
        /// Where to install (default: SHOAL_ARTIFACTS, else
        /// <binaries>/../share/shoal if it has a kernel, else
        /// ~/.cache/shoal/artifacts: where shoald looks by default).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Images to build (default: tiny and base): tiny, base, a built-in
        /// layer (`shoal image layers`), or `layers` for all of those.
        images: Vec<String>,
    },
    /// Where they are read from and which are present.
    Show,
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Build a DAX-ready root image for virtio-pmem (erofs, uncompressed,
    /// 4 KiB blocks, no inline data, padded to a multiple of 2 MiB) with the
    /// guest agent installed as /sbin/shoal-agent; or, with --packages, a
    /// read-only layer holding what installing those Debian packages over
    /// SRC adds and changes (needs root and a Debian mirror); or a built-in
    /// layer by name (cached).
    Build {
        /// `base` (the project's Debian image), a root directory, or a tar
        /// archive of one (plain or compressed); with --packages, `base` or
        /// an erofs image file; or a built-in layer (`shoal image layers`).
        source: String,
        /// The image file to write (replaced atomically).
        #[arg(long, short)]
        output: PathBuf,
        /// Guest agent binary to install (default: SHOAL_AGENT, else the
        /// workspace's musl release build).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// Install no agent (a layer over another image, or a source that
        /// brings its own).
        #[arg(long, conflicts_with = "agent")]
        no_agent: bool,
        /// Make a layer of these Debian packages (comma or space
        /// separated, repeatable) over SRC, installed with apt-get in a
        /// chroot of an overlay (only the upper layer is kept).
        #[arg(long, value_name = "PKGS", conflicts_with_all = ["agent", "no_agent"])]
        packages: Vec<String>,
        /// `microvm` (default: the erofs image above) or `vm`: a qcow2
        /// disk for the vm kind from SRC `base`'s Debian packages (ext4,
        /// the agent at /usr/local/sbin/shoal-agent and as the systemd
        /// unit shoal-agent.service; cached, then copied to OUTPUT).
        #[arg(long, default_value = "microvm", value_parser = ["microvm", "vm"],
              conflicts_with_all = ["agent", "no_agent", "packages"])]
        kind: String,
    },
    /// The built-in layers (name, packages, cached file).
    Layers,
    #[command(flatten)]
    Oci(oci_image_cmd::OciCmd),
}

#[derive(Subcommand)]
enum VmCmd {
    /// Start a sandbox and leave it running; prints its id.
    Start {
        #[command(flatten)]
        sandbox: SandboxArgs,
    },
    /// List running sandboxes.
    Ls,
    /// Stop a sandbox and remove it.
    Stop {
        /// Sandbox id.
        id: String,
    },
    /// Stop a sandbox's vCPUs.
    Pause {
        /// Sandbox id.
        id: String,
    },
    /// Continue a paused sandbox.
    Resume {
        /// Sandbox id.
        id: String,
    },
    /// Counters (JSON).
    Stats {
        /// Sandbox id.
        id: String,
    },
    /// Run a command in a running sandbox.
    Exec {
        /// Sandbox id (`shoal vm ls`).
        id: String,
        #[command(flatten)]
        exec: ExecArgs,
    },
    /// Copy files: `shoal vm cp LOCAL ID:PATH` or `shoal vm cp ID:PATH LOCAL`.
    Cp {
        /// Source.
        src: String,
        /// Destination.
        dst: String,
    },
    /// Snapshot a running sandbox into DIR (it stays paused; `shoal vm resume` continues it).
    Snapshot {
        /// Sandbox id.
        id: String,
        /// Target directory.
        dir: PathBuf,
        /// Only the pages changed since the sandbox's template (small, fast;
        /// the template must stay in place).
        #[arg(long)]
        diff: bool,
    },
}

/// Images by name.
pub const IMAGES: [&str; 2] = ["base", "tiny"];

/// An image's read-only root file, or a built-in layer's file.
pub fn image_path(name: &str) -> Result<PathBuf> {
    if artifacts::is_named_layer(name) {
        return Ok(artifacts::image(&format!("{name}_erofs"))?);
    }
    bail!(
        "unknown image '{name}' (expected base or tiny, or a built-in layer: {})",
        shoal_images::lang_layers::names().join(", ")
    )
}

fn doctor(json: bool) -> Result<i32> {
    let r = vmm::host::detect();
    let layout = artifacts::Layout::default_location();
    let confined = artifacts::vmm_binary()
        .map(|vmm| confinement::report(&vmm))
        .unwrap_or_else(|_| confinement::report(std::path::Path::new("shoal-vmm")));
    // What sandboxes created with a network need (the others need none).
    let net_missing = shoal_hostnet::probe();
    let vm_host = shoal_runtime::backend::qemu_probe::probe(
        std::path::Path::new("qemu-system-x86_64"),
        std::path::Path::new("qemu-img"),
    );
    if json {
        let mut v = serde_json::to_value(&r)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("artifacts".into(), artifacts_cmd::show_json(&layout));
            o.insert("confinement".into(), serde_json::to_value(&confined)?);
            o.insert(
                "network".into(),
                serde_json::json!({"ok": net_missing.is_empty(), "missing": net_missing}),
            );
            o.insert("vm_kind".into(), serde_json::to_value(&vm_host)?);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", r.table());
        println!();
        print!("{}", artifacts_cmd::show_text(&layout));
        println!();
        print!("{}", confinement::text(&confined));
        println!();
        print!("{}", net_arg::doctor_text(&net_missing));
        println!();
        print!("{}", vm_host.text());
    }
    Ok(0)
}

fn restore_fg(dir: PathBuf, sock: Option<PathBuf>, vsock: Option<PathBuf>) -> Result<i32> {
    use shoal_images::layers;
    use shoal_runtime::vmm_process::{Disk, VmmProcess};
    let mut p = VmmProcess::restore(&artifacts::vmm_binary()?, &dir);
    // A snapshot with a scratch disk runs on a copy of it (removed when the
    // VM ends), so the snapshot can be restored again.
    let disk = match layers::scratch_disk(&dir) {
        Some(src) => {
            let own = dir.join(format!("scratch-run-{}.ext4", std::process::id()));
            layers::clone_file(&src, &own)?;
            p = p.disk(Disk::rw(&own));
            Some(own)
        }
        None => None,
    };
    if let Some(s) = sock {
        p = p.api_sock(s);
    }
    if let Some(v) = vsock {
        p = p.vsock_uds(v);
    }
    let st = p
        .spawn()
        .context("cannot start shoal-vmm")
        .and_then(|mut s| Ok(s.child.wait()?));
    if let Some(d) = disk {
        let _ = std::fs::remove_file(d);
    }
    Ok(st?.code().unwrap_or(1))
}

fn main() {
    let cli = Cli::parse();
    use daemon_cmds as dc;
    use sandbox_cmds as sb;
    let g = &cli.g;
    let res = match cli.cmd {
        Cmd::Run {
            sandbox,
            exec,
            direct: true,
            ..
        } => sb::run(&sandbox, &exec),
        Cmd::Run {
            sandbox,
            exec,
            stdin,
            pull,
            ..
        } => dc::run(g, &sandbox, &exec, stdin, pull),
        Cmd::Create { args } => dc::create(g, &args),
        Cmd::Ls {
            state,
            template,
            meta,
        } => dc::ls(g, state.as_deref(), template.as_deref(), &meta),
        Cmd::Exec {
            id,
            exec,
            stdin,
            background,
        } => dc::exec(g, &id, &exec, stdin, background),
        Cmd::Attach { id, cmd } => dc::attach(g, &id, &cmd),
        Cmd::Cp { src, dst } => dc::cp(g, &src, &dst),
        Cmd::Snapshot { id, template } => dc::snapshot(g, &id, template.as_deref()),
        Cmd::Fork(a) => dc::fork(g, &a),
        Cmd::Net { id, policy } => dc::set_network(g, &id, &policy),
        Cmd::Pause { id } => dc::lifecycle(g, &id, "pause"),
        Cmd::Resume { id } => dc::lifecycle(g, &id, "resume"),
        Cmd::Screen(a) => display_cmds::screen(g, &a),
        Cmd::Input(a) => display_cmds::input(g, &a),
        Cmd::Rm { ids } => dc::rm(g, &ids),
        Cmd::Template { op } => dc::template(g, &op),
        Cmd::Pool { op } => dc::pool(g, &op),
        Cmd::Stats => dc::stats(g),
        Cmd::Fncall(a) => fncall_cmd::run(g, &a),
        Cmd::Daemon { op } => daemon_ctl::run(g, &op),
        Cmd::Vm { op } => match op {
            VmCmd::Start { sandbox } => sb::start(&sandbox),
            VmCmd::Ls => sb::ls(),
            VmCmd::Stop { id } => sb::stop(&id),
            VmCmd::Pause { id } => sb::control(&id, vmm_api::Request::Pause),
            VmCmd::Resume { id } => sb::control(&id, vmm_api::Request::Resume),
            VmCmd::Stats { id } => sb::control(&id, vmm_api::Request::Stats),
            VmCmd::Exec { id, exec } => sb::exec(&id, &exec),
            VmCmd::Cp { src, dst } => sb::cp(&src, &dst),
            VmCmd::Snapshot { id, dir, diff } => {
                let dir = std::path::absolute(&dir).unwrap_or(dir);
                sb::control(&id, vmm_api::Request::Snapshot { dir, diff })
            }
        },
        Cmd::Restore { dir, sock, vsock } => restore_fg(dir, sock, vsock),
        Cmd::Doctor => doctor(g.json),
        Cmd::Artifacts {
            op: ArtifactsCmd::Build { dir, images },
        } => artifacts_cmd::build_cmd(dir, &images),
        Cmd::Artifacts {
            op: ArtifactsCmd::Show,
        } => {
            print!(
                "{}",
                artifacts_cmd::show_text(&artifacts::Layout::default_location())
            );
            Ok(0)
        }
        Cmd::Image {
            op:
                ImageCmd::Build {
                    source,
                    output,
                    agent,
                    no_agent,
                    packages,
                    kind,
                },
        } => match kind.as_str() {
            "vm" => image_cmd::build_vm(&source, &output),
            _ => image_cmd::build(&source, &output, agent, no_agent, &packages),
        },
        Cmd::Image {
            op: ImageCmd::Layers,
        } => image_cmd::layers(),
        Cmd::Image {
            op: ImageCmd::Oci(c),
        } => oci_image_cmd::run(c, g),
        Cmd::Bench(a) => bench_cmd::run(g, a),
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("shoal: error: {e:#}");
            std::process::exit(1);
        }
    }
}
