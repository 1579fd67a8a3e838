//! One vsock stream connection: its state machine, credit accounting and
//! the guest->host bytes the host has not taken yet.
//!
//! Credit (virtio spec 5.10.6.3): the device tells the guest
//! `buf_alloc` = [`CONN_TX_BUF_SIZE`] and `fwd_cnt` = bytes handed to the
//! host socket, so the guest never has more than `buf_alloc` bytes in
//! flight; a guest that sends more is reset. In the other direction the
//! device reads from the host socket only as many bytes as the guest's
//! `buf_alloc - (rx_cnt - fwd_cnt)` allows, straight into the guest's RX
//! buffer.

use super::packet::{write_rx, Op, RxHeader, RxPacket, TxPacket, SHUTDOWN_RCV, SHUTDOWN_SEND};
use super::unix;
use super::{CONN_TX_BUF_SIZE, MAX_PKT_DATA};
use event_manager::EventSet;
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::Instant;
use vm_memory::{ReadVolatile, VolatileMemoryError, VolatileSlice};

/// Send a CREDIT_UPDATE once the guest's view of our free space is this
/// far behind the real one.
pub const CREDIT_UPDATE_THRESHOLD: u32 = CONN_TX_BUF_SIZE / 4;

/// Connection life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Host-initiated: REQUEST queued or sent, waiting for RESPONSE.
    LocalInit,
    /// Guest-initiated: host side connected, RESPONSE queued.
    PeerInit,
    /// Data flows.
    Established,
    /// The host socket is gone and the guest was told (SHUTDOWN both
    /// ways); waiting for the guest's RST.
    LocalClosed,
}

/// What the owner must do with a connection after an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep it.
    Keep,
    /// Remove it, resetting the guest side when `rst` (and it knows of it).
    Kill {
        /// Send the guest an RST.
        rst: bool,
    },
}

/// Result of offering a connection one RX buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxOutcome {
    /// A packet of this used length was written.
    Packet(u32),
    /// Nothing to send after all.
    Nothing,
    /// The host socket failed: kill with RST.
    Kill,
}

/// Packets owed to the guest; at most one of each kind, so bounded.
#[derive(Debug, Default)]
struct Pending {
    request: bool,
    response: bool,
    rw: bool,
    shutdown: u32,
    credit_update: bool,
    credit_request: bool,
}

/// One connection.
pub struct Conn {
    /// The host-side socket (non-blocking).
    pub stream: UnixStream,
    /// Host-side port.
    pub local_port: u32,
    /// Guest-side port.
    pub peer_port: u32,
    /// Whether the host opened it (its local port is then ours to free).
    pub host_initiated: bool,
    /// Whether the event thread's epoll watches `stream` (then only that
    /// thread may close it).
    pub watched: bool,
    /// When it was created (a host connection has
    /// [`super::CONNECT_TIMEOUT`] to be accepted by the guest).
    pub opened_at: Instant,
    state: State,
    request_sent: bool,
    pending: Pending,
    tx_buf: VecDeque<u8>,
    fwd_cnt: u32,
    last_fwd_cnt_sent: u32,
    rx_cnt: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    credit_requested: bool,
    host_eof: bool,
    host_hup: bool,
    guest_shut_rcv: bool,
    guest_shut_send: bool,
    host_write_shut: bool,
}

impl Conn {
    fn new(stream: UnixStream, local_port: u32, peer_port: u32, state: State) -> Self {
        Self {
            stream,
            local_port,
            peer_port,
            host_initiated: state == State::LocalInit,
            watched: false,
            opened_at: Instant::now(),
            state,
            request_sent: false,
            pending: Pending::default(),
            tx_buf: VecDeque::new(),
            fwd_cnt: 0,
            last_fwd_cnt_sent: 0,
            rx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            credit_requested: false,
            host_eof: false,
            host_hup: false,
            guest_shut_rcv: false,
            guest_shut_send: false,
            host_write_shut: false,
        }
    }

    /// Host-initiated and not accepted by the guest yet.
    pub fn awaiting_response(&self) -> bool {
        self.state == State::LocalInit
    }

