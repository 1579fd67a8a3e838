//! Slots on real namespaces, veths, TAPs and nftables (root). Each test
//! has its own lab (pool, name prefixes, internet stand-in: see
//! `common`), so they run in parallel; everything is removed on drop.

mod common;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::*;
use shoal_hostnet::{EgressPolicy, GuestLink, HostNet, NetConfig, Slot, SlotPool};

fn policy(allow: &[&str], deny: &[&str], dns: bool) -> EgressPolicy {
    EgressPolicy::parse(allow, deny, dns).unwrap()
}

#[test]
fn only_allowed_destinations_are_reachable_over_tcp_udp_and_icmp() {
    let mut lab = Lab::new(1);
    let a = lab.inet_a;
    let allow_a = format!("{a}:{TCP_A}");
    let allow_udp = format!("{a}:{UDP_ECHO}");
    let (slot, g) = lab.guest_slot(policy(&[&allow_a, &allow_udp], &[], false));

    assert_eq!(
        tcp(&g, sa(a, TCP_A), OK_WAIT).unwrap(),
        format!("{TCP_A} hi")
    );
    assert!(tcp(&g, sa(a, TCP_B), BLOCKED_WAIT).is_err(), "another port");
    assert!(
        tcp(&g, sa(lab.inet_b, TCP_A), BLOCKED_WAIT).is_err(),
        "another address"
    );

    assert_eq!(
        udp(&g, None, sa(a, UDP_ECHO), OK_WAIT).unwrap(),
        format!("{UDP_ECHO} ping")
    );
    assert!(udp(&g, None, sa(lab.inet_b, UDP_ECHO), BLOCKED_WAIT).is_err());

    // ICMP to an allowed network only.
    assert!(ping(&g, a, OK_WAIT), "ping to the allowed address");
    assert!(
        !ping(&g, lab.inet_b, BLOCKED_WAIT),
        "ping to another address"
    );

    // The counters saw it: packets out, replies in, drops.
    let c = slot.counters().unwrap();
    assert!(c.from_guest.packets >= 6 && c.from_guest.bytes > 0, "{c:?}");
    assert!(c.to_guest.packets >= 3 && c.to_guest.bytes > 0, "{c:?}");
    assert!(c.dropped.packets >= 3, "{c:?}");
    slot.remove().unwrap();
}

#[test]
fn the_host_other_slots_and_other_resolvers_stay_unreachable_under_wide_allows() {
    let mut lab = Lab::new(2);
    let (victim, vg) = lab.guest_slot(policy(&[], &[], false));
    lab.serve_in_guest(&vg, sa(victim.guest_ip(), TCP_A));
    let (slot, g) = lab.guest_slot(policy(&["0.0.0.0/0"], &[], true));

    // The internet is open...
    assert_eq!(
        tcp(&g, sa(lab.inet_a, TCP_B), OK_WAIT).unwrap(),
        format!("{TCP_B} hi")
    );
    // ...but not the host's own address (its TCP server listens there),
    assert!(
        tcp(&g, sa(lab.host_addr, TCP_A), BLOCKED_WAIT).is_err(),
        "the host"
    );
    assert!(!ping(&g, lab.host_addr, BLOCKED_WAIT), "ping the host");
    assert!(
        tcp(&g, sa(slot.addrs().host, TCP_A), BLOCKED_WAIT).is_err(),
        "own veth"
    );
    // nor another slot's guest (whose server is up: see below),
    assert!(
        tcp(&g, sa(victim.guest_ip(), TCP_A), BLOCKED_WAIT).is_err(),
        "another slot"
    );
    assert!(
        !ping(&g, victim.guest_ip(), BLOCKED_WAIT),
        "ping another slot"
    );
    // nor another resolver (a UDP server answers on the internet's port 53).
    assert!(
        udp(&g, None, sa(lab.inet_a, UDP_DNS), BLOCKED_WAIT).is_err(),
        "direct DNS"
    );
    assert!(
        tcp(&g, sa(lab.inet_a, 853), BLOCKED_WAIT).is_err(),
        "DNS over TLS"
    );
    // DNS to the gateway reaches the forwarder (a UDP echo in the host's
    // netns): the answer comes back from the gateway's port 53.
    let answer = udp(&g, None, sa(slot.gateway(), 53), OK_WAIT).unwrap();
    assert_eq!(answer, format!("{FWD_PORT} ping"));
    // The forwarder itself is not reachable directly.
    let fwd = lab.net.config().forwarder.unwrap();
    assert!(
        udp(&g, None, fwd, BLOCKED_WAIT).is_err(),
        "the forwarder directly"
    );
    // Without allow_dns the gateway does not answer.
    slot.set_policy(policy(&["0.0.0.0/0"], &[], false)).unwrap();
    assert!(
        udp(&g, None, sa(slot.gateway(), 53), BLOCKED_WAIT).is_err(),
        "DNS off"
    );
    // The victim's server is up (the blocked probe above was no accident).
    let from_inside = tcp(&vg, sa(victim.guest_ip(), TCP_A), OK_WAIT);
    assert_eq!(from_inside.unwrap(), format!("{TCP_A} hi"));
    // Named explicitly, a link-local address passes the always-denied
    // ranges (a metadata service): the rule order lets it through to the
    // host side, which has nothing there, so just check the rule set.
    slot.set_policy(policy(&["169.254.169.254:80"], &[], false))
        .unwrap();
    let rules = cmd_out(&[
        "netns",
        "exec",
        slot.netns_name(),
        "nft",
        "list",
        "set",
        "inet",
        "shoal_slot",
        "except",
    ]);
    assert!(rules.contains("169.254.169.254 . tcp . 80"), "{rules}");
}

