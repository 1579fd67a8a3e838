//! Token buckets for rate-limiting a device's traffic: one for bytes and
//! one for packets per direction, each with a steady rate and a burst size.
//!
//! The clock is a parameter of every call (`now`), so the buckets are
//! tested with made-up instants and the device decides where time comes
//! from. A refused `consume` says when to retry (the instant the bucket
//! will hold enough); the device arms a timerfd for it.
//!
//! A bucket counts in billionths of a token so refills over short
//! intervals are exact. An item larger than the burst (a 64 KiB frame
//! through a 16 KiB bucket) is let through once the bucket is full and
//! leaves it in debt, so the long-run rate still holds and nothing is
//! stuck forever.

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Sub-token units per token.
const SCALE: u128 = 1_000_000_000;

/// Why a rate-limit configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateLimitError {
    /// A rate of 0 would never refill.
    #[error("{0}: the rate must be at least 1 per second")]
    ZeroRate(&'static str),
    /// A burst of 0 would never admit anything.
    #[error("{0}: the burst must be at least 1")]
    ZeroBurst(&'static str),
}

/// One bucket's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketConfig {
    /// Tokens added per second.
    pub rate_per_sec: u64,
    /// Most tokens the bucket holds (and so the largest burst).
    pub burst: u64,
}

/// Limits of one direction; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// Bytes per second.
    pub bytes: Option<BucketConfig>,
    /// Packets (frames) per second.
    pub packets: Option<BucketConfig>,
}

/// A token bucket (starts full).
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: u128,
    capacity: u128,
    /// Tokens held, in 1/[`SCALE`] units; negative after an oversize item.
    level: i128,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket with `cfg`'s limits, its clock starting at `now`.
    pub fn new(
        cfg: BucketConfig,
        now: Instant,
        what: &'static str,
    ) -> Result<Self, RateLimitError> {
        if cfg.rate_per_sec == 0 {
            return Err(RateLimitError::ZeroRate(what));
        }
        if cfg.burst == 0 {
            return Err(RateLimitError::ZeroBurst(what));
        }
        let capacity = u128::from(cfg.burst) * SCALE;
        Ok(Self {
            rate: u128::from(cfg.rate_per_sec),
            capacity,
            level: i128::try_from(capacity).unwrap_or(i128::MAX),
            last: now,
        })
    }

    /// Adds what the time since the last refill earned (an earlier `now`
    /// earns nothing).
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_nanos();
        if elapsed == 0 {
            return;
        }
        self.last = now;
        // rate tokens/s * ns = rate * ns / 1e9 tokens = rate * ns units.
        let earned = i128::try_from(self.rate.saturating_mul(elapsed)).unwrap_or(i128::MAX);
        let cap = i128::try_from(self.capacity).unwrap_or(i128::MAX);
        self.level = self.level.saturating_add(earned).min(cap);
    }

    /// What `n` tokens need in the bucket before they are taken: `n`, or
    /// a full bucket for more than it holds.
    fn needed(&self, n: u64) -> i128 {
        let want = (u128::from(n) * SCALE).min(self.capacity);
        i128::try_from(want).unwrap_or(i128::MAX)
    }

    /// How long from `now` (after a refill) until `n` tokens can be taken.
    fn wait(&self, n: u64) -> Duration {
        let short = self.needed(n) - self.level;
        let Ok(short) = u128::try_from(short) else {
            return Duration::ZERO;
        };
        if short == 0 {
            return Duration::ZERO;
        }
        // ns = units / rate, rounded up.
        let ns = short.div_ceil(self.rate);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Tokens held now (whole tokens, 0 while in debt).
    pub fn tokens(&mut self, now: Instant) -> u64 {
        self.refill(now);
        u64::try_from(self.level.max(0) / i128::try_from(SCALE).unwrap_or(1)).unwrap_or(u64::MAX)
    }

    /// Takes `n` tokens, or says how long until they can be taken.
    pub fn consume(&mut self, n: u64, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        match self.wait(n) {
            Duration::ZERO => {
                let units = i128::try_from(u128::from(n) * SCALE).unwrap_or(i128::MAX);
                self.level = self.level.saturating_sub(units);
                Ok(())
            }
            d => Err(d),
        }
    }

    /// Whether `n` tokens could be taken now, without taking them.
    fn check(&mut self, n: u64, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        match self.wait(n) {
            Duration::ZERO => Ok(()),
            d => Err(d),
        }
    }
}

/// The buckets of one direction: an item passes when both have room.
#[derive(Debug, Clone, Default)]
pub struct RateLimiter {
    bytes: Option<TokenBucket>,
    packets: Option<TokenBucket>,
}

impl RateLimiter {
    /// Full buckets for `limit`, their clock starting at `now`.
    pub fn new(limit: RateLimit, now: Instant) -> Result<Self, RateLimitError> {
        Ok(Self {
            bytes: limit
                .bytes
                .map(|c| TokenBucket::new(c, now, "bytes"))
                .transpose()?,
            packets: limit
                .packets
                .map(|c| TokenBucket::new(c, now, "packets"))
                .transpose()?,
        })
    }

    /// Whether there is any limit at all.
    pub fn is_limited(&self) -> bool {
        self.bytes.is_some() || self.packets.is_some()
    }

