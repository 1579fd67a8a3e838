//! `shoal bench vm`: the `vm` kind (QEMU q35) next to a microVM of the
//! same size, in one run on one private shoald: a cold boot (a template:
//! boot to the agent, then the snapshot) vs a create restored from that
//! snapshot; freeze/thaw (vCPUs stopped and continued: QMP `stop`/`cont`
//! vs the VMM's `pause`/`resume`, one control session per call as each
//! backend does); pause to disk and resume through the daemon's API; and
//! the host memory of a few idle sandboxes (PSS and RSS of the QEMU
//! process vs the VMM's). Ratios are vm / microvm of the medians.

use crate::bench::{Output, PrivateDaemon};
use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;
use shoal_bench::plot::{self, Bar, Out, PlotError, Series};
use shoal_bench::stats::summarize;
use shoal_client::api::{CreateSandbox, CreateTemplate, ExecRequest, TemplateState};
use shoal_client::DaemonClient;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `shoal bench vm` options.
#[derive(clap::Args, Clone, Debug)]
pub struct VmArgs {
    /// Cold boots per kind (each a template: ~20-45 s for a vm on PVM hosts).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub cold_boots: u32,
    /// Creates (restores from the template's snapshot) timed per kind.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub creates: u32,
    /// Idle sandboxes per kind whose host memory is read (of the creates).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub idle: u32,
    /// Freeze/thaw cycles per kind.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub freezes: u32,
    /// Pause-to-disk/resume cycles per kind.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub pauses: u32,
    /// vCPUs of both templates.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub vcpus: u32,
    /// Guest memory of both templates (MiB).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(64..=8192))]
    pub memory: u32,
    /// Seconds idle sandboxes settle before their memory is read.
    #[arg(long, default_value_t = 3)]
    pub settle_s: u64,
    /// Extra arguments of the private shoald (no freezer, pools or VMM
    /// stock by default, so that both kinds take the same path).
    #[arg(long, default_value = "--no-pools --vmm-stock 0 --freeze-idle-ms 0")]
    pub daemon_args: String,
    /// Where to write the JSON report (its figures beside it, or in --plot).
    #[arg(long = "out", default_value = "bench-vm.json")]
    pub out: PathBuf,
}

/// One measured quantity, for both kinds.
#[derive(Debug, Clone, Serialize)]
pub struct Metric {
    /// What was measured.
    pub name: String,
    /// Unit of the samples.
    pub unit: String,
    /// The vm kind's samples.
    pub vm: Vec<f64>,
    /// The microVM's samples.
    pub microvm: Vec<f64>,
    /// Medians.
    pub vm_p50: Option<f64>,
    /// Medians.
    pub microvm_p50: Option<f64>,
    /// vm / microvm of the medians.
    pub ratio: Option<f64>,
}

impl Metric {
    fn new(name: &str, unit: &str, vm: Vec<f64>, microvm: Vec<f64>) -> Metric {
        let (a, b) = (p50(&vm), p50(&microvm));
        Metric {
            name: name.into(),
            unit: unit.into(),
            vm,
            microvm,
            vm_p50: a,
            microvm_p50: b,
            ratio: ratio(a, b),
        }
    }
}