fn cmd_out(args: &[&str]) -> String {
    ip(args)
}

#[test]
fn spoofed_addresses_are_dropped() {
    let mut lab = Lab::new(3);
    let a = lab.inet_a;
    let (slot, g) = lab.guest_slot(policy(&[&format!("{a}:{UDP_ECHO}")], &[], false));
    let me = slot.guest_ip();
    assert!(udp(&g, Some(me), sa(a, UDP_ECHO), OK_WAIT).is_ok());

    // Another source address: the guest claims a neighbour's.
    let other = Ipv4Addr::from(u32::from(me) + 8);
    ip(&[
        "-n",
        &g,
        "addr",
        "add",
        &format!("{other}/32"),
        "dev",
        "eth0",
    ]);
    let before = slot.counters().unwrap().dropped.packets;
    assert!(
        udp(&g, Some(other), sa(a, UDP_ECHO), BLOCKED_WAIT).is_err(),
        "spoofed IP"
    );
    assert!(slot.counters().unwrap().dropped.packets > before);
    assert!(udp(&g, Some(me), sa(a, UDP_ECHO), OK_WAIT).is_ok());

    // Another source MAC.
    ip(&[
        "-n",
        &g,
        "link",
        "set",
        "eth0",
        "address",
        "02:00:00:00:00:99",
    ]);
    assert!(
        udp(&g, Some(me), sa(a, UDP_ECHO), BLOCKED_WAIT).is_err(),
        "spoofed MAC"
    );
    ip(&[
        "-n",
        &g,
        "link",
        "set",
        "eth0",
        "address",
        &slot.guest_mac().to_string(),
    ]);
    assert!(eventually(OK_WAIT, || udp(
        &g,
        Some(me),
        sa(a, UDP_ECHO),
        BLOCKED_WAIT
    )
    .is_ok()));
}

#[test]
fn policy_changes_reach_live_slots_and_established_connections() {
    let mut lab = Lab::new(4);
    let a = lab.inet_a;
    let allow = policy(&[&format!("{a}:{TCP_A}")], &[], false);
    let (slot, g) = lab.guest_slot(allow.clone());

    // An established connection, kept open in the guest across changes.
    let (tx, rx) = std::sync::mpsc::channel::<&'static str>();
    let (back_tx, back_rx) = std::sync::mpsc::channel::<std::io::Result<String>>();
    let conn = std::thread::spawn({
        let g = g.clone();
        move || {
            shoal_hostnet::netns::enter(&g).unwrap();
            let mut s =
                std::net::TcpStream::connect_timeout(&sa(a, TCP_A).into(), OK_WAIT).unwrap();
            for (line, wait) in rx.iter().map(|l| {
                (
                    l,
                    if l == "blocked" {
                        BLOCKED_WAIT
                    } else {
                        OK_WAIT
                    },
                )
            }) {
                back_tx.send(exchange(&mut s, line, wait)).unwrap();
            }
        }
    });
    tx.send("one").unwrap();
    assert_eq!(back_rx.recv().unwrap().unwrap(), format!("{TCP_A} one"));

    // Allowed -> blocked: new connections and the established one stop.
    slot.set_policy(policy(&[], &[], false)).unwrap();
    assert!(tcp(&g, sa(a, TCP_A), BLOCKED_WAIT).is_err());
    tx.send("blocked").unwrap();
    assert!(
        back_rx.recv().unwrap().is_err(),
        "the established connection still talks"
    );
    drop(tx);
    conn.join().unwrap();

    // Blocked -> allowed again.
    slot.set_policy(allow.clone()).unwrap();
    assert_eq!(
        tcp(&g, sa(a, TCP_A), OK_WAIT).unwrap(),
        format!("{TCP_A} hi")
    );
    assert_eq!(slot.policy(), allow);

    // deny_out wins over allow_out.
    slot.set_policy(policy(
        &[&format!("{a}/32")],
        &[&format!("{a}:{TCP_A}")],
        false,
    ))
    .unwrap();
    assert!(tcp(&g, sa(a, TCP_A), BLOCKED_WAIT).is_err(), "denied port");
    assert_eq!(
        tcp(&g, sa(a, TCP_B), OK_WAIT).unwrap(),
        format!("{TCP_B} hi")
    );
}

