//! CLI commands that go through shoald: run, create, ls, exec (also in
//! the background), attach, cp, snapshot, fork, pause, resume, rm,
//! template, pool, stats.

use crate::daemon_client::{age, connect, table, Progress};
use crate::{ExecArgs, SandboxArgs};
use anyhow::{bail, Context, Result};
use shoal_client::api::{self, ExecEvent, SandboxState, TemplateState};
use shoal_client::DaemonClient;
use shoald::templates::image_template_name;
use std::collections::BTreeMap;
use std::io::{Read, Write};

/// Options every daemon command takes.
#[derive(clap::Args, Clone, Default)]
pub struct Global {
    /// The daemon: a Unix socket path or http://HOST:PORT (token in
    /// SHOAL_TOKEN). Default: SHOAL_DAEMON, else the local one (started
    /// on demand).
    #[arg(long, global = true)]
    pub daemon: Option<String>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    pub json: bool,
}

fn pairs(v: &[String], what: &str) -> Result<BTreeMap<String, String>> {
    v.iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("{what} {kv:?}: expected NAME=VALUE"))
        })
        .collect()
}

fn exec_body(e: &ExecArgs, stdin: Option<Vec<u8>>) -> Result<api::ExecRequest> {
    let mut b = api::ExecRequest {
        env: pairs(&e.env, "--env")?,
        cwd: e.cwd.as_ref().map(|c| c.display().to_string()),
        timeout_s: e.timeout,
        ..api::ExecRequest::argv(e.command.iter().cloned())
    };
    if let Some(s) = stdin {
        b = b.with_stdin(&s);
    }
    Ok(b)
}

/// Streams an exec's output to ours; returns the shell-style exit code.
fn stream_exec(c: &DaemonClient, id: &str, body: &api::ExecRequest) -> Result<i32> {
    print_events(c.exec_stream(id, body)?)
}

/// Writes a stream's output to ours; returns the shell-style exit code.
pub(crate) fn print_events(events: shoal_client::ExecStream) -> Result<i32> {
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    for ev in events {
        match ev? {
            ExecEvent::Stdout { data, encoding } => {
                out.write_all(&encoding.decode(&data).context("stdout")?)?;
                out.flush()?;
            }
            ExecEvent::Stderr { data, encoding } => {
                err.write_all(&encoding.decode(&data).context("stderr")?)?
            }
            ExecEvent::Exit {
                exit_code,
                signal,
                timed_out,
            } => {
                if timed_out {
                    eprintln!("shoal: command timed out; its processes were killed");
                }
                return Ok(api::exec::status_code(exit_code, signal));
            }
            ExecEvent::Error { message } => bail!("{message}"),
            ExecEvent::Start { .. } => {}
        }
    }
    bail!("the daemon closed the stream before the command ended")
}

fn read_stdin(forward: bool) -> Result<Option<Vec<u8>>> {
    if !forward {
        return Ok(None);
    }
    let mut v = Vec::new();
    std::io::stdin().lock().read_to_end(&mut v)?;
    Ok(Some(v))
}

/// The images a template of `image` with `root` boots: the image, and
/// the layers that are image names.
fn template_images(image: &str, root: &api::RootRequest) -> Vec<String> {
    let mut v = vec![image.to_string()];
    for l in &root.layers {
        if shoal_images::artifacts::is_named_layer(l) && !v.contains(l) {
            v.push(l.clone());
        }
    }
    v
}

