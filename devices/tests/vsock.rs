//! virtio-vsock driven from the guest's side by the test driver, with
//! real host Unix sockets: the hybrid CONNECT handshake both ways, credit,
//! malformed input from a hostile guest or host, shutdown, connection and
//! fd limits, the event loop on its own thread.

mod vsock_guest;

use devices::virtio::vsock::{
    Vsock, VsockError, VsockEvents, VsockHandle, CONN_TX_BUF_SIZE, CREDIT_UPDATE_THRESHOLD,
    FIRST_LOCAL_PORT, MAX_CONNECTIONS, TYPE_VSOCK,
};
use devices::virtio::VirtioDevice;
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;
use vsock_guest::{
    fd_count, is_closed, op, raise_fd_limit, read_exactly, read_line, Guest, Pkt, CID, RX_DATA,
};

fn nothing_to_read(s: &mut UnixStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let r = matches!(s.read(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    r
}

#[test]
fn halves_can_move_between_threads() {
    fn send<T: Send>() {}
    fn sync<T: Send + Sync>() {}
    send::<Vsock>();
    send::<VsockEvents>();
    sync::<VsockHandle>();
}

#[test]
fn identity_config_and_bad_setup() {
    let g = Guest::new(0);
    let mut d = g.d;
    assert_eq!(d.rd(0x8), TYPE_VSOCK);
    let mut cid = [0u8; 8];
    devices::BusDevice::read(&mut d.t, 0x100, &mut cid);
    assert_eq!(u64::from_le_bytes(cid), CID);
    let dir = tempfile::tempdir().unwrap();
    for bad in [0, 1, 2, u64::from(u32::MAX), 1 << 40] {
        assert!(matches!(
            Vsock::new(bad, &dir.path().join("x")),
            Err(VsockError::Cid(_))
        ));
    }
    // The socket path must not exist yet.
    let p = dir.path().join("taken");
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(Vsock::new(3, &p), Err(VsockError::Bind { .. })));
    // Dropping the event half removes the socket path.
    let p = dir.path().join("gone");
    let mut dev = Vsock::new(3, &p).unwrap();
    let ev = dev.take_events().unwrap();
    assert!(dev.take_events().is_none(), "handed out once");
    assert!(p.exists());
    assert_eq!(dev.queue_max_sizes().len(), 3);
    drop(ev);
    assert!(!p.exists());
}

#[test]
fn host_connect_request_response_and_data() {
    let mut g = Guest::new(8);
    let mut c = g.host_connect(1234);
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1);
    let req = &pkts[0];
    assert_eq!(req.op, op::REQUEST);
    assert_eq!((req.src_cid, req.dst_cid), (2, CID));
    assert_eq!(req.dst_port, 1234);
    assert!(req.src_port >= FIRST_LOCAL_PORT);
    assert_eq!(req.type_, 1);
    assert_eq!(req.buf_alloc, CONN_TX_BUF_SIZE);
    assert_eq!(req.len, 0);
    assert!(g.d.irq.eventfd().read().unwrap() >= 1, "guest interrupted");
    let local = req.src_port;

    g.send(&Pkt::guest(op::RESPONSE, 1234, local));
    assert_eq!(read_line(&mut c), format!("OK {local}\n"));
    assert_eq!(g.handle.connection_count(), 1);

    // host -> guest
    c.write_all(b"hello guest").unwrap();
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!(pkts[0].op, op::RW);
    assert_eq!((pkts[0].src_port, pkts[0].dst_port), (local, 1234));
    assert_eq!(pkts[0].data, b"hello guest");

    // guest -> host, both packet layouts
    g.send(&Pkt::guest(op::RW, 1234, local).with_data(b"hello "));
    g.send_split(&Pkt::guest(op::RW, 1234, local).with_data(b"host"));
    assert_eq!(read_exactly(&mut c, 10), b"hello host");

    // A bigger transfer, host -> guest, arrives complete and in order.
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    c.write_all(&big).unwrap();
    let mut got = vec![];
    for _ in 0..100 {
        for p in g.recv() {
            assert_eq!(p.op, op::RW);
            assert!(p.len <= RX_DATA);
            got.extend(p.data);
        }
        if got.len() == big.len() {
            break;
        }
    }
    assert_eq!(got, big);
}

