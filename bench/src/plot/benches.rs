//! The figures of each `shoal bench ...`, from its report: latency CDFs
//! per system (Shoal and the peer measured in the same run), throughput
//! against concurrency, memory against N. A figure whose data the run did
//! not produce (a skipped peer, a failed step) is left out; each function
//! returns the files it wrote.

use super::{bars, latency_cdf, xy, Bar, Figure, Out, PlotError, Series, XySeries};
use crate::boot::BootReport;
use crate::exec::ExecReport;
use crate::load::LoadReport;
use crate::pmem_report::PmemReport;
use crate::restore::RestoreReport;
use crate::stats::Samples;
use std::path::PathBuf;

/// What a figure draws.
#[derive(Debug)]
enum Kind {
    Cdf(Vec<Series>),
    Xy(Vec<XySeries>),
    Bars(Vec<Bar>),
}

/// A figure to draw: file name part, labels, data.
#[derive(Debug)]
struct Planned {
    name: String,
    fig: Figure,
    kind: Kind,
}

/// The figures of one report, planned, then drawn.
struct Figs<'a> {
    out: &'a Out,
    planned: Vec<Planned>,
}

impl<'a> Figs<'a> {
    fn new(out: &'a Out) -> Self {
        Self {
            out,
            planned: vec![],
        }
    }

    fn plan(&mut self, name: &str, fig: Figure, kind: Kind) {
        self.planned.push(Planned {
            name: name.into(),
            fig,
            kind,
        });
    }

    /// A CDF of the non-empty series (none: no figure).
    fn cdf(&mut self, name: &str, fig: Figure, series: Vec<Series>) {
        let series: Vec<Series> = series
            .into_iter()
            .filter(|s| !s.samples.is_empty())
            .collect();
        if !series.is_empty() {
            self.plan(name, fig, Kind::Cdf(series));
        }
    }

    /// Lines through the non-empty series (none: no figure).
    fn xy(&mut self, name: &str, fig: Figure, series: Vec<XySeries>) {
        let series: Vec<XySeries> = series
            .into_iter()
            .filter(|s| !s.points.is_empty())
            .collect();
        if !series.is_empty() {
            self.plan(name, fig, Kind::Xy(series));
        }
    }

    /// Bars (none: no figure).
    fn bars(&mut self, name: &str, fig: Figure, b: Vec<Bar>) {
        if !b.is_empty() {
            self.plan(name, fig, Kind::Bars(b));
        }
    }

    /// Draws them all; the files written.
    fn draw(self) -> Result<Vec<PathBuf>, PlotError> {
        let mut files = vec![];
        for p in self.planned {
            let path = self.out.path(&p.name);
            match &p.kind {
                Kind::Cdf(s) => latency_cdf(&path, &p.fig, s)?,
                Kind::Xy(s) => xy(&path, &p.fig, s)?,
                Kind::Bars(b) => bars(&path, &p.fig, b)?,
            }
            files.push(path);
        }
        Ok(files)
    }
}

/// The series of `metric` in `samples`, one per system, labelled by `label`.
fn of_metric(samples: &[Samples], metric: &str, label: impl Fn(&str) -> String) -> Vec<Series> {
    samples
        .iter()
        .filter(|s| s.metric == metric)
        .map(|s| Series::new(label(&s.system), s.values.clone()))
        .collect()
}

fn file_name(metric: &str) -> String {
    format!("cdf-{}", metric.replace('_', "-"))
}

/// `shoal bench boot`: one CDF per boot step (Shoal vs QEMU microvm), and
/// the monitors' own memory.
pub fn boot(r: &BootReport, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
    boot_figs(r, out).draw()
}

fn boot_figs<'a>(r: &BootReport, out: &'a Out) -> Figs<'a> {
    let mut f = Figs::new(out);
    let steps = [
        (
            "first_instruction",
            "VMM start to the guest's first instruction",
        ),
        ("first_console_line", "VMM start to the first console line"),
        ("init_marker", "VMM start to the init marker"),
        ("vmm_exit", "VMM start to the VMM's exit (guest rebooted)"),
    ];
    for (metric, what) in steps {
        let mut sub = "same kernel and root image (virtio-blk), runs interleaved".to_string();
        if let Some((_, x)) = r.ratio_peer_over_shoal.iter().find(|(m, _)| m == metric) {
            sub.push_str(&format!(", qemu/shoal p50 {x:.2}x"));
        }
        let fig = out
            .figure(format!("Boot: {what}"))
            .unit(r.unit)
            .subtitle(sub);
        f.cdf(
            &file_name(metric),
            fig,
            of_metric(&r.samples, metric, |s| s.to_string()),
        );
    }
    let fig = out
        .figure("Boot: the monitor's own memory at the init marker")
        .axes("monitor", "RSS minus guest RAM (MiB), median")
        .subtitle("same guest, same run");
    let mem = r
        .own_memory_kib
        .iter()
        .map(|(s, kib)| Bar::new(s.clone(), *kib as f64 / 1024.0))
        .collect();
    f.bars("memory", fig, mem);
    f
}

