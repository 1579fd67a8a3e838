//! The figures of `shoal bench fncall`: calls/s and p50/p99 latency
//! against concurrency for FnCall and its two peers, and the latency CDF
//! of each at the highest concurrency.

use crate::fncall::{FnCallReport, FNCALL, HOST, RESTORE_EXEC};
use crate::plot::{self, Out, PlotError, Series, XySeries};
use std::path::PathBuf;

impl FnCallReport {
    /// Draws the figures; returns their files.
    pub fn plot(&self, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
        let systems = [FNCALL, RESTORE_EXEC, HOST];
        let sub = format!(
            "{} HumanEval problems (canonical solutions) per level; fncall: a clone of the warm \
             python template per call; load1 {:.1}",
            self.problems, self.load1
        );
        let line = |sys: &str, y: &dyn Fn(&crate::fncall::SystemLevel) -> Option<f64>| {
            self.levels
                .iter()
                .filter(|l| l.system == sys)
                .filter_map(|l| Some((l.concurrency as f64, y(l)?)))
                .collect::<Vec<_>>()
        };
        let mut files = Vec::new();
        let thr: Vec<XySeries> = systems
            .iter()
            .enumerate()
            .map(|(i, s)| XySeries::new(*s, line(s, &|l| Some(l.calls_per_s))).color(i))
            .filter(|s| !s.points.is_empty())
            .collect();
        let p = out.path("throughput");
        plot::xy(
            &p,
            &out.figure("HumanEval calls per second against concurrency")
                .axes("concurrent clients", "calls/s")
                .subtitle(sub.clone()),
            &thr,
        )?;
        files.push(p);
        let mut lat = Vec::new();
        for (i, s) in systems.iter().enumerate() {
            let p50 = line(s, &|l| l.latency_ms.as_ref().map(|x| x.median));
            let p99 = line(s, &|l| l.latency_ms.as_ref().map(|x| x.p99));
            if p50.is_empty() {
                continue;
            }
            lat.push(XySeries::new(format!("{s} p50"), p50).color(i));
            lat.push(XySeries::new(format!("{s} p99"), p99).color(i).dashed());
        }
        let p = out.path("latency");
        plot::xy(
            &p,
            &out.figure("HumanEval call latency against concurrency")
                .axes("concurrent clients", "latency (ms)")
                .subtitle(sub.clone()),
            &lat,
        )?;
        files.push(p);
        if let Some(k) = self.levels.iter().map(|l| l.concurrency).max() {
            let series: Vec<Series> = systems
                .iter()
                .filter_map(|s| {
                    let l = self
                        .levels
                        .iter()
                        .find(|l| l.system == *s && l.concurrency == k)?;
                    (!l.samples.is_empty()).then(|| Series::new(*s, l.samples.clone()))
                })
                .collect();
            if !series.is_empty() {
                let p = out.path("cdf");
                plot::latency_cdf(
                    &p,
                    &out.figure(format!("HumanEval call latency at concurrency {k}"))
                        .unit("ms")
                        .subtitle(sub),
                    &series,
                )?;
                files.push(p);
            }
        }
        Ok(files)
    }
}