#[test]
fn guest_credit_limits_host_data() {
    let mut g = Guest::new(8);
    let (mut c, local) = g.establish(80, 64);
    let data: Vec<u8> = (0..200u8).collect();
    c.write_all(&data).unwrap();
    let pkts = g.recv();
    let rw: Vec<_> = pkts.iter().filter(|p| p.op == op::RW).collect();
    assert_eq!(rw.len(), 1, "{pkts:?}");
    assert_eq!(rw[0].data, &data[..64]);
    // Out of credit the device asks for more, but sends no data.
    assert!(pkts.iter().any(|p| p.op == op::CREDIT_REQUEST));
    assert!(g.recv().is_empty());
    assert!(g.recv().is_empty());

    // The guest consumed 64 bytes: 64 more may come.
    let mut upd = Pkt::guest(op::CREDIT_UPDATE, 80, local);
    upd.buf_alloc = 64;
    upd.fwd_cnt = 64;
    g.send(&upd);
    let rw = g.recv_no_credit_req();
    assert_eq!(rw.len(), 1, "{rw:?}");
    assert_eq!(rw[0].data, &data[64..128]);
    assert!(g.recv_no_credit_req().is_empty());

    // A bigger window lets the rest through.
    upd.buf_alloc = 4096;
    upd.fwd_cnt = 128;
    g.send(&upd);
    let rw = g.recv_no_credit_req();
    assert_eq!(rw.len(), 1);
    assert_eq!(rw[0].data, &data[128..]);

    // CREDIT_REQUEST from the guest is answered with our credit.
    g.send(&Pkt::guest(op::CREDIT_REQUEST, 80, local));
    let p = g.recv();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].op, op::CREDIT_UPDATE);
    assert_eq!(p[0].buf_alloc, CONN_TX_BUF_SIZE);
}

#[test]
fn guest_connects_to_host_listener() {
    let mut g = Guest::new(8);
    let lpath = g.dir.path().join("vm.sock_5000");
    let l = UnixListener::bind(&lpath).unwrap();
    let mut req = Pkt::guest(op::REQUEST, 40000, 5000);
    req.buf_alloc = 4096;
    g.send(&req);
    let p = g.recv();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].op, op::RESPONSE);
    assert_eq!((p[0].src_port, p[0].dst_port), (5000, 40000));
    assert_eq!((p[0].src_cid, p[0].dst_cid), (2, CID));
    let (mut h, _) = l.accept().unwrap();

    g.send(&Pkt::guest(op::RW, 40000, 5000).with_data(b"ping"));
    assert_eq!(read_exactly(&mut h, 4), b"ping");
    h.write_all(b"pong").unwrap();
    let p = g.recv();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].data, b"pong");

    // Guest closes: the host peer sees EOF and the connection is gone.
    g.send(&Pkt::guest(op::RST, 40000, 5000));
    assert!(is_closed(&mut h));
    assert_eq!(g.handle.connection_count(), 0);
}

#[test]
fn guest_connect_without_listener_is_reset() {
    let mut g = Guest::new(8);
    g.send(&Pkt::guest(op::REQUEST, 40001, 5001));
    let p = g.recv();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].op, op::RST);
    assert_eq!((p[0].src_port, p[0].dst_port), (5001, 40001));
    assert_eq!(g.handle.connection_count(), 0);
}

