//! The error type of both clients.

use thiserror::Error;

use agent_proto::ErrorCode;

/// Errors of client calls.
#[derive(Debug, Error)]
pub enum ClientError {
    /// Connecting, reading or writing failed.
    #[error("agent connection i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The VMM's hybrid vsock socket refused `CONNECT <port>`.
    #[error("vsock CONNECT handshake failed: {0}")]
    VsockHandshake(String),
    /// The agent speaks another protocol version.
    #[error("agent protocol version mismatch: {0}")]
    VersionMismatch(String),
    /// The agent refused the handshake for another reason.
    #[error("agent refused the handshake: {0}")]
    Handshake(String),
    /// The agent answered the request with an error.
    #[error("agent error ({code:?}, errno {errno}): {message}")]
    Remote {
        /// Error class.
        code: ErrorCode,
        /// Linux errno, for I/O and spawn errors (else 0).
        errno: i32,
        /// Detail from the agent.
        message: String,
    },
    /// The connection closed before the answer came.
    #[error("agent connection closed")]
    Disconnected,
    /// No answer within the client's timeout.
    #[error("timed out waiting for the agent")]
    Timeout,
    /// The agent sent something this client did not expect (a malformed or
    /// oversized frame, a reply of the wrong kind, an inconsistent count).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The agent sent more than this client accepts to hold for one call
    /// (see [`crate::Limits`]).
    #[error("limit exceeded: {0}")]
    Limit(String),
    /// Too many requests are in flight on this connection.
    #[error("too many requests in flight on one agent connection ({0})")]
    Busy(usize),
    /// This stream's consumer did not take its frames for longer than the
    /// client's stall timeout; the stream was dropped so that the other
    /// requests on the connection could go on.
    #[error("stream dropped: its reader stalled for more than {0:?}")]
    Stalled(std::time::Duration),
}

impl ClientError {
    /// The errno of a remote I/O or spawn error.
    pub fn errno(&self) -> Option<i32> {
        match self {
            ClientError::Remote { errno, .. } if *errno != 0 => Some(*errno),
            _ => None,
        }
    }

    /// Whether connecting again may succeed (the socket is missing or
    /// refuses, the guest is not listening yet, or the connection dropped):
    /// what the connect-retry loops retry on.
    pub fn is_retryable_connect(&self) -> bool {
        matches!(
            self,
            ClientError::Io(_) | ClientError::VsockHandshake(_) | ClientError::Disconnected
        )
    }
}

/// Result of client calls.
pub type Result<T> = std::result::Result<T, ClientError>;
