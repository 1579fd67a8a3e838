use std::time::Duration;

use super::*;
use crate::addr::AddrPool;
use crate::cmd;

fn addrs() -> SlotAddrs {
    AddrPool::new("10.213.0.0/16".parse().unwrap())
        .unwrap()
        .slot(3)
        .unwrap()
}

fn blocked() -> Vec<Ipv4Net> {
    let mut b: Vec<Ipv4Net> = ALWAYS_DENIED.iter().map(|s| s.parse().unwrap()).collect();
    b.push("10.213.0.0/16".parse().unwrap());
    b.push("192.0.2.10".parse().unwrap());
    b
}

fn sets(allow: &[&str], deny: &[&str], dns: bool) -> PolicySets {
    PolicySets::new(&EgressPolicy::parse(allow, deny, dns).unwrap(), &blocked()).unwrap()
}

fn fwd() -> Option<SocketAddrV4> {
    Some("192.0.2.10:5353".parse().unwrap())
}

#[test]
fn overlapping_entries_become_disjoint_elements() {
    let s = sets(
        &[
            "198.51.100.0/24:80",
            "198.51.100.2:8080",
            "198.51.100.2:80-90",
        ],
        &[],
        false,
    );
    assert_eq!(
        rects(&s.allow),
        [
            "198.51.100.0-198.51.100.1 . tcp . 80",
            "198.51.100.2 . tcp . 80-90",
            "198.51.100.2 . tcp . 8080",
            "198.51.100.3-198.51.100.255 . tcp . 80",
            "198.51.100.0-198.51.100.1 . udp . 80",
            "198.51.100.2 . udp . 80-90",
            "198.51.100.2 . udp . 8080",
            "198.51.100.3-198.51.100.255 . udp . 80",
        ]
    );
    assert_eq!(ranges(&s.allow_icmp), ["198.51.100.0-198.51.100.255"]);
    // A port-less entry covers every port, and swallows the narrower ones.
    let s = sets(&["10.0.0.0/8", "10.1.2.3:443"], &[], false);
    assert_eq!(
        rects(&s.allow),
        [
            "10.0.0.0-10.255.255.255 . tcp . 0-65535",
            "10.0.0.0-10.255.255.255 . udp . 0-65535"
        ]
    );
}

#[test]
fn explicit_entries_inside_denied_ranges_become_exceptions() {
    let s = sets(
        &["169.254.169.254:80", "0.0.0.0/0:443", "10.213.0.14"],
        &["8.8.8.8", "9.9.9.9:443"],
        false,
    );
    assert_eq!(
        rects(&s.except),
        [
            "10.213.0.14 . tcp . 0-65535",
            "169.254.169.254 . tcp . 80",
            "10.213.0.14 . udp . 0-65535",
            "169.254.169.254 . udp . 80",
        ]
    );
    // The wide entry is no exception: the blocked set still stops it.
    assert_eq!(
        rects(&s.allow),
        [
            "0.0.0.0-255.255.255.255 . tcp . 443",
            "0.0.0.0-255.255.255.255 . udp . 443"
        ]
    );
    assert_eq!(ranges(&s.deny_icmp), ["8.8.8.8"]);
    assert_eq!(
        rects(&s.deny),
        [
            "8.8.8.8 . tcp . 0-65535",
            "9.9.9.9 . tcp . 443",
            "8.8.8.8 . udp . 0-65535",
            "9.9.9.9 . udp . 443"
        ]
    );
    assert_eq!(
        ranges(&s.blocked),
        [
            "0.0.0.0-0.255.255.255",
            "10.213.0.0-10.213.255.255",
            "127.0.0.0-127.255.255.255",
            "169.254.0.0-169.254.255.255",
            "192.0.2.10",
            "224.0.0.0-255.255.255.255",
        ]
    );
}

#[test]
fn too_fragmented_policies_are_refused() {
    // Every /32 of a /24 with its own port, under one wide entry: each
    // address gets the wide range cut around its own port.
    let allow: Vec<String> = (0..=255)
        .map(|i| format!("198.51.{i}.0/24:{}", 1000 + i))
        .chain((0..=255).map(|i| format!("198.{i}.0.0/16:{}", 2000 + i)))
        .collect();
    let p = EgressPolicy::parse(&allow[..256], &allow[256..], false).unwrap();
    assert!(PolicySets::new(&p, &blocked()).is_ok());
    let many: Vec<String> = (0..200)
        .map(|i| format!("198.51.100.{i}:{}", 2 * i + 1))
        .collect();
    let mut allow = many.clone();
    allow.extend((0..50).map(|i| format!("198.51.100.0/24:{}-{}", 1000 + 2 * i, 1000 + 2 * i)));
    let p = EgressPolicy::parse(&allow, &[], false).unwrap();
    assert!(matches!(
        PolicySets::new(&p, &blocked()),
        Err(NftError::TooComplex(_))
    ));
}