#[test]
fn unknown_connection_is_reset() {
    let mut g = Guest::new(8);
    for o in [
        op::RW,
        op::RESPONSE,
        op::SHUTDOWN,
        op::CREDIT_UPDATE,
        op::CREDIT_REQUEST,
    ] {
        g.send(&Pkt::guest(o, 7, 9).with_data(if o == op::RW { b"x" } else { b"" }));
        let p = g.recv();
        assert_eq!(p.len(), 1, "op {o}");
        assert_eq!(p[0].op, op::RST);
        assert_eq!((p[0].src_port, p[0].dst_port), (9, 7));
    }
    // An RST for nothing gets no answer.
    g.send(&Pkt::guest(op::RST, 7, 9));
    assert!(g.recv().is_empty());
}

#[test]
fn guest_refusal_closes_host_socket() {
    let mut g = Guest::new(8);
    let mut c = g.host_connect(99);
    let req = g.recv();
    g.send(&Pkt::guest(op::RST, 99, req[0].src_port));
    assert!(is_closed(&mut c));
    assert_eq!(g.handle.connection_count(), 0);
}

#[test]
fn malformed_connect_lines_close_the_socket() {
    let mut g = Guest::new(8);
    let mut bad = vec![];
    for line in [
        &b"HELLO 5\n"[..],
        b"CONNECT x\n",
        b"CONNECT 99999999999\n",
        &[b'C'; 40],
    ] {
        let mut s = UnixStream::connect(&g.path).unwrap();
        s.write_all(line).unwrap();
        bad.push(s);
    }
    // A client that hangs up before finishing its line.
    let mut s = UnixStream::connect(&g.path).unwrap();
    s.write_all(b"CONN").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    bad.push(s);
    g.pump();
    for s in &mut bad {
        assert!(is_closed(s));
    }
    assert!(g.recv().is_empty());
    assert_eq!(g.handle.connection_count(), 0);
    // A good one still works afterwards; bytes after the line are kept.
    let mut c = UnixStream::connect(&g.path).unwrap();
    c.write_all(b"CONNECT 3\nearly").unwrap();
    let req = g.recv();
    assert_eq!(req.len(), 1);
    let local = req[0].src_port;
    g.send(&Pkt::guest(op::RESPONSE, 3, local));
    assert_eq!(read_line(&mut c), format!("OK {local}\n"));
    let p = g.recv();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].data, b"early");
}

#[test]
fn malformed_packets_do_not_panic_or_grow() {
    let mut g = Guest::new(16);
    let (mut c, local) = g.establish(77, 4096);
    let before = g.handle.counters().tx_dropped;
    let good = Pkt::guest(op::RW, 77, local).with_data(b"ok");

    // Header descriptor shorter than a header.
    g.send_raw(&good.header_bytes(), &[(None, 20, false)]);
    // len says 100, the descriptor holds 10.
    let mut p = good.clone();
    p.len = 100;
    g.send_raw(&p.header_bytes(), &[(None, 44 + 10, false)]);
    // len beyond the payload cap.
    p.len = u32::MAX;
    g.send_raw(
        &p.header_bytes(),
        &[(None, 44, false), (None, 0x1_0000, false)],
    );
    // Wrong source cid; wrong destination cid.
    let mut p = good.clone();
    p.src_cid = CID + 1;
    g.send(&p);
    let mut p = good.clone();
    p.dst_cid = 1;
    g.send(&p);
    // Device-writable TX descriptor.
    g.send_raw(&good.header_bytes(), &[(None, 46, true)]);
    // Header outside guest memory.
    g.send_raw(&[], &[(Some(0xffff_ffff_0000), 44, false)]);
    // Empty chain length.
    g.send_raw(&[], &[(None, 0, false)]);
    assert_eq!(g.handle.counters().tx_dropped - before, 8);
    assert_eq!(g.tx_used(), 1 + 8, "every chain is returned");
    assert!(
        nothing_to_read(&mut c),
        "no malformed data reached the host"
    );
    assert!(g.recv().is_empty());

    // A descriptor loop is bounded by the queue.
    g.d.write_desc_on(1, 200, 0x38_0000, 44, 1, 201);
    g.d.write_desc_on(1, 201, 0x38_0000, 44, 1, 200);
    g.d.publish_on(1, 200);
    g.d.notify_queue(1);
    g.pump();

    // Unknown type and unknown op are refused with RST.
    let mut p = Pkt::guest(op::REQUEST, 1, 2);
    p.type_ = 2;
    g.send(&p);
    let r = g.recv();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].op, op::RST);
    g.send(&Pkt::guest(99, 1, 2));
    assert_eq!(g.recv()[0].op, op::RST);
    // On a live connection a bad op resets it.
    g.send(&Pkt::guest(0, 77, local));
    let r = g.recv();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].op, op::RST);
    assert!(is_closed(&mut c));

    assert_eq!(g.handle.connection_count(), 0);
    assert_eq!(g.handle.buffered_bytes(), 0);
}

