//! What a vsock device keeps across a snapshot. Connections are not saved:
//! after a restore the device sends the guest TRANSPORT_RESET
//! ([`super::VsockHandle::send_transport_reset`]) and the guest drops its
//! sockets.

use crate::virtio::persist::QueueSaved;
use serde::{Deserialize, Serialize};

/// Saved vsock device state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    /// Guest context id.
    pub cid: u64,
    /// Features the driver accepted.
    pub acked_features: u64,
    /// rx, tx and event queue positions while active; empty otherwise.
    pub queues: Vec<QueueSaved>,
}
