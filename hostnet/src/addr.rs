//! Address types: CIDR networks, the slot pool and each slot's block.
//!
//! A slot's block is 8 addresses of the pool (IPv4 only for now), two /30
//! links:
//!
//! ```text
//! base+1  host side of the veth (shv<n>, host netns)
//! base+2  slot side of the veth (veth0, slot netns); the host routes the
//!         guest's address via it
//! base+5  gateway: tap0 in the slot netns, the guest's default route and
//!         DNS server
//! base+6  the guest
//! ```

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The addresses of one slot block.
pub const BLOCK: u32 = 8;
/// The prefix length of both links of a block.
pub const LINK_PREFIX: u8 = 30;

/// A CIDR or address the parser refuses.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AddrError {
    /// Not an address.
    #[error("{0:?} is not an IP address")]
    BadAddr(String),
    /// A prefix length that is not a number or too long.
    #[error("{0:?}: bad prefix length (0..=32 for IPv4, 0..=128 for IPv6)")]
    BadPrefix(String),
    /// Bits set below the prefix.
    #[error("{given:?} has host bits set (the network is {network})")]
    HostBits {
        /// What was given.
        given: String,
        /// The network it names.
        network: String,
    },
    /// A pool too small, too large or not IPv4.
    #[error("pool {0}: must be an IPv4 network from /8 to /29")]
    BadPool(String),
    /// A slot index past the pool's end.
    #[error("slot {index} is past the pool's {capacity} slots")]
    PastPool {
        /// The index asked for.
        index: u32,
        /// How many slots the pool has.
        capacity: u32,
    },
}

/// An IPv4 network: address (host bits zero) and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Net {
    addr: Ipv4Addr,
    len: u8,
}

impl Ipv4Net {
    /// The network of `addr/len`; `None` if `len > 32` or host bits are set.
    pub fn new(addr: Ipv4Addr, len: u8) -> Option<Self> {
        if len > 32 || u32::from(addr) & !mask4(len) != 0 {
            return None;
        }
        Some(Ipv4Net { addr, len })
    }

    /// One address (`/32`).
    pub fn host(addr: Ipv4Addr) -> Self {
        Ipv4Net { addr, len: 32 }
    }

    /// The network address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// First and last address as integers.
    pub fn range(&self) -> (u32, u32) {
        let a = u32::from(self.addr);
        (a, a | !mask4(self.len))
    }

    /// Whether `ip` is inside.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let (lo, hi) = self.range();
        (lo..=hi).contains(&u32::from(ip))
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Ipv4Net {
    type Err = AddrError;

    /// `a.b.c.d/len` or a bare address (`/32`).
    fn from_str(s: &str) -> Result<Self, AddrError> {
        let (a, len) = split_prefix(s, 32)?;
        let addr = Ipv4Addr::from_str(a).map_err(|_| AddrError::BadAddr(a.to_string()))?;
        Ipv4Net::new(addr, len).ok_or_else(|| AddrError::HostBits {
            given: s.to_string(),
            network: format!("{}/{len}", Ipv4Addr::from(u32::from(addr) & mask4(len))),
        })
    }
}

/// An IPv6 network: address (host bits zero) and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Net {
    addr: Ipv6Addr,
    len: u8,
}

impl Ipv6Net {
    /// The network address.
    pub fn addr(&self) -> Ipv6Addr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }
}

impl fmt::Display for Ipv6Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Ipv6Net {
    type Err = AddrError;

    /// `v6/len` or a bare address (`/128`).
    fn from_str(s: &str) -> Result<Self, AddrError> {
        let (a, len) = split_prefix(s, 128)?;
        let addr = Ipv6Addr::from_str(a).map_err(|_| AddrError::BadAddr(a.to_string()))?;
        let mask = if len == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(len))
        };
        let bits = u128::from(addr);
        if bits & !mask != 0 {
            return Err(AddrError::HostBits {
                given: s.to_string(),
                network: format!("{}/{len}", Ipv6Addr::from(bits & mask)),
            });
        }
        Ok(Ipv6Net { addr, len })
    }
}

/// An IPv4 or IPv6 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpNet {
    /// IPv4.
    V4(Ipv4Net),
    /// IPv6.
    V6(Ipv6Net),
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpNet::V4(n) => n.fmt(f),
            IpNet::V6(n) => n.fmt(f),
        }
    }
}

fn split_prefix(s: &str, max: u8) -> Result<(&str, u8), AddrError> {
    match s.split_once('/') {
        None => Ok((s, max)),
        Some((a, l)) => {
            let len = (!l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()))
                .then(|| l.parse::<u8>().ok())
                .flatten()
                .filter(|&n| n <= max)
                .ok_or_else(|| AddrError::BadPrefix(s.to_string()))?;
            Ok((a, len))
        }
    }
}