/// Has the daemon make template `req` and waits for it, showing each
/// step. From a checkout, for a daemon on this host, the guest kernel and
/// images are built (the first time: minutes, with the build's progress)
/// and installed in the foreground first, so that shoald only boots and
/// snapshots. There is no deadline: each step ends when it ends, or fails
/// saying what failed. An image template that exists is used as it is
/// (one that failed is made again), unless `explicit` (`shoal template
/// create`: the daemon refuses a taken name).
fn ensure_template(
    g: &Global,
    c: &DaemonClient,
    req: &api::CreateTemplate,
    explicit: bool,
) -> Result<api::Template> {
    use crate::artifacts_cmd::{build_into, build_steps, plan_build};
    use crate::progress::{elapsed, Live};
    let name = &req.name;
    if !explicit {
        match c.template(name) {
            Ok(t) if t.state == TemplateState::Ready => return Ok(t),
            Ok(t) if t.state == TemplateState::Failed => {
                let _ = c.delete_template(name);
            }
            _ => {}
        }
    }
    let images = template_images(&req.image, &req.root());
    let layout = shoal_images::artifacts::Layout::default_location();
    let checkout = crate::daemon_client::is_local(g.daemon.as_deref())
        .then(|| plan_build(&layout, &images))
        .flatten();
    let mut steps = match &checkout {
        Some(_) => build_steps(&images),
        None => vec![],
    };
    steps.push("boot and snapshot".into());
    let total = steps.len();
    let live = Live::start_with_line(&format!(
        "shoal: preparing template '{name}' (once): {}",
        steps.join(", ")
    ));
    if let Some(co) = &checkout {
        build_into(co, &layout, &images, &live, 1, total)?;
    }
    let title = format!("  [{total}/{total}] template '{name}'");
    live.step(&title);
    let doing = "booting and snapshotting in shoald";
    live.detail(doing);
    let mut t = match c.create_template(req) {
        Ok(t) => t,
        // Being made by another client, or made meanwhile.
        Err(e) if e.status() == Some(409) && !explicit => c.template(name)?,
        Err(e) => return Err(e.into()),
    };
    while t.state == TemplateState::Building {
        std::thread::sleep(std::time::Duration::from_millis(250));
        t = c.template(name)?;
        live.detail(doing);
    }
    if t.state != TemplateState::Ready {
        bail!(
            "template '{name}' failed: {}",
            t.error.as_deref().unwrap_or("(no reason given)")
        );
    }
    live.line(&format!(
        "{title}: ready ({})",
        elapsed(live.step_elapsed())
    ));
    Ok(t)
}

/// Has the daemon make (once) the template `POST /v1/sandboxes` with
/// `image` at this shape uses, showing each step ([`ensure_template`]).
pub fn image_template(
    g: &Global,
    c: &DaemonClient,
    img: &str,
    vcpus: u32,
    mem: u32,
    root: &api::RootRequest,
) -> Result<api::Template> {
    let req = api::CreateTemplate {
        kind: None,
        vcpus: Some(vcpus),
        memory_mib: Some(mem),
        ..api::CreateTemplate::new(image_template_name(img, vcpus, mem, root), img)
    }
    .with_root(root.clone());
    ensure_template(g, c, &req, false)
}

/// When `shoal run` and `shoal create` pull an OCI image first.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pull {
    /// When the daemon's store lacks it (`docker run`'s default).
    Missing,
    /// Every time (a moved tag is followed).
    Always,
    /// Never: a missing image is an error.
    Never,
}

/// `shoal create --priority`: the sandbox's CPU class.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PriorityArg {
    /// Normal scheduling; SMT isolation where the host kernel has core
    /// scheduling.
    #[default]
    Latency,
    /// Only CPU time latency sandboxes leave (SCHED_IDLE, low CPU weight).
    #[value(name = "best_effort", alias = "best-effort")]
    BestEffort,
}

impl From<PriorityArg> for api::Priority {
    fn from(p: PriorityArg) -> api::Priority {
        match p {
            PriorityArg::Latency => api::Priority::Latency,
            PriorityArg::BestEffort => api::Priority::BestEffort,
        }
    }
}

