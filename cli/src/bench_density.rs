//! `shoal bench density` (issue 21): a seeded sandbox-lifetime mix (most
//! idle after one small exec; some allocate, touch and free memory in the
//! guest; a few stay busy) replayed over N sandboxes of one template, with
//! the host memory of their VMMs sampled over time, under four reclaim
//! configurations of a private shoald each: none, balloon free page
//! reporting only, idle eviction only, both. Then the CPU classes'
//! latency at 50% and 100% of the cores loaded by best-effort burners
//! ([`crate::bench_classes::measure`]). JSON report + PNG figures
//! ([`crate::density_report`]).

use crate::bench::{Output, PrivateDaemon};
use crate::density_mem::{self, Sampler};
use crate::density_plan::{self as dp, MixSpec, Plan, Role};
use crate::density_report::{self as rep, ConfigResult, DensityReport, IdleMem, Latency};
use anyhow::{bail, Result};
use shoal_bench::stats::summarize;
use shoal_client::api::{CreateSandbox, ExecRequest};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `shoal bench density` options.
#[derive(clap::Args, Clone)]
pub struct DensityArgs {
    /// Image of the sandboxes (its template is booted once per configuration).
    #[arg(long, default_value = "tiny")]
    pub image: String,
    /// Guest memory of the template and its sandboxes (MiB).
    #[arg(long, default_value_t = 256)]
    pub memory_mib: u32,
    /// Sandboxes per configuration (default: 200 on hardware KVM, 40 on
    /// PVM hosts, where every guest page fault costs milliseconds).
    #[arg(long)]
    pub sandboxes: Option<usize>,
    /// Seconds of the replay after the creates (default: 300 on hardware
    /// KVM, 150 on PVM hosts).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Share of the sandboxes that allocate and free memory.
    #[arg(long, default_value_t = 0.15)]
    pub alloc_share: f64,
    /// Share of the sandboxes that stay busy.
    #[arg(long, default_value_t = 0.05)]
    pub busy_share: f64,
    /// MiB touched and freed per allocation (default: 256 on hardware KVM,
    /// 16 on PVM hosts: ~1 s of guest kernel time per MiB there).
    #[arg(long)]
    pub alloc_mib: Option<u32>,
    /// Allocations per allocating sandbox.
    #[arg(long, default_value_t = 2)]
    pub allocs: u32,
    /// Seconds between a busy sandbox's execs (±25%).
    #[arg(long, default_value_t = 10.0)]
    pub busy_period_s: f64,
    /// `--evict-idle-s` of the configurations that evict.
    #[arg(long, default_value_t = 20)]
    pub evict_idle_s: u64,
    /// Seed of the schedule.
    #[arg(long, default_value_t = 21)]
    pub seed: u64,
    /// Concurrent clients creating and replaying.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Milliseconds between memory samples.
    #[arg(long, default_value_t = 1000)]
    pub sample_ms: u64,
    /// Configurations to run (comma-separated, in order): off, fpr, evict, both.
    #[arg(long, default_value = "off,fpr,evict,both")]
    pub configs: String,
    /// Execs timed per latency case (0: skip the latency part).
    #[arg(long, default_value_t = 15)]
    pub execs: usize,
    /// Extra shoald arguments for every private daemon.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub daemon_args: String,
    /// Only print the table and draw the figures of this earlier report
    /// (no daemon, nothing run).
    #[arg(long, value_name = "FILE.json")]
    pub from_json: Option<std::path::PathBuf>,
    /// Where to write the JSON report (figures beside it, or in --plot).
    #[arg(long = "out", default_value = "bench-density.json")]
    pub out: std::path::PathBuf,
}

/// A reclaim configuration: its name, its label, its daemon arguments.
fn config(name: &str, evict_s: u64) -> Result<(&'static str, String)> {
    // Evictions are rate-limited per minute (30 by default): high enough
    // here that every idle sandbox can go within the replay.
    let ev = format!("--evict-idle-s {evict_s} --evict-per-minute 6000");
    Ok(match name {
        "off" => ("reclaim off", "--no-balloon --evict-idle-s 0".into()),
        "fpr" => ("balloon FPR only", "--evict-idle-s 0".into()),
        "evict" => ("eviction only", format!("--no-balloon {ev}")),
        "both" => ("FPR + eviction", ev),
        _ => bail!("unknown configuration {name:?} (off, fpr, evict, both)"),
    })
}

/// The create request of every sandbox.
fn create_req(a: &DensityArgs) -> CreateSandbox {
    CreateSandbox {
        vcpus: Some(1),
        memory_mib: Some(a.memory_mib),
        ..CreateSandbox::from_image(&a.image)
    }
}

/// The guest command of an allocation: `dd` reads MiB of zeros into one
/// buffer of that size (every page touched) and exits (the guest frees it).
fn alloc_cmd(mib: u32) -> ExecRequest {
    ExecRequest::shell(format!(
        "dd if=/dev/zero of=/dev/null bs={mib}M count=1 2>/dev/null && echo ok"
    ))
    .with_timeout(900.0)
}