/// The netmask of a prefix length (`len <= 32`).
pub(crate) fn mask4(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

/// Sorts inclusive ranges and merges the ones that overlap or touch.
pub(crate) fn merge_ranges(mut r: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    r.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(r.len());
    for (lo, hi) in r {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// The pool slots take their blocks from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrPool {
    net: Ipv4Net,
}

impl AddrPool {
    /// The default pool, `10.213.0.0/16` (8192 slots).
    pub const DEFAULT: &'static str = "10.213.0.0/16";

    /// A pool over `net` (IPv4, `/8` to `/29`).
    pub fn new(net: Ipv4Net) -> Result<Self, AddrError> {
        if !(8..=29).contains(&net.prefix_len()) {
            return Err(AddrError::BadPool(net.to_string()));
        }
        Ok(AddrPool { net })
    }

    /// The pool's network.
    pub fn net(&self) -> Ipv4Net {
        self.net
    }

    /// How many slots it holds.
    pub fn capacity(&self) -> u32 {
        (1u32 << (32 - u32::from(self.net.prefix_len()))) / BLOCK
    }

    /// The addresses of slot `index`.
    pub fn slot(&self, index: u32) -> Result<SlotAddrs, AddrError> {
        let capacity = self.capacity();
        if index >= capacity {
            return Err(AddrError::PastPool { index, capacity });
        }
        let base = u32::from(self.net.addr()) + index * BLOCK;
        let guest = Ipv4Addr::from(base + 6);
        let g = guest.octets();
        Ok(SlotAddrs {
            index,
            host: Ipv4Addr::from(base + 1),
            ns: Ipv4Addr::from(base + 2),
            gateway: Ipv4Addr::from(base + 5),
            guest,
            // Locally administered (0x02), unicast; the guest address makes
            // it unique per slot.
            guest_mac: MacAddr([0x02, 0x5a, g[0], g[1], g[2], g[3]]),
        })
    }
}

/// The addresses of one slot (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotAddrs {
    /// The slot's index in its pool.
    pub index: u32,
    /// Host side of the veth.
    pub host: Ipv4Addr,
    /// Slot side of the veth.
    pub ns: Ipv4Addr,
    /// The guest's gateway (tap0), `/30`.
    pub gateway: Ipv4Addr,
    /// The guest's address, `/30`.
    pub guest: Ipv4Addr,
    /// The guest's MAC address.
    pub guest_mac: MacAddr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_refuse() {
        let n: Ipv4Net = "10.1.0.0/16".parse().unwrap();
        assert_eq!(n.range(), (0x0a01_0000, 0x0a01_ffff));
        assert_eq!("1.2.3.4".parse::<Ipv4Net>().unwrap().prefix_len(), 32);
        assert!(matches!(
            "10.1.0.1/16".parse::<Ipv4Net>(),
            Err(AddrError::HostBits { network, .. }) if network == "10.1.0.0/16"
        ));
        for bad in ["10.0.0.0/33", "10.0.0.0/", "10.0.0.0/+8", "10.0.0/8", "x"] {
            assert!(bad.parse::<Ipv4Net>().is_err(), "{bad}");
        }
        assert_eq!("2001:db8::/32".parse::<Ipv6Net>().unwrap().prefix_len(), 32);
        assert_eq!("::1".parse::<Ipv6Net>().unwrap().prefix_len(), 128);
        assert!("2001:db8::1/32".parse::<Ipv6Net>().is_err());
        assert!("2001:db8::/129".parse::<Ipv6Net>().is_err());
        assert!("0.0.0.0/0"
            .parse::<Ipv4Net>()
            .unwrap()
            .contains(Ipv4Addr::BROADCAST));
    }

    #[test]
    fn ranges_merge() {
        assert_eq!(
            merge_ranges(vec![(10, 20), (0, 5), (6, 8), (15, 30), (40, 40)]),
            vec![(0, 8), (10, 30), (40, 40)]
        );
        assert_eq!(
            merge_ranges(vec![(0, u32::MAX), (5, 6)]),
            vec![(0, u32::MAX)]
        );
    }

    #[test]
    fn slots_get_distinct_blocks_and_macs() {
        let pool = AddrPool::new("10.213.0.0/16".parse().unwrap()).unwrap();
        assert_eq!(pool.capacity(), 8192);
        let a = pool.slot(0).unwrap();
        assert_eq!(a.host, Ipv4Addr::new(10, 213, 0, 1));
        assert_eq!(a.ns, Ipv4Addr::new(10, 213, 0, 2));
        assert_eq!(a.gateway, Ipv4Addr::new(10, 213, 0, 5));
        assert_eq!(a.guest, Ipv4Addr::new(10, 213, 0, 6));
        assert_eq!(a.guest_mac.to_string(), "02:5a:0a:d5:00:06");
        let b = pool.slot(8191).unwrap();
        assert_eq!(b.guest, Ipv4Addr::new(10, 213, 255, 254));
        assert_ne!(a.guest_mac, b.guest_mac);
        assert!(pool.slot(8192).is_err());
        assert!(AddrPool::new("10.0.0.0/30".parse().unwrap()).is_err());
        assert!(AddrPool::new("10.0.0.0/7".parse().unwrap()).is_err());
    }
}
