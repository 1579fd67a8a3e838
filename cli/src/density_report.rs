//! `shoal bench density`'s report: per configuration the memory over time,
//! its peak and time integral and their ratios to "reclaim off", the idle
//! sandboxes' private guest RAM; the latency cases; the goals; the table
//! and the figures.

use crate::density_mem::Sample;
use crate::density_plan::{self as dp, MixSpec, Plan, Role};
use serde::{Deserialize, Serialize};
use shoal_bench::plot::{self, Bar, Out, PlotError, Series, XySeries};
use shoal_bench::stats::summarize;
use shoal_client::api::Priority;
use std::fmt::Write;
use std::path::PathBuf;

/// The idle sandboxes' memory at the end of a configuration (KiB per VMM).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct IdleMem {
    /// VMMs read.
    pub n: usize,
    /// Guest RAM held privately (anonymous + eviction file pages back in RAM).
    pub private_kib_p50: Option<f64>,
    pub private_kib_max: Option<f64>,
    /// Those at most 1 MiB.
    pub private_within_1mib: usize,
    /// The whole VMM's anonymous memory (its own heap and stacks too).
    pub anon_kib_p50: Option<f64>,
    pub anon_kib_max: Option<f64>,
}

impl IdleMem {
    /// From per-VMM readings.
    pub fn of(private: &[f64], anon: &[f64]) -> IdleMem {
        let p = summarize(private);
        let a = summarize(anon);
        IdleMem {
            n: private.len(),
            private_kib_p50: p.as_ref().map(|s| s.median),
            private_kib_max: p.as_ref().map(|s| s.max),
            private_within_1mib: private.iter().filter(|&&k| k <= 1024.0).count(),
            anon_kib_p50: a.as_ref().map(|s| s.median),
            anon_kib_max: a.as_ref().map(|s| s.max),
        }
    }
}

/// One configuration's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfigResult {
    pub name: String,
    pub label: String,
    pub daemon_args: String,
    pub sandboxes: usize,
    pub created: usize,
    /// Seconds to create every sandbox and run its first exec.
    pub create_s: f64,
    /// The replay's window (s since the configuration's start): from the
    /// end of the creates, its planned length.
    pub replay_s: (f64, f64),
    /// When the last request of the replay finished (s), at or after the
    /// window's end.
    pub replay_end_s: f64,
    pub failures: usize,
    pub first_failures: Vec<String>,
    pub alloc_execs: usize,
    pub alloc_exec_ms_p50: Option<f64>,
    pub busy_execs: usize,
    pub busy_exec_ms_p50: Option<f64>,
    /// How late the latest request started (s).
    pub lag_s_max: f64,
    /// Sum of the VMMs' PSS: peak over the whole run, integral and mean
    /// over the replay.
    pub peak_pss_mib: f64,
    pub integral_pss_mib_s: f64,
    pub mean_pss_mib: f64,
    /// Host used memory (MemTotal − MemAvailable) less its value before
    /// the creates: peak and integral over the replay (others' use too).
    pub host_used_base_mib: f64,
    pub peak_host_used_mib: f64,
    pub integral_host_used_mib_s: f64,
    pub idle: IdleMem,
    /// The daemon's `shoal_balloon_*` and `shoal_evict_*` at the end.
    pub counters: std::collections::BTreeMap<String, f64>,
    pub samples: Vec<Sample>,
}

/// One latency case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyCase {
    pub label: String,
    pub burners: usize,
    pub best_effort: bool,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    /// p50 over the quiet host's p50, less 1.
    pub inflation: Option<f64>,
    pub ms: Vec<f64>,
}

/// The latency part.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Latency {
    pub cores: usize,
    pub cases: Vec<LatencyCase>,
}

impl Latency {
    /// From the classes' cases (the quiet host first).
    pub fn of(cores: usize, cases: Vec<crate::bench_classes::Case>) -> Latency {
        let p50 = |v: &[f64]| summarize(v).map(|s| s.median);
        let floor = cases.first().and_then(|c| p50(&c.ms));
        let cases = cases
            .into_iter()
            .map(|c| {
                let s = summarize(&c.ms);
                let m = s.as_ref().map(|s| s.median);
                LatencyCase {
                    label: c.label,
                    burners: c.burners,
                    best_effort: c.priority == Priority::BestEffort,
                    p50_ms: m,
                    p90_ms: s.as_ref().map(|s| s.p90),
                    inflation: m
                        .zip(floor)
                        .and_then(|(m, f)| dp::ratio(m, f))
                        .map(|r| r - 1.0),
                    ms: c.ms,
                }
            })
            .collect();
        Latency { cores, cases }
    }

