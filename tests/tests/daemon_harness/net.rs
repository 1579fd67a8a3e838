//! The network side of the daemon tests: each networked test gives its
//! daemon an address pool and slot and link name prefixes of its own (so
//! no test touches another's slots), and looks at its slots by prefix.

// Each test binary includes the harness; only the networked ones use this.
#![allow(dead_code)]

use shoal_test_support::ip;

/// `--net-pool POOL --net-slots 2 --net-netns-prefix PREFIX
/// --net-link-prefix LINK_PREFIX`: a test daemon's own pool (two slots
/// made ahead) and names.
pub fn net_args<'a>(pool: &'a str, prefix: &'a str, link_prefix: &'a str) -> [&'a str; 8] {
    [
        "--net-pool",
        pool,
        "--net-slots",
        "2",
        "--net-netns-prefix",
        prefix,
        "--net-link-prefix",
        link_prefix,
    ]
}

/// Every named netns of the host.
pub fn netns_list() -> Vec<String> {
    ip(&["netns", "list"])
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The slots (netns) named with `prefix`.
pub fn slots_of(prefix: &str) -> Vec<String> {
    netns_list()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect()
}
