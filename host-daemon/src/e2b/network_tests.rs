use super::*;
use serde_json::json;
use shoal_hostnet::EgressPolicy;

fn e(allow: &[&str], deny: &[&str]) -> Egress {
    Egress {
        allow_out: allow.iter().map(|s| s.to_string()).collect(),
        deny_out: deny.iter().map(|s| s.to_string()).collect(),
    }
}

fn spec(allow: &[&str], deny: &[&str], dns: bool) -> NetworkSpec {
    NetworkSpec {
        allow_out: allow.iter().map(|s| s.to_string()).collect(),
        deny_out: deny.iter().map(|s| s.to_string()).collect(),
        allow_dns: dns,
    }
}

/// Whether E2B's rules allow `ip:port` (allow wins, then deny, then
/// allow), for IPv4 entries.
fn e2b_allows(rules: &Egress, ip: Ipv4Addr, port: u16) -> bool {
    let hit = |l: &[String]| {
        l.iter().any(|s| match parse(s) {
            Ok(t) => t.as_v4().is_some_and(|(n, p)| {
                n.contains(ip) && p.is_none_or(|p| (p.lo()..=p.hi()).contains(&port))
            }),
            Err(_) => false,
        })
    };
    hit(&rules.allow_out) || !hit(&rules.deny_out)
}

/// Whether shoald's policy lets `ip:port` through (deny wins; its
/// always-denied ranges aside).
fn shoal_allows(s: &NetworkSpec, ip: Ipv4Addr, port: u16) -> bool {
    let p = EgressPolicy::parse(&s.allow_out, &s.deny_out, s.allow_dns).expect("a valid policy");
    let hit = |l: &[Target]| {
        l.iter().any(|t| {
            t.as_v4().is_some_and(|(n, p)| {
                n.contains(ip) && p.is_none_or(|p| (p.lo()..=p.hi()).contains(&port))
            })
        })
    };
    hit(p.allow_out()) && !hit(p.deny_out())
}

#[test]
fn a_whitelist_is_allow_out_as_given() {
    let s = to_spec(&e(
        &["10.1.2.3:8080", "pypi.org", "*.x.test"],
        &[ALL_TRAFFIC],
    ))
    .unwrap();
    assert_eq!(
        s,
        spec(&["10.1.2.3:8080", "pypi.org", "*.x.test"], &[], true)
    );
    // Addresses only: no DNS (E2B opens its nameserver for domains only).
    let s = to_spec(&e(&["1.1.1.1"], &[ALL_TRAFFIC])).unwrap();
    assert_eq!(s, spec(&["1.1.1.1"], &[], false));
    // Nothing allowed at all.
    let s = to_spec(&e(&[], &[ALL_TRAFFIC])).unwrap();
    assert_eq!(s, spec(&[], &[], false));
    // Blocking all of IPv4 in two halves is blocking all.
    let s = to_spec(&e(&["8.8.8.8"], &["0.0.0.0/1", "128.0.0.0/1"])).unwrap();
    assert_eq!(s, spec(&["8.8.8.8"], &[], false));
}

#[test]
fn no_rules_or_allow_covering_deny_is_the_public_internet() {
    for r in [
        e(&[], &[]),
        e(&["1.2.3.4"], &[]),
        e(&["1.2.3.0/24"], &["1.2.3.4"]),
        e(&[ALL_TRAFFIC], &[ALL_TRAFFIC]),
    ] {
        assert_eq!(to_spec(&r).unwrap(), public_internet(), "{r:?}");
    }
    assert_eq!(
        public_internet(),
        spec(&["0.0.0.0/0", "*"], &[], true),
        "every address and every name"
    );
}

#[test]
fn a_blacklist_is_deny_minus_allow() {
    let s = to_spec(&e(&[], &["1.1.1.1", "10.0.0.0/8:22"])).unwrap();
    assert_eq!(
        s,
        spec(&["0.0.0.0/0", "*"], &["1.1.1.1", "10.0.0.0/8:22"], true)
    );
    // Allow wins: its address cut out of the denied network.
    let r = e(&["10.1.2.3", "10.9.0.0/16:443"], &["10.0.0.0/8"]);
    let s = to_spec(&r).unwrap();
    assert_eq!(s.allow_out, ["0.0.0.0/0", "*"]);
    assert!(!s.deny_out.iter().any(|d| d == "10.0.0.0/8"), "{s:?}");
    for (ip, port) in [
        ([10, 1, 2, 3], 80),
        ([10, 1, 2, 4], 80),
        ([10, 9, 1, 1], 443),
        ([10, 9, 1, 1], 444),
        ([10, 255, 255, 255], 1),
        ([11, 0, 0, 0], 22),
        ([9, 255, 255, 255], 65535),
    ] {
        let ip = Ipv4Addr::from(ip);
        assert_eq!(
            shoal_allows(&s, ip, port),
            e2b_allows(&r, ip, port),
            "{ip}:{port} under {s:?}"
        );
    }
}

