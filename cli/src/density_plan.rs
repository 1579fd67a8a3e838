//! `shoal bench density`'s pure parts: the seeded sandbox-lifetime mix
//! (who idles, who allocates and frees, who stays busy, and when), and the
//! maths over the memory samples (peak, time integral, ratios). No KVM.

use serde::Serialize;

/// What a sandbox does over the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// One small exec after its create, then nothing.
    Idle,
    /// Allocates, touches and frees memory in the guest a few times.
    Alloc,
    /// Execs again and again until the end.
    Busy,
}

/// One request of the replay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Event {
    /// Seconds after the replay's start.
    pub at_s: f64,
    /// The sandbox (index into the roles).
    pub sandbox: usize,
    /// `Some(MiB)`: allocate, touch and free that much; `None`: a small exec.
    pub alloc_mib: Option<u32>,
}

/// The mix's parameters.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct MixSpec {
    /// Sandboxes.
    pub sandboxes: usize,
    /// Seed of the schedule (same seed, same replay).
    pub seed: u64,
    /// Length of the replay (s).
    pub duration_s: f64,
    /// Share of sandboxes that allocate (0..=1).
    pub alloc_share: f64,
    /// Share of sandboxes that stay busy (0..=1).
    pub busy_share: f64,
    /// MiB per allocation.
    pub alloc_mib: u32,
    /// Allocations per allocating sandbox.
    pub allocs: u32,
    /// Seconds between a busy sandbox's execs (each jittered ±25%).
    pub busy_period_s: f64,
}

/// The replay: every sandbox's role and every request, by time.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Role of each sandbox.
    pub roles: Vec<Role>,
    /// The requests, sorted by time.
    pub events: Vec<Event>,
}

impl Plan {
    /// Sandboxes of `role`.
    pub fn count(&self, role: Role) -> usize {
        self.roles.iter().filter(|r| **r == role).count()
    }
}

/// splitmix64: a small deterministic generator (the schedule must be the
/// same in every configuration and every run with the same seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n > 0).
    fn below(&mut self, n: usize) -> usize {
        // The bias of a modulo over 2^64 is negligible for these n.
        let n64 = u64::try_from(n).unwrap_or(u64::MAX);
        usize::try_from(self.next() % n64).unwrap_or(0)
    }
}

/// Builds the replay of `s`: `round(n × alloc_share)` allocating and
/// `round(n × busy_share)` busy sandboxes (at least one of each when the
/// share is above 0 and n allows), picked at random; the allocations at
/// random times in the first 70% of the replay (so that what they free is
/// seen being given back); the busy execs every `busy_period_s` ± 25%
/// from a random phase.
pub fn plan(s: &MixSpec) -> Plan {
    let n = s.sandboxes;
    let share = |x: f64| {
        let k = round_share(n, x);
        if x > 0.0 && n > 0 {
            k.max(1)
        } else {
            k
        }
    };
    let allocs = share(s.alloc_share).min(n);
    let busy = share(s.busy_share).min(n - allocs);
    let mut roles: Vec<Role> = (0..n)
        .map(|i| match i {
            i if i < allocs => Role::Alloc,
            i if i < allocs + busy => Role::Busy,
            _ => Role::Idle,
        })
        .collect();
    let mut rng = Rng(s.seed);
    // Fisher-Yates: which sandboxes get which role.
    for i in (1..n).rev() {
        let j = rng.below(i + 1);
        roles.swap(i, j);
    }
    let mut events = vec![];
    let d = s.duration_s.max(0.0);
    for (i, r) in roles.iter().enumerate() {
        match r {
            Role::Idle => {}
            Role::Alloc => {
                for _ in 0..s.allocs {
                    events.push(Event {
                        at_s: rng.unit() * d * 0.7,
                        sandbox: i,
                        alloc_mib: Some(s.alloc_mib),
                    });
                }
            }
            Role::Busy => {
                let p = s.busy_period_s.max(0.1);
                let mut t = rng.unit() * p;
                while t < d {
                    events.push(Event {
                        at_s: t,
                        sandbox: i,
                        alloc_mib: None,
                    });
                    t += p * (0.75 + 0.5 * rng.unit());
                }
            }
        }
    }
    events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s).then(a.sandbox.cmp(&b.sandbox)));
    Plan { roles, events }
}

/// `n × x` rounded, x clamped to 0..=1.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn round_share(n: usize, x: f64) -> usize {
    // In 0..=n: `as` from a non-negative f64 no larger than n is exact enough.
    (n as f64 * x.clamp(0.0, 1.0)).round() as usize
}

/// The largest y of `(t, y)` points (0 for none).
pub fn peak(points: &[(f64, f64)]) -> f64 {
    points.iter().map(|p| p.1).fold(0.0, f64::max)
}