    /// A host-initiated connection; a REQUEST to the guest is queued.
    pub fn new_local(stream: UnixStream, local_port: u32, peer_port: u32) -> Self {
        let mut c = Self::new(stream, local_port, peer_port, State::LocalInit);
        c.pending.request = true;
        c
    }

    /// A guest-initiated connection already connected on the host; a
    /// RESPONSE to the guest is queued.
    pub fn new_peer(stream: UnixStream, local_port: u32, pkt: &TxPacket<'_>) -> Self {
        let mut c = Self::new(stream, local_port, pkt.src_port, State::PeerInit);
        c.peer_buf_alloc = pkt.buf_alloc;
        c.peer_fwd_cnt = pkt.fwd_cnt;
        c.pending.response = true;
        c
    }

    /// Whether the guest has heard of this connection (so an RST means
    /// something to it).
    pub fn guest_knows(&self) -> bool {
        self.state != State::LocalInit || self.request_sent
    }

    /// Whether a packet is owed to the guest.
    pub fn has_pending_rx(&self) -> bool {
        let p = &self.pending;
        p.request || p.response || p.rw || p.shutdown != 0 || p.credit_update || p.credit_request
    }

    /// Guest->host bytes held because the host has not read them yet.
    pub fn tx_buffered(&self) -> usize {
        self.tx_buf.len()
    }

    /// Bytes the guest can still take on this connection.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = self.rx_cnt.wrapping_sub(self.peer_fwd_cnt);
        // A guest reporting more consumed than was sent gets no credit.
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    fn can_read(&self) -> bool {
        self.state == State::Established
            && !self.host_eof
            && !self.guest_shut_rcv
            && self.peer_credit() > 0
    }

    /// Readiness to watch on the host socket; `None`: do not watch it at
    /// all (the host hung up; what it left is read as credit allows).
    pub fn interest(&self) -> Option<EventSet> {
        if self.host_hup {
            return None;
        }
        let mut ev = EventSet::empty();
        if self.can_read() && !self.pending.rw {
            ev |= EventSet::IN;
        }
        if !self.tx_buf.is_empty() {
            ev |= EventSet::OUT;
        }
        Some(ev)
    }

    fn header(&self, guest_cid: u64, op: Op) -> RxHeader {
        RxHeader {
            dst_cid: guest_cid,
            src_port: self.local_port,
            dst_port: self.peer_port,
            len: 0,
            op,
            flags: 0,
            buf_alloc: CONN_TX_BUF_SIZE,
            fwd_cnt: self.fwd_cnt,
        }
    }

    /// Writes the next owed packet into `pkt`.
    pub fn fill_rx(&mut self, pkt: &mut RxPacket<'_>, guest_cid: u64) -> RxOutcome {
        let mut hdr = self.header(guest_cid, Op::CreditUpdate);
        if self.pending.request {
            self.pending.request = false;
            self.request_sent = true;
            hdr.op = Op::Request;
        } else if self.pending.response {
            self.pending.response = false;
            self.state = State::Established;
            hdr.op = Op::Response;
        } else if self.pending.rw {
            match self.read_host(pkt, &mut hdr) {
                RxOutcome::Packet(_) => {}
                other => return other,
            }
        } else if self.pending.shutdown != 0 {
            hdr.op = Op::Shutdown;
            hdr.flags = std::mem::take(&mut self.pending.shutdown);
        } else if self.pending.credit_update {
            hdr.op = Op::CreditUpdate;
        } else if self.pending.credit_request {
            self.pending.credit_request = false;
            hdr.op = Op::CreditRequest;
        } else {
            return RxOutcome::Nothing;
        }
        // Every packet carries our credit, so no separate update is owed.
        self.pending.credit_update = false;
        self.last_fwd_cnt_sent = self.fwd_cnt;
        RxOutcome::Packet(write_rx(pkt, &hdr))
    }

