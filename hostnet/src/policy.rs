//! A sandbox's egress policy: what it may reach.
//!
//! In JSON: `{"allow_out": [...], "deny_out": [...], "allow_dns": bool}`,
//! each entry one of
//!
//! - `CIDR` or `CIDR:port` or `CIDR:lo-hi` for IPv4 (`10.0.0.0/8:443`, a
//!   bare address is a `/32`: `1.2.3.4:80`);
//! - `CIDR` or `[CIDR]:port[-hi]` for IPv6 (`2001:db8::/32`,
//!   `[2001:db8::1]:443`; a bare address is a `/128`);
//! - `domain` (that name exactly) or `*.domain` (every name strictly below
//!   it), or `*` (every name), resolved through the daemon's DNS forwarder.
//!
//! A network entry without a port covers every TCP and UDP port and ICMP;
//! one with ports covers TCP and UDP on them, and ICMP to the network.
//! Other IP protocols are never allowed. `deny_out` wins over `allow_out`.
//! Slots are IPv4 only for now: IPv6 entries are parsed and kept, and have
//! no effect (the slot forwards no IPv6 at all).
//!
//! Serde parses straight into the typed form: a bad entry fails the
//! deserialisation with its reason.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::addr::{AddrError, IpNet, Ipv4Net, Ipv6Net};

/// The most entries in `allow_out` or in `deny_out`.
pub const MAX_ENTRIES: usize = 256;
/// The longest entry (a domain is at most 253 characters).
pub const MAX_ENTRY_LEN: usize = 260;

/// A policy the parser refuses.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// More entries than [`MAX_ENTRIES`] in one list.
    #[error("{list} has {count} entries; at most {MAX_ENTRIES} are allowed")]
    TooMany {
        /// `allow_out` or `deny_out`.
        list: &'static str,
        /// How many were given.
        count: usize,
    },
    /// One entry that does not parse.
    #[error("{list} entry {entry:?}: {why}")]
    Entry {
        /// `allow_out` or `deny_out`.
        list: &'static str,
        /// The entry (cut to [`MAX_ENTRY_LEN`]).
        entry: String,
        /// Why.
        why: EntryError,
    },
}

/// Why one entry does not parse.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EntryError {
    /// Longer than [`MAX_ENTRY_LEN`].
    #[error("longer than {MAX_ENTRY_LEN} characters")]
    TooLong,
    /// Empty.
    #[error("empty")]
    Empty,
    /// A bad address or network.
    #[error(transparent)]
    Addr(#[from] AddrError),
    /// A bad port or port range.
    #[error("bad port {0:?}: ports are 1..=65535, a range is lo-hi with lo <= hi")]
    Port(String),
    /// A bad domain name.
    #[error("bad domain name: {0}")]
    Domain(&'static str),
}

/// An inclusive TCP/UDP port range (`1..=65535`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    lo: u16,
    hi: u16,
}

impl PortRange {
    /// `lo..=hi`; `None` if `lo` is 0 or `lo > hi`.
    pub fn new(lo: u16, hi: u16) -> Option<Self> {
        (lo != 0 && lo <= hi).then_some(PortRange { lo, hi })
    }

    /// The first port.
    pub fn lo(&self) -> u16 {
        self.lo
    }

    /// The last port.
    pub fn hi(&self) -> u16 {
        self.hi
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

impl FromStr for PortRange {
    type Err = EntryError;

    fn from_str(s: &str) -> Result<Self, EntryError> {
        let bad = || EntryError::Port(s.to_string());
        let num = |p: &str| {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            p.parse::<u16>().map_err(|_| bad())
        };
        let (lo, hi) = match s.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let p = num(s)?;
                (p, p)
            }
        };
        PortRange::new(lo, hi).ok_or_else(bad)
    }
}

/// A domain entry: one name, every name strictly below it, or (`*`, an
/// empty name with the wildcard) every name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DomainPattern {
    name: String,
    wildcard: bool,
}

impl DomainPattern {
    /// The name (lower case, no trailing dot; without the `*.`; empty for
    /// `*`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it is `*.name`.
    pub fn is_wildcard(&self) -> bool {
        self.wildcard
    }

