//! What a vsock device keeps across a snapshot. Connections are not saved:
//! after a restore the device sends the guest TRANSPORT_RESET
//! ([`super::VsockHandle::send_transport_reset`]) and the guest drops its
//! sockets.

use crate::virtio::persist::QueueState;
use crate::virtio::VirtioInterrupt;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use vm_memory::GuestMemoryMmap;

/// Saved vsock device state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    /// Guest context id.
    pub cid: u64,
    /// Features the driver accepted.
    pub acked_features: u64,
    /// rx, tx and event queue positions while active; empty otherwise.
    pub queues: Vec<QueueState>,
}

/// What restoring a vsock device needs besides its state.
pub struct VsockArgs {
    /// The host socket to listen on (must not exist).
    pub uds_path: PathBuf,
    /// Guest memory, for re-activating an active device.
    pub mem: GuestMemoryMmap,
    /// The transport's interrupt, for re-activating an active device.
    pub irq: Arc<VirtioInterrupt>,
}
