//! A lab per test: a `HostNet` with its own pool and name prefixes, a
//! stand-in "internet" netns (TEST-NET-2 addresses, TCP servers on two
//! ports and a UDP echo on two more, one of them 53), a stand-in DNS
//! forwarder and a TCP server on the host's own address, and stand-in
//! guests (netns whose `eth0` is where the VM's interface would be).
//! Everything is removed on drop, also when the test panics.

#![allow(dead_code)]

use std::collections::HashSet;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use shoal_hostnet::cmd;
use shoal_hostnet::netns;
use shoal_hostnet::{AddrPool, EgressPolicy, GuestLink, HostNet, NetConfig, Slot};

/// Ports of the internet stand-in's servers.
pub const TCP_A: u16 = 8080;
pub const TCP_B: u16 = 8081;
pub const UDP_ECHO: u16 = 9000;
pub const UDP_DNS: u16 = 53;
/// The forwarder stand-in's port (host netns).
pub const FWD_PORT: u16 = 5353;
/// How long a probe that should be blocked waits.
pub const BLOCKED_WAIT: Duration = Duration::from_secs(3);
/// How long a probe that should pass may take.
pub const OK_WAIT: Duration = Duration::from_secs(20);

pub const T: Duration = Duration::from_secs(60);

pub fn ip(args: &[&str]) -> String {
    cmd::run("ip", args, None, T).unwrap_or_else(|e| panic!("{e}"))
}

pub fn ip_quiet(args: &[&str]) {
    let _ = cmd::run("ip", args, None, T);
}

/// Fails with what is missing unless this runs as root with the tools.
fn require() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "these tests need root (netns, veth, nftables)"
    );
    let missing = shoal_hostnet::probe();
    assert!(missing.is_empty(), "the host lacks: {missing:#?}");
}

/// Servers that stop when dropped.
struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    fn new() -> Self {
        Servers {
            stop: Arc::new(AtomicBool::new(false)),
            threads: vec![],
        }
    }

    /// A TCP server in `ns` (or the host's netns) on `addr`: for each line
    /// it answers `PORT LINE`.
    fn tcp(&mut self, ns: Option<&str>, addr: SocketAddrV4) {
        let stop = self.stop.clone();
        let ns = ns.map(str::to_string);
        let (tx, rx) = std::sync::mpsc::channel();
        self.threads.push(thread::spawn(move || {
            if let Some(ns) = &ns {
                netns::enter(ns).expect("enter netns");
            }
            let l = TcpListener::bind(addr).expect("bind tcp");
            l.set_nonblocking(true).unwrap();
            tx.send(()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        let port = addr.port();
                        let stop = stop.clone();
                        thread::spawn(move || serve_lines(s, port, &stop));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        }));
        rx.recv_timeout(T).expect("tcp server started");
    }

    /// A UDP echo in `ns` (or the host's) on `addr`, answering `PORT DATA`.
    fn udp(&mut self, ns: Option<&str>, addr: SocketAddrV4) {
        let stop = self.stop.clone();
        let ns = ns.map(str::to_string);
        let (tx, rx) = std::sync::mpsc::channel();
        self.threads.push(thread::spawn(move || {
            if let Some(ns) = &ns {
                netns::enter(ns).expect("enter netns");
            }
            let s = UdpSocket::bind(addr).expect("bind udp");
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            tx.send(()).unwrap();
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = s.recv_from(&mut buf) {
                    let mut reply = format!("{} ", addr.port()).into_bytes();
                    reply.extend_from_slice(&buf[..n]);
                    let _ = s.send_to(&reply, from);
                }
            }
        }));
        rx.recv_timeout(T).expect("udp server started");
    }
}

