//! The listeners against hostile callers, over real sockets: a whole
//! daemon ([`crate::serve_until`], no KVM: its VMM does not exist) on a
//! temporary state directory, with TCP and named tokens, driven by raw
//! HTTP/1.1 from std sockets so that requests can be sent half-way.

use super::*;
use crate::auth::Tokens;
use crate::{Config, Daemon};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Instant;

pub(crate) const ALICE: &str = "alice-token-0123456789";
pub(crate) const BOB: &str = "bob-token-0123456789ab";

/// A daemon serving its Unix socket and TCP (tokens `alice`, `bob`).
pub(crate) struct Served {
    _tmp: tempfile::TempDir,
    pub addr: SocketAddr,
    pub sock: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    pub fn start(http: HttpLimits) -> Served {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let backend = shoal_runtime::backend::microvm::MicroVm::new(
            "/nonexistent/shoal-vmm",
            shoal_images::artifacts::Layout::at(tmp.path().join("no-artifacts")),
        );
        let d = Daemon::open(
            Config {
                http,
                ..Config::for_tests(&state, 8192, 4, 10)
            },
            Arc::new(backend),
        )
        .unwrap();
        // A free port (bound, then let go for the daemon to bind).
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let tokens = Tokens::named([
            ("alice".to_string(), ALICE.to_string()),
            ("bob".to_string(), BOB.to_string()),
        ]);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let d2 = d.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                crate::serve_until(d2, Some((addr, tokens)), async {
                    let _ = stopped.await;
                })
                .await
                .expect("the daemon serves");
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        });
        let sock = d.cfg.socket();
        let t0 = Instant::now();
        while TcpStream::connect(addr).is_err() || UnixStream::connect(&sock).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Served {
            _tmp: tmp,
            addr,
            sock,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// A TCP request with `token` (or none): status and body.
    pub fn tcp(&self, token: Option<&str>, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(self.addr).unwrap();
        request(&mut s, token, method, path, body)
    }

    /// A Unix socket request: status and body.
    pub fn unix(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = UnixStream::connect(&self.sock).unwrap();
        request(&mut s, None, method, path, body)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends one request (`Connection: close`) and reads the whole answer
/// (within 10 s): status and body.
pub(crate) fn request<S: Read + Write + Timeouts>(
    s: &mut S,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    s.timeouts(Some(Duration::from_secs(10)));
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    answer(s)
}

/// Reads a response to its end: status and body.
pub(crate) fn answer<S: Read>(s: &mut S) -> (u16, String) {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_string())
}

/// Read and write timeouts of std sockets.
pub(crate) trait Timeouts {
    fn timeouts(&self, t: Option<Duration>);
}

impl Timeouts for TcpStream {
    fn timeouts(&self, t: Option<Duration>) {
        self.set_read_timeout(t).unwrap();
        self.set_write_timeout(t).unwrap();
    }
}

impl Timeouts for UnixStream {
    fn timeouts(&self, t: Option<Duration>) {
        self.set_read_timeout(t).unwrap();
        self.set_write_timeout(t).unwrap();
    }
}

/// Whether the daemon closed `s` (EOF) within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 1024];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn half_sent(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Le")
        .unwrap();
    s
}

/// Connections to the daemon at `addr` whose daemon end is still an open
/// socket (`/proc/net/tcp`: local port the daemon's, not listening, with
/// an inode).
fn held_by_daemon(addr: SocketAddr) -> usize {
    let port = format!(":{:04X}", addr.port());
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 9 && f[1].ends_with(&port) && f[3] != "0A" && f[9] != "0"
        })
        .count()
}

/// The process's resident memory (KiB).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn limits() -> HttpLimits {
    HttpLimits {
        header_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        max_connections: 1000,
        max_json_body: 1 << 20,
        max_upload: 1 << 20,
    }
}

