//! The guest's side of a virtio-net device for the tests: the test driver
//! with rx buffers and tx frames in fixed slots, an `EventManager` pumped
//! in the test thread, Ethernet/ARP frame helpers, and a private network
//! namespace per test with a real TAP in it.

#![allow(dead_code)]

use devices::virtio::mmio::status;
use devices::virtio::net::{
    MacAddr, Net, NetConfig, NetEvents, NetHandle, Tap, QUEUE_SIZE, VIRTIO_NET_F_MAC,
    VIRTIO_NET_F_STATUS, VNET_HDR_LEN,
};
use devices::virtio::testing::{mem_sized, Driver, DATA};
use devices::virtio::VIRTIO_F_VERSION_1;
use event_manager::{EventManager, SubscriberOps};
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

/// Guest memory: rx slots, tx slots, then room for big chains.
pub const MEM_SIZE: usize = 4 << 20;
pub const QSIZE: u16 = QUEUE_SIZE;
/// Each rx buffer: header + a full-size Ethernet frame, as Linux posts.
pub const RX_BUF: u32 = 2048;
pub const RX_AREA: u64 = DATA;
pub const TX_SLOT: u64 = 2048;
pub const TX_AREA: u64 = RX_AREA + QSIZE as u64 * RX_BUF as u64;
/// Free guest memory for tests' own chains.
pub const SCRATCH: u64 = TX_AREA + QSIZE as u64 * TX_SLOT;

pub const FEATURES: u64 =
    (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_NET_F_MAC) | (1 << VIRTIO_NET_F_STATUS);

pub const GUEST_MAC: MacAddr = MacAddr([0x02, 0x5e, 0, 0, 0, 0x02]);
pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const BROADCAST: [u8; 6] = [0xff; 6];
/// How long a test waits for the kernel (generous: CI is loaded).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Runs `f` on a thread of its own in a new network namespace (gone with
/// the thread and the TAPs in it), with IPv6 off on new interfaces so the
/// kernel sends nothing unasked.
pub fn in_netns<F: FnOnce() + Send + 'static>(f: F) {
    let t = std::thread::spawn(move || {
        // SAFETY: unshare with a constant flag; only this thread moves.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            r,
            0,
            "unshare(CLONE_NEWNET) failed (the net tests need root): {}",
            std::io::Error::last_os_error()
        );
        let v6 = "/proc/sys/net/ipv6/conf/default/disable_ipv6";
        if std::path::Path::new(v6).exists() {
            std::fs::write(v6, "1").expect("disable IPv6 in the test's netns");
        }
        f();
    });
    if let Err(e) = t.join() {
        std::panic::resume_unwind(e);
    }
}