fn p50(v: &[f64]) -> Option<f64> {
    summarize(v).map(|s| s.median)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct VmReport {
    /// Host KVM kind ("pvm", "vmx", "svm").
    pub host: String,
    /// vCPUs of both templates.
    pub vcpus: u32,
    /// Guest memory of both templates (MiB).
    pub memory_mib: u32,
    /// The private daemon's extra arguments.
    pub daemon_args: String,
    /// Every metric, vm next to microvm.
    pub metrics: Vec<Metric>,
}

impl VmReport {
    fn metric(&self, name: &str) -> Option<&Metric> {
        self.metrics.iter().find(|m| m.name == name)
    }

    /// The table printed.
    pub fn render(&self) -> String {
        let mut s = format!(
            "vm (QEMU q35) vs microVM, {} vCPU, {} MiB, host {}\n{:<40} {:>5} {:>10} {:>10} {:>8} {:>6}\n",
            self.vcpus, self.memory_mib, self.host, "metric", "unit", "vm p50", "microvm", "ratio", "n"
        );
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        for m in &self.metrics {
            s.push_str(&format!(
                "{:<40} {:>5} {:>10} {:>10} {:>8} {:>6}\n",
                m.name,
                m.unit,
                f(m.vm_p50),
                f(m.microvm_p50),
                f(m.ratio),
                format!("{}/{}", m.vm.len(), m.microvm.len())
            ));
        }
        s
    }

    /// Its figures: CDFs of the latencies, bars of the cold boots, of
    /// the memory and of the ratios.
    pub fn plot(&self, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
        let sub = format!(
            "{} vCPU, {} MiB each, one private shoald",
            self.vcpus, self.memory_mib
        );
        let mut files = vec![];
        let cdf = |file: &str, title: &str, names: &[(&str, &str)]| -> Result<_, PlotError> {
            let mut series = vec![];
            for (name, short) in names {
                if let Some(m) = self.metric(name) {
                    for (kind, v) in [("vm", &m.vm), ("microvm", &m.microvm)] {
                        if !v.is_empty() {
                            series.push(Series::new(format!("{kind} {short}"), v.clone()));
                        }
                    }
                }
            }
            if series.is_empty() {
                return Ok(None);
            }
            let p = out.path(file);
            let fig = out.figure(title).subtitle(sub.clone()).unit("ms");
            plot::latency_cdf(&p, &fig, &series)?;
            Ok(Some(p))
        };
        files.extend(cdf(
            "create",
            "Create from the template's snapshot",
            &[(CREATE, "create")],
        )?);
        files.extend(cdf(
            "freeze",
            "Freeze and thaw (vCPUs stopped, process kept)",
            &[(FREEZE, "freeze"), (THAW, "thaw")],
        )?);
        files.extend(cdf(
            "pause",
            "Pause to disk and resume",
            &[(PAUSE, "pause"), (RESUME, "resume")],
        )?);
        let bars = |file: &str, title: &str, y: &str, bars: Vec<Bar>| -> Result<_, PlotError> {
            if bars.is_empty() {
                return Ok(None);
            }
            let p = out.path(file);
            let fig = out.figure(title).subtitle(sub.clone()).axes("", y);
            plot::bars(&p, &fig, &bars)?;
            Ok(Some(p))
        };
        let both = |names: &[(&str, &str)]| {
            let mut v = vec![];
            for (name, short) in names {
                if let Some(m) = self.metric(name) {
                    v.extend(m.vm_p50.map(|x| Bar::new(format!("vm {short}"), x)));
                    v.extend(
                        m.microvm_p50
                            .map(|x| Bar::new(format!("microvm {short}"), x)),
                    );
                }
            }
            v
        };
        files.extend(bars(
            "cold",
            "Cold boot (boot to the agent + snapshot), median",
            "s",
            both(&[(COLD, "cold boot")]),
        )?);
        files.extend(bars(
            "memory",
            "Host memory per idle sandbox, median",
            "MiB",
            both(&[(PSS, "PSS"), (RSS, "RSS")]),
        )?);
        let ratios = self
            .metrics
            .iter()
            .filter_map(|m| m.ratio.map(|r| Bar::new(short_name(&m.name), r)))
            .collect();
        files.extend(bars("ratios", "vm / microVM (medians)", "ratio", ratios)?);
        Ok(files)
    }
}

const COLD: &str = "cold boot (template)";
const CREATE: &str = "create (restore)";
const FREEZE: &str = "freeze";
const THAW: &str = "thaw";
const PAUSE: &str = "pause to disk";
const RESUME: &str = "resume from disk";
const PSS: &str = "idle host memory, PSS";
const RSS: &str = "idle host memory, RSS";
/// Pss_Anon + Pss_Shmem: what the process holds that no file backs.
const PRIVATE: &str = "idle host memory, private PSS";

fn short_name(name: &str) -> String {
    match name {
        PSS => "PSS".into(),
        RSS => "RSS".into(),
        PRIVATE => "private".into(),
        other => other.split(" (").next().unwrap_or(other).into(),
    }
}

/// Which kind a step is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum K {
    Vm,
    MicroVm,
}

