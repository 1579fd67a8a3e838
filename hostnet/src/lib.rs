//! `shoal-hostnet`: per-sandbox network slots on the host.
//!
//! A sandbox that asks for network gets a [`Slot`]: a network namespace
//! joined to the host by a veth pair, a TAP (`tap0`) inside it for the
//! VMM's virtio-net device, addresses from a pool ([`addr`]), NAT out
//! through the host, and an nftables default-drop egress [`EgressPolicy`]
//! ([`policy`], rendered by [`nft`]) that changes while the sandbox runs.
//! [`HostNet`] is the host side (forwarding, the shared table, reclaiming
//! what a crashed daemon left), [`SlotPool`] keeps slots made ahead, and
//! [`probe`] says what the host lacks. [`dns`] is the forwarder that answers
//! a sandbox only for the names its policy allows and lets the answers'
//! addresses through for their TTL.
//!
//! Everything runs `ip` (iproute2) and `nft` (nftables) with arguments,
//! never through a shell, each call with a deadline ([`cmd`]); root is
//! needed. IPv4 only for now.

pub mod addr;
pub mod cmd;
pub mod dns;
pub mod forward;
pub mod host;
mod ifaddrs;
pub mod netns;
pub mod nft;
pub mod policy;
pub mod pool;
pub mod probe;
pub mod slot;

pub use addr::{AddrPool, Ipv4Net, MacAddr, SlotAddrs};
pub use host::{HostError, HostNet, NetConfig, Reclaimed};
pub use nft::{Count, SlotCounters};
pub use policy::{EgressPolicy, PolicyError};
pub use pool::SlotPool;
pub use probe::probe;
pub use slot::{GuestLink, Slot, SlotError};
