//! nftables scripts, rendered by pure functions: the host's shared table,
//! each slot's table, a policy update and a forwarder's address; and the
//! reader of a slot's counters.
//!
//! A slot's table (`inet shoal_slot`, in the slot's netns) checks every
//! packet the guest sends, new or established, against the policy sets:
//! a destination removed from the policy stops at the guest's next packet
//! (its TCP connection stalls: no conntrack flush is needed, and none of
//! the `conntrack` tool). Replies to the guest pass on conntrack state.
//! Every policy-dependent part lives in a set, so a policy change is one
//! transaction that flushes and refills the sets: rules and counters stay.
//!
//! The slot's netns itself (where the jailed VMM runs) sends nothing new
//! but on loopback (`output` drops it): a VMM taken over by its guest
//! gains no network by it. Its `input` drops all that comes from tap0
//! (DNS to the gateway is DNAT'ed before, so it is forwarded, not input).
//!
//! Order of the chain for what the guest sends (`guest`), first match wins:
//! 1. anti-spoof: source MAC and IPv4 address must be the guest's; no IPv6;
//! 2. DNS to the forwarder, only as DNAT'ed from the gateway's port 53
//!    while DNS is allowed (the `dns_gw` set holds the gateway then);
//! 3. every other TCP/UDP to port 53 or 853 dropped;
//! 4. `deny_out`;
//! 5. `allow_out` entries inside an always-denied range (named
//!    explicitly: `169.254.169.254:80`);
//! 6. always denied (`blocked`): the host's own addresses, loopback,
//!    0.0.0.0/8, link-local, the whole slot pool, multicast, 240.0.0.0/4
//!    and broadcast;
//! 7. `allow_out` (TCP/UDP by address, protocol and port; ICMP by
//!    address), then the forwarder's addresses (`dns`, with timeouts);
//! 8. drop.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use crate::addr::{merge_ranges, Ipv4Net, SlotAddrs};
use crate::policy::{EgressPolicy, Target};

/// The host's table (host netns).
pub const HOST_TABLE: &str = "shoal";
/// Each slot's table (in the slot's netns).
pub const SLOT_TABLE: &str = "shoal_slot";
/// The guest-facing interface in a slot's netns.
pub const GUEST_IF: &str = "tap0";
/// Host-side veth names start with this (the host table matches it).
pub const HOST_LINK_PREFIX: &str = "shv";
/// The most elements a policy may render to in one set.
pub const MAX_SET_ELEMENTS: usize = 8192;
/// The most addresses the forwarder may add to one slot at a time.
pub const MAX_DNS_ADDRS: usize = 4096;
/// The longest TTL [`render_allow_addr`] takes.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);

/// Ranges no slot reaches unless `allow_out` names a network inside them,
/// besides the host's own addresses and the pool.
pub const ALWAYS_DENIED: &[&str] = &[
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
];

/// A policy that cannot be rendered.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum NftError {
    /// It splits into more set elements than [`MAX_SET_ELEMENTS`].
    #[error("the policy renders to {0} elements of one set; at most {MAX_SET_ELEMENTS}")]
    TooComplex(usize),
    /// DNS is allowed but no forwarder is configured.
    #[error("allow_dns needs a DNS forwarder address in the network configuration")]
    NoForwarder,
    /// A TTL of 0 or over [`MAX_TTL`].
    #[error("TTL {0:?} is outside 1 s ..= {MAX_TTL:?}")]
    BadTtl(Duration),
}

/// `(address range, port range)` of TCP/UDP rules.
type Rect = ((u32, u32), (u16, u16));

/// The contents of a slot's policy sets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicySets {
    allow: Vec<Rect>,
    allow_icmp: Vec<(u32, u32)>,
    except: Vec<Rect>,
    except_icmp: Vec<(u32, u32)>,
    deny: Vec<Rect>,
    deny_icmp: Vec<(u32, u32)>,
    blocked: Vec<(u32, u32)>,
    dns_gw: bool,
}

