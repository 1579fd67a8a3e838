//! What the host lacks for sandbox networking, as plain messages for
//! `shoal doctor` and for a create that asks for network.

use std::os::unix::fs::FileTypeExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::cmd;

/// The deadline of each check's command.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// Checks the host; each message names one missing piece and what to do.
/// Empty: networking can work. It creates and deletes one netns
/// (`shoalprobe-<pid>-<n>`) to check namespaces and nf_tables NAT for real
/// without touching the host's ruleset.
pub fn probe() -> Vec<String> {
    let mut missing = Vec::new();
    let ip_ok = cmd::run("ip", &["-V"], None, PROBE_TIMEOUT).is_ok();
    if !ip_ok {
        missing.push("the `ip` tool (iproute2) is missing: apt-get install iproute2".to_string());
    }
    let nft_ok = cmd::run("nft", &["-v"], None, PROBE_TIMEOUT).is_ok();
    if !nft_ok {
        missing.push("the `nft` tool is missing: apt-get install nftables".to_string());
    }
    match std::fs::metadata("/dev/net/tun") {
        Ok(m) if m.file_type().is_char_device() => {}
        Ok(_) => missing.push("/dev/net/tun is not a character device".to_string()),
        Err(e) => missing.push(format!(
            "/dev/net/tun: {e} (the kernel needs CONFIG_TUN; try modprobe tun)"
        )),
    }
    if !std::path::Path::new("/proc/self/ns/net").exists() {
        missing.push("the kernel has no network namespaces (CONFIG_NET_NS)".to_string());
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/net/ipv4/ip_forward")
    {
        missing.push(format!(
            "/proc/sys/net/ipv4/ip_forward is not writable ({e}): run shoald as root"
        ));
    }
    if ip_ok && nft_ok {
        if let Err(m) = netns_nat() {
            missing.push(m);
        }
        missing.extend(forward_drop());
    }
    missing
}

/// Makes a netns and loads a NAT table in it.
fn netns_nat() -> Result<(), String> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let ns = format!("shoalprobe-{}-{n}", std::process::id());
    cmd::run("ip", &["netns", "add", &ns], None, PROBE_TIMEOUT)
        .map_err(|e| format!("cannot create a network namespace: {e}"))?;
    let script = "table inet probe {\n\tchain post {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tmasquerade\n\t}\n\tchain pre {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tudp dport 53 dnat ip to 10.0.0.1:53\n\t}\n\tset s {\n\t\ttype ipv4_addr . inet_proto . inet_service; flags interval;\n\t}\n}\n";
    let r = cmd::run(
        "ip",
        &["netns", "exec", &ns, "nft", "-f", "-"],
        Some(script),
        PROBE_TIMEOUT,
    );
    let _ = cmd::run("ip", &["netns", "del", &ns], None, PROBE_TIMEOUT);
    r.map(drop).map_err(|e| {
        format!("nf_tables NAT or interval sets do not work (kernel modules nf_tables, nft_nat, nft_masq, nft_ct, nft_set_pipapo): {e}")
    })
}

/// A forward chain of another table that drops by default, without the
/// accepts [`crate::HostNet::setup`] inserts, drops slot traffic whatever
/// the shared table accepts (setup fixes it; this says it is not yet).
fn forward_drop() -> Vec<String> {
    match crate::forward::closed_chains(PROBE_TIMEOUT) {
        Ok(closed) => closed
            .into_iter()
            .map(|c| format!(
                "the forward chain {c} drops by default: shoald accepts slot traffic (shv*) in it when it starts; until then slots get no network"
            ))
            .collect(),
        Err(e) => vec![format!("cannot read the host's forward chains: {e}")],
    }
}

#[cfg(test)]
mod tests {
    /// This host (root, nftables installed) has everything: CI must too.
    #[test]
    fn this_host_has_what_networking_needs() {
        let missing = super::probe();
        assert!(missing.is_empty(), "missing: {missing:#?}");
    }
}
