//! Guest networking: [`NetConfigure`] gives the guest's one virtio-net
//! interface its identity (MAC, IPv4 address, default route, MTU, name
//! servers), answered by [`NetConfigured`]. Both decoders check every field
//! (see `guest-agent/PROTOCOL.md`), so neither side acts on a value outside
//! the bounds below.

use std::net::Ipv4Addr;

use crate::codec::{DecodeError, Message, Reader, Wire};
use crate::frame::Kind;

/// Most name servers in a [`NetConfigure`] (what resolv.conf readers use).
pub const NET_MAX_NAMESERVERS: usize = 3;
/// Smallest MTU an IPv4 interface may have (RFC 791).
pub const NET_MIN_MTU: u16 = 68;
/// Longest interface name in a [`NetConfigured`] (Linux's `IFNAMSIZ` - 1).
pub const NET_MAX_IFNAME: usize = 15;

impl Wire for Ipv4Addr {
    const MIN_LEN: usize = 4;
    fn put(&self, w: &mut Vec<u8>) {
        w.extend_from_slice(&self.octets());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Ipv4Addr::from(r.array::<4>()?))
    }
}

/// Configures the guest's network interface (client to agent); re-sent
/// with another identity, it replaces the previous one entirely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfigure {
    /// The interface's MAC address: unicast, not all zero.
    pub mac: [u8; 6],
    /// The guest's IPv4 address.
    pub addr: Ipv4Addr,
    /// The prefix length of its subnet (0..=32).
    pub prefix_len: u8,
    /// The default route's next hop.
    pub gateway: Ipv4Addr,
    /// The interface's MTU ([`NET_MIN_MTU`]..=65535).
    pub mtu: u16,
    /// Name servers for `/etc/resolv.conf` (at most
    /// [`NET_MAX_NAMESERVERS`]; none leaves an empty file).
    pub nameservers: Vec<Ipv4Addr>,
}

impl NetConfigure {
    /// The netmask of `prefix_len` (0.0.0.0 for a prefix above 32).
    pub fn netmask(&self) -> Ipv4Addr {
        let bits = 32u32
            .checked_sub(u32::from(self.prefix_len))
            .and_then(|shift| u32::MAX.checked_shl(shift))
            .unwrap_or(0);
        Ipv4Addr::from(bits)
    }

    /// Checks the bounds the decoder enforces (for values built in code).
    pub fn validate(&self) -> Result<(), DecodeError> {
        let invalid = |what| Err(DecodeError::Invalid(what));
        let [m0, ..] = self.mac;
        if self.mac == [0; 6] {
            return invalid("all-zero MAC address");
        }
        if m0 & 1 != 0 {
            return invalid("multicast MAC address");
        }
        if self.prefix_len > 32 {
            return invalid("prefix length above 32");
        }
        if self.mtu < NET_MIN_MTU {
            return invalid("MTU below 68");
        }
        if self.nameservers.len() > NET_MAX_NAMESERVERS {
            return invalid("more than 3 name servers");
        }
        Ok(())
    }
}

impl Wire for NetConfigure {
    const MIN_LEN: usize = 6 + 4 + 1 + 4 + 2 + 4;
    fn put(&self, w: &mut Vec<u8>) {
        self.mac.put(w);
        self.addr.put(w);
        self.prefix_len.put(w);
        self.gateway.put(w);
        self.mtu.put(w);
        self.nameservers.put(w);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mac = Wire::get(r)?;
        let addr = Wire::get(r)?;
        let prefix_len = Wire::get(r)?;
        let gateway = Wire::get(r)?;
        let mtu = Wire::get(r)?;
        // Checked before the list is read: a long count is refused without
        // decoding its items.
        let count = u32::get(r)?;
        if usize::try_from(count).map_or(true, |n| n > NET_MAX_NAMESERVERS) {
            return Err(DecodeError::Invalid("more than 3 name servers"));
        }
        let mut nameservers = Vec::new();
        for _ in 0..count {
            nameservers.push(Ipv4Addr::get(r)?);
        }
        let m = NetConfigure {
            mac,
            addr,
            prefix_len,
            gateway,
            mtu,
            nameservers,
        };
        m.validate()?;
        Ok(m)
    }
}

impl Message for NetConfigure {
    const KIND: Kind = Kind::NetConfigure;
}

/// What [`NetConfigure`] configured (agent to client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfigured {
    /// The interface's name in the guest (1..=[`NET_MAX_IFNAME`] bytes, no
    /// `/`, NUL or white space).
    pub ifname: String,
}

impl Wire for NetConfigured {
    const MIN_LEN: usize = 4;
    fn put(&self, w: &mut Vec<u8>) {
        self.ifname.put(w);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        // The length is checked before the bytes are taken.
        let len = u32::get(r)?;
        if usize::try_from(len).map_or(true, |n| n == 0 || n > NET_MAX_IFNAME) {
            return Err(DecodeError::Invalid("interface name length"));
        }
        let bytes = r.take(usize::try_from(len).unwrap_or(0))?;
        let ifname = std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8)?;
        if !valid_ifname(ifname) {
            return Err(DecodeError::Invalid("interface name"));
        }
        Ok(NetConfigured {
            ifname: ifname.to_owned(),
        })
    }
}

impl Message for NetConfigured {
    const KIND: Kind = Kind::NetConfigured;
}

/// Whether `name` can be a Linux interface name: 1..=15 bytes, not `.` or
/// `..`, without `/`, `:`, NUL or white space.
pub fn valid_ifname(name: &str) -> bool {
    (1..=NET_MAX_IFNAME).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
}
