//! Jailer A/B (`shoal bench restore --jail`): the same templates restored
//! with and without `shoal-jailer`, interleaved one by one in one run so
//! that both see the same host state; restore latency (to the VMM's
//! `main`, which splits the jail's set-up from the VMM's own work; to vCPUs
//! running; to the guest's first output) p50/p90/p99 and the sustained restore rate
//! at each concurrency. A jailed restore's time includes everything the
//! daemon does for it: the uid lease, the sandbox directory's owner, the
//! jailer's namespaces, mounts, cgroup and credential changes.

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
    let plain_sock = o.workdir.join("ab-plain.sock");
    let jail_sock = lat_dir.join("ab.sock");
    let mut v: [[Vec<f64>; 3]; 2] = Default::default();
    let mut errors = (0, 0);
    for i in 0..o.restores {
        for jailed in [false, true] {
            let (sock, jl) = match jailed {
                false => (&plain_sock, None),
                true => (&jail_sock, Some(j)),
            };
            match one_restore_latency(&o.vmm, printer, sock, jl) {
                Ok(t) => {
                    let side = &mut v[usize::from(jailed)];
                    side[0].push(t.vmm_start);
                    side[1].push(t.vcpu_run);
                    side[2].push(t.first_output);
                }
                Err(e) => {
                    match jailed {
                        false => errors.0 += 1,
                        true => errors.1 += 1,
                    }
                    progress(&format!("restore {i} (jailed: {jailed}): {e}"));
                }
            }
        }
    }
    let mut rows = vec![];
    let mut samples = vec![];
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
        samples,
    })
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
        for r in &self.rates {
            s.push_str(&format!(
                "  rate, {:>2} concurrent: plain {:.1}/s, jailed {:.1}/s (errors {}/{})\n",
                r.concurrency, r.plain_per_second, r.jailed_per_second, r.errors.0, r.errors.1
            ));
        }
        s
    }
}
