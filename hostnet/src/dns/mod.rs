//! The DNS forwarder sandboxes resolve names through: it answers a
//! sandbox only for the names its egress policy allows, and before the
//! answer leaves, adds the answer's addresses to that sandbox's allowed
//! set, so the first connection after the answer already passes.
//!
//! One UDP socket ([`DnsForwarder::bind`]); per datagram, in this order:
//!
//! 1. Over [`MAX_MESSAGE`] bytes, not DNS, a response, not exactly one
//!    question, or records where a query has none: dropped (no answer),
//!    counted in `dropped`.
//! 2. From an address the [`DnsPolicy`] knows no slot for: ignored,
//!    counted in `unknown_clients`.
//! 3. Over the client's rate ([`RateLimit`], a token bucket per client):
//!    dropped, counted in `throttled`.
//! 4. An opcode other than QUERY, a class other than IN, or a meta type
//!    (ANY, AXFR, IXFR, OPT, TSIG, ...): REFUSED (`refused`).
//! 5. A name the slot does not allow, or one that is no host name (a label
//!    with a dot, `*`, a space, a control or non-ASCII byte): NXDOMAIN
//!    (`denied`); the upstream never sees it.
//! 6. Allowed: past the forwarder's or the client's cap of queries in
//!    flight, dropped (`throttled`); else forwarded to the upstreams in
//!    turn, each with its share of [`ForwarderConfig::upstream_timeout`],
//!    under a fresh random id from a fresh socket. A reply counts only
//!    with that id and that question; a truncated one, or one that is
//!    neither NOERROR nor NXDOMAIN, moves to the next upstream. None left,
//!    or the deadline passed: SERVFAIL (`upstream_failures`).
//! 7. Of the reply the sandbox gets only the CNAME chain from its name,
//!    within the answer (at most [`MAX_CNAME_HOPS`], no further lookups;
//!    CNAME targets are not checked against the policy: they are where
//!    the allowed name lives), the records of the question's type at its
//!    end and the zone's SOA; every TTL capped to
//!    [`ForwarderConfig::max_allow_ttl`]. Each A/AAAA address goes to the
//!    [`AllowSink`] with `ttl = clamp(record TTL, min_allow_ttl,
//!    max_allow_ttl)`; only when all were taken does the answer go out
//!    (`allowed`), with the client's id. A sink that fails (or does not
//!    return within the timeout) makes it SERVFAIL (`sink_failures`):
//!    the sandbox never learns an address it could not reach (a sink call
//!    past its timeout keeps the query's place in flight until it
//!    returns, and may still allow the address: harmless, unanswered).
//!
//! The reply fits the client: 512 bytes without EDNS, its payload size up
//! to [`MAX_MESSAGE`] with; records that do not fit are left out and TC
//! set (over TCP it would be refused: the sandbox has no DNS over TCP).
//! Nothing grows without bound: the clients' table, the queries in flight
//! (each with a deadline) and every buffer are capped.

mod forwarder;
mod limits;
mod message;
pub mod names;

pub use forwarder::{DnsForwarder, DnsStats};
pub use limits::RateLimit;
pub use message::{MAX_CNAME_HOPS, MAX_MESSAGE};

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Which slot (sandbox) a client address is, and what it may resolve.
pub trait DnsPolicy: Send + Sync {
    /// The slot whose sandbox has address `client`; `None` for an address
    /// no slot has (its queries get no answer). Asked once per query, so
    /// a policy changed while the sandbox runs applies to its next query.
    fn lookup(&self, client: IpAddr) -> Option<Box<dyn SlotView + '_>>;
}

/// One slot's view of the policy, for one query.
pub trait SlotView {
    /// The slot's id (opaque to the forwarder; given back to the sink).
    fn slot(&self) -> &str;

    /// Whether the slot may resolve `name`. The forwarder passes it lower
    /// case without the trailing dot, but it must answer as
    /// [`names::NameRules::allows`] does: `d` matches exactly `d`, `*.d`
    /// any name strictly below `d` (not `d`), case-insensitive, a
    /// trailing dot ignored, and a deny pattern wins over an allow one.
    fn name_allowed(&self, name: &str) -> bool;
}