#[test]
fn half_sent_requests_are_dropped_after_the_header_timeout() {
    let s = Served::start(limits());
    let mut held: Vec<TcpStream> = (0..400).map(|_| half_sent(s.addr)).collect();
    // Authenticated requests keep working meanwhile, on both listeners.
    let t0 = Instant::now();
    assert_eq!(s.tcp(Some(ALICE), "GET", "/v1/stats", "").0, 200);
    assert_eq!(s.unix("GET", "/v1/stats", "").0, 200);
    assert_eq!(s.tcp(None, "GET", "/v1/stats", "").0, 401);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // Each half-sent one is closed by the daemon once its head is late.
    let t0 = Instant::now();
    for (i, c) in held.iter_mut().enumerate() {
        assert!(
            closed_within(c, Duration::from_secs(10)),
            "half-sent request {i} still open after {:?}",
            t0.elapsed()
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // The daemon's ends are no descriptors any more (a socket still open
    // in a process has an inode; one closed and lingering has none).
    assert_eq!(held_by_daemon(s.addr), 0);
    drop(held);
    // An idle keep-alive connection goes the same way.
    let mut c = TcpStream::connect(s.addr).unwrap();
    assert!(closed_within(&mut c, Duration::from_secs(5)));
    assert_eq!(s.tcp(Some(ALICE), "GET", "/v1/stats", "").0, 200);
    // Counted: every one of them timed out; this scrape is open.
    let (st, m) = s.tcp(Some(ALICE), "GET", "/metrics", "");
    assert_eq!(st, 200);
    let value = |k: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix(k)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {m}"))
    };
    assert!(
        value("shoal_http_timeouts_total{listener=\"tcp\"}") >= 401,
        "{m}"
    );
    // (The previous request's connection may be ending still.)
    let open = value("shoal_http_connections{listener=\"tcp\"}");
    assert!((1..=2).contains(&open), "{m}");
}

#[test]
fn connections_past_the_cap_wait_and_each_listener_has_its_own_cap() {
    let s = Served::start(HttpLimits {
        header_timeout: Duration::from_secs(30),
        max_connections: 8,
        ..limits()
    });
    let mut held: Vec<TcpStream> = (0..8).map(|_| half_sent(s.addr)).collect();
    // Wait until the daemon has accepted them all (a request on a 9th
    // connection is not answered).
    let t0 = Instant::now();
    while held_by_daemon(s.addr) < 8 {
        assert!(t0.elapsed() < Duration::from_secs(10), "not accepted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut ninth = TcpStream::connect(s.addr).unwrap();
    write!(
        ninth,
        "GET /v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    ninth
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut b = [0u8; 64];
    let r = ninth.read(&mut b);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the 9th connection was served past the cap of 8: {r:?}"
    );
    // It waits in the kernel's backlog: the daemon holds no socket for it.
    assert_eq!(held_by_daemon(s.addr), 8);
    // The Unix socket's cap is its own.
    assert_eq!(s.unix("GET", "/v1/stats", "").0, 200);
    // One slot frees: the waiting one is served.
    drop(held.pop());
    let (status, _) = answer(&mut ninth);
    assert_eq!(status, 200);
}

#[test]
fn huge_json_bodies_are_refused_with_413_unread() {
    let s = Served::start(limits());
    let before = rss_kib();
    // A declared 1 GiB body: refused before any of it is read.
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"metadata\":{{\"a\":\"",
        1u64 << 30
    )
    .unwrap();
    let (status, body) = answer(&mut c);
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("payload_too_large"), "{body}");
    // A chunked 1 GiB body: refused after at most the limit was read.
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        c,
        "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .unwrap();
    let mut w = c.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let chunk = vec![b' '; 1 << 20];
        let head = format!("{:x}\r\n", chunk.len());
        let mut sent = 0u64;
        while sent < 1 << 30 {
            if w.write_all(head.as_bytes()).is_err()
                || w.write_all(&chunk).is_err()
                || w.write_all(b"\r\n").is_err()
            {
                break;
            }
            sent += chunk.len() as u64;
        }
        sent
    });
    let (status, body) = answer(&mut c);
    assert_eq!(status, 413, "{body}");
    let sent = sender.join().unwrap();
    assert!(sent < 1 << 30, "the daemon read all of a 1 GiB body");
    // Not held whole (other tests in this process allocate meanwhile:
    // the bound is loose, the body 1 GiB).
    let grown = rss_kib().saturating_sub(before);
    assert!(grown < 512 * 1024, "grew by {grown} KiB");
    // Uploads have their own cap (a declared length past it: 413 at once).
    let mut c = TcpStream::connect(s.addr).unwrap();
    write!(
        c,
        "PUT /v1/sandboxes/0123456789ab/files?path=/x HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {ALICE}\r\nContent-Length: {}\r\n\r\n",
        (1u64 << 20) + 1
    )
    .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(answer(&mut c).0, 413);
    // Meanwhile, requests are served.
    assert_eq!(s.tcp(Some(BOB), "GET", "/v1/sandboxes", "").0, 200);
}

#[test]
fn a_stalled_request_body_ends_after_the_idle_timeout() {
    let s = Served::start(limits());
    let mut c = TcpStream::connect(s.addr).unwrap();
    write!(
        c,
        "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Length: 100\r\n\r\n{{\"ima"
    )
    .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = Instant::now();
    let (status, body) = answer(&mut c);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("stalled"), "{body}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}
