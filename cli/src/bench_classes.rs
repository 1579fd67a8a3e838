//! `shoal bench classes`: CPU classes' measurement (issue 21): a latency
//! sandbox's exec latency with sandboxes burning CPU beside it, when the
//! burners are `best_effort` (classes) and when they are `latency` like it
//! (the peer: no classes), in the same run, with the quiet host as the
//! floor. Each burner runs a shell loop on its vCPU (guest user mode:
//! native speed, no exits); the measured sandbox runs `true` again and
//! again. A private daemon (jailed VMMs when root, so each in its cgroup).

use crate::bench::{Output, PrivateDaemon};
use anyhow::Result;
use shoal_bench::plot::{self, Doc, Series};
use shoal_bench::stats::summarize;
use shoal_client::api::{self, CreateSandbox, ExecRequest, Priority};
use shoal_client::DaemonClient;
use std::time::Instant;

/// `shoal bench classes` options.
#[derive(clap::Args, Clone)]
pub struct ClassesArgs {
    /// Image of the sandboxes (its template is booted once and cached).
    #[arg(long, default_value = "tiny")]
    pub image: String,
    /// Sandboxes burning CPU beside the measured one (default: the host's
    /// CPUs, so they could fill it).
    #[arg(long)]
    pub burners: Option<usize>,
    /// Execs timed per case.
    #[arg(long, default_value_t = 15)]
    pub execs: usize,
    /// Extra shoald arguments for the private daemon.
    #[arg(long, default_value = "")]
    pub daemon_args: String,
    /// Where to write the JSON report (its CDF beside it, or in --plot).
    #[arg(long = "out", default_value = "bench-classes.json")]
    pub out: std::path::PathBuf,
}

/// The burner's loop: busy in guest user mode until killed.
const BURN: &str = "while :; do :; done";

fn create(c: &DaemonClient, image: &str, p: Priority) -> Result<api::Sandbox> {
    Ok(c.create(&CreateSandbox {
        vcpus: Some(1),
        memory_mib: Some(128),
        // Never frozen: a burner must keep burning between requests.
        keep_running: true,
        priority: p,
        ..CreateSandbox::from_image(image)
    })?)
}

/// Times `n` execs of `true` in `id` (ms), after one untimed.
fn execs(c: &DaemonClient, id: &str, n: usize) -> Result<Vec<f64>> {
    let req = ExecRequest::argv(["true"]).with_timeout(120.0);
    c.exec(id, &req)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = c.exec(id, &req)?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(r.exit_code == Some(0), "true failed: {r:?}");
    }
    Ok(v)
}

/// One case: `burners` sandboxes of class `p` burning, the latency
/// sandbox `probe`'s exec latencies meanwhile.
fn case(
    c: &DaemonClient,
    image: &str,
    execs_n: usize,
    probe: &str,
    burners: usize,
    p: Priority,
) -> Result<Vec<f64>> {
    let mut ids = vec![];
    let res = (|| {
        for _ in 0..burners {
            let sb = create(c, image, p)?;
            ids.push(sb.id.clone());
            c.start_command(&sb.id, &ExecRequest::shell(BURN))?;
        }
        // Let the burners reach their loops.
        std::thread::sleep(std::time::Duration::from_secs(2));
        execs(c, probe, execs_n)
    })();
    for id in ids {
        let _ = c.kill(&id);
    }
    res
}

/// One measured case: the latency sandbox's exec latencies (ms) with
/// `burners` sandboxes of class `priority` burning beside it.
pub(crate) struct Case {
    pub label: String,
    pub burners: usize,
    pub priority: Priority,
    pub ms: Vec<f64>,
}

/// The quiet host, then for each count of `levels` the burners
/// best_effort (classes) and latency (the peer: no classes), `execs`
/// timed execs each, in one latency sandbox of `image` (its template
/// made already). Labels name the burner count when there are several
/// levels.
pub(crate) fn measure(
    c: &DaemonClient,
    image: &str,
    execs: usize,
    levels: &[usize],
) -> Result<Vec<Case>> {
    let probe = create(c, image, Priority::Latency)?;
    eprintln!(
        "measured sandbox {} (latency); burners {levels:?}; {execs} execs per case",
        probe.id
    );
    let mut cases = vec![("quiet host (floor)".to_string(), 0, Priority::Latency)];
    for &n in levels {
        let k = if levels.len() > 1 {
            format!("{n} ")
        } else {
            String::new()
        };
        cases.push((
            format!("{k}burners best_effort (classes)"),
            n,
            Priority::BestEffort,
        ));
        cases.push((
            format!("{k}burners latency (peer: no classes)"),
            n,
            Priority::Latency,
        ));
    }
    let mut out = vec![];
    let res = (|| {
        for (label, n, p) in cases {
            eprintln!("{label}...");
            let ms = case(c, image, execs, &probe.id, n, p)?;
            out.push(Case {
                label,
                burners: n,
                priority: p,
                ms,
            });
        }
        Ok::<_, anyhow::Error>(())
    })();
    let _ = c.kill(&probe.id);
    res.map(|_| out)
}

/// Runs it; the report is the figure's document (a CDF per case).
pub fn run(g: &crate::daemon_cmds::Global, a: &ClassesArgs, out: &Output) -> Result<()> {
    let burners = a
        .burners
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let mut private = None;
    let c = match &g.daemon {
        Some(_) => crate::daemon_client::connect(g.daemon.as_deref())?,
        None => {
            let (c, p) = PrivateDaemon::start("classes", &a.daemon_args)?;
            private = Some(p);
            c
        }
    };
    crate::daemon_cmds::image_template(g, &c, &a.image, 1, 128, &Default::default())?;
    let cases = measure(&c, &a.image, a.execs, &[burners]);
    drop(private);
    let mut series = vec![];
    let mut table = format!(
        "exec latency of a latency sandbox, {burners} sandboxes burning CPU beside it (ms)\n\
         {:<38} {:>4} {:>9} {:>9} {:>9}\n",
        "case", "n", "p50", "p90", "max"
    );
    for k in cases? {
        if let Some(s) = summarize(&k.ms) {
            table.push_str(&format!(
                "{:<38} {:>4} {:>9.1} {:>9.1} {:>9.1}\n",
                k.label, s.n, s.median, s.p90, s.max
            ));
        }
        series.push(Series::new(k.label, k.ms));
    }
    let core = shoal_runtime::sched::core_sched();
    let doc = Doc {
        title: "Exec latency of a latency sandbox beside CPU burners".into(),
        host: vmm::host::kvm_kind().as_str().into(),
        unit: "ms".into(),
        subtitle: format!(
            "{burners} burners, 1 vCPU each; best_effort: SCHED_IDLE + cpu weight {}; SMT isolation {}",
            shoald::cpu_share::BEST_EFFORT_WEIGHT,
            core.code()
        ),
        series,
        xy: None,
        bars: None,
    };
    out.emit(&table, &doc, plot::doc::draw)
}