/// Pulls OCI image `reference` through the daemon as `policy` says.
fn pull_first(c: &DaemonClient, reference: &str, policy: Pull) -> Result<()> {
    let pull = match policy {
        Pull::Never => false,
        Pull::Always => true,
        Pull::Missing => match c.image(reference) {
            Ok(_) => false,
            Err(e) if e.status() == Some(404) => true,
            Err(e) => return Err(e.into()),
        },
    };
    if pull {
        eprintln!("shoal: pulling {reference}...");
        let t = std::time::Instant::now();
        let img = c
            .pull_image(&api::PullImage {
                reference: reference.to_string(),
                insecure: None,
            })
            .with_context(|| format!("pulling {reference}"))?;
        eprintln!(
            "shoal: {} is {} ({} layers, {:.1} s)",
            reference,
            img.id,
            img.layers.len(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn create_sandbox(g: &Global, c: &DaemonClient, req: &api::CreateSandbox) -> Result<api::Sandbox> {
    // The first use of an image at a shape makes its template first (an
    // OCI image's, the daemon makes within the create).
    if let Some(img) = req
        .image
        .as_deref()
        .filter(|i| shoald::containers::is_builtin(i))
    {
        image_template(
            g,
            c,
            img,
            req.vcpus.unwrap_or(1),
            req.memory_mib.unwrap_or(128),
            &req.root(),
        )?;
    }
    Ok(c.create(req)?)
}

/// `shoal run`: a fresh sandbox through the daemon, the command, removal.
pub fn run(g: &Global, a: &SandboxArgs, e: &ExecArgs, stdin: bool, pull: Pull) -> Result<i32> {
    let oci = !shoald::containers::is_builtin(&a.image);
    if e.command.is_empty() && !oci {
        bail!("give the command after `--` (only an OCI image has a default command)");
    }
    let c = connect(g.daemon.as_deref())?;
    if oci {
        pull_first(&c, &a.image, pull)?;
    }
    if oci && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprintln!(
            "shoal: a sandbox of {} (its first one boots and snapshots the image's template: \
             ~20-60 s on PVM hosts)...",
            a.image
        );
    }
    let req = api::CreateSandbox {
        vcpus: Some(u32::from(a.cpus)),
        memory_mib: Some(a.memory),
        metadata: BTreeMap::from([("by".to_string(), "shoal run".to_string())]),
        ..api::CreateSandbox::from_image(&a.image)
    }
    .with_root(a.root.request()?);
    let sb = create_sandbox(g, &c, &req)?;
    let res = read_stdin(stdin).and_then(|s| stream_exec(&c, &sb.id, &exec_body(e, s)?));
    let _ = c.kill(&sb.id);
    res
}

/// Options of `shoal create`.
#[derive(clap::Args, Clone)]
pub struct CreateArgs {
    /// A template name (`shoal template ls`).
    #[arg(long, conflicts_with = "image")]
    pub template: Option<String>,
    /// Or an image: tiny or base.
    #[arg(long)]
    pub image: Option<String>,
    /// vCPUs (with --image).
    #[arg(long)]
    pub cpus: Option<u32>,
    /// Memory in MiB (with --image).
    #[arg(long)]
    pub memory: Option<u32>,
    /// Layers and upper layer (with --image; a template fixes its own).
    #[command(flatten)]
    pub root: crate::RootArgs,
    /// Kill after this many seconds.
    #[arg(long, default_value_t = 0)]
    pub ttl: u64,
    /// Pause after this many idle seconds.
    #[arg(long, default_value_t = 0)]
    pub idle_timeout: u64,
    /// Label KEY=VALUE (repeatable).
    #[arg(long = "meta", short = 'm')]
    pub meta: Vec<String>,
    /// Environment NAME=VALUE for every exec (repeatable).
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// Never freeze it while idle (background work keeps running).
    #[arg(long)]
    pub keep_running: bool,
    /// At its TTL, pause it (to disk) instead of killing it.
    #[arg(long, requires = "ttl")]
    pub pause_at_ttl: bool,
    /// A network device behind this egress policy:
    /// `allow=pypi.org,10.1.2.0/24:443[,deny=ENTRY..][,dns=off]` (entries
    /// `CIDR[:port[-port]]`, `domain`, `*.domain`; "" lets nothing out).
    /// Without it the sandbox has no network device.
    #[arg(long, value_name = "POLICY")]
    pub net: Option<String>,
    /// When to pull an OCI `--image` first, as `docker run --pull`.
    #[arg(long, value_enum, default_value_t = Pull::Missing)]
    pub pull: Pull,
    /// CPU class: latency, or best_effort (runs on what latency sandboxes
    /// leave: its VMM's threads SCHED_IDLE, a low CPU weight).
    #[arg(long, value_enum, default_value_t = PriorityArg::Latency)]
    pub priority: PriorityArg,
}

/// `shoal create`.
pub fn create(g: &Global, a: &CreateArgs) -> Result<i32> {
    let mut req = api::CreateSandbox {
        ttl_s: a.ttl,
        idle_timeout_s: a.idle_timeout,
        metadata: pairs(&a.meta, "--meta")?,
        env: pairs(&a.env, "--env")?,
        keep_running: a.keep_running,
        pause_at_ttl: a.pause_at_ttl,
        network: a
            .net
            .as_deref()
            .map(crate::net_arg::parse_net)
            .transpose()?,
        priority: a.priority.into(),
        ..Default::default()
    };
    let root = a.root.request()?;
    match (&a.template, &a.image) {
        (Some(t), _) => {
            if !root.is_default() {
                bail!("--layer, --upper-size and --upper-disk go with --image; a template has its own");
            }
            req.template = Some(t.clone());
        }
        (None, img) => {
            req.image = Some(img.clone().unwrap_or_else(|| "base".into()));
            req.vcpus = Some(a.cpus.unwrap_or(1));
            req.memory_mib = Some(a.memory.unwrap_or(128));
            req = req.with_root(root);
        }
    }
    let c = connect(g.daemon.as_deref())?;
    if let Some(img) = req
        .image
        .as_deref()
        .filter(|i| !shoald::containers::is_builtin(i))
    {
        pull_first(&c, img, a.pull)?;
    }
    let sb = create_sandbox(g, &c, &req)?;
    // What the host could not give it, on stderr (stdout is the id).
    if !g.json {
        for w in &sb.warnings {
            eprintln!("shoal: warning: {w}");
        }
    }
    print(g, &sb, |s| s.id.clone())
}

/// `shoal ls`.
pub fn ls(g: &Global, state: Option<&str>, template: Option<&str>, meta: &[String]) -> Result<i32> {
    let state = state
        .map(|s| {
            SandboxState::parse(s).with_context(|| {
                format!("state={s}: expected starting, running, pausing, paused, failed or pooled")
            })
        })
        .transpose()?;
    let f = api::ListFilter {
        state,
        template: template.map(String::from),
        metadata: pairs(meta, "--meta")?,
    };
    let c = connect(g.daemon.as_deref())?;
    let v = c.list(&f)?;
    if g.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    let now = shoald::db::now();
    let rows: Vec<Vec<String>> = v
        .iter()
        .map(|s| {
            let meta: Vec<String> = s.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
            vec![
                s.id.clone(),
                s.state.to_string(),
                kind_text(&s.kind),
                s.template.clone(),
                format!("{}/{}M", s.vcpus, s.memory_mib),
                age(now - s.created_at),
                s.pid.map_or_else(|| "-".into(), |p| p.to_string()),
                s.guest_addr.map_or_else(|| "-".into(), |a| a.to_string()),
                s.priority.to_string(),
                meta.join(","),
            ]
        })
        .collect();
    table(
        &[
            "ID", "STATE", "KIND", "TEMPLATE", "CPU/MEM", "AGE", "PID", "NET", "PRIORITY",
            "METADATA",
        ],
        &rows,
    );
    Ok(0)
}

/// A sandbox's kind as `shoal ls` shows it (an older daemon sends none:
/// its sandboxes are microVMs).
fn kind_text(kind: &str) -> String {
    if kind.is_empty() { "microvm" } else { kind }.to_string()
}

/// `shoal exec`.
pub fn exec(g: &Global, id: &str, e: &ExecArgs, stdin: bool, background: bool) -> Result<i32> {
    if e.command.is_empty() {
        bail!("give the command after `--`");
    }
    let c = connect(g.daemon.as_deref())?;
    let body = exec_body(e, read_stdin(stdin)?)?;
    if background {
        let cmd = c.start_command(id, &body)?;
        if g.json {
            println!("{}", serde_json::to_string(&cmd)?);
        } else {
            println!("{}", cmd.id);
        }
        return Ok(0);
    }
    stream_exec(&c, id, &body)
}

/// `shoal attach ID CMD_ID`: a background command's output (what it
/// wrote so far, then live); exits with its exit code.
pub fn attach(g: &Global, id: &str, cmd: &str) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    print_events(c.command_stream(id, cmd)?)
}

/// `shoal cp LOCAL ID:PATH` or `shoal cp ID:PATH LOCAL`.
pub fn cp(g: &Global, src: &str, dst: &str) -> Result<i32> {
    let remote = |s: &str| {
        s.split_once(':')
            .filter(|(id, p)| {
                !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()) && p.starts_with('/')
            })
            .map(|(id, p)| (id.to_string(), p.to_string()))
    };
    let c = connect(g.daemon.as_deref())?;
    match (remote(src), remote(dst)) {
        (None, Some((id, path))) => {
            let mut f = std::fs::File::open(src).with_context(|| format!("cannot open {src}"))?;
            let mode = f
                .metadata()
                .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
                .unwrap_or(0o644);
            let q = api::UploadQuery {
                mode: Some(mode),
                ..api::UploadQuery::new(&path)
            };
            let len = f.metadata().ok().map(|m| m.len());
            let live = Progress::start_quiet(&format!("copying {src} to {id}:{path}"));
            let v = c.put_file(&id, &q, &mut live.counted(&mut f, len))?;
            drop(live);
            eprintln!("copied {} bytes to {id}:{path}", v.bytes);
        }
        (Some((id, path)), None) => {
            let r = c.get_file(&id, &path)?;
            let tmp = format!("{dst}.shoal-partial");
            let mut f =
                std::fs::File::create(&tmp).with_context(|| format!("cannot create {tmp}"))?;
            let live = Progress::start_quiet(&format!("copying {id}:{path} to {dst}"));
            let size = r.size;
            let copied = std::io::copy(&mut live.counted(r, size), &mut f);
            drop(live);
            match copied {
                Ok(n) => {
                    std::fs::rename(&tmp, dst)?;
                    eprintln!("copied {n} bytes from {id}:{path}");
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    bail!("download failed: {e}");
                }
            }
        }
        _ => bail!("exactly one of SRC and DST must be ID:/PATH (a sandbox path)"),
    }
    Ok(0)
}

fn print<T: serde::Serialize>(g: &Global, v: &T, short: impl FnOnce(&T) -> String) -> Result<i32> {
    if g.json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        println!("{}", short(v));
    }
    Ok(0)
}