impl PolicySets {
    /// The sets for `policy`, with `blocked` the always-denied ranges (the
    /// host's addresses, the pool and [`ALWAYS_DENIED`]).
    pub fn new(policy: &EgressPolicy, blocked: &[Ipv4Net]) -> Result<Self, NftError> {
        let blocked = merge_ranges(blocked.iter().map(Ipv4Net::range).collect());
        let inside_blocked = |r: (u32, u32)| blocked.iter().any(|b| b.0 <= r.0 && r.1 <= b.1);
        let mut s = PolicySets {
            dns_gw: policy.allow_dns(),
            ..Default::default()
        };
        let (mut allow, mut except, mut deny) = (vec![], vec![], vec![]);
        let (mut allow_icmp, mut except_icmp, mut deny_icmp) = (vec![], vec![], vec![]);
        for (net, ports) in policy.allow_out().iter().filter_map(Target::as_v4) {
            let r = net.range();
            let p = ports.map_or((0, u16::MAX), |p| (p.lo(), p.hi()));
            if inside_blocked(r) {
                except.push((r, p));
                except_icmp.push(r);
            } else {
                allow.push((r, p));
                allow_icmp.push(r);
            }
        }
        for (net, ports) in policy.deny_out().iter().filter_map(Target::as_v4) {
            let r = net.range();
            match ports {
                Some(p) => deny.push((r, (p.lo(), p.hi()))),
                None => {
                    deny.push((r, (0, u16::MAX)));
                    deny_icmp.push(r);
                }
            }
        }
        s.allow = disjoint(allow)?;
        s.except = disjoint(except)?;
        s.deny = disjoint(deny)?;
        s.allow_icmp = merge_ranges(allow_icmp);
        s.except_icmp = merge_ranges(except_icmp);
        s.deny_icmp = merge_ranges(deny_icmp);
        s.blocked = blocked;
        Ok(s)
    }
}

/// An address range and the merged port ranges open on it.
type Segment = ((u32, u32), Vec<(u32, u32)>);

/// Splits overlapping rectangles into disjoint ones covering the same
/// union (nftables refuses overlapping elements of an interval set).
fn disjoint(rects: Vec<Rect>) -> Result<Vec<Rect>, NftError> {
    let mut cuts: Vec<u64> = rects
        .iter()
        .flat_map(|((lo, hi), _)| [u64::from(*lo), u64::from(*hi) + 1])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    // (address range, merged port ranges), adjacent equal ones joined.
    let mut segs: Vec<Segment> = Vec::new();
    for w in cuts.windows(2) {
        let (Ok(lo), Ok(hi)) = (u32::try_from(w[0]), u32::try_from(w[1] - 1)) else {
            continue;
        };
        let ports = merge_ranges(
            rects
                .iter()
                .filter(|((a, b), _)| *a <= lo && lo <= *b)
                .map(|(_, (p, q))| (u32::from(*p), u32::from(*q)))
                .collect(),
        );
        if ports.is_empty() {
            continue;
        }
        match segs.last_mut() {
            Some(((_, prev_hi), prev)) if *prev == ports && prev_hi.checked_add(1) == Some(lo) => {
                *prev_hi = hi
            }
            _ => segs.push(((lo, hi), ports)),
        }
    }
    let mut out = Vec::new();
    for (a, ports) in segs {
        for (p, q) in ports {
            // merge_ranges keeps values within the u16 inputs.
            let (p, q) = (
                u16::try_from(p).unwrap_or(u16::MAX),
                u16::try_from(q).unwrap_or(u16::MAX),
            );
            out.push((a, (p, q)));
        }
    }
    if out.len() * 2 > MAX_SET_ELEMENTS {
        return Err(NftError::TooComplex(out.len() * 2));
    }
    Ok(out)
}

fn addr_range((lo, hi): (u32, u32)) -> String {
    if lo == hi {
        Ipv4Addr::from(lo).to_string()
    } else {
        format!("{}-{}", Ipv4Addr::from(lo), Ipv4Addr::from(hi))
    }
}

fn port_range((lo, hi): (u16, u16)) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

fn add_elements(out: &mut String, set: &str, elems: &[String]) {
    if !elems.is_empty() {
        let _ = writeln!(
            out,
            "add element inet {SLOT_TABLE} {set} {{ {} }}",
            elems.join(", ")
        );
    }
}

