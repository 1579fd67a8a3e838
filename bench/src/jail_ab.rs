//! Jailer A/B (`shoal bench restore --jail`): the same templates restored
//! with and without `shoal-jailer`, interleaved one by one in one run so
//! that both see the same host state; restore latency (to the VMM's
//! `main`, which splits the jail's set-up from the VMM's own work; to vCPUs
//! running; to the guest's first output) p50/p90/p99 and the sustained restore rate
//! at each concurrency. A jailed restore's time includes everything the
//! daemon does for it: the uid lease, the sandbox directory's owner, the
//! jailer's namespaces, mounts, cgroup and credential changes.
//!
//! Interleaved with those, restores into pre-warmed VMMs, plain and
//! jailed (the daemon's VMM stock, `shoald --vmm-stock`: the jail and the
//! KVM VM made before the sandbox is asked for), timed from the `restore`
//! request; and the restore a daemon's create waits for, through the
//! runtime's microVM backend as the daemon calls it (`restore` of a
//! template vs a stocked VMM's `restore`), each plain and jailed.

use crate::restore_rate::{one_restore_latency, rate_with};
use crate::stats::{summarize, Summary};
use serde::Serialize;
use shoal_runtime::jail::{self, JailConfig};
use shoal_runtime::template::TemplateError;
use std::path::Path;

/// What the A/B runs.
#[derive(Debug, Clone)]
pub struct AbOpts {
    /// Our VMM.
    pub vmm: std::path::PathBuf,
    /// Scratch directory.
    pub workdir: std::path::PathBuf,
    /// Restores timed each way.
    pub restores: usize,
    /// Concurrency levels for the rate.
    pub concurrency: Vec<usize>,
    /// Restores per level each way.
    pub rate_restores: usize,
    /// The images the templates map (outside their directories).
    pub images: Vec<std::path::PathBuf>,
}

/// One latency metric, both ways.
#[derive(Debug, Serialize)]
pub struct AbRow {
    /// What was measured.
    pub metric: String,
    /// Without the jailer (ms).
    pub plain: Summary,
    /// Through the jailer (ms).
    pub jailed: Summary,
    /// Jailed p50 minus plain p50 (ms).
    pub delta_p50_ms: f64,
}

/// One latency metric, four ways: new VMM process or pre-warmed (stocked),
/// each plain and jailed (ms; `None` where every try failed).
#[derive(Debug, Serialize)]
pub struct StockRow {
    /// What was measured.
    pub metric: String,
    /// New VMM process, no jailer.
    pub plain_cold: Option<Summary>,
    /// New VMM process through the jailer.
    pub jailed_cold: Option<Summary>,
    /// Pre-warmed VMM, no jailer.
    pub plain_prewarmed: Option<Summary>,
    /// Pre-warmed VMM in its jail (a stocked VMM).
    pub jailed_prewarmed: Option<Summary>,
    /// Jailed pre-warmed p50 minus plain cold p50 (ms): what the stock
    /// leaves of the jail's cost (negative: faster than a plain cold
    /// restore).
    pub stocked_vs_plain_cold_p50_ms: Option<f64>,
}

/// The sustained restore rate at one concurrency, both ways.
#[derive(Debug, Serialize)]
pub struct AbRate {
    /// Concurrent restores.
    pub concurrency: usize,
    /// Restores per second without the jailer.
    pub plain_per_second: f64,
    /// Restores per second through the jailer.
    pub jailed_per_second: f64,
    /// Failed restores (plain, jailed).
    pub errors: (usize, usize),
}

/// The A/B report.
#[derive(Debug, Serialize)]
pub struct JailAb {
    /// Latency rows.
    pub rows: Vec<AbRow>,
    /// Rates.
    pub rates: Vec<AbRate>,
    /// Failed latency restores (plain, jailed).
    pub errors: (usize, usize),
    /// The four ways (new VMM / pre-warmed, plain / jailed), same run.
    pub stock_rows: Vec<StockRow>,
    /// Failed restores of the four ways (in `stock_rows` order).
    pub stock_errors: [usize; 4],
    /// The samples behind `rows`: system "shoal unjailed" or "shoal jailed"
    /// (figures only).
    #[serde(skip)]
    pub samples: Vec<crate::stats::Samples>,
}

