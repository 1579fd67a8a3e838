//! What a net device keeps across a snapshot: features and queue
//! positions. Not the TAP or the MAC: a restore is given new ones
//! ([`NetArgs`]), so a clone never sends with its template's identity.

use super::tap::Tap;
use super::{MacAddr, NetConfig};
use crate::virtio::persist::QueueState;
use crate::virtio::VirtioInterrupt;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use vm_memory::GuestMemoryMmap;

/// Saved net device state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    /// The MAC the device had (for the record; a restore takes
    /// [`NetArgs::config`]'s).
    pub mac: MacAddr,
    /// Features the driver accepted.
    pub acked_features: u64,
    /// rx and tx queue positions while active; empty otherwise.
    pub queues: Vec<QueueState>,
}

/// What restoring a net device needs besides its state.
pub struct NetArgs {
    /// The clone's own TAP.
    pub tap: Tap,
    /// The clone's MAC and rate limits.
    pub config: NetConfig,
    /// Guest memory, for re-activating an active device.
    pub mem: GuestMemoryMmap,
    /// The transport's interrupt, for re-activating an active device.
    pub irq: Arc<VirtioInterrupt>,
}
