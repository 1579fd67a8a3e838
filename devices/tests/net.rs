//! virtio-net driven from the guest's side by the test driver, on a real
//! TAP in a private network namespace per test: ARP with the host kernel,
//! anti-spoofing, hostile descriptor chains, rx without buffers, rate
//! limits (counted in tokens with a frozen clock), and restore with a new
//! TAP and MAC.

mod net_guest;

use devices::rate_limiter::{BucketConfig, RateLimit};
use devices::virtio::mmio::MmioTransport;
use devices::virtio::net::{
    MacAddr, Net, NetArgs, NetError, NetEvents, NetHandle, NetState, Tap, TapError, MAX_FRAME_LEN,
    TYPE_NET, VIRTIO_NET_F_MAC, VIRTIO_NET_F_STATUS, VNET_HDR_LEN,
};
use devices::virtio::persist::MmioArgs;
use devices::virtio::{VirtioDevice, VirtioInterrupt, INT_CONFIG, VIRTIO_F_VERSION_1};
use devices::{BusDevice, IrqLine};
use net_guest::*;
use snapshot::Persist;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

#[test]
fn halves_can_move_between_threads() {
    fn send<T: Send>() {}
    fn sync<T: Send + Sync>() {}
    send::<Net>();
    send::<NetEvents>();
    sync::<NetHandle>();
}

#[test]
fn config_space_has_the_host_mac_and_the_guest_cannot_change_it() {
    in_netns(|| {
        let bad_mac = Net::new(tap_up(), &config(MacAddr([1, 2, 3, 4, 5, 6])));
        assert!(matches!(bad_mac, Err(NetError::Mac(_))));
        let mut cfg = config(GUEST_MAC);
        cfg.tx_rate.packets = Some(BucketConfig {
            rate_per_sec: 0,
            burst: 1,
        });
        assert!(matches!(
            Net::new(tap_up(), &cfg),
            Err(NetError::RateLimit {
                direction: "tx",
                ..
            })
        ));

        let dev = Net::new(tap_up(), &config(GUEST_MAC)).unwrap();
        assert_eq!(dev.device_type(), TYPE_NET);
        let f = dev.avail_features();
        for bit in [VIRTIO_F_VERSION_1, VIRTIO_NET_F_MAC, VIRTIO_NET_F_STATUS] {
            assert_ne!(f & (1 << bit), 0, "feature {bit}");
        }
        let mut g = Guest::with_device(dev);
        let read_mac = |g: &mut Guest| {
            let mut m = [0u8; 6];
            for (i, b) in m.iter_mut().enumerate() {
                let mut one = [0u8; 1];
                g.d.t.read(0x100 + i as u64, &mut one);
                *b = one[0];
            }
            MacAddr(m)
        };
        assert_eq!(read_mac(&mut g), GUEST_MAC);
        let mut st = [0u8; 2];
        g.d.t.read(0x106, &mut st);
        assert_eq!(u16::from_le_bytes(st), 1, "link up");
        g.d.t.write(0x100, &[0x02, 0xee, 0xee, 0xee, 0xee, 0xee]);
        assert_eq!(read_mac(&mut g), GUEST_MAC);
        assert_eq!(g.handle.mac(), GUEST_MAC);
    });
}

#[test]
fn guest_arp_request_gets_the_kernels_reply() {
    in_netns(|| {
        let tap = tap_up();
        let name = tap.name().to_owned();
        let host_mac = link_mac(&name);
        let mut g = Guest::new(tap, config(GUEST_MAC));
        assert_eq!(g.handle.tap_name(), name);
        g.post_rx(16);
        g.send(&arp_request(GUEST_MAC, GUEST_IP, HOST_IP));
        assert_eq!(g.d.take_used_on(1).len(), 1, "tx chain returned");
        let mut reply = None;
        g.wait_until("the ARP reply", |g| {
            for (hdr, frame) in g.received() {
                assert_eq!(hdr[..10], [0; 10], "no offload flags");
                assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 1, "num_buffers");
                if let Some(r) = arp_reply(&frame) {
                    reply = Some(r);
                }
            }
            reply.is_some()
        });
        let r = reply.unwrap();
        assert_eq!(r.dst, GUEST_MAC);
        assert_eq!(r.src, host_mac);
        assert_eq!(r.sha, host_mac);
        assert_eq!(r.spa, HOST_IP);
        assert_eq!(r.tha, GUEST_MAC);
        assert_eq!(r.tpa, GUEST_IP);
        let c = g.handle.counters();
        assert_eq!(c.tx_packets, 1);
        assert_eq!(c.tx_bytes, 60);
        assert!(c.rx_packets >= 1);
        assert!(c.rx_bytes >= 42);
        assert_eq!(
            c.tx_spoofed + c.tx_malformed + c.rx_too_small + c.rx_malformed,
            0
        );
        assert!(g.d.irq.eventfd().read().unwrap() >= 1, "interrupt raised");
        // The kernel learned the guest's address.
        let neigh = ip(&["neigh", "show", &GUEST_IP.to_string(), "dev", &name]);
        assert!(neigh.contains(&GUEST_MAC.to_string()), "{neigh}");
    });
}