    /// Reads host bytes into the payload area, bounded by the guest's credit.
    fn read_host(&mut self, pkt: &mut RxPacket<'_>, hdr: &mut RxHeader) -> RxOutcome {
        self.pending.rw = false;
        if !self.can_read() {
            return RxOutcome::Nothing;
        }
        let Some(data) = pkt.data_slice().copied() else {
            // A buffer with no payload room: spend it on a credit update
            // and keep the data for the next buffer.
            self.pending.rw = true;
            return RxOutcome::Packet(0);
        };
        let max = (self.peer_credit().min(MAX_PKT_DATA) as usize).min(data.len());
        // A zero-length read would look like EOF.
        let Ok(mut dst) = data.subslice(0, max).and_then(|d| {
            if d.is_empty() {
                Err(vm_memory::VolatileMemoryError::OutOfBounds { addr: 0 })
            } else {
                Ok(d)
            }
        }) else {
            return RxOutcome::Nothing;
        };
        match (&self.stream).read_volatile(&mut dst) {
            Ok(0) => self.on_host_eof(),
            Ok(n) => {
                // n <= max <= MAX_PKT_DATA, so it fits in u32.
                #[allow(clippy::cast_possible_truncation)]
                let n = n as u32;
                self.rx_cnt = self.rx_cnt.wrapping_add(n);
                hdr.op = Op::Rw;
                hdr.len = n;
                if self.peer_credit() == 0 && !self.credit_requested {
                    self.credit_requested = true;
                    self.pending.credit_request = true;
                }
                // A full buffer suggests more is waiting: try the next RX
                // buffer at once rather than after another epoll round.
                // After a hang-up there is no epoll: drain while allowed.
                self.pending.rw = (n as usize == max || self.host_hup) && self.can_read();
                RxOutcome::Packet(0)
            }
            Err(VolatileMemoryError::IOError(e)) if e.kind() == ErrorKind::WouldBlock => {
                RxOutcome::Nothing
            }
            Err(VolatileMemoryError::IOError(e)) if e.kind() == ErrorKind::Interrupted => {
                self.pending.rw = true;
                RxOutcome::Nothing
            }
            Err(_) => RxOutcome::Kill,
        }
    }

    /// The host will send no more.
    fn on_host_eof(&mut self) -> RxOutcome {
        self.host_eof = true;
        if self.host_hup {
            // Gone both ways: tell the guest and wait for its RST.
            self.state = State::LocalClosed;
            self.pending.shutdown = SHUTDOWN_RCV | SHUTDOWN_SEND;
        } else if self.guest_shut_send && self.tx_buf.is_empty() {
            return RxOutcome::Kill;
        } else {
            self.pending.shutdown |= SHUTDOWN_SEND;
        }
        RxOutcome::Nothing
    }

    /// Handles a packet the guest sent on this connection.
    pub fn on_guest_pkt(&mut self, pkt: &TxPacket<'_>) -> Verdict {
        self.peer_buf_alloc = pkt.buf_alloc;
        self.peer_fwd_cnt = pkt.fwd_cnt;
        let verdict = match pkt.op {
            Some(Op::Rst) => return Verdict::Kill { rst: false },
            Some(Op::Response) if self.state == State::LocalInit && self.request_sent => {
                self.state = State::Established;
                self.send_ok()
            }
            Some(Op::Rw) => self.guest_data(pkt.data),
            Some(Op::CreditUpdate) => Verdict::Keep,
            Some(Op::CreditRequest) => {
                self.pending.credit_update = true;
                Verdict::Keep
            }
            Some(Op::Shutdown) => self.guest_shutdown(pkt.flags),
            // A second REQUEST, a RESPONSE out of turn, an unknown op.
            _ => Verdict::Kill { rst: true },
        };
        self.refresh();
        verdict
    }

    fn send_ok(&mut self) -> Verdict {
        let msg = format!("OK {}\n", self.local_port);
        match unix::send(&self.stream, msg.as_bytes()) {
            Ok(n) if n == msg.len() => Verdict::Keep,
            _ => Verdict::Kill { rst: true },
        }
    }

