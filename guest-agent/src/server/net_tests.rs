//! [`configure`] on real interfaces: each test runs in a thread of its own
//! that moves into a fresh network namespace (`unshare(CLONE_NEWNET)`), so
//! it touches nothing on the host and runs beside the others. Needs root
//! and iproute2 (`ip`), and fails saying so.

use std::path::PathBuf;
use std::process::Command;

use super::*;

fn in_fresh_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare with a flag only; it affects this thread alone.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            r,
            0,
            "unshare(CLONE_NEWNET) failed (these tests need root): {}",
            std::io::Error::last_os_error()
        );
        f()
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Runs `ip ARGS` (in the calling thread's namespace) and returns stdout.
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

fn tempdir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = std::env::temp_dir().join(format!("shoal-net-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn request(last: u8, mtu: u16, ns: &[Ipv4Addr]) -> NetConfigure {
    NetConfigure {
        mac: [0x02, 0x5a, 0x0a, 0xd5, 0x00, last],
        addr: Ipv4Addr::new(10, 213, 0, last),
        prefix_len: 24,
        gateway: Ipv4Addr::new(10, 213, 0, 1),
        mtu,
        nameservers: ns.to_vec(),
    }
}

/// (mac, mtu, up, addresses as "a.b.c.d/len") of `dev` from `ip -j addr`.
fn link_state(dev: &str) -> (String, u64, bool, Vec<String>) {
    let v: serde_json::Value =
        serde_json::from_str(&ip(&["-j", "addr", "show", "dev", dev])).expect("ip -j output");
    let l = &v[0];
    let addrs = l["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["family"] == "inet")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect();
    let flags: Vec<&str> = l["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    (
        l["address"].as_str().unwrap().to_string(),
        l["mtu"].as_u64().unwrap(),
        flags.contains(&"UP"),
        addrs,
    )
}

/// The default routes as (gateway, dev).
fn default_routes() -> Vec<(String, String)> {
    let v: serde_json::Value =
        serde_json::from_str(&ip(&["-j", "-4", "route", "show", "default"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["gateway"].as_str().unwrap_or("").to_string(),
                r["dev"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn configure_sets_identity_route_and_resolv_conf_and_a_second_call_replaces_it() {
    in_fresh_netns(|| {
        ip(&[
            "link", "add", "veth-g", "type", "veth", "peer", "name", "veth-h",
        ]);
        let dir = tempdir("cfg");
        let resolv = CString::new(dir.join("resolv.conf").to_str().unwrap()).unwrap();
        // A symlink there is replaced, not followed.
        let target = dir.join("target");
        std::fs::write(&target, "old\n").unwrap();
        std::os::unix::fs::symlink(&target, dir.join("resolv.conf")).unwrap();

        let ns = [Ipv4Addr::new(10, 213, 0, 1), Ipv4Addr::new(1, 1, 1, 1)];
        let got = configure(&request(2, 1400, &ns), "veth-g", &resolv).unwrap();
        assert_eq!(got.ifname, "veth-g");
        let (mac, mtu, up, addrs) = link_state("veth-g");
        assert_eq!(mac, "02:5a:0a:d5:00:02");
        assert_eq!(mtu, 1400);
        assert!(up, "the interface is up");
        assert_eq!(addrs, ["10.213.0.2/24"]);
        assert_eq!(
            default_routes(),
            [("10.213.0.1".to_string(), "veth-g".to_string())]
        );
        let text = std::fs::read_to_string(dir.join("resolv.conf")).unwrap();
        assert!(
            text.contains("nameserver 10.213.0.1\nnameserver 1.1.1.1\n"),
            "{text}"
        );
        assert!(
            !dir.join("resolv.conf").is_symlink(),
            "the link was replaced"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old\n");

        // Another identity, another gateway: everything replaced.
        let mut second = request(7, 9000, &[Ipv4Addr::new(9, 9, 9, 9)]);
        second.prefix_len = 16;
        second.addr = Ipv4Addr::new(10, 99, 3, 7);
        second.gateway = Ipv4Addr::new(10, 99, 0, 1);
        configure(&second, "veth-g", &resolv).unwrap();
        let (mac, mtu, up, addrs) = link_state("veth-g");
        assert_eq!(mac, "02:5a:0a:d5:00:07");
        assert_eq!(mtu, 9000);
        assert!(up);
        assert_eq!(addrs, ["10.99.3.7/16"], "the old address is gone");
        assert_eq!(
            default_routes(),
            [("10.99.0.1".to_string(), "veth-g".to_string())],
            "one default route, the new one"
        );
        let text = std::fs::read_to_string(dir.join("resolv.conf")).unwrap();
        assert!(text.contains("nameserver 9.9.9.9\n"), "{text}");
        assert!(!text.contains("1.1.1.1"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn configure_replaces_a_default_route_through_another_interface() {
    in_fresh_netns(|| {
        ip(&[
            "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b",
        ]);
        ip(&[
            "link", "add", "veth-o", "type", "veth", "peer", "name", "veth-p",
        ]);
        ip(&["addr", "add", "192.168.50.2/24", "dev", "veth-o"]);
        ip(&["link", "set", "veth-p", "up"]);
        ip(&["link", "set", "veth-o", "up"]);
        ip(&["route", "add", "default", "via", "192.168.50.1"]);
        let dir = tempdir("route");
        let resolv = CString::new(dir.join("resolv.conf").to_str().unwrap()).unwrap();
        configure(&request(3, 1500, &[]), "veth-a", &resolv).unwrap();
        assert_eq!(
            default_routes(),
            [("10.213.0.1".to_string(), "veth-a".to_string())]
        );
        let text = std::fs::read_to_string(dir.join("resolv.conf")).unwrap();
        assert!(!text.contains("nameserver"), "no name servers: {text}");
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn errors_name_the_missing_interface_and_lo_comes_up() {
    in_fresh_netns(|| {
        let dir = tempdir("err");
        let resolv = CString::new(dir.join("resolv.conf").to_str().unwrap()).unwrap();
        let e = configure(&request(2, 1500, &[]), "nosuch0", &resolv).unwrap_err();
        assert_eq!(e.errno, Errno(libc::ENODEV), "{e:?}");
        assert!(
            !dir.join("resolv.conf").exists(),
            "nothing written on failure"
        );
        // A fresh namespace's lo is down until loopback_up.
        assert!(!link_state("lo").2);
        loopback_up().unwrap();
        let (_, _, up, addrs) = link_state("lo");
        assert!(up, "lo is up");
        assert_eq!(addrs, ["127.0.0.1/8"]);
        // Host mode without SHOAL_AGENT_NETDEV refuses.
        let e = handle(AgentMode::Host, None, &request(2, 1500, &[])).unwrap_err();
        assert_eq!(e.errno, Errno(libc::EPERM));
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn find_netdev_skips_lo_and_takes_the_first_name() {
    let dir = tempdir("sys");
    for d in ["lo", "eth1", "eth0"] {
        std::fs::create_dir(dir.join(d)).unwrap();
    }
    let c = CString::new(dir.to_str().unwrap()).unwrap();
    assert_eq!(find_netdev(&c).unwrap(), "eth0");
    std::fs::remove_dir(dir.join("eth0")).unwrap();
    std::fs::remove_dir(dir.join("eth1")).unwrap();
    let e = find_netdev(&c).unwrap_err();
    assert_eq!(e.errno, Errno(libc::ENODEV));
    let _ = std::fs::remove_dir_all(&dir);
}