/// `shoal pause|resume ID`.
pub fn lifecycle(g: &Global, id: &str, op: &str) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let v = match op {
        "pause" => c.pause(id)?,
        "resume" => c.resume(id)?,
        o => bail!("no such operation {o:?}"),
    };
    print(g, &v, |v| format!("{id} {}", v.state))
}

/// `shoal net ID POLICY`.
pub fn set_network(g: &Global, id: &str, policy: &str) -> Result<i32> {
    let spec = crate::net_arg::parse_net(policy)?;
    let c = connect(g.daemon.as_deref())?;
    let v = c.set_network(id, &spec)?;
    print(g, &v, |v| {
        let n = v.network.as_ref();
        format!(
            "{id} allow_out={:?} deny_out={:?} dns={}",
            n.map(|n| &n.allow_out),
            n.map(|n| &n.deny_out),
            n.is_some_and(|n| n.allow_dns)
        )
    })
}

/// `shoal rm ID...`.
pub fn rm(g: &Global, ids: &[String]) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let mut code = 0;
    for id in ids {
        match c.kill(id) {
            Ok(()) => println!("{id}"),
            Err(e) => {
                eprintln!("shoal: {id}: {e}");
                code = 1;
            }
        }
    }
    Ok(code)
}

/// `shoal snapshot ID [--template NAME]`.
pub fn snapshot(g: &Global, id: &str, template: Option<&str>) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let _p = Progress::start(&format!("shoal: snapshotting {id}"));
    let req = api::SnapshotRequest {
        template: template.map(String::from),
    };
    let v = c.snapshot(id, &req)?;
    drop(_p);
    print(g, &v, |v| v.name.clone())
}