#[test]
fn unusable_rx_buffers_are_returned_empty() {
    let mut g = Guest::new(0);
    // Read-only, too short for a header, outside memory, oversized payload.
    g.post_rx_raw(0x38_0000, 4096, false);
    g.post_rx_raw(0x38_0000, 20, true);
    g.post_rx_raw(0xffff_ffff_0000, 4096, true);
    g.send(&Pkt::guest(op::RW, 1, 2).with_data(b"x"));
    let used = g.d.take_used_on(0);
    assert_eq!(used.len(), 3);
    assert!(used.iter().all(|&(_, len)| len == 0));
    // The RST still waits for a usable buffer.
    g.post_rx(1);
    let p = g.recv();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].op, op::RST);
}

#[test]
fn slow_host_reader_is_bounded_by_credit() {
    let mut g = Guest::new(32);
    let (mut c, local) = g.establish(9, 4096);
    let chunk = vec![0x5a; 4096];
    let mut sent: u32 = 0;
    let mut fwd: u32 = 0;
    let mut buf_alloc = CONN_TX_BUF_SIZE;
    // The guest sends whatever its credit allows, as a driver would.
    for _ in 0..1000 {
        let mut progressed = false;
        while sent - fwd + 4096 <= buf_alloc {
            g.send(&Pkt::guest(op::RW, 9, local).with_data(&chunk));
            sent += 4096;
            progressed = true;
        }
        for p in g.recv() {
            assert_eq!(p.op, op::CREDIT_UPDATE, "{p:?}");
            buf_alloc = p.buf_alloc;
            fwd = p.fwd_cnt;
            progressed = true;
        }
        if !progressed {
            break;
        }
        assert!(g.handle.buffered_bytes() <= CONN_TX_BUF_SIZE as usize);
    }
    assert_eq!(g.handle.connection_count(), 1);
    let held = g.handle.buffered_bytes();
    assert!(held > 0 && held <= CONN_TX_BUF_SIZE as usize, "{held}");
    // What the socket took plus what we hold is what the guest sent.
    assert!(fwd as usize + held <= sent as usize);

    // The host starts reading: bytes flow and the guest gets credit back.
    let mut total = 0usize;
    c.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut updates = 0;
    for _ in 0..1000 {
        match c.read(&mut buf) {
            Ok(n) => total += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        for p in g.recv() {
            assert_eq!(p.op, op::CREDIT_UPDATE);
            fwd = p.fwd_cnt;
            updates += 1;
        }
        if total == sent as usize {
            break;
        }
    }
    assert_eq!(total, sent as usize);
    assert!(updates > 0);
    assert!(
        sent - fwd < CREDIT_UPDATE_THRESHOLD,
        "the guest learns (nearly) everything was forwarded"
    );
    assert_eq!(g.handle.buffered_bytes(), 0);
}

#[test]
fn guest_ignoring_credit_is_reset() {
    let mut g = Guest::new(8);
    let (mut c, local) = g.establish(9, 4096);
    let chunk = vec![1u8; 0x1_0000];
    // Never reading, the host socket fills; then our buffer; then the guest
    // oversteps and the connection is reset rather than buffered.
    let mut reset = false;
    for _ in 0..100 {
        g.send(&Pkt::guest(op::RW, 9, local).with_data(&chunk));
        assert!(g.handle.buffered_bytes() <= CONN_TX_BUF_SIZE as usize);
        if g.recv().iter().any(|p| p.op == op::RST) {
            reset = true;
            break;
        }
    }
    assert!(reset);
    assert_eq!(g.handle.connection_count(), 0);
    assert_eq!(g.handle.buffered_bytes(), 0);
    // The host gets what was forwarded, then EOF.
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sink = vec![];
    c.read_to_end(&mut sink).unwrap();
    assert!(sink.len() >= 0x1_0000);
}

#[test]
fn shutdown_both_directions() {
    let mut g = Guest::new(8);
    let (mut c, local) = g.establish(21, 4096);
    // The guest stops sending: the host reads EOF but can still write.
    let mut sd = Pkt::guest(op::SHUTDOWN, 21, local);
    sd.flags = 2;
    g.send(&sd);
    assert!(is_closed(&mut c));
    c.write_all(b"late reply").unwrap();
    let p = g.recv();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].data, b"late reply");
    // Data after SHUTDOWN(send) is a protocol error.
    // The host closes: remaining data, then SHUTDOWN, and the guest's RST
    // finishes the connection.
    c.write_all(b"bye").unwrap();
    drop(c);
    let p = g.recv();
    let ops: Vec<u16> = p.iter().map(|p| p.op).collect();
    assert!(
        ops == [op::RW, op::RST] || ops == [op::RW, op::SHUTDOWN],
        "{p:?}"
    );
    assert_eq!(p[0].data, b"bye");
    if ops[1] == op::SHUTDOWN {
        g.send(&Pkt::guest(op::RST, 21, local));
    }
    assert_eq!(g.handle.connection_count(), 0);
}