/// `shoal bench restore`: restore latency CDFs (new VMM process,
/// pre-warmed VM, jailed), the restore rate against concurrency, and the
/// PSS of idle restored VMs.
pub fn restore(r: &RestoreReport, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
    restore_figs(r, out).draw()
}

fn restore_figs<'a>(r: &RestoreReport, out: &'a Out) -> Figs<'a> {
    let mut f = Figs::new(out);
    let sub = format!("{} MiB guest, restored from one snapshot", r.memory_mib);
    let jailed = |metric: &str| {
        r.jail_ab.as_ref().map_or(vec![], |ab| {
            of_metric(&ab.samples, metric, |s| format!("{s}, A/B run"))
        })
    };
    let mut run = of_metric(&r.samples, "restore_to_vcpu_run", |_| {
        "shoal: new VMM process".into()
    });
    if let Some(p) = &r.prewarmed {
        run.push(Series::new(
            "shoal: into a pre-warmed VM (request to vCPUs running)",
            p.restore_samples.clone(),
        ));
    }
    run.extend(jailed("restore_to_vcpu_run"));
    let fig = out
        .figure("Restore: start to vCPUs running")
        .unit(r.unit)
        .subtitle(sub.clone());
    f.cdf("cdf-vcpu-run", fig, run);
    let mut first = of_metric(&r.samples, "restore_to_first_output", |_| {
        "shoal: new VMM process".into()
    });
    first.extend(jailed("restore_to_first_output"));
    let fig = out
        .figure("Restore: start to the guest's first output")
        .unit(r.unit)
        .subtitle(sub.clone());
    f.cdf("cdf-first-output", fig, first);

    let fig = out
        .figure("Restore: start to the VMM's main (the jail's set-up)")
        .unit(r.unit)
        .subtitle(format!("{sub}; jailed and unjailed interleaved"));
    f.cdf("cdf-vmm-start", fig, jailed("restore_to_vmm_start"));
    if r.jail_ab
        .as_ref()
        .is_some_and(|ab| !ab.stock_rows.is_empty())
    {
        let fig = out
            .figure("The restore a daemon's create waits for")
            .unit(r.unit)
            .subtitle(format!(
                "{sub}; microVM backend: new VMM (plain, jailed) vs a stocked pre-warmed VMM"
            ));
        f.cdf("cdf-create-restore", fig, jailed("create_restore"));
    }

    let pts = |v: Vec<(usize, f64)>| v.into_iter().map(|(k, y)| (k as f64, y)).collect();
    let mut rates = vec![XySeries::new(
        "shoal: new VMM per restore",
        pts(r
            .rates
            .iter()
            .map(|x| (x.concurrency, x.per_second))
            .collect()),
    )];
    if let Some(ab) = &r.jail_ab {
        rates.push(XySeries::new(
            "shoal, A/B run: plain",
            pts(ab
                .rates
                .iter()
                .map(|x| (x.concurrency, x.plain_per_second))
                .collect()),
        ));
        rates.push(XySeries::new(
            "shoal, A/B run: jailed",
            pts(ab
                .rates
                .iter()
                .map(|x| (x.concurrency, x.jailed_per_second))
                .collect()),
        ));
    }
    if let Some(p) = &r.prewarmed {
        rates.push(XySeries::new(
            "shoal: pre-warmed VMs (one per worker)",
            vec![(p.workers as f64, p.rate_per_second)],
        ));
    }
    let fig = out
        .figure("Restore rate against concurrency")
        .axes("concurrent restores", "restores/s (sustained)")
        .subtitle(sub);
    f.xy("rate", fig, rates);
    if r.pss_vms > 0 {
        let fig = out
            .figure(format!(
                "Host memory (PSS) of a restored idle VM, {} VMs alive",
                r.pss_vms
            ))
            .axes("", "PSS per VM (MiB)")
            .subtitle(format!("{} MiB guest", r.memory_mib));
        f.bars(
            "memory",
            fig,
            vec![
                Bar::new("mean", r.pss_kib_mean / 1024.0),
                Bar::new("max", r.pss_kib_max / 1024.0),
            ],
        );
    }
    f
}