/// The integral of `(t, y)` points over `[from, to]` (trapezoids; the
/// curve is linear between points, flat before the first and after the
/// last). Units: y's times t's (MiB·s).
pub fn integral(points: &[(f64, f64)], from: f64, to: f64) -> f64 {
    if points.is_empty() || to <= from {
        return 0.0;
    }
    // The value at t, by linear interpolation.
    let at = |t: f64| -> f64 {
        let i = points.partition_point(|p| p.0 <= t);
        match i {
            0 => points[0].1,
            i if i == points.len() => points[i - 1].1,
            i => {
                let (a, b) = (points[i - 1], points[i]);
                if b.0 > a.0 {
                    a.1 + (b.1 - a.1) * (t - a.0) / (b.0 - a.0)
                } else {
                    b.1
                }
            }
        }
    };
    // Breakpoints: from, every sample inside, to.
    let mut ts = vec![from];
    ts.extend(points.iter().map(|p| p.0).filter(|&t| t > from && t < to));
    ts.push(to);
    ts.windows(2)
        .map(|w| (w[1] - w[0]) * (at(w[0]) + at(w[1])) / 2.0)
        .sum()
}

/// `x / base`, or None when base is not positive.
pub fn ratio(x: f64, base: f64) -> Option<f64> {
    (base > 0.0).then(|| x / base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(n: usize, seed: u64) -> MixSpec {
        MixSpec {
            sandboxes: n,
            seed,
            duration_s: 100.0,
            alloc_share: 0.15,
            busy_share: 0.05,
            alloc_mib: 32,
            allocs: 2,
            busy_period_s: 10.0,
        }
    }

    #[test]
    fn the_mix_has_its_shares_and_is_the_same_for_a_seed() {
        let p = plan(&spec(200, 7));
        assert_eq!(p.roles.len(), 200);
        assert_eq!(p.count(Role::Alloc), 30);
        assert_eq!(p.count(Role::Busy), 10);
        assert_eq!(p.count(Role::Idle), 160);
        // Two allocations per allocator, in the first 70%.
        let allocs: Vec<_> = p.events.iter().filter(|e| e.alloc_mib.is_some()).collect();
        assert_eq!(allocs.len(), 60);
        assert!(allocs.iter().all(|e| e.at_s >= 0.0 && e.at_s < 70.0));
        assert!(allocs
            .iter()
            .all(|e| p.roles[e.sandbox] == Role::Alloc && e.alloc_mib == Some(32)));
        // Busy execs: about duration / period each, only busy sandboxes.
        let busy: Vec<_> = p.events.iter().filter(|e| e.alloc_mib.is_none()).collect();
        assert!(busy.iter().all(|e| p.roles[e.sandbox] == Role::Busy));
        assert!((80..=140).contains(&busy.len()), "{}", busy.len());
        assert!(busy.iter().all(|e| e.at_s < 100.0));
        // Sorted, deterministic, and another seed gives another mix.
        assert!(p.events.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        assert_eq!(plan(&spec(200, 7)).events, p.events);
        assert_eq!(plan(&spec(200, 7)).roles, p.roles);
        assert_ne!(plan(&spec(200, 8)).roles, p.roles);
    }

    #[test]
    fn small_mixes_keep_one_of_each() {
        let p = plan(&spec(4, 1));
        assert_eq!(
            (
                p.count(Role::Alloc),
                p.count(Role::Busy),
                p.count(Role::Idle)
            ),
            (1, 1, 2)
        );
        let p = plan(&spec(1, 1));
        assert_eq!(p.count(Role::Alloc), 1);
        assert!(plan(&spec(0, 1)).events.is_empty());
        let none = MixSpec {
            alloc_share: 0.0,
            busy_share: 0.0,
            ..spec(10, 1)
        };
        let p = plan(&none);
        assert_eq!(p.count(Role::Idle), 10);
        assert!(p.events.is_empty());
    }

    #[test]
    fn integral_and_peak() {
        let pts = [(0.0, 10.0), (10.0, 30.0), (20.0, 30.0)];
        // 10 s rising 10 -> 30 (200) + 10 s flat at 30 (300).
        assert!((integral(&pts, 0.0, 20.0) - 500.0).abs() < 1e-9);
        // A window inside: 5..15 = 5 s from 20 to 30 (125) + 5 s at 30 (150).
        assert!((integral(&pts, 5.0, 15.0) - 275.0).abs() < 1e-9);
        // Flat outside the samples.
        assert!((integral(&pts, -10.0, 0.0) - 100.0).abs() < 1e-9);
        assert!((integral(&pts, 20.0, 30.0) - 300.0).abs() < 1e-9);
        assert_eq!(integral(&[], 0.0, 10.0), 0.0);
        assert_eq!(integral(&pts, 5.0, 5.0), 0.0);
        assert_eq!(peak(&pts), 30.0);
        assert_eq!(peak(&[]), 0.0);
        assert_eq!(ratio(50.0, 100.0), Some(0.5));
        assert_eq!(ratio(1.0, 0.0), None);
    }
}
