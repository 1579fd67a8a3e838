//! Saving and restoring a vsock device, alone and through its transport,
//! and the transport reset that tells a restored guest its connections are
//! gone.

mod vsock_guest;

use devices::virtio::persist::QueueState;
use devices::virtio::vsock::{Vsock, VsockArgs, VsockError, VsockState};
use devices::virtio::{VirtioDevice, VirtioInterrupt};
use devices::IrqLine;
use snapshot::Persist;
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress};
use vsock_guest::{is_closed, op, read_exactly, Guest, Pkt, CID};

fn irq() -> Arc<VirtioInterrupt> {
    Arc::new(VirtioInterrupt::new(IrqLine::new(5).unwrap()))
}

#[test]
fn the_transport_saves_queue_positions_and_a_reset_closes_host_sockets() {
    let mut g = Guest::new(8);
    let (mut c, local) = g.establish(31, 4096);
    g.send(&Pkt::guest(op::RW, 31, local).with_data(b"x"));
    let st = g.d.t.save().unwrap();
    assert_eq!(st.acked_features, 1 << 32);
    assert_eq!(st.queues.len(), 3);
    assert_eq!(st.queues[1].next_avail, 2, "two TX packets taken");
    assert_eq!(st.queues[0].size, 256);
    g.d.wr(0x70, 0);
    g.pump();
    assert_eq!(read_exactly(&mut c, 1), b"x");
    assert!(is_closed(&mut c));
    assert_eq!(g.handle.connection_count(), 0);
    assert!(!g.d.t.is_activated());
}

/// Queue states that fit the guest memory of a [`Guest`]: those its
/// driver set up.
fn live_queues(g: &Guest) -> Vec<QueueState> {
    g.d.t.save().unwrap().queues
}

#[test]
fn device_state_round_trips() {
    let g = Guest::new(0);
    let dir = tempfile::tempdir().unwrap();
    // Inactive: the cid only.
    let mut dev = Vsock::new(CID, &dir.path().join("a")).unwrap();
    let inactive = dev.save().unwrap();
    assert_eq!(
        inactive,
        VsockState {
            cid: CID,
            acked_features: 0,
            queues: vec![]
        }
    );
    // Active: features and queue positions.
    let queues: Vec<_> = live_queues(&g)
        .iter()
        .map(|q| q.to_queue().unwrap())
        .collect();
    dev.set_acked_features(1 << 32);
    dev.activate(g.d.mem.clone(), irq(), queues).unwrap();
    let active = dev.save().unwrap();
    assert_eq!(active.queues, live_queues(&g));
    assert_eq!(active.acked_features, 1 << 32);
    for (name, state) in [("b", &inactive), ("c", &active)] {
        let args = VsockArgs {
            uds_path: dir.path().join(name),
            mem: g.d.mem.clone(),
            irq: irq(),
        };
        let mut back = Vsock::restore(args, state).unwrap();
        assert_eq!(&back.save().unwrap(), state);
        // A restored device serves a fresh host socket.
        assert!(dir.path().join(name).exists());
        drop(back.take_events().unwrap());
        assert!(!dir.path().join(name).exists());
    }
    // Through the snapshot container.
    let mut file = Vec::new();
    snapshot::write_to(&mut file, &active).unwrap();
    let read: VsockState =
        snapshot::read_from(&mut file.as_slice(), std::path::Path::new("s")).unwrap();
    assert_eq!(read, active);
}

#[test]
fn bad_device_states_are_refused() {
    let g = Guest::new(0);
    let dir = tempfile::tempdir().unwrap();
    let args = |n: &str| VsockArgs {
        uds_path: dir.path().join(n),
        mem: g.d.mem.clone(),
        irq: irq(),
    };
    let good = VsockState {
        cid: CID,
        acked_features: 1 << 32,
        queues: live_queues(&g),
    };
    let mut two = good.clone();
    two.queues.pop();
    assert!(matches!(
        Vsock::restore(args("a"), &two),
        Err(VsockError::QueueCount(2))
    ));
    let mut odd = good.clone();
    odd.queues[1].size = 3;
    assert!(matches!(
        Vsock::restore(args("b"), &odd),
        Err(VsockError::Queue { index: 1, .. })
    ));
    let mut cid = good.clone();
    cid.cid = 2;
    assert!(matches!(
        Vsock::restore(args("c"), &cid),
        Err(VsockError::Cid(2))
    ));
    // Nothing was left listening.
    for n in ["a", "b", "c"] {
        assert!(!dir.path().join(n).exists(), "{n}");
    }
    Vsock::restore(args("d"), &good).unwrap();
}

#[test]
fn transport_reset_event() {
    let mut g = Guest::new(8);
    let (mut c, _) = g.establish(30, 4096);
    let ev = g.post_event_buf();
    g.handle.send_transport_reset();
    g.pump();
    let used = g.d.take_used_on(2);
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].1, 4);
    assert_eq!(g.d.mem.read_obj::<u32>(GuestAddress(ev)).unwrap(), 0);
    assert_eq!(g.handle.connection_count(), 0);
    assert!(is_closed(&mut c));

    // Without an event buffer the event waits for one.
    g.handle.send_transport_reset();
    assert!(g.d.take_used_on(2).is_empty());
    let ev = g.post_event_buf();
    let used = g.d.take_used_on(2);
    assert_eq!(used, vec![(1, 4)]);
    assert_eq!(g.d.mem.read_obj::<u32>(GuestAddress(ev)).unwrap(), 0);
}

#[test]
fn host_connections_wait_until_the_guest_handled_a_reset() {
    let mut g = Guest::new(8);
    // As after a snapshot restore: the reset is queued before the guest
    // runs; a host client connects at once.
    g.handle.send_transport_reset();
    let mut c = g.host_connect(40);
    g.pump();
    assert!(g.recv().is_empty(), "no REQUEST while the reset is pending");
    let _ = g.post_event_buf(); // the reset is delivered into this buffer
    g.pump();
    assert!(
        g.recv().is_empty(),
        "no REQUEST before the guest handled it"
    );
    let _ = g.post_event_buf(); // re-posting the buffer: handled
    g.pump();
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!(pkts[0].op, op::REQUEST);
    assert_eq!(pkts[0].dst_port, 40);
    let mut resp = Pkt::guest(op::RESPONSE, 40, pkts[0].src_port);
    resp.buf_alloc = 4096;
    g.send(&resp);
    g.pump();
    let mut line = [0u8; 3];
    std::io::Read::read_exact(&mut c, &mut line).unwrap();
    assert_eq!(&line, b"OK ");
}