    /// Takes one packet of `bytes` from both buckets, or takes nothing and
    /// returns the instant to retry at (when both will have room).
    pub fn consume(&mut self, bytes: u64, now: Instant) -> Result<(), Instant> {
        self.consume_packets(bytes, 1, now)
    }

    /// Takes `packets` packets of `bytes` in all from both buckets (a TCP
    /// segment that goes out as several packets), or takes nothing and
    /// returns the instant to retry at.
    pub fn consume_packets(
        &mut self,
        bytes: u64,
        packets: u64,
        now: Instant,
    ) -> Result<(), Instant> {
        let mut wait = Duration::ZERO;
        if let Some(b) = self.bytes.as_mut() {
            wait = wait.max(b.check(bytes, now).err().unwrap_or_default());
        }
        if let Some(p) = self.packets.as_mut() {
            wait = wait.max(p.check(packets, now).err().unwrap_or_default());
        }
        if wait > Duration::ZERO {
            return Err(now
                .checked_add(wait)
                .unwrap_or(now + Duration::from_secs(3600)));
        }
        // Both have room: neither can refuse now.
        if let Some(b) = self.bytes.as_mut() {
            let _ = b.consume(bytes, now);
        }
        if let Some(p) = self.packets.as_mut() {
            let _ = p.consume(packets, now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(rate_per_sec: u64, burst: u64) -> BucketConfig {
        BucketConfig {
            rate_per_sec,
            burst,
        }
    }

    #[test]
    fn refuses_zero_rate_and_burst() {
        let t = Instant::now();
        assert_eq!(
            TokenBucket::new(cfg(0, 5), t, "bytes").unwrap_err(),
            RateLimitError::ZeroRate("bytes")
        );
        assert_eq!(
            TokenBucket::new(cfg(5, 0), t, "packets").unwrap_err(),
            RateLimitError::ZeroBurst("packets")
        );
    }

    #[test]
    fn burst_then_steady_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(cfg(100, 1000), t0, "bytes").unwrap();
        // The whole burst at once, not a token more.
        assert_eq!(b.consume(1000, t0), Ok(()));
        // 1 token at 100/s takes 10 ms.
        assert_eq!(b.consume(1, t0), Err(Duration::from_millis(10)));
        // After 50 ms: 5 tokens.
        let t1 = t0 + Duration::from_millis(50);
        assert_eq!(b.tokens(t1), 5);
        assert_eq!(b.consume(5, t1), Ok(()));
        assert_eq!(b.consume(1, t1), Err(Duration::from_millis(10)));
        // Over 10 s of the steady rate exactly 1000 tokens pass.
        let mut t = t1;
        let mut passed = 0;
        for _ in 0..10_000 {
            t += Duration::from_millis(1);
            while b.consume(1, t).is_ok() {
                passed += 1;
            }
        }
        assert_eq!(passed, 1000);
    }

    #[test]
    fn refill_stops_at_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(cfg(10, 20), t0, "packets").unwrap();
        assert_eq!(b.consume(20, t0), Ok(()));
        assert_eq!(b.tokens(t0 + Duration::from_secs(3600)), 20);
    }

    #[test]
    fn time_going_backwards_earns_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = TokenBucket::new(cfg(10, 10), t0, "packets").unwrap();
        assert_eq!(b.consume(10, t0), Ok(()));
        assert_eq!(b.tokens(t0 - Duration::from_secs(5)), 0);
        assert_eq!(b.tokens(t0 + Duration::from_millis(100)), 1);
    }

    #[test]
    fn oversize_item_waits_for_a_full_bucket_and_leaves_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(cfg(1000, 100), t0, "bytes").unwrap();
        assert_eq!(b.consume(1, t0), Ok(()));
        // 300 > burst: needs the bucket full again (1 token, 1 ms).
        assert_eq!(b.consume(300, t0), Err(Duration::from_millis(1)));
        let t1 = t0 + Duration::from_millis(1);
        assert_eq!(b.consume(300, t1), Ok(()));
        // 200 in debt: the next byte waits for 201 tokens (201 ms).
        assert_eq!(b.consume(1, t1), Err(Duration::from_millis(201)));
    }

    #[test]
    fn limiter_needs_both_buckets_and_takes_from_neither_on_refusal() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(
            RateLimit {
                bytes: Some(cfg(1000, 1000)),
                packets: Some(cfg(1, 2)),
            },
            t0,
        )
        .unwrap();
        assert!(l.is_limited());
        assert_eq!(l.consume(100, t0), Ok(()));
        assert_eq!(l.consume(100, t0), Ok(()));
        // Packets are out: retry in 1 s; no bytes were taken.
        assert_eq!(l.consume(100, t0), Err(t0 + Duration::from_secs(1)));
        assert_eq!(l.bytes.as_mut().unwrap().tokens(t0), 800);
        // Bytes short too: the later of the two deadlines.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(l.consume(800, t1), Ok(()));
        assert_eq!(l.consume(1000, t1), Err(t1 + Duration::from_secs(1)));
        assert_eq!(l.consume(1000, t1 + Duration::from_secs(1)), Ok(()));
    }

    #[test]
    fn unlimited_passes_everything() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(RateLimit::default(), t0).unwrap();
        assert!(!l.is_limited());
        for _ in 0..10_000 {
            assert_eq!(l.consume(65_536, t0), Ok(()));
        }
    }
}
