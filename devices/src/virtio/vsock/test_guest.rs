//! A guest for vsock tests: the shared test driver plus RX/TX/event buffer
//! management and packet (de)coding, with the device's event half on an
//! `EventManager` pumped in the test thread.

use super::{Vsock, VsockEvents, VsockHandle, HOST_CID};
use crate::virtio::testing::{mem_sized, Driver};
use crate::virtio::VIRTIO_F_VERSION_1;
use event_manager::{EventManager, SubscriberOps};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use vm_memory::{Bytes, GuestAddress};

pub const CID: u64 = 3;
pub const QSIZE: u16 = 256;
const EVQ_SIZE: u16 = 16;
const RX_AREA: u64 = 0x10_0000;
const RX_STRIDE: u64 = 0x2000;
pub const RX_DATA: u32 = 4096;
const EV_AREA: u64 = 0x30_0000;
const TX_AREA: u64 = 0x40_0000;
const TX_STRIDE: u64 = 0x1_1000;
const MEM_SIZE: usize = 32 << 20;

pub mod op {
    pub const REQUEST: u16 = 1;
    pub const RESPONSE: u16 = 2;
    pub const RST: u16 = 3;
    pub const SHUTDOWN: u16 = 4;
    pub const RW: u16 = 5;
    pub const CREDIT_UPDATE: u16 = 6;
    pub const CREDIT_REQUEST: u16 = 7;
}

/// A decoded packet (either direction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pkt {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
    pub data: Vec<u8>,
}

impl Pkt {
    /// A well-formed guest->host packet.
    pub fn guest(op: u16, src_port: u32, dst_port: u32) -> Self {
        Self {
            src_cid: CID,
            dst_cid: HOST_CID,
            src_port,
            dst_port,
            len: 0,
            type_: 1,
            op,
            flags: 0,
            buf_alloc: 256 * 1024,
            fwd_cnt: 0,
            data: vec![],
        }
    }

    /// Sets the payload (and `len`).
    pub fn with_data(mut self, data: &[u8]) -> Self {
        self.data = data.to_vec();
        self.len = u32::try_from(data.len()).unwrap();
        self
    }

    pub fn header_bytes(&self) -> [u8; 44] {
        let mut b = [0u8; 44];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    fn parse(b: &[u8; 44]) -> Self {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        Self {
            src_cid: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            dst_cid: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16::from_le_bytes(b[28..30].try_into().unwrap()),
            op: u16::from_le_bytes(b[30..32].try_into().unwrap()),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
            data: vec![],
        }
    }
}

pub struct Guest {
    pub d: Driver,
    /// `None` once a test moved the event loop to its own thread.
    pub em: Option<EventManager<VsockEvents>>,
    pub handle: VsockHandle,
    pub path: PathBuf,
    pub dir: tempfile::TempDir,
    rx_next: u16,
    tx_next: u16,
    ev_next: u16,
}

impl Guest {
    /// A device brought up by the driver with `rx_bufs` RX buffers posted.
    pub fn new(rx_bufs: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm.sock");
        let mut dev = Vsock::new(CID, &path).unwrap();
        let events = dev.take_events().unwrap();
        let handle = dev.handle();
        let mut d = Driver::with_mem(Box::new(dev), mem_sized(MEM_SIZE));
        let st = d.bring_up_queues(1 << VIRTIO_F_VERSION_1, &[QSIZE, QSIZE, EVQ_SIZE]);
        assert_ne!(st & crate::virtio::mmio::status::DRIVER_OK, 0, "activated");
        let mut em = EventManager::new().unwrap();
        em.add_subscriber(events);
        let mut g = Self {
            d,
            em: Some(em),
            handle,
            path,
            dir,
            rx_next: 0,
            tx_next: 0,
            ev_next: 0,
        };
        g.post_rx(rx_bufs);
        g
    }

    /// Posts `n` single-descriptor RX buffers (header + 4 KiB) and notifies.
    pub fn post_rx(&mut self, n: u16) {
        for _ in 0..n {
            let addr = RX_AREA + u64::from(self.rx_next) * RX_STRIDE;
            let head = self.d.push_chain_on(0, &[(addr, 44 + RX_DATA, true)]);
            assert_eq!(head, self.rx_next);
            self.rx_next = (self.rx_next + 1) % QSIZE;
        }
        if n > 0 {
            self.d.notify_queue(0);
        }
    }

    /// Posts one event buffer and notifies the event queue.
    pub fn post_event_buf(&mut self) -> u64 {
        let addr = EV_AREA + u64::from(self.ev_next) * 16;
        self.d
            .mem
            .write_obj(0xffff_ffffu32, GuestAddress(addr))
            .unwrap();
        self.d.push_chain_on(2, &[(addr, 8, true)]);
        self.ev_next = (self.ev_next + 1) % EVQ_SIZE;
        self.d.notify_queue(2);
        addr
    }

    /// Runs the event loop until nothing is ready (or, when it runs on its
    /// own thread, gives it a moment).
    pub fn pump(&mut self) {
        let Some(em) = self.em.as_mut() else {
            std::thread::sleep(std::time::Duration::from_millis(1));
            return;
        };
        for _ in 0..10_000 {
            if em.run_with_timeout(0).unwrap() == 0 {
                return;
            }
        }
        panic!("event loop never went quiet");
    }