    /// The inflation with `burners` best-effort (or latency) burners.
    fn inflation(&self, burners: usize, best_effort: bool) -> Option<f64> {
        self.cases
            .iter()
            .find(|c| c.burners == burners && c.best_effort == best_effort)
            .and_then(|c| c.inflation)
    }
}

/// A goal of issue 21 and where this run stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Goal {
    pub goal: String,
    pub measured: String,
    pub met: Option<bool>,
}

/// The report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DensityReport {
    pub host: String,
    pub mix: MixSpec,
    pub idle: usize,
    pub allocating: usize,
    pub busy: usize,
    pub requests: usize,
    pub memory_mib: u32,
    pub evict_idle_s: u64,
    pub configs: Vec<ConfigResult>,
    /// Per configuration: its integral (and peak) over "reclaim off"'s.
    pub integral_ratio_vs_off: Vec<(String, Option<f64>)>,
    pub peak_ratio_vs_off: Vec<(String, Option<f64>)>,
    pub latency: Option<Latency>,
    pub goals: Vec<Goal>,
}

impl DensityReport {
    /// Puts it together: ratios to "off" and the goals.
    pub fn new(
        host: String,
        mix: MixSpec,
        plan: &Plan,
        memory_mib: u32,
        evict_idle_s: u64,
        configs: Vec<ConfigResult>,
        latency: Option<Latency>,
    ) -> DensityReport {
        let off = configs.iter().find(|c| c.name == "off");
        let ratios = |f: fn(&ConfigResult) -> f64| -> Vec<(String, Option<f64>)> {
            configs
                .iter()
                .map(|c| (c.name.clone(), off.and_then(|o| dp::ratio(f(c), f(o)))))
                .collect()
        };
        let integral_ratio_vs_off = ratios(|c| c.integral_pss_mib_s);
        let peak_ratio_vs_off = ratios(|c| c.peak_pss_mib);
        let mut goals = vec![];
        let both = integral_ratio_vs_off.iter().find(|r| r.0 == "both");
        goals.push(Goal {
            goal: "time-integrated memory ≥ 30% lower with FPR + eviction than with reclaim off"
                .into(),
            measured: match both.and_then(|r| r.1) {
                Some(r) => format!("{:.1}% lower", (1.0 - r) * 100.0),
                None => "not measured (needs off and both)".into(),
            },
            met: both.and_then(|r| r.1).map(|r| r <= 0.7),
        });
        let ev = configs
            .iter()
            .find(|c| c.name == "both")
            .or_else(|| configs.iter().find(|c| c.name == "evict"));
        goals.push(Goal {
            goal: "idle sandbox's private guest RAM after eviction ≤ 1 MiB".into(),
            measured: match ev {
                Some(c) => format!(
                    "{}: {} of {} idle VMMs within 1 MiB; p50 {:.0} KiB, max {:.0} KiB (whole VMM's anonymous memory p50 {:.0} KiB)",
                    c.label,
                    c.idle.private_within_1mib,
                    c.idle.n,
                    c.idle.private_kib_p50.unwrap_or(f64::NAN),
                    c.idle.private_kib_max.unwrap_or(f64::NAN),
                    c.idle.anon_kib_p50.unwrap_or(f64::NAN),
                ),
                None => "not measured (needs evict or both)".into(),
            },
            met: ev
                .filter(|c| c.idle.n > 0)
                .map(|c| c.idle.private_within_1mib == c.idle.n),
        });
        let half = latency
            .as_ref()
            .and_then(|l| l.inflation((l.cores / 2).max(1), true));
        goals.push(Goal {
            goal: "exec latency inflation ≤ 15% at 50% best-effort load (classes)".into(),
            measured: match half {
                Some(i) => format!("{:+.1}%", i * 100.0),
                None => "not measured".into(),
            },
            met: half.map(|i| i <= 0.15),
        });
        DensityReport {
            host,
            idle: plan.count(Role::Idle),
            allocating: plan.count(Role::Alloc),
            busy: plan.count(Role::Busy),
            requests: plan.events.len(),
            mix,
            memory_mib,
            evict_idle_s,
            configs,
            integral_ratio_vs_off,
            peak_ratio_vs_off,
            latency,
            goals,
        }
    }

