//! TCP forwarding to a guest port: [`tcp_connect`] opens a connection of
//! its own to the agent, sends `Hello` and `TcpConnect` in one write, and
//! once the agent answers `Ok` hands back the bare stream, which from then
//! on carries the guest TCP connection's bytes both ways (see
//! `guest-agent/PROTOCOL.md`, "TCP forwarding").
//!
//! A connection per forwarded connection (not streams multiplexed on the
//! sandbox's shared agent connection): the bytes go through with no framing
//! and no copy into per-request channels, flow control is the sockets' own
//! (each side stops reading when the other cannot take more), and bulk port
//! traffic never queues in front of the sandbox's exec and file frames.

use std::time::Duration;

use agent_proto::{Header, Kind, TcpConnect, HEADER_LEN, TCP_CONNECT_TIMEOUT_MAX_MS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::time::{timeout_at, Instant};

use crate::error::{ClientError, Result};
use crate::session::{self, Frame};
use crate::transport::{connect_async, Transport};

/// Largest reply payload accepted during the tunnel handshake (a `HelloOk`
/// or an `Error`; both are small).
const HANDSHAKE_REPLY_MAX: usize = 64 << 10;

/// Reads exactly one frame (no byte past it: what follows is the relayed
/// stream), refusing payloads above [`HANDSHAKE_REPLY_MAX`].
async fn read_frame(s: &mut UnixStream) -> Result<Frame> {
    let mut h = [0u8; HEADER_LEN];
    read_exact(s, &mut h).await?;
    let header = Header::parse(&h);
    let len = header
        .checked_len()
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    if len > HANDSHAKE_REPLY_MAX {
        return Err(ClientError::Protocol(format!(
            "tunnel handshake reply of {len} bytes (at most {HANDSHAKE_REPLY_MAX})"
        )));
    }
    let mut payload = vec![0u8; len];
    read_exact(s, &mut payload).await?;
    Ok(Frame {
        kind: header.kind,
        payload,
    })
}

async fn read_exact(s: &mut UnixStream, buf: &mut [u8]) -> Result<()> {
    match s.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(ClientError::Disconnected),
        Err(e) => Err(e.into()),
    }
}

/// Opens a TCP connection to `127.0.0.1:port` inside the guest behind
/// `transport`, all within `timeout` (connecting to the agent, its
/// handshake, and the guest-side connect). On success the returned stream
/// is that TCP connection: read and write it as one; shutting down its
/// write side half-closes the guest connection. A closed port is
/// [`ClientError::Remote`] with errno `ECONNREFUSED`.
pub async fn tcp_connect(
    transport: &Transport,
    port: u16,
    timeout: Duration,
) -> Result<UnixStream> {
    let deadline = Instant::now() + timeout;
    let guest_ms = u32::try_from(timeout.as_millis())
        .unwrap_or(u32::MAX)
        .clamp(1, TCP_CONNECT_TIMEOUT_MAX_MS);
    let open = async {
        let mut s = connect_async(transport).await?;
        let mut req = session::message(0, &session::default_hello());
        req.extend(session::message(
            1,
            &TcpConnect {
                port,
                timeout_ms: guest_ms,
            },
        ));
        s.write_all(&req).await?;
        session::hello_reply(read_frame(&mut s).await?)?;
        let reply = read_frame(&mut s).await?;
        if !reply.is(Kind::Ok) && !reply.is(Kind::Error) {
            return Err(ClientError::Protocol(format!(
                "unexpected reply {:#04x} to TcpConnect",
                reply.kind
            )));
        }
        reply.expect_ok()?;
        Ok(s)
    };
    timeout_at(deadline, open)
        .await
        .map_err(|_| ClientError::Timeout)?
}
