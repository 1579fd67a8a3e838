//! Host network set-up for the network tests.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// Runs `ip ARGS`, panicking with its stderr if it fails; its stdout.
pub fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A test host in a network namespace of its own, `ns`, joined to the host
/// by the veth `host_link` (its end in the netns is `eth0`): the host side
/// has `host/30`, the test host `addr/30` and its default route through
/// the host. Leftovers of the same names are removed first; everything is
/// removed on drop.
pub struct PeerNs {
    pub ns: String,
    pub host_link: String,
    pub addr: Ipv4Addr,
}

impl PeerNs {
    /// Makes the netns `name` and the veth `{name}h`.
    pub fn create(name: &str, host: Ipv4Addr, addr: Ipv4Addr) -> PeerNs {
        let ns = name.to_string();
        let host_link = format!("{name}h");
        for args in [["netns", "del", &ns], ["link", "del", &host_link]] {
            let _ = Command::new("ip").args(args).stderr(Stdio::null()).status();
        }
        ip(&["netns", "add", &ns]);
        // Owned from here: a failure below removes what was made.
        let peer = PeerNs {
            ns,
            host_link,
            addr,
        };
        let (ns, link) = (peer.ns.as_str(), peer.host_link.as_str());
        ip(&[
            "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ]);
        ip(&["addr", "add", &format!("{host}/30"), "dev", link]);
        ip(&["link", "set", link, "up"]);
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{addr}/30"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", ns, "link", "set", "eth0", "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            &host.to_string(),
        ]);
        peer
    }
}

impl Drop for PeerNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .status();
    }
}
