//! `shoal bench restore`: snapshot create time and size, restore latency
//! (process start to vCPUs running, and to the guest's first output after
//! resume), sustained restore rate with K concurrent restores, and host
//! memory (PSS) per restored idle VM.

use super::{table, Row};
use crate::restore_rate::one_restore_latency;
pub use crate::restore_rate::{rate, rate_with, Rate};
use crate::stats::{summarize, Samples};
use serde::Serialize;
use shoal_runtime::jail::JailConfig;
use shoal_runtime::launch::BootSpec;
use shoal_runtime::template::{self, TemplateError};
use shoal_runtime::vmm_process::{Io, VmmProcess};
use std::path::PathBuf;
use std::time::Duration;

/// Options.
#[derive(Debug, Clone)]
pub struct RestoreBenchOpts {
    /// The guest to boot for the templates (its init args are replaced).
    pub spec: BootSpec,
    /// Our VMM.
    pub vmm: PathBuf,
    /// Where templates go.
    pub workdir: PathBuf,
    /// Sequential restores timed.
    pub restores: usize,
    /// Concurrency levels for the rate test.
    pub concurrency: Vec<usize>,
    /// Restores per concurrency level.
    pub rate_restores: usize,
    /// Idle VMs kept alive for the PSS measurement.
    pub pss_vms: usize,
    /// Also measure restores through this jailer, interleaved with
    /// unjailed ones in the same run ([`crate::jail_ab`]).
    pub jail: Option<JailConfig>,
}

/// The JSON report.
#[derive(Debug, Serialize)]
pub struct RestoreReport {
    /// Always "restore".
    pub bench: &'static str,
    /// "pvm" or "hardware".
    pub host_kvm: &'static str,
    /// Always "ms".
    pub unit: &'static str,
    /// Latency rows.
    pub rows: Vec<Row>,
    /// Pause + save time of the template snapshot (ms).
    pub snapshot_create_ms: f64,
    /// State file bytes.
    pub snapshot_state_bytes: u64,
    /// Memory file bytes (apparent).
    pub snapshot_memory_bytes: u64,
    /// Sustained rates.
    pub rates: Vec<Rate>,
    /// Mean PSS of a restored idle VM (KiB).
    pub pss_kib_mean: f64,
    /// Largest PSS (KiB).
    pub pss_kib_max: f64,
    /// Idle VMs measured for PSS.
    pub pss_vms: usize,
    /// Failed restores in the latency runs.
    pub latency_errors: usize,
    /// Restores into pre-warmed VMs (no new KVM VM per restore).
    pub prewarmed: Option<super::prewarm::PrewarmReport>,
    /// Jailed vs unjailed restores, interleaved in this run.
    pub jail_ab: Option<crate::jail_ab::JailAb>,
    /// Guest memory of the VMs (MiB).
    pub memory_mib: u32,
    /// The samples behind `rows` (figures only).
    #[serde(skip)]
    pub samples: Vec<Samples>,
}