#[test]
fn frames_from_a_foreign_source_mac_are_dropped_and_counted() {
    in_netns(|| {
        let tap = tap_up();
        let name = tap.name().to_owned();
        let mut g = Guest::new(tap, config(GUEST_MAC));
        g.post_rx(16);
        let spoofed = MacAddr([0x02, 0x5e, 0, 0, 0, 0x99]);
        let spoofed_ip = Ipv4Addr::new(10, 0, 0, 3);
        // A spoofed ARP request (the kernel would answer it and learn the
        // neighbour), then the guest's own.
        g.send(&arp_request(spoofed, spoofed_ip, HOST_IP));
        // Own MAC in the ARP payload, foreign one in the Ethernet header.
        let mut mixed = arp_request(GUEST_MAC, spoofed_ip, HOST_IP);
        mixed[6..12].copy_from_slice(&spoofed.0);
        g.send(&mixed);
        g.send(&arp_request(GUEST_MAC, GUEST_IP, HOST_IP));
        assert_eq!(g.d.take_used_on(1).len(), 3, "every chain returned");
        let c = g.handle.counters();
        assert_eq!(c.tx_spoofed, 2);
        assert_eq!(c.tx_packets, 1);
        let mut replies = vec![];
        g.wait_until("the ARP reply", |g| {
            replies.extend(g.received().into_iter().filter_map(|(_, f)| arp_reply(&f)));
            !replies.is_empty()
        });
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].tha, GUEST_MAC);
        assert_eq!(replies[0].tpa, GUEST_IP);
        let neigh = ip(&["neigh", "show", &spoofed_ip.to_string(), "dev", &name]);
        assert!(
            neigh.trim().is_empty(),
            "kernel saw the spoofed frame: {neigh}"
        );
    });
}

