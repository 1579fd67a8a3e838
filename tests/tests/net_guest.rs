//! A guest with a virtio-net device, on /dev/kvm: a template booted with
//! a net device on a TAP, restored into clones that each get their own TAP
//! (in their own network namespace) and MAC, configured by the agent
//! (`NetConfigure`), reach a host-side listener over ICMP and TCP, and
//! send with their own MAC only; a restore that gives the snapshot's net
//! device no new identity is refused.
//!
//! The daemon does not give sandboxes a network yet (issue 18); this is
//! the VMM + guest kernel + agent path the daemon will use.

use agent_client::ExitStatus;
use agent_proto::NetConfigure;
use shoal_runtime::sandbox::{build_net_template, GuestFiles, Sandbox, TemplateSpec};
use shoal_test_support::{ip, require_kvm, require_root, sh, RunningSandbox};
use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const HOST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const GUEST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const PORT: u16 = 8080;
const UP: Duration = Duration::from_secs(180);

/// A network namespace holding one TAP (`tap0`, host side HOST/24, up),
/// removed on drop.
struct Ns {
    name: String,
    tap: Arc<File>,
}

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = format!("shnt{}{tag}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        ip(&["netns", "add", &name]);
        let fd = shoal_hostnet::netns::run_in(&name, || shoal_hostnet::netns::attach_tap("tap0"))
            .expect("a TAP in the test's netns");
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{HOST}/24"),
            "dev",
            "tap0",
        ]);
        ip(&["-n", &name, "link", "set", "tap0", "up"]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        Ns {
            name,
            tap: Arc::new(File::from(fd)),
        }
    }

    /// A TCP listener on HOST:PORT inside the namespace answering one
    /// line per connection.
    fn serve(&self, reply: &'static str) {
        let name = self.name.clone();
        let l = shoal_hostnet::netns::run_in(&name, move || TcpListener::bind((HOST, PORT)))
            .expect("listen in the netns");
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let mut s = s;
                let _ = writeln!(s, "{reply}");
            }
        });
    }

    /// The MAC the host side learned for GUEST (its neighbour entry).
    fn guest_mac(&self) -> Option<String> {
        let v: serde_json::Value = serde_json::from_str(&ip(&[
            "-n", &self.name, "-j", "neigh", "show", "dev", "tap0",
        ]))
        .ok()?;
        v.as_array()?
            .iter()
            .find(|n| n["dst"] == GUEST.to_string())
            .and_then(|n| n["lladdr"].as_str().map(str::to_string))
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn mac(last: u8) -> [u8; 6] {
    [0x02, 0x5a, 0x0a, 0x4d, 0x00, last]
}

fn configure(c: &agent_client::Client, m: [u8; 6]) -> String {
    c.net_configure(&NetConfigure {
        mac: m,
        addr: GUEST,
        prefix_len: 24,
        gateway: HOST,
        mtu: 1500,
        nameservers: vec![HOST],
    })
    .expect("NetConfigure")
    .ifname
}

#[test]
fn clones_of_a_networked_template_each_get_their_own_link_and_identity() {
    require_kvm();
    require_root("network namespaces and TAPs");
    let work = tempfile::tempdir().unwrap();
    let tpl = work.path().join("tpl");
    let tns = Ns::new("t");
    let guest = GuestFiles::for_image("tiny").expect("tiny image");
    let vmm = shoal_images::artifacts::vmm_binary().expect("shoal-vmm");
    build_net_template(
        &tpl,
        &TemplateSpec::new("tiny", 1, 128),
        &guest,
        &vmm,
        tns.tap.clone(),
        mac(1),
    )
    .expect("a networked template");
    drop(tns);

    // Without a TAP and MAC of its own, the snapshot's net device is not
    // restored at all.
    let (sb, child) = Sandbox::start(&tpl, false).expect("spawn");
    let r = RunningSandbox { sb, child };
    assert!(r.sb.connect(Duration::from_secs(20), true).is_err());
    let log = r.sb.vmm_log_tail();
    assert!(log.contains("--restore-net"), "{log}");
    drop(r);

    for (tag, last) in [("a", 0x0a), ("b", 0x0b)] {
        let ns = Ns::new(tag);
        ns.serve("hello from the host");
        let m = mac(last);
        let (sb, child) =
            Sandbox::start_with_net(&tpl, false, Some((ns.tap.clone(), m))).expect("restore");
        let r = RunningSandbox { sb, child };
        let c = r.sb.connect(UP, true).expect("agent reachable");
        c.set_timeout(Some(UP));
        assert_eq!(configure(&c, m), "eth0");

        let (out, err, st) = sh(&c, &format!("ping -c 1 -W 10 {HOST}"));
        assert_eq!(st, ExitStatus::Exited(0), "ping: {out}{err}");
        let (out, err, st) = sh(&c, &format!("nc {HOST} {PORT} </dev/null"));
        assert_eq!(st, ExitStatus::Exited(0), "nc: {err}");
        assert_eq!(out, "hello from the host\n");
        let (out, _, _) = sh(&c, "cat /etc/resolv.conf; cat /sys/class/net/eth0/address");
        assert!(out.contains(&format!("nameserver {HOST}")), "{out}");
        let want = shoal_runtime::vmm_net::mac_string(m);
        assert!(out.contains(&want), "guest MAC: {out}");
        // The host side saw this clone's MAC, not the template's.
        assert_eq!(ns.guest_mac().as_deref(), Some(want.as_str()), "{tag}");

        let stats = vmm_api::Client::new(&r.sb.api_sock, Duration::from_secs(10))
            .stats()
            .expect("stats");
        let net = stats.net.expect("net counters");
        assert!(net.tx_packets >= 2 && net.rx_packets >= 2, "{net:?}");
        // A TCP peer's line arrived; nothing the guest sent was dropped.
        assert_eq!(net.tx_dropped, 0, "{net:?}");
    }
}
