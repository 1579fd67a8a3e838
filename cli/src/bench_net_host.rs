//! The test host of `shoal bench net`: a network namespace of its own,
//! joined to the host by a veth (the "internet" a Shoal sandbox reaches
//! through its slot, its policy and the host's NAT) and holding the QEMU
//! peer's TAP (QEMU's guest reaches it directly), with the servers both
//! guests talk to. Every figure is measured here, on the host side, with
//! the same code for both systems:
//!
//! - HTTP on [`HTTP_PORT`]: `GET /bulk/N` answers N bytes and times the
//!   request's end to the client's close (the guest's download), `GET
//!   /warm/N` the same untimed, `GET /c` a two-byte answer whose accept
//!   instant is recorded (connections per second), `GET /script` the
//!   guest's script with `@HOST@` replaced by the address the guest
//!   reached (so one script serves both systems);
//! - the request exchange on [`ECHO_PORT`]: the guest connects with
//!   `nc HOST PORT -e /bin/cat` and this side sends [`MSG`]-byte requests
//!   one at a time, timing each until its echo is back (one connection,
//!   no process start per request).
//!
//! Everything it makes (the netns, the veth, the TAP, its threads) is
//! removed when it is dropped.

use anyhow::{bail, Context, Result};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The HTTP server's port.
pub const HTTP_PORT: u16 = 8000;
/// The request exchange's port.
pub const ECHO_PORT: u16 = 8001;
/// Bytes of one request (and of its echo).
pub const MSG: usize = 64;
/// Exchanges before the timed ones (the connection's first packets).
const WARM_EXCHANGES: usize = 5;
/// Most bytes of a request's head.
const HEAD_CAP: usize = 4096;
/// Most bytes one `/bulk/N` sends.
pub const BULK_CAP: u64 = 1 << 30;
/// Deadline of every read and write of a connection.
const IO_TIMEOUT: Duration = Duration::from_secs(120);
/// The TAP of the QEMU peer, inside the namespace.
pub const QEMU_TAP: &str = "tapq";

/// What a guest did, as seen from here.
#[derive(Debug, Clone)]
pub enum Event {
    /// A timed download: bytes, and seconds from the request to the
    /// client's close.
    Bulk {
        /// Bytes sent.
        bytes: u64,
        /// Seconds.
        secs: f64,
    },
    /// A `/c` connection, when it was accepted.
    Conn(Instant),
    /// One connection's timed request round trips (ms).
    Rtts(Vec<f64>),
}

struct Shared {
    events: Mutex<Vec<Event>>,
    script: Mutex<String>,
    exchanges: usize,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `ip ARGS`, failing with what it printed.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The test host.
pub struct TestHost {
    /// Its network namespace.
    pub ns: String,
    host_link: String,
    /// Its address on the veth (what Shoal sandboxes are allowed to).
    pub addr: Ipv4Addr,
    /// Its address on the QEMU peer's TAP.
    pub tap_addr: Ipv4Addr,
    /// The QEMU guest's address (same /24 as `tap_addr`).
    pub qemu_guest: Ipv4Addr,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl TestHost {
    /// Makes the namespace `shnb<tag>`, its veth (10.218.T.0/30) and TAP
    /// (10.214.T.0/24), and starts the servers; the request exchange does
    /// `exchanges` timed round trips per connection.
    pub fn new(tag: u32, exchanges: usize) -> Result<TestHost> {
        let t = u8::try_from(tag % 250).unwrap_or(0);
        let ns = format!("shnb{tag}");
        let host_link = format!("shnb{tag}h");
        ip_quiet(&["netns", "del", &ns]);
        ip_quiet(&["link", "del", &host_link]);
        let mut h = TestHost {
            ns: ns.clone(),
            host_link: host_link.clone(),
            addr: Ipv4Addr::new(10, 218, t, 2),
            tap_addr: Ipv4Addr::new(10, 214, t, 1),
            qemu_guest: Ipv4Addr::new(10, 214, t, 2),
            shared: Arc::new(Shared {
                events: Mutex::new(vec![]),
                script: Mutex::new(String::new()),
                exchanges,
                stop: AtomicBool::new(false),
            }),
            threads: vec![],
        };
        let gw = Ipv4Addr::new(10, 218, t, 1);
        ip(&["netns", "add", &ns])?;
        ip(&[
            "link", "add", &host_link, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        ip(&["addr", "add", &format!("{gw}/30"), "dev", &host_link])?;
        ip(&["link", "set", &host_link, "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/30", h.addr),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&["-n", &ns, "route", "add", "default", "via", &gw.to_string()])?;
        ip(&["-n", &ns, "tuntap", "add", "dev", QEMU_TAP, "mode", "tap"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/24", h.tap_addr),
            "dev",
            QEMU_TAP,
        ])?;
        ip(&["-n", &ns, "link", "set", QEMU_TAP, "up"])?;
        for (port, handler) in [(HTTP_PORT, http as Handler), (ECHO_PORT, echo as Handler)] {
            let l = shoal_hostnet::netns::run_in(&ns, move || {
                TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
            })
            .with_context(|| format!("listening on port {port} in {ns}"))?;
            l.set_nonblocking(true)?;
            let sh = h.shared.clone();
            h.threads
                .push(std::thread::spawn(move || accept_loop(&l, &sh, handler)));
        }
        Ok(h)
    }

    /// The script `GET /script` serves from now on.
    pub fn set_script(&self, s: &str) {
        *lock(&self.shared.script) = s.to_string();
    }

    /// The events recorded since the last call.
    pub fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut *lock(&self.shared.events))
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        ip_quiet(&["-n", &self.ns, "link", "del", QEMU_TAP]);
        ip_quiet(&["netns", "del", &self.ns]);
        ip_quiet(&["link", "del", &self.host_link]);
    }
}

type Handler = fn(TcpStream, Instant, &Shared) -> io::Result<()>;

/// Accepts until told to stop (polling the listener every 100 ms for
/// that), one thread per connection.
fn accept_loop(l: &TcpListener, sh: &Arc<Shared>, handler: Handler) {
    while !sh.stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, for a listener this function borrows.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            continue;
        }
        let at = Instant::now();
        if let Ok((s, _)) = l.accept() {
            let sh = sh.clone();
            std::thread::spawn(move || {
                let _ = s
                    .set_nonblocking(false)
                    .and_then(|()| s.set_read_timeout(Some(IO_TIMEOUT)))
                    .and_then(|()| s.set_write_timeout(Some(IO_TIMEOUT)))
                    .and_then(|()| handler(s, at, &sh));
            });
        }
    }
}

