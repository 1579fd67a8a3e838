//! The report of `shoal bench image` (see [`crate::image`]): its sections,
//! the ratios against the goals, the table and the figures.

use crate::image_oci::BuiltImage;
use crate::plot::{self, Bar, Out, PlotError, Series};
use crate::stats::{summarize, Summary};
use serde::Serialize;
use std::path::PathBuf;

/// Shoal's system name.
pub const SHOAL: &str = "shoal";
/// The peer chain's.
pub const PEER: &str = "skopeo+tar+mkfs.erofs";
/// The shared-read arms.
pub const SHARED: &str = "pmem-shared";
/// The per-sandbox copy arm.
pub const COPIES: &str = "per-sandbox-copy";

/// One step of a pull+convert chain.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// What it ran.
    pub name: String,
    /// Wall time (ms).
    pub ms: f64,
}

/// One pull+convert run of one system.
#[derive(Debug, Clone, Serialize)]
pub struct PullRun {
    /// "shoal" or "skopeo+tar+mkfs.erofs".
    pub system: String,
    /// Wall time, registry to erofs layers (ms).
    pub wall_ms: f64,
    /// Bytes the run's processes wrote (`write_bytes` of /proc/self/io
    /// plus the waited children's `ru_oublock` x 512: what they dirtied
    /// for the disk, temporary files included).
    pub written_bytes: u64,
    /// Bytes left on disk: the erofs layers.
    pub erofs_bytes: u64,
    /// Bytes left on disk besides them (the peer's OCI layout and
    /// extracted trees; shoal keeps none).
    pub intermediate_bytes: u64,
    /// Its steps.
    pub steps: Vec<Step>,
}

/// Pull + convert, both systems.
#[derive(Debug, Clone, Serialize)]
pub struct PullSection {
    /// Every run, alternating systems.
    pub runs: Vec<PullRun>,
    /// The peer's commands, as run.
    pub peer_commands: Vec<String>,
    /// Median wall time of shoal over the peer's (goal: <= 1).
    pub time_ratio_shoal_over_peer: Option<f64>,
    /// Median bytes written, shoal over the peer.
    pub written_ratio_shoal_over_peer: Option<f64>,
    /// Whether the time goal is met.
    pub goal_no_slower: Option<bool>,
}

/// Time to the first sandbox of an image and to the next ones.
#[derive(Debug, Clone, Serialize)]
pub struct FirstSection {
    /// `POST /v1/images` (pull into the daemon's store) (ms).
    pub daemon_pull_ms: f64,
    /// The first `POST /v1/sandboxes {"image"}`: template boot +
    /// snapshot + one restore (ms).
    pub first_ms: f64,
    /// The next ones (restores), one at a time (ms).
    pub next_ms: Option<Summary>,
    /// Their samples.
    pub next_samples: Vec<f64>,
}

/// Idle container sandboxes of one image.
#[derive(Debug, Clone, Serialize)]
pub struct IdleSection {
    /// Held at once.
    pub held: usize,
    /// Why the fill stopped: the refusal or the --idle-max cap.
    pub stopped_by: String,
    /// Host MemAvailable before (MiB).
    pub mem_available_before_mib: u64,
    /// At the peak (MiB).
    pub mem_available_peak_mib: u64,
    /// (before - peak) / held (KiB).
    pub host_kib_per_sandbox: u64,
    /// VMM processes found for them.
    pub vmms_found: usize,
    /// Mean PSS of those VMMs (KiB).
    pub vmm_pss_kib_mean: u64,
    /// Seconds to fill.
    pub fill_s: f64,
    /// Of up to 5 picked across the fill, how many answered an exec.
    pub probes_ok: usize,
    /// Probes made.
    pub probes: usize,
    /// Failures that were not admission refusals.
    pub errors: usize,
    /// Sandboxes this host's MemAvailable before the fill would hold at
    /// `host_kib_per_sandbox` (an extrapolation when the fill was capped).
    pub extrapolated_capacity: u64,
    /// Whether the 1,000 goal is met: held, or extrapolated when capped.
    pub goal_1000: bool,
    /// Whether that verdict is an extrapolation.
    pub goal_extrapolated: bool,
}