/// `shoal bench exec`: the exec round trip's CDF, the steps from restore
/// to agent-ready, and the throughputs.
pub fn exec(r: &ExecReport, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
    exec_figs(r, out).draw()
}

fn exec_figs<'a>(r: &ExecReport, out: &'a Out) -> Figs<'a> {
    let mut f = Figs::new(out);
    let fig = out
        .figure("Exec round trip of /bin/true (host to guest agent and back)")
        .unit(r.unit)
        .subtitle("one restored sandbox, sequential execs");
    f.cdf(
        "cdf-exec",
        fig,
        of_metric(&r.samples, "exec_true_rtt", |_| "shoal".into()),
    );
    let steps = [
        ("restore_to_vsock_socket", "vsock socket accepts"),
        ("restore_to_guest_accept", "guest accepted the connection"),
        ("restore_to_agent_ready", "agent answered (agent-ready)"),
        ("restore_to_post_restore_done", "entropy and clock reset"),
    ];
    let series = steps
        .iter()
        .flat_map(|(m, label)| of_metric(&r.samples, m, |_| (*label).into()))
        .collect();
    let fig = out
        .figure("Restore to agent-ready, step by step (shoal)")
        .unit(r.unit)
        .subtitle("time from the VMM's start to each step");
    f.cdf("cdf-restore", fig, series);
    let fig = out
        .figure("Guest I/O throughput through the agent (shoal)")
        .axes("", "MB/s")
        .subtitle(format!("{} MB each", r.bytes / 1_000_000));
    f.bars(
        "throughput",
        fig,
        vec![
            Bar::new("guest stdout to host", r.stdout_mb_s),
            Bar::new("upload (host to guest file)", r.upload_mb_s),
            Bar::new("download (guest file to host)", r.download_mb_s),
        ],
    );
    f
}

/// `shoal bench load`: sandboxes/s and latencies against concurrency, the
/// cycle's CDF per concurrency, the create bursts' CDFs.
pub fn load(r: &LoadReport, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
    load_figs(r, out).draw()
}

fn load_figs<'a>(r: &LoadReport, out: &'a Out) -> Figs<'a> {
    let mut f = Figs::new(out);
    let cycle = if r.exec.is_empty() {
        "create \u{2192} destroy".to_string()
    } else {
        format!("create \u{2192} exec {} \u{2192} destroy", r.exec.join(" "))
    };
    let k = |c: usize| c as f64;
    let mut sub = format!("shoald over HTTP; a cycle: {cycle}");
    if let Some(i) = &r.idle {
        sub.push_str(&format!(
            "; idle: {} held, {} KiB host memory each",
            i.held, i.host_kib_per_sandbox
        ));
    }
    let fig = out
        .figure("shoald throughput against concurrency")
        .axes("concurrent clients", "completed cycles/s")
        .subtitle(sub);
    let thr = r
        .levels
        .iter()
        .map(|l| (k(l.concurrency), l.sandboxes_per_s))
        .collect();
    f.xy("throughput", fig, vec![XySeries::new("shoald", thr)]);

    let mut lat = vec![];
    type Pick = fn(&crate::load::Level) -> &Option<crate::stats::Summary>;
    let steps: [(&str, Pick); 4] = [
        ("cycle", |l| &l.cycle_ms),
        ("create", |l| &l.create_ms),
        ("exec", |l| &l.exec_ms),
        ("destroy", |l| &l.destroy_ms),
    ];
    for (c, (name, pick)) in steps.into_iter().enumerate() {
        // Without an exec step its (zero) times say nothing.
        if name == "exec" && r.exec.is_empty() {
            continue;
        }
        for (q, get) in [("p50", 0), ("p99", 1)] {
            let pts = r
                .levels
                .iter()
                .filter_map(|l| {
                    pick(l).as_ref().map(|s| {
                        let y = if get == 0 { s.median } else { s.p99 };
                        (k(l.concurrency), y)
                    })
                })
                .collect();
            // A step's p50 and p99 share a colour; the p99 is dashed.
            let line = XySeries::new(format!("{name} {q}"), pts).color(c);
            lat.push(if get == 1 { line.dashed() } else { line });
        }
    }
    let fig = out
        .figure("shoald latency against concurrency")
        .axes("concurrent clients", format!("latency ({})", r.unit))
        .subtitle(format!("a cycle: {cycle}"));
    f.xy("latency", fig, lat);
    let fig = out
        .figure(format!("shoald: one cycle ({cycle})"))
        .unit(r.unit)
        .subtitle("one line per concurrency level");
    let cdf = r
        .levels
        .iter()
        .map(|l| {
            Series::new(
                format!("{} concurrent", l.concurrency),
                l.cycle_samples.clone(),
            )
        })
        .collect();
    f.cdf("cdf-cycle", fig, cdf);
    let fig = out
        .figure("shoald: create latency in a burst")
        .unit(r.unit)
        .subtitle("from the warm pool vs restored on demand (pool off)");
    let bursts = r
        .create_rate
        .iter()
        .map(|b| {
            Series::new(
                format!("{} ({:.0}/s)", b.source, b.per_s),
                b.create_samples.clone(),
            )
        })
        .collect();
    f.cdf("cdf-create-burst", fig, bursts);
    f
}

