//! Benchmarks (`shoal bench ...`): each prints a table and writes JSON
//! `{"bench":..,"host_kvm":..,"unit":..,"rows":[..]}`, comparing Shoal with
//! a peer measured in the same run.

pub mod boot;
pub mod exec;
pub mod fncall;
pub mod fncall_cost;
mod fncall_plot;
pub mod fork;
pub mod hostmem;
pub mod image;
pub mod image_mem;
pub mod image_oci;
pub mod image_report;
pub mod jail_ab;
pub mod load;
pub mod plot;
pub mod pmem;
pub mod pmem_report;
pub mod prewarm;
pub mod restore;
pub mod restore_rate;
pub mod stats;

use serde::Serialize;

/// One row: a system's summary for one metric.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// "shoal" or the peer's name.
    pub system: String,
    /// What was measured.
    pub metric: String,
    /// Samples.
    pub n: usize,
    /// Smallest.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// Formats rows as a fixed-width table.
pub fn table(rows: &[Row], unit: &str) -> String {
    let mut s = format!(
        "{:<14} {:<22} {:>4} {:>10} {:>10} {:>10} {:>10}  ({unit})\n",
        "SYSTEM", "METRIC", "N", "MIN", "MEDIAN", "P99", "MAX"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<14} {:<22} {:>4} {:>10.2} {:>10.2} {:>10.2} {:>10.2}\n",
            r.system, r.metric, r.n, r.min, r.median, r.p99, r.max
        ));
    }
    s
}