/// A TAP name unique to this process and call (`shtst<pid><n>`).
pub fn tap_name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "shtst{}{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `ip ARGS` (in the calling thread's netns) and returns its stdout.
pub fn ip(args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("running `ip` (iproute2 is needed by the net tests)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A new TAP with `HOST_IP/24`, up.
pub fn tap_up() -> Tap {
    let name = tap_name();
    let tap = Tap::open(&name).expect("open a TAP (needs root and /dev/net/tun)");
    ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", &name]);
    ip(&["link", "set", "dev", &name, "up"]);
    tap
}

/// Tells the kernel the guest's MAC for `GUEST_IP` on `tap_name` (no ARP
/// needed before sending to it).
pub fn guest_neighbour(tap_name: &str) {
    ip(&[
        "neigh",
        "replace",
        &GUEST_IP.to_string(),
        "lladdr",
        &GUEST_MAC.to_string(),
        "dev",
        tap_name,
        "nud",
        "permanent",
    ]);
}

/// The kernel side's MAC of interface `name`.
pub fn link_mac(name: &str) -> MacAddr {
    let out = ip(&["-br", "link", "show", "dev", name]);
    out.split_whitespace()
        .nth(2)
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no MAC in {out:?}"))
}

/// A device config with `mac` and no limits.
pub fn config(mac: MacAddr) -> NetConfig {
    NetConfig {
        mac,
        rx_rate: Default::default(),
        tx_rate: Default::default(),
    }
}

pub struct Guest {
    pub d: Driver,
    pub em: EventManager<NetEvents>,
    pub handle: NetHandle,
    rx_next: u16,
    tx_next: u16,
}

impl Guest {
    /// A device on `tap` brought up by the driver, no rx buffers posted.
    pub fn new(tap: Tap, cfg: NetConfig) -> Self {
        Self::with_device(Net::new(tap, &cfg).unwrap())
    }

    pub fn with_device(dev: Net) -> Self {
        Self::with_features(dev, FEATURES)
    }

    /// A device brought up by a driver that takes `features`.
    pub fn with_features(mut dev: Net, features: u64) -> Self {
        let events = dev.take_events().unwrap();
        let handle = dev.handle();
        let mut d = Driver::with_mem(Box::new(dev), mem_sized(MEM_SIZE));
        let st = d.bring_up_queues(features, &[QSIZE, QSIZE]);
        assert_ne!(st & status::DRIVER_OK, 0, "activated");
        let mut em = EventManager::new().unwrap();
        em.add_subscriber(events);
        Self {
            d,
            em,
            handle,
            rx_next: 0,
            tx_next: 0,
        }
    }

    /// Posts `n` rx buffers of [`RX_BUF`] bytes and notifies.
    pub fn post_rx(&mut self, n: u16) {
        for _ in 0..n {
            let addr = RX_AREA + u64::from(self.rx_next) * u64::from(RX_BUF);
            let head = self.d.push_chain_on(0, &[(addr, RX_BUF, true)]);
            assert_eq!(head, self.rx_next);
            self.rx_next = (self.rx_next + 1) % QSIZE;
        }
        self.d.notify_queue(0);
    }

    /// Posts one rx chain as given (single-descriptor chains keep the
    /// slot numbering).
    pub fn post_rx_raw(&mut self, addr: u64, len: u32, writable: bool) {
        let head = self.d.push_chain_on(0, &[(addr, len, writable)]);
        assert_eq!(head, self.rx_next);
        self.rx_next = (self.rx_next + 1) % QSIZE;
        self.d.notify_queue(0);
    }

    /// Puts `frame` behind a zero header in the next tx slot and makes it
    /// available, without notifying.
    pub fn queue_tx(&mut self, frame: &[u8]) -> u16 {
        self.queue_tx_with(&[0; VNET_HDR_LEN], frame)
    }

    /// Puts `frame` behind `hdr` in the next tx slot and makes it
    /// available, without notifying.
    pub fn queue_tx_with(&mut self, hdr: &[u8; VNET_HDR_LEN], frame: &[u8]) -> u16 {
        let addr = TX_AREA + u64::from(self.tx_next) * TX_SLOT;
        let mut buf = hdr.to_vec();
        buf.extend_from_slice(frame);
        assert!(u64::try_from(buf.len()).unwrap() <= TX_SLOT);
        self.d.mem.write_slice(&buf, GuestAddress(addr)).unwrap();
        let len = u32::try_from(buf.len()).unwrap();
        let head = self.d.push_chain_on(1, &[(addr, len, false)]);
        self.tx_next = (self.tx_next + 1) % QSIZE;
        head
    }

    /// Sends `frame` (queues it and notifies tx).
    pub fn send(&mut self, frame: &[u8]) -> u16 {
        let head = self.queue_tx(frame);
        self.d.notify_queue(1);
        head
    }

    /// Sends `frame` behind `hdr` (queues it and notifies tx).
    pub fn send_with(&mut self, hdr: &[u8; VNET_HDR_LEN], frame: &[u8]) -> u16 {
        let head = self.queue_tx_with(hdr, frame);
        self.d.notify_queue(1);
        head
    }

    /// Runs the event loop until nothing is ready.
    pub fn pump(&mut self) {
        for _ in 0..10_000 {
            if self.em.run_with_timeout(0).unwrap() == 0 {
                return;
            }
        }
        panic!("event loop never went quiet");
    }

    /// Frames the device put in rx buffers since the last call: the
    /// virtio header and the frame, as (header, frame).
    pub fn received(&mut self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.d
            .take_used_on(0)
            .into_iter()
            .map(|(id, len)| {
                let addr = RX_AREA + u64::from(id) * u64::from(RX_BUF);
                let mut b = vec![0u8; usize::try_from(len).unwrap()];
                self.d.mem.read_slice(&mut b, GuestAddress(addr)).unwrap();
                let frame = b.split_off(VNET_HDR_LEN.min(b.len()));
                (b, frame)
            })
            .collect()
    }

    /// Pumps the event loop (waiting for events up to 50 ms a round) until
    /// `done` says so, for at most [`PATIENCE`].
    pub fn wait_until(&mut self, what: &str, mut done: impl FnMut(&mut Guest) -> bool) {
        let end = Instant::now() + PATIENCE;
        while !done(self) {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            self.em.run_with_timeout(50).unwrap();
        }
    }
}

/// An Ethernet frame.
pub fn eth(dst: [u8; 6], src: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A broadcast ARP request from `sha`/`spa` for `tpa`, padded to 60 bytes.
pub fn arp_request(sha: MacAddr, spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
    let mut p = vec![0, 1, 8, 0, 6, 4, 0, 1];
    p.extend_from_slice(&sha.0);
    p.extend_from_slice(&spa.octets());
    p.extend_from_slice(&[0; 6]);
    p.extend_from_slice(&tpa.octets());
    p.resize(46, 0);
    eth(BROADCAST, sha, 0x0806, &p)
}

/// An ARP reply's (eth dst, eth src, sha, spa, tha, tpa), if `f` is one.
pub struct ArpReply {
    pub dst: MacAddr,
    pub src: MacAddr,
    pub sha: MacAddr,
    pub spa: Ipv4Addr,
    pub tha: MacAddr,
    pub tpa: Ipv4Addr,
}

pub fn arp_reply(f: &[u8]) -> Option<ArpReply> {
    if f.len() < 42 || f[12..14] != [8, 6] || f[14..22] != [0, 1, 8, 0, 6, 4, 0, 2] {
        return None;
    }
    let mac = |o: usize| MacAddr(f[o..o + 6].try_into().unwrap());
    let ip = |o: usize| Ipv4Addr::new(f[o], f[o + 1], f[o + 2], f[o + 3]);
    Some(ArpReply {
        dst: mac(0),
        src: mac(6),
        sha: mac(22),
        spa: ip(28),
        tha: mac(32),
        tpa: ip(38),
    })
}
