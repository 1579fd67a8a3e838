//! The host side: the configuration, forwarding and the host's shared
//! nftables table, the host's own addresses, which slot indices are in use,
//! and the reclaiming of slots a crashed daemon left.

use std::collections::{BTreeSet, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::addr::{AddrPool, Ipv4Net};
use crate::cmd::{self, CmdError};
use crate::forward;
use crate::netns;
use crate::nft::{self, HOST_LINK_PREFIX};

/// Where the host's IPv4 forwarding switch is.
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// What went wrong on the host side.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A bad configuration value.
    #[error("network configuration: {0}")]
    Config(String),
    /// An `ip` or `nft` command failed.
    #[error(transparent)]
    Cmd(#[from] CmdError),
    /// A file of the host could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// Another table's forward chain could not be opened to slots.
    #[error("opening the host's forward chains to slots: {0}")]
    Forward(#[from] forward::ForwardError),
    /// `ip -j` printed something else than its JSON.
    #[error("cannot read `ip -j` output: {0}")]
    Json(#[from] serde_json::Error),
    /// Every index of the pool is taken.
    #[error("the address pool {0} has no free slot")]
    Exhausted(Ipv4Net),
}

/// How slots are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// The pool slot addresses come from.
    pub pool: AddrPool,
    /// Where the daemon's DNS forwarder listens (an address of the host
    /// netns); a slot's DNS to its gateway goes there. `None`: no slot may
    /// have `allow_dns`.
    pub forwarder: Option<SocketAddrV4>,
    /// Slot netns names: this and the slot's index (`shoal-7`). It must end
    /// in a character that is not a digit.
    pub netns_prefix: String,
    /// Host-side veth names: this and the index (`shv7`). It starts with
    /// `shv` (what the host table matches) and ends in a non-digit or is
    /// `shv`; with the index it fits in 15 characters.
    pub link_prefix: String,
    /// The deadline of each `ip` or `nft` call.
    pub cmd_timeout: Duration,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            pool: AddrPool::new(AddrPool::DEFAULT.parse().expect("valid default pool"))
                .expect("valid default pool"),
            forwarder: None,
            netns_prefix: "shoal-".into(),
            link_prefix: HOST_LINK_PREFIX.into(),
            cmd_timeout: Duration::from_secs(20),
        }
    }
}

impl NetConfig {
    fn validate(&self) -> Result<(), HostError> {
        let bad = |m: String| Err(HostError::Config(m));
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !s.as_bytes()[s.len() - 1].is_ascii_digit()
        };
        if !name_ok(&self.netns_prefix) || self.netns_prefix.len() > 64 {
            return bad(format!("bad netns prefix {:?}", self.netns_prefix));
        }
        let digits = (self.pool.capacity() - 1).to_string().len();
        if !self.link_prefix.starts_with(HOST_LINK_PREFIX)
            || !name_ok(&self.link_prefix)
            || self.link_prefix.len() + digits > 15
        {
            return bad(format!(
                "bad link prefix {:?} (starts with {HOST_LINK_PREFIX:?}, ends in a non-digit, \
                 {} characters at most with this pool)",
                self.link_prefix,
                15 - digits
            ));
        }
        if let Some(f) = self.forwarder {
            let ip = *f.ip();
            if ip.is_loopback() || ip.is_unspecified() || f.port() == 0 {
                // DNAT in the slot's netns to a loopback address stays there.
                return bad(format!(
                    "DNS forwarder {f}: an address of the host netns other than loopback, and a port"
                ));
            }
        }
        if self.cmd_timeout.is_zero() {
            return bad("zero command timeout".into());
        }
        Ok(())
    }
}

/// What [`HostNet::reclaim_stale`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Network namespaces.
    pub netns: Vec<String>,
    /// Host-side links.
    pub links: Vec<String>,
}

/// The host side of one pool of slots. Slots keep it alive ([`Arc`]).
#[derive(Debug)]
pub struct HostNet {
    cfg: NetConfig,
    used: Mutex<BTreeSet<u32>>,
}

