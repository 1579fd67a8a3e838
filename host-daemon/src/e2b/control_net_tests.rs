//! E2B's network fields on create, detail and `PUT .../network`: what
//! they map to and what is refused. Nothing here reaches a VMM or the
//! host's network: creates stop at the mapping ([`super::to_create`]),
//! sandboxes are rows put in the database.

use super::tests::{daemon, routes, send, KEY};
use super::{to_create, w};
use crate::db::{SandboxNet, SandboxRow, State};
use serde_json::json;
use shoal_api::{CreateSandbox, NetworkSpec, RootRequest};
use std::collections::BTreeMap;

fn new(v: serde_json::Value) -> w::NewSandbox {
    serde_json::from_value(v).unwrap()
}

fn create(d: &crate::Daemon, v: serde_json::Value) -> Result<CreateSandbox, String> {
    to_create(d, new(v)).map_err(|e| {
        let r = e.0;
        format!("{} {:?}", r.status(), r.headers())
    })
}

fn spec(allow: &[&str], deny: &[&str], dns: bool) -> NetworkSpec {
    NetworkSpec {
        allow_out: allow.iter().map(|s| s.to_string()).collect(),
        deny_out: deny.iter().map(|s| s.to_string()).collect(),
        allow_dns: dns,
    }
}

fn template(name: &str, source: &str, net: bool) -> crate::db::TemplateRow {
    crate::db::TemplateRow {
        name: name.into(),
        source: source.into(),
        kind: shoal_runtime::backend::Kind::MicroVm,
        vcpus: 1,
        memory_mib: 256,
        dir: "/nonexistent".into(),
        state: shoal_api::TemplateState::Ready,
        error: None,
        created_at: 1.0,
        owned: true,
        owner: None,
        image: None,
        net,
        disk: None,
        root: RootRequest {
            layers: vec!["fncall-python".into()],
            ..RootRequest::default()
        },
    }
}

fn row(id: &str, state: State, net: Option<NetworkSpec>) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        template: "base-1c-256m-net".into(),
        kind: shoal_runtime::backend::Kind::MicroVm,
        state,
        vcpus: 1,
        memory_mib: 256,
        pid: None,
        backend_state: None,
        dir: format!("/nonexistent/{id}").into(),
        created_at: crate::db::now(),
        last_active: crate::db::now(),
        ttl_s: 0,
        idle_timeout_s: 0,
        metadata: BTreeMap::new(),
        env: BTreeMap::new(),
        needs_post_restore: false,
        keep_running: true,
        pause_at_ttl: false,
        priority: shoal_api::Priority::Latency,
        error: None,
        net: net.map(|policy| SandboxNet {
            slot: 3,
            guest_addr: "10.213.0.26".parse().unwrap(),
            policy,
        }),
    }
}

#[tokio::test]
async fn rules_make_a_networked_create_of_the_templates_image() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    d.db(|db| db.put_template(&template("base", "image:base", false)))
        .unwrap();
    d.db(|db| db.put_template(&template("snap", "sandbox:0123456789ab", false)))
        .unwrap();
    d.db(|db| db.put_template(&template("web-net", "image:base", true)))
        .unwrap();
    let rules = json!({"allowOut": ["10.218.0.2:8080"], "denyOut": ["0.0.0.0/0"]});
    // The template has no network device: its image, shape and layers.
    let c = create(&d, json!({"templateID": "base", "network": rules})).unwrap();
    assert_eq!(c.template, None);
    assert_eq!(c.image.as_deref(), Some("base"));
    assert_eq!((c.vcpus, c.memory_mib), (Some(1), Some(256)));
    assert_eq!(c.layers, ["fncall-python"]);
    assert_eq!(c.network, Some(spec(&["10.218.0.2:8080"], &[], false)));
    assert!(c.keep_running && c.ttl_s == 300);
    // A template with the device is used as it is.
    let c = create(&d, json!({"templateID": "web-net", "network": rules})).unwrap();
    assert_eq!(c.template.as_deref(), Some("web-net"));
    // An image's name: that image, networked.
    let c = create(&d, json!({"templateID": "tiny", "network": rules})).unwrap();
    assert_eq!((c.image.as_deref(), c.vcpus), (Some("tiny"), None));
    assert!(c.network.is_some());
    // A snapshot cannot get a network device.
    let e = to_create(&d, new(json!({"templateID": "snap", "network": rules}))).unwrap_err();
    assert_eq!(e.0.status(), 400);
    // No rules: no network, as before (the template as it is).
    for body in [
        json!({"templateID": "base"}),
        json!({"templateID": "base", "allow_internet_access": true}),
        json!({"templateID": "base", "allow_internet_access": false}),
        json!({"templateID": "base", "network": {"allowPublicTraffic": false}}),
    ] {
        let c = create(&d, body.clone()).unwrap();
        assert_eq!(
            (c.template.as_deref(), &c.network),
            (Some("base"), &None),
            "{body}"
        );
    }
    // allow_internet_access: false keeps only allowOut, as on E2B.
    let c = create(
        &d,
        json!({"templateID": "base", "allow_internet_access": false,
               "network": {"allowOut": ["10.218.0.2"]}}),
    )
    .unwrap();
    assert_eq!(c.network, Some(spec(&["10.218.0.2"], &[], false)));
}

