//! The vsock packet path (virtio side and muxer): hostile RX, TX and event
//! queues over real guest memory (the checks of `shoal_fuzz::queue`), TX
//! packets with headers a guest would forge (any op, type, ports, cids,
//! lengths, credit), host sockets connecting (`CONNECT <port>`), writing
//! and closing, a host listener the guest connects to, and the event loop
//! pumped in between (its RX writes are checked too). After every step
//! the connection table is consistent (opened - closed = live, at most
//! `MAX_CONNECTIONS`, buffered bytes within the per-connection cap); after
//! a driver reset no connection is left.

use bolero::{check, TypeGenerator};
use devices::virtio::vsock::{Vsock, VsockEvents, VsockHandle, CONN_TX_BUF_SIZE, MAX_CONNECTIONS};
use event_manager::{EventManager, SubscriberOps};
use shoal_fuzz::queue::{pick_sizes, Kick, Rig};
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use vm_memory::{Bytes, GuestAddress};

const CID: u64 = 3;
/// Host port with a listener (`<uds>_1234`).
const LISTEN_PORT: u32 = 1234;
const F_VERSION_1: u64 = 1 << 32;

#[derive(Debug, Clone, TypeGenerator)]
struct Header {
    cids: u8,
    src_port: u8,
    dst_port: u32,
    len: u32,
    ty: u16,
    op: u16,
    flags: u32,
    buf_alloc: u32,
    fwd_cnt: u32,
}

#[derive(Debug, Clone, TypeGenerator)]
enum Step {
    Tx { kick: Kick, hdr: Header },
    Rx { kick: Kick },
    Event { kick: Kick },
    HostConnect { port: u8 },
    HostWrite { conn: u8, bytes: Vec<u8> },
    HostClose { conn: u8 },
    AcceptGuest { write: bool },
    Pump,
}

#[derive(Debug, Clone, TypeGenerator)]
struct Input {
    sizes: Vec<u8>,
    steps: Vec<Step>,
}

#[test]
fn vsock_packets() {
    check!()
        .with_type::<Input>()
        .with_test_time(shoal_fuzz::budget())
        .with_max_len(1024)
        .for_each(run);
}

impl Header {
    fn bytes(&self) -> [u8; 44] {
        let (src_cid, dst_cid) = match self.cids % 8 {
            0 => (u64::from(self.flags), 2),
            1 => (CID, u64::from(self.buf_alloc)),
            _ => (CID, 2),
        };
        let dst_port = if self.dst_port.is_multiple_of(4) {
            self.dst_port
        } else {
            LISTEN_PORT
        };
        let src_port = 1000 + u32::from(self.src_port % 8);
        let len = if self.len & 0x8000_0000 == 0 {
            self.len % 512
        } else {
            self.len
        };
        let ty = if self.ty.is_multiple_of(8) {
            self.ty
        } else {
            1
        };
        let op = if self.op % 16 < 8 {
            self.op % 8
        } else {
            self.op
        };
        let mut b = [0u8; 44];
        b[0..8].copy_from_slice(&src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&src_port.to_le_bytes());
        b[20..24].copy_from_slice(&dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&len.to_le_bytes());
        b[28..30].copy_from_slice(&ty.to_le_bytes());
        b[30..32].copy_from_slice(&op.to_le_bytes());
        b[32..36].copy_from_slice(&(self.flags & 3).to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

struct World {
    rig: Rig,
    em: EventManager<VsockEvents>,
    handle: VsockHandle,
    path: std::path::PathBuf,
    listener: UnixListener,
    host: Vec<UnixStream>,
    accepted: Vec<UnixStream>,
    _dir: tempfile::TempDir,
}

impl World {
    fn pump(&mut self) {
        let em = &mut self.em;
        self.rig.act(|_| {
            for _ in 0..1000 {
                if em.run_with_timeout(0).unwrap() == 0 {
                    return;
                }
            }
            panic!("the vsock event loop never went quiet");
        });
    }

    fn check_table(&self) {
        let live = self.handle.connection_count();
        let c = self.handle.counters();
        assert!(live <= MAX_CONNECTIONS, "{live} connections");
        assert_eq!(
            c.opened - c.closed,
            live as u64,
            "opened {} closed {} but {live} live",
            c.opened,
            c.closed
        );
        let cap = live * CONN_TX_BUF_SIZE as usize;
        let held = self.handle.buffered_bytes();
        assert!(held <= cap, "{held} bytes buffered for {live} connections");
    }
}

fn on_queue(k: &Kick, q: u8) -> Kick {
    let mut k = k.clone();
    k.queue = q;
    k
}

fn run(input: &Input) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sock");
    let mut dev = Vsock::new(CID, &path).unwrap();
    let events = dev.take_events().unwrap();
    let handle = dev.handle();
    let listener = UnixListener::bind(format!("{}_{LISTEN_PORT}", path.display())).unwrap();
    listener.set_nonblocking(true).unwrap();
    let sizes = pick_sizes(&[256; 3], &input.sizes);
    let rig = Rig::new(Box::new(dev), F_VERSION_1, &sizes);
    let mut em = EventManager::new().unwrap();
    em.add_subscriber(events);
    let mut w = World {
        rig,
        em,
        handle,
        path,
        listener,
        host: vec![],
        accepted: vec![],
        _dir: dir,
    };
    for step in input.steps.iter().take(48) {
        match step {
            Step::Tx { kick, hdr } => {
                let k = on_queue(kick, 1);
                let (q, written) = w.rig.load(&k);
                if let Some(first) = written.first() {
                    let _ = w
                        .rig
                        .mem()
                        .write_slice(&hdr.bytes(), GuestAddress(first.addr));
                }
                w.rig.notify(q, &k);
            }
            Step::Rx { kick } => w.rig.kick(&on_queue(kick, 0)),
            Step::Event { kick } => w.rig.kick(&on_queue(kick, 2)),
            Step::HostConnect { port } => {
                if w.host.len() < 8 {
                    if let Ok(mut s) = UnixStream::connect(&w.path) {
                        s.set_nonblocking(true).unwrap();
                        let port = if *port < 200 { 5000 } else { u32::from(*port) };
                        let _ = writeln!(s, "CONNECT {port}");
                        w.host.push(s);
                    }
                }
            }
            Step::HostWrite { conn, bytes } => {
                let n = w.host.len();
                if let Some(s) = w.host.get_mut(usize::from(*conn) % n.max(1)) {
                    let _ = s.write(bytes);
                }
            }
            Step::HostClose { conn } => {
                let n = w.host.len();
                if n > 0 {
                    w.host.remove(usize::from(*conn) % n);
                }
            }
            Step::AcceptGuest { write } => {
                while let Ok((mut s, _)) = w.listener.accept() {
                    s.set_nonblocking(true).unwrap();
                    if *write {
                        let _ = s.write(b"hello guest");
                    }
                    w.accepted.push(s);
                }
                if !*write {
                    w.accepted.clear();
                }
            }
            Step::Pump => {}
        }
        w.pump();
        w.check_table();
    }
    w.rig.reset_and_reuse();
    w.pump();
    assert_eq!(
        w.handle.connection_count(),
        0,
        "connections survived a driver reset"
    );
    w.check_table();
}