#[test]
fn host_half_close_then_guest_close() {
    let mut g = Guest::new(8);
    let (mut c, local) = g.establish(22, 4096);
    c.write_all(b"request").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let p = g.recv();
    let ops: Vec<u16> = p.iter().map(|p| p.op).collect();
    assert_eq!(ops, [op::RW, op::SHUTDOWN], "{p:?}");
    assert_eq!(p[1].flags, 2, "host will send no more");
    // The guest answers, then closes.
    g.send(&Pkt::guest(op::RW, 22, local).with_data(b"response"));
    assert_eq!(read_exactly(&mut c, 8), b"response");
    let mut sd = Pkt::guest(op::SHUTDOWN, 22, local);
    sd.flags = 3;
    g.send(&sd);
    let p = g.recv();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].op, op::RST);
    assert!(is_closed(&mut c));
    assert_eq!(g.handle.connection_count(), 0);
}

#[test]
fn host_close_drains_pending_data_within_credit() {
    let mut g = Guest::new(8);
    let (mut c, local) = g.establish(23, 10);
    c.write_all(b"0123456789abcdef").unwrap();
    drop(c);
    let p = g.recv_no_credit_req();
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].data, b"0123456789");
    let mut upd = Pkt::guest(op::CREDIT_UPDATE, 23, local);
    upd.buf_alloc = 10;
    upd.fwd_cnt = 10;
    g.send(&upd);
    let p = g.recv_no_credit_req();
    let ops: Vec<u16> = p.iter().map(|p| p.op).collect();
    assert_eq!(ops, [op::RW, op::SHUTDOWN], "{p:?}");
    assert_eq!(p[0].data, b"abcdef");
    assert_eq!(p[1].flags, 3);
    g.send(&Pkt::guest(op::RST, 23, local));
    assert_eq!(g.handle.connection_count(), 0);
}