/// Runs the A/B on the bench's templates (made readable to jailed VMMs
/// first, as the daemon makes its templates).
pub fn run(
    o: &AbOpts,
    j: &JailConfig,
    printer: &Path,
    idle: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<JailAb, TemplateError> {
    // The images the templates map are outside their directories.
    let images = &o.images;
    for t in [printer, idle] {
        jail::write_files(t, images)
            .and_then(|()| jail::share_template(t))
            .map_err(|e| TemplateError::NotReady(format!("jail: {e}")))?;
    }
    let lat_dir = o.workdir.join("jail-lat");
    std::fs::create_dir_all(&lat_dir).map_err(|e| TemplateError::NotReady(e.to_string()))?;
    // All four ways, interleaved one by one.
    let (v, errors, stock_rows, stock_errors, stock_samples) =
        four_ways(o, j, printer, &lat_dir, progress);
    let mut rows = vec![];
    let mut samples = stock_samples;
    for (m, metric) in [
        "restore_to_vmm_start",
        "restore_to_vcpu_run",
        "restore_to_first_output",
    ]
    .iter()
    .enumerate()
    {
        if let (Some(plain), Some(jailed)) = (summarize(&v[0][m]), summarize(&v[1][m])) {
            for (system, vals) in [("shoal unjailed", &v[0][m]), ("shoal jailed", &v[1][m])] {
                samples.push(crate::stats::Samples::new(system, metric, vals.clone()));
            }
            rows.push(AbRow {
                metric: (*metric).into(),
                delta_p50_ms: jailed.median - plain.median,
                plain,
                jailed,
            });
        }
    }
    let mut rates = vec![];
    for &k in &o.concurrency {
        let a = rate_with(&o.vmm, idle, &o.workdir, k, o.rate_restores, None);
        let b = rate_with(&o.vmm, idle, &o.workdir, k, o.rate_restores, Some(j));
        progress(&format!(
            "K={k}: {:.0} restores/s plain, {:.0} jailed",
            a.per_second, b.per_second
        ));
        rates.push(AbRate {
            concurrency: k,
            plain_per_second: a.per_second,
            jailed_per_second: b.per_second,
            errors: (a.errors, b.errors),
        });
    }
    Ok(JailAb {
        rows,
        rates,
        errors,
        stock_rows,
        stock_errors,
        samples,
    })
}

/// The four ways' systems, in [`StockRow`] order.
pub const WAYS: [&str; 4] = [
    "shoal unjailed",
    "shoal jailed",
    "shoal unjailed pre-warmed",
    "shoal jailed pre-warmed (stocked)",
];

/// Cold (new VMM process) and pre-warmed restores and the daemon's create
/// restores, plain and jailed, interleaved one by one: the cold ones'
/// samples per side (VMM start, vCPU run, first output) and failures, and
/// the four ways' rows.
#[allow(clippy::type_complexity)] // one caller, which takes it apart at once
fn four_ways(
    o: &AbOpts,
    j: &JailConfig,
    printer: &Path,
    lat_dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> (
    [[Vec<f64>; 3]; 2],
    (usize, usize),
    Vec<StockRow>,
    [usize; 4],
    Vec<crate::stats::Samples>,
) {
    use shoal_runtime::backend::{microvm::MicroVm, SandboxBackend, Source};
    let mem = std::fs::metadata(printer.join("memory")).map_or(0, |m| m.len());
    let mem_mib = u32::try_from(mem >> 20).unwrap_or(u32::MAX);
    // [way] -> (vcpu run, first output, create's restore)
    let mut w: [[Vec<f64>; 3]; 4] = Default::default();
    let mut cold: [[Vec<f64>; 3]; 2] = Default::default();
    let mut cold_errors = (0, 0);
    let cold_plain_sock = o.workdir.join("ab-plain.sock");
    let cold_jail_sock = lat_dir.join("ab.sock");
    let mut errors = [0usize; 4];
    let plain_sock = o.workdir.join("ab-warm.sock");
    let jail_sock = lat_dir.join("ab-warm.sock");
    let layout = shoal_images::artifacts::Layout::at(o.workdir.join("no-artifacts"));
    let backends = [
        MicroVm::new(&o.vmm, layout.clone()),
        MicroVm::new(&o.vmm, layout).with_jail(Some(j.clone())),
    ];
    let be_dir = o.workdir.join("ab-sandboxes");
    let _ = std::fs::create_dir_all(&be_dir);
    for i in 0..o.restores {
        for jailed in [false, true] {
            let (sock, jl) = match jailed {
                false => (&cold_plain_sock, None),
                true => (&cold_jail_sock, Some(j)),
            };
            match one_restore_latency(&o.vmm, printer, sock, jl) {
                Ok(t) => {
                    let side = &mut cold[usize::from(jailed)];
                    side[0].push(t.vmm_start);
                    side[1].push(t.vcpu_run);
                    side[2].push(t.first_output);
                }
                Err(e) => {
                    match jailed {
                        false => cold_errors.0 += 1,
                        true => cold_errors.1 += 1,
                    }
                    progress(&format!("restore {i} (jailed: {jailed}): {e}"));
                }
            }
            let way = 2 + usize::from(jailed);
            let (sock, jl) = match jailed {
                false => (&plain_sock, None),
                true => match crate::restore_rate::jail_of(j, &jail_sock, printer) {
                    Ok(jl) => (&jail_sock, Some(jl)),
                    Err(e) => {
                        errors[way] += 1;
                        progress(&format!("pre-warmed {i} jail: {e}"));
                        continue;
                    }
                },
            };
            match crate::prewarm::one_prewarmed_latency(&o.vmm, printer, sock, mem_mib, jl) {
                Ok((run, _reply, out)) => {
                    w[way][0].push(run);
                    w[way][1].push(out);
                }
                Err(e) => {
                    errors[way] += 1;
                    progress(&format!("pre-warmed restore {i} (jailed: {jailed}): {e}"));
                }
            }
            // The daemon's create: a template's restore, then a stocked
            // VMM's, through the backend.
            let b = &backends[usize::from(jailed)];
            let from = Source::Template(printer.into());
            let dir = be_dir.join(format!("cold-{i}-{jailed}"));
            let t0 = std::time::Instant::now();
            match b.restore(&dir, &from, None) {
                Ok(vm) => {
                    w[usize::from(jailed)][2].push(t0.elapsed().as_secs_f64() * 1e3);
                    vm.destroy(std::time::Duration::from_secs(2));
                }
                Err(e) => progress(&format!("create {i} (jailed: {jailed}): {e}")),
            }
            let _ = std::fs::remove_dir_all(&dir);
            let dir = be_dir.join(format!("stock-{i}-{jailed}"));
            match b.stock(&dir, printer, 1, mem_mib, None) {
                Ok(Some(s)) => {
                    std::thread::sleep(crate::prewarm::SETTLE);
                    let t0 = std::time::Instant::now();
                    match s.restore(printer) {
                        Ok(vm) => {
                            w[way][2].push(t0.elapsed().as_secs_f64() * 1e3);
                            vm.destroy(std::time::Duration::from_secs(2));
                        }
                        Err(e) => progress(&format!("stocked create {i}: {e}")),
                    }
                }
                Ok(None) => {}
                Err(e) => progress(&format!("stocking {i} (jailed: {jailed}): {e}")),
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    for (k, c) in cold.iter().enumerate() {
        w[k][0].clone_from(&c[1]);
        w[k][1].clone_from(&c[2]);
        errors[k] = [cold_errors.0, cold_errors.1][k];
    }
    let mut rows = vec![];
    let mut samples = vec![];
    for (m, metric) in [
        "restore_to_vcpu_run",
        "restore_to_first_output",
        "create_restore",
    ]
    .iter()
    .enumerate()
    {
        let s: Vec<Option<Summary>> = w.iter().map(|x| summarize(&x[m])).collect();
        for (k, x) in w.iter().enumerate() {
            // The cold ones' samples of the first two are the A/B's own.
            if k >= 2 || m == 2 {
                samples.push(crate::stats::Samples::new(WAYS[k], metric, x[m].clone()));
            }
        }
        rows.push(StockRow {
            metric: (*metric).into(),
            stocked_vs_plain_cold_p50_ms: match (&s[3], &s[0]) {
                (Some(a), Some(b)) => Some(a.median - b.median),
                _ => None,
            },
            plain_cold: s[0].clone(),
            jailed_cold: s[1].clone(),
            plain_prewarmed: s[2].clone(),
            jailed_prewarmed: s[3].clone(),
        });
    }
    (cold, cold_errors, rows, errors, samples)
}

impl JailAb {
    /// Human-readable summary.
    pub fn render(&self) -> String {
        let mut s = String::from("jailer A/B (same run, interleaved):\n");
        for r in &self.rows {
            s.push_str(&format!(
                "  {:<24} plain p50 {:.2} p90 {:.2} ms | jailed p50 {:.2} p90 {:.2} ms | p50 +{:.2} ms (n={})\n",
                r.metric, r.plain.median, r.plain.p90, r.jailed.median, r.jailed.p90,
                r.delta_p50_ms, r.jailed.n
            ));
        }
        let p = |x: &Option<Summary>| {
            x.as_ref()
                .map_or("-".to_string(), |s| format!("{:.2}/{:.2}", s.median, s.p90))
        };
        s.push_str(
            "  four ways, p50/p90 ms: new VMM plain | new VMM jailed | pre-warmed plain | \
             pre-warmed jailed (stocked)\n",
        );
        for r in &self.stock_rows {
            s.push_str(&format!(
                "  {:<24} {} | {} | {} | {} | stocked vs plain new p50 {:+.2} ms\n",
                r.metric,
                p(&r.plain_cold),
                p(&r.jailed_cold),
                p(&r.plain_prewarmed),
                p(&r.jailed_prewarmed),
                r.stocked_vs_plain_cold_p50_ms.unwrap_or(f64::NAN)
            ));
        }
        for r in &self.rates {
            s.push_str(&format!(
                "  rate, {:>2} concurrent: plain {:.1}/s, jailed {:.1}/s (failed: plain {}, jailed {})\n",
                r.concurrency, r.plain_per_second, r.jailed_per_second, r.errors.0, r.errors.1
            ));
        }
        s
    }
}