#[tokio::test]
async fn e2b_internet_gives_creates_without_rules_the_internet() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::Config::for_tests(dir.path(), 1024, 1, 1);
    cfg.net.e2b_internet = true;
    let d = crate::Daemon::open(
        cfg,
        std::sync::Arc::new(shoal_runtime::backend::microvm::MicroVm::new(
            "/nonexistent/shoal-vmm",
            shoal_images::artifacts::Layout::at(dir.path().join("artifacts")),
        )),
    )
    .unwrap();
    let internet = spec(&["0.0.0.0/0", "*"], &[], true);
    for body in [
        json!({"templateID": "base", "allow_internet_access": true}),
        json!({"templateID": "base"}),
    ] {
        let c = create(&d, body.clone()).unwrap();
        assert_eq!(c.network.as_ref(), Some(&internet), "{body}");
        assert_eq!(c.image.as_deref(), Some("base"));
    }
    let c = create(
        &d,
        json!({"templateID": "base", "allow_internet_access": false}),
    )
    .unwrap();
    assert_eq!(c.network, None);
    let c = create(
        &d,
        json!({"templateID": "base", "network": {"allowOut": ["10.0.0.1"], "denyOut": ["0.0.0.0/0"]}}),
    )
    .unwrap();
    assert_eq!(c.network, Some(spec(&["10.0.0.1"], &[], false)));
}

#[tokio::test]
async fn without_a_dns_forwarder_the_internet_has_no_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::Config::for_tests(dir.path(), 1024, 1, 1);
    cfg.net.dns = crate::net_dns::DnsListen::Off;
    let d = crate::Daemon::open(
        cfg,
        std::sync::Arc::new(shoal_runtime::backend::microvm::MicroVm::new(
            "/nonexistent/shoal-vmm",
            shoal_images::artifacts::Layout::at(dir.path().join("artifacts")),
        )),
    )
    .unwrap();
    let c = create(
        &d,
        json!({"templateID": "tiny", "network": {"denyOut": ["1.1.1.1"]}}),
    )
    .unwrap();
    assert_eq!(
        c.network,
        Some(spec(&["0.0.0.0/0"], &["1.1.1.1"], false)),
        "addresses still work"
    );
    // Domains need the forwarder: left for the create to refuse (400).
    let c = create(
        &d,
        json!({"templateID": "tiny", "network": {"allowOut": ["a.test"], "denyOut": ["0.0.0.0/0"]}}),
    )
    .unwrap();
    assert_eq!(c.network, Some(spec(&["a.test"], &[], true)));
}

#[tokio::test]
async fn detail_and_update_of_networked_and_plain_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let r = routes(d.clone());
    let k = [("x-api-key", KEY)];
    let white = spec(&["10.218.0.2:8080"], &[], false);
    d.db(|db| db.put_sandbox(&row("aaaaaaaaaaaa", State::Paused, Some(white))))
        .unwrap();
    d.db(|db| {
        db.put_sandbox(&row(
            "bbbbbbbbbbbb",
            State::Paused,
            Some(spec(&["0.0.0.0/0", "*"], &["1.1.1.1"], true)),
        ))
    })
    .unwrap();
    d.db(|db| db.put_sandbox(&row("cccccccccccc", State::Paused, None)))
        .unwrap();
    let (s, v, _) = send(&r, "GET", "/sandboxes/aaaaaaaaaaaa", &k, "").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["allowInternetAccess"], false, "{v}");
    assert_eq!(
        v["network"],
        json!({"allowOut": ["10.218.0.2:8080"], "denyOut": ["0.0.0.0/0"], "allowPublicTraffic": false})
    );
    let (_, v, _) = send(&r, "GET", "/sandboxes/bbbbbbbbbbbb", &k, "").await;
    assert_eq!(v["allowInternetAccess"], true, "{v}");
    assert_eq!(v["network"]["denyOut"], json!(["1.1.1.1"]), "{v}");
    let (_, v, _) = send(&r, "GET", "/sandboxes/cccccccccccc", &k, "").await;
    assert_eq!(v["allowInternetAccess"], false, "{v}");
    assert!(v.get("network").is_none(), "{v}");
    // Listed the same way.
    let (_, v, _) = send(&r, "GET", "/v2/sandboxes", &k, "").await;
    assert_eq!(v.as_array().unwrap().len(), 3, "{v}");

    let put = |id: &'static str, body: &'static str| {
        let r = r.clone();
        async move {
            let (s, v, _) = send(&r, "PUT", &format!("/sandboxes/{id}/network"), &k, body).await;
            (s, v["message"].as_str().unwrap_or_default().to_string())
        }
    };
    let body = r#"{"allowOut":["10.218.0.2:9090"],"denyOut":["0.0.0.0/0"]}"#;
    let (s, m) = put("0123456789ab", body).await;
    assert_eq!(s, 404, "{m}");
    let (s, m) = put("cccccccccccc", body).await;
    assert_eq!(s, 409, "{m}");
    assert!(m.contains("has no network"), "{m}");
    let (s, m) = put("aaaaaaaaaaaa", body).await;
    assert_eq!(s, 409, "{m}");
    assert!(m.contains("paused"), "{m}");
    let (s, m) = put("aaaaaaaaaaaa", r#"{"rules":{"a.test":[{}]}}"#).await;
    assert_eq!(s, 400, "{m}");
    assert!(m.contains("network.rules"), "{m}");
    let (s, m) = put("aaaaaaaaaaaa", r#"{"denyOut":["a.test"]}"#).await;
    assert_eq!(s, 400, "{m}");
    assert!(m.contains("denyOut"), "{m}");
}