#[test]
fn three_hundred_concurrent_connections() {
    raise_fd_limit();
    let mut g = Guest::new(256);
    let n = 300;
    let mut clients = vec![];
    for i in 0..n {
        clients.push(g.host_connect(1000 + i));
        if i % 32 == 0 {
            g.pump();
        }
    }
    let mut reqs = vec![];
    for _ in 0..10 {
        reqs.extend(g.recv());
        if reqs.len() == n as usize {
            break;
        }
    }
    assert_eq!(reqs.len(), n as usize);
    let mut local_of = std::collections::HashMap::new();
    for r in &reqs {
        assert_eq!(r.op, op::REQUEST);
        assert!(local_of.insert(r.dst_port, r.src_port).is_none());
        g.send(&Pkt::guest(op::RESPONSE, r.dst_port, r.src_port));
    }
    let locals: std::collections::HashSet<u32> = local_of.values().copied().collect();
    assert_eq!(locals.len(), n as usize, "local ports are unique");
    for (i, c) in clients.iter_mut().enumerate() {
        let port = 1000 + u32::try_from(i).unwrap();
        assert_eq!(read_line(c), format!("OK {}\n", local_of[&port]));
        c.write_all(format!("client {i}").as_bytes()).unwrap();
    }
    assert_eq!(g.handle.connection_count(), n as usize);
    let mut got = vec![];
    for _ in 0..10 {
        got.extend(g.recv());
        if got.len() == n as usize {
            break;
        }
    }
    assert_eq!(got.len(), n as usize);
    for p in &got {
        let i = p.dst_port - 1000;
        assert_eq!(local_of[&p.dst_port], p.src_port);
        assert_eq!(p.data, format!("client {i}").as_bytes());
        g.send(&Pkt::guest(op::RW, p.dst_port, p.src_port).with_data(&i.to_le_bytes()));
    }
    for (i, c) in clients.iter_mut().enumerate() {
        assert_eq!(read_exactly(c, 4), u32::try_from(i).unwrap().to_le_bytes());
    }
    drop(clients);
    let mut closing = vec![];
    for _ in 0..10 {
        closing.extend(g.recv());
        if closing.len() == n as usize {
            break;
        }
    }
    assert_eq!(closing.len(), n as usize);
    for p in closing {
        assert_eq!(p.op, op::SHUTDOWN);
        g.send(&Pkt::guest(op::RST, p.dst_port, p.src_port));
    }
    assert_eq!(g.handle.connection_count(), 0);
}

#[test]
fn connection_limit_refuses_beyond() {
    let limit = raise_fd_limit();
    let needed = 3 * MAX_CONNECTIONS as u64 + 100;
    assert!(
        limit >= needed,
        "this test needs {needed} open files; the hard limit is {limit} (raise it: ulimit -Hn)"
    );
    let mut g = Guest::new(0);
    // Without RX buffers the REQUESTs wait; the connections still count.
    let mut clients = vec![];
    for i in 0..MAX_CONNECTIONS {
        clients.push(g.host_connect(u32::try_from(i).unwrap()));
        if i % 64 == 0 {
            g.pump();
        }
    }
    g.pump();
    assert_eq!(g.handle.connection_count(), MAX_CONNECTIONS);
    let mut extra = g.host_connect(1);
    g.pump();
    assert!(is_closed(&mut extra));
    // A guest connection is refused too.
    let _l = UnixListener::bind(g.dir.path().join("vm.sock_6")).unwrap();
    g.send(&Pkt::guest(op::REQUEST, 5, 6));
    assert!(g.handle.counters().refused >= 2);
    assert_eq!(g.handle.connection_count(), MAX_CONNECTIONS);
    // Closing clients frees the table.
    drop(clients);
    g.pump();
    assert_eq!(g.handle.connection_count(), 0);
}