#[test]
fn forwarder_addresses_are_allowed_for_their_ttl() {
    let mut lab = Lab::new(5);
    let b = lab.inet_b;
    let (slot, g) = lab.guest_slot(policy(&["*.example.test"], &[], true));
    assert!(slot.policy().domain_allowed("api.example.test"));
    assert!(
        tcp(&g, sa(b, TCP_A), BLOCKED_WAIT).is_err(),
        "before the answer"
    );

    slot.allow_addr(IpAddr::V4(b), Duration::from_secs(3))
        .unwrap();
    assert_eq!(
        tcp(&g, sa(b, TCP_A), OK_WAIT).unwrap(),
        format!("{TCP_A} hi")
    );
    assert!(ping(&g, b, OK_WAIT));
    // A later answer with a longer TTL replaces the timeout.
    slot.allow_addr(IpAddr::V4(b), Duration::from_secs(600))
        .unwrap();
    slot.allow_addr(IpAddr::V4(b), Duration::from_secs(3))
        .unwrap();
    // Expired: blocked again.
    assert!(eventually(Duration::from_secs(60), || tcp(
        &g,
        sa(b, TCP_A),
        BLOCKED_WAIT
    )
    .is_err()));

    // An answer naming the host's address, a slot's or link-local stays blocked.
    slot.allow_addr(IpAddr::V4(lab.host_addr), Duration::from_secs(600))
        .unwrap();
    assert!(
        tcp(&g, sa(lab.host_addr, TCP_A), BLOCKED_WAIT).is_err(),
        "the host via DNS"
    );
    // IPv6 and a zero TTL are refused.
    assert!(slot
        .allow_addr("2001:db8::1".parse().unwrap(), Duration::from_secs(5))
        .is_err());
    assert!(slot.allow_addr(IpAddr::V4(b), Duration::ZERO).is_err());

    // A policy change that keeps the domains keeps the addresses; one that
    // changes them drops them.
    slot.allow_addr(IpAddr::V4(b), Duration::from_secs(600))
        .unwrap();
    slot.set_policy(policy(&["*.example.test", "192.0.2.0/24"], &[], true))
        .unwrap();
    assert_eq!(
        tcp(&g, sa(b, TCP_A), OK_WAIT).unwrap(),
        format!("{TCP_A} hi")
    );
    slot.set_policy(policy(&["other.test"], &[], true)).unwrap();
    assert!(
        tcp(&g, sa(b, TCP_A), BLOCKED_WAIT).is_err(),
        "after the domains changed"
    );
}