#[test]
fn hostile_tx_chains_are_refused_and_the_device_keeps_working() {
    in_netns(|| {
        let mut g = Guest::new(tap_up(), config(GUEST_MAC));
        let good = arp_request(GUEST_MAC, GUEST_IP, HOST_IP);
        let mut frame = vec![0u8; VNET_HDR_LEN];
        frame.extend_from_slice(&good);
        g.d.mem.write_slice(&frame, GuestAddress(SCRATCH)).unwrap();
        let flen = u32::try_from(frame.len()).unwrap();
        let end = u64::try_from(MEM_SIZE).unwrap();
        // Past the end of guest memory; wholly outside it; zero length;
        // device-writable; header only.
        g.d.push_chain_on(1, &[(end - 16, 64, false)]);
        g.d.push_chain_on(1, &[(1 << 40, flen, false)]);
        g.d.push_chain_on(1, &[(SCRATCH, 0, false)]);
        g.d.push_chain_on(1, &[(SCRATCH, flen, true)]);
        g.d.push_chain_on(1, &[(SCRATCH, 12, false)]);
        // A good frame followed by a write-only descriptor.
        g.d.push_chain_on(1, &[(SCRATCH, flen, false), (SCRATCH, 64, true)]);
        // Over the size cap: two descriptors of 40000 bytes.
        g.d.push_chain_on(1, &[(SCRATCH, 40_000, false), (SCRATCH, 40_000, false)]);
        // One byte over: header + 65550 bytes.
        let over = u32::try_from(MAX_FRAME_LEN).unwrap() + 1 - flen;
        g.d.push_chain_on(1, &[(SCRATCH, flen, false), (SCRATCH + 4096, over, false)]);
        // A 4 GiB descriptor.
        g.d.push_chain_on(1, &[(SCRATCH, u32::MAX, false)]);
        g.d.notify_queue(1);
        let used = g.d.take_used_on(1);
        assert_eq!(used.len(), 9, "each refused chain is returned");
        assert!(used.iter().all(|&(_, len)| len == 0));
        let c = g.handle.counters();
        assert_eq!(c.tx_malformed, 6, "{c:?}");
        assert_eq!(c.tx_oversize, 3, "{c:?}");
        assert_eq!(c.tx_packets, 0);

        // A descriptor loop (0 -> 1 -> 0 ...): the chain ends after
        // queue-size links; its frame is garbage from another MAC.
        let (a, b) = (200u16, 201u16);
        g.d.write_desc_on(1, a, SCRATCH + 8192, 16, 1, b);
        g.d.write_desc_on(1, b, SCRATCH + 8192, 16, 1, a);
        g.d.publish_on(1, a);
        // A head past the table.
        g.d.publish_on(1, 999);
        g.d.notify_queue(1);
        let c = g.handle.counters();
        assert_eq!(c.tx_packets, 0);
        // The device still sends a good frame (a fresh head past the loop).
        let head = g.send(&good);
        let used = g.d.take_used_on(1);
        assert!(
            used.iter().any(|&(id, _)| id == u32::from(head)),
            "{used:?}"
        );
        assert_eq!(g.handle.counters().tx_packets, 1);
    });
}

/// A socket in the test's netns that sends UDP frames to the guest.
fn udp_to_guest(tap_name: &str) -> UdpSocket {
    guest_neighbour(tap_name);
    let s = UdpSocket::bind((HOST_IP, 0)).unwrap();
    s.connect((GUEST_IP, 9)).unwrap();
    s
}

/// The payload of a UDP frame (Ethernet + IPv4 without options + UDP).
fn udp_payload(frame: &[u8]) -> &[u8] {
    assert_eq!(frame[12..14], [8, 0], "IPv4");
    &frame[42..]
}

#[test]
fn hostile_rx_buffers_drop_frames_and_count() {
    in_netns(|| {
        let tap = tap_up();
        let name = tap.name().to_owned();
        let mut g = Guest::new(tap, config(GUEST_MAC));
        let sock = udp_to_guest(&name);
        let end = u64::try_from(MEM_SIZE).unwrap();
        // Read-only, too small, outside memory, then a good one.
        g.post_rx_raw(RX_AREA, RX_BUF, false);
        g.post_rx_raw(RX_AREA + u64::from(RX_BUF), 20, true);
        g.post_rx_raw(end - 8, RX_BUF, true);
        g.post_rx(1);
        for i in 0u8..4 {
            sock.send(&[i; 100]).unwrap();
        }
        let mut got = vec![];
        g.wait_until("four frames", |g| {
            got.extend(g.received());
            got.len() == 4
        });
        let lens: Vec<usize> = got.iter().map(|(h, f)| h.len() + f.len()).collect();
        assert_eq!(lens[..3], [0, 0, 0], "refused buffers come back empty");
        assert_eq!(udp_payload(&got[3].1), [3u8; 100]);
        let c = g.handle.counters();
        assert_eq!(c.rx_malformed, 2, "{c:?}");
        assert_eq!(c.rx_too_small, 1, "{c:?}");
        assert_eq!(c.rx_packets, 1, "{c:?}");
    });
}

