//! The forwarder's socket loop, one task per forwarded query, and its
//! counters (see the module above for what happens to a datagram).

use super::limits::{lock, Clients, InFlight};
use super::message::{self, Answer, MAX_MESSAGE};
use super::names::wire_name;
use super::{AllowSink, DnsError, DnsPolicy, ForwarderConfig};
use hickory_proto::op::{Message, Query, ResponseCode};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

/// A running forwarder. [`DnsForwarder::shutdown`] stops it; dropping it
/// stops it too, without waiting.
pub struct DnsForwarder {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// What the forwarder did since it started, and `in_flight` now. Every
/// datagram counts in `received` and then in exactly one of `dropped`,
/// `unknown_clients` or `queries`; every query in exactly one of
/// `throttled`, `refused`, `denied`, `allowed`, `upstream_failures` or
/// `sink_failures` once it is done (until then, or when a shutdown ended
/// it, in none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DnsStats {
    /// Datagrams read from the socket.
    pub received: u64,
    /// Not a one-question DNS query within the size cap: no answer.
    pub dropped: u64,
    /// From an address no slot has: no answer.
    pub unknown_clients: u64,
    /// Queries from known clients.
    pub queries: u64,
    /// Over the client's rate or a cap of queries in flight: no answer.
    pub throttled: u64,
    /// Answered REFUSED (opcode, class or query type).
    pub refused: u64,
    /// Answered NXDOMAIN: a name the slot may not resolve.
    pub denied: u64,
    /// Answered from an upstream (NOERROR or NXDOMAIN), addresses allowed.
    pub allowed: u64,
    /// Answered SERVFAIL: no upstream answered in time, or none well.
    pub upstream_failures: u64,
    /// Answered SERVFAIL: the sink did not take an address.
    pub sink_failures: u64,
    /// Queries waiting on an upstream (or the sink) now.
    pub in_flight: u64,
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    dropped: AtomicU64,
    unknown_clients: AtomicU64,
    queries: AtomicU64,
    throttled: AtomicU64,
    refused: AtomicU64,
    denied: AtomicU64,
    allowed: AtomicU64,
    upstream_failures: AtomicU64,
    sink_failures: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What the socket loop and the query tasks share.
struct Shared {
    config: ForwarderConfig,
    policy: Arc<dyn DnsPolicy>,
    sink: Arc<dyn AllowSink>,
    counters: Counters,
    clients: Arc<Mutex<Clients>>,
    in_flight: Arc<Semaphore>,
}

impl DnsForwarder {
    /// Binds `config.listen` and serves on it (on the current tokio
    /// runtime) until [`DnsForwarder::shutdown`] or drop.
    pub async fn bind(
        config: ForwarderConfig,
        policy: Arc<dyn DnsPolicy>,
        sink: Arc<dyn AllowSink>,
    ) -> Result<DnsForwarder, DnsError> {
        config.check()?;
        let bind_err = |source| DnsError::Bind {
            addr: config.listen,
            source,
        };
        let sock = UdpSocket::bind(config.listen).await.map_err(bind_err)?;
        let local_addr = sock.local_addr().map_err(bind_err)?;
        let shared = Arc::new(Shared {
            clients: Arc::new(Mutex::new(Clients::new(
                config.rate,
                config.max_in_flight_per_client,
                config.max_clients,
            ))),
            in_flight: Arc::new(Semaphore::new(config.max_in_flight)),
            config,
            policy,
            sink,
            counters: Counters::default(),
        });
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(serve(Arc::new(sock), shared.clone(), stopped));
        Ok(DnsForwarder {
            local_addr,
            shared,
            stop,
            task,
        })
    }

    /// The address it listens on (the port it got for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Its counters now.
    pub fn stats(&self) -> DnsStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DnsStats {
            received: get(&c.received),
            dropped: get(&c.dropped),
            unknown_clients: get(&c.unknown_clients),
            queries: get(&c.queries),
            throttled: get(&c.throttled),
            refused: get(&c.refused),
            denied: get(&c.denied),
            allowed: get(&c.allowed),
            upstream_failures: get(&c.upstream_failures),
            sink_failures: get(&c.sink_failures),
            in_flight: u64::try_from(
                self.shared
                    .config
                    .max_in_flight
                    .saturating_sub(self.shared.in_flight.available_permits()),
            )
            .unwrap_or(u64::MAX),
        }
    }

