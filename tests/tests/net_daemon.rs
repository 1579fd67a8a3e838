//! Sandbox networks through shoald (issue 18), on /dev/kvm as root: a
//! create with `network` restores a networked template onto a slot of its
//! own (netns, veth, TAP, nftables), the agent configures the guest's
//! link, the policy lets through exactly what it names (a test host in a
//! netns of the test's stands in for the internet), two sandboxes do not
//! reach each other, `PUT .../network` changes the policy of a running
//! sandbox at once, `/metrics` counts each sandbox's traffic, a kill
//! removes the slot, and after a `kill -9` of the daemon a restart takes
//! over the surviving sandbox's slot and removes what the crash left.

#[allow(dead_code)] // shared with the daemon tests; this binary uses part
mod daemon_harness;

use daemon_harness::net::{net_args, netns_list, slots_of};
use daemon_harness::{wait_for, Daemon};
use shoal_client::api::{CreateSandbox, ErrorCode, NetworkSpec};
use shoal_test_support::{ip, PeerNs};
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};

/// A test host: a netns joined to the host by a veth (host side `.1/30`,
/// its side `.2/30`), with TCP listeners answering one line each.
struct Peer {
    net: PeerNs,
    addr: Ipv4Addr,
}

impl Peer {
    fn new(tag: u32) -> Peer {
        let third = u8::try_from(tag % 250).unwrap();
        let net = PeerNs::create(
            &format!("shnp{tag}"),
            Ipv4Addr::new(10, 216, third, 1),
            Ipv4Addr::new(10, 216, third, 2),
        );
        Peer {
            addr: net.addr,
            net,
        }
    }

    fn serve(&self, port: u16, reply: &'static str) {
        let addr = self.addr;
        let l = shoal_hostnet::netns::run_in(&self.net.ns, move || TcpListener::bind((addr, port)))
            .expect("listen in the peer's netns");
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let _ = writeln!(s, "{reply}");
            }
        });
    }
}

/// A DNS zone's answer to `q` (a query): `names` have A records (TTL
/// 60), every other name is NXDOMAIN, other types get no records.
fn dns_answer(q: &[u8], names: &[(&str, Ipv4Addr)]) -> Option<Vec<u8>> {
    // The question: labels from byte 12, then type and class.
    let mut i = 12;
    let mut labels = vec![];
    while *q.get(i)? != 0 {
        let n = usize::from(q[i]);
        labels.push(String::from_utf8_lossy(q.get(i + 1..i + 1 + n)?).to_lowercase());
        i += 1 + n;
    }
    let qtype = u16::from_be_bytes([*q.get(i + 1)?, *q.get(i + 2)?]);
    let end = i + 5;
    let name = labels.join(".");
    let hit = names.iter().find(|(n, _)| *n == name).map(|(_, a)| *a);
    let mut r = q.get(..end)?.to_vec();
    r[2] = 0x81;
    r[3] = if hit.is_some() { 0x80 } else { 0x83 };
    r[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
    if let (Some(a), 1) = (hit, qtype) {
        r[7] = 1;
        r.extend([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        r.extend(a.octets());
    }
    Some(r)
}

impl Peer {
    /// A DNS zone on the peer's port 53 (UDP), answering `names`.
    fn serve_dns(&self, names: &'static [(&'static str, Ipv4Addr)]) {
        let addr = self.addr;
        let s = shoal_hostnet::netns::run_in(&self.net.ns, move || UdpSocket::bind((addr, 53)))
            .expect("a DNS socket in the peer's netns");
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                if let Some(r) = dns_answer(&buf[..n], names) {
                    let _ = s.send_to(&r, from);
                }
            }
        });
    }
}

fn net(allow: &[String]) -> NetworkSpec {
    NetworkSpec {
        allow_out: allow.to_vec(),
        deny_out: vec![],
        allow_dns: false,
    }
}

/// What `nc` printed connecting to `to` from sandbox `id` within `secs`
/// (empty: no connection). A fresh guest's first packets wait on ARP in
/// both directions, which on PVM hosts can take seconds.
fn nc_within(d: &Daemon, id: &str, to: &str, secs: u32) -> String {
    let (h, p) = to.split_once(':').unwrap();
    let r = d.sh(
        id,
        &format!("nc -w {secs} {h} {p} </dev/null 2>/dev/null; true"),
    );
    r.stdout.trim().to_string()
}

/// [`nc_within`] for what must pass (20 s: a fresh clone's first
/// connection has taken over 10 s on a loaded PVM host).
fn nc(d: &Daemon, id: &str, to: &str) -> String {
    nc_within(d, id, to, 20)
}

/// Panics unless `to` is unreachable from `id` (nothing within 4 s).
fn blocked(d: &Daemon, id: &str, to: &str, why: &str) {
    assert_eq!(nc_within(d, id, to, 4), "", "{why}");
}