#[test]
fn rx_without_guest_buffers_holds_one_frame_and_sleeps() {
    in_netns(|| {
        let tap = tap_up();
        let name = tap.name().to_owned();
        let mut g = Guest::new(tap, config(GUEST_MAC));
        let sock = udp_to_guest(&name);
        for i in 0u8..50 {
            sock.send(&[i; 64]).unwrap();
        }
        g.wait_until("a frame held", |g| g.handle.held_bytes() > 0);
        g.pump();
        // Edge-triggered: the queued frames do not wake the loop again (a
        // late frame may, once; a spinning loop would every round).
        let quiet = (0..10).any(|_| g.em.run_with_timeout(100).unwrap() == 0);
        assert!(
            quiet,
            "the event loop keeps waking for frames it cannot deliver"
        );
        assert_eq!(g.handle.held_bytes(), VNET_HDR_LEN + 42 + 64);
        assert_eq!(g.handle.counters().rx_packets, 0);
        assert!(g.received().is_empty());
        // Buffers come: every frame arrives, in order.
        g.post_rx(64);
        let mut got = vec![];
        g.wait_until("50 frames", |g| {
            got.extend(g.received());
            got.len() >= 50
        });
        for (i, (_, f)) in got.iter().enumerate() {
            assert_eq!(udp_payload(f), [u8::try_from(i).unwrap(); 64]);
        }
        assert_eq!(g.handle.held_bytes(), 0);
        assert_eq!(g.handle.counters().rx_packets, 50);
    });
}

/// A clock the test moves by hand.
fn frozen_clock() -> (Arc<Mutex<Instant>>, Arc<dyn Fn() -> Instant + Send + Sync>) {
    let now = Arc::new(Mutex::new(Instant::now()));
    let n = now.clone();
    (now, Arc::new(move || *n.lock().unwrap()))
}

#[test]
fn tx_rate_limit_holds_the_guest_to_its_budget() {
    in_netns(|| {
        let mut cfg = config(GUEST_MAC);
        cfg.tx_rate = RateLimit {
            packets: Some(BucketConfig {
                rate_per_sec: 1,
                burst: 3,
            }),
            bytes: Some(BucketConfig {
                rate_per_sec: 1_000_000,
                burst: 1_000_000,
            }),
        };
        let dev = Net::new(tap_up(), &cfg).unwrap();
        let (now, clock) = frozen_clock();
        dev.set_clock(clock);
        let t0 = *now.lock().unwrap();
        let mut g = Guest::with_device(dev);
        for _ in 0..6 {
            g.queue_tx(&arp_request(GUEST_MAC, GUEST_IP, HOST_IP));
        }
        g.d.notify_queue(1);
        assert_eq!(g.d.take_used_on(1).len(), 3, "the burst");
        let c = g.handle.counters();
        assert_eq!(c.tx_packets, 3);
        assert_eq!(c.tx_throttled, 1);
        assert_eq!(g.handle.retry_deadline(), Some(t0 + Duration::from_secs(1)));
        // Notifying again changes nothing: no tokens.
        g.d.notify_queue(1);
        assert!(g.d.take_used_on(1).is_empty());
        assert_eq!(
            g.handle.counters().tx_throttled,
            1,
            "waits for its deadline"
        );
        // One token's worth of time: the timer lets exactly one more go.
        *now.lock().unwrap() = t0 + Duration::from_secs(1);
        g.wait_until("the retry", |g| g.handle.counters().tx_packets == 4);
        assert_eq!(g.d.take_used_on(1).len(), 1);
        assert_eq!(g.handle.retry_deadline(), Some(t0 + Duration::from_secs(2)));
        // Plenty of time: the rest, up to the burst.
        *now.lock().unwrap() = t0 + Duration::from_secs(100);
        g.d.notify_queue(1);
        assert_eq!(g.d.take_used_on(1).len(), 2);
        assert_eq!(g.handle.counters().tx_packets, 6);
        assert_eq!(g.handle.retry_deadline(), None);
    });
}

#[test]
fn rx_rate_limit_holds_the_host_to_its_budget() {
    in_netns(|| {
        let tap = tap_up();
        let name = tap.name().to_owned();
        let mut cfg = config(GUEST_MAC);
        // 2 frames of 106 bytes fit, the third does not.
        cfg.rx_rate.bytes = Some(BucketConfig {
            rate_per_sec: 106,
            burst: 250,
        });
        let dev = Net::new(tap, &cfg).unwrap();
        let (now, clock) = frozen_clock();
        dev.set_clock(clock);
        let t0 = *now.lock().unwrap();
        let mut g = Guest::with_device(dev);
        g.post_rx(16);
        let sock = udp_to_guest(&name);
        for i in 0u8..4 {
            sock.send(&[i; 64]).unwrap();
        }
        g.wait_until("the throttle", |g| g.handle.counters().rx_throttled > 0);
        assert_eq!(g.received().len(), 2);
        assert_eq!(g.handle.counters().rx_packets, 2);
        // 250 - 212 = 38 left; 106 needs 68 more: 68/106 s.
        let deadline = t0 + Duration::from_nanos(68_000_000_000u64.div_ceil(106));
        assert_eq!(g.handle.retry_deadline(), Some(deadline));
        assert!(g.handle.held_bytes() > 0);
        *now.lock().unwrap() = deadline;
        g.wait_until("one more frame", |g| g.handle.counters().rx_packets == 3);
        let got = g.received();
        assert_eq!(got.len(), 1);
        assert_eq!(udp_payload(&got[0].1), [2u8; 64]);
    });
}