fn pss_kib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    s.lines()
        .find(|l| l.starts_with("Pss:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Runs the benchmark.
pub fn run(
    o: &RestoreBenchOpts,
    progress: &mut dyn FnMut(&str),
) -> Result<RestoreReport, TemplateError> {
    let idle_dir = o.workdir.join("idle");
    let printer_dir = o.workdir.join("printer");
    let boot_limit = Duration::from_secs(600);
    progress("booting the idle template (init, no command)...");
    let mut idle = o.spec.clone();
    idle.init_args = vec![];
    let info = template::make(
        &idle,
        &o.vmm,
        &idle_dir,
        shoal_runtime::launch::INIT_MARKER,
        boot_limit,
    )?;
    progress(&format!(
        "idle template: pause {:.1} ms + save {:.1} ms, state {} B, memory {} B",
        info.pause_ms, info.save_ms, info.state_bytes, info.memory_bytes
    ));
    progress("booting the printer template (prints continuously)...");
    let mut printer = o.spec.clone();
    printer.init_args = ["/bin/busybox", "sh", "-c", "\"while :; do echo x; done\""]
        .map(String::from)
        .to_vec();
    template::make_with(&printer, &o.vmm, &printer_dir, "x", boot_limit, false)?;

    let sock = o.workdir.join("lat.sock");
    let (mut run_ms, mut out_ms, mut errors) = (vec![], vec![], 0);
    for i in 0..o.restores {
        match one_restore_latency(&o.vmm, &printer_dir, &sock, None) {
            Ok(t) => {
                run_ms.push(t.vcpu_run);
                out_ms.push(t.first_output);
            }
            Err(e) => {
                errors += 1;
                progress(&format!("restore {i}: {e}"));
            }
        }
    }
    let mut rows = vec![];
    let mut samples = vec![];
    for (metric, v) in [
        ("restore_to_vcpu_run", &run_ms),
        ("restore_to_first_output", &out_ms),
    ] {
        if let Some(s) = summarize(v) {
            samples.push(Samples::new("shoal", metric, v.clone()));
            rows.push(Row {
                system: "shoal".into(),
                metric: metric.into(),
                n: s.n,
                min: s.min,
                median: s.median,
                p99: s.p99,
                max: s.max,
            });
        }
    }
    let mut rates = vec![];
    for &k in &o.concurrency {
        let r = rate(&o.vmm, &idle_dir, &o.workdir, k, o.rate_restores);
        progress(&format!(
            "K={k}: {:.0} restores/s ({} errors)",
            r.per_second, r.errors
        ));
        rates.push(r);
    }
    progress(&format!(
        "keeping {} idle restored VMs for PSS...",
        o.pss_vms
    ));
    let mut vms = vec![];
    for i in 0..o.pss_vms {
        let mut r = template::spawn_restore(
            VmmProcess::restore(&o.vmm, &idle_dir)
                .api_sock(o.workdir.join(format!("pss-{i}.sock")))
                .stdout(Io::Null),
        )?;
        r.wait_ready(Duration::from_secs(30))?;
        vms.push(r);
    }
    std::thread::sleep(Duration::from_millis(500));
    let pss: Vec<f64> = vms.iter().filter_map(|r| pss_kib(r.child.id())).collect();
    for r in vms {
        r.shutdown();
    }
    let jail_ab = match &o.jail {
        Some(j) => {
            progress("jailer A/B: restores with and without shoal-jailer, interleaved...");
            let mut images = vec![o.spec.root.clone()];
            images.extend(o.spec.extra_pmem.iter().cloned());
            let ab = crate::jail_ab::AbOpts {
                vmm: o.vmm.clone(),
                workdir: o.workdir.clone(),
                restores: o.restores,
                concurrency: o.concurrency.clone(),
                rate_restores: o.rate_restores,
                images,
            };
            Some(crate::jail_ab::run(
                &ab,
                j,
                &printer_dir,
                &idle_dir,
                progress,
            )?)
        }
        None => None,
    };
    progress("restores into pre-warmed VMs...");
    let workers = o.concurrency.iter().copied().max().unwrap_or(2).clamp(1, 8);
    let prewarmed = super::prewarm::run(
        &o.vmm,
        &idle_dir,
        &o.workdir,
        o.spec.memory_mib,
        o.restores,
        workers,
        (o.rate_restores / workers).max(1),
    )
    .ok();
    Ok(RestoreReport {
        bench: "restore",
        host_kvm: vmm::host::kvm_kind().as_str(),
        unit: "ms",
        rows,
        snapshot_create_ms: info.pause_ms + info.save_ms,
        snapshot_state_bytes: info.state_bytes,
        snapshot_memory_bytes: info.memory_bytes,
        rates,
        pss_kib_mean: if pss.is_empty() {
            0.0
        } else {
            pss.iter().sum::<f64>() / pss.len() as f64
        },
        pss_kib_max: pss.iter().cloned().fold(0.0, f64::max),
        pss_vms: pss.len(),
        latency_errors: errors,
        prewarmed,
        jail_ab,
        memory_mib: o.spec.memory_mib,
        samples,
    })
}

impl RestoreReport {
    /// Human-readable summary.
    pub fn render(&self) -> String {
        let mut s = format!("restore benchmark, host KVM: {}\n", self.host_kvm);
        s.push_str(&table(&self.rows, self.unit));
        s.push_str(&format!(
            "snapshot create: {:.1} ms; state {} B; memory {} MiB\n",
            self.snapshot_create_ms,
            self.snapshot_state_bytes,
            self.snapshot_memory_bytes >> 20
        ));
        for r in &self.rates {
            s.push_str(&format!(
                "sustained rate, {:>3} concurrent: {:>7.1} restores/s ({} errors / {})\n",
                r.concurrency, r.per_second, r.errors, r.restores
            ));
        }
        s.push_str(&format!(
            "PSS per restored idle VM ({} VMs): mean {:.2} MiB, max {:.2} MiB\n",
            self.pss_vms,
            self.pss_kib_mean / 1024.0,
            self.pss_kib_max / 1024.0
        ));
        if let Some(ab) = &self.jail_ab {
            s.push_str(&ab.render());
        }
        if let Some(p) = &self.prewarmed {
            if let Some(r) = &p.restore_ms {
                s.push_str(&format!(
                    "pre-warmed VM restore (request to vCPUs running): median {:.2} ms, p99 {:.2} ms (n={})\n",
                    r.median, r.p99, r.n
                ));
            }
            if let Some(r) = &p.request_rtt_ms {
                s.push_str(&format!(
                    "pre-warmed VM restore request round trip: median {:.2} ms, p99 {:.2} ms\n",
                    r.median, r.p99
                ));
            }
            s.push_str(&format!(
                "pre-warmed pool of {}: {:.0} restores/s ({} errors)\n",
                p.workers, p.rate_per_second, p.errors
            ));
        }
        s
    }
}