    /// Whether `name` (already normalised) matches.
    fn matches(&self, name: &str) -> bool {
        if !self.wildcard {
            return name == self.name;
        }
        if self.name.is_empty() {
            return true;
        }
        name.len() > self.name.len() + 1
            && name.ends_with(&self.name)
            && name.as_bytes()[name.len() - self.name.len() - 1] == b'.'
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard && self.name.is_empty() {
            f.write_str("*")
        } else if self.wildcard {
            write!(f, "*.{}", self.name)
        } else {
            f.write_str(&self.name)
        }
    }
}

/// Lower-cases `name` and drops one trailing dot; an error if it is not a
/// valid host name (LDH labels of 1..=63, 253 characters in all).
fn normalize_name(name: &str) -> Result<String, EntryError> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err(EntryError::Domain("empty name"));
    }
    if name.len() > 253 {
        return Err(EntryError::Domain("longer than 253 characters"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(EntryError::Domain("empty label"));
        }
        if label.len() > 63 {
            return Err(EntryError::Domain("a label longer than 63 characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(EntryError::Domain(
                "labels hold only letters, digits and '-' (a '*' only as the whole first label)",
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(EntryError::Domain("a label starts or ends with '-'"));
        }
    }
    Ok(name.to_ascii_lowercase())
}

/// One `allow_out` or `deny_out` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// A network, with ports (TCP and UDP) or without (every port).
    Net {
        /// The network.
        net: IpNet,
        /// The ports; `None`: all.
        ports: Option<PortRange>,
    },
    /// A domain, for the DNS forwarder.
    Domain(DomainPattern),
}

impl Target {
    /// The IPv4 network and ports of a network entry.
    pub fn as_v4(&self) -> Option<(Ipv4Net, Option<PortRange>)> {
        match self {
            Target::Net {
                net: IpNet::V4(n),
                ports,
            } => Some((*n, *ports)),
            _ => None,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Net { net, ports: None } => net.fmt(f),
            Target::Net {
                net: IpNet::V4(n),
                ports: Some(p),
            } => write!(f, "{n}:{p}"),
            Target::Net {
                net: IpNet::V6(n),
                ports: Some(p),
            } => write!(f, "[{n}]:{p}"),
            Target::Domain(d) => d.fmt(f),
        }
    }
}

impl FromStr for Target {
    type Err = EntryError;

    fn from_str(s: &str) -> Result<Self, EntryError> {
        if s.len() > MAX_ENTRY_LEN {
            return Err(EntryError::TooLong);
        }
        if s.is_empty() {
            return Err(EntryError::Empty);
        }
        if let Some(rest) = s.strip_prefix('[') {
            // [v6]:port or [v6/len]:port
            let (net, port) = rest
                .split_once("]:")
                .ok_or_else(|| AddrError::BadAddr(s.to_string()))?;
            return Ok(Target::Net {
                net: IpNet::V6(net.parse()?),
                ports: Some(port.parse()?),
            });
        }
        if s.contains(':') {
            if let Some((host, _)) = s.split_once(':') {
                if host
                    .bytes()
                    .any(|b| b.is_ascii_alphabetic() && !b.is_ascii_hexdigit())
                    || host.starts_with("*.")
                    || host == "*"
                {
                    return Err(EntryError::Domain("a domain entry takes no port"));
                }
            }
            // IPv6 (no port), or IPv4 with a port.
            let v4 = s
                .split_once(':')
                .filter(|(a, _)| !a.is_empty() && a.contains('.'));
            return match v4 {
                Some((net, port)) if !net.contains(':') && !port.contains(':') => Ok(Target::Net {
                    net: IpNet::V4(net.parse()?),
                    ports: Some(port.parse()?),
                }),
                _ => Ok(Target::Net {
                    net: IpNet::V6(s.parse::<Ipv6Net>()?),
                    ports: None,
                }),
            };
        }
        if s.contains('/') || s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Ok(Target::Net {
                net: IpNet::V4(s.parse()?),
                ports: None,
            });
        }
        if s == "*" {
            return Ok(Target::Domain(DomainPattern {
                name: String::new(),
                wildcard: true,
            }));
        }
        let (wildcard, name) = match s.strip_prefix("*.") {
            Some(n) => (true, n),
            None => (false, s),
        };
        Ok(Target::Domain(DomainPattern {
            name: normalize_name(name)?,
            wildcard,
        }))
    }
}

