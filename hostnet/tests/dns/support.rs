//! The forwarder's surroundings in its tests: a policy and a sink that
//! record what they are asked, sandbox clients on loopback addresses, and
//! the forwarder between them and the test upstream.

use super::upstream::Upstream;
use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::{Name, RecordType};
use shoal_hostnet::dns::names::NameRules;
use shoal_hostnet::dns::{AllowSink, DnsForwarder, DnsPolicy, DnsStats, ForwarderConfig, SlotView};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::net::UdpSocket;

/// How long a test waits for anything that must happen.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Sandbox A (slot `sb-a`), sandbox B (`sb-b`), and an address no slot has.
pub const CLIENT_A: [u8; 4] = [127, 0, 0, 2];
pub const CLIENT_B: [u8; 4] = [127, 0, 0, 3];
pub const STRANGER: [u8; 4] = [127, 0, 0, 9];

/// What both sandboxes may resolve.
pub const ALLOW: &[&str] = &[
    "pypi.example.test",
    "*.cdn.example.test",
    "www.chain.example.test",
    "v6.example.test",
    "long.example.test",
    "FOREVER.example.test.",
    "slow.example.test",
    "forged.example.test",
    "gone.example.test",
];
pub const DENY: &[&str] = &["denied.cdn.example.test"];

/// The policy double: a slot per client address, each with [`NameRules`].
pub struct Policy {
    slots: HashMap<IpAddr, (String, NameRules)>,
}

struct View<'a> {
    slot: &'a str,
    rules: &'a NameRules,
}

impl SlotView for View<'_> {
    fn slot(&self) -> &str {
        self.slot
    }
    fn name_allowed(&self, name: &str) -> bool {
        self.rules.allows(name)
    }
}

impl DnsPolicy for Policy {
    fn lookup(&self, client: IpAddr) -> Option<Box<dyn SlotView + '_>> {
        self.slots
            .get(&client)
            .map(|(slot, rules)| Box::new(View { slot, rules }) as Box<dyn SlotView>)
    }
}

/// The sink double: records every call; fails while `fail` is set; does
/// not return while `held` is set.
#[derive(Default)]
pub struct Sink {
    pub calls: Mutex<Vec<(String, IpAddr, Duration)>>,
    pub fail: AtomicBool,
    held: Mutex<bool>,
    released: Condvar,
}

impl AllowSink for Sink {
    fn allow(&self, slot: &str, addr: IpAddr, ttl: Duration) -> Result<(), String> {
        let held = self.held.lock().unwrap();
        drop(self.released.wait_while(held, |h| *h).unwrap());
        if self.fail.load(Ordering::SeqCst) {
            return Err("nftables said no".into());
        }
        self.calls
            .lock()
            .unwrap()
            .push((slot.to_string(), addr, ttl));
        Ok(())
    }
}

impl Sink {
    /// Holds (true) or releases (false) every call.
    pub fn hold(&self, on: bool) {
        *self.held.lock().unwrap() = on;
        self.released.notify_all();
    }

    pub fn calls(&self) -> Vec<(String, IpAddr, Duration)> {
        self.calls.lock().unwrap().clone()
    }
}

/// A forwarder on 127.0.0.1 between the test clients and upstream(s).
pub struct Setup {
    pub upstream: Upstream,
    pub sink: Arc<Sink>,
    pub fwd: DnsForwarder,
}

/// The defaults with a 2 s upstream deadline, changed by `tune`;
/// forwarding to a fresh test upstream (and whatever `tune` puts first).
pub async fn setup(tune: impl FnOnce(&mut ForwarderConfig)) -> Setup {
    let upstream = Upstream::start().await;
    let mut config = ForwarderConfig::new("127.0.0.1:0".parse().unwrap(), vec![upstream.addr]);
    tune(&mut config);
    let rules = NameRules::parse(ALLOW.iter().copied(), DENY.iter().copied()).unwrap();
    let policy = Policy {
        slots: HashMap::from([
            (IpAddr::from(CLIENT_A), ("sb-a".to_string(), rules.clone())),
            (IpAddr::from(CLIENT_B), ("sb-b".to_string(), rules)),
        ]),
    };
    let sink = Arc::new(Sink::default());
    let fwd = DnsForwarder::bind(config, Arc::new(policy), sink.clone())
        .await
        .expect("starting the forwarder on 127.0.0.1");
    Setup {
        upstream,
        sink,
        fwd,
    }
}

impl Setup {
    pub fn stats(&self) -> DnsStats {
        self.fwd.stats()
    }

    /// Waits until the forwarder's counters satisfy `what`.
    pub async fn wait_stats(&self, what: &str, f: impl Fn(&DnsStats) -> bool) {
        let start = tokio::time::Instant::now();
        while !f(&self.stats()) {
            assert!(
                start.elapsed() < PATIENCE,
                "waited {PATIENCE:?} for {what}; counters: {:?}",
                self.stats()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A sandbox's socket on `ip`.
pub async fn client(ip: [u8; 4]) -> UdpSocket {
    UdpSocket::bind((IpAddr::from(ip), 0))
        .await
        .unwrap_or_else(|e| panic!("binding a client on {ip:?}: {e} (127.0.0.0/8 must be on lo)"))
}

/// A query for `name` with `id` (EDNS when `edns`).
pub fn query(name: &str, t: RecordType, id: u16, edns: bool) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    if edns {
        m.set_edns(Edns::new());
    }
    m.to_vec().unwrap()
}

/// The next datagram `sock` gets, as a DNS message, within [`PATIENCE`].
pub async fn next_reply(sock: &UdpSocket) -> Message {
    let mut buf = vec![0u8; 65536];
    let n = tokio::time::timeout(PATIENCE, sock.recv(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("no reply within {PATIENCE:?}"))
        .unwrap();
    Message::from_vec(&buf[..n]).expect("the reply is DNS")
}

/// Sends a query from `sock` to `to` and returns the reply with its id.
pub async fn ask(sock: &UdpSocket, to: SocketAddr, name: &str, t: RecordType) -> Message {
    let id = rand_id(name);
    sock.send_to(&query(name, t, id, true), to).await.unwrap();
    let reply = next_reply(sock).await;
    assert_eq!(reply.metadata.id, id, "the reply has the query's id");
    reply
}

/// An id that differs per name (ids are the test's; the forwarder's
/// upstream ids are its own).
fn rand_id(name: &str) -> u16 {
    name.bytes()
        .fold(0x5a5au16, |h, b| h.rotate_left(5) ^ u16::from(b))
}

/// Asserts that nothing waits on `sock` (after the forwarder counted the
/// datagram it would have answered, so a reply would be there already).
pub fn assert_silent(sock: &UdpSocket) {
    let mut buf = [0u8; 512];
    match sock.try_recv(&mut buf) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Ok(n) => panic!(
            "expected no reply, got {n} bytes: {:?}",
            Message::from_vec(&buf[..n])
        ),
        Err(e) => panic!("expected no reply, got {e}"),
    }
}

/// The A/AAAA addresses in a reply's answer section.
pub fn addresses(m: &Message) -> Vec<IpAddr> {
    m.answers.iter().filter_map(|r| r.data.ip_addr()).collect()
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