fn tap_info(slot: &Slot) -> serde_json::Value {
    let out = ip(&["-n", slot.netns_name(), "-d", "-j", "link", "show", "tap0"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["linkinfo"]["info_data"].clone()
}

#[test]
fn a_tap_slot_has_an_owned_persistent_tap_that_opens() {
    let lab = Lab::new(6);
    let slot = Slot::create(
        &lab.net,
        &GuestLink::Tap {
            owner: Some((61234, 61235)),
        },
        EgressPolicy::default(),
    )
    .unwrap();
    let info = tap_info(&slot);
    assert_eq!(info["type"], "tap");
    assert_eq!(info["persist"], true);
    assert_eq!(info["pi"], false);
    assert_eq!(info["user"], 61234);
    assert_eq!(info["group"], 61235);
    let fd = slot.open_tap_fd().unwrap();
    assert_eq!(tap_info(&slot)["vnet_hdr"], true);
    drop(fd);
    slot.set_tap_owner(61300, 61301).unwrap();
    let info = tap_info(&slot);
    assert_eq!(
        (info["user"].clone(), info["group"].clone()),
        (61300.into(), 61301.into())
    );
    // The jailer's --netns path.
    assert!(slot.netns_path().exists());
    let name = slot.netns_name().to_string();
    slot.remove().unwrap();
    assert!(!shoal_hostnet::netns::path(&name).exists());

    // Without a forwarder, allow_dns is refused: at creation (which undoes
    // what it made) and as a change (which keeps the policy in force).
    let cfg = NetConfig {
        forwarder: None,
        ..lab.net.config().clone()
    };
    let no_fwd = HostNet::setup(cfg).unwrap();
    let dns = policy(&[], &[], true);
    let e = Slot::create(&no_fwd, &GuestLink::Tap { owner: None }, dns.clone()).unwrap_err();
    assert!(e.to_string().contains("forwarder"), "{e}");
    assert_eq!(lab.leftovers(), Vec::<String>::new());
    let slot = Slot::create(
        &no_fwd,
        &GuestLink::Tap { owner: None },
        EgressPolicy::default(),
    )
    .unwrap();
    assert!(slot.set_policy(dns).is_err());
    assert_eq!(slot.policy(), EgressPolicy::default());
}

#[test]
fn removal_and_reclaim_leave_nothing_behind() {
    let mut lab = Lab::new(7);
    let (one, _) = lab.guest_slot(EgressPolicy::default());
    let (two, _) = lab.guest_slot(EgressPolicy::default());
    let three = Slot::create(
        &lab.net,
        &GuestLink::Tap { owner: None },
        EgressPolicy::default(),
    )
    .unwrap();
    let (n1, n2, n3) = (
        one.netns_name().to_string(),
        two.netns_name().to_string(),
        three.netns_name().to_string(),
    );
    let (l1, l2, l3) = (
        one.host_link().to_string(),
        two.host_link().to_string(),
        three.host_link().to_string(),
    );
    let guest1 = one.guest_ip();
    let mut all = vec![
        n1.clone(),
        n2.clone(),
        n3.clone(),
        l1.clone(),
        l2.clone(),
        l3.clone(),
    ];
    all.sort();
    assert_eq!(lab.leftovers(), all);

    one.remove().unwrap();
    assert!(!lab.leftovers().iter().any(|n| *n == n1 || *n == l1));
    let routes = ip(&["route", "show", &format!("{guest1}/32")]);
    assert!(routes.trim().is_empty(), "the route stayed: {routes}");

    // A crash: the daemon forgets its slots; a new one reclaims them but
    // the one it keeps.
    let keep_index = two.index();
    std::mem::forget(two);
    std::mem::forget(three);
    let restarted = HostNet::setup(lab.net.config().clone()).unwrap();
    let r = restarted
        .reclaim_stale(&HashSet::from([keep_index]))
        .unwrap();
    assert_eq!((r.netns, r.links), (vec![n3], vec![l3]));
    let mut kept = vec![n2, l2];
    kept.sort();
    assert_eq!(lab.leftovers(), kept);
    let r = restarted.reclaim_stale(&HashSet::new()).unwrap();
    assert_eq!(r.netns.len() + r.links.len(), 2);
    assert_eq!(lab.leftovers(), Vec::<String>::new());

    // The host's ruleset holds only the shared table: slot tables live in
    // their netns and went with it.
    let tables = cmd_out_nft();
    assert_eq!(
        tables,
        vec!["inet shoal".to_string()],
        "shoal tables on the host"
    );
}

fn cmd_out_nft() -> Vec<String> {
    let out = shoal_hostnet::cmd::run(
        "nft",
        &["-j", "list", "tables"],
        None,
        Duration::from_secs(60),
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i.get("table"))
        .map(|t| {
            format!(
                "{} {}",
                t["family"].as_str().unwrap(),
                t["name"].as_str().unwrap()
            )
        })
        .filter(|n| n.contains("shoal"))
        .collect()
}

#[test]
fn a_pool_hands_out_ready_slots_refills_and_cleans_up() {
    let lab = Lab::new(8);
    let pool = SlotPool::start(lab.net.clone(), 2).unwrap();
    assert!(
        eventually(Duration::from_secs(120), || pool.ready() == 2),
        "{:?}",
        pool.last_error()
    );
    let made = Instant::now();
    let extra = Slot::create(
        &lab.net,
        &GuestLink::Tap { owner: None },
        EgressPolicy::default(),
    )
    .unwrap();
    let create_time = made.elapsed();
    let t = Instant::now();
    let slot = pool.take().expect("a ready slot");
    let take_time = t.elapsed();
    // Reported, not asserted (see pool.rs): a pop against a creation.
    eprintln!("pool take: {take_time:?}; creating a slot: {create_time:?}");
    assert!(
        eventually(Duration::from_secs(120), || pool.ready() == 2),
        "{:?}",
        pool.last_error()
    );
    // A pooled slot denies everything and is ready for its owner.
    assert_eq!(slot.policy(), EgressPolicy::default());
    slot.set_tap_owner(61400, 61400).unwrap();
    slot.set_policy(policy(&["198.51.100.0/24:443"], &[], false))
        .unwrap();
    assert_eq!(lab.leftovers().len(), 2 * 4);
    pool.shutdown().unwrap();
    let mut left = vec![
        slot.netns_name().to_string(),
        slot.host_link().to_string(),
        extra.netns_name().to_string(),
        extra.host_link().to_string(),
    ];
    left.sort();
    assert_eq!(lab.leftovers(), left);
    slot.remove().unwrap();
    extra.remove().unwrap();
    assert_eq!(lab.leftovers(), Vec::<String>::new());
}

/// Deletes a netns when dropped.
struct NsGuard(&'static str);

impl Drop for NsGuard {
    fn drop(&mut self) {
        ip_quiet(&["netns", "del", self.0]);
    }
}

fn our_forward_rules() -> usize {
    let out = shoal_hostnet::cmd::run(
        "nft",
        &["-j", "list", "chain", "ip", "filter", "FORWARD"],
        None,
        Duration::from_secs(60),
    )
    .unwrap();
    shoal_hostnet::forward::our_rules(&out).unwrap().len()
}

/// A host whose FORWARD chain drops by default (as Docker leaves it): the
/// whole lab runs in a stand-in host netns, on a thread that entered it
/// (commands and threads it starts inherit it).
#[test]
fn a_host_forward_chain_that_drops_is_opened_to_slots() {
    const FAKE_HOST: &str = "shoaltest9-host";
    ip_quiet(&["netns", "del", FAKE_HOST]);
    ip(&["netns", "add", FAKE_HOST]);
    let _guard = NsGuard(FAKE_HOST);
    let body = std::thread::spawn(|| {
        shoal_hostnet::netns::enter(FAKE_HOST).unwrap();
        ip(&["link", "set", "lo", "up"]);
        let drop_chain = "table ip filter {\n\tchain FORWARD {\n\t\ttype filter hook forward priority filter; policy drop;\n\t}\n}\n";
        shoal_hostnet::cmd::run(
            "nft",
            &["-f", "-"],
            Some(drop_chain),
            Duration::from_secs(60),
        )
        .unwrap();
        let missing = shoal_hostnet::probe();
        assert!(
            missing
                .iter()
                .any(|m| m.contains("ip filter FORWARD drops by default")),
            "{missing:#?}"
        );
        HostNet::setup(NetConfig::default()).unwrap();
        assert_eq!(our_forward_rules(), 2);
        assert!(shoal_hostnet::probe().is_empty());
        // Another setup (another pool, a restart: the lab's) adds no duplicates.
        let mut lab = Lab::new(9);
        assert_eq!(our_forward_rules(), 2);

        let a = lab.inet_a;
        let (_slot, g) = lab.guest_slot(policy(&[&format!("{a}:{TCP_A}")], &[], false));
        assert_eq!(
            tcp(&g, sa(a, TCP_A), OK_WAIT).unwrap(),
            format!("{TCP_A} hi")
        );

        // Without the accepts (the shared table still there) the host's
        // drop stops the slot; a setup puts them back.
        let t = Duration::from_secs(60);
        shoal_hostnet::forward::close_all(t).unwrap();
        assert_eq!(our_forward_rules(), 0);
        assert!(
            tcp(&g, sa(a, TCP_A), BLOCKED_WAIT).is_err(),
            "the host's drop"
        );
        HostNet::setup(lab.net.config().clone()).unwrap();
        assert_eq!(
            tcp(&g, sa(a, TCP_A), OK_WAIT).unwrap(),
            format!("{TCP_A} hi")
        );

        // Teardown takes them out with the shared table.
        lab.net.teardown().unwrap();
        assert_eq!(our_forward_rules(), 0);
        assert!(
            tcp(&g, sa(a, TCP_A), BLOCKED_WAIT).is_err(),
            "after teardown"
        );
    });
    if let Err(p) = body.join() {
        std::panic::resume_unwind(p);
    }
}
