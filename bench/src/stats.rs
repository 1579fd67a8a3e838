//! Summary statistics for benchmark rows.

use serde::Serialize;

/// The samples behind a summary, kept for figures (not in the JSON).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    /// "shoal" or the peer's name.
    pub system: String,
    /// What was measured.
    pub metric: String,
    /// The samples, in the report's unit.
    pub values: Vec<f64>,
}

impl Samples {
    /// Samples of `metric` for `system`.
    pub fn new(system: &str, metric: &str, values: Vec<f64>) -> Self {
        Self {
            system: system.into(),
            metric: metric.into(),
            values,
        }
    }
}

/// min / median / p99 / max over `n` samples.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// Sample count.
    pub n: usize,
    /// Smallest.
    pub min: f64,
    /// 50th percentile.
    pub median: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// Summarizes `samples`; `None` when empty.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = |p: f64| {
        // `as` from f64 saturates; the clamp keeps the rank in bounds.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let i = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
        s[i]
    };
    Some(Summary {
        n: s.len(),
        min: s[0],
        median: rank(0.5),
        p90: rank(0.9),
        p99: rank(0.99),
        max: s[s.len() - 1],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        assert_eq!(summarize(&[]), None);
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.min, s.median, s.p99, s.max), (1.0, 2.0, 3.0, 3.0));
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = summarize(&v).unwrap();
        assert_eq!((s.median, s.p90, s.p99), (50.0, 90.0, 99.0));
    }
}
