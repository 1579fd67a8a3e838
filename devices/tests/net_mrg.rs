//! Mergeable receive buffers (VIRTIO_NET_F_MRG_RXBUF) against a real TAP
//! in a private network namespace: a frame from the host spans as many of
//! the driver's small buffers as it needs with `num_buffers` saying how
//! many; with too few buffers it waits for more and asks to be notified
//! at the ring's end; a frame that a whole ring of buffers cannot hold is
//! dropped and the buffers come back empty; bad buffers drop the frame.
//! Needs root (TAPs, namespaces) like the other net device tests.

mod net_guest;

use devices::virtio::net::{Net, QUEUE_SIZE, VIRTIO_NET_F_MRG_RXBUF, VNET_HDR_LEN};
use devices::virtio::testing::layout;
use devices::virtio::VIRTIO_RING_F_EVENT_IDX;
use net_guest::*;
use std::net::UdpSocket;
use vm_memory::{Bytes, GuestAddress};

/// Small buffers, as a driver with mergeable buffers may post them.
const SMALL: u32 = 256;

/// A driver that took mergeable buffers (and `extra`), with a TAP whose
/// host side can send to the guest; returns the guest and a host socket.
fn merging_guest(extra: u64) -> (Guest, UdpSocket) {
    let tap = tap_up();
    let name = tap.name().to_owned();
    let dev = Net::new(tap, &config(GUEST_MAC)).unwrap();
    let g = Guest::with_features(dev, FEATURES | (1 << VIRTIO_NET_F_MRG_RXBUF) | extra);
    guest_neighbour(&name);
    (g, UdpSocket::bind((HOST_IP, 0)).unwrap())
}

/// Posts `n` rx buffers of `len` bytes in the scratch area, starting at
/// slot `first`; notifies.
fn post(g: &mut Guest, first: u64, n: u64, len: u32) {
    for i in first..first + n {
        g.d.push_chain_on(0, &[(SCRATCH + i * u64::from(SMALL), len, true)]);
    }
    g.d.notify_queue(0);
}

/// Used rx entries as (head, bytes written) and the bytes they hold.
fn take(g: &mut Guest) -> Vec<(u32, Vec<u8>)> {
    g.d.take_used_on(0)
        .into_iter()
        .map(|(id, len)| {
            let mut b = vec![0u8; usize::try_from(len).unwrap()];
            let at = SCRATCH + u64::from(id) * u64::from(SMALL);
            g.d.mem.read_slice(&mut b, GuestAddress(at)).unwrap();
            (id, b)
        })
        .collect()
}

/// The UDP payload of a frame (header stripped) sent to port 9.
fn payload(frame: &[u8]) -> Option<&[u8]> {
    (frame.len() >= 42 && frame[12..14] == [8, 0] && frame[36..38] == 9u16.to_be_bytes())
        .then(|| &frame[42..])
}

fn num_buffers(h: &[u8]) -> u16 {
    u16::from_le_bytes([h[10], h[11]])
}

#[test]
fn a_frame_spans_as_many_small_buffers_as_it_needs() {
    in_netns(|| {
        let (mut g, s) = merging_guest(0);
        post(&mut g, 0, 32, SMALL);
        let big: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        s.send_to(&big, (GUEST_IP, 9)).unwrap();
        s.send_to(b"small", (GUEST_IP, 9)).unwrap();
        let mut got: Vec<(u32, Vec<u8>)> = Vec::new();
        g.wait_until("both datagrams", |g| {
            got.extend(take(g));
            got.iter().filter(|(_, b)| b.len() >= VNET_HDR_LEN).count() >= 6
        });
        // 12 + 14 + 20 + 8 + 1000 = 1054 bytes: five buffers of 256, the
        // first four full; the header counts them.
        let (_, first) = &got[0];
        assert_eq!(num_buffers(first), 5, "num_buffers of the big frame");
        let lens: Vec<usize> = got[..5].iter().map(|(_, b)| b.len()).collect();
        assert_eq!(lens, [256, 256, 256, 256, 30]);
        let whole: Vec<u8> = got[..5].iter().flat_map(|(_, b)| b.clone()).collect();
        assert_eq!(payload(&whole[VNET_HDR_LEN..]), Some(&big[..]));
        // Buffers are used in the order they were posted.
        let heads: Vec<u32> = got.iter().map(|(h, _)| *h).collect();
        assert_eq!(heads[..6], [0, 1, 2, 3, 4, 5]);
        let (_, small) = &got[5];
        assert_eq!(num_buffers(small), 1);
        assert_eq!(payload(&small[VNET_HDR_LEN..]), Some(&b"small"[..]));
        let c = g.handle.counters();
        assert_eq!((c.rx_too_small, c.rx_malformed), (0, 0));
    });
}