fn rects(r: &[Rect]) -> Vec<String> {
    let mut v = Vec::with_capacity(r.len() * 2);
    for proto in ["tcp", "udp"] {
        for (a, p) in r {
            v.push(format!("{} . {proto} . {}", addr_range(*a), port_range(*p)));
        }
    }
    v
}

fn ranges(r: &[(u32, u32)]) -> Vec<String> {
    r.iter().map(|x| addr_range(*x)).collect()
}

/// The sets' names, in the order they are filled.
const POLICY_SETS: &[&str] = &[
    "allow",
    "allow_icmp",
    "except",
    "except_icmp",
    "deny",
    "deny_icmp",
    "blocked",
    "dns_gw",
];

/// One transaction that empties the policy sets and fills them from
/// `sets`; `flush_dns` also drops the forwarder's addresses.
pub fn render_policy_update(sets: &PolicySets, gateway: Ipv4Addr, flush_dns: bool) -> String {
    let mut out = String::new();
    for set in POLICY_SETS {
        let _ = writeln!(out, "flush set inet {SLOT_TABLE} {set}");
    }
    if flush_dns {
        let _ = writeln!(out, "flush set inet {SLOT_TABLE} dns");
    }
    add_elements(&mut out, "allow", &rects(&sets.allow));
    add_elements(&mut out, "allow_icmp", &ranges(&sets.allow_icmp));
    add_elements(&mut out, "except", &rects(&sets.except));
    add_elements(&mut out, "except_icmp", &ranges(&sets.except_icmp));
    add_elements(&mut out, "deny", &rects(&sets.deny));
    add_elements(&mut out, "deny_icmp", &ranges(&sets.deny_icmp));
    add_elements(&mut out, "blocked", &ranges(&sets.blocked));
    if sets.dns_gw {
        add_elements(&mut out, "dns_gw", &[gateway.to_string()]);
    }
    out
}

/// A slot's whole table with its sets filled: applied once, at creation,
/// in the slot's netns (replacing any table of that name).
pub fn render_slot(
    addrs: &SlotAddrs,
    forwarder: Option<SocketAddrV4>,
    sets: &PolicySets,
) -> Result<String, NftError> {
    if sets.dns_gw && forwarder.is_none() {
        return Err(NftError::NoForwarder);
    }
    let t = SLOT_TABLE;
    let g = GUEST_IF;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "table inet {t} {{}}\ndelete table inet {t}\ntable inet {t} {{"
    );
    for c in ["from_guest", "to_guest", "dropped"] {
        let _ = writeln!(s, "\tcounter {c} {{}}");
    }
    for set in ["allow", "except", "deny"] {
        let _ = writeln!(
            s,
            "\tset {set} {{ type ipv4_addr . inet_proto . inet_service; flags interval; size {MAX_SET_ELEMENTS}; }}"
        );
    }
    for set in ["allow_icmp", "except_icmp", "deny_icmp", "blocked"] {
        let _ = writeln!(
            s,
            "\tset {set} {{ type ipv4_addr; flags interval; size {MAX_SET_ELEMENTS}; }}"
        );
    }
    let _ = writeln!(
        s,
        "\tset dns {{ type ipv4_addr; flags timeout; size {MAX_DNS_ADDRS}; }}\n\
         \tset dns_gw {{ type ipv4_addr; size 1; }}"
    );
    let drop = "counter name dropped drop";
    let _ = writeln!(
        s,
        "\tchain prerouting {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;"
    );
    if let Some(f) = forwarder {
        let _ = writeln!(
            s,
            "\t\tiifname \"{g}\" ip daddr @dns_gw udp dport 53 dnat ip to {f}"
        );
    }
    let _ = writeln!(
        s,
        "\t}}\n\
         \tchain input {{\n\t\ttype filter hook input priority filter; policy accept;\n\
         \t\tiifname \"{g}\" {drop}\n\t}}\n\
         \tchain output {{\n\t\ttype filter hook output priority filter; policy drop;\n\
         \t\toifname \"lo\" accept\n\
         \t\tct state established,related accept\n\t}}\n\
         \tchain forward {{\n\t\ttype filter hook forward priority filter; policy drop;\n\
         \t\tiifname \"{g}\" jump guest\n\
         \t\toifname \"{g}\" ct state established,related counter name to_guest accept\n\t}}\n\
         \tchain guest {{\n\
         \t\tcounter name from_guest\n\
         \t\tether saddr != {mac} {drop}\n\
         \t\tmeta nfproto != ipv4 {drop}\n\
         \t\tip saddr != {ip} {drop}",
        mac = addrs.guest_mac,
        ip = addrs.guest,
    );
    if let Some(f) = forwarder {
        let _ = writeln!(
            s,
            "\t\tct status dnat ct original ip daddr @dns_gw ip daddr {} udp dport {} accept",
            f.ip(),
            f.port()
        );
    }
    let _ = writeln!(
        s,
        "\t\tudp dport {{ 53, 853 }} {drop}\n\
         \t\ttcp dport {{ 53, 853 }} {drop}\n\
         \t\tip daddr . meta l4proto . th dport @deny {drop}\n\
         \t\tmeta l4proto icmp ip daddr @deny_icmp {drop}\n\
         \t\tip daddr . meta l4proto . th dport @except accept\n\
         \t\tmeta l4proto icmp ip daddr @except_icmp accept\n\
         \t\tip daddr @blocked {drop}\n\
         \t\tip daddr . meta l4proto . th dport @allow accept\n\
         \t\tmeta l4proto icmp ip daddr @allow_icmp accept\n\
         \t\tmeta l4proto {{ tcp, udp, icmp }} ip daddr @dns accept\n\
         \t\t{drop}\n\t}}\n}}"
    );
    s.push_str(&render_policy_update(sets, addrs.gateway, false));
    Ok(s)
}