/// `shoal fork ID -n N`.
#[derive(clap::Args, Clone)]
pub struct ForkArgs {
    /// Sandbox id (running or paused; it keeps running).
    pub id: String,
    /// Clones to make (1 to 100).
    #[arg(short = 'n', long = "count", default_value_t = 1)]
    pub count: u32,
    /// Labels of the clones in place of the source's (repeatable NAME=VALUE).
    #[arg(long = "meta", short = 'm')]
    pub meta: Vec<String>,
}

/// `shoal fork ID -n N`: the new ids, one a line (the whole reply with
/// `--json`); clones not made are reported on stderr (exit 1 when some
/// were not).
pub fn fork(g: &Global, a: &ForkArgs) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let _p = Progress::start(&format!("shoal: forking {} into {}", a.id, a.count));
    let req = api::ForkRequest {
        count: a.count,
        metadata: (!a.meta.is_empty())
            .then(|| pairs(&a.meta, "--meta"))
            .transpose()?,
    };
    let v = c.fork(&a.id, &req)?;
    drop(_p);
    for e in &v.failed {
        eprintln!("shoal: a clone was not made: {} ({})", e.message, e.code);
    }
    print(g, &v, |v| {
        let ids: Vec<&str> = v.sandboxes.iter().map(|s| s.id.as_str()).collect();
        ids.join("\n")
    })?;
    Ok(i32::from(!v.failed.is_empty()))
}

