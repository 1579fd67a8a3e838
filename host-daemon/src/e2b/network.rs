//! E2B's sandbox network mapped onto shoald's (issue 15, issue 18).
//!
//! E2B (`SandboxNetworkConfig`; e2b-dev/infra's firewall and API): every
//! sandbox has a network, open by default; `allowOut` and `denyOut` hold
//! `IP`, `CIDR`, `CIDR:port[-port]` (and, `allowOut` only, domains), and a
//! destination is allowed when an `allowOut` entry matches it, else denied
//! when a `denyOut` entry does, else allowed: **allow wins**. Domains need
//! `denyOut` to block everything (`0.0.0.0/0`, `ALL_TRAFFIC`).
//! `allow_internet_access: false` replaces `denyOut` with `0.0.0.0/0`.
//!
//! shoald: a sandbox has no network unless asked; a networked one drops
//! everything but what `allow_out` allows and `deny_out` does not deny:
//! **deny wins**. So E2B's allowed set `allowOut ∪ ¬denyOut` becomes:
//!
//! - `denyOut` covering all of IPv4 (the whitelist): `allow_out` =
//!   `allowOut` as given, `deny_out` = [], DNS only when it names domains
//!   (the forwarder answers just those);
//! - else (a blacklist, or nothing: the public internet): `allow_out` =
//!   `0.0.0.0/0` and `*` (every name resolves), `deny_out` = `denyOut`
//!   minus `allowOut` (computed over addresses and ports), DNS on.
//!
//! Either way shoald's always-denied addresses (the host's, the pool's,
//! loopback, link-local, multicast) stay denied unless an `allowOut`
//! entry names a network inside them, as in shoald's own policies (E2B
//! denies its private and link-local ranges always). The detail reads
//! the policy back in E2B's terms ([`to_e2b`]).

use crate::Daemon;
use serde_json::{json, Map, Value};
use shoal_api::{NetworkSpec, MAX_POLICY_ENTRIES};
use shoal_hostnet::addr::IpNet;
use shoal_hostnet::policy::Target;
use shoal_hostnet::Ipv4Net;
use std::net::Ipv4Addr;

/// E2B's `ALL_TRAFFIC`.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// What shoald gives a sandbox for "the public internet": every address
/// but its always-denied ones, every name through its DNS forwarder.
pub fn public_internet() -> NetworkSpec {
    NetworkSpec {
        allow_out: vec![ALL_TRAFFIC.into(), "*".into()],
        deny_out: vec![],
        allow_dns: true,
    }
}

/// E2B's egress lists.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Egress {
    /// `allowOut`.
    pub allow_out: Vec<String>,
    /// `denyOut`.
    pub deny_out: Vec<String>,
}

/// Whether `v` asks for nothing (absent, null, false, "", [] or {}).
fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Number(_) => false,
    }
}