    /// The table printed.
    pub fn render(&self) -> String {
        let mut t = String::new();
        let m = &self.mix;
        let _ = writeln!(
            t,
            "{} sandboxes of {} MiB ({} idle, {} allocating {} MiB x{}, {} busy), replay {} s, host {}",
            m.sandboxes,
            self.memory_mib,
            self.idle,
            self.allocating,
            m.alloc_mib,
            m.allocs,
            self.busy,
            m.duration_s,
            self.host
        );
        let _ = writeln!(
            t,
            "{:<18} {:>7} {:>9} {:>10} {:>12} {:>7} {:>10} {:>12} {:>5}",
            "configuration",
            "created",
            "peak MiB",
            "mean MiB",
            "MiB*s",
            "vs off",
            "idle p50",
            "host peak",
            "fails"
        );
        for (c, r) in self.configs.iter().zip(&self.integral_ratio_vs_off) {
            let _ = writeln!(
                t,
                "{:<18} {:>7} {:>9.0} {:>10.0} {:>12.0} {:>7} {:>7.0} KiB {:>8.0} MiB {:>5}",
                c.label,
                c.created,
                c.peak_pss_mib,
                c.mean_pss_mib,
                c.integral_pss_mib_s,
                r.1.map_or("-".into(), |r| format!("{r:.2}")),
                c.idle.private_kib_p50.unwrap_or(f64::NAN),
                c.peak_host_used_mib,
                c.failures
            );
        }
        if let Some(l) = &self.latency {
            let _ = writeln!(t, "exec latency of a latency sandbox ({} cores)", l.cores);
            for c in &l.cases {
                let _ = writeln!(
                    t,
                    "  {:<40} p50 {:>8.1} ms  p90 {:>8.1} ms  inflation {}",
                    c.label,
                    c.p50_ms.unwrap_or(f64::NAN),
                    c.p90_ms.unwrap_or(f64::NAN),
                    c.inflation
                        .map_or("-".into(), |i| format!("{:+.1}%", i * 100.0))
                );
            }
        }
        for g in &self.goals {
            let met = match g.met {
                Some(true) => "MET",
                Some(false) => "NOT MET",
                None => "-",
            };
            let _ = writeln!(t, "goal: {} -> {} [{met}]", g.goal, g.measured);
        }
        t
    }
}

