//! What one sandbox may cost the forwarder: a token bucket of queries per
//! second and a cap of its queries waiting on an upstream, in a table of
//! clients that never holds more than its cap.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;
use tokio::sync::OwnedSemaphorePermit;

/// Queries per second one client may make: `burst` at once, then
/// `per_second` on average.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Tokens added per second.
    pub per_second: u32,
    /// The bucket's size: the most queries at once after a quiet time.
    pub burst: u32,
}

/// A token bucket; the clock is the caller's (`now` on each call).
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub(crate) fn full(limit: RateLimit, now: Instant) -> TokenBucket {
        TokenBucket {
            tokens: f64::from(limit.burst),
            last: now,
        }
    }

    fn refill(&mut self, limit: RateLimit, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens =
            (self.tokens + elapsed * f64::from(limit.per_second)).min(f64::from(limit.burst));
        // A clock that goes back keeps the later time: no free tokens.
        self.last = self.last.max(now);
    }

    /// Takes one token if there is one.
    pub(crate) fn take(&mut self, limit: RateLimit, now: Instant) -> bool {
        self.refill(limit, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether the bucket is full again (it then says nothing a new one
    /// would not).
    fn is_full(&mut self, limit: RateLimit, now: Instant) -> bool {
        self.refill(limit, now);
        self.tokens >= f64::from(limit.burst)
    }
}

#[derive(Debug)]
struct Client {
    bucket: TokenBucket,
    in_flight: usize,
}

/// Every client's bucket and queries in flight; at most `max_clients`
/// entries (entries that a new one would equal are dropped to make room).
#[derive(Debug)]
pub(crate) struct Clients {
    rate: RateLimit,
    max_in_flight: usize,
    max_clients: usize,
    map: HashMap<IpAddr, Client>,
}

impl Clients {
    pub(crate) fn new(rate: RateLimit, max_in_flight: usize, max_clients: usize) -> Clients {
        Clients {
            rate,
            max_in_flight,
            max_clients,
            map: HashMap::new(),
        }
    }

    /// Takes a token for a query from `ip`; false when it has none, or
    /// the table is full of clients with state.
    pub(crate) fn admit(&mut self, ip: IpAddr, now: Instant) -> bool {
        if !self.map.contains_key(&ip) && self.map.len() >= self.max_clients {
            let rate = self.rate;
            self.map
                .retain(|_, c| c.in_flight > 0 || !c.bucket.is_full(rate, now));
            if self.map.len() >= self.max_clients {
                return false;
            }
        }
        let rate = self.rate;
        self.map
            .entry(ip)
            .or_insert_with(|| Client {
                bucket: TokenBucket::full(rate, now),
                in_flight: 0,
            })
            .bucket
            .take(rate, now)
    }

    /// Counts one more query of `ip` in flight; false at its cap. Only
    /// after [`Clients::admit`] said yes (which made its entry).
    fn begin(&mut self, ip: IpAddr) -> bool {
        match self.map.get_mut(&ip) {
            Some(c) if c.in_flight < self.max_in_flight => {
                c.in_flight += 1;
                true
            }
            _ => false,
        }
    }

    fn end(&mut self, ip: IpAddr) {
        if let Some(c) = self.map.get_mut(&ip) {
            c.in_flight = c.in_flight.saturating_sub(1);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// One query waiting on an upstream: its place under the forwarder's cap
/// (the permit) and under its client's; both freed on drop, also when the
/// task is aborted.
pub(crate) struct InFlight {
    clients: Arc<Mutex<Clients>>,
    ip: IpAddr,
    _permit: OwnedSemaphorePermit,
}

impl InFlight {
    /// Counts a query of `ip` in flight under `permit` (the forwarder's
    /// cap); `None` at the client's cap.
    pub(crate) fn begin(
        clients: &Arc<Mutex<Clients>>,
        ip: IpAddr,
        permit: OwnedSemaphorePermit,
    ) -> Option<InFlight> {
        lock(clients).begin(ip).then(|| InFlight {
            clients: clients.clone(),
            ip,
            _permit: permit,
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.clients).end(self.ip);
    }
}

/// The table, also after a panic elsewhere held it (its counts stay
/// consistent: every change is one statement).
pub(crate) fn lock(clients: &Mutex<Clients>) -> std::sync::MutexGuard<'_, Clients> {
    clients.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::Semaphore;

    const RATE: RateLimit = RateLimit {
        per_second: 2,
        burst: 3,
    };

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[test]
    fn bucket_gives_burst_then_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::full(RATE, t0);
        assert!((0..3).all(|_| b.take(RATE, t0)));
        assert!(!b.take(RATE, t0));
        // Half a second at 2/s is one token.
        let t1 = t0 + Duration::from_millis(500);
        assert!(b.take(RATE, t1));
        assert!(!b.take(RATE, t1));
        // A long quiet time refills to the burst, not beyond.
        let t2 = t1 + Duration::from_secs(3600);
        assert!((0..3).all(|_| b.take(RATE, t2)));
        assert!(!b.take(RATE, t2));
        // A clock going back gives nothing.
        assert!(!b.take(RATE, t0));
        assert!(!b.take(RATE, t2 + Duration::from_millis(100)));
        assert!(b.take(RATE, t2 + Duration::from_millis(500)));
    }

    #[test]
    fn clients_have_their_own_buckets() {
        let t0 = Instant::now();
        let mut c = Clients::new(RATE, 4, 16);
        assert!((0..3).all(|_| c.admit(ip(1), t0)));
        assert!(!c.admit(ip(1), t0));
        assert!(c.admit(ip(2), t0));
    }

    #[test]
    fn table_is_capped_and_makes_room_from_idle_clients() {
        let t0 = Instant::now();
        let mut c = Clients::new(RATE, 4, 2);
        assert!(c.admit(ip(1), t0));
        assert!(c.admit(ip(2), t0));
        // Both have state (a token spent): no room for a third.
        assert!(!c.admit(ip(3), t0));
        assert_eq!(c.len(), 2);
        // Client 1 has a query in flight; client 2's bucket refills.
        assert!(c.begin(ip(1)));
        let t1 = t0 + Duration::from_secs(10);
        assert!(c.admit(ip(3), t1));
        assert_eq!(c.len(), 2);
        assert!(c.map.contains_key(&ip(1)) && c.map.contains_key(&ip(3)));
    }

    #[test]
    fn in_flight_is_capped_per_client_and_freed_on_drop() {
        let t0 = Instant::now();
        let clients = Arc::new(Mutex::new(Clients::new(RATE, 2, 16)));
        let global = Arc::new(Semaphore::new(3));
        assert!(lock(&clients).admit(ip(1), t0));
        assert!(lock(&clients).admit(ip(2), t0));
        let permit = || global.clone().try_acquire_owned().unwrap();
        let a = InFlight::begin(&clients, ip(1), permit()).unwrap();
        let b = InFlight::begin(&clients, ip(1), permit()).unwrap();
        assert!(InFlight::begin(&clients, ip(1), permit()).is_none());
        // The refused one gave its permit back.
        let c = InFlight::begin(&clients, ip(2), permit()).unwrap();
        assert!(global.clone().try_acquire_owned().is_err());
        drop(a);
        assert!(InFlight::begin(&clients, ip(1), permit()).is_some());
        drop((b, c));
        assert_eq!(global.available_permits(), 3);
        assert_eq!(lock(&clients).map[&ip(1)].in_flight, 0);
    }

    #[test]
    fn unknown_client_is_never_in_flight() {
        let clients = Arc::new(Mutex::new(Clients::new(RATE, 2, 16)));
        let global = Arc::new(Semaphore::new(1));
        let p = global.clone().try_acquire_owned().unwrap();
        assert!(InFlight::begin(&clients, ip(9), p).is_none());
    }
}
