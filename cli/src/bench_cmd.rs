//! `shoal bench ...`: the subcommands and their options (the benchmarks
//! themselves are in [`crate::bench`]).

use crate::bench;
use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;

/// `shoal bench` options.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Directory for the PNG figures (default: the JSON report's directory;
    /// the files are named after the report: bench-boot-cdf-init-marker.png).
    #[arg(long, global = true, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    #[command(subcommand)]
    pub which: BenchCmd,
}

/// `shoal bench` subcommands.
#[derive(Subcommand)]
pub enum BenchCmd {
    /// shoald under load: create -> exec -> destroy at each concurrency,
    /// the create rate from a warm template, idle sandboxes held until
    /// admission refuses.
    Load {
        /// Image whose template the sandboxes restore from.
        #[arg(long, default_value = "tiny")]
        image: String,
        /// Concurrency levels (comma-separated).
        #[arg(long, default_value = "1,10,100,500")]
        concurrency: String,
        /// Cycles per level (at least the level).
        #[arg(long, default_value_t = 20)]
        cycles: usize,
        /// The exec step's command (the cheapest: busybox `true`).
        #[arg(long, default_value = "true")]
        exec: String,
        /// Skip the exec step.
        #[arg(long)]
        no_exec: bool,
        /// Creates per create-rate burst (0 skips).
        #[arg(long, default_value_t = 200)]
        burst: usize,
        /// Clients in the bursts and the idle fill.
        #[arg(long, default_value_t = 16)]
        burst_concurrency: usize,
        /// Most idle sandboxes to hold (0 skips the idle test).
        #[arg(long, default_value_t = 2000)]
        idle_max: usize,
        /// Extra shoald arguments for the private daemon (e.g. "--memory-overcommit 16").
        #[arg(long, default_value = "")]
        daemon_args: String,
        /// Where to write the JSON report.
        #[arg(long = "out", default_value = "bench-load.json")]
        out: PathBuf,
    },
    /// Fork a running sandbox into 1, 10, 100 clones vs as many creates: time, memory.
    Fork(bench::ForkArgs),
    /// HumanEval's 164 problems through FnCall at each concurrency, vs
    /// restore+exec python3+remove and a host python3: passes, calls/s,
    /// p50/p99, host CPU per call.
    Fncall(crate::bench_fncall::FnCallArgs),
    /// CPU classes: a latency sandbox's exec latency beside sandboxes
    /// burning CPU, the burners best_effort vs latency (the peer: no
    /// classes) vs none, in one run; JSON + CDF.
    Classes(crate::bench_classes::ClassesArgs),
    /// Density under reclaim (issue 21): a seeded mix of mostly idle, some
    /// allocating, a few busy sandboxes replayed with reclaim off, balloon
    /// free page reporting, idle eviction, both; host memory over time,
    /// peak and time integral; then the classes' exec latency at 50% and
    /// 100% best-effort load. JSON + PNG.
    Density(crate::bench_density::DensityArgs),
    /// An OCI image from a loopback registry: pull + convert vs skopeo +
    /// tar + mkfs.erofs, the first and next sandboxes, idle density, host
    /// memory of N sandboxes reading the same files (pmem layers vs
    /// per-sandbox copies).
    Image(crate::bench_image::ImageArgs),
    /// Networking: a sandbox's TCP download throughput, request round
    /// trips and connections/s to a test host (a netns), vs QEMU microvm
    /// on a TAP in the same run, and create latency with and without a
    /// network; JSON + figures. Needs root and qemu-system-x86_64.
    Net(crate::bench_net::NetArgs),
    /// The vm kind (QEMU q35) next to a microVM of the same size: cold
    /// boot vs create from the snapshot, freeze/thaw, pause to disk and
    /// resume, host memory per idle VM; ratios vm/microvm.
    Vm(crate::bench_vm::VmArgs),
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
        #[arg(long = "out", default_value = "bench-boot.json")]
        out: PathBuf,
    },
    /// Exec round trip, stdout/upload/download throughput, restore to
    /// agent-ready, and the agent's syscalls per exec and per MiB.
    Exec {
        /// Execs of /bin/true timed.
        #[arg(long, default_value_t = 50)]
        execs: usize,
        /// Restores timed (to agent-ready).
        #[arg(long, default_value_t = 20)]
        restores: usize,
        /// Bytes per throughput test.
        #[arg(long, default_value_t = 8 << 20)]
        bytes: u64,
        /// Where to write the JSON report.
        #[arg(long = "out", default_value = "bench-exec.json")]
        out: PathBuf,
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
        /// Also restore through shoal-jailer, interleaved with unjailed
        /// restores (A/B in one run; needs root).
        #[arg(long)]
        jail: bool,
        /// Where to write the JSON report.
        #[arg(long = "out", default_value = "bench-restore.json")]
        out: PathBuf,
    },
    /// Host memory of N VMs reading the same files from one image (pmem+DAX
    /// vs virtio-blk), guest page metadata, host disk writes per VM.
    Pmem {
        /// VM counts (comma-separated); each for both root kinds.
        #[arg(long, default_value = "50,200")]
        vms: String,
        /// Bytes each guest reads (default: 50 MB on hardware KVM, 5 MB on
        /// PVM hosts, where a guest reads ~1 MB/s).
        #[arg(long)]
        read_bytes: Option<u64>,
        /// Files the read set is split into.
        #[arg(long, default_value_t = 5)]
        read_files: usize,
        /// Guests reading at the same time.
        #[arg(long, default_value_t = 2)]
        concurrency: usize,
        /// Bytes one guest writes for the disk-write figure (0: skip).
        #[arg(long, default_value_t = 20_000_000)]
        write_bytes: u64,
        /// Guest memory in MiB.
        #[arg(long, default_value_t = 128)]
        memory: u32,
        /// Scratch directory (not on tmpfs; default: under the state dir).
        #[arg(long)]
        workdir: Option<PathBuf>,
        /// Where to write the JSON report.
        #[arg(long = "out", default_value = "bench-pmem.json")]
        out: PathBuf,
    },
    /// Draws a generic JSON document (another language's benchmark) as PNG
    /// figures.
    ///
    /// {"title", "host", "unit", "series": [{"label", "samples": [..]}]} is
    /// drawn as a latency CDF (FILE-cdf.png), and
    /// "xy": {"x_label", "y_label", "series": [{"label", "points": [[x, y], ..]}]}
    /// (FILE-xy.png) and "bars": {"y_label", "bars": [{"label", "value"}]}
    /// (FILE-bars.png) when present.
    Plot {
        /// The document.
        #[arg(value_name = "FILE.json")]
        doc: PathBuf,
    },
    /// The E2B layer: create -> commands.run("echo hi") -> kill with the
    /// stock e2b SDK vs the same flow through Shoal's Python SDK, at each
    /// concurrency, and run_code("1+1"); runs sdk/python/bench/e2b_overhead.py.
    E2b {
        /// The Python with the pinned e2b SDK (scripts/e2b-tests.sh makes it).
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/e2b-venvs/e2b-2.63/bin/python"))]
        python: PathBuf,
        /// Concurrency levels (comma-separated).
        #[arg(long, default_value = "1,10,50")]
        concurrency: String,
        /// Cycles per level and system (at least the level).
        #[arg(long, default_value_t = 50)]
        cycles: usize,
        /// Warm pool size (0: the top level).
        #[arg(long, default_value_t = 0)]
        pool: usize,
        /// Extra shoald arguments for the private daemon.
        #[arg(long, default_value = "")]
        daemon_args: String,
        /// Directory for the JSON reports (bench-e2b.json, bench-e2b-summary.json).
        #[arg(long = "out", default_value = ".")]
        out: PathBuf,
    },
    /// Shoal on a Ray cluster: creates from warm pools over 1, 2, 3 local
    /// nodes (3 daemons, each capped to the same CPU share), the placement
    /// overhead per create, and placement at 160 nodes and 5,000 creates/s
    /// simulated (power-of-2 vs random vs least-loaded); runs
    /// sdk/python/bench/cluster.py.
    Cluster {
        /// The Python with Ray and the SDK (scripts/test.sh makes
        /// target/rayenv: pip install './sdk/python[ray]').
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/rayenv/bin/python"))]
        python: PathBuf,
        /// Warm pool per node (a burst takes 3/4 of it on each node).
        #[arg(long, default_value_t = 40)]
        pool: usize,
        /// Bursts per node count.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// CPU share of each daemon (a cgroup quota; 0.1: a tenth of a CPU).
        #[arg(long, default_value_t = 0.1)]
        cpu_share: f64,
        /// Simulated seconds of the 160-node placement.
        #[arg(long, default_value_t = 60.0)]
        sim_seconds: f64,
        /// Only the simulation, at this per-host capacity (0: run everything).
        #[arg(long, default_value_t = 0)]
        sim_only_capacity: usize,
        /// Directory for the JSON reports (bench-cluster.json, bench-cluster-summary.json).
        #[arg(long = "out", default_value = ".")]
        out: PathBuf,
    },
}

