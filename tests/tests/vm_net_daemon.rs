//! A networked `vm` sandbox (QEMU q35) through shoald, on /dev/kvm as
//! root (issue 18's slots and policies, as microVMs have them): a vm
//! template made with `"network": true` boots on a slot lent for the boot;
//! a create from it with `network` restores onto a slot of its own (QEMU
//! on the slot's TAP), the agent gives the guest the slot's MAC and
//! address; busybox `wget` fetches from the test host's allowed port and
//! is refused on a port the policy does not allow, also after a pause to
//! disk and resume (a new QEMU on the same slot); a second sandbox gets
//! another address and MAC; a kill removes the slot. A test host in a
//! netns of the test's stands in for the internet.

#[allow(dead_code)] // shared with the daemon tests; this binary uses part
mod daemon_harness;

use daemon_harness::net::{net_args, netns_list, slots_of};
use daemon_harness::{wait_for, Daemon};
use shoal_client::api::{CreateSandbox, CreateTemplate, NetworkSpec, Sandbox, TemplateState};
use shoal_test_support::{ip, PeerNs};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::time::Instant;

fn qemus(d: &Daemon) -> usize {
    shoal_runtime::vm::processes_under(&d.dir, "qemu-system-x86_64").len()
}

/// A test host answering HTTP GETs with `body` on `port`.
fn serve_http(peer: &PeerNs, port: u16, body: &'static str) {
    let addr = peer.addr;
    let l = shoal_hostnet::netns::run_in(&peer.ns, move || TcpListener::bind((addr, port)))
        .expect("listen in the peer's netns");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(&s);
                let mut line = String::new();
                // The request's head, up to its empty line.
                while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let _ = write!(
                    &s,
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
}

fn net(allow: &[String]) -> NetworkSpec {
    NetworkSpec {
        allow_out: allow.to_vec(),
        deny_out: vec![],
        allow_dns: false,
    }
}

/// What busybox `wget` fetched from `url` in sandbox `id` within `secs`
/// (empty: nothing), and its exit code. (`timeout`, not `wget -T`: the
/// tiny image's busybox 1.35 wget dies of SIGSEGV with `-T`, exit 139,
/// whatever the network does.)
fn wget(d: &Daemon, id: &str, url: &str, secs: u32) -> (String, String) {
    let r = d.sh(
        id,
        &format!("timeout {secs} wget -q -O - {url} 2>/dev/null; echo \" rc=$?\""),
    );
    let (body, rc) = r.stdout.rsplit_once(" rc=").unwrap_or((&r.stdout, ""));
    (body.trim().to_string(), rc.trim().to_string())
}

/// The slots' counters and rulesets, and the guest's view of its link:
/// what a failed fetch is diagnosed from.
fn evidence(d: &Daemon, prefix: &str, id: &str) -> String {
    let mut out = vec![];
    for n in netns_list().into_iter().filter(|n| n.starts_with(prefix)) {
        out.push(format!("== {n}: ip -s link"));
        out.push(ip(&["netns", "exec", &n, "ip", "-s", "link"]));
        out.push(format!("== {n}: nft list ruleset"));
        out.push(ip(&["netns", "exec", &n, "nft", "list", "ruleset"]));
    }
    let g = d.sh(
        id,
        "cat /sys/class/net/eth0/address; ip addr; ip route; cat /proc/net/dev",
    );
    out.push(format!("== guest\n{}", g.stdout));
    out.join("\n")
}

/// The slot (netns) of `prefix` whose policy is for guest `addr`.
fn slot_of(prefix: &str, addr: Ipv4Addr) -> Option<String> {
    let rule = format!("ip saddr != {addr} ");
    netns_list()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .find(|n| ip(&["netns", "exec", n, "nft", "list", "ruleset"]).contains(&rule))
}

fn create(d: &Daemon, allow: &[String]) -> Sandbox {
    let req = CreateSandbox {
        network: Some(net(allow)),
        ..CreateSandbox::from_template("vmnet")
    };
    d.must("create", d.c.create(&req))
}

#[test]
fn a_networked_vm_sandbox_gets_its_slot_and_policy() {
    shoal_test_support::require_root("sandbox networks need netns, veth and nftables");
    let tag = std::process::id() % 10_000;
    let prefix = format!("sqv{tag}-");
    let link_prefix = format!("shv{tag}q");
    let pool = format!("10.218.{}.0/24", tag % 250);
    let third = u8::try_from(tag % 250).unwrap();
    let peer = PeerNs::create(
        &format!("shqp{tag}"),
        Ipv4Addr::new(10, 222, third, 1),
        Ipv4Addr::new(10, 222, third, 2),
    );
    serve_http(&peer, 8080, "allowed-port");
    serve_http(&peer, 9090, "other-port");
    let upstream = format!("{}:53", peer.addr);
    let d = Daemon::start(
        &[
            &["--net-dns-upstream", &upstream][..],
            &net_args(&pool, &prefix, &link_prefix),
        ]
        .concat(),
    );
    let ours = || slots_of(&prefix);
    let open = format!("{}:8080", peer.addr);
    let other = format!("{}:9090", peer.addr);

    // A vm without the agent cannot have a network (the agent configures
    // the link).
    let (status, _, m) = d.err(
        "POST",
        "/v1/templates",
        r#"{"name":"bad","image":"tiny","kind":"vm","agent":false,"network":true}"#,
    );
    assert_eq!((status, m.contains("network")), (400, true), "{m}");

    let mut req = CreateTemplate::new("vmnet", "tiny");
    req.kind = Some("vm".into());
    req.network = true;
    let t = d.must("vm template", d.c.create_template(&req));
    assert!(t.network, "{t:?}");
    wait_for("the networked vm template", 300, || {
        let t = d.must("template", d.c.template("vmnet"));
        assert_ne!(t.state, TemplateState::Failed, "{t:?}\n{}", d.log());
        t.state == TemplateState::Ready
    });
    // Its sandboxes take a network, as a microVM template's do.
    let (status, _, m) = d.err("POST", "/v1/sandboxes", r#"{"template":"vmnet"}"#);
    assert_eq!((status, m.contains("network")), (400, true), "{m}");

    let t0 = Instant::now();
    let a = create(&d, std::slice::from_ref(&open));
    let created = t0.elapsed();
    assert_eq!(a.kind, "vm");
    let a_addr = a.guest_addr.expect("a networked sandbox has an address");
    let t0 = Instant::now();
    let (body, rc) = wget(&d, &a.id, &format!("http://{open}/"), 30);
    // The first exec connects the agent, which configures the link.
    eprintln!(
        "create {} ms; first fetch (agent connect, NetConfigure, ARP, TCP) {} ms",
        created.as_millis(),
        t0.elapsed().as_millis()
    );
    if body != "allowed-port" {
        panic!(
            "a fetched {body:?} (rc {rc})\n{}\n{}",
            evidence(&d, &prefix, &a.id),
            d.log()
        );
    }
    // The policy: a port it does not name is refused.
    let (body, rc) = wget(&d, &a.id, &format!("http://{other}/"), 4);
    assert_eq!(body, "", "port 9090 is not allowed");
    assert_ne!(rc, "0", "port 9090 is not allowed");
    let r = d.sh(
        &a.id,
        "ip -4 addr show eth0; cat /sys/class/net/eth0/address",
    );
    assert!(r.stdout.contains(&a_addr.to_string()), "{r:?}");
    let a_mac = r.stdout.lines().last().unwrap_or_default().to_string();
    let t0 = Instant::now();
    let (body, _) = wget(&d, &a.id, &format!("http://{open}/"), 30);
    assert_eq!(body, "allowed-port");
    eprintln!("a second fetch {} ms", t0.elapsed().as_millis());

    // Paused to disk (its QEMU ends, the slot stays) and resumed: a new
    // QEMU on the same slot's TAP, the guest's link as it was.
    d.must("pause", d.c.pause(&a.id));
    wait_for("the paused sandbox's QEMU to end", 30, || qemus(&d) == 0);
    assert!(
        slot_of(&prefix, a_addr).is_some(),
        "a paused sandbox keeps its slot"
    );
    d.must("resume", d.c.resume(&a.id));
    let (body, _) = wget(&d, &a.id, &format!("http://{open}/"), 30);
    assert_eq!(body, "allowed-port", "{}", evidence(&d, &prefix, &a.id));
    let (body, _) = wget(&d, &a.id, &format!("http://{other}/"), 4);
    assert_eq!(body, "", "the policy holds after the resume");

    // A second sandbox: another slot, address and MAC; its own policy.
    let b = create(&d, std::slice::from_ref(&other));
    let b_addr = b.guest_addr.unwrap();
    assert_ne!(a_addr, b_addr);
    let (body, _) = wget(&d, &b.id, &format!("http://{other}/"), 30);
    assert_eq!(body, "other-port", "{}", evidence(&d, &prefix, &b.id));
    let (body, _) = wget(&d, &b.id, &format!("http://{open}/"), 4);
    assert_eq!(body, "", "b's policy does not allow 8080");
    let r = d.sh(
        &b.id,
        "ip -4 addr show eth0; cat /sys/class/net/eth0/address",
    );
    assert!(r.stdout.contains(&b_addr.to_string()), "{r:?}");
    let b_mac = r.stdout.lines().last().unwrap_or_default().to_string();
    assert_ne!(a_mac, b_mac, "each sandbox has its slot's MAC");
    let a_slot = slot_of(&prefix, a_addr).expect("a's slot");
    let b_slot = slot_of(&prefix, b_addr).expect("b's slot");
    assert_ne!(a_slot, b_slot);

    // A kill removes the slot (the pool makes new ones on a take only).
    let before = ours();
    d.kill(&a.id);
    wait_for("a's slot to go", 20, || !ours().contains(&a_slot));
    assert_eq!(ours().len(), before.len() - 1, "{before:?} {:?}", ours());
    assert!(ours().contains(&b_slot), "b keeps its slot");
    d.kill(&b.id);
    wait_for("b's slot to go", 20, || !ours().contains(&b_slot));
    assert_eq!(ours().len(), before.len() - 2, "{before:?} {:?}", ours());
    wait_for("every QEMU to end", 30, || qemus(&d) == 0);
    d.assert_no_sandbox_dirs();
    // The daemon's stop removes the rest: pooled slots and the DNS
    // forwarder's link.
    drop(d);
    assert_eq!(
        ours(),
        Vec::<String>::new(),
        "slots left after the daemon stopped"
    );
    let links = ip(&["-j", "link", "show"]);
    assert!(!links.contains(&link_prefix), "links left: {links}");
}