#[test]
fn a_frame_waits_for_enough_buffers_and_asks_for_more_at_the_rings_end() {
    in_netns(|| {
        let (mut g, s) = merging_guest(1 << VIRTIO_RING_F_EVENT_IDX);
        let (_, _, used) = layout(0);
        let avail_event = GuestAddress(used + 4 + 8 * u64::from(QUEUE_SIZE));
        post(&mut g, 0, 2, SMALL);
        let big = vec![7u8; 1000];
        s.send_to(&big, (GUEST_IP, 9)).unwrap();
        g.wait_until("the frame to be read from the TAP", |g| {
            g.handle.held_bytes() > 0
        });
        g.pump();
        assert!(take(&mut g).is_empty(), "two buffers cannot hold it");
        assert_eq!(g.handle.counters().rx_too_small, 0, "it waits, not dropped");
        // Notify me when buffer 2 (the third) is added, not buffer 0.
        assert_eq!(g.d.mem.read_obj::<u16>(avail_event).unwrap(), 2);
        post(&mut g, 2, 3, SMALL);
        let got = take(&mut g);
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(num_buffers(&got[0].1), 5);
        let whole: Vec<u8> = got.iter().flat_map(|(_, b)| b.clone()).collect();
        assert_eq!(payload(&whole[VNET_HDR_LEN..]), Some(&big[..]));
        assert_eq!(g.handle.held_bytes(), 0);
    });
}

#[test]
fn a_frame_no_ring_of_buffers_holds_is_dropped_and_the_buffers_come_back() {
    in_netns(|| {
        let (mut g, s) = merging_guest(0);
        // A full ring of 2-byte buffers: 512 bytes, less than the frame.
        post(&mut g, 0, u64::from(QUEUE_SIZE), 2);
        s.send_to(&[1u8; 1000], (GUEST_IP, 9)).unwrap();
        g.wait_until("the drop", |g| g.handle.counters().rx_too_small == 1);
        let got = take(&mut g);
        assert_eq!(got.len(), usize::from(QUEUE_SIZE));
        assert!(got.iter().all(|(_, b)| b.is_empty()), "returned empty");
        // The next frame, with buffers that fit, gets through.
        post(&mut g, 0, 8, SMALL);
        s.send_to(b"after", (GUEST_IP, 9)).unwrap();
        let mut after = None;
        g.wait_until("the next datagram", |g| {
            for (_, b) in take(g) {
                if payload(&b[VNET_HDR_LEN..]) == Some(&b"after"[..]) {
                    after = Some(b);
                }
            }
            after.is_some()
        });
        assert_eq!(num_buffers(after.as_ref().unwrap()), 1);
    });
}

#[test]
fn a_device_readable_buffer_drops_the_frame_and_returns_every_buffer() {
    in_netns(|| {
        let (mut g, s) = merging_guest(0);
        post(&mut g, 0, 2, SMALL);
        // The third buffer is device-readable: the guest's mistake.
        g.d.push_chain_on(0, &[(SCRATCH + 2 * u64::from(SMALL), SMALL, false)]);
        post(&mut g, 3, 4, SMALL);
        s.send_to(&[2u8; 1000], (GUEST_IP, 9)).unwrap();
        g.wait_until("the drop", |g| g.handle.counters().rx_malformed == 1);
        let got = take(&mut g);
        let heads: Vec<u32> = got.iter().map(|(h, _)| *h).collect();
        assert_eq!(heads, [0, 1, 2], "the frame's buffers, back empty");
        assert!(got.iter().all(|(_, b)| b.is_empty()));
        // The buffers after it are still the guest's for the next frame.
        s.send_to(b"next", (GUEST_IP, 9)).unwrap();
        let mut next = Vec::new();
        g.wait_until("the next datagram", |g| {
            next.extend(take(g));
            !next.is_empty()
        });
        assert_eq!(next[0].0, 3);
        assert_eq!(payload(&next[0].1[VNET_HDR_LEN..]), Some(&b"next"[..]));
    });
}