/// A list of strings (`null`: none), at most [`MAX_POLICY_ENTRIES`].
fn strings(o: &Map<String, Value>, key: &str) -> Result<Option<Vec<String>>, String> {
    let Some(v) = o.get(key).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let a = v
        .as_array()
        .ok_or_else(|| format!("network.{key} must be a list of strings"))?;
    if a.len() > MAX_POLICY_ENTRIES {
        return Err(format!(
            "network.{key} has {} entries; at most {MAX_POLICY_ENTRIES} are allowed",
            a.len()
        ));
    }
    a.iter()
        .map(|e| {
            e.as_str()
                .map(|s| s.trim().to_string())
                .ok_or_else(|| format!("network.{key} must be a list of strings"))
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// Why shoald cannot do `key` (a field it refuses when it asks for
/// anything).
fn unsupported(key: &str) -> String {
    let why = match key {
        "allowPublicTraffic" => {
            "every sandbox port needs the sandbox's trafficAccessToken (false is accepted)"
        }
        "maskRequestHost" => "sandbox ports are reached at E2B_SANDBOX_URL, not host names",
        "rules" => "requests are not rewritten on their way out",
        "egressProxy" => "egress goes out through the host, not a SOCKS5 proxy",
        "httpsPorts" => "sandbox ports are relayed as they are",
        "dnsServers" => {
            "a sandbox resolves through its gateway, shoald's forwarder, which answers the \
             names allowOut allows"
        }
        _ => "shoald does not know it",
    };
    format!("network.{key} is not supported by shoald: {why}")
}

/// The egress a create's `network` asks for (`None`: it names neither
/// `allowOut` nor `denyOut`), or why shoald cannot do it.
pub fn parse_create(n: Option<&Value>) -> Result<Option<Egress>, String> {
    let Some(n) = n.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let o = n
        .as_object()
        .ok_or_else(|| "network must be an object".to_string())?;
    let allow = strings(o, "allowOut")?;
    let deny = strings(o, "denyOut")?;
    check_dns_servers(o, allow.as_deref())?;
    for (k, v) in o {
        match k.as_str() {
            "allowOut" | "denyOut" | "dnsServers" => {}
            _ if empty(v) => {}
            k => return Err(unsupported(k)),
        }
    }
    Ok((allow.is_some() || deny.is_some()).then(|| Egress {
        allow_out: allow.unwrap_or_default(),
        deny_out: deny.unwrap_or_default(),
    }))
}

/// `dnsServers` only opens resolvers for `allowOut`'s domains on E2B
/// (without domains it does nothing): refused with domains.
fn check_dns_servers(o: &Map<String, Value>, allow: Option<&[String]>) -> Result<(), String> {
    let Some(servers) = strings(o, "dnsServers")? else {
        return Ok(());
    };
    let domains = allow
        .unwrap_or_default()
        .iter()
        .any(|e| matches!(parse(e), Ok(Target::Domain(_))));
    if domains && !servers.is_empty() {
        return Err(unsupported("dnsServers"));
    }
    Ok(())
}

/// The egress and `allow_internet_access` of `PUT /sandboxes/{id}/network`
/// (the whole configuration: an absent list is an empty one, as on E2B).
pub fn parse_update(v: &Value) -> Result<(Egress, Option<bool>), String> {
    let o = v
        .as_object()
        .ok_or_else(|| "the body must be a JSON object".to_string())?;
    let allow = strings(o, "allowOut")?;
    let deny = strings(o, "denyOut")?;
    check_dns_servers(o, allow.as_deref())?;
    let aia = match o.get("allow_internet_access") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err("allow_internet_access must be a boolean".into()),
    };
    for (k, v) in o {
        match k.as_str() {
            "allowOut" | "denyOut" | "dnsServers" | "allow_internet_access" => {}
            _ if empty(v) => {}
            k => return Err(unsupported(k)),
        }
    }
    let e = Egress {
        allow_out: allow.unwrap_or_default(),
        deny_out: deny.unwrap_or_default(),
    };
    Ok((e, aia))
}

/// The network of an E2B create: its `network` rules (`allow_internet_access:
/// false` blocking all but `allowOut`, as on E2B); without rules, the public
/// internet when `internet` (`shoald --e2b-internet`) and
/// `allow_internet_access` is not false, else none.
pub fn create_spec(
    egress: Option<Egress>,
    allow_internet_access: Option<bool>,
    internet: bool,
) -> Result<Option<NetworkSpec>, String> {
    match egress {
        Some(mut e) => {
            if allow_internet_access == Some(false) {
                e.deny_out = vec![ALL_TRAFFIC.into()];
            }
            to_spec(&e).map(Some)
        }
        None if internet && allow_internet_access != Some(false) => Ok(Some(public_internet())),
        None => Ok(None),
    }
}

/// The policy of an E2B update (`allow_internet_access: false` blocks all
/// but `allowOut`).
pub fn update_spec(v: &Value) -> Result<NetworkSpec, String> {
    let (mut e, aia) = parse_update(v)?;
    if aia == Some(false) {
        e.deny_out = vec![ALL_TRAFFIC.into()];
    }
    to_spec(&e)
}

/// An entry as given, but E2B's `IP:` (nothing after the colon: every
/// port) written as shoald writes it (`IP`).
fn canonical(s: &str) -> String {
    match s.strip_suffix(':') {
        Some(rest) if !rest.contains(':') => rest.to_string(),
        _ => s.to_string(),
    }
}

/// One entry, as hostnet parses it.
fn parse(s: &str) -> Result<Target, String> {
    canonical(s).parse::<Target>().map_err(|e| e.to_string())
}

/// An IPv4 network and its TCP/UDP ports (every port: `1..=65535`).
type Rect = ((u32, u32), (u16, u16));

const ALL_PORTS: (u16, u16) = (1, u16::MAX);
const EVERYTHING: Rect = ((0, u32::MAX), ALL_PORTS);

/// A list split by kind: IPv4 networks (with ports), the other entries
/// (IPv6, kept as given: slots forward no IPv6), domains.
#[derive(Default)]
struct Split {
    v4: Vec<Rect>,
    v6: Vec<String>,
    domains: Vec<String>,
}

fn split(list: &str, entries: &[String]) -> Result<Split, String> {
    let mut s = Split::default();
    for e in entries {
        let t = parse(e).map_err(|why| format!("network.{list} entry {e:?}: {why}"))?;
        match &t {
            Target::Domain(_) => s.domains.push(t.to_string()),
            Target::Net {
                net: IpNet::V6(_), ..
            } => s.v6.push(t.to_string()),
            Target::Net { .. } => {
                if let Some((net, ports)) = t.as_v4() {
                    s.v4.push((net.range(), ports.map_or(ALL_PORTS, |p| (p.lo(), p.hi()))));
                }
            }
        }
    }
    Ok(s)
}

/// E2B's `allowOut`/`denyOut` (allow wins) as a shoald policy (deny wins):
/// see the module's documentation.
pub fn to_spec(e: &Egress) -> Result<NetworkSpec, String> {
    let allow = split("allowOut", &e.allow_out)?;
    let deny = split("denyOut", &e.deny_out)?;
    if let Some(d) = deny.domains.first() {
        return Err(format!(
            "network.denyOut entry {d:?}: denyOut takes IP addresses and CIDRs only (as on E2B)"
        ));
    }
    let deny_all = minus(&[EVERYTHING], &deny.v4).is_empty();
    if let Some(d) = allow.domains.first().filter(|_| !deny_all) {
        return Err(format!(
            "network.allowOut entry {d:?}: domains need denyOut to block all traffic \
             (\"{ALL_TRAFFIC}\", ALL_TRAFFIC), as on E2B"
        ));
    }
    // Everything allowed: the public internet.
    if minus(&deny.v4, &allow.v4).is_empty() {
        return Ok(public_internet());
    }
    let spec = if deny_all {
        // A whitelist: allowOut as it is.
        NetworkSpec {
            allow_out: e.allow_out.iter().map(|s| canonical(s)).collect(),
            deny_out: vec![],
            allow_dns: !allow.domains.is_empty(),
        }
    } else {
        let mut deny_out = entries(&minus(&deny.v4, &allow.v4));
        deny_out.extend(deny.v6);
        let mut allow_out = public_internet().allow_out;
        allow_out.extend(allow.v6);
        NetworkSpec {
            allow_out,
            deny_out,
            allow_dns: true,
        }
    };
    for (list, v) in [("allowOut", &spec.allow_out), ("denyOut", &spec.deny_out)] {
        if v.len() > MAX_POLICY_ENTRIES {
            return Err(format!(
                "network: shoald's policy for these rules needs {} {list} entries (allowOut \
                 cut out of denyOut); at most {MAX_POLICY_ENTRIES}: give fewer or wider ranges",
                v.len()
            ));
        }
    }
    Ok(spec)
}

/// Whether `spec` lets the sandbox reach all of IPv4 (but shoald's
/// always-denied addresses): E2B's `allowInternetAccess`.
pub fn internet(spec: Option<&NetworkSpec>) -> bool {
    spec.is_some_and(|s| {
        s.allow_out
            .iter()
            .filter_map(|e| parse(e).ok())
            .filter_map(|t| t.as_v4())
            .any(|(n, p)| n.prefix_len() == 0 && p.is_none())
    })
}

/// A sandbox's policy in E2B's terms (`network` of its detail): with all
/// of IPv4 allowed, an empty `allowOut` and `deny_out` as `denyOut`; else
/// `denyOut` blocks all and `allowOut` is what `allow_out` allows and
/// `deny_out` does not deny.
pub fn to_e2b(spec: &NetworkSpec) -> Value {
    let (allow_out, deny_out) = if internet(Some(spec)) {
        (vec![], spec.deny_out.clone())
    } else if spec.deny_out.is_empty() {
        (spec.allow_out.clone(), vec![ALL_TRAFFIC.to_string()])
    } else {
        let parts = |l: &str, v: &[String]| split(l, v).unwrap_or_default();
        let (a, d) = (
            parts("allowOut", &spec.allow_out),
            parts("denyOut", &spec.deny_out),
        );
        let mut allow = entries(&minus(&a.v4, &d.v4));
        allow.extend(a.v6);
        allow.extend(a.domains.into_iter().filter(|n| !d.domains.contains(n)));
        (allow, vec![ALL_TRAFFIC.to_string()])
    };
    json!({"allowOut": allow_out, "denyOut": deny_out, "allowPublicTraffic": false})
}

/// `spec` as this daemon can enforce it: the public internet's `*` and
/// DNS are dropped when the daemon has no DNS forwarder (`--net-dns off`;
/// addresses still work); anything else is left for the create to refuse.
pub fn fit(d: &Daemon, mut spec: NetworkSpec) -> NetworkSpec {
    let ok = crate::net::network_policy(&spec).is_ok_and(|p| d.net.check(&p).is_ok());
    if !ok && spec.allow_out.iter().any(|e| e == "*") {
        spec.allow_out.retain(|e| e != "*");
        spec.allow_dns = false;
    }
    spec
}

/// Merged port ranges.
fn merge(mut v: Vec<(u16, u16)>) -> Vec<(u16, u16)> {
    v.sort_unstable();
    let mut out: Vec<(u16, u16)> = Vec::with_capacity(v.len());
    for (lo, hi) in v {
        match out.last_mut() {
            Some((_, h)) if u32::from(lo) <= u32::from(*h) + 1 => *h = (*h).max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// Port ranges `a` without those of `b` (both merged).
fn subtract(a: &[(u16, u16)], b: &[(u16, u16)]) -> Vec<(u16, u16)> {
    let mut out = Vec::new();
    for &(lo, hi) in a {
        let mut cur = u32::from(lo);
        let end = u32::from(hi);
        for &(blo, bhi) in b {
            let (blo, bhi) = (u32::from(blo), u32::from(bhi));
            if bhi < cur || blo > end {
                continue;
            }
            if blo > cur {
                out.push((cur, blo - 1));
            }
            cur = cur.max(bhi + 1);
        }
        if cur <= end {
            out.push((cur, end));
        }
    }
    out.into_iter()
        .filter_map(|(l, h)| Some((u16::try_from(l).ok()?, u16::try_from(h).ok()?)))
        .collect()
}

/// An address range and the port ranges open on it.
type Segment = ((u32, u32), Vec<(u16, u16)>);

/// What `x` covers and `y` does not, as disjoint rectangles (address
/// ranges cut where either list's networks start or end).
fn minus(x: &[Rect], y: &[Rect]) -> Vec<Rect> {
    let mut cuts: Vec<u64> = x
        .iter()
        .chain(y)
        .flat_map(|((lo, hi), _)| [u64::from(*lo), u64::from(*hi) + 1])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut segs: Vec<Segment> = Vec::new();
    for w in cuts.windows(2) {
        let (Ok(lo), Ok(hi)) = (u32::try_from(w[0]), u32::try_from(w[1] - 1)) else {
            continue;
        };
        let over = |v: &[Rect]| {
            merge(
                v.iter()
                    .filter(|((a, b), _)| *a <= lo && lo <= *b)
                    .map(|(_, p)| *p)
                    .collect(),
            )
        };
        let ports = subtract(&over(x), &over(y));
        if ports.is_empty() {
            continue;
        }
        match segs.last_mut() {
            Some(((_, h), p)) if *p == ports && h.checked_add(1) == Some(lo) => *h = hi,
            _ => segs.push(((lo, hi), ports)),
        }
    }
    segs.into_iter()
        .flat_map(|(a, ps)| ps.into_iter().map(move |p| (a, p)))
        .collect()
}

/// The fewest CIDRs covering `lo..=hi` exactly.
fn cidrs(lo: u32, hi: u32) -> Vec<Ipv4Net> {
    let mut out = Vec::new();
    let (mut cur, end) = (u64::from(lo), u64::from(hi));
    while cur <= end {
        let mut len = if cur == 0 {
            0
        } else {
            32 - cur.trailing_zeros().min(32)
        };
        while cur + (1u64 << (32 - len)) - 1 > end {
            len += 1;
        }
        let addr = Ipv4Addr::from(u32::try_from(cur).unwrap_or(u32::MAX));
        if let Some(n) = u8::try_from(len).ok().and_then(|l| Ipv4Net::new(addr, l)) {
            out.push(n);
        }
        cur += 1u64 << (32 - len);
    }
    out
}

/// Rectangles as policy entries (`CIDR`, `CIDR:port`, `CIDR:lo-hi`).
fn entries(rects: &[Rect]) -> Vec<String> {
    let mut out = Vec::new();
    for &((lo, hi), (plo, phi)) in rects {
        for n in cidrs(lo, hi) {
            let n = if n.prefix_len() == 32 {
                n.addr().to_string()
            } else {
                n.to_string()
            };
            out.push(match (plo, phi) {
                ALL_PORTS => n,
                (p, q) if p == q => format!("{n}:{p}"),
                (p, q) => format!("{n}:{p}-{q}"),
            });
        }
    }
    out
}

#[cfg(test)]
#[path = "network_tests.rs"]
mod tests;
