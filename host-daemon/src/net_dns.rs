//! Where the daemon's DNS forwarder listens (issue 18): a slot DNATs its
//! guest's port-53 queries to an address of the host netns other than
//! loopback. By default (`--net-dns auto`) the daemon makes one for it: a
//! dummy link (or an empty bridge) `<link prefix>dns` holding the host address of the pool's
//! last slot (kept out of the pool), port 53, the same on every start, so
//! slots that outlive a restart still reach it; the upstreams default to
//! the host's `/etc/resolv.conf` nameservers.

use shoal_hostnet::cmd::{self, CmdError};
use shoal_hostnet::AddrPool;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// The forwarder's port.
pub const PORT: u16 = 53;
const T: Duration = Duration::from_secs(20);

/// Where the forwarder listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsListen {
    /// No forwarder: `allow_dns` is refused.
    Off,
    /// On the daemon's own dummy link ([`auto_link`]).
    Auto,
    /// On this address of the host (made by the operator).
    At(SocketAddrV4),
}

impl std::str::FromStr for DnsListen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(DnsListen::Off),
            "auto" => Ok(DnsListen::Auto),
            _ => s
                .parse()
                .map(DnsListen::At)
                .map_err(|_| format!("{s:?}: give auto, off or ADDR:PORT")),
        }
    }
}

/// The pool index whose host address the auto forwarder takes.
pub fn reserved_index(pool: &AddrPool) -> u32 {
    pool.capacity() - 1
}

/// The dummy link's name for `link_prefix` (None: too long for a link).
pub fn link_name(link_prefix: &str) -> Option<String> {
    let n = format!("{link_prefix}dns");
    (n.len() <= 15).then_some(n)
}

/// Makes (again) the link `name` holding `addr`, up: a dummy link, or
/// where the kernel has none (no CONFIG_DUMMY) a bridge without ports
/// (either only holds a local address).
pub fn auto_link(name: &str, addr: Ipv4Addr) -> Result<(), CmdError> {
    let _ = cmd::run("ip", &["link", "del", name], None, T);
    let add = |kind| cmd::run("ip", &["link", "add", name, "type", kind], None, T);
    if let Err(e) = add("dummy") {
        tracing::info!("{e}: a bridge holds the DNS forwarder's address instead");
        add("bridge")?;
    }
    cmd::run(
        "ip",
        &["addr", "add", &format!("{addr}/32"), "dev", name],
        None,
        T,
    )?;
    cmd::run("ip", &["link", "set", name, "up"], None, T)?;
    Ok(())
}

/// Removes the dummy link (when no slot needs it).
pub fn remove_link(name: &str) {
    let _ = cmd::run("ip", &["link", "del", name], None, T);
}

/// The nameservers of a resolv.conf's text (port 53).
pub fn nameservers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .filter(|a| !a.is_unspecified())
        .map(|a| SocketAddr::new(a, 53))
        .collect()
}

/// The host's nameservers (`/etc/resolv.conf`).
pub fn host_nameservers() -> Vec<SocketAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .map(|t| nameservers(&t))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_and_flags_parse() {
        let t = "# x\nnameserver 10.0.0.2\nnameserver  ::1 \nsearch a\nnameserver bogus\nnameserver 0.0.0.0\n";
        assert_eq!(
            nameservers(t),
            vec!["10.0.0.2:53".parse().unwrap(), "[::1]:53".parse().unwrap()]
        );
        assert_eq!("auto".parse(), Ok(DnsListen::Auto));
        assert_eq!("off".parse(), Ok(DnsListen::Off));
        assert_eq!(
            "10.1.1.1:5353".parse(),
            Ok(DnsListen::At("10.1.1.1:5353".parse().unwrap()))
        );
        assert!("nope".parse::<DnsListen>().is_err());
        assert_eq!(link_name("shv").as_deref(), Some("shvdns"));
        assert_eq!(link_name("shv12345678ab"), None);
        let pool = AddrPool::new("10.9.0.0/24".parse().unwrap()).unwrap();
        assert_eq!((pool.capacity(), reserved_index(&pool)), (32, 31));
    }
}
