//! Flood fairness (issue 18), through shoald on /dev/kvm as root: with the
//! daemon's per-device limits (`--net-rate-pps`, token buckets in each
//! VMM), a sandbox sending to a test host as fast as it can (TCP from
//! `/dev/zero`) leaves a neighbour's download from that host within 20% of
//! what it was alone, and is itself held to its limit (so the test cannot
//! pass by the flood never happening). Both throughputs are measured by
//! the test host (a netns of the test's).

#[allow(dead_code)] // shared with the daemon tests; this binary uses part
mod daemon_harness;

use daemon_harness::net::net_args;
use daemon_harness::Daemon;
use shoal_client::api::{CreateSandbox, ExecRequest, NetworkSpec};
use shoal_client::ClientError;
use shoal_test_support::{ip, PeerNs};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Each sandbox's limit, both directions (frames/s; its bucket holds one
/// second's worth). On a PVM host a guest's network is bound by its
/// emulated kernel: under a loaded CI host one received ~20 frames/s and
/// sent ~5 full ones at its share of the CPU. The limit is set below that,
/// so the neighbour's figure is the limit's, not the host scheduler's.
const PPS: u64 = 6;
/// Most payload bytes a full frame carries (MSS of a 1500-byte MTU).
const MSS: u64 = 1448;
/// Bytes per timed download of the neighbour (~23 frames: its bucket's
/// second, then ~3 s at the limit).
const DOWNLOAD: u64 = 32 << 10;
/// Timed downloads per case.
const DOWNLOADS: usize = 3;
const HTTP: u16 = 8000;
const SINK: u16 = 9000;

/// A test host: a netns joined to the host by a veth, serving
/// `GET /N` (N bytes, timed from the request to the client's close) on
/// [`HTTP`] and discarding (and counting) what arrives on [`SINK`].
struct Peer {
    net: PeerNs,
    addr: Ipv4Addr,
    /// Seconds of each timed download.
    downloads: Arc<Mutex<Vec<f64>>>,
    /// Bytes the sink received.
    sunk: Arc<AtomicU64>,
}

impl Peer {
    fn new(tag: u32) -> Peer {
        let t = u8::try_from(tag % 250).unwrap();
        let (h, p) = (Ipv4Addr::new(10, 212, t, 1), Ipv4Addr::new(10, 212, t, 2));
        let net = PeerNs::create(&format!("shnf{tag}"), h, p);
        let peer = Peer {
            net,
            addr: p,
            downloads: Arc::default(),
            sunk: Arc::default(),
        };
        let listen = |port: u16| {
            shoal_hostnet::netns::run_in(&peer.net.ns, move || TcpListener::bind((p, port)))
                .expect("listen in the peer's netns")
        };
        let (http, sink) = (listen(HTTP), listen(SINK));
        let downloads = peer.downloads.clone();
        std::thread::spawn(move || {
            for s in http.incoming().flatten() {
                let d = downloads.clone();
                std::thread::spawn(move || serve_download(s, &d));
            }
        });
        let sunk = peer.sunk.clone();
        std::thread::spawn(move || {
            for mut s in sink.incoming().flatten() {
                let sunk = sunk.clone();
                std::thread::spawn(move || {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(120)));
                    let mut buf = vec![0u8; 64 << 10];
                    while let Ok(n @ 1..) = s.read(&mut buf) {
                        sunk.fetch_add(n as u64, Ordering::Relaxed);
                    }
                });
            }
        });
        peer
    }
}

/// Answers `GET /N` with N bytes (at most 64 MiB) and records the seconds
/// from the request to the client's close.
fn serve_download(mut s: TcpStream, downloads: &Mutex<Vec<f64>>) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(120)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(120)));
    let mut head = vec![];
    let mut buf = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 4096 {
        match s.read(&mut buf) {
            Ok(n @ 1..) => head.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
    let t0 = Instant::now();
    let line = String::from_utf8_lossy(&head);
    let n: Option<u64> = line
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.strip_prefix('/'))
        .and_then(|n| n.parse().ok())
        .filter(|&n| n <= 64 << 20);
    let Some(n) = n else { return };
    let chunk = [b'.'; 16 << 10];
    let mut left = n;
    let mut sent = write!(s, "HTTP/1.0 200 OK\r\nContent-Length: {n}\r\n\r\n").is_ok();
    while sent && left > 0 {
        let k = usize::try_from(left.min(16 << 10)).unwrap();
        sent = s.write_all(&chunk[..k]).is_ok();
        left -= k as u64;
    }
    // The client closes once it has every byte.
    while let Ok(1..) = s.read(&mut buf) {}
    if sent {
        downloads.lock().unwrap().push(t0.elapsed().as_secs_f64());
    }
}