#[test]
fn the_slot_table_reads_as_designed() {
    let s = render_slot(&addrs(), fwd(), &sets(&["198.51.100.2:80"], &[], true)).unwrap();
    for line in [
        "table inet shoal_slot {}\ndelete table inet shoal_slot\ntable inet shoal_slot {",
        "iifname \"tap0\" ip daddr @dns_gw udp dport 53 dnat ip to 192.0.2.10:5353",
        "iifname \"tap0\" counter name dropped drop",
        "iifname \"tap0\" jump guest",
        "type filter hook output priority filter; policy drop;\n\t\toifname \"lo\" accept\n\t\tct state established,related accept\n\t}",
        "oifname \"tap0\" ct state established,related counter name to_guest accept",
        "ether saddr != 02:5a:0a:d5:00:1e counter name dropped drop",
        "ip saddr != 10.213.0.30 counter name dropped drop",
        "ct status dnat ct original ip daddr @dns_gw ip daddr 192.0.2.10 udp dport 5353 accept",
        "udp dport { 53, 853 } counter name dropped drop",
        "tcp dport { 53, 853 } counter name dropped drop",
        "add element inet shoal_slot allow { 198.51.100.2 . tcp . 80, 198.51.100.2 . udp . 80 }",
        "add element inet shoal_slot dns_gw { 10.213.0.29 }",
    ] {
        assert!(s.contains(line), "missing {line:?} in\n{s}");
    }
    // Order: anti-spoof, forwarder, DNS block, deny, exceptions, blocked, allow.
    let at = |p: &str| s.find(p).unwrap_or_else(|| panic!("{p}"));
    assert!(at("ether saddr") < at("ct status dnat"));
    assert!(at("ct status dnat") < at("udp dport { 53"));
    assert!(at("udp dport { 53") < at("@deny "));
    assert!(at("@deny ") < at("@except "));
    assert!(at("@except ") < at("@blocked"));
    assert!(at("@blocked") < at("@allow "));
    assert!(at("@allow ") < at("@dns accept"));
    // Without DNS the gateway is not in dns_gw; without a forwarder no DNAT.
    let s = render_slot(&addrs(), None, &sets(&[], &[], false)).unwrap();
    assert!(
        !s.contains("dnat") && !s.contains("add element inet shoal_slot dns_gw"),
        "{s}"
    );
    assert_eq!(
        render_slot(&addrs(), None, &sets(&[], &[], true)),
        Err(NftError::NoForwarder)
    );
}

#[test]
fn updates_and_forwarder_addresses() {
    let u = render_policy_update(&sets(&[], &[], false), addrs().gateway, true);
    assert!(u.contains("flush set inet shoal_slot allow\n"));
    assert!(u.contains("flush set inet shoal_slot dns\n"));
    assert!(u.contains("flush set inet shoal_slot dns_gw\n"));
    let u = render_policy_update(&sets(&[], &[], false), addrs().gateway, false);
    assert!(!u.contains("flush set inet shoal_slot dns\n"));
    let a = render_allow_addr("198.51.100.9".parse().unwrap(), Duration::from_secs(30)).unwrap();
    assert_eq!(
        a,
        "add element inet shoal_slot dns { 198.51.100.9 timeout 30s }\n\
         delete element inet shoal_slot dns { 198.51.100.9 }\n\
         add element inet shoal_slot dns { 198.51.100.9 timeout 30s }\n"
    );
    assert!(render_allow_addr("1.2.3.4".parse().unwrap(), Duration::ZERO).is_err());
    assert!(render_allow_addr("1.2.3.4".parse().unwrap(), MAX_TTL * 2).is_err());
}

#[test]
fn counters_parse_from_nft_json() {
    let j = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
        {"counter": {"family": "inet", "name": "from_guest", "table": "shoal_slot", "handle": 1, "packets": 5, "bytes": 400}},
        {"counter": {"family": "inet", "name": "to_guest", "table": "shoal_slot", "handle": 2, "packets": 4, "bytes": 300}},
        {"counter": {"family": "inet", "name": "dropped", "table": "shoal_slot", "handle": 3, "packets": 1, "bytes": 60}}]}"#;
    let c = parse_counters(j).unwrap();
    assert_eq!(
        c.from_guest,
        Count {
            packets: 5,
            bytes: 400
        }
    );
    assert_eq!(
        c.to_guest,
        Count {
            packets: 4,
            bytes: 300
        }
    );
    assert_eq!(
        c.dropped,
        Count {
            packets: 1,
            bytes: 60
        }
    );
    assert!(parse_counters("not json").is_err());
}

/// The rendered scripts are valid nftables: `nft -c` checks them against
/// the kernel without committing (root, nft installed: it fails if not).
#[test]
fn nft_accepts_the_rendered_scripts() {
    let t = Duration::from_secs(60);
    let slot = render_slot(
        &addrs(),
        fwd(),
        &sets(
            &["198.51.100.0/24:80-90", "169.254.169.254:80", "10.0.0.0/8"],
            &["10.9.0.0/16:22", "10.8.0.0/16"],
            true,
        ),
    )
    .unwrap();
    let update = render_policy_update(&sets(&["1.1.1.1"], &[], false), addrs().gateway, true);
    let dns = render_allow_addr("198.51.100.9".parse().unwrap(), Duration::from_secs(5)).unwrap();
    let script = format!("{slot}\n{update}{dns}");
    if let Err(e) = cmd::run("nft", &["-c", "-f", "-"], Some(&script), t) {
        panic!("nft refused the slot script ({e}):\n{script}");
    }
    if let Err(e) = cmd::run("nft", &["-c", "-f", "-"], Some(&render_host()), t) {
        panic!("nft refused the host script ({e})");
    }
}