#[test]
fn the_mapping_agrees_with_e2b_on_a_grid() {
    let cases = [
        e(&["192.0.2.0/25:80-90"], &["192.0.2.0/24"]),
        e(&["192.0.2.7"], &["192.0.2.0/24:1-100", "198.51.100.0/24"]),
        e(&["192.0.2.0/24:53"], &[ALL_TRAFFIC]),
        e(&["0.0.0.0/0:443"], &["192.0.2.0/24"]),
        e(&["192.0.2.128/25"], &["192.0.2.0/24", "192.0.2.200:7"]),
    ];
    let ips = [
        [192, 0, 2, 0],
        [192, 0, 2, 7],
        [192, 0, 2, 127],
        [192, 0, 2, 128],
        [192, 0, 2, 200],
        [192, 0, 2, 255],
        [198, 51, 100, 9],
        [203, 0, 113, 1],
    ];
    for r in &cases {
        let s = to_spec(r).unwrap();
        for ip in ips {
            for port in [1, 7, 53, 80, 85, 90, 91, 100, 101, 443, 65535] {
                let ip = Ipv4Addr::from(ip);
                assert_eq!(
                    shoal_allows(&s, ip, port),
                    e2b_allows(r, ip, port),
                    "{ip}:{port}: {r:?} -> {s:?}"
                );
            }
        }
    }
}

#[test]
fn refusals_name_the_entry() {
    let err = |r: Egress| to_spec(&r).unwrap_err();
    let m = err(e(&[], &["example.com"]));
    assert!(m.contains("denyOut") && m.contains("example.com"), "{m}");
    let m = err(e(&["example.com"], &["1.1.1.1"]));
    assert!(m.contains("domains need denyOut"), "{m}");
    let m = err(e(&["example.com"], &[]));
    assert!(m.contains("domains need denyOut"), "{m}");
    let m = err(e(&["10.0.0.0/33"], &[ALL_TRAFFIC]));
    assert!(m.contains("network.allowOut entry \"10.0.0.0/33\""), "{m}");
    let m = err(e(&["example.com:443"], &[ALL_TRAFFIC]));
    assert!(m.contains("takes no port"), "{m}");
    // A blacklist too fragmented for shoald's policy size.
    let many: Vec<String> = (0..250u32)
        .map(|i| Ipv4Addr::from(0x0a00_0000 + i * 2).to_string())
        .collect();
    let r = Egress {
        allow_out: vec!["10.0.0.0/24".into()],
        deny_out: vec!["10.0.0.0/8".into()],
    };
    assert!(to_spec(&r).is_ok());
    let r = Egress {
        allow_out: many,
        deny_out: vec!["10.0.0.0/8".into()],
    };
    let m = to_spec(&r).unwrap_err();
    assert!(m.contains("at most 256"), "{m}");
}

#[test]
fn e2b_trailing_colon_means_every_port() {
    let s = to_spec(&e(&["1.2.3.4:"], &[ALL_TRAFFIC])).unwrap();
    assert_eq!(s.allow_out, ["1.2.3.4"]);
}

#[test]
fn create_rules_and_allow_internet_access() {
    let rules = || Some(e(&["10.0.0.1"], &[]));
    // allow_internet_access: false blocks all but allowOut, as on E2B.
    let s = create_spec(rules(), Some(false), false).unwrap().unwrap();
    assert_eq!(s, spec(&["10.0.0.1"], &[], false));
    // Rules win over the flag; true changes nothing.
    let s = create_spec(rules(), Some(true), false).unwrap().unwrap();
    assert_eq!(s, public_internet());
    // No rules: no network, unless shoald --e2b-internet (then E2B's
    // default, the internet, unless allow_internet_access is false).
    for aia in [None, Some(true), Some(false)] {
        assert_eq!(create_spec(None, aia, false).unwrap(), None);
    }
    assert_eq!(
        create_spec(None, Some(true), true).unwrap(),
        Some(public_internet())
    );
    assert_eq!(
        create_spec(None, None, true).unwrap(),
        Some(public_internet())
    );
    assert_eq!(create_spec(None, Some(false), true).unwrap(), None);
}