impl K {
    fn label(self) -> &'static str {
        match self {
            K::Vm => "vm",
            K::MicroVm => "microvm",
        }
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Makes template `name` of kind `k` and waits for it (seconds, boot and
/// snapshot).
fn cold_boot(c: &DaemonClient, a: &VmArgs, k: K, name: &str) -> Result<f64> {
    let mut req = CreateTemplate::new(name, "tiny");
    req.vcpus = Some(a.vcpus);
    req.memory_mib = Some(a.memory);
    if k == K::Vm {
        req.kind = Some("vm".into());
    }
    let t = Instant::now();
    c.create_template(&req)
        .with_context(|| format!("the {} template", k.label()))?;
    // A loaded PVM host has taken minutes for one vm boot.
    let end = t + Duration::from_secs(600);
    loop {
        let tp = c.template(name)?;
        match tp.state {
            TemplateState::Ready => return Ok(t.elapsed().as_secs_f64()),
            TemplateState::Failed => bail!("the {} template failed: {:?}", k.label(), tp.error),
            _ if Instant::now() > end => bail!("the {} template: no boot in 600 s", k.label()),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The sandbox `id`'s VM processes (QEMU, or the VMM) in `state`.
fn procs(state: &Path, k: K, id: &str) -> Vec<i32> {
    let dir = state.join("sandboxes").join(id);
    let ps = match k {
        K::Vm => shoal_runtime::vm::processes_under(&dir, "qemu-system-x86_64"),
        K::MicroVm => shoal_runtime::vm::vmms_under(&dir),
    };
    ps.into_iter().map(|p| p.pid).collect()
}

/// (Rss, Pss, Pss_Anon + Pss_Shmem) of `pid` in KiB.
fn smaps(pid: i32) -> Result<[u64; 3]> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .with_context(|| format!("reading the memory of process {pid}"))?;
    Ok(smaps_fields(&s))
}

fn smaps_fields(s: &str) -> [u64; 3] {
    let field = |k: &str| -> u64 {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    [
        field("Rss:"),
        field("Pss:"),
        field("Pss_Anon:") + field("Pss_Shmem:"),
    ]
}

/// Times freeze and thaw of sandbox `id`, directly on its control socket,
/// the way its backend does (one session per call).
fn freeze_thaw(state: &Path, k: K, id: &str, n: u32) -> Result<(Vec<f64>, Vec<f64>)> {
    let dir = state.join("sandboxes").join(id);
    let timeout = Duration::from_secs(10);
    let call = |cmd: &str| -> Result<()> {
        match k {
            K::Vm => {
                let sock = dir.join("qemu").join("qmp.sock");
                let mut q = shoal_runtime::qmp::Qmp::connect(&sock, timeout)?;
                q.execute(cmd, None, timeout)?;
            }
            K::MicroVm => {
                let c = vmm_api::Client::new(dir.join("api.sock"), timeout);
                match cmd {
                    "stop" => c.pause()?,
                    _ => c.resume()?,
                }
            }
        }
        Ok(())
    };
    let (mut f, mut t) = (vec![], vec![]);
    for _ in 0..n {
        let s = Instant::now();
        call("stop")?;
        f.push(ms(s));
        let s = Instant::now();
        call("cont")?;
        t.push(ms(s));
    }
    Ok((f, t))
}

/// Everything measured on one kind.
#[derive(Default)]
struct KindRun {
    cold: Vec<f64>,
    create: Vec<f64>,
    freeze: Vec<f64>,
    thaw: Vec<f64>,
    pause: Vec<f64>,
    resume: Vec<f64>,
    rss: Vec<f64>,
    pss: Vec<f64>,
    private: Vec<f64>,
}

/// Checks that sandbox `id` answers an exec.
fn answers(c: &DaemonClient, id: &str, what: &str) -> Result<()> {
    let r = c.exec(id, &ExecRequest::argv(["true"]).with_timeout(120.0))?;
    ensure!(r.exit_code == Some(0), "{what}: `true` failed: {r:?}");
    Ok(())
}

fn run_kind(
    c: &DaemonClient,
    state: &Path,
    a: &VmArgs,
    k: K,
    ids: &mut Vec<String>,
) -> Result<KindRun> {
    let mut r = KindRun::default();
    let name = format!("bench-{}", k.label());
    for i in 0..a.cold_boots {
        // The first one stays: the sandboxes restore from it.
        let n = if i == 0 {
            name.clone()
        } else {
            format!("{name}-{i}")
        };
        let s = cold_boot(c, a, k, &n)?;
        eprintln!("{} cold boot {}: {s:.1} s", k.label(), i + 1);
        r.cold.push(s);
        if i > 0 {
            c.delete_template(&n)?;
        }
    }
    for i in 0..a.creates {
        let t = Instant::now();
        let sb = c.create(&CreateSandbox::from_template(&name))?;
        r.create.push(ms(t));
        ids.push(sb.id.clone());
        if i == 0 {
            answers(c, &sb.id, "the first create")?;
        }
    }
    eprintln!(
        "{} creates: {:?} ms",
        k.label(),
        r.create.iter().map(|v| v.round()).collect::<Vec<_>>()
    );
    let probe = ids.last().cloned().context("no sandbox")?;
    // The last `idle` of this kind's sandboxes, left alone for a while.
    let idle: Vec<String> = ids
        .iter()
        .rev()
        .take(a.creates as usize)
        .take(a.idle as usize)
        .cloned()
        .collect();
    std::thread::sleep(Duration::from_secs(a.settle_s));
    for id in &idle {
        let pids = procs(state, k, id);
        ensure!(
            !pids.is_empty(),
            "no {} process for sandbox {id}",
            k.label()
        );
        let mut sum = [0u64; 3];
        for p in pids {
            for (s, v) in sum.iter_mut().zip(smaps(p)?) {
                *s += v;
            }
        }
        let mib = |kib: u64| kib as f64 / 1024.0;
        r.rss.push(mib(sum[0]));
        r.pss.push(mib(sum[1]));
        r.private.push(mib(sum[2]));
    }
    let (f, t) = freeze_thaw(state, k, &probe, a.freezes)?;
    (r.freeze, r.thaw) = (f, t);
    answers(c, &probe, "after freeze/thaw")?;
    for _ in 0..a.pauses {
        let t = Instant::now();
        c.pause(&probe)?;
        r.pause.push(ms(t));
        let t = Instant::now();
        c.resume(&probe)?;
        r.resume.push(ms(t));
    }
    if a.pauses > 0 {
        answers(c, &probe, "after pause/resume")?;
    }
    Ok(r)
}

/// Runs it on a private shoald.
pub fn run(g: &crate::daemon_cmds::Global, a: &VmArgs, out: &Output) -> Result<()> {
    if g.daemon.is_some() {
        bail!("bench vm runs a private shoald (it reads its VMs' memory): drop --daemon");
    }
    ensure!(
        a.idle <= a.creates,
        "--idle {} > --creates {}",
        a.idle,
        a.creates
    );
    let (c, private) = PrivateDaemon::start("vm", &a.daemon_args)?;
    let mut ids = vec![];
    let res = (|| {
        // The microVM first: it shows the daemon works before the longer vm boot.
        let m = run_kind(&c, &private.dir, a, K::MicroVm, &mut ids)?;
        let v = run_kind(&c, &private.dir, a, K::Vm, &mut ids)?;
        Ok::<_, anyhow::Error>((v, m))
    })();
    for id in &ids {
        let _ = c.kill(id);
    }
    let log = private.dir.join("shoald.log");
    let tail = shoal_runtime::vm::log_tail(&log, 15, "\n");
    drop(private);
    let (v, m) = res.map_err(|e| e.context(format!("shoald's last lines:\n{tail}")))?;
    let report = VmReport {
        host: vmm::host::kvm_kind().as_str().into(),
        vcpus: a.vcpus,
        memory_mib: a.memory,
        daemon_args: a.daemon_args.clone(),
        metrics: vec![
            Metric::new(COLD, "s", v.cold, m.cold),
            Metric::new(CREATE, "ms", v.create, m.create),
            Metric::new(FREEZE, "ms", v.freeze, m.freeze),
            Metric::new(THAW, "ms", v.thaw, m.thaw),
            Metric::new(PAUSE, "ms", v.pause, m.pause),
            Metric::new(RESUME, "ms", v.resume, m.resume),
            Metric::new(PSS, "MiB", v.pss, m.pss),
            Metric::new(RSS, "MiB", v.rss, m.rss),
            Metric::new(PRIVATE, "MiB", v.private, m.private),
        ],
    };
    out.emit(&report.render(), &report, VmReport::plot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        a: VmArgs,
    }

    #[test]
    fn options_are_checked() {
        let a = P::try_parse_from(["x"]).unwrap().a;
        assert_eq!((a.creates, a.idle, a.memory, a.vcpus), (5, 3, 256, 1));
        assert!(a.daemon_args.contains("--freeze-idle-ms 0"));
        assert!(P::try_parse_from(["x", "--creates", "0"]).is_err());
        assert!(P::try_parse_from(["x", "--memory", "32"]).is_err());
        let a = P::try_parse_from(["x", "--pauses", "0", "--cold-boots", "2"])
            .unwrap()
            .a;
        assert_eq!((a.pauses, a.cold_boots), (0, 2));
    }

    #[test]
    fn smaps_rollup_is_read() {
        let s = "00400000-7fff [rollup]\nRss:  2048 kB\nPss:  1024 kB\nPss_Anon:  100 kB\n\
                 Pss_File: 900 kB\nPss_Shmem: 24 kB\n";
        assert_eq!(smaps_fields(s), [2048, 1024, 124]);
        assert_eq!(smaps_fields(""), [0, 0, 0]);
    }

    #[test]
    fn the_report_has_ratios_a_table_and_figures() {
        let r = VmReport {
            host: "pvm".into(),
            vcpus: 1,
            memory_mib: 256,
            daemon_args: String::new(),
            metrics: vec![
                Metric::new(COLD, "s", vec![30.0], vec![10.0]),
                Metric::new(CREATE, "ms", vec![800.0, 900.0, 1000.0], vec![90.0]),
                Metric::new(FREEZE, "ms", vec![1.0], vec![]),
                Metric::new(PSS, "MiB", vec![200.0], vec![20.0]),
            ],
        };
        assert_eq!(r.metrics[0].ratio, Some(3.0));
        assert_eq!(r.metrics[1].ratio, Some(10.0));
        assert_eq!(r.metrics[2].ratio, None);
        let t = r.render();
        assert!(t.contains("create (restore)") && t.contains("10.00"), "{t}");
        let d = tempfile::tempdir().unwrap();
        let files = r
            .plot(&Out::for_json(d.path(), Path::new("bench-vm.json")))
            .unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for n in ["create", "freeze", "cold", "memory", "ratios"] {
            assert!(names.contains(&format!("bench-vm-{n}.png")), "{names:?}");
        }
        assert!(!names.contains(&"bench-vm-pause.png".to_string()));
    }
}