fn small_exec() -> ExecRequest {
    ExecRequest::argv(["true"]).with_timeout(300.0)
}

/// What the workers count.
#[derive(Default)]
struct Tally {
    failures: Vec<String>,
    alloc_ms: Vec<f64>,
    busy_ms: Vec<f64>,
    lag_s: Vec<f64>,
}

impl Tally {
    fn fail(&mut self, what: String) {
        if self.failures.len() < 20 {
            eprintln!("  {what}");
        }
        self.failures.push(what);
    }
}

/// Runs `f(i)` for i in 0..n on `clients` threads.
fn on_threads(clients: usize, n: usize, f: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..clients.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                f(i);
            });
        }
    });
}

/// One configuration: its daemon, template, creates, replay, readings.
fn run_config(
    g: &crate::daemon_cmds::Global,
    a: &DensityArgs,
    name: &str,
    plan: &Plan,
    duration_s: f64,
) -> Result<ConfigResult> {
    let (label, args) = config(name, a.evict_idle_s)?;
    let args = format!("--no-pools --idle-timeout-s 900 {args} {}", a.daemon_args);
    eprintln!("== {label}: shoald {args}");
    let (c, daemon) = PrivateDaemon::start(&format!("density-{name}"), &args)?;
    crate::daemon_cmds::image_template(g, &c, &a.image, 1, a.memory_mib, &Default::default())?;
    let base = density_mem::read(&daemon.dir, 0.0);
    let t0 = Instant::now();
    let sampler = Sampler::start(
        daemon.dir.clone(),
        Duration::from_millis(a.sample_ms.max(100)),
        t0,
    );
    let n = plan.roles.len();
    let ids: Vec<Mutex<Option<String>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let tally = Mutex::new(Tally::default());
    let fail = |w: String| tally.lock().unwrap_or_else(|e| e.into_inner()).fail(w);
    // The creates, each followed by its one small exec.
    on_threads(a.clients, n, |i| match c.create(&create_req(a)) {
        Ok(sb) => {
            if let Err(e) = c.exec(&sb.id, &small_exec()) {
                fail(format!("first exec in {}: {e}", sb.id));
            }
            *ids[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(sb.id);
        }
        Err(e) => fail(format!("create {i}: {e}")),
    });
    let created_s = t0.elapsed().as_secs_f64();
    let created = ids
        .iter()
        .filter(|m| m.lock().is_ok_and(|v| v.is_some()))
        .count();
    eprintln!("  {created}/{n} created and run once in {created_s:.1} s; replay {duration_s} s");
    // The replay: every event at its time (late when the workers lag).
    let r0 = Instant::now();
    on_threads(a.clients, plan.events.len(), |k| {
        let ev = plan.events[k];
        let at = r0 + Duration::from_secs_f64(ev.at_s);
        if let Some(d) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let lag = Instant::now().duration_since(at).as_secs_f64();
        let id = ids[ev.sandbox].lock().map(|v| v.clone()).ok().flatten();
        let Some(id) = id else { return };
        let req = ev.alloc_mib.map_or_else(small_exec, alloc_cmd);
        let t = Instant::now();
        let r = c.exec(&id, &req);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let mut tl = tally.lock().unwrap_or_else(|e| e.into_inner());
        tl.lag_s.push(lag);
        match r {
            Ok(r) if r.exit_code == Some(0) => match ev.alloc_mib {
                Some(_) => tl.alloc_ms.push(ms),
                None => tl.busy_ms.push(ms),
            },
            Ok(r) => tl.fail(format!("exec in {id}: {r:?}")),
            Err(e) => tl.fail(format!("exec in {id}: {e}")),
        }
    });
    if let Some(d) = Duration::from_secs_f64(duration_s).checked_sub(r0.elapsed()) {
        std::thread::sleep(d);
    }
    // The window every configuration is compared over: the replay's
    // planned length from the end of the creates (late requests can run
    // past it: `replay_end_s`, `lag_s_max`).
    let replay = (created_s, created_s + duration_s);
    let replay_end_s = t0.elapsed().as_secs_f64();
    // The idle sandboxes' private guest RAM now.
    let idle = idle_memory(&daemon, plan, &ids, u64::from(a.memory_mib));
    let counters = reclaim_counters(&c.metrics().unwrap_or_default());
    let samples = sampler.finish();
    drop(daemon);
    let tally = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    let pts = |f: fn(&density_mem::Sample) -> f64| -> Vec<(f64, f64)> {
        samples.iter().map(|s| (s.t_s, f(s))).collect()
    };
    let pss = pts(|s| s.pss_mib);
    let host = pts(|s| s.host_used_mib);
    let p50 = |v: &[f64]| summarize(v).map(|s| s.median);
    Ok(ConfigResult {
        name: name.into(),
        label: label.into(),
        daemon_args: args,
        sandboxes: n,
        created,
        create_s: created_s,
        replay_s: replay,
        replay_end_s,
        failures: tally.failures.len(),
        first_failures: tally.failures.into_iter().take(5).collect(),
        alloc_execs: tally.alloc_ms.len(),
        alloc_exec_ms_p50: p50(&tally.alloc_ms),
        busy_execs: tally.busy_ms.len(),
        busy_exec_ms_p50: p50(&tally.busy_ms),
        lag_s_max: tally.lag_s.iter().copied().fold(0.0, f64::max),
        peak_pss_mib: dp::peak(&pss),
        integral_pss_mib_s: dp::integral(&pss, replay.0, replay.1),
        mean_pss_mib: dp::integral(&pss, replay.0, replay.1) / (replay.1 - replay.0).max(1e-9),
        host_used_base_mib: base.host_used_mib,
        peak_host_used_mib: dp::peak(&host) - base.host_used_mib,
        integral_host_used_mib_s: dp::integral(&host, replay.0, replay.1)
            - base.host_used_mib * (replay.1 - replay.0),
        idle,
        counters,
        samples,
    })
}

/// The daemon's balloon and eviction counters in its `/metrics` text.
fn reclaim_counters(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| l.starts_with("shoal_balloon_") || l.starts_with("shoal_evict_"))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Private guest RAM and anonymous memory of the idle sandboxes' VMMs.
fn idle_memory(
    d: &PrivateDaemon,
    plan: &Plan,
    ids: &[Mutex<Option<String>>],
    memory_mib: u64,
) -> IdleMem {
    let (mut private, mut anon) = (vec![], vec![]);
    for (i, r) in plan.roles.iter().enumerate() {
        let id = ids[i].lock().map(|v| v.clone()).ok().flatten();
        let (Role::Idle, Some(id)) = (r, id) else {
            continue;
        };
        for p in shoal_runtime::vm::vmms_under(&d.dir.join("sandboxes").join(&id)) {
            if let Some(k) = density_mem::guest_private_kib(p.pid, memory_mib) {
                private.push(k as f64);
                anon.push(density_mem::rollup_kib(p.pid).1 as f64);
            }
        }
    }
    IdleMem::of(&private, &anon)
}

/// The latency part: the classes' cases at 50% and 100% of the cores.
fn latency(g: &crate::daemon_cmds::Global, a: &DensityArgs) -> Result<Latency> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let levels = vec![(cores / 2).max(1), cores];
    eprintln!("== latency: burners {levels:?} on {cores} cores");
    let (c, daemon) = PrivateDaemon::start("density-classes", &a.daemon_args)?;
    crate::daemon_cmds::image_template(g, &c, &a.image, 1, 128, &Default::default())?;
    let cases = crate::bench_classes::measure(&c, &a.image, a.execs, &levels);
    drop(daemon);
    Ok(Latency::of(cores, cases?))
}