/// Host memory of one arm of the shared-read test.
#[derive(Debug, Clone, Serialize)]
pub struct MemRow {
    /// "pmem-shared" or "per-sandbox-copy".
    pub arm: String,
    /// VMs alive at the measurement.
    pub vms: usize,
    /// Reads that failed.
    pub errors: usize,
    /// Sum of the VMMs' Pss_Anon + Pss_Shmem (KiB).
    pub vmm_private_kib: u64,
    /// Page cache of the layer files, the copies and the template memory
    /// (growth from evicted, KiB; `mincore`).
    pub page_cache_kib: i64,
    /// Their sum (KiB).
    pub host_total_kib: i64,
    /// Per VM (KiB).
    pub host_per_vm_kib: f64,
    /// Bytes written for the copies (0 for pmem-shared).
    pub copy_written_bytes: u64,
    /// Each guest's read time (ms).
    pub read_ms: Option<Summary>,
    /// Its samples.
    pub read_samples: Vec<f64>,
}

/// N sandboxes of one image reading the same files.
#[derive(Debug, Clone, Serialize)]
pub struct MemSection {
    /// Bytes each guest reads.
    pub read_bytes: u64,
    /// The image's erofs layer bytes (what each copy holds).
    pub layer_bytes: u64,
    /// Guest memory (MiB).
    pub memory_mib: u32,
    /// Both arms.
    pub rows: Vec<MemRow>,
    /// 100 * (1 - shared / copies) of the host totals (goal: >= 70).
    pub reduction_pct: Option<f64>,
    /// Whether the goal is met.
    pub goal_70pct: Option<bool>,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct ImageReport {
    /// "image".
    pub bench: &'static str,
    /// Host KVM type.
    pub host_kvm: &'static str,
    /// Times in ms, memory in KiB unless the field says otherwise.
    pub unit: &'static str,
    /// The command that made it.
    pub command: String,
    /// The image.
    pub image: BuiltImage,
    /// Pull + convert.
    pub pull: Option<PullSection>,
    /// First and next sandboxes.
    pub first: Option<FirstSection>,
    /// Idle density.
    pub idle: Option<IdleSection>,
    /// Shared reads.
    pub memory: Option<MemSection>,
    /// What is guest-bound, what was scaled down.
    pub notes: Vec<String>,
}

/// `a / b`, when `b` is positive.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite()).then(|| a / b)
}

/// The median of `f` over the runs of `system`.
pub fn median_of(runs: &[PullRun], system: &str, f: impl Fn(&PullRun) -> f64) -> Option<f64> {
    let v: Vec<f64> = runs.iter().filter(|r| r.system == system).map(f).collect();
    summarize(&v).map(|s| s.median)
}

impl PullSection {
    /// The section with its ratios (`shoal` against `peer`).
    pub fn new(runs: Vec<PullRun>, peer_commands: Vec<String>, shoal: &str, peer: &str) -> Self {
        let t = |s| median_of(&runs, s, |r| r.wall_ms);
        let w = |s| median_of(&runs, s, |r| r.written_bytes as f64);
        let time = t(shoal).zip(t(peer)).and_then(|(a, b)| ratio(a, b));
        let written = w(shoal).zip(w(peer)).and_then(|(a, b)| ratio(a, b));
        PullSection {
            runs,
            peer_commands,
            time_ratio_shoal_over_peer: time,
            written_ratio_shoal_over_peer: written,
            goal_no_slower: time.map(|r| r <= 1.0),
        }
    }
}

impl MemSection {
    /// Fills in the reduction of `shared` over `copies` and the verdict.
    pub fn finish(mut self) -> Self {
        let of = |arm: &str| {
            self.rows
                .iter()
                .find(|r| r.arm == arm)
                .map(|r| r.host_total_kib as f64)
        };
        self.reduction_pct = of(SHARED)
            .zip(of(COPIES))
            .and_then(|(s, c)| ratio(s, c).map(|r| 100.0 * (1.0 - r)));
        self.goal_70pct = self.reduction_pct.map(|p| p >= 70.0);
        self
    }
}