/// The neighbour's throughput (bytes/s, the mean of `n` downloads of
/// [`DOWNLOAD`], each after a pause that refills its bucket), as the
/// test host timed them.
fn download_rate(d: &Daemon, id: &str, peer: &Peer, n: usize) -> f64 {
    peer.downloads.lock().unwrap().clear();
    let script = format!(
        "for i in $(seq {n}); do sleep 1.5; wget -q -O /dev/null http://{}:{HTTP}/{DOWNLOAD} || exit 1; done",
        peer.addr
    );
    let r = d.sh(id, &script);
    assert_eq!(r.exit_code, Some(0), "downloads: {r:?}\n{}", d.log());
    // The server records a download once it sees the client's close,
    // which may be after the exec's answer.
    let recorded = || peer.downloads.lock().unwrap().clone();
    let end = Instant::now() + Duration::from_secs(10);
    while recorded().len() < n && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = recorded();
    assert_eq!(secs.len(), n, "{secs:?}");
    let rates: Vec<f64> = secs.iter().map(|s| DOWNLOAD as f64 / s).collect();
    rates.iter().sum::<f64>() / rates.len() as f64
}

/// Removes the netns named with its prefix when dropped.
struct Sweep(String);

impl Drop for Sweep {
    fn drop(&mut self) {
        for n in ip(&["netns", "list"]).lines() {
            let n = n.split_whitespace().next().unwrap_or("");
            if n.starts_with(&self.0) {
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
        }
    }
}

#[test]
fn a_flooding_sandbox_leaves_its_neighbours_throughput_alone() {
    shoal_test_support::require_root("sandbox networks need netns, veth and nftables");
    let tag = std::process::id() % 10_000;
    let prefix = format!("sdf{tag}-");
    let link_prefix = format!("shv{tag}f");
    let pool = format!("10.211.{}.0/24", tag % 250);
    let peer = Peer::new(tag);
    // Dropped after the daemon: whatever slot a failure left goes too.
    let _sweep = Sweep(prefix.clone());
    let rate = PPS.to_string();
    let d = Daemon::start(
        &[
            &["--net-rate-pps", &rate, "--net-dns", "off"][..],
            &net_args(&pool, &prefix, &link_prefix),
        ]
        .concat(),
    );
    let net = NetworkSpec {
        allow_out: vec![format!("{}/32", peer.addr)],
        deny_out: vec![],
        allow_dns: false,
    };
    // The first create boots the networked template, which can take
    // minutes on a loaded PVM host: the daemon answers 504 while it builds.
    let create = || {
        let req = CreateSandbox {
            image: Some("tiny".into()),
            network: Some(net.clone()),
            ..Default::default()
        };
        let end = Instant::now() + Duration::from_secs(600);
        loop {
            match d.c.create(&req) {
                Err(ClientError::Api { status: 504, .. }) if Instant::now() < end => {}
                r => break d.must("create", r),
            }
        }
    };
    let (a, b) = (create(), create());
    // First packets (ARP both ways) before anything is timed.
    let warm = format!(
        "wget -q -O /dev/null http://{}:{HTTP}/1000 && echo ok",
        peer.addr
    );
    for id in [&a.id, &b.id] {
        let r = d.sh(id, &warm);
        assert_eq!(r.stdout.trim(), "ok", "{r:?}\n{}", d.log());
    }

    let alone = download_rate(&d, &a.id, &peer, DOWNLOADS);

    // b sends as fast as TCP lets it for as long as it lives.
    let flood = format!("nc {} {SINK} </dev/zero", peer.addr);
    d.must(
        "flood",
        d.c.start_command(&b.id, &ExecRequest::shell(flood)),
    );
    let start = Instant::now();
    while peer.sunk.load(Ordering::Relaxed) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the flood never arrived"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Past its bucket's first second.
    std::thread::sleep(Duration::from_secs(2));
    let (b0, t0) = (peer.sunk.load(Ordering::Relaxed), Instant::now());
    let flooded = download_rate(&d, &a.id, &peer, DOWNLOADS);
    let flood_rate = (peer.sunk.load(Ordering::Relaxed) - b0) as f64 / t0.elapsed().as_secs_f64();
    d.kill(&b.id);
    d.kill(&a.id);
    let kib = |x: f64| x / 1024.0;
    // The flood's payload at the limit: full frames only.
    let limit = (PPS * MSS) as f64;
    eprintln!(
        "neighbour alone {:.1} KiB/s, beside the flood {:.1} KiB/s; flood {:.1} KiB/s \
         (limit {PPS} frames/s, {:.1} KiB/s of payload)",
        kib(alone),
        kib(flooded),
        kib(flood_rate),
        kib(limit)
    );
    assert!(
        flooded >= 0.8 * alone,
        "the neighbour fell from {:.0} to {:.0} KiB/s beside the flood",
        kib(alone),
        kib(flooded)
    );
    // The flood happened, and at no more than its limit.
    assert!(
        flood_rate >= 0.3 * limit && flood_rate <= 1.1 * limit,
        "the flood ran at {:.1} KiB/s, its limit {:.1} KiB/s",
        kib(flood_rate),
        kib(limit)
    );
    drop(d);
    drop(peer);
}
