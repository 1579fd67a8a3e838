//! virtio-net on a host TAP interface: one rx and one tx queue, the
//! host-given MAC in config space, checksum and TCP segmentation offloads
//! ([`offload`]) and no control queue.
//!
//! Two halves share one lock, as with vsock: [`Net`] is the virtio device
//! the MMIO transport drives from vCPU threads (guest tx, rx refills), and
//! [`NetEvents`] is an `event_manager` subscriber on the VMM's event thread
//! that serves the TAP's readiness and the rate limiter's retry timer.
//! [`NetHandle`] is a cloneable side door for the VMM (counters, the MAC,
//! the retry deadline, a config-change interrupt after restore).
//!
//! What the guest controls is bounded: a tx frame is at most
//! [`MAX_FRAME_LEN`] bytes with its header, read from guest memory through
//! `vm-memory` (every descriptor's address and length checked); a frame
//! whose Ethernet source is not the device's MAC is dropped and counted; rx
//! holds at most one frame in VMM memory (read from the TAP only while the
//! guest has a buffer for it or to fill that one slot), and the TAP's
//! edge-triggered readiness is not re-armed while rx waits, so a guest that
//! gives no buffers costs nothing. Frames that do not fit the guest's
//! buffer are dropped and counted (VIRTIO_NET_F_MRG_RXBUF is not offered:
//! the driver must post buffers of at least 1526 bytes, as Linux does, or
//! of 64 KiB once it takes GUEST_TSO4/6, as Linux does too).
//!
//! The guest's driver must take VIRTIO_NET_F_MAC (Linux does): one that
//! picks a MAC of its own has every frame dropped as spoofed.
//! VIRTIO_RING_F_EVENT_IDX is offered: interrupts and notifications only
//! where the other side's event index asks for them. The TAP must keep an MTU of at
//! most 1500 (larger frames do not fit the buffers a driver posts without
//! MRG_RXBUF and GUEST_TSO, and are dropped as `rx_too_small`); it hands
//! over 64 KiB TCP segments only to a driver that took GUEST_TSO4/6.
//!
//! The MAC is the host's: the guest cannot write config space, and a
//! restored clone gets a new TAP and MAC ([`NetArgs`]). Linux reads the MAC
//! only at probe, so after a restore the guest agent sets the interface's
//! address to the one in config space (`NetHandle::signal_config_change`
//! raises the config interrupt, for VIRTIO_NET_F_STATUS drivers).

mod device;
mod events;
pub mod offload;
mod persist;
mod rx;
mod shared;
pub mod tap;

pub use device::{Net, NetError, NetHandle};
pub use events::NetEvents;
pub use persist::{NetArgs, NetState};
pub use shared::NetCounters;
pub use tap::{Tap, TapError};

use crate::rate_limiter::RateLimit;
use serde::{Deserialize, Serialize};

/// Virtio device type of a network device.
pub const TYPE_NET: u32 = 1;
/// Queue indices.
pub const RXQ: usize = 0;
/// Guest-to-host frames.
pub const TXQ: usize = 1;
/// Size offered for each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Feature: the device has a MAC in config space.
pub const VIRTIO_NET_F_MAC: u32 = 5;
/// Feature: the driver takes a frame across several rx buffers
/// (`num_buffers` in the header says how many).
pub const VIRTIO_NET_F_MRG_RXBUF: u32 = 15;
/// Feature: the config space has a link status field.
pub const VIRTIO_NET_F_STATUS: u32 = 16;
/// Link status bit: up.
pub const VIRTIO_NET_S_LINK_UP: u16 = 1;
/// `virtio_net_hdr_v1` (with `num_buffers`), before every frame.
pub const VNET_HDR_LEN: usize = 12;
/// Largest frame in either direction, header included (64 KiB of IP
/// packet, an Ethernet header with a VLAN tag, and the virtio header).
pub const MAX_FRAME_LEN: usize = 65_562;
/// An Ethernet header: destination, source, type.
pub const ETH_HDR_LEN: usize = 14;

/// How to build a net device (besides its TAP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetConfig {
    /// The guest's MAC, chosen by the host (unicast, not zero).
    pub mac: MacAddr,
    /// Limits on host-to-guest frames.
    pub rx_rate: RateLimit,
    /// Limits on guest-to-host frames.
    pub tx_rate: RateLimit,
}

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MacAddr(pub [u8; 6]);

/// Why a MAC address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    /// Not six hex octets separated by ':'.
    #[error("{0:?} is not a MAC address (six hex octets separated by ':')")]
    Syntax(String),
    /// A multicast/broadcast or all-zero address cannot be a device's own.
    #[error("{0} is not a unicast address (zero, or multicast bit set)")]
    NotUnicast(MacAddr),
}

impl MacAddr {
    /// Checks the address can be a device's own: unicast and not zero.
    pub fn validate(self) -> Result<MacAddr, MacError> {
        if self.0 == [0; 6] || self.0[0] & 1 != 0 {
            return Err(MacError::NotUnicast(self));
        }
        Ok(self)
    }
}

impl std::fmt::Display for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl std::str::FromStr for MacAddr {
    type Err = MacError;

    fn from_str(s: &str) -> Result<Self, MacError> {
        let err = || MacError::Syntax(s.to_owned());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for o in &mut out {
            let p = parts.next().ok_or_else(err)?;
            if p.len() != 2 {
                return Err(err());
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parse_print_validate() {
        let m: MacAddr = "02:aB:00:10:ff:01".parse().unwrap();
        assert_eq!(m.0, [2, 0xab, 0, 0x10, 0xff, 1]);
        assert_eq!(m.to_string(), "02:ab:00:10:ff:01");
        assert_eq!(m.validate(), Ok(m));
        for bad in [
            "",
            "02:ab:00:10:ff",
            "02:ab:00:10:ff:01:02",
            "2:ab:00:10:ff:01",
            "zz:00:00:00:00:00",
        ] {
            assert!(
                matches!(bad.parse::<MacAddr>(), Err(MacError::Syntax(_))),
                "{bad}"
            );
        }
        assert!(MacAddr([0; 6]).validate().is_err());
        assert!(MacAddr([1, 0, 0, 0, 0, 1]).validate().is_err());
        assert!(MacAddr([0xff; 6]).validate().is_err());
    }
}
