//! The connection table: routes guest packets to connections (or answers
//! RST), queues what is owed to the guest, and records which host sockets
//! the event thread must (un)watch.

use super::conn::{Conn, RxOutcome, Verdict};
use super::packet::{write_rx, Op, RxHeader, RxPacket, TxPacket};
use super::unix;
use super::{FIRST_LOCAL_PORT, MAX_CONNECTIONS, MAX_GUEST_CONNECTIONS};
use event_manager::EventSet;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// RSTs for packets that match no connection, queued before the device
/// stops taking guest TX packets until the guest drains RX.
pub const RST_BACKLOG: usize = 256;

/// A connection's identity: (host-side port, guest-side port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// Host-side port.
    pub local_port: u32,
    /// Guest-side port.
    pub peer_port: u32,
}

/// Something owed to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxItem {
    /// A connection has packets pending (at most one entry per connection).
    Conn(ConnKey),
    /// An RST for a connection that no longer (or never) existed.
    Rst(ConnKey),
}

/// Counters for the VMM and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Guest packets dropped as malformed or mis-addressed.
    pub tx_dropped: u64,
    /// RSTs sent to the guest.
    pub rst_sent: u64,
    /// Connections created.
    pub opened: u64,
    /// Connections removed.
    pub closed: u64,
    /// Connections refused because the table (or the guest's share of it)
    /// was full.
    pub refused: u64,
    /// Host connections closed because the guest did not accept them in
    /// time, and host sockets that did not finish their CONNECT line.
    pub connect_timeouts: u64,
}

/// All connections of one device.
pub struct Muxer {
    cid: u64,
    uds_path: PathBuf,
    conns: HashMap<ConnKey, Conn>,
    host_ports: HashSet<u32>,
    next_port: u32,
    rxq: VecDeque<RxItem>,
    queued: HashSet<ConnKey>,
    rst_backlog: usize,
    graveyard: Vec<UnixStream>,
    touched: HashSet<ConnKey>,
    /// Host sockets still sending their CONNECT line (owned by the event
    /// thread, counted against [`MAX_CONNECTIONS`]).
    pub handshakes: usize,
    /// Counters.
    pub counters: Counters,
}

impl Muxer {
    /// An empty table for guest `cid`, host side at `uds_path`.
    pub fn new(cid: u64, uds_path: &Path) -> Self {
        Self {
            cid,
            uds_path: uds_path.to_owned(),
            conns: HashMap::new(),
            host_ports: HashSet::new(),
            next_port: FIRST_LOCAL_PORT,
            rxq: VecDeque::new(),
            queued: HashSet::new(),
            rst_backlog: 0,
            graveyard: Vec::new(),
            touched: HashSet::new(),
            handshakes: 0,
            counters: Counters::default(),
        }
    }

    /// The guest's cid.
    pub fn cid(&self) -> u64 {
        self.cid
    }

    /// Live connections.
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// Whether a new connection must be refused.
    pub fn at_capacity(&self) -> bool {
        self.conns.len() + self.handshakes + self.rst_backlog >= MAX_CONNECTIONS
    }

    /// Guest->host bytes held for slow host readers, all connections.
    pub fn buffered_bytes(&self) -> usize {
        self.conns.values().map(Conn::tx_buffered).sum()
    }

    /// Guest-initiated connections.
    fn guest_conns(&self) -> usize {
        self.conns.len().saturating_sub(self.host_ports.len())
    }

    /// Whether a host connection waits for the guest's RESPONSE.
    pub fn awaiting_responses(&self) -> bool {
        self.conns.values().any(Conn::awaiting_response)
    }

