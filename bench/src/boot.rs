//! `shoal bench boot`: VMM start to first guest instruction, first console
//! line, init marker and VMM exit, for Shoal and QEMU microvm booting the
//! same kernel and root image in the same run (runs interleaved).

use super::{table, Row};
use crate::stats::{summarize, Samples};
use serde::Serialize;
use shoal_runtime::launch::{self, BootRun, BootSpec, LaunchError, Monitor};
use std::time::Duration;

/// Options of one benchmark run.
#[derive(Debug, Clone)]
pub struct BootBenchOpts {
    /// What to boot (init args should make the guest reboot at once).
    pub spec: BootSpec,
    /// Our VMM binary.
    pub vmm: std::path::PathBuf,
    /// Runs per system.
    pub runs: usize,
    /// Also measure QEMU.
    pub qemu: bool,
    /// Kernel words for QEMU's guest (the CPU profile's work-arounds).
    pub qemu_kernel_args: String,
    /// Per-boot limit.
    pub timeout: Duration,
}

/// The JSON report.
#[derive(Debug, Serialize)]
pub struct BootReport {
    /// Always "boot".
    pub bench: &'static str,
    /// "pvm" or "hardware".
    pub host_kvm: &'static str,
    /// Always "ms".
    pub unit: &'static str,
    /// Summaries.
    pub rows: Vec<Row>,
    /// Peer median / Shoal median, per metric both measured.
    pub ratio_peer_over_shoal: Vec<(String, f64)>,
    /// Monitor memory (RSS minus guest RAM) at the init marker, KiB, median.
    pub own_memory_kib: Vec<(String, u64)>,
    /// Failed boots per system.
    pub failures: Vec<(String, usize)>,
    /// The samples behind `rows` (figures only).
    #[serde(skip)]
    pub samples: Vec<Samples>,
}

const METRICS: [&str; 4] = [
    "first_instruction",
    "first_console_line",
    "init_marker",
    "vmm_exit",
];

fn metric(r: &BootRun, m: &str) -> Option<f64> {
    match m {
        "first_instruction" => r.first_instruction_ms,
        "first_console_line" => r.first_line_ms,
        "init_marker" => r.marker_ms,
        _ => Some(r.exit_ms),
    }
}

/// Runs the benchmark; `progress` gets one line per boot.
pub fn run(o: &BootBenchOpts, progress: &mut dyn FnMut(&str)) -> Result<BootReport, LaunchError> {
    let mut monitors = vec![Monitor::Shoal(o.vmm.clone())];
    if o.qemu {
        monitors.push(Monitor::QemuMicrovm {
            kernel_args: o.qemu_kernel_args.clone(),
        });
    }
    let mut results: Vec<Vec<BootRun>> = vec![vec![]; monitors.len()];
    let mut failures = vec![0usize; monitors.len()];
    for i in 0..o.runs {
        for (k, m) in monitors.iter().enumerate() {
            match launch::boot(&o.spec, m, o.timeout, &mut |_| {}) {
                Ok(r) if r.marker_ms.is_some() && r.status.is_some_and(|s| s.success()) => {
                    progress(&format!(
                        "{} run {}/{}: init marker {:.1} ms, exit {:.1} ms",
                        m.name(),
                        i + 1,
                        o.runs,
                        r.marker_ms.unwrap_or(0.0),
                        r.exit_ms
                    ));
                    results[k].push(r);
                }
                Ok(r) => {
                    failures[k] += 1;
                    progress(&format!(
                        "{} run {}: no init marker or failed exit ({:?})",
                        m.name(),
                        i + 1,
                        r.status
                    ));
                }
                Err(e) => {
                    failures[k] += 1;
                    progress(&format!("{} run {}: {e}", m.name(), i + 1));
                }
            }
        }
    }
    let mut rows = Vec::new();
    let mut medians = vec![];
    let mut own = vec![];
    let mut samples = vec![];
    for (k, m) in monitors.iter().enumerate() {
        for met in METRICS {
            let v: Vec<f64> = results[k].iter().filter_map(|r| metric(r, met)).collect();
            if let Some(s) = summarize(&v) {
                samples.push(Samples::new(m.name(), met, v.clone()));
                medians.push((m.name(), met, s.median));
                rows.push(Row {
                    system: m.name().into(),
                    metric: met.into(),
                    n: s.n,
                    min: s.min,
                    median: s.median,
                    p99: s.p99,
                    max: s.max,
                });
            }
        }
        let mem: Vec<f64> = results[k]
            .iter()
            .filter_map(|r| r.own_rss_kib.map(|x| x as f64))
            .collect();
        if let Some(s) = summarize(&mem) {
            // A median of KiB counts: non-negative and far below 2^53.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let kib = s.median as u64;
            own.push((m.name().to_string(), kib));
        }
    }
    let mut ratios = vec![];
    for met in METRICS {
        let get = |sys: &str| {
            medians
                .iter()
                .find(|(s, m, _)| *s == sys && *m == met)
                .map(|x| x.2)
        };
        if let (Some(a), Some(b)) = (get("shoal"), get("qemu-microvm")) {
            if a > 0.0 {
                ratios.push((met.to_string(), b / a));
            }
        }
    }
    Ok(BootReport {
        bench: "boot",
        host_kvm: vmm::host::kvm_kind().as_str(),
        unit: "ms",
        rows,
        ratio_peer_over_shoal: ratios,
        own_memory_kib: own,
        failures: monitors
            .iter()
            .zip(failures)
            .map(|(m, f)| (m.name().to_string(), f))
            .collect(),
        samples,
    })
}

impl BootReport {
    /// Human-readable summary.
    pub fn render(&self) -> String {
        let mut s = format!("boot benchmark, host KVM: {}\n", self.host_kvm);
        s.push_str(&table(&self.rows, self.unit));
        for (m, r) in &self.ratio_peer_over_shoal {
            s.push_str(&format!("ratio qemu-microvm/shoal {m:<20} {r:>6.2}x\n"));
        }
        for (sys, kib) in &self.own_memory_kib {
            s.push_str(&format!(
                "{sys:<14} own memory at init (RSS - guest RAM): {:.2} MiB\n",
                *kib as f64 / 1024.0
            ));
        }
        for (sys, f) in &self.failures {
            if *f > 0 {
                s.push_str(&format!("{sys}: {f} failed boots\n"));
            }
        }
        s
    }
}