impl HostNet {
    /// Checks `cfg`, turns IPv4 forwarding on, (re)applies the host's
    /// shared table `inet shoal` (one transaction; it names no pool, so
    /// several pools share it) and opens other tables' forward chains that
    /// drop by default to slot traffic ([`forward`]).
    pub fn setup(cfg: NetConfig) -> Result<Arc<HostNet>, HostError> {
        cfg.validate()?;
        std::fs::write(IP_FORWARD, "1").map_err(|source| HostError::Io {
            what: format!("turning forwarding on ({IP_FORWARD})"),
            source,
        })?;
        cmd::run(
            "nft",
            &["-f", "-"],
            Some(&nft::render_host()),
            cfg.cmd_timeout,
        )?;
        for c in forward::open_all(cfg.cmd_timeout)? {
            tracing::info!("forward chain {c} drops by default: slot traffic accepted in it");
        }
        Ok(Arc::new(HostNet {
            cfg,
            used: Mutex::new(BTreeSet::new()),
        }))
    }

    /// Removes the host's shared table and the accepts inserted in other
    /// tables' forward chains (daemon shutdown, after every slot is gone;
    /// other pools on this host lose them too). Forwarding stays on.
    pub fn teardown(&self) -> Result<(), HostError> {
        forward::close_all(self.cfg.cmd_timeout)?;
        match cmd::run(
            "nft",
            &["delete", "table", "inet", nft::HOST_TABLE],
            None,
            self.cfg.cmd_timeout,
        ) {
            Err(CmdError::Failed { stderr, .. }) if stderr.contains("No such file") => Ok(()),
            r => r.map(drop).map_err(Into::into),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &NetConfig {
        &self.cfg
    }

    /// The netns name of slot `index`.
    pub fn netns_name(&self, index: u32) -> String {
        format!("{}{index}", self.cfg.netns_prefix)
    }

    /// The host-side veth name of slot `index`.
    pub fn link_name(&self, index: u32) -> String {
        format!("{}{index}", self.cfg.link_prefix)
    }

    /// Runs `ip` with the configured deadline.
    pub(crate) fn ip(&self, args: &[&str]) -> Result<String, CmdError> {
        cmd::run("ip", args, None, self.cfg.cmd_timeout)
    }

    /// Runs an nft script in a slot's netns: `nft` started from a thread
    /// inside it (no `ip netns exec`, which also makes a mount namespace
    /// and remounts /sys for each call).
    pub(crate) fn nft_in(&self, netns: &str, script: &str) -> Result<String, CmdError> {
        self.nft_args_in(netns, &["-f", "-"], Some(script))
    }

    /// Runs `nft ARGS` (with `stdin`) in a slot's netns.
    pub(crate) fn nft_args_in(
        &self,
        netns: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, CmdError> {
        let timeout = self.cfg.cmd_timeout;
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let stdin = stdin.map(str::to_string);
        let cmd_line = format!("nft {} (in netns {netns})", args.join(" "));
        let ran = netns::run_in(netns, move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Ok(cmd::run("nft", &args, stdin.as_deref(), timeout))
        });
        match ran {
            Ok(r) => r,
            Err(source) => Err(CmdError::Spawn {
                cmd: cmd_line,
                source,
            }),
        }
    }

    /// The host netns's own IPv4 addresses (and their subnet broadcasts),
    /// read in-process (`getifaddrs`, no `ip` run: every policy change
    /// reads them). Call from a thread in the host netns.
    pub fn host_addrs(&self) -> Result<Vec<Ipv4Addr>, HostError> {
        crate::ifaddrs::ipv4_addrs().map_err(|source| HostError::Io {
            what: "reading the host's addresses (getifaddrs)".into(),
            source,
        })
    }

    /// What no slot reaches unless named explicitly: the host's addresses
    /// (read now), the pool and [`nft::ALWAYS_DENIED`].
    pub fn blocked(&self) -> Result<Vec<Ipv4Net>, HostError> {
        let mut b: Vec<Ipv4Net> = nft::ALWAYS_DENIED
            .iter()
            .map(|s| s.parse().expect("valid built-in range"))
            .collect();
        b.push(self.cfg.pool.net());
        b.extend(self.host_addrs()?.into_iter().map(Ipv4Net::host));
        Ok(b)
    }

    fn used(&self) -> MutexGuard<'_, BTreeSet<u32>> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the lowest free index whose netns and link do not exist.
    pub(crate) fn take_index(&self) -> Result<u32, HostError> {
        let mut used = self.used();
        for i in 0..self.cfg.pool.capacity() {
            if used.contains(&i)
                || netns::path(&self.netns_name(i)).exists()
                || std::path::Path::new("/sys/class/net")
                    .join(self.link_name(i))
                    .exists()
            {
                continue;
            }
            used.insert(i);
            return Ok(i);
        }
        Err(HostError::Exhausted(self.cfg.pool.net()))
    }

    /// Takes `index` out of the free ones (a slot that exists already, a
    /// restarted daemon's sandbox's; or an address kept for the daemon);
    /// false if it is taken.
    pub fn reserve_index(&self, index: u32) -> bool {
        index < self.cfg.pool.capacity() && self.used().insert(index)
    }

    /// Gives an index back.
    pub(crate) fn free_index(&self, index: u32) {
        self.used().remove(&index);
    }

    /// The index in a name made of `prefix` and digits.
    fn index_of(prefix: &str, name: &str) -> Option<u32> {
        let digits = name.strip_prefix(prefix)?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// Removes every slot netns and host-side link of this configuration's
    /// prefixes whose index is neither in `keep` nor a live slot of this
    /// process (what a crashed daemon left).
    pub fn reclaim_stale(&self, keep: &HashSet<u32>) -> Result<Reclaimed, HostError> {
        let live = self.used().clone();
        let stale = |i: u32| !keep.contains(&i) && !live.contains(&i);
        let mut r = Reclaimed::default();
        let out = self.ip(&["-j", "link", "show"])?;
        let links: serde_json::Value = serde_json::from_str(&out)?;
        for l in links.as_array().into_iter().flatten() {
            let Some(name) = l["ifname"].as_str() else {
                continue;
            };
            match Self::index_of(&self.cfg.link_prefix, name) {
                Some(i) if stale(i) => {
                    ignore_missing(self.ip(&["link", "del", name]))?;
                    r.links.push(name.to_string());
                }
                _ => {}
            }
        }
        let dir = std::fs::read_dir(netns::NETNS_DIR);
        let entries = match dir {
            Ok(d) => d.filter_map(Result::ok).collect::<Vec<_>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
            Err(source) => {
                return Err(HostError::Io {
                    what: format!("listing {}", netns::NETNS_DIR),
                    source,
                })
            }
        };
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            match Self::index_of(&self.cfg.netns_prefix, &name) {
                Some(i) if stale(i) => {
                    ignore_missing(self.ip(&["netns", "del", &name]))?;
                    r.netns.push(name);
                }
                _ => {}
            }
        }
        r.links.sort();
        r.netns.sort();
        Ok(r)
    }
}

/// Treats "it is not there" as done (removal is idempotent).
pub(crate) fn ignore_missing(r: Result<String, CmdError>) -> Result<(), CmdError> {
    match r {
        Err(CmdError::Failed { stderr, .. })
            if stderr.contains("Cannot find device")
                || stderr.contains("No such file")
                || stderr.contains("does not exist") =>
        {
            Ok(())
        }
        r => r.map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_are_checked() {
        let ok = NetConfig::default();
        assert!(ok.validate().is_ok());
        for (ns, link) in [
            ("shoal-1", "shv"),
            ("", "shv"),
            ("sh/oal-", "shv"),
            ("shoal-", "shx"),
            ("shoal-", "shvabcdefghijk"),
            ("shoal-", "shva1"),
        ] {
            let c = NetConfig {
                netns_prefix: ns.into(),
                link_prefix: link.into(),
                ..NetConfig::default()
            };
            assert!(c.validate().is_err(), "{ns:?} {link:?}");
        }
        for f in ["127.0.0.1:53", "0.0.0.0:53", "10.0.0.1:0"] {
            let c = NetConfig {
                forwarder: Some(f.parse().unwrap()),
                ..NetConfig::default()
            };
            assert!(c.validate().is_err(), "{f}");
        }
    }

    #[test]
    fn stale_names_are_prefix_and_digits() {
        assert_eq!(HostNet::index_of("shv", "shv12"), Some(12));
        assert_eq!(HostNet::index_of("shv", "shvta3"), None);
        assert_eq!(HostNet::index_of("shv", "shv"), None);
        assert_eq!(HostNet::index_of("shoal-", "shoal-7"), Some(7));
        assert_eq!(HostNet::index_of("shoal-", "shoal-t-7"), None);
    }
}