/// Runs it.
pub fn run(g: &crate::daemon_cmds::Global, a: &DensityArgs, out: &Output) -> Result<()> {
    if let Some(f) = &a.from_json {
        let text = std::fs::read_to_string(f)?;
        let report: DensityReport = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: not a density report: {e}", f.display()))?;
        return out.emit(&report.render(), &report, rep::figures);
    }
    if g.daemon.is_some() {
        bail!("bench density runs private daemons (it reads their VMMs' memory): drop --daemon");
    }
    let hw = vmm::host::kvm_kind() == vmm::host::KvmKind::Hardware;
    let spec = MixSpec {
        sandboxes: a.sandboxes.unwrap_or(if hw { 200 } else { 40 }),
        seed: a.seed,
        duration_s: a.duration_s.unwrap_or(if hw { 300.0 } else { 150.0 }),
        alloc_share: a.alloc_share,
        busy_share: a.busy_share,
        alloc_mib: a.alloc_mib.unwrap_or(if hw { 256 } else { 16 }),
        allocs: a.allocs,
        busy_period_s: a.busy_period_s,
    };
    if spec.alloc_mib >= a.memory_mib {
        bail!("--alloc-mib must be under the guest's --memory-mib");
    }
    let plan = dp::plan(&spec);
    eprintln!(
        "{} sandboxes: {} idle, {} allocating {} MiB x{}, {} busy; {} requests over {} s",
        spec.sandboxes,
        plan.count(Role::Idle),
        plan.count(Role::Alloc),
        spec.alloc_mib,
        spec.allocs,
        plan.count(Role::Busy),
        plan.events.len(),
        spec.duration_s
    );
    let mut configs = vec![];
    for name in a
        .configs
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        config(name, 0)?;
        let r = run_config(g, a, name, &plan, spec.duration_s)?;
        eprintln!(
            "  peak {:.0} MiB, {:.0} MiB·s over the replay, idle private guest RAM p50 {:?} KiB",
            r.peak_pss_mib, r.integral_pss_mib_s, r.idle.private_kib_p50
        );
        configs.push(r);
    }
    let latency = match a.execs {
        0 => None,
        _ => Some(latency(g, a)?),
    };
    let report = DensityReport::new(
        shoal_bench::plot::host_kind(),
        spec,
        &plan,
        a.memory_mib,
        a.evict_idle_s,
        configs,
        latency,
    );
    out.emit(&report.render(), &report, rep::figures)
}