    /// Guest data for the host: sent at once as far as the host takes it,
    /// the rest kept within the credit the guest was given.
    fn guest_data(&mut self, data: Option<VolatileSlice<'_, ()>>) -> Verdict {
        if self.state != State::Established || self.guest_shut_send || self.host_hup {
            return Verdict::Kill { rst: true };
        }
        let Some(data) = data else {
            return Verdict::Keep;
        };
        let len = data.len();
        if self.tx_buf.len().saturating_add(len) > CONN_TX_BUF_SIZE as usize {
            // The guest ignored its credit.
            return Verdict::Kill { rst: true };
        }
        let mut sent = 0;
        if self.tx_buf.is_empty() {
            match unix::send_volatile(&self.stream, &data) {
                Ok(n) => sent = n.min(len),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(_) => return Verdict::Kill { rst: true },
            }
        }
        if sent < len {
            let Ok(rest) = data.subslice(sent, len - sent) else {
                return Verdict::Kill { rst: true };
            };
            // len <= MAX_PKT_DATA (checked by the parser).
            let mut tmp = vec![0u8; rest.len()];
            let copied = rest.copy_to(&mut tmp[..]);
            self.tx_buf.extend(&tmp[..copied]);
        }
        // sent <= len <= MAX_PKT_DATA.
        #[allow(clippy::cast_possible_truncation)]
        let sent = sent as u32;
        self.fwd_cnt = self.fwd_cnt.wrapping_add(sent);
        self.after_forward()
    }

    /// The host socket can take more: flush what the guest sent.
    pub fn on_writable(&mut self) -> Verdict {
        while !self.tx_buf.is_empty() {
            let (front, _) = self.tx_buf.as_slices();
            match unix::send(&self.stream, front) {
                Ok(0) => break,
                Ok(n) => {
                    let n = n.min(front.len());
                    self.tx_buf.drain(..n);
                    // n <= CONN_TX_BUF_SIZE.
                    #[allow(clippy::cast_possible_truncation)]
                    let n = n as u32;
                    self.fwd_cnt = self.fwd_cnt.wrapping_add(n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Verdict::Kill { rst: true },
            }
        }
        self.after_forward()
    }

    /// Credit bookkeeping and deferred shutdowns once bytes reached the host.
    fn after_forward(&mut self) -> Verdict {
        if self.fwd_cnt.wrapping_sub(self.last_fwd_cnt_sent) >= CREDIT_UPDATE_THRESHOLD {
            self.pending.credit_update = true;
        }
        if !self.tx_buf.is_empty() {
            return Verdict::Keep;
        }
        if self.tx_buf.capacity() > 0 {
            self.tx_buf = VecDeque::new();
        }
        if self.guest_shut_send && (self.guest_shut_rcv || self.host_eof) {
            // Nothing more can flow either way.
            return Verdict::Kill { rst: true };
        }
        if self.guest_shut_send && !self.host_write_shut {
            self.host_write_shut = true;
            if self.stream.shutdown(Shutdown::Write).is_err() {
                return Verdict::Kill { rst: true };
            }
        }
        Verdict::Keep
    }

    fn guest_shutdown(&mut self, flags: u32) -> Verdict {
        self.guest_shut_rcv |= flags & SHUTDOWN_RCV != 0;
        self.guest_shut_send |= flags & SHUTDOWN_SEND != 0;
        match self.state {
            State::Established => self.after_forward(),
            // The host side is gone or never came up: finish now.
            _ => Verdict::Kill { rst: true },
        }
    }

    /// The host socket is readable.
    pub fn on_readable(&mut self) {
        if self.can_read() {
            self.pending.rw = true;
        }
    }

    /// The host closed its socket. What it wrote before is still delivered
    /// (as credit allows); what the guest sends can no longer arrive.
    pub fn on_hup(&mut self) -> Verdict {
        if self.state != State::Established || self.host_eof || self.guest_shut_rcv {
            return Verdict::Kill { rst: true };
        }
        self.host_hup = true;
        self.tx_buf = VecDeque::new();
        // No more readiness events: drain by reading whenever credit allows.
        self.refresh();
        Verdict::Keep
    }

    fn refresh(&mut self) {
        if self.peer_credit() > 0 {
            self.credit_requested = false;
        }
        if self.host_hup && self.can_read() {
            self.pending.rw = true;
        }
    }
}