/// Runs `shoal bench ...`.
pub fn run(g: &crate::daemon_cmds::Global, a: BenchArgs) -> Result<i32> {
    let plot = a.plot.as_deref();
    match a.which {
        BenchCmd::Load {
            image,
            concurrency,
            cycles,
            exec,
            no_exec,
            burst,
            burst_concurrency,
            idle_max,
            daemon_args,
            out: json,
        } => bench::load(
            g,
            &bench::LoadArgs {
                image,
                concurrency,
                cycles,
                exec: if no_exec {
                    vec![]
                } else {
                    exec.split_whitespace().map(String::from).collect()
                },
                burst,
                burst_concurrency,
                idle_max,
                daemon_args,
            },
            &bench::Output::new(&json, plot),
        )
        .map(|_| 0),
        BenchCmd::Fork(f) => bench::fork(g, &f, &bench::Output::new(&f.out, plot)).map(|_| 0),
        BenchCmd::Classes(c) => {
            crate::bench_classes::run(g, &c, &bench::Output::new(&c.out, plot)).map(|_| 0)
        }
        BenchCmd::Density(d) => {
            crate::bench_density::run(g, &d, &bench::Output::new(&d.out, plot)).map(|_| 0)
        }
        BenchCmd::Fncall(f) => {
            crate::bench_fncall::run(g, &f, &bench::Output::new(&f.out, plot)).map(|_| 0)
        }
        BenchCmd::Net(n) => {
            crate::bench_net::run(g, &n, &bench::Output::new(&n.out, plot)).map(|_| 0)
        }
        BenchCmd::Vm(v) => {
            crate::bench_vm::run(g, &v, &bench::Output::new(&v.out, plot)).map(|_| 0)
        }
        BenchCmd::Image(i) => {
            crate::bench_image::run(g, &i, &bench::Output::new(&i.out, plot)).map(|_| 0)
        }
        BenchCmd::Boot {
            runs,
            image,
            memory,
            no_qemu,
            out: json,
        } => bench::boot(
            runs,
            &image,
            memory,
            no_qemu,
            &bench::Output::new(&json, plot),
        )
        .map(|_| 0),
        BenchCmd::Exec {
            execs,
            restores,
            bytes,
            out: json,
        } => bench::exec(execs, restores, bytes, &bench::Output::new(&json, plot)).map(|_| 0),
        BenchCmd::Restore {
            restores,
            concurrency,
            rate_restores,
            pss_vms,
            memory,
            jail,
            out: json,
        } => bench::restore(
            restores,
            &concurrency,
            rate_restores,
            pss_vms,
            jail,
            memory,
            &bench::Output::new(&json, plot),
        )
        .map(|_| 0),
        BenchCmd::Pmem {
            vms,
            read_bytes,
            read_files,
            concurrency,
            write_bytes,
            memory,
            workdir,
            out: json,
        } => bench::pmem(
            bench::PmemArgs {
                vms,
                read_bytes,
                read_files,
                concurrency,
                write_bytes,
                memory,
                workdir,
            },
            &bench::Output::new(&json, plot),
        )
        .map(|_| 0),
        BenchCmd::Plot { doc } => bench::plot_doc(&bench::Output::new(&doc, plot)).map(|_| 0),
        BenchCmd::E2b {
            python,
            concurrency,
            cycles,
            pool,
            daemon_args,
            out,
        } => {
            let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../sdk/python/bench/e2b_overhead.py");
            let bins = std::env::current_exe()?
                .parent()
                .map(std::path::Path::to_path_buf)
                .unwrap_or_default();
            let st = std::process::Command::new(&python)
                .arg(&script)
                .args(["--concurrency", &concurrency])
                .args(["--cycles", &cycles.to_string()])
                .args(["--pool", &pool.to_string()])
                .arg(format!("--daemon-args={daemon_args}"))
                .arg("--out")
                .arg(&out)
                .arg("--bins")
                .arg(&bins)
                .status()
                .map_err(|e| {
                    anyhow::anyhow!(
                        "{}: {e} (make it with scripts/e2b-tests.sh)",
                        python.display()
                    )
                })?;
            if let Some(dir) = plot.filter(|d| *d != out.as_path()) {
                bench::plot_doc(&bench::Output::new(&out.join("bench-e2b.json"), Some(dir)))?;
            }
            Ok(st.code().unwrap_or(1))
        }
        BenchCmd::Cluster {
            python,
            pool,
            rounds,
            cpu_share,
            sim_seconds,
            sim_only_capacity,
            out,
        } => {
            let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../sdk/python/bench/cluster.py");
            let bins = std::env::current_exe()?
                .parent()
                .map(std::path::Path::to_path_buf)
                .unwrap_or_default();
            let mut cmd = std::process::Command::new(&python);
            cmd.arg(&script)
                .args(["--pool", &pool.to_string()])
                .args(["--rounds", &rounds.to_string()])
                .args(["--cpu-share", &cpu_share.to_string()])
                .args(["--sim-seconds", &sim_seconds.to_string()])
                .arg("--out")
                .arg(&out)
                .arg("--bins")
                .arg(&bins);
            if sim_only_capacity > 0 {
                cmd.arg("--sim-only")
                    .args(["--sim-capacity", &sim_only_capacity.to_string()]);
            }
            let st = cmd.status().map_err(|e| {
                anyhow::anyhow!(
                    "{}: {e} (make it: python3 -m venv target/rayenv && \
                     target/rayenv/bin/pip install './sdk/python[ray]')",
                    python.display()
                )
            })?;
            if let Some(dir) = plot.filter(|d| *d != out.as_path()) {
                bench::plot_doc(&bench::Output::new(
                    &out.join("bench-cluster.json"),
                    Some(dir),
                ))?;
            }
            Ok(st.code().unwrap_or(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_command_line_is_consistent() {
        crate::Cli::command().debug_assert();
    }

    fn plot_of(args: &[&str]) -> Option<PathBuf> {
        match crate::Cli::try_parse_from(args).unwrap().cmd {
            crate::Cmd::Bench(a) => a.plot,
            _ => panic!("not a bench: {args:?}"),
        }
    }

    #[test]
    fn plot_dir_before_or_after_the_bench() {
        let d = Some(PathBuf::from("/d"));
        assert_eq!(plot_of(&["shoal", "bench", "restore", "--plot", "/d"]), d);
        assert_eq!(plot_of(&["shoal", "bench", "--plot", "/d", "boot"]), d);
        assert_eq!(plot_of(&["shoal", "bench", "exec"]), None);
        // The document is not `json`: that is the global --json flag's id
        // (a positional of that name panicked when parsed).
        let a = crate::Cli::try_parse_from(["shoal", "bench", "plot", "x.json"]).unwrap();
        assert!(matches!(
            a.cmd,
            crate::Cmd::Bench(BenchArgs {
                which: BenchCmd::Plot { .. },
                ..
            })
        ));
    }
}
