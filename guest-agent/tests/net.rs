//! `NetConfigure` through the protocol and both clients: a host-mode agent
//! inside a network namespace of its own (`ip netns exec`), pointed at one
//! end of a veth pair there by `SHOAL_AGENT_NETDEV`, and one without it
//! that must refuse. Needs root and iproute2, and fails saying so.

mod common;

use std::net::Ipv4Addr;
use std::process::Command;

use agent_client::{AsyncClient, ClientError, Config, ErrorCode, NetConfigure, Transport};
use common::{Agent, TempDir};

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run `ip` (install iproute2)");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A named network namespace with a veth pair in it, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("shoal-agt-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        ip(&["netns", "add", &name]);
        let ns = Netns(name);
        ip(&[
            "-n", &ns.0, "link", "add", "veth-g", "type", "veth", "peer", "name", "veth-h",
        ]);
        ns
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["-n", &self.0, "-j"];
        a.extend_from_slice(args);
        serde_json::from_str(&ip(&a)).expect("ip -j output")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn request(last: u8) -> NetConfigure {
    NetConfigure {
        mac: [0x02, 0x5a, 0x0a, 0xd5, 0x00, last],
        addr: Ipv4Addr::new(10, 213, 0, last),
        prefix_len: 30,
        gateway: Ipv4Addr::new(10, 213, 0, 1),
        mtu: 1500,
        nameservers: vec![Ipv4Addr::new(10, 213, 0, 1)],
    }
}

/// Checks the interface and default route against `req`.
fn check(ns: &Netns, req: &NetConfigure) {
    let link = &ns.json(&["addr", "show", "dev", "veth-g"])[0];
    let mac = req.mac.map(|b| format!("{b:02x}")).join(":");
    assert_eq!(link["address"], mac.as_str());
    assert_eq!(link["mtu"], u64::from(req.mtu));
    let addrs: Vec<String> = link["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["family"] == "inet")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect();
    assert_eq!(addrs, [format!("{}/{}", req.addr, req.prefix_len)]);
    let routes = ns.json(&["-4", "route", "show", "default"]);
    let routes = routes.as_array().unwrap();
    assert_eq!(routes.len(), 1, "one default route: {routes:?}");
    assert_eq!(routes[0]["gateway"], req.gateway.to_string().as_str());
    assert_eq!(routes[0]["dev"], "veth-g");
}

#[test]
fn net_configure_through_both_clients_and_refused_without_an_interface() {
    let ns = Netns::new("cfg");
    let dir = TempDir::new("net");
    std::fs::create_dir(dir.path().join("etc")).unwrap();
    let name = ns.0.clone();
    let agent = Agent::start_in(dir, |argv| {
        let mut v: Vec<String> = ["ip", "netns", "exec", &name, "env"]
            .map(String::from)
            .to_vec();
        v.push("SHOAL_AGENT_NETDEV=veth-g".into());
        v.extend(argv);
        v
    });

    let c = agent.client();
    let got = c.net_configure(&request(2)).unwrap();
    assert_eq!(got.ifname, "veth-g");
    check(&ns, &request(2));
    let resolv = agent.dir.path().join("etc/resolv.conf");
    assert_eq!(
        std::fs::read_to_string(&resolv).unwrap(),
        "# written by shoal-agent\nnameserver 10.213.0.1\n"
    );

    // The async client, another identity: it replaces the first.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let second = NetConfigure {
        mtu: 1280,
        prefix_len: 24,
        nameservers: vec![Ipv4Addr::new(9, 9, 9, 9), Ipv4Addr::new(1, 1, 1, 1)],
        ..request(6)
    };
    let got = rt
        .block_on(async {
            let c = AsyncClient::connect(&Transport::Unix(agent.sock.clone()), Config::default())
                .await
                .unwrap();
            c.net_configure(&second).await
        })
        .unwrap();
    assert_eq!(got.ifname, "veth-g");
    check(&ns, &second);
    assert!(std::fs::read_to_string(&resolv)
        .unwrap()
        .ends_with("nameserver 9.9.9.9\nnameserver 1.1.1.1\n"));

    // A host-mode agent not pointed at an interface refuses.
    let plain = Agent::start();
    match plain.client().net_configure(&request(2)) {
        Err(ClientError::Remote {
            code,
            errno,
            message,
        }) => {
            assert_eq!(code, ErrorCode::Io);
            assert_eq!(errno, libc::EPERM, "{message}");
            assert!(message.contains("SHOAL_AGENT_NETDEV"), "{message}");
        }
        other => panic!("a host-mode agent must refuse: {other:?}"),
    }
}
