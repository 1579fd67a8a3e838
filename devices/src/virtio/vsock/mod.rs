//! virtio-vsock with a hybrid (Firecracker-style) Unix-socket host side.
//!
//! The host side of a VM is one listening Unix socket at `uds_path`:
//! - host-initiated: a client connects to `uds_path`, writes
//!   `CONNECT <port>\n`, and once the guest accepts it reads
//!   `OK <local_port>\n`; from then on the socket is a raw byte stream to
//!   the guest's `port`;
//! - guest-initiated: a guest connection to host cid 2, port `P`, is
//!   forwarded to a Unix listener at `<uds_path>_<P>`, or refused with RST.
//!
//! Two halves share one lock: [`Vsock`] is the virtio device the MMIO
//! transport drives from vCPU threads (guest TX, RX refills), and
//! [`VsockEvents`] is an `event_manager` subscriber that serves the listening
//! socket and every connection's readiness on the VMM's event thread.
//! [`VsockHandle`] is a cloneable side door for the VMM (transport reset,
//! snapshots, counters).
//!
//! Memory is bounded everywhere: host->guest bytes are read from a host
//! socket only into a guest RX buffer the guest has credit for; guest->host
//! bytes the host does not take at once are kept up to [`CONN_TX_BUF_SIZE`]
//! per connection, which is exactly the credit the guest is given; at most
//! [`MAX_CONNECTIONS`] connections exist at once, at most
//! [`MAX_GUEST_CONNECTIONS`] of them opened by the guest; a host connection
//! the guest never accepts lives [`CONNECT_TIMEOUT`] at most.

mod conn;
mod device;
mod events;
mod handshake;
mod muxer;
mod packet;
mod persist;
mod shared;
mod unix;

pub use conn::CREDIT_UPDATE_THRESHOLD;
pub use device::{Vsock, VsockError, VsockHandle};
pub use events::VsockEvents;
pub use muxer::Counters;
pub use persist::{VsockArgs, VsockState};

/// Virtio device type of a vsock device.
pub const TYPE_VSOCK: u32 = 19;
/// Queue indices.
pub const RXQ: usize = 0;
/// Guest-to-device packets.
pub const TXQ: usize = 1;
/// Device-to-guest events.
pub const EVQ: usize = 2;
/// Size offered for each of the three queues.
pub const QUEUE_SIZE: u16 = 256;
/// The host's context id.
pub const HOST_CID: u64 = 2;
/// Guest->host bytes kept per connection while the host reader is slow;
/// also the `buf_alloc` the guest is told, so a guest that honours credit
/// never exceeds it.
pub const CONN_TX_BUF_SIZE: u32 = 256 * 1024;
/// Most connections (including host sockets still sending their CONNECT
/// line) at once; more are refused.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most guest-initiated connections at once (more are refused with RST):
/// the rest of the table stays for host connections, so a guest that opens
/// thousands cannot lock the host (the daemon's agent connection) out.
pub const MAX_GUEST_CONNECTIONS: usize = MAX_CONNECTIONS / 2;
/// A host socket that has not sent its whole CONNECT line, or a host
/// connection the guest has not accepted (RESPONSE), this long after it
/// came is closed, its entry freed and the guest's half reset. The event
/// thread checks with a timerfd, armed only while such sockets exist.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// First local port handed to host-initiated connections.
pub const FIRST_LOCAL_PORT: u32 = 1 << 30;
/// Largest payload of one packet in either direction.
pub const MAX_PKT_DATA: u32 = 64 * 1024;
