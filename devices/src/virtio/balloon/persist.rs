//! What a balloon keeps across a snapshot: the host's target, the guest's
//! balloon size, features and queue positions, the latest stats and its
//! counters. The stats buffer the device holds needs nothing more: it
//! stays the stats queue's next entry until the host asks for new stats.
//!
//! The VMM restores virtio devices through their MMIO transport (which
//! re-activates a fresh device with the saved queues); the rest of this
//! state then goes in with [`super::BalloonHandle::load`].
//! [`snapshot::Persist`] for [`super::Balloon`] does both at once.

use super::parse::BalloonStats;
use super::queues::BalloonCounters;
use super::release::GiveBack;
use super::BalloonConfig;
use crate::virtio::persist::QueueState;
use crate::virtio::VirtioInterrupt;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use vm_memory::GuestMemoryMmap;

/// Saved balloon state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonState {
    /// The host's target (config `num_pages`).
    pub num_pages: u32,
    /// The guest's balloon size (config `actual`).
    pub actual: u32,
    /// Features the driver accepted.
    pub acked_features: u64,
    /// Queue positions while active (in the negotiated layout); empty
    /// otherwise.
    pub queues: Vec<QueueState>,
    /// The latest stats.
    pub stats: BalloonStats,
    /// Counters.
    pub counters: BalloonCounters,
}

/// What restoring a balloon needs besides its state.
pub struct BalloonArgs {
    /// The device's configuration (what it offers).
    pub config: BalloonConfig,
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// The transport's interrupt, for re-activating an active device.
    pub irq: Arc<VirtioInterrupt>,
    /// How pages are given back.
    pub give_back: Box<dyn GiveBack>,
}
