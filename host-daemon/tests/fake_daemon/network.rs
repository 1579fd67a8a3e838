//! Sandboxes asking for a network (issue 18): a bad policy is a 400 with
//! hostnet's message, DNS without the daemon's forwarder a 400 naming the
//! flag; neither leaves a sandbox (nor touches the host's network), and a
//! sandbox without a network shows none. Networked sandboxes themselves
//! are tested on KVM (`tests/tests/net_daemon.rs`).

use crate::harness::*;
use shoal_client::api::{self, ErrorCode, NetworkSpec};

#[test]
fn network_requests_are_checked_and_refused_clearly() {
    let d = TestDaemon::start();
    let plain = d.create();
    assert_eq!((plain.network.clone(), plain.guest_addr), (None, None));

    let ask = |spec: NetworkSpec| {
        let req = api::CreateSandbox {
            image: Some("tiny".into()),
            network: Some(spec),
            ..Default::default()
        };
        refused(d.c.create(&req).expect_err("a create with a network"))
    };
    let (status, code, msg) = ask(NetworkSpec::allowing(["10.0.0.0/33"]));
    assert_eq!((status, code), (400, Some(ErrorCode::BadRequest)), "{msg}");
    assert!(msg.contains("10.0.0.0/33"), "{msg}");
    let (status, code, msg) = ask(NetworkSpec::allowing(["pypi.org", "10.1.2.0/24:443"]));
    assert_eq!((status, code), (400, Some(ErrorCode::BadRequest)), "{msg}");
    assert!(msg.contains("--net-dns"), "{msg}");

    // Only the plain sandbox exists, and it still works.
    let ids: Vec<String> =
        d.c.list(&api::ListFilter::default())
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
    assert_eq!(ids, [plain.id.as_str()]);
    assert_eq!(
        d.sh(&plain.id, "echo ok").unwrap(),
        (Some(0), "ok\n".into())
    );
    assert_eq!(d.get(&plain.id).network, None);
}