#[test]
fn event_loop_on_its_own_thread() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;
    let mut g = Guest::new(128);
    let mut em = g.em.take().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let ev_thread = std::thread::spawn(move || {
        while !stop2.load(Ordering::Relaxed) {
            em.run_with_timeout(10).unwrap();
        }
    });
    // Host clients on their own threads: connect, send 64 KiB, read the
    // echo, close.
    let n = 8u32;
    let path = g.path.clone();
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut s = UnixStream::connect(&path).unwrap();
                writeln!(s, "CONNECT {}", 100 + i).unwrap();
                assert!(read_line(&mut s).starts_with("OK "));
                let data: Vec<u8> = (0..65536u32)
                    .map(|j| (j * 7 + i).to_le_bytes()[0])
                    .collect();
                s.write_all(&data).unwrap();
                assert_eq!(read_exactly(&mut s, data.len()), data);
            })
        })
        .collect();
    // The guest echoes every byte back until all clients are done.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut finished = 0;
    while finished < n {
        assert!(Instant::now() < deadline, "timed out");
        for p in g.recv() {
            match p.op {
                op::REQUEST => g.send(&Pkt::guest(op::RESPONSE, p.dst_port, p.src_port)),
                op::RW => {
                    let mut echo = Pkt::guest(op::RW, p.dst_port, p.src_port).with_data(&p.data);
                    echo.fwd_cnt = 0;
                    g.send(&echo);
                }
                op::SHUTDOWN => {
                    g.send(&Pkt::guest(op::RST, p.dst_port, p.src_port));
                    finished += 1;
                }
                op::CREDIT_UPDATE | op::CREDIT_REQUEST => {}
                other => panic!("unexpected op {other}"),
            }
        }
    }
    for c in clients {
        c.join().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while g.handle.connection_count() != 0 {
        assert!(Instant::now() < deadline);
        g.pump();
    }
    stop.store(true, Ordering::Relaxed);
    ev_thread.join().unwrap();
}

/// Set in the child process that [`fds_return_to_baseline`] runs.
const FD_CHILD: &str = "SHOAL_VSOCK_FD_CHILD";

/// 500 connection cycles of every kind end with as many open fds as
/// before. They run in a child process (this test again, alone, with
/// [`FD_CHILD`] set) so that other tests' fds do not disturb the count.
#[test]
fn fds_return_to_baseline() {
    if std::env::var_os(FD_CHILD).is_some() {
        fd_cycles();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "fds_return_to_baseline",
            "--exact",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(FD_CHILD, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

fn fd_cycles() {
    let mut g = Guest::new(64);
    let l = UnixListener::bind(g.dir.path().join("vm.sock_8000")).unwrap();
    g.pump();
    let baseline = fd_count();
    for i in 0..500u32 {
        match i % 5 {
            // Host closes; guest answers SHUTDOWN with RST.
            0 => {
                let (c, local) = g.establish(i, 4096);
                drop(c);
                let p = g.recv();
                assert_eq!(p.last().unwrap().op, op::SHUTDOWN, "{p:?}");
                g.send(&Pkt::guest(op::RST, i, local));
            }
            // Guest resets an established connection.
            1 => {
                let (mut c, local) = g.establish(i, 4096);
                g.send(&Pkt::guest(op::RST, i, local));
                assert!(is_closed(&mut c));
            }
            // Guest refuses.
            2 => {
                let mut c = g.host_connect(i);
                let r = g.recv();
                g.send(&Pkt::guest(op::RST, i, r[0].src_port));
                assert!(is_closed(&mut c));
            }
            // Guest-initiated to a listener, closed by the guest.
            3 => {
                g.send(&Pkt::guest(op::REQUEST, i, 8000));
                assert_eq!(g.recv()[0].op, op::RESPONSE);
                let (mut peer, _) = l.accept().unwrap();
                let mut sd = Pkt::guest(op::SHUTDOWN, i, 8000);
                sd.flags = 3;
                g.send(&sd);
                assert_eq!(g.recv()[0].op, op::RST);
                assert!(is_closed(&mut peer));
            }
            // Malformed CONNECT line.
            _ => {
                let mut s = UnixStream::connect(&g.path).unwrap();
                s.write_all(b"CONNECT nope\n").unwrap();
                g.pump();
                assert!(is_closed(&mut s));
            }
        }
        assert_eq!(g.handle.connection_count(), 0, "cycle {i}");
    }
    g.pump();
    assert_eq!(fd_count(), baseline);
}