/// Reads a request's head (up to the blank line, at most [`HEAD_CAP`]
/// bytes) and returns its path.
fn read_path(s: &mut TcpStream) -> io::Result<String> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() >= HEAD_CAP {
            return Err(io::Error::other("request head too long"));
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    line.split_whitespace()
        .nth(1)
        .map(str::to_string)
        .ok_or_else(|| io::Error::other("no path"))
}

fn respond(s: &mut TcpStream, status: &str, body: &[u8]) -> io::Result<()> {
    write!(
        s,
        "HTTP/1.0 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    s.write_all(body)
}

/// Sends `n` bytes of an HTTP answer, then waits for the client to close.
fn send_bulk(s: &mut TcpStream, n: u64) -> io::Result<()> {
    write!(
        s,
        "HTTP/1.0 200 OK\r\nContent-Length: {n}\r\nContent-Type: application/octet-stream\r\n\
         Connection: close\r\n\r\n"
    )?;
    let chunk = [b'.'; 64 << 10];
    let mut left = n;
    while left > 0 {
        let k = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
        s.write_all(&chunk[..k])?;
        left -= k as u64;
    }
    // The client closes once it has every byte.
    let mut buf = [0u8; 256];
    while s.read(&mut buf)? > 0 {}
    Ok(())
}

fn http(mut s: TcpStream, accepted: Instant, sh: &Shared) -> io::Result<()> {
    let path = read_path(&mut s)?;
    let t0 = Instant::now();
    let bytes = |p: &str| p.parse::<u64>().ok().filter(|&n| n <= BULK_CAP);
    if path == "/c" {
        // Recorded first: the guest may be done before this thread is.
        lock(&sh.events).push(Event::Conn(accepted));
        respond(&mut s, "200 OK", b"ok")?;
    } else if path == "/script" {
        let host = s.local_addr()?.ip().to_string();
        let body = lock(&sh.script).replace("@HOST@", &host);
        respond(&mut s, "200 OK", body.as_bytes())?;
    } else if let Some(n) = path.strip_prefix("/bulk/").and_then(bytes) {
        send_bulk(&mut s, n)?;
        let secs = t0.elapsed().as_secs_f64();
        lock(&sh.events).push(Event::Bulk { bytes: n, secs });
    } else if let Some(n) = path.strip_prefix("/warm/").and_then(bytes) {
        send_bulk(&mut s, n)?;
    } else {
        respond(&mut s, "404 Not Found", b"")?;
    }
    Ok(())
}

fn echo(mut s: TcpStream, _: Instant, sh: &Shared) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut msg = [b'r'; MSG];
    msg[MSG - 1] = b'\n';
    let mut back = [0u8; MSG];
    let mut rtts = Vec::with_capacity(sh.exchanges);
    for i in 0..WARM_EXCHANGES + sh.exchanges {
        let t = Instant::now();
        s.write_all(&msg)?;
        s.read_exact(&mut back)?;
        if back != msg {
            return Err(io::Error::other("the echo differs"));
        }
        if i >= WARM_EXCHANGES {
            rtts.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    lock(&sh.events).push(Event::Rtts(rtts));
    let _ = s.shutdown(Shutdown::Both);
    Ok(())
}
