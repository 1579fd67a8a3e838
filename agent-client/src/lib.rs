//! Host-side clients of the Shoal guest agent (`shoal-agent`), speaking
//! the protocol of [`agent_proto`] (see `guest-agent/PROTOCOL.md`).
//!
//! - [`Client`]: blocking; one reader thread per connection, calls from
//!   any number of threads.
//! - [`AsyncClient`]: tokio; one connection multiplexes any number of
//!   concurrent requests with no thread at all (a reader and a writer task),
//!   bounded buffers and a deadline on every wait.
//!
//! Both are built on one sans-I/O session core (`session`): the same
//! request bytes, the same checks of everything the agent sends (which is
//! not trusted), the same caps ([`Limits`]). Both reach the agent over a
//! [`Transport`]: a Unix socket, a VMM's hybrid vsock Unix socket
//! (`CONNECT <port>` handshake, with connect-retry), or AF_VSOCK.
//!
//! [`syscount`] analyses strace output of the agent (host benchmarks and
//! tests).

mod aio;
mod blocking;
mod error;
mod session;
pub mod syscount;
mod transport;
mod tunnel;

pub use agent_proto::{
    AgentMode, Command, DirEntry, ErrorCode, ExecRequest, ExecResult, ExitStatus, FileStat,
    FileType, HealthReply, HelloOk, NetConfigure, NetConfigured, PostRestoreReply, User,
    VersionReply, VSOCK_PORT,
};
pub use aio::{AsyncClient, AsyncDownload, AsyncExecHandle, AsyncExecStdin, AsyncUpload, Config};
pub use blocking::{Client, ExecHandle, ExecStdin};
pub use error::{ClientError, Result};
pub use session::{
    ExecEvent, ExecOutput, Limits, UploadOptions, CHANNEL_FRAMES, DIR_ENTRY_OVERHEAD,
};
pub use transport::Transport;
pub use tunnel::tcp_connect;