/// Where the addresses of allowed answers go: the sandbox's allowed set.
pub trait AllowSink: Send + Sync {
    /// Allows `slot` to reach `addr` for `ttl` (from now). Called for
    /// every address of an answer before the answer is sent, on a thread
    /// that may block (tokio's blocking pool), never twice at once for
    /// one query; an error makes the answer SERVFAIL.
    fn allow(&self, slot: &str, addr: IpAddr, ttl: Duration) -> Result<(), String>;
}

/// The forwarder's settings; [`ForwarderConfig::new`] gives the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwarderConfig {
    /// Where it listens (port 0: any free one, see
    /// [`DnsForwarder::local_addr`]).
    pub listen: SocketAddr,
    /// The resolvers it forwards to, tried in this order (at least one).
    pub upstreams: Vec<SocketAddr>,
    /// How long one query may wait on the upstreams, all of them
    /// together, before it is answered SERVFAIL (default 2 s).
    pub upstream_timeout: Duration,
    /// How long the sink may take for one answer's addresses (default 2 s).
    pub sink_timeout: Duration,
    /// Each client's query rate (default 50/s, bursts of 100).
    pub rate: RateLimit,
    /// Queries waiting on an upstream, all clients together (default 256).
    pub max_in_flight: usize,
    /// Queries waiting on an upstream, per client (default 32).
    pub max_in_flight_per_client: usize,
    /// Clients whose rate state is kept (default 4096); past it a new
    /// client is throttled until an idle one's state can be dropped.
    pub max_clients: usize,
    /// The shortest time an address is allowed for (default 60 s), so a
    /// record with a TTL of seconds is still reachable when used.
    pub min_allow_ttl: Duration,
    /// The longest (default 1 day); answers' TTLs are capped to it too,
    /// so no sandbox caches an address longer than it may reach it.
    pub max_allow_ttl: Duration,
}

impl ForwarderConfig {
    /// The defaults, listening on `listen` and forwarding to `upstreams`.
    pub fn new(listen: SocketAddr, upstreams: Vec<SocketAddr>) -> ForwarderConfig {
        ForwarderConfig {
            listen,
            upstreams,
            upstream_timeout: Duration::from_secs(2),
            sink_timeout: Duration::from_secs(2),
            rate: RateLimit {
                per_second: 50,
                burst: 100,
            },
            max_in_flight: 256,
            max_in_flight_per_client: 32,
            max_clients: 4096,
            min_allow_ttl: Duration::from_secs(60),
            max_allow_ttl: Duration::from_secs(24 * 3600),
        }
    }

    fn check(&self) -> Result<(), DnsError> {
        let bad = |what: &str| Err(DnsError::Config(what.to_string()));
        if self.upstreams.is_empty() {
            return bad("no upstream resolver");
        }
        if self
            .upstreams
            .iter()
            .any(|u| u.port() == 0 || u.ip().is_unspecified())
        {
            return bad("an upstream needs an address and a port");
        }
        if self.upstream_timeout.is_zero() || self.sink_timeout.is_zero() {
            return bad("timeouts must be above zero");
        }
        if self.rate.per_second == 0 || self.rate.burst == 0 {
            return bad("the rate limit must allow a query");
        }
        if self.max_in_flight == 0 || self.max_in_flight_per_client == 0 || self.max_clients == 0 {
            return bad("the caps must be above zero");
        }
        if self.max_in_flight > tokio::sync::Semaphore::MAX_PERMITS {
            return bad("max_in_flight is too big");
        }
        if self.min_allow_ttl > self.max_allow_ttl
            || self.max_allow_ttl.as_secs() > u64::from(u32::MAX)
        {
            return bad("min_allow_ttl must not be above max_allow_ttl (at most 2^32 s)");
        }
        Ok(())
    }
}

/// Why the forwarder did not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// Settings that cannot work.
    #[error("dns forwarder settings: {0}")]
    Config(String),
    /// The listening socket.
    #[error("dns forwarder: binding {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}
