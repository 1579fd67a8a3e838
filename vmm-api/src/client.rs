//! The client: one connection per call, one deadline per call (connect,
//! send and reply together), replies capped at [`MAX_LINE`].

use crate::wire::{
    BalloonInfo, EvictInfo, Reply, ReplyBody, Request, RestoreInfo, Sample, SnapshotInfo, Stats,
    MAX_LINE,
};
use serde_json::{Map, Value};
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Connecting, sending or receiving failed.
    #[error("control socket {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The deadline passed before the reply arrived.
    #[error("control socket {path}: no reply to {request} within {} ms", timeout.as_millis())]
    Timeout {
        /// The socket.
        path: PathBuf,
        /// The request's `op`.
        request: &'static str,
        /// The call's deadline.
        timeout: Duration,
    },
    /// The request could not be encoded (a path that is not UTF-8).
    #[error("cannot encode the {request} request: {source}")]
    Encode {
        /// The request's `op`.
        request: &'static str,
        /// The encoder's error.
        source: serde_json::Error,
    },
    /// The reply was not a valid reply to the request.
    #[error("control socket {path}: bad reply to {request}: {cause}")]
    BadReply {
        /// The socket.
        path: PathBuf,
        /// The request's `op`.
        request: &'static str,
        /// What was wrong with it.
        cause: ReplyError,
    },
    /// The VMM refused the request.
    #[error("{message}")]
    Refused {
        /// The request's `op`.
        request: &'static str,
        /// The VMM's reason.
        message: String,
    },
}

/// What was wrong with a reply.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    /// The connection ended before a whole line.
    #[error("the VMM closed the connection without a reply")]
    Closed,
    /// No newline within [`MAX_LINE`] bytes.
    #[error("reply longer than {MAX_LINE} bytes")]
    TooLong,
    /// Not JSON.
    #[error("not JSON: {0}")]
    Json(serde_json::Error),
    /// JSON, but not an object with a boolean `ok`.
    #[error("not an object with a boolean \"ok\" field")]
    NoOk,
    /// `ok` is true but the fields do not fit the request's reply type.
    #[error("{0}")]
    Shape(serde_json::Error),
}

/// A client of one VMM's control socket.
#[derive(Debug, Clone)]
pub struct Client {
    sock: PathBuf,
    timeout: Duration,
}

impl Client {
    /// A client of the socket at `sock` whose calls each get `timeout`.
    pub fn new(sock: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            sock: sock.into(),
            timeout,
        }
    }

    /// The same socket with another deadline per call.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self {
            sock: self.sock.clone(),
            timeout,
        }
    }

    /// The socket.
    pub fn sock(&self) -> &Path {
        &self.sock
    }

    /// Stops all vCPUs.
    pub fn pause(&self) -> Result<(), ApiError> {
        self.typed(&Request::Pause)
    }

    /// Continues after a pause or snapshot.
    pub fn resume(&self) -> Result<(), ApiError> {
        self.typed(&Request::Resume)
    }

    /// Ends the VM and the VMM process.
    pub fn shutdown(&self) -> Result<(), ApiError> {
        self.typed(&Request::Shutdown)
    }

    /// Counters.
    pub fn stats(&self) -> Result<Stats, ApiError> {
        self.typed(&Request::Stats)
    }

    /// The balloon: sets its target (MiB) if given, asks the guest for new
    /// stats, and returns its state.
    pub fn balloon(&self, target_mib: Option<u64>) -> Result<BalloonInfo, ApiError> {
        self.typed(&Request::Balloon { target_mib })
    }

    /// Cold-memory eviction (see [`Request::Evict`]); the eviction file
    /// goes into `dir` (the first time).
    pub fn evict(&self, dir: &std::path::Path) -> Result<EvictInfo, ApiError> {
        self.typed(&Request::Evict {
            dir: dir.to_path_buf(),
        })
    }

    /// Writes a snapshot into `dir`; the VM stays paused.
    pub fn snapshot(&self, dir: &Path, diff: bool) -> Result<SnapshotInfo, ApiError> {
        self.typed(&Request::Snapshot {
            dir: dir.to_path_buf(),
            diff,
        })
    }

    /// Replaces the guest with the snapshot in `dir`, with the saved disks
    /// pointed at `disks` (in order; none: as saved).
    pub fn restore(&self, dir: &Path, disks: &[PathBuf]) -> Result<RestoreInfo, ApiError> {
        self.typed(&Request::Restore {
            dir: dir.to_path_buf(),
            disks: disks.to_vec(),
        })
    }

    /// Each vCPU's instruction pointer.
    pub fn sample(&self) -> Result<Vec<u64>, ApiError> {
        self.typed::<Sample>(&Request::Sample).map(|s| s.rips)
    }

    /// Any request; the reply is the one that request gets.
    pub fn call(&self, req: &Request) -> Result<Reply, ApiError> {
        let fields = self.exchange(req)?;
        req.decode_reply(fields)
            .map_err(|e| self.bad(req, ReplyError::Shape(e)))
    }

    fn typed<T: ReplyBody>(&self, req: &Request) -> Result<T, ApiError> {
        let fields = self.exchange(req)?;
        T::from_fields(fields).map_err(|e| self.bad(req, ReplyError::Shape(e)))
    }

    fn bad(&self, req: &Request, cause: ReplyError) -> ApiError {
        ApiError::BadReply {
            path: self.sock.clone(),
            request: req.name(),
            cause,
        }
    }

    /// Sends `req` and returns the fields of a success reply.
    fn exchange(&self, req: &Request) -> Result<Map<String, Value>, ApiError> {
        let deadline = Instant::now() + self.timeout;
        let mut line = serde_json::to_vec(req).map_err(|source| ApiError::Encode {
            request: req.name(),
            source,
        })?;
        line.push(b'\n');
        let fail = |e: Failure| match e {
            Failure::Io(source) => ApiError::Io {
                path: self.sock.clone(),
                source,
            },
            Failure::Timeout => ApiError::Timeout {
                path: self.sock.clone(),
                request: req.name(),
                timeout: self.timeout,
            },
            Failure::Reply(cause) => self.bad(req, cause),
        };
        // A busy refusal comes before the request is read (every control
        // connection was in use, often by ones whose callers already have
        // their replies): nothing was done, so it is sent again, backing off,
        // until the deadline.
        let mut pause = Duration::from_millis(1);
        let mut fields = loop {
            let mut s = connect(&self.sock, deadline).map_err(fail)?;
            // The server may refuse before reading: a write that fails then
            // is answered by the refusal it wrote first.
            let sent = write_all(&mut s, &line, deadline);
            let reply = match read_line(&mut s, deadline) {
                Ok(r) => r,
                Err(e) => return Err(fail(sent.err().unwrap_or(e))),
            };
            let Value::Object(fields) =
                serde_json::from_slice(&reply).map_err(|e| self.bad(req, ReplyError::Json(e)))?
            else {
                return Err(self.bad(req, ReplyError::NoOk));
            };
            let busy = fields.get("busy") == Some(&Value::Bool(true));
            if !busy || deadline.saturating_duration_since(Instant::now()) <= pause {
                break fields;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        };
        match fields.get("ok") {
            Some(Value::Bool(true)) => Ok(fields),
            Some(Value::Bool(false)) => Err(ApiError::Refused {
                request: req.name(),
                message: match fields.remove("error") {
                    Some(Value::String(s)) => s,
                    _ => "request failed".into(),
                },
            }),
            _ => Err(self.bad(req, ReplyError::NoOk)),
        }
    }
}