/// The figures: memory over time (one line per configuration), the time
/// integrals as bars, the latency cases' CDF.
pub fn figures(r: &DensityReport, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
    let sub = format!(
        "{} sandboxes x {} MiB; {} idle, {} allocating {} MiB x{}, {} busy; replay {} s after the creates",
        r.mix.sandboxes,
        r.memory_mib,
        r.idle,
        r.allocating,
        r.mix.alloc_mib,
        r.mix.allocs,
        r.busy,
        r.mix.duration_s
    );
    let mut files = vec![];
    let lines: Vec<XySeries> = r
        .configs
        .iter()
        .filter(|c| !c.samples.is_empty())
        .map(|c| {
            // Times to 0.1 s: the first sample at 0 keeps the axis linear.
            let pts = c
                .samples
                .iter()
                .map(|s| ((s.t_s * 10.0).round() / 10.0, s.pss_mib))
                .collect();
            XySeries::new(c.label.clone(), pts)
        })
        .collect();
    if !lines.is_empty() {
        let p = out.path("memory");
        let f = out
            .figure("Host memory of the sandboxes' VMMs over time (sum of PSS)")
            .subtitle(sub.clone())
            .axes("time since the first create (s)", "VMMs' PSS (MiB)");
        plot::xy(&p, &f, &lines)?;
        files.push(p);
        let bars: Vec<Bar> = r
            .configs
            .iter()
            .map(|c| Bar::new(c.label.clone(), c.integral_pss_mib_s / 1024.0))
            .collect();
        let p = out.path("integral");
        let f = out
            .figure("Time-integrated host memory over the replay (VMMs' PSS)")
            .subtitle(sub)
            .axes("reclaim configuration", "GiB x s");
        plot::bars(&p, &f, &bars)?;
        files.push(p);
    }
    if let Some(l) = r.latency.as_ref().filter(|l| !l.cases.is_empty()) {
        let series: Vec<Series> = l
            .cases
            .iter()
            .filter(|c| !c.ms.is_empty())
            .map(|c| Series::new(c.label.clone(), c.ms.clone()))
            .collect();
        let p = out.path("latency-cdf");
        let f = out
            .figure("Exec latency of a latency sandbox beside best-effort burners")
            .subtitle(format!(
                "{} cores; burners of 1 vCPU each at 50% and 100% of them",
                l.cores
            ))
            .unit("ms");
        plot::latency_cdf(&p, &f, &series)?;
        files.push(p);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::density_plan::{plan, MixSpec};

    fn config(name: &str, level: f64, idle_private: &[f64]) -> ConfigResult {
        let samples: Vec<Sample> = (0..=20)
            .map(|t| Sample {
                t_s: f64::from(t),
                vmms: 4,
                pss_mib: level,
                anon_mib: level / 2.0,
                host_used_mib: 1000.0,
            })
            .collect();
        ConfigResult {
            name: name.into(),
            label: name.into(),
            daemon_args: String::new(),
            sandboxes: 4,
            created: 4,
            create_s: 0.0,
            replay_s: (0.0, 20.0),
            replay_end_s: 20.0,
            failures: 0,
            first_failures: vec![],
            alloc_execs: 1,
            alloc_exec_ms_p50: Some(1.0),
            busy_execs: 0,
            busy_exec_ms_p50: None,
            lag_s_max: 0.0,
            peak_pss_mib: level,
            integral_pss_mib_s: level * 20.0,
            mean_pss_mib: level,
            host_used_base_mib: 1000.0,
            peak_host_used_mib: 0.0,
            integral_host_used_mib_s: 0.0,
            idle: IdleMem::of(idle_private, &[500.0; 2]),
            counters: Default::default(),
            samples,
        }
    }

    #[test]
    fn ratios_goals_round_trip_and_figures() {
        let mix = MixSpec {
            sandboxes: 4,
            seed: 1,
            duration_s: 20.0,
            alloc_share: 0.25,
            busy_share: 0.25,
            alloc_mib: 8,
            allocs: 1,
            busy_period_s: 5.0,
        };
        let p = plan(&mix);
        let cases = |ms: [f64; 3]| {
            let c = |label: &str, burners, priority, v: f64| crate::bench_classes::Case {
                label: label.into(),
                burners,
                priority,
                ms: vec![v; 3],
            };
            vec![
                c("quiet", 0, Priority::Latency, 100.0),
                c("1 be", 1, Priority::BestEffort, ms[0]),
                c("1 lat", 1, Priority::Latency, ms[1]),
                c("2 be", 2, Priority::BestEffort, ms[2]),
            ]
        };
        let r = DensityReport::new(
            "pvm".into(),
            mix,
            &p,
            256,
            20,
            vec![
                config("off", 100.0, &[900.0, 800.0]),
                config("both", 60.0, &[0.0, 2048.0]),
            ],
            Some(Latency::of(2, cases([110.0, 200.0, 150.0]))),
        );
        assert_eq!(r.integral_ratio_vs_off[1], ("both".into(), Some(0.6)));
        // 40% lower: met; one idle VMM over 1 MiB: not met; +10%: met.
        let met: Vec<_> = r.goals.iter().map(|g| g.met).collect();
        assert_eq!(met, [Some(true), Some(false), Some(true)], "{:?}", r.goals);
        assert!(r.goals[0].measured.starts_with("40.0% lower"));
        assert_eq!(r.goals[2].measured, "+10.0%");
        let t = r.render();
        assert!(t.contains("[NOT MET]") && t.contains("0.60"), "{t}");
        // The JSON reads back (--from-json) and draws three figures.
        let back: DensityReport =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.render(), t);
        let d = tempfile::tempdir().unwrap();
        let out = Out::for_json(d.path(), std::path::Path::new("bench-density.json"));
        let files = figures(&back, &out).unwrap();
        assert_eq!(files.len(), 3);
        assert!(files.iter().all(|f| f.is_file()));
    }
}