fn serve_lines(s: TcpStream, port: u16, stop: &AtomicBool) {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        match r.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                if w.write_all(format!("{port} {line}").as_bytes()).is_err() {
                    return;
                }
                line.clear();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One test's world. `k` (1..=15) must be unique per test.
pub struct Lab {
    pub k: u8,
    pub net: Arc<HostNet>,
    pub inet_ns: String,
    pub inet_link: String,
    /// The host's address on the internet link (its own address).
    pub host_addr: Ipv4Addr,
    /// The internet stand-in's two addresses.
    pub inet_a: Ipv4Addr,
    pub inet_b: Ipv4Addr,
    guests: Vec<String>,
    servers: Servers,
}

impl Lab {
    pub fn new(k: u8) -> Lab {
        assert!((1..=15).contains(&k));
        require();
        let base = 16 * k;
        let host_addr = Ipv4Addr::new(198, 51, 100, base + 1);
        let cfg = NetConfig {
            pool: AddrPool::new(format!("10.214.{k}.0/24").parse().unwrap()).unwrap(),
            forwarder: Some(SocketAddrV4::new(host_addr, FWD_PORT)),
            netns_prefix: format!("shoaltest{k}-"),
            link_prefix: format!("shv{}", char::from(b'a' + k)),
            cmd_timeout: T,
        };
        let mut lab = Lab {
            k,
            net: HostNet::setup(cfg).expect("host setup"),
            inet_ns: format!("shoaltest{k}-inet"),
            inet_link: format!("shtinet{k}"),
            host_addr,
            inet_a: Ipv4Addr::new(198, 51, 100, base + 2),
            inet_b: Ipv4Addr::new(198, 51, 100, base + 3),
            guests: vec![],
            servers: Servers::new(),
        };
        lab.sweep();
        let (ns, link) = (lab.inet_ns.clone(), lab.inet_link.clone());
        ip(&["netns", "add", &ns]);
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]);
        ip(&["addr", "add", &format!("{host_addr}/28"), "dev", &link]);
        ip(&["link", "set", &link, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        for a in [lab.inet_a, lab.inet_b] {
            ip(&["-n", &ns, "addr", "add", &format!("{a}/28"), "dev", "eth0"]);
        }
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        ip(&[
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &host_addr.to_string(),
        ]);
        let any = Ipv4Addr::UNSPECIFIED;
        for p in [TCP_A, TCP_B] {
            lab.servers.tcp(Some(&ns), SocketAddrV4::new(any, p));
        }
        for p in [UDP_ECHO, UDP_DNS] {
            lab.servers.udp(Some(&ns), SocketAddrV4::new(any, p));
        }
        // On the host's own address: a TCP server and the DNS forwarder.
        lab.servers.tcp(None, SocketAddrV4::new(host_addr, TCP_A));
        lab.servers
            .udp(None, SocketAddrV4::new(host_addr, FWD_PORT));
        lab
    }

    /// A stand-in guest netns (empty; the slot puts its eth0 there).
    pub fn guest_ns(&mut self) -> String {
        let name = format!("shoaltest{}-g{}", self.k, self.guests.len());
        ip_quiet(&["netns", "del", &name]);
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        self.guests.push(name.clone());
        name
    }

    /// A slot whose guest is a stand-in netns; returns both.
    pub fn guest_slot(&mut self, policy: EgressPolicy) -> (Slot, String) {
        let g = self.guest_ns();
        let link = GuestLink::Veth {
            peer_netns: g.clone(),
            peer: "eth0".into(),
        };
        let slot = Slot::create(&self.net, &link, policy).expect("create slot");
        (slot, g)
    }

    /// A TCP server inside a stand-in guest.
    pub fn serve_in_guest(&mut self, g: &str, addr: SocketAddrV4) {
        self.servers.tcp(Some(g), addr);
    }

    /// Names of this lab's slot netns and links that exist now.
    pub fn leftovers(&self) -> Vec<String> {
        let c = self.net.config();
        let mut v: Vec<String> = std::fs::read_dir(netns::NETNS_DIR)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| {
                        n.strip_prefix(&c.netns_prefix)
                            .is_some_and(|r| r.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let links: serde_json::Value = serde_json::from_str(&ip(&["-j", "link", "show"])).unwrap();
        for l in links.as_array().unwrap() {
            let name = l["ifname"].as_str().unwrap_or_default();
            if name.starts_with(&c.link_prefix) {
                v.push(name.to_string());
            }
        }
        v.sort();
        v
    }

    /// Removes whatever an earlier run of this test left.
    fn sweep(&self) {
        let keep = HashSet::new();
        let _ = self.net.reclaim_stale(&keep);
        for g in 0..8 {
            ip_quiet(&["netns", "del", &format!("shoaltest{}-g{g}", self.k)]);
        }
        ip_quiet(&["link", "del", &self.inet_link]);
        ip_quiet(&["netns", "del", &self.inet_ns]);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Servers first: their sockets hold the namespaces.
        let servers = std::mem::replace(&mut self.servers, Servers::new());
        drop(servers);
        for g in self.guests.drain(..) {
            ip_quiet(&["netns", "del", &g]);
        }
        self.sweep();
    }
}

/// Runs `f` in the netns `ns`.
pub fn in_ns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    netns::run_in(ns, f)
}

/// Connects from `ns` to `to` and exchanges one line; the answer, or the
/// error (a timeout when the policy drops it).
pub fn tcp(ns: &str, to: SocketAddrV4, wait: Duration) -> std::io::Result<String> {
    in_ns(ns, move || {
        let mut s = TcpStream::connect_timeout(&SocketAddr::V4(to), wait)?;
        exchange(&mut s, "hi", wait)
    })
}

/// Sends a line on an open connection and reads the answer.
pub fn exchange(s: &mut TcpStream, line: &str, wait: Duration) -> std::io::Result<String> {
    s.set_read_timeout(Some(wait))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut answer = String::new();
    r.read_line(&mut answer)?;
    if answer.is_empty() {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    Ok(answer.trim_end().to_string())
}

/// Sends a datagram from `ns` (from `src` if given) and waits for the echo.
pub fn udp(
    ns: &str,
    src: Option<Ipv4Addr>,
    to: SocketAddrV4,
    wait: Duration,
) -> std::io::Result<String> {
    in_ns(ns, move || {
        let s = UdpSocket::bind(SocketAddrV4::new(src.unwrap_or(Ipv4Addr::UNSPECIFIED), 0))?;
        s.set_read_timeout(Some(wait))?;
        s.send_to(b"ping", to)?;
        let mut buf = [0u8; 512];
        let (n, _) = s.recv_from(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    })
}

/// Sends one ICMP echo request from `ns` to `to` (raw socket) and waits
/// for the reply.
pub fn ping(ns: &str, to: Ipv4Addr, wait: Duration) -> bool {
    in_ns(ns, move || Ok(ping_here(to, wait))).unwrap_or(false)
}

fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop folded the sum into 16 bits.
    !u16::try_from(sum).unwrap_or(0)
}

fn ping_here(to: Ipv4Addr, wait: Duration) -> bool {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: plain socket call; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
    assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let id = (std::process::id() & 0xffff) as u16;
    let mut pkt = vec![8u8, 0, 0, 0];
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&1u16.to_be_bytes());
    pkt.extend_from_slice(b"shoal-ping");
    let c = checksum(&pkt);
    pkt[2..4].copy_from_slice(&c.to_be_bytes());
    let addr = libc::sockaddr_in {
        sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap(),
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(to).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: pkt and addr outlive the call; the lengths are theirs.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&addr as *const libc::sockaddr_in).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_in>()).unwrap(),
        )
    };
    if n < 0 {
        return false;
    }
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: tv is a valid timeval for SO_RCVTIMEO.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                libc::socklen_t::try_from(std::mem::size_of::<libc::timeval>()).unwrap(),
            )
        };
        // SAFETY: buf is writable for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 28 {
            continue;
        }
        let ihl = usize::from(buf[0] & 0x0f) * 4;
        let src = Ipv4Addr::new(buf[12], buf[13], buf[14], buf[15]);
        let Ok(n) = usize::try_from(n) else { continue };
        let Some(icmp) = buf.get(ihl..n) else {
            continue;
        };
        if src == to && icmp.len() >= 8 && icmp[0] == 0 && icmp[4..6] == id.to_be_bytes() {
            return true;
        }
    }
    false
}

/// Polls `f` until it holds or `within` passes.
pub fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

pub fn sa(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip, port)
}
