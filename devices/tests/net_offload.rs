//! The net device's checksum offloads on a real TAP in a private network
//! namespace, driven from the guest's side by the test driver: a frame
//! with a partial checksum reaches a host socket only when its header's
//! NEEDS_CSUM is passed on; the TAP hands a driver that took GUEST_CSUM
//! partial checksums and one that did not whole ones; offload fields a
//! driver did not take are dropped and counted; with EVENT_IDX the device
//! asks for the next notification and interrupts only when the driver's
//! used_event says so, and a garbage avail index cannot make it spin; a
//! TCP segment counts against a packet rate limit as the packets it
//! becomes. (64 KiB TCP segments in both directions are exercised by real
//! guests: `tests/tests/net_*.rs` and `shoal bench net`.)

mod net_guest;

use devices::rate_limiter::{BucketConfig, RateLimit};
use devices::virtio::net::offload::{
    GSO_TCPV4, NEEDS_CSUM, VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_HOST_TSO4,
};
use devices::virtio::net::{MacAddr, Net, VNET_HDR_LEN};
use devices::virtio::testing::layout;
use devices::virtio::{INT_USED_RING, VIRTIO_RING_F_EVENT_IDX};
use net_guest::*;
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

/// One's-complement sum of 16-bit words.
fn sum(data: &[u8], mut acc: u32) -> u32 {
    for c in data.chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    u16::try_from(acc).unwrap()
}

/// An Ethernet + IPv4 + UDP frame from the guest to `dst`:`port`, with a
/// valid IP header checksum and `udp_csum` in the UDP checksum field.
fn udp_frame(dst_mac: MacAddr, dst: Ipv4Addr, port: u16, payload: &[u8], udp_csum: u16) -> Vec<u8> {
    let udp_len = u16::try_from(8 + payload.len()).unwrap();
    let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
    ip.extend_from_slice(&GUEST_IP.octets());
    ip.extend_from_slice(&dst.octets());
    let c = !fold(sum(&ip, 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&4000u16.to_be_bytes());
    ip.extend_from_slice(&port.to_be_bytes());
    ip.extend_from_slice(&udp_len.to_be_bytes());
    ip.extend_from_slice(&udp_csum.to_be_bytes());
    ip.extend_from_slice(payload);
    eth(dst_mac.0, GUEST_MAC, 0x0800, &ip)
}

/// The partial checksum a sender leaves for the device: the pseudo
/// header's sum, not complemented.
fn pseudo_sum(dst: Ipv4Addr, udp_len: u16) -> u16 {
    let mut p = GUEST_IP.octets().to_vec();
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&[0, 17]);
    p.extend_from_slice(&udp_len.to_be_bytes());
    fold(sum(&p, 0))
}

fn hdr(flags: u8, gso: u8, gso_size: u16, start: u16, off: u16) -> [u8; VNET_HDR_LEN] {
    let mut h = [0u8; VNET_HDR_LEN];
    h[0] = flags;
    h[1] = gso;
    h[2..4].copy_from_slice(&42u16.to_le_bytes());
    h[4..6].copy_from_slice(&gso_size.to_le_bytes());
    h[6..8].copy_from_slice(&start.to_le_bytes());
    h[8..10].copy_from_slice(&off.to_le_bytes());
    h
}