    /// Posts one RX chain of a single descriptor as given.
    pub fn post_rx_raw(&mut self, addr: u64, len: u32, writable: bool) {
        let head = self.d.push_chain_on(0, &[(addr, len, writable)]);
        assert_eq!(head, self.rx_next);
        self.rx_next = (self.rx_next + 1) % QSIZE;
        self.d.notify_queue(0);
    }

    /// Pumps, then returns the packets the device put on the RX queue,
    /// re-posting one buffer for each.
    pub fn recv(&mut self) -> Vec<Pkt> {
        self.pump();
        let used = self.d.take_used_on(0);
        let mut out = vec![];
        for &(id, len) in &used {
            let addr = RX_AREA + u64::from(id) * RX_STRIDE;
            if len == 0 {
                continue;
            }
            let mut h = [0u8; 44];
            self.d.mem.read_slice(&mut h, GuestAddress(addr)).unwrap();
            let mut p = Pkt::parse(&h);
            assert_eq!(len, 44 + p.len, "used length matches header: {p:?}");
            p.data = vec![0u8; usize::try_from(p.len).unwrap()];
            self.d
                .mem
                .read_slice(&mut p.data, GuestAddress(addr + 44))
                .unwrap();
            out.push(p);
        }
        self.post_rx(u16::try_from(used.len()).unwrap());
        out
    }

    /// Like [`Guest::recv`] but drops CREDIT_REQUESTs.
    pub fn recv_no_credit_req(&mut self) -> Vec<Pkt> {
        self.recv()
            .into_iter()
            .filter(|p| p.op != op::CREDIT_REQUEST)
            .collect()
    }

    /// Sends a packet on the TX queue (header and data in one descriptor)
    /// and pumps the event loop.
    pub fn send(&mut self, p: &Pkt) {
        let addr = self.tx_slot(1);
        self.d
            .mem
            .write_slice(&p.header_bytes(), GuestAddress(addr))
            .unwrap();
        self.d
            .mem
            .write_slice(&p.data, GuestAddress(addr + 44))
            .unwrap();
        self.d.push_chain_on(
            1,
            &[(addr, 44 + u32::try_from(p.data.len()).unwrap(), false)],
        );
        self.d.notify_queue(1);
        self.pump();
    }

    /// Sends a packet as two descriptors (header, data), like older Linux.
    pub fn send_split(&mut self, p: &Pkt) {
        let addr = self.tx_slot(2);
        self.d
            .mem
            .write_slice(&p.header_bytes(), GuestAddress(addr))
            .unwrap();
        self.d
            .mem
            .write_slice(&p.data, GuestAddress(addr + 64))
            .unwrap();
        self.d.push_chain_on(
            1,
            &[
                (addr, 44, false),
                (addr + 64, u32::try_from(p.data.len()).unwrap(), false),
            ],
        );
        self.d.notify_queue(1);
        self.pump();
    }

    /// Sends a raw chain of (offset in a TX slot or absolute address,
    /// len, writable) after writing `bytes` at the slot start.
    pub fn send_raw(&mut self, bytes: &[u8], descs: &[(Option<u64>, u32, bool)]) {
        let addr = self.tx_slot(u16::try_from(descs.len()).unwrap());
        self.d.mem.write_slice(bytes, GuestAddress(addr)).unwrap();
        let chain: Vec<(u64, u32, bool)> = descs
            .iter()
            .map(|&(a, l, w)| (a.unwrap_or(addr), l, w))
            .collect();
        self.d.push_chain_on(1, &chain);
        self.d.notify_queue(1);
        self.pump();
    }

    fn tx_slot(&mut self, descs: u16) -> u64 {
        let addr = TX_AREA + u64::from(self.tx_next) * TX_STRIDE;
        self.tx_next = (self.tx_next + descs) % QSIZE;
        addr
    }

    /// TX chains the device has consumed.
    pub fn tx_used(&mut self) -> usize {
        self.d.take_used_on(1).len()
    }

    /// A host client that asked for guest `port`.
    pub fn host_connect(&self, port: u32) -> UnixStream {
        let mut s = UnixStream::connect(&self.path).unwrap();
        writeln!(s, "CONNECT {port}").unwrap();
        s
    }

    /// Connects a host client to guest `port`, accepts on the guest side
    /// with `buf_alloc`, reads the `OK` line. Returns the client and the
    /// device's local port.
    pub fn establish(&mut self, port: u32, buf_alloc: u32) -> (UnixStream, u32) {
        let mut c = self.host_connect(port);
        let req = self.recv();
        assert_eq!(req.len(), 1, "{req:?}");
        assert_eq!(req[0].op, op::REQUEST);
        let local = req[0].src_port;
        let mut resp = Pkt::guest(op::RESPONSE, port, local);
        resp.buf_alloc = buf_alloc;
        self.send(&resp);
        assert_eq!(read_line(&mut c), format!("OK {local}\n"));
        (c, local)
    }
}

/// Reads one `\n`-terminated line (blocking, byte by byte).
pub fn read_line(s: &mut UnixStream) -> String {
    use std::io::Read;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut out = vec![];
    let mut b = [0u8; 1];
    while s.read(&mut b).unwrap() == 1 {
        out.push(b[0]);
        if b[0] == b'\n' {
            break;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Open fds of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Raises the soft fd limit to the hard one; returns the new soft limit.
pub fn raise_fd_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    r.rlim_cur = r.rlim_max;
    // SAFETY: setrlimit only reads the rlimit we own.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    r.rlim_cur
}