/// The JSON form of [`EgressPolicy`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyDoc {
    /// What the sandbox may reach.
    #[serde(default)]
    pub allow_out: Vec<String>,
    /// What it may not, whatever `allow_out` says.
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// Whether it may resolve names through the daemon's forwarder.
    #[serde(default)]
    pub allow_dns: bool,
}

/// A parsed egress policy. The default allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PolicyDoc", into = "PolicyDoc")]
pub struct EgressPolicy {
    allow_out: Vec<Target>,
    deny_out: Vec<Target>,
    allow_dns: bool,
}

impl EgressPolicy {
    /// Parses the two lists.
    pub fn parse<S: AsRef<str>>(
        allow_out: &[S],
        deny_out: &[S],
        allow_dns: bool,
    ) -> Result<Self, PolicyError> {
        Ok(EgressPolicy {
            allow_out: parse_list("allow_out", allow_out)?,
            deny_out: parse_list("deny_out", deny_out)?,
            allow_dns,
        })
    }

    /// The allowed targets.
    pub fn allow_out(&self) -> &[Target] {
        &self.allow_out
    }

    /// The denied targets.
    pub fn deny_out(&self) -> &[Target] {
        &self.deny_out
    }

    /// Whether DNS through the forwarder is allowed.
    pub fn allow_dns(&self) -> bool {
        self.allow_dns
    }

    /// Whether the DNS forwarder may answer for `name`: a `d` entry matches
    /// exactly `d`, a `*.d` entry any name strictly below `d`; case does not
    /// matter and a trailing dot is ignored; a matching `deny_out` domain
    /// wins; an invalid name is never allowed.
    pub fn domain_allowed(&self, name: &str) -> bool {
        let Ok(name) = normalize_name(name) else {
            return false;
        };
        let hit = |list: &[Target]| {
            list.iter()
                .any(|t| matches!(t, Target::Domain(d) if d.matches(&name)))
        };
        !hit(&self.deny_out) && hit(&self.allow_out)
    }

    /// Whether the two policies name the same domains (a change of the
    /// domains drops the addresses the forwarder added).
    pub fn same_domains(&self, other: &EgressPolicy) -> bool {
        fn doms(v: &[Target]) -> Vec<String> {
            let mut d: Vec<String> = v
                .iter()
                .filter(|t| matches!(t, Target::Domain(_)))
                .map(ToString::to_string)
                .collect();
            d.sort();
            d
        }
        doms(&self.allow_out) == doms(&other.allow_out)
            && doms(&self.deny_out) == doms(&other.deny_out)
    }
}

fn parse_list<S: AsRef<str>>(list: &'static str, v: &[S]) -> Result<Vec<Target>, PolicyError> {
    if v.len() > MAX_ENTRIES {
        return Err(PolicyError::TooMany {
            list,
            count: v.len(),
        });
    }
    v.iter()
        .map(|s| {
            let s = s.as_ref();
            s.parse().map_err(|why| PolicyError::Entry {
                list,
                entry: s.chars().take(MAX_ENTRY_LEN).collect(),
                why,
            })
        })
        .collect()
}

impl TryFrom<PolicyDoc> for EgressPolicy {
    type Error = PolicyError;

    fn try_from(d: PolicyDoc) -> Result<Self, PolicyError> {
        EgressPolicy::parse(&d.allow_out, &d.deny_out, d.allow_dns)
    }
}

impl From<EgressPolicy> for PolicyDoc {
    fn from(p: EgressPolicy) -> Self {
        let s = |v: &[Target]| v.iter().map(ToString::to_string).collect();
        PolicyDoc {
            allow_out: s(&p.allow_out),
            deny_out: s(&p.deny_out),
            allow_dns: p.allow_dns,
        }
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