/// Adds `ip` to a slot's forwarder set for `ttl` (replacing an earlier
/// timeout), in one transaction.
pub fn render_allow_addr(ip: Ipv4Addr, ttl: Duration) -> Result<String, NftError> {
    if ttl < Duration::from_secs(1) || ttl > MAX_TTL {
        return Err(NftError::BadTtl(ttl));
    }
    let secs = ttl.as_secs();
    let t = SLOT_TABLE;
    Ok(format!(
        "add element inet {t} dns {{ {ip} timeout {secs}s }}\n\
         delete element inet {t} dns {{ {ip} }}\n\
         add element inet {t} dns {{ {ip} timeout {secs}s }}\n"
    ))
}

/// The host's shared table: forwarding to and from slots accepted, slot
/// to slot dropped, nothing new towards a slot, and masquerade for what
/// slots send out of other interfaces. It names no slot and no pool
/// (it matches `shv*`), so every pool shares it; applying it replaces it.
pub fn render_host() -> String {
    let t = HOST_TABLE;
    let l = format!("\"{HOST_LINK_PREFIX}*\"");
    format!(
        "table inet {t} {{}}\n\
         delete table inet {t}\n\
         table inet {t} {{\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\tiifname {l} oifname {l} drop\n\
         \t\tiifname {l} accept\n\
         \t\toifname {l} ct state established,related accept\n\
         \t\toifname {l} drop\n\
         \t}}\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tiifname {l} oifname != {l} masquerade\n\
         \t}}\n\
         }}\n"
    )
}

/// Packets and bytes of one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Count {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// A slot's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotCounters {
    /// Everything the guest sent (before the policy).
    pub from_guest: Count,
    /// What reached the guest.
    pub to_guest: Count,
    /// What the policy dropped (of what the guest sent).
    pub dropped: Count,
}

/// Reads `nft -j list counters table inet shoal_slot`.
pub fn parse_counters(json: &str) -> Result<SlotCounters, serde_json::Error> {
    let v: serde_json::Value = serde_json::from_str(json)?;
    let mut c = SlotCounters::default();
    let items = v.get("nftables").and_then(|x| x.as_array());
    for item in items.into_iter().flatten() {
        let Some(k) = item.get("counter") else {
            continue;
        };
        let n = |f: &str| k.get(f).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let count = Count {
            packets: n("packets"),
            bytes: n("bytes"),
        };
        match k.get("name").and_then(|x| x.as_str()) {
            Some("from_guest") => c.from_guest = count,
            Some("to_guest") => c.to_guest = count,
            Some("dropped") => c.dropped = count,
            _ => {}
        }
    }
    Ok(c)
}

#[cfg(test)]
#[path = "nft_tests.rs"]
mod tests;