/// Why one step of a call failed.
enum Failure {
    Io(io::Error),
    Timeout,
    Reply(ReplyError),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => Failure::Timeout,
            _ => Failure::Io(e),
        }
    }
}

/// Time left before `deadline`; none left is a timeout.
fn left(deadline: Instant) -> Result<Duration, Failure> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        Err(Failure::Timeout)
    } else {
        Ok(d)
    }
}

/// Connects before `deadline`. A Unix stream `connect` waits while the
/// listener's backlog is full (a VMM that stopped accepting), bounded by the
/// socket's send timeout, which `std` gives no way to set beforehand.
fn connect(path: &Path, deadline: Instant) -> Result<UnixStream, Failure> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(Failure::Io(io::Error::new(
            ErrorKind::InvalidInput,
            "socket path too long or not a valid C string",
        )));
    }
    addr.sun_family = libc::sa_family_t::try_from(libc::AF_UNIX)
        .map_err(|_| Failure::Io(ErrorKind::Unsupported.into()))?;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = libc::c_char::from_ne_bytes([*s]);
    }
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Failure::Io(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a socket we just created and nothing else owns.
    let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    sock.set_write_timeout(Some(left(deadline)?))?;
    // At most sizeof(sockaddr_un), 110 bytes.
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::sa_family_t>() + bytes.len())
        .map_err(|_| Failure::Io(ErrorKind::InvalidInput.into()))?;
    loop {
        // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes that
        // outlives the call; `fd` is open.
        let r =
            unsafe { libc::connect(fd, std::ptr::addr_of!(addr).cast::<libc::sockaddr>(), len) };
        if r == 0 {
            return Ok(sock);
        }
        let e = io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            // EAGAIN: the send timeout passed with the backlog still full.
            return Err(e.into());
        }
        left(deadline)?;
    }
}

fn write_all(s: &mut UnixStream, mut b: &[u8], deadline: Instant) -> Result<(), Failure> {
    while !b.is_empty() {
        s.set_write_timeout(Some(left(deadline)?))?;
        match s.write(b) {
            Ok(0) => return Err(Failure::Reply(ReplyError::Closed)),
            Ok(n) => b = &b[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads one line (without its newline) before `deadline`, at most
/// [`MAX_LINE`] bytes with the newline.
fn read_line(s: &mut UnixStream, deadline: Instant) -> Result<Vec<u8>, Failure> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        s.set_read_timeout(Some(left(deadline)?))?;
        let n = match s.read(&mut chunk) {
            Ok(0) => return Err(Failure::Reply(ReplyError::Closed)),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        let got = &chunk[..n];
        let end = got.iter().position(|&b| b == b'\n');
        line.extend_from_slice(&got[..end.unwrap_or(n)]);
        if line.len() >= MAX_LINE {
            return Err(Failure::Reply(ReplyError::TooLong));
        }
        if end.is_some() {
            return Ok(line);
        }
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
