use super::*;

fn one(s: &str) -> Result<Target, EntryError> {
    s.parse()
}

#[test]
fn network_entries_parse_with_and_without_ports() {
    let (n, p) = one("10.0.0.0/8:443").unwrap().as_v4().unwrap();
    assert_eq!(
        (n.to_string(), p.map(|p| (p.lo(), p.hi()))),
        ("10.0.0.0/8".into(), Some((443, 443)))
    );
    let (n, p) = one("1.2.3.4:8000-8100").unwrap().as_v4().unwrap();
    assert_eq!(
        (n.prefix_len(), p.map(|p| (p.lo(), p.hi()))),
        (32, Some((8000, 8100)))
    );
    let (n, p) = one("198.51.100.0/24").unwrap().as_v4().unwrap();
    assert_eq!((n.prefix_len(), p), (24, None));
    assert_eq!(one("1.2.3.4").unwrap().as_v4().unwrap().0.prefix_len(), 32);
    match one("[2001:db8::1]:443").unwrap() {
        Target::Net {
            net: IpNet::V6(n),
            ports: Some(p),
        } => {
            assert_eq!((n.prefix_len(), p.lo()), (128, 443))
        }
        t => panic!("{t:?}"),
    }
    match one("2001:db8::/32").unwrap() {
        Target::Net {
            net: IpNet::V6(n),
            ports: None,
        } => assert_eq!(n.prefix_len(), 32),
        t => panic!("{t:?}"),
    }
    match one("[2001:db8::/32]:1-1024").unwrap() {
        Target::Net {
            net: IpNet::V6(n),
            ports: Some(p),
        } => {
            assert_eq!((n.prefix_len(), p.lo(), p.hi()), (32, 1, 1024))
        }
        t => panic!("{t:?}"),
    }
    // v4-mapped IPv6 has dots and colons: still IPv6.
    assert!(matches!(
        one("::ffff:1.2.3.4"),
        Ok(Target::Net {
            net: IpNet::V6(_),
            ..
        })
    ));
}

#[test]
fn bad_entries_say_why() {
    type Check = fn(&EntryError) -> bool;
    let cases: &[(&str, Check)] = &[
        ("10.0.0.0/33", |e| {
            matches!(e, EntryError::Addr(AddrError::BadPrefix(_)))
        }),
        ("10.0.0.1/8", |e| {
            matches!(e, EntryError::Addr(AddrError::HostBits { .. }))
        }),
        ("1.2.3.256", |e| {
            matches!(e, EntryError::Addr(AddrError::BadAddr(_)))
        }),
        ("1.2.3.4:0", |e| matches!(e, EntryError::Port(_))),
        ("1.2.3.4:90-80", |e| matches!(e, EntryError::Port(_))),
        ("1.2.3.4:65536", |e| matches!(e, EntryError::Port(_))),
        ("1.2.3.4:", |e| matches!(e, EntryError::Port(_))),
        ("1.2.3.4:+5", |e| matches!(e, EntryError::Port(_))),
        ("[2001:db8::1]", |e| matches!(e, EntryError::Addr(_))),
        ("[2001:db8::1]:0", |e| matches!(e, EntryError::Port(_))),
        ("2001:db8::1:", |e| matches!(e, EntryError::Addr(_))),
        ("", |e| matches!(e, EntryError::Empty)),
        ("example.com:443", |e| {
            *e == EntryError::Domain("a domain entry takes no port")
        }),
        ("*.pypi.org:443", |e| matches!(e, EntryError::Domain(_))),
        ("exa mple.com", |e| matches!(e, EntryError::Domain(_))),
        ("-bad.com", |e| matches!(e, EntryError::Domain(_))),
        ("bad-.com", |e| matches!(e, EntryError::Domain(_))),
        ("a..com", |e| matches!(e, EntryError::Domain(_))),
        ("*:53", |e| matches!(e, EntryError::Domain(_))),
        ("*.", |e| matches!(e, EntryError::Domain(_))),
        ("a.*.com", |e| matches!(e, EntryError::Domain(_))),
        ("**.com", |e| matches!(e, EntryError::Domain(_))),
        ("xn--_x.com", |e| matches!(e, EntryError::Domain(_))),
    ];
    for (s, ok) in cases {
        let e = one(s).expect_err(s);
        assert!(ok(&e), "{s:?}: {e:?}");
        assert!(!e.to_string().is_empty());
    }
    let long_label = format!("{}.com", "a".repeat(64));
    assert!(matches!(one(&long_label), Err(EntryError::Domain(_))));
    let long_name = vec!["a".repeat(63); 4].join(".");
    assert!(matches!(one(&long_name), Err(EntryError::Domain(_))));
    assert!(matches!(one(&"a".repeat(400)), Err(EntryError::TooLong)));
}