/// How many sandboxes of `per_kib` fit in `avail_mib`.
pub fn capacity(avail_mib: u64, per_kib: u64) -> u64 {
    (avail_mib * 1024).checked_div(per_kib).unwrap_or(0)
}

fn mib(kib: f64) -> f64 {
    kib / 1024.0
}

impl ImageReport {
    /// A table for people.
    pub fn render(&self) -> String {
        let mut s = format!(
            "image: {} layers, {} files, {:.1} MB tar, {:.1} MB gzip ({})\n",
            self.image.layers,
            self.image.files,
            self.image.tar_bytes as f64 / 1e6,
            self.image.blob_bytes as f64 / 1e6,
            self.host_kvm
        );
        if let Some(p) = &self.pull {
            s.push_str("pull + convert (registry -> erofs layers):\n");
            for r in &p.runs {
                s.push_str(&format!(
                    "  {:<24} {:>8.0} ms  written {:>7.1} MB  erofs {:>7.1} MB  other {:>7.1} MB\n",
                    r.system,
                    r.wall_ms,
                    r.written_bytes as f64 / 1e6,
                    r.erofs_bytes as f64 / 1e6,
                    r.intermediate_bytes as f64 / 1e6
                ));
            }
            if let Some(t) = p.time_ratio_shoal_over_peer {
                s.push_str(&format!(
                    "  time shoal/peer {t:.2} (goal <= 1: {}), written shoal/peer {}\n",
                    if t <= 1.0 { "met" } else { "NOT met" },
                    p.written_ratio_shoal_over_peer
                        .map_or("-".into(), |w| format!("{w:.2}"))
                ));
            }
        }
        if let Some(f) = &self.first {
            s.push_str(&format!(
                "daemon pull {:.0} ms; first sandbox (template boot+snapshot) {:.0} ms",
                f.daemon_pull_ms, f.first_ms
            ));
            if let Some(n) = &f.next_ms {
                s.push_str(&format!(
                    "; next {}: p50 {:.0} ms p99 {:.0} ms",
                    n.n, n.median, n.p99
                ));
            }
            s.push('\n');
        }
        if let Some(i) = &self.idle {
            s.push_str(&format!(
                "idle: {} held ({}), {:.2} MiB host each (VMM PSS {:.2} MiB), probes {}/{}, \
                 capacity at that rate {} (goal 1000: {}{})\n",
                i.held,
                i.stopped_by,
                mib(i.host_kib_per_sandbox as f64),
                mib(i.vmm_pss_kib_mean as f64),
                i.probes_ok,
                i.probes,
                i.extrapolated_capacity,
                if i.goal_1000 { "met" } else { "NOT met" },
                if i.goal_extrapolated {
                    ", extrapolated"
                } else {
                    ""
                }
            ));
        }
        if let Some(m) = &self.memory {
            for r in &m.rows {
                s.push_str(&format!(
                    "shared reads {:<17} x{:<4} host {:>8.1} MiB ({:.2} MiB/VM: VMM {:.1} + page cache \
                     {:.1}), {} errors\n",
                    r.arm,
                    r.vms,
                    mib(r.host_total_kib as f64),
                    mib(r.host_per_vm_kib),
                    mib(r.vmm_private_kib as f64),
                    mib(r.page_cache_kib as f64),
                    r.errors
                ));
            }
            if let Some(p) = m.reduction_pct {
                s.push_str(&format!(
                    "  pmem layers use {p:.1}% less host memory than per-sandbox copies (goal >= 70: {})\n",
                    if p >= 70.0 { "met" } else { "NOT met" }
                ));
            }
        }
        for n in &self.notes {
            s.push_str(&format!("note: {n}\n"));
        }
        s
    }