/// `shoal bench pmem`: host memory against the number of VMs (pmem+DAX vs
/// virtio-blk), the guests' read times, host disk bytes per VM.
pub fn pmem(r: &PmemReport, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
    pmem_figs(r, out).draw()
}

fn pmem_figs<'a>(r: &PmemReport, out: &'a Out) -> Figs<'a> {
    let mut f = Figs::new(out);
    let mut roots: Vec<&str> = vec![];
    for m in &r.memory {
        if !roots.contains(&m.root.as_str()) {
            roots.push(&m.root);
        }
    }
    let label = |root: &str| match root {
        "pmem" => "virtio-pmem + DAX (shared)".to_string(),
        "blk" => "virtio-blk (per-guest page cache)".to_string(),
        o => o.to_string(),
    };
    let sub = format!(
        "{} MiB guests, each reads {:.1} MB of one image",
        r.memory_mib,
        r.read_bytes as f64 / 1e6
    );
    let line = |root: &str, y: &dyn Fn(&crate::pmem_report::MemoryRow) -> f64| {
        XySeries::new(
            label(root),
            r.memory
                .iter()
                .filter(|m| m.root == root)
                .map(|m| (m.vms as f64, y(m)))
                .collect(),
        )
    };
    let per_vm = roots
        .iter()
        .map(|root| line(root, &|m| m.host_per_vm_kib / 1024.0))
        .collect();
    let fig = out
        .figure("Host memory per VM against the number of VMs")
        .axes("VMs alive", "host memory per VM (MiB)")
        .subtitle(sub.clone());
    f.xy("memory-per-vm", fig, per_vm);
    let total = roots
        .iter()
        .map(|root| line(root, &|m| m.host_total_kib as f64 / 1024.0))
        .collect();
    let fig = out
        .figure("Host memory of all VMs against the number of VMs")
        .axes("VMs alive", "host memory (MiB)")
        .subtitle(sub.clone());
    f.xy("memory", fig, total);
    // The largest run of each root kind holds every VM's read time.
    let reads = roots
        .iter()
        .filter_map(|root| {
            r.memory
                .iter()
                .filter(|m| m.root == *root)
                .max_by_key(|m| m.vms)
                .map(|m| Series::new(label(root), m.read_samples.clone()))
        })
        .collect();
    let fig = out
        .figure("Guest read time of the shared files")
        .unit("ms")
        .subtitle(sub);
    f.cdf("cdf-read", fig, reads);
    let fig = out
        .figure(format!(
            "Host disk bytes per VM for a guest writing {:.0} MB",
            r.writes.first().map_or(0.0, |w| w.guest_bytes as f64 / 1e6)
        ))
        .axes("root", "host disk written per VM (MB)")
        .subtitle("pmem: tmpfs upper layer; blk: a writable per-VM copy of the root");
    let writes = r
        .writes
        .iter()
        .map(|w| Bar::new(w.root.clone(), w.host_bytes_per_vm / 1e6))
        .collect();
    f.bars("disk", fig, writes);
    f
}

#[cfg(test)]
#[path = "benches_tests.rs"]
mod tests;