fn host_socket() -> UdpSocket {
    let s = UdpSocket::bind((HOST_IP, 7000)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    s
}

fn recv(s: &UdpSocket) -> Option<Vec<u8>> {
    let mut b = [0u8; 2048];
    s.recv(&mut b).ok().map(|n| b[..n].to_vec())
}

#[test]
fn a_partial_checksum_reaches_the_host_only_with_needs_csum() {
    in_netns(|| {
        let tap = tap_up();
        let host_mac = link_mac(tap.name());
        let dev = Net::new(tap, &config(GUEST_MAC)).unwrap();
        let mut g = Guest::with_features(dev, FEATURES | (1 << VIRTIO_NET_F_CSUM));
        let sock = host_socket();
        let payload = b"partial checksum";
        let partial = pseudo_sum(HOST_IP, u16::try_from(8 + payload.len()).unwrap());
        let frame = udp_frame(host_mac, HOST_IP, 7000, payload, partial);
        // Without NEEDS_CSUM the kernel checks the (wrong) checksum: dropped.
        g.queue_tx_with(&hdr(0, 0, 0, 0, 0), &frame);
        g.d.notify_queue(1);
        assert_eq!(recv(&sock), None, "a bad checksum was delivered");
        // With it the kernel fills the checksum in: delivered.
        g.queue_tx_with(&hdr(NEEDS_CSUM, 0, 0, 34, 6), &frame);
        g.d.notify_queue(1);
        assert_eq!(recv(&sock).as_deref(), Some(&payload[..]));
        let c = g.handle.counters();
        assert_eq!((c.tx_packets, c.tx_malformed), (2, 0));

        // A segment type the driver did not take, a checksum outside the
        // frame, and a flag a guest may not send: dropped and counted.
        for h in [
            hdr(NEEDS_CSUM, GSO_TCPV4, 1448, 34, 16),
            hdr(NEEDS_CSUM, 0, 0, 2000, 6),
            hdr(NEEDS_CSUM | 2, 0, 0, 34, 6),
        ] {
            g.queue_tx_with(&h, &frame);
        }
        g.d.notify_queue(1);
        assert_eq!(g.d.take_used_on(1).len(), 5, "every tx chain returned");
        let c = g.handle.counters();
        assert_eq!((c.tx_packets, c.tx_malformed), (2, 3));
        assert_eq!(recv(&sock), None);
    });
}

#[test]
fn a_driver_without_csum_has_its_header_ignored() {
    in_netns(|| {
        let tap = tap_up();
        let host_mac = link_mac(tap.name());
        let mut g = Guest::new(tap, config(GUEST_MAC));
        let sock = host_socket();
        let payload = b"whole";
        // A correct checksum, and a header asking for a TCP segment the
        // driver never took: the header is zeroed, the frame goes as is.
        let udp_len = u16::try_from(8 + payload.len()).unwrap();
        let zero = udp_frame(host_mac, HOST_IP, 7000, payload, 0);
        let mut p = GUEST_IP.octets().to_vec();
        p.extend_from_slice(&HOST_IP.octets());
        p.extend_from_slice(&[0, 17]);
        p.extend_from_slice(&udp_len.to_be_bytes());
        let good = !fold(sum(&zero[34..], sum(&p, 0)));
        let frame = udp_frame(host_mac, HOST_IP, 7000, payload, good);
        g.send_with(&hdr(NEEDS_CSUM, GSO_TCPV4, 1448, 34, 6), &frame);
        assert_eq!(recv(&sock).as_deref(), Some(&payload[..]));
        assert_eq!(g.handle.counters().tx_malformed, 0);
    });
}

#[test]
fn the_tap_hands_partial_checksums_only_to_a_driver_that_took_them() {
    for (features, want_flags) in [
        (FEATURES, 0u8),
        (
            FEATURES
                | (1 << VIRTIO_NET_F_GUEST_CSUM)
                | (1 << VIRTIO_NET_F_GUEST_TSO4)
                | (1 << VIRTIO_NET_F_HOST_TSO4)
                | (1 << VIRTIO_NET_F_CSUM),
            NEEDS_CSUM,
        ),
    ] {
        in_netns(move || {
            let tap = tap_up();
            let name = tap.name().to_owned();
            let dev = Net::new(tap, &config(GUEST_MAC)).unwrap();
            let mut g = Guest::with_features(dev, features);
            g.post_rx(16);
            let s = UdpSocket::bind((HOST_IP, 0)).unwrap();
            guest_neighbour(&name);
            s.send_to(b"to the guest", (GUEST_IP, 9)).unwrap();
            let mut got = None;
            g.wait_until("the datagram", |g| {
                for (h, f) in g.received() {
                    if f.len() >= 42 && f[12..14] == [8, 0] && f[42..] == b"to the guest"[..] {
                        got = Some(h);
                    }
                }
                got.is_some()
            });
            let h = got.unwrap();
            assert_eq!(h[0], want_flags, "flags with features {features:#x}: {h:?}");
            assert_eq!(h[1], 0, "no segment");
            assert_eq!(u16::from_le_bytes([h[10], h[11]]), 1, "num_buffers");
            if want_flags == NEEDS_CSUM {
                let start = u16::from_le_bytes([h[6], h[7]]);
                let off = u16::from_le_bytes([h[8], h[9]]);
                assert_eq!((start, off), (34, 6), "the UDP checksum's place");
            } else {
                assert_eq!(h[..10], [0; 10]);
            }
        });
    }
}

#[test]
fn with_event_idx_notifications_follow_the_event_indexes() {
    in_netns(|| {
        let tap = tap_up();
        let host_mac = link_mac(tap.name());
        let dev = Net::new(tap, &config(GUEST_MAC)).unwrap();
        let mut g = Guest::with_features(dev, FEATURES | (1 << VIRTIO_RING_F_EVENT_IDX));
        let (_, avail, used) = layout(1);
        let size = u64::from(QSIZE);
        let used_event = GuestAddress(avail + 4 + 2 * size);
        let avail_event = GuestAddress(used + 4 + 8 * size);
        let pending = |g: &mut Guest| g.d.rd(0x60) & INT_USED_RING != 0;
        g.d.wr(0x64, 3);
        let frame = udp_frame(host_mac, HOST_IP, 7000, b"x", 0);

        // The driver wants an interrupt only after the 100th used entry.
        g.d.mem.write_obj(100u16, used_event).unwrap();
        g.send(&frame);
        assert_eq!(g.d.take_used_on(1).len(), 1);
        assert!(!pending(&mut g), "interrupted before used_event");
        // The device asks to be notified of the next frame.
        assert_eq!(g.d.mem.read_obj::<u16>(avail_event).unwrap(), 1);
        // Now it wants one for the next entry (used index 1 -> 2).
        g.d.mem.write_obj(1u16, used_event).unwrap();
        g.send(&frame);
        assert_eq!(g.d.take_used_on(1).len(), 1);
        assert!(pending(&mut g), "no interrupt at used_event");
        assert_eq!(g.d.mem.read_obj::<u16>(avail_event).unwrap(), 2);
        assert_eq!(g.handle.counters().tx_packets, 2);

        // An avail index far past the ring's size: nothing is taken, and
        // the notification returns.
        g.d.mem.write_obj(1000u16, GuestAddress(avail + 2)).unwrap();
        g.d.notify_queue(1);
        g.d.notify_queue(0);
        assert_eq!(g.handle.counters().tx_packets, 2);
    });
}

#[test]
fn a_tcp_segment_counts_as_its_packets_against_the_rate_limit() {
    in_netns(|| {
        let tap = tap_up();
        let host_mac = link_mac(tap.name());
        let mut cfg = config(GUEST_MAC);
        cfg.tx_rate = RateLimit {
            packets: Some(BucketConfig {
                rate_per_sec: 1,
                burst: 10,
            }),
            bytes: None,
        };
        let dev = Net::new(tap, &cfg).unwrap();
        let t0 = Instant::now();
        dev.set_clock(Arc::new(move || t0));
        let features = FEATURES | (1 << VIRTIO_NET_F_CSUM) | (1 << VIRTIO_NET_F_HOST_TSO4);
        let mut g = Guest::with_features(dev, features);
        // 1486 bytes after the Ethernet header in segments of 100: 15
        // packets on the wire, more than the whole burst of 10.
        let big = udp_frame(host_mac, HOST_IP, 7000, &[0u8; 1458], 0);
        assert_eq!(big.len(), 14 + 1486);
        g.send_with(&hdr(NEEDS_CSUM, GSO_TCPV4, 100, 34, 16), &big);
        assert_eq!(g.d.take_used_on(1).len(), 1, "a full bucket lets it go");
        // It left the bucket 5 packets in debt: one plain frame waits.
        g.send(&udp_frame(host_mac, HOST_IP, 7000, b"x", 0));
        assert!(g.d.take_used_on(1).is_empty(), "passed the limit");
        assert_eq!(g.handle.counters().tx_throttled, 1);
        assert_eq!(g.handle.retry_deadline(), Some(t0 + Duration::from_secs(6)));
    });
}