#[test]
fn networked_sandboxes_get_their_own_slot_policy_and_cleanup() {
    shoal_test_support::require_root("sandbox networks need netns, veth and nftables");
    let tag = std::process::id() % 10_000;
    let prefix = format!("sdt{tag}-");
    let link_prefix = format!("shv{tag}t");
    // This test's own pool, prefixes and peer: nothing of another daemon.
    let pool = format!("10.217.{}.0/24", tag % 250);
    let peer = Peer::new(tag);
    peer.serve(8080, "allowed-port");
    peer.serve(9090, "other-port");
    // The peer is the internet's DNS too: the daemon's forwarder (on its
    // own link, `--net-dns auto`) asks it.
    let zone: &'static [(&'static str, Ipv4Addr)] = Box::leak(Box::new([
        ("allowed.test", peer.addr),
        ("denied.test", peer.addr),
    ]));
    peer.serve_dns(zone);
    let upstream = format!("{}:53", peer.addr);
    // A VMM stock of one per template: networked creates are served by
    // VMMs stocked on slots of their own (asserted below).
    let mut d = Daemon::start(
        &[
            &["--vmm-stock", "1", "--net-dns-upstream", &upstream][..],
            &net_args(&pool, &prefix, &link_prefix),
        ]
        .concat(),
    );
    let ours = || slots_of(&prefix);
    let open = format!("{}:8080", peer.addr);
    let other = format!("{}:9090", peer.addr);

    // Bad policies and mismatches are refused before anything is made.
    let (status, code, msg) = d.err(
        "POST",
        "/v1/sandboxes",
        r#"{"image":"tiny","network":{"allow_out":["10.0.0.0/33"],"allow_dns":false}}"#,
    );
    assert_eq!((status, code), (400, ErrorCode::BadRequest), "{msg}");

    let a = d.create(CreateSandbox {
        network: Some(net(std::slice::from_ref(&open))),
        ..Default::default()
    });
    assert!(a.template.ends_with("-net"), "{}", a.template);
    let a_addr = a.guest_addr.expect("a networked sandbox has an address");
    assert_eq!(a.network.as_ref().unwrap().allow_out, vec![open.clone()]);
    // Only the allowed port passes.
    assert_eq!(nc(&d, &a.id, &open), "allowed-port", "{}", d.log());
    blocked(&d, &a.id, &other, "port 9090 is not allowed");
    // The guest has the slot's address.
    let r = d.sh(&a.id, "ip -4 addr show eth0 2>/dev/null || ifconfig eth0");
    assert!(r.stdout.contains(&a_addr.to_string()), "{r:?}");

    // A second sandbox: another address, and the two cannot reach each
    // other (the pool is always denied).
    let b = d.create(CreateSandbox {
        network: Some(net(&[format!("{}/32", peer.addr)])),
        ..Default::default()
    });
    let b_addr = b.guest_addr.unwrap();
    assert_ne!(a_addr, b_addr);
    let got = nc(&d, &b.id, &other);
    if got != "other-port" {
        let tables: Vec<String> = netns_list()
            .iter()
            .filter(|n| n.starts_with("sdt"))
            .map(|n| ip(&["netns", "exec", n, "nft", "list", "ruleset"]))
            .collect();
        let r = d.sh(
            &b.id,
            &format!(
                "nc -w 10 {} 9090 </dev/null; echo rc=$?; ip addr; ip route",
                peer.addr
            ),
        );
        panic!("b got {got:?}\n{r:?}\n{}\n{}", tables.join("\n"), d.log());
    }
    let r = d.sh(
        &a.id,
        &format!("ping -c 1 -W 2 {b_addr} >/dev/null 2>&1; echo $?"),
    );
    assert_ne!(r.stdout.trim(), "0", "a reached b");

    // A template without a net device cannot serve a networked create.
    let plain = d.create(CreateSandbox::default());
    let (status, _, msg) = d.err(
        "POST",
        "/v1/sandboxes",
        &format!(
            r#"{{"template":"{}","network":{{"allow_out":[],"allow_dns":false}}}}"#,
            plain.template
        ),
    );
    assert_eq!(status, 400, "{msg}");
    let (status, _, _) = d.err(
        "PUT",
        &format!("/v1/sandboxes/{}/network", plain.id),
        r#"{"allow_out":[],"allow_dns":false}"#,
    );
    assert_eq!(status, 409, "a sandbox without a network");
    d.kill(&plain.id);

    // The policy changes on the running sandbox, both ways.
    let v = d.must("set", d.c.set_network(&a.id, &net(&[])));
    assert!(v.network.unwrap().allow_out.is_empty());
    blocked(&d, &a.id, &open, "nothing is allowed any more");
    d.must(
        "set",
        d.c.set_network(&a.id, &net(std::slice::from_ref(&other))),
    );
    assert_eq!(nc(&d, &a.id, &other), "other-port");
    assert_eq!(
        d.get(&a.id).unwrap().network.unwrap().allow_out,
        vec![other.clone()]
    );

    // Each sandbox's traffic is counted.
    let m = d.metrics();
    let sent = m
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "shoal_net_bytes_total{{sandbox=\"{}\",dir=\"sent\"}}",
                a.id
            ))
        })
        .unwrap_or_else(|| panic!("no counter for {}:\n{m}", a.id));
    let n: u64 = sent.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n > 0, "{sent}");

    // Domains: only an allowed name resolves (through the forwarder, the
    // gateway being the guest's resolver), and its answer's address is
    // reachable from then on; a denied name is NXDOMAIN and a query sent
    // to another resolver (the peer itself) is dropped.
    let c = d.create(CreateSandbox {
        network: Some(NetworkSpec {
            allow_out: vec!["allowed.test".into()],
            deny_out: vec![],
            allow_dns: true,
        }),
        ..Default::default()
    });
    blocked(&d, &c.id, &open, "not resolved yet");
    let r = d.sh(&c.id, "nslookup denied.test 2>&1; echo rc=$?");
    assert!(
        !r.stdout.contains(&peer.addr.to_string()) && r.stdout.contains("rc=1"),
        "{r:?}"
    );
    let r = d.sh(
        &c.id,
        &format!(
            "timeout 6 nslookup allowed.test {} 2>&1; echo rc=$?",
            peer.addr
        ),
    );
    assert!(
        !r.stdout.contains("rc=0"),
        "a query to another resolver was answered: {r:?}"
    );
    let r = d.sh(&c.id, "nslookup allowed.test 2>&1; echo rc=$?");
    assert!(
        r.stdout.contains(&peer.addr.to_string()) && r.stdout.contains("rc=0"),
        "{r:?}\n{}",
        d.log()
    );
    assert_eq!(nc(&d, &c.id, &open), "allowed-port", "the answer's address");
    d.kill(&c.id);

    // 20 clones of the networked template: 20 distinct addresses and MACs
    // (none the template's), each configured and working.
    let clones: Vec<_> = (0..20)
        .map(|_| {
            d.create(CreateSandbox {
                network: Some(net(std::slice::from_ref(&open))),
                ..Default::default()
            })
        })
        .collect();
    // One at a time: a fresh guest's first connection can take seconds
    // here (see `nc`), more with several guests starting at once.
    let script = format!(
        "cat /sys/class/net/eth0/address; nc -w 20 {} 8080 </dev/null",
        peer.addr
    );
    let results: Vec<_> = clones.iter().map(|s| (s, d.sh(&s.id, &script))).collect();
    let mut seen = std::collections::BTreeSet::new();
    for (s, r) in results {
        let (mac, reply) = r.stdout.split_once('\n').unwrap_or((&r.stdout, ""));
        assert_eq!(reply.trim(), "allowed-port", "{}: {r:?}", s.id);
        assert!(
            seen.insert((mac.to_string(), s.guest_addr.unwrap())),
            "{mac} twice"
        );
    }
    assert_eq!(seen.len(), 20);
    for s in &clones {
        d.kill(&s.id);
    }
    // Networked creates are served by VMMs stocked on slots of their own
    // (the stock keeps one: at least some of 20 in a row found it).
    let log = d.log();
    let stocked = log.matches("into a stocked VMM onto network slot").count();
    assert!(
        stocked > 0,
        "no networked create used the VMM stock:\n{log}"
    );

    // A kill removes the slot.
    let before = ours();
    d.kill(&a.id);
    wait_for("a's slot to go", 20, || ours().len() == before.len() - 1);

    // kill -9: b survives; a slot the crash left behind (made by hand
    // here under the daemon's prefix) is removed at the restart, b's kept
    // and taken over (its policy still applies, and can still change).
    d.kill9();
    let stale = format!("{prefix}30");
    ip(&["netns", "add", &stale]);
    d.spawn();
    wait_for("the restarted daemon", 60, || d.c.health().is_ok());
    wait_for("the stale slot to go", 30, || {
        !netns_list().contains(&stale)
    });
    assert_eq!(nc(&d, &b.id, &other), "other-port", "{}", d.log());
    d.must("set", d.c.set_network(&b.id, &net(&[])));
    blocked(&d, &b.id, &other, "b's policy emptied after the restart");
    d.kill(&b.id);
    drop(d);
    assert_eq!(
        ours(),
        Vec::<String>::new(),
        "slots left after the daemon stopped"
    );
    let links = ip(&["-j", "link", "show"]);
    assert!(!links.contains(&link_prefix), "links left: {links}");
}
