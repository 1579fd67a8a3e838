//! Where an agent is reached: a plain Unix socket, a VMM's hybrid vsock
//! Unix socket (Firecracker-style `CONNECT <port>\n` / `OK <n>\n`), or
//! AF_VSOCK. Connecting yields a stream socket; both clients speak the
//! protocol over it the same way.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::Result;
use crate::session::{vsock_connect_line, VsockReply};

/// Send buffer asked for on the socket, so a whole frame goes out at once
/// and the agent reads it in one system call.
const SNDBUF: libc::c_int = 4 << 20;

/// How to reach an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A Unix socket the agent listens on (`shoal-agent --listen unix:PATH`).
    Unix(PathBuf),
    /// A VMM's hybrid vsock Unix socket: `CONNECT <port>\n`, `OK <n>\n`,
    /// then the guest's vsock stream.
    HybridVsock {
        /// The VMM's Unix socket.
        uds: PathBuf,
        /// The guest port (the agent's is [`agent_proto::VSOCK_PORT`]).
        port: u32,
    },
    /// AF_VSOCK to a context id and port (e.g. a vhost-vsock guest, or an
    /// agent listening with `--listen vsock:PORT`).
    Vsock {
        /// Context id of the peer.
        cid: u32,
        /// Its port.
        port: u32,
    },
}

impl Transport {
    /// The agent's port behind a VMM's hybrid vsock socket.
    pub fn hybrid_vsock(uds: impl Into<PathBuf>) -> Transport {
        Transport::HybridVsock {
            uds: uds.into(),
            port: agent_proto::VSOCK_PORT,
        }
    }
}

/// The connect-retry schedule: every 1 ms for the first 100 ms (when a
/// just-restored VM's socket is about to appear), then every 10 ms, until
/// `deadline`. Returns the delay before the next try, or `None` to give up
/// with the last error (`retryable`: whether that error may go away).
pub(crate) fn retry_delay(start: Instant, deadline: Instant, retryable: bool) -> Option<Duration> {
    let now = Instant::now();
    if !retryable || now >= deadline {
        return None;
    }
    let fast = now.duration_since(start) < Duration::from_millis(100);
    Some(Duration::from_millis(if fast { 1 } else { 10 }).min(deadline - now))
}

/// Asks for a large send buffer (failure only leaves the default one).
pub(crate) fn set_sndbuf(fd: &impl AsRawFd) {
    let sndbuf: libc::c_int = SNDBUF;
    #[allow(clippy::cast_possible_truncation)] // size_of::<c_int>() is 4
    let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the option value is a live int of the given size; the fd is
    // an open socket owned by the caller.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            std::ptr::addr_of!(sndbuf).cast(),
            len,
        );
    }
}

fn vsock_addr(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain data; all-zero is a valid value.
    let mut a: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    #[allow(clippy::cast_possible_truncation)] // AF_VSOCK (40) fits sa_family_t
    {
        a.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    }
    a.svm_cid = cid;
    a.svm_port = port;
    a
}

/// An AF_VSOCK stream socket connected (or, `nonblocking`, connecting) to
/// `cid:port`, as a `UnixStream`: std and tokio treat it as any stream
/// socket (read, write, shutdown and readiness are the same system calls);
/// only address queries would be wrong, and the clients make none.
fn vsock_socket(cid: u32, port: u32, nonblocking: bool) -> Result<UnixStream> {
    let flags =
        libc::SOCK_STREAM | libc::SOCK_CLOEXEC | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: socket() has no memory preconditions.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, flags, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: fd was just returned by socket() and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let addr = vsock_addr(cid, port);
    #[allow(clippy::cast_possible_truncation)] // size_of::<sockaddr_vm>() is 16
    let len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
    // SAFETY: addr is a live sockaddr_vm of the given length.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if !(nonblocking && e.raw_os_error() == Some(libc::EINPROGRESS)) {
            return Err(e.into());
        }
    }
    Ok(UnixStream::from(fd))
}

/// The pending error of a socket whose non-blocking connect completed.
fn socket_error(fd: &impl AsRawFd) -> std::io::Result<()> {
    let mut err: libc::c_int = 0;
    #[allow(clippy::cast_possible_truncation)] // size_of::<c_int>() is 4
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: err and len are live and sized as getsockopt expects.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            std::ptr::addr_of_mut!(err).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if err != 0 {
        return Err(std::io::Error::from_raw_os_error(err));
    }
    Ok(())
}

/// Connects a blocking stream (the protocol's Hello not sent yet).
pub(crate) fn connect_blocking(t: &Transport) -> Result<UnixStream> {
    match t {
        Transport::Unix(p) => Ok(UnixStream::connect(p)?),
        Transport::HybridVsock { uds, port } => {
            let mut s = UnixStream::connect(uds)?;
            s.write_all(&vsock_connect_line(*port))?;
            let mut reply = VsockReply::default();
            loop {
                let mut b = [0u8; 1];
                if s.read(&mut b)? == 0 {
                    return Err(reply.closed());
                }
                if let Some(r) = reply.push(b[0]) {
                    r?;
                    return Ok(s);
                }
            }
        }
        Transport::Vsock { cid, port } => vsock_socket(*cid, *port, false),
    }
}

/// Connects a tokio stream (the protocol's Hello not sent yet).
pub(crate) async fn connect_async(t: &Transport) -> Result<tokio::net::UnixStream> {
    match t {
        Transport::Unix(p) => Ok(tokio::net::UnixStream::connect(p).await?),
        Transport::HybridVsock { uds, port } => {
            let mut s = tokio::net::UnixStream::connect(uds).await?;
            s.write_all(&vsock_connect_line(*port)).await?;
            let mut reply = VsockReply::default();
            loop {
                let mut b = [0u8; 1];
                if s.read(&mut b).await? == 0 {
                    return Err(reply.closed());
                }
                if let Some(r) = reply.push(b[0]) {
                    r?;
                    return Ok(s);
                }
            }
        }
        Transport::Vsock { cid, port } => {
            let s = tokio::net::UnixStream::from_std(vsock_socket(*cid, *port, true)?)?;
            s.writable().await?;
            socket_error(&s)?;
            Ok(s)
        }
    }
}
