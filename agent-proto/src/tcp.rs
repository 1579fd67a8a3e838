//! TCP forwarding: a connection that sends [`TcpConnect`] after its
//! `Hello` stops carrying frames once the agent answers `Ok` and becomes a
//! plain byte relay to a TCP port on the guest's loopback (one forwarded
//! TCP connection per agent connection; see `guest-agent/PROTOCOL.md`).

use crate::codec::{DecodeError, Message, Reader, Wire};
use crate::frame::Kind;

/// Longest connect timeout a client may ask for (the agent caps it).
pub const TCP_CONNECT_TIMEOUT_MAX_MS: u32 = 60_000;

/// Opens a TCP connection to `127.0.0.1:port` in the guest; on `Ok` the
/// rest of the stream, both ways, is that connection's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConnect {
    /// The guest port (not 0).
    pub port: u16,
    /// How long the connect may take, in ms (0: the agent's default of
    /// 10 s; capped at [`TCP_CONNECT_TIMEOUT_MAX_MS`]).
    pub timeout_ms: u32,
}
message!(TcpConnect = TcpConnect { port, timeout_ms });