    /// Draws the figures; returns their files.
    pub fn plot(&self, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
        let mut files = Vec::new();
        let sub = format!(
            "{} layers, {:.0} MB tar, {:.0} MB gzip",
            self.image.layers,
            self.image.tar_bytes as f64 / 1e6,
            self.image.blob_bytes as f64 / 1e6
        );
        if let Some(p) = &self.pull {
            let mut bars = Vec::new();
            for sys in [SHOAL, PEER] {
                if let Some(t) = median_of(&p.runs, sys, |r| r.wall_ms) {
                    bars.push(Bar::new(format!("{sys} (median ms)"), t));
                }
            }
            let path = out.path("pull");
            plot::bars(
                &path,
                &out.figure("Pull + convert to erofs layers from a loopback registry")
                    .axes("", "wall time (ms)")
                    .subtitle(sub.clone()),
                &bars,
            )?;
            files.push(path);
        }
        if let Some(f) = self.first.as_ref().filter(|f| !f.next_samples.is_empty()) {
            let path = out.path("next-sandbox");
            plot::latency_cdf(
                &path,
                &out.figure(format!(
                    "Next sandboxes of an image (restores); the first took {:.0} ms",
                    f.first_ms
                ))
                .unit("ms")
                .subtitle(sub.clone()),
                &[Series::new("shoal create (image)", f.next_samples.clone())],
            )?;
            files.push(path);
        }
        if let Some(m) = &self.memory {
            let bars: Vec<Bar> = m
                .rows
                .iter()
                .map(|r| {
                    Bar::new(
                        format!("{} x{}", r.arm, r.vms),
                        mib(r.host_total_kib as f64),
                    )
                })
                .collect();
            if !bars.is_empty() {
                let path = out.path("shared-memory");
                plot::bars(
                    &path,
                    &out.figure("Host memory of sandboxes reading the same image files")
                        .axes("", "host memory (MiB)")
                        .subtitle(format!(
                            "each reads {:.1} MB; {}",
                            m.read_bytes as f64 / 1e6,
                            m.reduction_pct
                                .map_or(String::new(), |p| format!("{p:.0}% less with pmem"))
                        )),
                    &bars,
                )?;
                files.push(path);
            }
        }
        if let Some(i) = self.idle.as_ref().filter(|i| i.held > 0) {
            let path = out.path("idle");
            let why: String = i.stopped_by.chars().take(60).collect();
            plot::bars(
                &path,
                &out.figure("Idle container sandboxes of one image")
                    .axes("", "sandboxes")
                    .subtitle(format!(
                        "{:.2} MiB host each (MemAvailable drop); stopped by: {why}",
                        mib(i.host_kib_per_sandbox as f64)
                    )),
                &[
                    Bar::new("held at once", i.held as f64),
                    Bar::new(
                        "fit in MemAvailable at that rate",
                        i.extrapolated_capacity as f64,
                    ),
                    Bar::new("goal", 1000.0),
                ],
            )?;
            files.push(path);
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(system: &str, ms: f64, written: u64) -> PullRun {
        PullRun {
            system: system.into(),
            wall_ms: ms,
            written_bytes: written,
            erofs_bytes: 0,
            intermediate_bytes: 0,
            steps: vec![],
        }
    }

    #[test]
    fn pull_ratios_are_of_medians_and_judge_the_goal() {
        let runs = vec![
            run("a", 100.0, 10),
            run("b", 200.0, 40),
            run("a", 300.0, 30),
            run("b", 220.0, 20),
            run("a", 120.0, 20),
            run("b", 210.0, 30),
        ];
        let p = PullSection::new(runs, vec![], "a", "b");
        let t = p.time_ratio_shoal_over_peer.unwrap();
        assert!((t - 120.0 / 210.0).abs() < 1e-9, "{t}");
        assert!((p.written_ratio_shoal_over_peer.unwrap() - 20.0 / 30.0).abs() < 1e-9);
        assert_eq!(p.goal_no_slower, Some(true));
        let slow = PullSection::new(vec![run("a", 3.0, 1), run("b", 2.0, 1)], vec![], "a", "b");
        assert_eq!(slow.goal_no_slower, Some(false));
        let none = PullSection::new(vec![run("a", 3.0, 1)], vec![], "a", "b");
        assert_eq!(none.time_ratio_shoal_over_peer, None);
        assert_eq!(none.goal_no_slower, None);
    }

    fn mem(arm: &str, total: i64) -> MemRow {
        MemRow {
            arm: arm.into(),
            vms: 50,
            errors: 0,
            vmm_private_kib: 0,
            page_cache_kib: total,
            host_total_kib: total,
            host_per_vm_kib: total as f64 / 50.0,
            copy_written_bytes: 0,
            read_ms: None,
            read_samples: vec![],
        }
    }

    #[test]
    fn memory_reduction_against_copies() {
        let m = MemSection {
            read_bytes: 1,
            layer_bytes: 1,
            memory_mib: 128,
            rows: vec![mem(SHARED, 250), mem(COPIES, 1000)],
            reduction_pct: None,
            goal_70pct: None,
        }
        .finish();
        assert!((m.reduction_pct.unwrap() - 75.0).abs() < 1e-9);
        assert_eq!(m.goal_70pct, Some(true));
        let one = MemSection {
            rows: vec![mem(SHARED, 250)],
            ..m
        }
        .finish();
        assert_eq!(one.reduction_pct, None);
        assert_eq!(ratio(1.0, 0.0), None);
    }

    #[test]
    fn capacity_at_a_rate() {
        assert_eq!(capacity(20 * 1024, 10 * 1024), 2048);
        assert_eq!(capacity(100, 0), 0);
    }

    #[test]
    fn every_section_is_drawn() {
        let runs = vec![run(SHOAL, 100.0, 10), run(PEER, 200.0, 20)];
        let idle = IdleSection {
            held: 10,
            stopped_by: "HTTP 429: full".into(),
            mem_available_before_mib: 1000,
            mem_available_peak_mib: 990,
            host_kib_per_sandbox: 1024,
            vmms_found: 10,
            vmm_pss_kib_mean: 500,
            fill_s: 1.0,
            probes_ok: 5,
            probes: 5,
            errors: 0,
            extrapolated_capacity: capacity(1000, 1024),
            goal_1000: false,
            goal_extrapolated: false,
        };
        let r = ImageReport {
            bench: "image",
            host_kvm: "pvm",
            unit: "ms; KiB",
            command: "shoal bench image".into(),
            image: BuiltImage {
                layers: 3,
                files: 9,
                tar_bytes: 3 << 20,
                blob_bytes: 2 << 20,
                read_bytes: 1 << 20,
                read_files: 5,
            },
            pull: Some(PullSection::new(runs, vec![], SHOAL, PEER)),
            first: Some(FirstSection {
                daemon_pull_ms: 1.0,
                first_ms: 1000.0,
                next_ms: summarize(&[10.0, 20.0]),
                next_samples: vec![10.0, 20.0],
            }),
            idle: Some(idle),
            memory: Some(
                MemSection {
                    read_bytes: 1,
                    layer_bytes: 1,
                    memory_mib: 128,
                    rows: vec![mem(SHARED, 250), mem(COPIES, 1000)],
                    reduction_pct: None,
                    goal_70pct: None,
                }
                .finish(),
            ),
            notes: vec!["a note".into()],
        };
        let text = r.render();
        assert!(
            text.contains("time shoal/peer 0.50 (goal <= 1: met)"),
            "{text}"
        );
        assert!(text.contains("75.0% less"), "{text}");
        let d = tempfile::tempdir().unwrap();
        let files = r
            .plot(&Out::for_json(
                d.path(),
                std::path::Path::new("bench-image.json"),
            ))
            .unwrap();
        assert_eq!(files.len(), 4, "{files:?}");
        assert!(files.iter().all(|f| f.is_file()), "{files:?}");
    }
}