#[test]
fn restore_gets_a_new_tap_and_mac() {
    in_netns(|| {
        let old_tap = tap_up();
        let mut g = Guest::new(old_tap, config(GUEST_MAC));
        g.post_rx(8);
        g.send(&arp_request(GUEST_MAC, GUEST_IP, HOST_IP));
        g.d.take_used_on(1);
        g.wait_until("the template's ARP reply", |g| {
            g.received().iter().any(|(_, f)| arp_reply(f).is_some())
        });
        let saved = g.d.t.save().unwrap();
        assert!(saved.activated);

        // The clone: its own TAP (another subnet) and MAC.
        let new_mac = MacAddr([0x02, 0x5e, 0, 0, 1, 0x02]);
        let (host2, guest2) = (Ipv4Addr::new(10, 0, 1, 1), Ipv4Addr::new(10, 0, 1, 2));
        let name = tap_name();
        let tap = Tap::open(&name).unwrap();
        ip(&["addr", "add", &format!("{host2}/24"), "dev", &name]);
        ip(&["link", "set", "dev", &name, "up"]);
        let mut dev = Net::new(tap, &config(new_mac)).unwrap();
        let events = dev.take_events().unwrap();
        let handle = dev.handle();
        let irq = IrqLine::new(5).unwrap();
        let t = MmioTransport::restore(
            MmioArgs {
                device: Box::new(dev),
                mem: g.d.mem.clone(),
                irq: irq.clone(),
            },
            &saved,
        )
        .unwrap();
        // The old device (and its TAP) go; the driver keeps its rings.
        g.d.t = t;
        g.d.irq = irq;
        g.em = event_manager::EventManager::new().unwrap();
        event_manager::SubscriberOps::add_subscriber(&mut g.em, events);
        g.handle = handle;
        let mut m = [0u8; 6];
        devices::BusDevice::read(&mut g.d.t, 0x100, &mut m);
        assert_eq!(MacAddr(m), new_mac);
        assert!(g.handle.signal_config_change());
        assert_ne!(g.d.rd(0x60) & INT_CONFIG, 0, "config interrupt");

        // The template's identity is refused; the new one gets answers.
        g.send(&arp_request(GUEST_MAC, guest2, host2));
        g.send(&arp_request(new_mac, guest2, host2));
        assert_eq!(g.d.take_used_on(1).len(), 2);
        assert_eq!(g.handle.counters().tx_spoofed, 1);
        let mut reply = None;
        g.wait_until("the clone's ARP reply", |g| {
            reply = g.received().into_iter().find_map(|(_, f)| arp_reply(&f));
            reply.is_some()
        });
        let r = reply.unwrap();
        assert_eq!((r.dst, r.spa, r.tpa), (new_mac, host2, guest2));
        assert_eq!(r.src, link_mac(&name));
    });
}