    /// Stops reading, ends the queries in flight unanswered and returns
    /// once the socket is closed.
    pub async fn shutdown(self) {
        let DnsForwarder { stop, task, .. } = self;
        let _ = stop.send(true);
        if let Err(e) = task.await {
            tracing::warn!("dns forwarder: its task ended badly: {e}");
        }
    }
}

/// Reads datagrams until `stop` changes (or its sender is gone), then
/// aborts the queries in flight.
async fn serve(sock: Arc<UdpSocket>, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut tasks = JoinSet::new();
    // One byte over the cap, to tell a datagram at the cap from a bigger one.
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    loop {
        let received = tokio::select! {
            r = sock.recv_from(&mut buf) => r,
            _ = stop.changed() => break,
            Some(done) = tasks.join_next() => {
                if let Err(e) = done {
                    if e.is_panic() {
                        tracing::error!("dns forwarder: a query's task panicked: {e}");
                    }
                }
                continue;
            }
        };
        match received {
            Ok((n, peer)) => {
                if let Some(job) = shared.handle(&sock, &buf[..n], peer) {
                    tasks.spawn(job);
                }
            }
            Err(e) => {
                // Nothing a client sends causes this; do not spin on it.
                tracing::warn!("dns forwarder: receiving: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    tasks.shutdown().await;
}

impl Shared {
    /// Steps 1 to 6 of the module's list, without waiting: answers locally
    /// or returns the task that forwards the query.
    fn handle(
        self: &Arc<Self>,
        sock: &Arc<UdpSocket>,
        buf: &[u8],
        peer: SocketAddr,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let c = &self.counters;
        bump(&c.received);
        let Some(query) = message::parse_query(buf) else {
            bump(&c.dropped);
            return None;
        };
        let client = peer.ip().to_canonical();
        let refused = message::refused(&query);
        let (slot, name_allowed) = {
            let Some(view) = self.policy.lookup(client) else {
                bump(&c.unknown_clients);
                return None;
            };
            let allowed = !refused
                && wire_name(message::question(&query).name())
                    .is_some_and(|name| view.name_allowed(&name));
            (view.slot().to_string(), allowed)
        };
        bump(&c.queries);
        if !lock(&self.clients).admit(client, std::time::Instant::now()) {
            bump(&c.throttled);
            return None;
        }
        if refused || !name_allowed {
            let (rcode, counter) = if refused {
                (ResponseCode::Refused, &c.refused)
            } else {
                (ResponseCode::NXDomain, &c.denied)
            };
            bump(counter);
            if let Some(reply) = message::local_reply(&query, rcode) {
                // A full send buffer drops the reply, as the network would.
                if let Err(e) = sock.try_send_to(&reply, peer) {
                    tracing::debug!("dns forwarder: replying to {peer}: {e}");
                }
            }
            return None;
        }
        let guard = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .ok()
            .and_then(|permit| InFlight::begin(&self.clients, client, permit));
        let Some(guard) = guard else {
            bump(&c.throttled);
            return None;
        };
        let (shared, sock) = (self.clone(), sock.clone());
        Some(async move { shared.forward(&sock, query, slot, peer, guard).await })
    }

    /// Step 6 and 7: the upstreams, the sink, the reply.
    async fn forward(
        &self,
        sock: &UdpSocket,
        query: Message,
        slot: String,
        peer: SocketAddr,
        guard: InFlight,
    ) {
        let c = &self.counters;
        let q = message::question(&query).clone();
        let mut pending_sink = None;
        let reply = match self.resolve(&q).await {
            None => {
                bump(&c.upstream_failures);
                message::local_reply(&query, ResponseCode::ServFail)
            }
            Some(answer) => match self.allow_all(slot, &answer).await {
                Ok(()) => {
                    bump(&c.allowed);
                    message::answer_reply(&query, &answer)
                }
                Err(failure) => {
                    tracing::warn!(
                        "dns forwarder: {q}: allowing its addresses: {}",
                        failure.why
                    );
                    bump(&c.sink_failures);
                    pending_sink = failure.pending;
                    message::local_reply(&query, ResponseCode::ServFail)
                }
            },
        };
        if let Some(bytes) = reply {
            if let Err(e) = sock.send_to(&bytes, peer).await {
                tracing::debug!("dns forwarder: replying to {peer}: {e}");
            }
        }
        // A sink past its timeout still holds this query's place in flight
        // until it returns: a stuck sink cannot pile up blocking calls.
        if let Some(job) = pending_sink {
            let _ = job.await;
        }
        drop(guard);
    }

    /// The answer of the first upstream that gives one within its share
    /// of the deadline (what is left, split over the upstreams left).
    async fn resolve(&self, q: &Query) -> Option<Answer> {
        let deadline = tokio::time::Instant::now() + self.config.upstream_timeout;
        let max_ttl = u32::try_from(self.config.max_allow_ttl.as_secs()).unwrap_or(u32::MAX);
        let ups = &self.config.upstreams;
        for (i, up) in ups.iter().enumerate() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let share = left / u32::try_from(ups.len() - i).unwrap_or(u32::MAX);
            match tokio::time::timeout(share, exchange(*up, q)).await {
                Ok(Ok(reply)) => match message::answer_of(reply, q, max_ttl) {
                    Some(answer) => return Some(answer),
                    None => tracing::debug!("dns forwarder: {up} failed {q}"),
                },
                Ok(Err(e)) => tracing::debug!("dns forwarder: {up}: {e}"),
                Err(_) => tracing::debug!("dns forwarder: {up}: no reply to {q} within {share:?}"),
            }
        }
        None
    }

    /// Gives the sink every address of `answer`, on the blocking pool,
    /// within the sink timeout.
    async fn allow_all(&self, slot: String, answer: &Answer) -> Result<(), SinkFailure> {
        let (min, max) = (self.config.min_allow_ttl, self.config.max_allow_ttl);
        let addrs: Vec<(IpAddr, Duration)> = answer
            .addresses()
            .map(|(ip, ttl)| (ip, Duration::from_secs(u64::from(ttl)).clamp(min, max)))
            .collect();
        if addrs.is_empty() {
            return Ok(());
        }
        let sink = self.sink.clone();
        let mut job = tokio::task::spawn_blocking(move || {
            addrs.into_iter().try_for_each(|(ip, ttl)| {
                sink.allow(&slot, ip, ttl)
                    .map_err(|e| format!("{ip} for {}s: {e}", ttl.as_secs()))
            })
        });
        let failed = |why: String, pending| Err(SinkFailure { why, pending });
        match tokio::time::timeout(self.config.sink_timeout, &mut job).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(why))) => failed(why, None),
            Ok(Err(e)) => failed(format!("the sink panicked: {e}"), None),
            Err(_) => failed(
                format!(
                    "no answer from the sink within {:?}",
                    self.config.sink_timeout
                ),
                Some(job),
            ),
        }
    }
}

/// Why an answer's addresses were not all allowed, and the sink call
/// still running if it timed out.
struct SinkFailure {
    why: String,
    pending: Option<JoinHandle<Result<(), String>>>,
}

/// One query to one upstream from a fresh socket connected to it (so only
/// its datagrams arrive, on a random port); stray replies are skipped.
async fn exchange(up: SocketAddr, q: &Query) -> io::Result<Message> {
    let any: IpAddr = match up {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = UdpSocket::bind((any, 0)).await?;
    sock.connect(up).await?;
    let (id, bytes) =
        message::upstream_query(q).ok_or_else(|| io::Error::other("the query does not encode"))?;
    sock.send(&bytes).await?;
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    loop {
        let n = sock.recv(&mut buf).await?;
        if let Some(reply) = message::upstream_reply(&buf[..n], id, q) {
            return Ok(reply);
        }
        tracing::debug!("dns forwarder: {up}: a datagram that is no reply to {q}");
    }
}