#[test]
fn create_network_fields() {
    let p = |v: Value| parse_create(Some(&v));
    assert_eq!(p(json!({})).unwrap(), None);
    assert_eq!(parse_create(None).unwrap(), None);
    assert_eq!(p(Value::Null).unwrap(), None);
    // What the SDK sends for options shoald already does.
    assert_eq!(
        p(json!({"allowPublicTraffic": false, "rules": {}, "httpsPorts": [], "egressProxy": null}))
            .unwrap(),
        None
    );
    assert_eq!(
        p(json!({"allowOut": ["1.2.3.4"], "denyOut": null})).unwrap(),
        Some(e(&["1.2.3.4"], &[]))
    );
    assert_eq!(
        p(json!({"denyOut": []})).unwrap(),
        Some(e(&[], &[])),
        "explicit empty rules ask for E2B's default, the internet"
    );
    for (body, field) in [
        (json!({"allowPublicTraffic": true}), "allowPublicTraffic"),
        (
            json!({"maskRequestHost": "${PORT}-x.example.com"}),
            "maskRequestHost",
        ),
        (json!({"rules": {"a.com": [{}]}}), "rules"),
        (json!({"egressProxy": {"address": "p:1080"}}), "egressProxy"),
        (json!({"httpsPorts": [3000]}), "httpsPorts"),
        (json!({"surprise": 1}), "surprise"),
        (
            json!({"allowOut": ["a.com"], "denyOut": ["0.0.0.0/0"], "dnsServers": ["1.1.1.1"]}),
            "dnsServers",
        ),
    ] {
        let m = p(body.clone()).unwrap_err();
        assert!(
            m.contains(&format!("network.{field} is not supported")),
            "{body}: {m}"
        );
    }
    // dnsServers without domains does nothing on E2B either.
    assert!(p(json!({"allowOut": ["1.2.3.4"], "dnsServers": ["1.1.1.1"]})).is_ok());
    assert!(p(json!({"allowOut": "1.2.3.4"}))
        .unwrap_err()
        .contains("list of strings"));
    assert!(p(json!({"allowOut": [1]}))
        .unwrap_err()
        .contains("list of strings"));
    assert!(p(json!(["x"])).unwrap_err().contains("object"));
    let many = vec!["1.2.3.4"; 257];
    assert!(p(json!({ "allowOut": many }))
        .unwrap_err()
        .contains("at most 256"));
}

#[test]
fn update_bodies() {
    let u = |v: Value| update_spec(&v);
    assert_eq!(
        u(json!({})).unwrap(),
        public_internet(),
        "a full replace: no rules"
    );
    assert_eq!(
        u(json!({"allowOut": ["10.0.0.2:9090"], "denyOut": ["0.0.0.0/0"]})).unwrap(),
        spec(&["10.0.0.2:9090"], &[], false)
    );
    assert_eq!(
        u(json!({"allowOut": ["10.0.0.2"], "allow_internet_access": false})).unwrap(),
        spec(&["10.0.0.2"], &[], false)
    );
    assert_eq!(
        u(json!({"allow_internet_access": true})).unwrap(),
        public_internet()
    );
    assert!(u(json!({"allow_internet_access": "yes"})).is_err());
    let m = u(json!({"rules": {"a.com": []}})).unwrap_err();
    assert!(m.contains("network.rules"), "{m}");
    assert!(u(json!({"maskRequestHost": null, "allowPorts": []})).is_ok());
    assert!(u(json!({"denyIn": ["1.2.3.4"]}))
        .unwrap_err()
        .contains("denyIn"));
}

#[test]
fn the_detail_reads_the_policy_in_e2b_terms() {
    let d = to_e2b(&spec(&["10.0.0.2:8080"], &[], false));
    assert_eq!(
        d,
        json!({"allowOut": ["10.0.0.2:8080"], "denyOut": ["0.0.0.0/0"], "allowPublicTraffic": false})
    );
    let d = to_e2b(&public_internet());
    assert_eq!(d["allowOut"], json!([]));
    assert_eq!(d["denyOut"], json!([]));
    let d = to_e2b(&spec(&["0.0.0.0/0", "*"], &["1.1.1.1"], true));
    assert_eq!(d["denyOut"], json!(["1.1.1.1"]));
    // shoald's own deny-wins policy, read as E2B's allow-wins one.
    let d = to_e2b(&spec(&["10.0.0.0/30", "a.test"], &["10.0.0.1"], true));
    assert_eq!(d["allowOut"], json!(["10.0.0.0", "10.0.0.2/31", "a.test"]));
    assert_eq!(d["denyOut"], json!(["0.0.0.0/0"]));
    assert!(internet(Some(&public_internet())));
    assert!(!internet(Some(&spec(&["0.0.0.0/0:443"], &[], false))));
    assert!(!internet(None));
}

#[test]
fn cidrs_cover_ranges_exactly() {
    let s = |lo: [u8; 4], hi: [u8; 4]| -> Vec<String> {
        cidrs(u32::from(Ipv4Addr::from(lo)), u32::from(Ipv4Addr::from(hi)))
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    assert_eq!(s([0, 0, 0, 0], [255, 255, 255, 255]), ["0.0.0.0/0"]);
    assert_eq!(s([10, 0, 0, 1], [10, 0, 0, 1]), ["10.0.0.1/32"]);
    assert_eq!(
        s([10, 0, 0, 1], [10, 0, 0, 6]),
        ["10.0.0.1/32", "10.0.0.2/31", "10.0.0.4/31", "10.0.0.6/32"]
    );
    assert_eq!(
        s([255, 255, 255, 255], [255, 255, 255, 255]),
        ["255.255.255.255/32"]
    );
    assert_eq!(
        s([0, 0, 0, 0], [1, 2, 3, 3]),
        [
            "0.0.0.0/8",
            "1.0.0.0/15",
            "1.2.0.0/23",
            "1.2.2.0/24",
            "1.2.3.0/30"
        ]
    );
}