/// A template's upper layer in a few words.
fn upper_text(t: &api::Template) -> String {
    if t.kind == "vm" {
        return "-".into(); // a vm guest has its disk, no upper layer
    }
    match (t.upper_disk_mib, t.upper_size_mib) {
        (Some(d), _) => format!("disk {d}M"),
        (None, Some(s)) => format!("tmpfs {s}M"),
        (None, None) => "tmpfs".into(),
    }
}

/// `shoal template create|ls|rm`.
pub fn template(g: &Global, op: &crate::TemplateCmd) -> Result<i32> {
    use crate::TemplateCmd as T;
    let c = connect(g.daemon.as_deref())?;
    match op {
        T::Create {
            name,
            image,
            cpus,
            memory,
            kind,
            no_agent,
            net,
            root,
            disk,
        } => {
            let vm = kind.as_deref() == Some("vm");
            let image = image.as_deref().unwrap_or(if vm { "tiny" } else { "base" });
            let mut req = api::CreateTemplate {
                kind: kind.clone(),
                agent: no_agent.then_some(false),
                vcpus: Some(*cpus),
                memory_mib: *memory,
                network: *net,
                ..api::CreateTemplate::new(name, image)
            }
            .with_root(root.request()?);
            disk.apply(&mut req)?;
            let v = ensure_template(g, &c, &req, true)?;
            print(g, &v, |v| v.name.clone())
        }
        T::Ls => {
            let v = c.templates()?;
            if g.json {
                return print(g, &v, |_| String::new());
            }
            let rows: Vec<Vec<String>> = v
                .iter()
                .map(|t| {
                    vec![
                        t.name.clone(),
                        t.kind.clone(),
                        t.state.to_string(),
                        t.source.clone(),
                        format!("{}/{}M", t.vcpus, t.memory_mib),
                        upper_text(t),
                        t.layers.len().to_string(),
                    ]
                })
                .collect();
            table(
                &[
                    "NAME", "KIND", "STATE", "SOURCE", "CPU/MEM", "UPPER", "LAYERS",
                ],
                &rows,
            );
            Ok(0)
        }
        T::Rm { name } => {
            c.delete_template(name)?;
            println!("{name}");
            Ok(0)
        }
    }
}

/// `shoal pool set|ls|rm`.
pub fn pool(g: &Global, op: &crate::PoolCmd) -> Result<i32> {
    use crate::PoolCmd as P;
    let c = connect(g.daemon.as_deref())?;
    match op {
        P::Set { template, target } => {
            let v = c.set_pool(template, *target)?;
            print(g, &v, |v| {
                format!("{template}: target {} ready {}", v.target, v.ready)
            })
        }
        P::Ls => {
            let v = c.pools()?;
            if g.json {
                return print(g, &v, |_| String::new());
            }
            let rows: Vec<Vec<String>> = v
                .iter()
                .map(|p| {
                    vec![
                        p.template.clone(),
                        p.target.to_string(),
                        p.ready.to_string(),
                    ]
                })
                .collect();
            table(&["TEMPLATE", "TARGET", "READY"], &rows);
            Ok(0)
        }
        P::Rm { template } => {
            c.delete_pool(template)?;
            println!("{template}");
            Ok(0)
        }
    }
}

/// `shoal stats`.
pub fn stats(g: &Global) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let v = c.stats()?;
    if g.json {
        return print(g, &v, |_| String::new());
    }
    let u = &v.usage;
    println!("sandboxes   {}", serde_json::to_string(&u.by_state)?);
    println!(
        "reserved    {} vCPUs of {}, {} MiB guest memory of {}",
        u.vcpus, v.vcpu_budget, u.memory_mib, v.memory_budget_mib
    );
    println!(
        "disk        {} MiB reserved of {} ({} MiB budget x {} overcommit; 0: no budget), \
         {} MiB kept free",
        u.disk_mib,
        v.limits.disk_quota_mib(),
        v.limits.disk_budget_mib,
        v.limits.disk_overcommit,
        v.limits.min_free_disk_mib
    );
    println!(
        "host        {} CPUs, {} MiB available of {} MiB, load {}",
        v.host.cpus,
        v.host.memory_available_mib,
        v.host.memory_total_mib,
        serde_json::to_string(&v.host.load1)?
    );
    for p in &v.pools {
        println!("pool        {} ready {}/{}", p.template, p.ready, p.target);
    }
    Ok(0)
}
