//! The vsock device against a hostile guest (and a stuck host client),
//! driven directly (no KVM): a host CONNECT the guest never answers, or a
//! CONNECT line never finished, is closed after the connect timeout and
//! its entry freed; a guest opening thousands of connections is refused
//! with RST beyond its share of the table, so host connections (the
//! daemon's to the agent) still find room.

mod vsock_guest;

use devices::virtio::vsock::{CONNECT_TIMEOUT, MAX_CONNECTIONS, MAX_GUEST_CONNECTIONS};
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};
use vsock_guest::{fd_count, is_closed, op, raise_fd_limit, read_line, Guest, Pkt};

/// Runs the event loop for `d` (the timer included), as the VMM's event
/// thread does.
fn run_for(g: &mut Guest, d: Duration) {
    let t0 = Instant::now();
    let em = g.em.as_mut().expect("event loop in the test thread");
    while t0.elapsed() < d {
        em.run_with_timeout(20).unwrap();
    }
}

/// Whether the peer has closed `s` (without waiting).
fn closed_now(s: &mut UnixStream) -> bool {
    use std::io::Read;
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let r = matches!(s.read(&mut b), Ok(0))
        || matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset);
    s.set_nonblocking(false).unwrap();
    r
}

#[test]
fn a_connect_the_guest_never_answers_is_closed_and_reset() {
    let mut g = Guest::new(8);
    let mut c = g.host_connect(5000);
    let req = g.recv();
    assert_eq!(req.len(), 1, "{req:?}");
    assert_eq!(req[0].op, op::REQUEST);
    let local = req[0].src_port;
    assert_eq!(g.handle.connection_count(), 1);
    // Not yet: the guest has until the timeout.
    run_for(&mut g, CONNECT_TIMEOUT / 2);
    assert!(!closed_now(&mut c), "closed before the timeout");
    run_for(&mut g, CONNECT_TIMEOUT / 2 + Duration::from_secs(2));
    assert!(is_closed(&mut c), "the host socket was kept");
    assert_eq!(g.handle.connection_count(), 0, "the entry was kept");
    assert_eq!(g.handle.counters().connect_timeouts, 1);
    // The guest is told (its half-open socket is reset).
    let p = g.recv();
    assert!(
        p.iter()
            .any(|p| p.op == op::RST && (p.src_port, p.dst_port) == (local, 5000)),
        "{p:?}"
    );
    // A late RESPONSE finds nothing (and is reset).
    g.send(&Pkt::guest(op::RESPONSE, 5000, local));
    assert_eq!(g.recv()[0].op, op::RST);
    // A connection the guest answers in time works as before.
    let mut c = g.host_connect(5001);
    let req = g.recv();
    g.send(&Pkt::guest(op::RESPONSE, 5001, req[0].src_port));
    assert_eq!(read_line(&mut c), format!("OK {}\n", req[0].src_port));
    run_for(&mut g, CONNECT_TIMEOUT + Duration::from_secs(1));
    assert!(!closed_now(&mut c), "an established connection timed out");
    assert_eq!(g.handle.connection_count(), 1);
}

#[test]
fn a_connect_line_never_finished_is_closed() {
    let mut g = Guest::new(8);
    let mut s = UnixStream::connect(&g.path).unwrap();
    s.write_all(b"CONN").unwrap();
    let mut quiet = UnixStream::connect(&g.path).unwrap();
    g.pump();
    run_for(&mut g, CONNECT_TIMEOUT + Duration::from_secs(2));
    assert!(is_closed(&mut s), "a half-sent CONNECT line was kept");
    assert!(is_closed(&mut quiet), "a silent host socket was kept");
    assert!(g.recv().is_empty(), "the guest heard of it");
    // The listener still serves.
    let (_c, _) = g.establish(7, 4096);
}

#[test]
fn a_guest_opening_thousands_of_connections_leaves_room_for_the_host() {
    let limit = raise_fd_limit();
    let needed = 3 * MAX_CONNECTIONS as u64 + 100;
    assert!(
        limit >= needed,
        "this test needs {needed} open files; the hard limit is {limit} (raise it: ulimit -Hn)"
    );
    let mut g = Guest::new(64);
    let l = UnixListener::bind(g.dir.path().join("vm.sock_5000")).unwrap();
    l.set_nonblocking(true).unwrap();
    let fds0 = fd_count();
    let mut accepted = vec![];
    let (mut responses, mut resets) = (0usize, 0usize);
    for i in 0..10_000u32 {
        let mut req = Pkt::guest(op::REQUEST, 20_000 + i, 5000);
        req.buf_alloc = 4096;
        g.send(&req);
        if i % 32 == 31 {
            for p in g.recv() {
                match p.op {
                    op::RESPONSE => responses += 1,
                    op::RST => resets += 1,
                    o => panic!("unexpected op {o}"),
                }
            }
            while let Ok((s, _)) = l.accept() {
                accepted.push(s);
            }
        }
    }
    for p in g.recv() {
        match p.op {
            op::RESPONSE => responses += 1,
            op::RST => resets += 1,
            o => panic!("unexpected op {o}"),
        }
    }
    assert_eq!(responses + resets, 10_000);
    assert_eq!(responses, MAX_GUEST_CONNECTIONS, "guest connections kept");
    assert_eq!(g.handle.connection_count(), MAX_GUEST_CONNECTIONS);
    let fds = fd_count() - fds0;
    assert!(
        fds <= 2 * MAX_GUEST_CONNECTIONS + 16,
        "{fds} descriptors for {MAX_GUEST_CONNECTIONS} connections"
    );
    // The host still connects.
    let (_c, _) = g.establish(5000, 4096);
    assert_eq!(g.handle.connection_count(), MAX_GUEST_CONNECTIONS + 1);
}
