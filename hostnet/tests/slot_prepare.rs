//! A slot pool that makes its slots with the policy last asked for
//! (root: real namespaces, veths, TAPs and nftables). Alone in its binary:
//! it checks that a slot still "has" its policy while the host's
//! addresses change, so no other test's links may come and go meanwhile.

mod common;

use common::*;
use shoal_hostnet::{EgressPolicy, SlotPool};
use std::time::Duration;

fn policy(allow: &[&str], deny: &[&str], dns: bool) -> EgressPolicy {
    EgressPolicy::parse(allow, deny, dns).unwrap()
}

#[test]
fn a_pool_makes_slots_with_the_policy_it_was_last_asked_for() {
    let lab = Lab::new(10);
    let pool = SlotPool::start(lab.net.clone(), 1).unwrap();
    let ready = || {
        let ok = eventually(Duration::from_secs(120), || pool.ready() == 1);
        assert!(ok, "{:?}", pool.last_error());
    };
    ready();
    let job = policy(&["198.51.100.0/24:443"], &[], false);
    pool.prepare(&job);
    // The slot made before has none: no match, the oldest is taken.
    let first = pool.take_wait_for(&job, T).unwrap();
    assert_eq!(first.policy(), EgressPolicy::default());
    assert!(!first.has_policy(&job).unwrap());
    assert!(first.has_policy(&EgressPolicy::default()).unwrap());
    ready();
    let second = pool.take_wait_for(&job, T).unwrap();
    assert_eq!(second.policy(), job);
    // Slots made since add host addresses, but inside the pool (denied
    // anyway): still the same sets.
    ready();
    assert!(second.has_policy(&job).unwrap(), "made with it");
    // It is in the slot's nftables, not only in its struct.
    let allow = shoal_hostnet::cmd::run(
        "ip",
        &[
            "netns",
            "exec",
            second.netns_name(),
            "nft",
            "list",
            "set",
            "inet",
            "shoal_slot",
            "allow",
        ],
        None,
        T,
    )
    .unwrap();
    assert!(allow.contains("198.51.100.0/24 . tcp . 443"), "{allow}");
    // A host address added since it was made is not yet denied to it: the
    // policy has to be applied again.
    // (A veth: this host's kernel has no dummy links.)
    let dummy = "shtextra10";
    ip_quiet(&["link", "del", dummy]);
    ip(&[
        "link",
        "add",
        dummy,
        "type",
        "veth",
        "peer",
        "name",
        "shtextra10p",
    ]);
    ip(&["addr", "add", "100.64.77.77/32", "dev", dummy]);
    let stale = second.has_policy(&job);
    second.set_policy(job.clone()).unwrap();
    let fresh = second.has_policy(&job);
    ip(&["link", "del", dummy]);
    assert!(!stale.unwrap(), "the host's addresses changed");
    assert!(fresh.unwrap());
    pool.shutdown().unwrap();
    first.remove().unwrap();
    second.remove().unwrap();
    assert_eq!(lab.leftovers(), Vec::<String>::new());
}