    /// Closes the host connections the guest has not accepted within
    /// `timeout` (resetting the guest's half); returns how many.
    pub fn expire_connects(&mut self, now: Instant, timeout: Duration) -> usize {
        let late: Vec<ConnKey> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.awaiting_response() && now.saturating_duration_since(c.opened_at) >= timeout
            })
            .map(|(k, _)| *k)
            .collect();
        for key in &late {
            self.kill(*key, true);
        }
        self.counters.connect_timeouts += u64::try_from(late.len()).unwrap_or(u64::MAX);
        late.len()
    }

    /// Whether guest TX processing must wait for the guest to drain RX.
    pub fn tx_paused(&self) -> bool {
        self.rst_backlog >= RST_BACKLOG
    }

    /// Whether anything is owed to the guest.
    pub fn has_rx(&self) -> bool {
        !self.rxq.is_empty()
    }

    fn alloc_port(&mut self, peer_port: u32) -> Option<u32> {
        // At most MAX_CONNECTIONS ports are taken, so this finds one quickly.
        for _ in 0..=MAX_CONNECTIONS + 1 {
            let p = self.next_port;
            self.next_port = self.next_port.checked_add(1).unwrap_or(FIRST_LOCAL_PORT);
            let key = ConnKey {
                local_port: p,
                peer_port,
            };
            if !self.host_ports.contains(&p) && !self.conns.contains_key(&key) {
                return Some(p);
            }
        }
        None
    }

    /// Adds a host-initiated connection to guest `port` and queues its
    /// REQUEST; gives the socket back if the table is full. The socket is
    /// already watched by the event thread (it carried the CONNECT line).
    pub fn add_host_conn(&mut self, stream: UnixStream, port: u32) -> Result<ConnKey, UnixStream> {
        if self.at_capacity() {
            self.counters.refused += 1;
            return Err(stream);
        }
        let Some(local_port) = self.alloc_port(port) else {
            return Err(stream);
        };
        let key = ConnKey {
            local_port,
            peer_port: port,
        };
        self.host_ports.insert(local_port);
        let mut conn = Conn::new_local(stream, local_port, port);
        conn.watched = true;
        self.conns.insert(key, conn);
        self.counters.opened += 1;
        self.touch(key);
        Ok(key)
    }

    /// Notes that `key` changed: re-check its epoll interest, and queue it
    /// if it owes the guest a packet.
    fn touch(&mut self, key: ConnKey) {
        self.touched.insert(key);
        let pending = self.conns.get(&key).is_some_and(Conn::has_pending_rx);
        if pending && self.queued.insert(key) {
            self.rxq.push_back(RxItem::Conn(key));
        }
    }

    fn push_rst(&mut self, key: ConnKey) {
        self.rxq.push_back(RxItem::Rst(key));
        self.rst_backlog += 1;
    }

    /// Removes a connection. A socket epoll watches waits in the graveyard
    /// until the event thread has unwatched it; any other is closed now.
    pub fn kill(&mut self, key: ConnKey, rst: bool) {
        let Some(c) = self.conns.remove(&key) else {
            return;
        };
        if c.host_initiated {
            self.host_ports.remove(&c.local_port);
        }
        if self.queued.remove(&key) {
            self.rxq.retain(|i| *i != RxItem::Conn(key));
        }
        if rst && c.guest_knows() {
            self.push_rst(key);
        }
        if c.watched {
            self.graveyard.push(c.stream);
        }
        self.counters.closed += 1;
    }

    /// Drops every connection without telling the guest (device or
    /// transport reset).
    pub fn kill_all(&mut self) {
        let keys: Vec<ConnKey> = self.conns.keys().copied().collect();
        for key in keys {
            self.kill(key, false);
        }
        self.rxq.clear();
        self.queued.clear();
        self.rst_backlog = 0;
    }

    fn apply(&mut self, key: ConnKey, v: Verdict) {
        match v {
            Verdict::Keep => self.touch(key),
            Verdict::Kill { rst } => self.kill(key, rst),
        }
    }

    /// Handles one validated guest packet.
    pub fn on_guest_pkt(&mut self, pkt: &TxPacket<'_>) {
        let key = ConnKey {
            local_port: pkt.dst_port,
            peer_port: pkt.src_port,
        };
        if !pkt.stream {
            if pkt.op != Some(Op::Rst) {
                self.push_rst(key);
            }
            return;
        }
        match self.conns.get_mut(&key) {
            Some(_) if pkt.op == Some(Op::Request) => self.kill(key, true),
            Some(c) => {
                let v = c.on_guest_pkt(pkt);
                self.apply(key, v);
            }
            None => match pkt.op {
                Some(Op::Request) => self.guest_connect(key, pkt),
                Some(Op::Rst) => {}
                _ => self.push_rst(key),
            },
        }
    }

    /// A guest connects to host port `key.local_port`: forward it to the
    /// listener at `<uds_path>_<port>`, or refuse.
    fn guest_connect(&mut self, key: ConnKey, pkt: &TxPacket<'_>) {
        if self.at_capacity() || self.guest_conns() >= MAX_GUEST_CONNECTIONS {
            self.counters.refused += 1;
            self.push_rst(key);
            return;
        }
        let mut path = OsString::from(self.uds_path.as_os_str());
        path.push(format!("_{}", key.local_port));
        match unix::connect_nonblocking(Path::new(&path)) {
            Ok(stream) => {
                self.conns
                    .insert(key, Conn::new_peer(stream, key.local_port, pkt));
                self.counters.opened += 1;
                self.touch(key);
            }
            Err(_) => self.push_rst(key),
        }
    }

    /// Readiness reported for connection `key`'s host socket.
    pub fn on_conn_event(&mut self, key: ConnKey, ev: EventSet) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if ev.contains(EventSet::ERROR) {
            self.kill(key, true);
            return;
        }
        if ev.contains(EventSet::IN) {
            c.on_readable();
        }
        let mut v = Verdict::Keep;
        if ev.contains(EventSet::OUT) {
            v = c.on_writable();
        }
        if v == Verdict::Keep && ev.contains(EventSet::HANG_UP) {
            v = c.on_hup();
        }
        self.apply(key, v);
    }

    /// Writes the next packet owed to the guest into `pkt`; `None` when
    /// nothing is owed.
    pub fn fill_rx(&mut self, pkt: &mut RxPacket<'_>) -> Option<u32> {
        // Each round either writes a packet or clears something a
        // connection owed, so this is bounded; the budget makes sure.
        let mut budget = self.rxq.len().saturating_mul(8).saturating_add(8);
        while budget > 0 {
            budget -= 1;
            let item = self.rxq.pop_front()?;
            let key = match item {
                RxItem::Rst(key) => {
                    self.rst_backlog = self.rst_backlog.saturating_sub(1);
                    self.counters.rst_sent += 1;
                    return Some(write_rx(pkt, &rst_header(self.cid, key)));
                }
                RxItem::Conn(key) => key,
            };
            self.queued.remove(&key);
            let Some(c) = self.conns.get_mut(&key) else {
                continue;
            };
            match c.fill_rx(pkt, self.cid) {
                RxOutcome::Packet(n) => {
                    self.touch(key);
                    return Some(n);
                }
                RxOutcome::Nothing => self.touch(key),
                RxOutcome::Kill => self.kill(key, true),
            }
        }
        None
    }

    /// Sockets of removed connections, to unwatch and close.
    pub fn take_graveyard(&mut self) -> Vec<UnixStream> {
        std::mem::take(&mut self.graveyard)
    }

    /// Connections whose epoll interest may have changed.
    pub fn take_touched(&mut self) -> Vec<ConnKey> {
        self.touched.drain().collect()
    }

    /// Whether the event thread has watch-list work to do.
    pub fn needs_reconcile(&self) -> bool {
        !self.graveyard.is_empty() || !self.touched.is_empty()
    }

    /// Records whether the event thread watches `key`'s socket.
    pub fn set_watched(&mut self, key: ConnKey, watched: bool) {
        if let Some(c) = self.conns.get_mut(&key) {
            c.watched = watched;
        }
    }

    /// The host socket of `key` and what to watch on it (`None`: nothing,
    /// not even hang-ups).
    pub fn watch(&self, key: ConnKey) -> Option<(RawFd, Option<EventSet>)> {
        self.conns
            .get(&key)
            .map(|c| (c.stream.as_raw_fd(), c.interest()))
    }
}

fn rst_header(cid: u64, key: ConnKey) -> RxHeader {
    RxHeader {
        dst_cid: cid,
        src_port: key.local_port,
        dst_port: key.peer_port,
        len: 0,
        op: Op::Rst,
        flags: 0,
        buf_alloc: 0,
        fwd_cnt: 0,
    }
}
