//! Derived names and owners: the rules, then the API over real sockets.

use super::*;

#[test]
fn derived_names_are_recognised() {
    for n in [
        "tiny-1c-128m",
        "base-32c-65536m",
        "tiny-1c-128m-0123456789ab",
        "oci-0123456789ab-1c-128m",
        "oci-0123456789ab-2c-512m-0123456789ab",
        "tiny-1c-128m-net",
        "tiny-1c-128m-0123456789ab-net",
        "oci-0123456789ab-1c-128m-net",
    ] {
        assert!(derived_image(n).is_some(), "{n}");
    }
    for n in [
        "tiny",
        "tiny-1c",
        "tiny-c-128m",
        "tiny-1c-128",
        "tiny-1c-128m-xyz",
        "tiny-1c-128m-0123456789abc",
        "tiny-1c-128m-0123456789ab-x",
        "tiny-1c-128m-net-0123456789ab",
        "tiny-1c-128m-net-net",
        "tiny-1c-128m-0123456789ab-net-x",
        "other-1c-128m",
        "mytiny-1c-128m",
        "tiny-1c-128m.x",
        "oci-1c-128m",
        "oci-0123456789a-1c-128m",
        "oci-0123456789abc-1c-128m",
        "oci-0123456789ab",
        "oci-0123456789ab-1c-128m-x",
    ] {
        assert!(derived_image(n).is_none(), "{n}");
    }
    assert_eq!(derived_image("base-2c-256m"), Some("base"));
    assert_eq!(derived_image("oci-0123456789ab-1c-128m"), Some("oci"));
}

#[test]
fn only_the_daemon_and_exact_requests_get_derived_names() {
    let alice = Principal::Token("alice".into());
    let own = |n| owner_for_create(&alice, n, "tiny-1c-128m");
    assert_eq!(own("mine").unwrap(), "token:alice");
    assert_eq!(
        own("tiny-1c-128m").unwrap(),
        DAEMON,
        "what the daemon makes"
    );
    for n in ["tiny-2c-128m", "base-1c-128m", "tiny-1c-128m-0123456789ab"] {
        let e = own(n).unwrap_err();
        assert_eq!(e.status(), 403, "{n}: {e}");
        assert!(e.to_string().contains("reserved"), "{e}");
    }
    assert_eq!(
        check_snapshot_name("tiny-1c-128m").unwrap_err().status(),
        403
    );
    check_snapshot_name("snap-1").unwrap();
}

mod over_the_api {
    use crate::listen::tests::{Served, ALICE, BOB};
    use crate::listen::HttpLimits;
    use serde_json::Value;
    use std::time::Duration;

    fn json(b: &str) -> Value {
        serde_json::from_str(b).unwrap_or_else(|e| panic!("{e}: {b}"))
    }

    /// Waits until template `n`'s build has ended (it fails: no artifacts).
    fn built(s: &Served, n: &str) {
        let t0 = std::time::Instant::now();
        loop {
            let (st, b) = s.unix("GET", &format!("/v1/templates/{n}"), "");
            assert_eq!(st, 200, "{b}");
            if json(&b)["state"] != "building" {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "{n} still building");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn templates_are_their_makers_and_derived_names_the_daemons() {
        let s = Served::start(HttpLimits::default());
        let post = |tok, body: &str| s.tcp(Some(tok), "POST", "/v1/templates", body);
        let del = |tok: Option<&str>, n: &str| match tok {
            Some(t) => s.tcp(Some(t), "DELETE", &format!("/v1/templates/{n}"), ""),
            None => s.unix("DELETE", &format!("/v1/templates/{n}"), ""),
        };
        // Alice's template is hers: Bob can neither delete it nor drain
        // its pool; she can.
        let (st, b) = post(ALICE, r#"{"name":"kit","image":"tiny"}"#);
        assert_eq!(st, 202, "{b}");
        assert_eq!(json(&b)["owner"], "token:alice");
        built(&s, "kit");
        let (st, b) = del(Some(BOB), "kit");
        assert_eq!(st, 403, "{b}");
        assert!(b.contains("token:alice") && b.contains("forbidden"), "{b}");
        let (st, b) = s.tcp(Some(BOB), "DELETE", "/v1/pools/kit", "");
        assert_eq!(st, 403, "{b}");
        assert_eq!(del(Some(ALICE), "kit").0, 204);

        // Derived names: squatting one with other content is refused, for
        // templates and snapshots alike.
        for body in [
            r#"{"name":"tiny-1c-128m","image":"base"}"#,
            r#"{"name":"tiny-1c-128m","image":"tiny","memory_mib":256}"#,
            r#"{"name":"base-2c-512m","image":"tiny"}"#,
        ] {
            let (st, b) = post(BOB, body);
            assert_eq!(st, 403, "{body}: {b}");
            assert!(b.contains("reserved"), "{b}");
        }
        let (st, b) = s.tcp(
            Some(BOB),
            "POST",
            "/v1/sandboxes/0123456789ab/snapshot",
            r#"{"template":"tiny-1c-128m"}"#,
        );
        assert_eq!(st, 403, "{b}");
        // Asking for exactly what the daemon would make is fine, and it is
        // the daemon's: no tenant may delete it, an admin may.
        let (st, b) = post(BOB, r#"{"name":"tiny-1c-128m","image":"tiny"}"#);
        assert_eq!(st, 202, "{b}");
        assert_eq!(json(&b)["owner"], "daemon");
        built(&s, "tiny-1c-128m");
        assert_eq!(del(Some(BOB), "tiny-1c-128m").0, 403);
        assert_eq!(del(Some(ALICE), "tiny-1c-128m").0, 403);
        let (st, b) = del(None, "tiny-1c-128m");
        assert_eq!(st, 204, "root on the Unix socket is an admin: {b}");
        // Unix socket callers own what they make, by uid.
        let (st, b) = s.unix(
            "POST",
            "/v1/templates",
            r#"{"name":"local","image":"tiny"}"#,
        );
        assert_eq!(st, 202, "{b}");
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(json(&b)["owner"], format!("uid:{me}"));
        built(&s, "local");
        assert_eq!(del(Some(ALICE), "local").0, 403);
        assert_eq!(del(None, "local").0, 204);
    }
}
