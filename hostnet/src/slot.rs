//! A slot: one sandbox's network. A netns `shoal-<n>` joined to the host
//! by a veth pair (`shv<n>` on the host, `veth0` inside), and `tap0`
//! inside, the guest's link, with the gateway address; the host routes the
//! guest's address via the veth (no NAT inside the slot), and masquerades
//! it on the way out. The slot's nftables table enforces the policy
//! ([`crate::nft`]). IPv4 only for now.
//!
//! Removing it (or dropping it) deletes the veth (with the host's route)
//! and the netns (with tap0, the table and its conntrack entries).

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::addr::{AddrError, MacAddr, SlotAddrs, LINK_PREFIX};
use crate::cmd::CmdError;
use crate::host::{ignore_missing, HostError, HostNet};
use crate::netns;
use crate::nft::{self, NftError, PolicySets, GUEST_IF};
use crate::policy::EgressPolicy;

/// The slot side of the veth.
pub const NS_LINK: &str = "veth0";

/// What went wrong with a slot.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The host side.
    #[error(transparent)]
    Host(#[from] HostError),
    /// An `ip` or `nft` command failed.
    #[error("slot {slot}: {source}")]
    Cmd {
        /// The slot's netns.
        slot: String,
        /// The command's failure.
        #[source]
        source: CmdError,
    },
    /// Its addresses.
    #[error(transparent)]
    Addr(#[from] AddrError),
    /// The policy cannot be applied.
    #[error(transparent)]
    Policy(#[from] NftError),
    /// A system call in the slot's netns failed.
    #[error("slot {slot}: {what}: {source}")]
    Io {
        /// The slot's netns.
        slot: String,
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// [`Slot::adopt`] of a slot whose netns or host link is not there.
    #[error("slot {slot}: its netns or host link is gone")]
    Gone {
        /// The slot's netns.
        slot: String,
    },
    /// [`Slot::adopt`] of a slot this process holds already.
    #[error("slot {slot} is held already")]
    Taken {
        /// The slot's netns.
        slot: String,
    },
    /// An address the slot cannot use (IPv6: slots are IPv4 only).
    #[error("slot {slot}: {ip} is not an IPv4 address (slots are IPv4 only)")]
    NotV4 {
        /// The slot's netns.
        slot: String,
        /// The address.
        ip: IpAddr,
    },
    /// `nft -j` printed something else than its JSON.
    #[error("slot {slot}: cannot read the counters: {source}")]
    Counters {
        /// The slot's netns.
        slot: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// What the guest's link (`tap0` in the slot) is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestLink {
    /// A persistent TAP for the VMM (`IFF_NO_PI`, `IFF_VNET_HDR`), owned by
    /// `owner` (uid, gid) if given, so that a jailed VMM can attach to it;
    /// or hand the VMM [`Slot::open_tap_fd`].
    Tap {
        /// uid and gid allowed to attach.
        owner: Option<(u32, u32)>,
    },
    /// A veth whose peer `peer` is moved into the existing netns
    /// `peer_netns` and configured as the guest would be (MAC, address,
    /// default route): a netns standing in for a VM, for tests.
    Veth {
        /// The netns the guest's side goes to.
        peer_netns: String,
        /// The guest side's name there.
        peer: String,
    },
}

/// One slot. Dropping it removes it (errors are logged); [`Slot::remove`]
/// reports them.
#[derive(Debug)]
pub struct Slot {
    net: Arc<HostNet>,
    addrs: SlotAddrs,
    netns: String,
    link: String,
    policy: Mutex<EgressPolicy>,
    /// The sets the policy was applied as (with the host's addresses
    /// then); None until applied.
    applied: Mutex<Option<PolicySets>>,
    removed: bool,
}

impl Slot {
    /// Makes a slot from the next free index of `net`'s pool with `link` as
    /// the guest's link and `policy` applied. A failure part-way removes
    /// what was made.
    pub fn create(
        net: &Arc<HostNet>,
        link: &GuestLink,
        policy: EgressPolicy,
    ) -> Result<Slot, SlotError> {
        let index = net.take_index()?;
        let addrs = match net.config().pool.slot(index) {
            Ok(a) => a,
            Err(e) => {
                net.free_index(index);
                return Err(e.into());
            }
        };
        let slot = Slot {
            net: net.clone(),
            addrs,
            netns: net.netns_name(index),
            link: net.link_name(index),
            policy: Mutex::new(policy),
            applied: Mutex::new(None),
            removed: false,
        };
        // On an error the slot drops here, which removes what was made.
        slot.build(link)?;
        Ok(slot)
    }
    /// Takes over slot `index`, made by an earlier process of this daemon
    /// (its sandbox outlived a restart): its netns and host link must
    /// exist; `policy` is applied again at once. Removing it or dropping
    /// it removes the slot as for one made here.
    pub fn adopt(net: &Arc<HostNet>, index: u32, policy: EgressPolicy) -> Result<Slot, SlotError> {
        let addrs = net.config().pool.slot(index)?;
        let (netns, link) = (net.netns_name(index), net.link_name(index));
        let present = netns::path(&netns).exists()
            && std::path::Path::new("/sys/class/net").join(&link).exists();
        if !present {
            return Err(SlotError::Gone { slot: netns });
        }
        if !net.reserve_index(index) {
            return Err(SlotError::Taken { slot: netns });
        }
        let slot = Slot {
            net: net.clone(),
            addrs,
            netns,
            link,
            policy: Mutex::new(EgressPolicy::default()),
            applied: Mutex::new(None),
            removed: false,
        };
        match slot.set_policy(policy) {
            Ok(()) => Ok(slot),
            Err(e) => {
                // Not ours to remove on a failure: the sandbox may still
                // run; a restart tries again.
                let mut slot = slot;
                slot.removed = true;
                net.free_index(index);
                Err(e)
            }
        }
    }

    fn cmd_err(&self) -> impl Fn(CmdError) -> SlotError + '_ {
        move |source| SlotError::Cmd {
            slot: self.netns.clone(),
            source,
        }
    }

    fn ip(&self, args: &[&str]) -> Result<(), SlotError> {
        self.net.ip(args).map(drop).map_err(self.cmd_err())
    }

    fn build(&self, link: &GuestLink) -> Result<(), SlotError> {
        let a = &self.addrs;
        let (ns, host_link) = (self.netns.as_str(), self.link.as_str());
        let cidr = |ip: Ipv4Addr| format!("{ip}/{LINK_PREFIX}");
        self.ip(&["netns", "add", ns])?;
        self.ip(&[
            "link", "add", host_link, "type", "veth", "peer", "name", NS_LINK, "netns", ns,
        ])?;
        self.ip(&["addr", "add", &cidr(a.host), "dev", host_link])?;
        self.ip(&["link", "set", host_link, "up"])?;
        self.ip(&["-n", ns, "link", "set", "lo", "up"])?;
        self.ip(&["-n", ns, "addr", "add", &cidr(a.ns), "dev", NS_LINK])?;
        self.ip(&["-n", ns, "link", "set", NS_LINK, "up"])?;
        self.ip(&[
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            &a.host.to_string(),
        ])?;
        match link {
            GuestLink::Tap { owner } => {
                let (u, g) = owner.map(|(u, g)| (u.to_string(), g.to_string())).unzip();
                let mut args = vec!["-n", ns, "tuntap", "add", "dev", GUEST_IF, "mode", "tap"];
                args.push("vnet_hdr");
                if let (Some(u), Some(g)) = (&u, &g) {
                    args.extend(["user", u.as_str(), "group", g.as_str()]);
                }
                self.ip(&args)?;
            }
            GuestLink::Veth { peer_netns, peer } => {
                let mac = a.guest_mac.to_string();
                self.ip(&[
                    "-n", ns, "link", "add", GUEST_IF, "type", "veth", "peer", "name", peer,
                    "netns", peer_netns,
                ])?;
                self.ip(&["-n", peer_netns, "link", "set", peer, "address", &mac, "up"])?;
                self.ip(&["-n", peer_netns, "addr", "add", &cidr(a.guest), "dev", peer])?;
                self.ip(&[
                    "-n",
                    peer_netns,
                    "route",
                    "add",
                    "default",
                    "via",
                    &a.gateway.to_string(),
                ])?;
            }
        }
        self.ip(&["-n", ns, "addr", "add", &cidr(a.gateway), "dev", GUEST_IF])?;
        self.ip(&["-n", ns, "link", "set", GUEST_IF, "up"])?;
        let guest = format!("{}/32", a.guest);
        let via = a.ns.to_string();
        self.ip(&["route", "add", &guest, "via", &via, "dev", host_link])?;
        netns::run_in(ns, || std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")).map_err(
            |source| SlotError::Io {
                slot: self.netns.clone(),
                what: "turning forwarding on",
                source,
            },
        )?;
        let sets = PolicySets::new(&self.policy(), &self.net.blocked()?)?;
        let script = nft::render_slot(a, self.net.config().forwarder, &sets)?;
        self.net.nft_in(ns, &script).map_err(self.cmd_err())?;
        *self.lock_applied() = Some(sets);
        Ok(())
    }

    /// The slot's index in its pool.
    pub fn index(&self) -> u32 {
        self.addrs.index
    }

    /// Its addresses.
    pub fn addrs(&self) -> &SlotAddrs {
        &self.addrs
    }

    /// The guest's address.
    pub fn guest_ip(&self) -> Ipv4Addr {
        self.addrs.guest
    }

    /// The guest's MAC address.
    pub fn guest_mac(&self) -> MacAddr {
        self.addrs.guest_mac
    }

    /// The guest's gateway and DNS server.
    pub fn gateway(&self) -> Ipv4Addr {
        self.addrs.gateway
    }

    /// The netns name (`shoal-<n>`).
    pub fn netns_name(&self) -> &str {
        &self.netns
    }

    /// The netns file, for the jailer's `--netns`.
    pub fn netns_path(&self) -> PathBuf {
        netns::path(&self.netns)
    }

    /// The host-side veth (`shv<n>`).
    pub fn host_link(&self) -> &str {
        &self.link
    }

    fn lock_policy(&self) -> MutexGuard<'_, EgressPolicy> {
        self.policy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The policy in force.
    pub fn policy(&self) -> EgressPolicy {
        self.lock_policy().clone()
    }

    /// Opens `tap0` from inside the slot (`IFF_TAP | IFF_NO_PI |
    /// IFF_VNET_HDR`), for a VMM to be handed the descriptor.
    pub fn open_tap_fd(&self) -> Result<OwnedFd, SlotError> {
        netns::run_in(&self.netns, || netns::attach_tap(GUEST_IF)).map_err(|source| SlotError::Io {
            slot: self.netns.clone(),
            what: "opening tap0",
            source,
        })
    }

    /// Lets `uid`/`gid` attach to `tap0` (a pooled slot is made before its
    /// sandbox's uid is known).
    pub fn set_tap_owner(&self, uid: u32, gid: u32) -> Result<(), SlotError> {
        let fd = self.open_tap_fd()?;
        netns::set_tap_owner(&fd, uid, gid).map_err(|source| SlotError::Io {
            slot: self.netns.clone(),
            what: "setting tap0's owner",
            source,
        })
    }

    /// Replaces the policy in one nftables transaction (the host's
    /// addresses are read again). The guest's next packet to a destination
    /// no longer allowed is dropped, established connection or not. The
    /// forwarder's addresses are kept if the domains did not change.
    pub fn set_policy(&self, new: EgressPolicy) -> Result<(), SlotError> {
        let mut cur = self.lock_policy();
        let sets = PolicySets::new(&new, &self.net.blocked()?)?;
        if new.allow_dns() && self.net.config().forwarder.is_none() {
            return Err(NftError::NoForwarder.into());
        }
        let script = nft::render_policy_update(&sets, self.addrs.gateway, !cur.same_domains(&new));
        self.net
            .nft_in(&self.netns, &script)
            .map_err(self.cmd_err())?;
        *cur = new;
        *self.lock_applied() = Some(sets);
        Ok(())
    }

    /// Whether `policy` is in force as [`Slot::set_policy`] would apply it
    /// now: the same policy, applied as the same sets as the host's
    /// addresses now give (they are always denied; those inside the pool,
    /// as other slots' links are, change nothing). A slot made ahead with
    /// the policy a create asks for then needs no nft run.
    pub fn has_policy(&self, policy: &EgressPolicy) -> Result<bool, SlotError> {
        let cur = self.lock_policy();
        if *cur != *policy {
            return Ok(false);
        }
        let now = PolicySets::new(policy, &self.net.blocked()?)?;
        Ok(self.lock_applied().as_ref() == Some(&now))
    }

    fn lock_applied(&self) -> MutexGuard<'_, Option<PolicySets>> {
        self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets the guest reach `ip` (TCP, UDP, ICMP; any port) for `ttl`: the
    /// DNS forwarder calls it with the addresses of an allowed name's
    /// answer. The always-denied ranges and `deny_out` still win.
    pub fn allow_addr(&self, ip: IpAddr, ttl: Duration) -> Result<(), SlotError> {
        let IpAddr::V4(v4) = ip else {
            return Err(SlotError::NotV4 {
                slot: self.netns.clone(),
                ip,
            });
        };
        let script = nft::render_allow_addr(v4, ttl)?;
        self.net
            .nft_in(&self.netns, &script)
            .map_err(self.cmd_err())?;
        Ok(())
    }

    /// Reads the slot's counters.
    pub fn counters(&self) -> Result<nft::SlotCounters, SlotError> {
        let out = self
            .net
            .nft_args_in(
                &self.netns,
                &["-j", "list", "counters", "table", "inet", nft::SLOT_TABLE],
                None,
            )
            .map_err(self.cmd_err())?;
        nft::parse_counters(&out).map_err(|source| SlotError::Counters {
            slot: self.netns.clone(),
            source,
        })
    }

    /// Removes the slot: its veth (and so the host's route to the guest)
    /// and its netns (tap0, the table, conntrack). Idempotent for the
    /// parts already gone.
    pub fn remove(mut self) -> Result<(), SlotError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), SlotError> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        let link = ignore_missing(self.net.ip(&["link", "del", &self.link]));
        let ns = ignore_missing(self.net.ip(&["netns", "del", &self.netns]));
        if link.is_ok() && ns.is_ok() {
            self.net.free_index(self.addrs.index);
        }
        // An index whose removal failed stays taken (a later reclaim_stale
        // of this process skips it too; a restart reclaims it).
        link.and(ns).map_err(self.cmd_err())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!("removing slot {}: {e}", self.netns);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The daemon shares a slot between its API and the DNS forwarder.
    #[test]
    fn slots_are_send_and_sync() {
        fn shared<T: Send + Sync>() {}
        shared::<super::Slot>();
        shared::<crate::SlotPool>();
    }
}