#[test]
fn lists_are_capped_and_errors_name_the_entry() {
    let many: Vec<String> = (0..=MAX_ENTRIES)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect();
    assert!(matches!(
        EgressPolicy::parse(&many, &[], false),
        Err(PolicyError::TooMany { list: "allow_out", count }) if count == MAX_ENTRIES + 1
    ));
    assert!(EgressPolicy::parse(&many[..MAX_ENTRIES], &many[..MAX_ENTRIES], false).is_ok());
    let e = EgressPolicy::parse(&["1.2.3.4"], &["nope..x"], false).unwrap_err();
    assert!(
        e.to_string().starts_with("deny_out entry \"nope..x\""),
        "{e}"
    );
}

#[test]
fn json_round_trips_and_refuses_bad_bodies() {
    let p: EgressPolicy = serde_json::from_str(
        r#"{"allow_out": ["10.0.0.0/8:443", "[2001:db8::1]:80", "Example.COM.", "*.pypi.org"],
            "deny_out": ["10.1.0.0/16"], "allow_dns": true}"#,
    )
    .unwrap();
    assert!(p.allow_dns());
    let back = serde_json::to_value(&p).unwrap();
    assert_eq!(
        back,
        serde_json::json!({"allow_out": ["10.0.0.0/8:443", "[2001:db8::1/128]:80", "example.com", "*.pypi.org"],
                           "deny_out": ["10.1.0.0/16"], "allow_dns": true})
    );
    let again: EgressPolicy = serde_json::from_value(back).unwrap();
    assert_eq!(again, p);
    let empty: EgressPolicy = serde_json::from_str("{}").unwrap();
    assert_eq!(empty, EgressPolicy::default());
    assert!(serde_json::from_str::<EgressPolicy>(r#"{"allow_out": ["1.2.3.4:0"]}"#).is_err());
    assert!(serde_json::from_str::<EgressPolicy>(r#"{"allow": []}"#).is_err());
}

#[test]
fn domain_matching() {
    let p = EgressPolicy::parse(
        &["example.com", "*.pypi.org", "*.corp.test", "10.0.0.0/8"],
        &["secret.corp.test", "*.internal.corp.test"],
        true,
    )
    .unwrap();
    for yes in [
        "example.com",
        "EXAMPLE.com.",
        "files.pypi.org",
        "a.b.pypi.org",
        "x.corp.test",
    ] {
        assert!(p.domain_allowed(yes), "{yes}");
    }
    for no in [
        "www.example.com",      // exact only
        "pypi.org",             // strictly below
        "evilpypi.org",         // not a label boundary
        "pypi.org.evil.com",    // suffix elsewhere
        "secret.corp.test",     // denied exactly
        "SECRET.corp.test.",    // denied, any case
        "a.internal.corp.test", // denied by wildcard
        "",
        ".",
        "bad..name",
        "10.0.0.1",
    ] {
        assert!(!p.domain_allowed(no), "{no}");
    }
    // The denied wildcard's own name is not below itself: allowed by *.corp.test.
    assert!(p.domain_allowed("internal.corp.test"));
}

#[test]
fn a_star_allows_every_name_but_the_denied() {
    let p = EgressPolicy::parse(&["*", "0.0.0.0/0"], &["*.corp.test"], true).unwrap();
    for yes in ["example.com", "a.b.c.pypi.org", "corp.test", "X.ORG."] {
        assert!(p.domain_allowed(yes), "{yes}");
    }
    for no in ["secret.corp.test", "", "bad..name"] {
        assert!(!p.domain_allowed(no), "{no}");
    }
    let back = serde_json::to_value(&p).unwrap();
    assert_eq!(back["allow_out"], serde_json::json!(["*", "0.0.0.0/0"]));
    let none = EgressPolicy::parse(&["example.com"], &["*"], true).unwrap();
    assert!(!none.domain_allowed("example.com"));
}

#[test]
fn same_domains_ignores_networks_and_order() {
    let a = EgressPolicy::parse(&["a.com", "*.b.com", "1.2.3.4"], &[], false).unwrap();
    let b = EgressPolicy::parse(&["*.b.com", "a.com", "5.6.7.8:80"], &[], true).unwrap();
    let c = EgressPolicy::parse(&["a.com"], &[], false).unwrap();
    let d = EgressPolicy::parse(&["a.com", "*.b.com"], &["x.a.com"], false).unwrap();
    assert!(a.same_domains(&b));
    assert!(!a.same_domains(&c));
    assert!(!a.same_domains(&d));
}