#[test]
fn device_restore_checks_the_state_and_takes_the_new_mac() {
    in_netns(|| {
        let new_mac = MacAddr([0x02, 0x5e, 0, 0, 2, 0x02]);
        let mem = net_guest_mem();
        let irq = Arc::new(VirtioInterrupt::new(IrqLine::new(5).unwrap()));
        let args = |mac| NetArgs {
            tap: tap_up(),
            config: config(mac),
            mem: mem.clone(),
            irq: irq.clone(),
        };
        let state = NetState {
            mac: GUEST_MAC,
            acked_features: 1 << VIRTIO_F_VERSION_1,
            queues: vec![],
        };
        let dev = Net::restore(args(new_mac), &state).unwrap();
        let mut m = [0u8; 6];
        dev.read_config(0, &mut m);
        assert_eq!(MacAddr(m), new_mac);
        let saved = dev.save().unwrap();
        assert_eq!(saved.mac, new_mac);
        assert_eq!(saved.acked_features, 1 << VIRTIO_F_VERSION_1);
        assert!(!dev.handle().signal_config_change(), "inactive");

        let bad = NetState {
            acked_features: 1 << 17,
            ..state.clone()
        };
        assert!(matches!(
            Net::restore(args(new_mac), &bad),
            Err(NetError::Features { .. })
        ));
        let one_queue = NetState {
            queues: vec![devices::virtio::persist::QueueState {
                max_size: 256,
                next_avail: 0,
                next_used: 0,
                event_idx_enabled: false,
                size: 256,
                ready: true,
                desc_table: 0,
                avail_ring: 0,
                used_ring: 0,
            }],
            ..state.clone()
        };
        assert!(matches!(
            Net::restore(args(new_mac), &one_queue),
            Err(NetError::QueueCount(1))
        ));
        let outside = NetState {
            queues: vec![one_queue.queues[0]; 2]
                .into_iter()
                .map(|mut q| {
                    q.desc_table = 1 << 40;
                    q
                })
                .collect(),
            ..state.clone()
        };
        assert!(Net::restore(args(new_mac), &outside).is_err());
        assert!(matches!(
            Net::restore(args(MacAddr([0xff; 6])), &state),
            Err(NetError::Mac(_))
        ));
    });
}

fn net_guest_mem() -> vm_memory::GuestMemoryMmap {
    devices::virtio::testing::mem_sized(MEM_SIZE)
}

/// Opens /dev/net/tun and attaches `name` with `flags`, the way the
/// runtime would in the sandbox's netns.
fn raw_tap_fd(name: &str, flags: i16) -> OwnedFd {
    // SAFETY: a literal path; the result is checked.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(
        fd >= 0,
        "open /dev/net/tun: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = [0u8; 40];
    req[..name.len()].copy_from_slice(name.as_bytes());
    req[16..18].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF with a 40-byte ifreq; the result is checked.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            0x4004_54ca,
            req.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "TUNSETIFF: {}", std::io::Error::last_os_error());
    fd
}

#[test]
fn tap_from_a_passed_fd_or_a_persistent_interface() {
    in_netns(|| {
        // IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, opened elsewhere.
        let name = tap_name();
        let tap = Tap::from_fd(raw_tap_fd(&name, 0x0002 | 0x1000 | 0x4000)).unwrap();
        assert_eq!(tap.name(), name);
        ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", &name]);
        ip(&["link", "set", "dev", &name, "up"]);
        let mut g = Guest::new(tap, config(GUEST_MAC));
        g.post_rx(4);
        g.send(&arp_request(GUEST_MAC, GUEST_IP, HOST_IP));
        g.wait_until("the ARP reply", |g| {
            g.received().iter().any(|(_, f)| arp_reply(f).is_some())
        });

        // Without IFF_VNET_HDR, or a TUN: refused.
        let other = tap_name();
        assert!(matches!(
            Tap::from_fd(raw_tap_fd(&other, 0x0002 | 0x1000)),
            Err(TapError::Flags { .. })
        ));
        let tun = tap_name();
        assert!(matches!(
            Tap::from_fd(raw_tap_fd(&tun, 0x0001 | 0x1000 | 0x4000)),
            Err(TapError::Flags { .. })
        ));

        // An interface of another kind is not attached to.
        assert!(matches!(Tap::open("lo"), Err(TapError::Attach { .. })));

        // A persistent TAP made beforehand is attached to by name, and
        // stays when the device lets go of it.
        let persistent = tap_name();
        ip(&["tuntap", "add", "dev", &persistent, "mode", "tap"]);
        let tap = Tap::open(&persistent).unwrap();
        assert_eq!(tap.name(), persistent);
        drop(tap);
        ip(&["link", "show", "dev", &persistent]);
        // A TAP made here goes with its fd.
        let gone = tap_name();
        drop(Tap::open(&gone).unwrap());
        let out = std::process::Command::new("ip")
            .args(["link", "show", "dev", &gone])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{gone} outlived its fd");
    });
}
