//! The VMM's control socket: a small typed protocol, one JSON object per
//! line each way. `shoal-vmm --api-sock PATH` serves it; [`call`] is the
//! client.
//!
//! Requests: `{"op":"pause"}`, `{"op":"resume"}`,
//! `{"op":"snapshot","dir":"/path"}` (pauses first; the VM stays paused),
//! `{"op":"restore","dir":"/path"}` (replaces the guest, reusing the VM;
//! `"disks":["/f"]` points the saved disks at other files),
//! `{"op":"shutdown"}`, `{"op":"stats"}`. Every reply has `"ok"`; failures
//! carry `"error"`.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::time::Duration;

/// Longest request line accepted.
pub const MAX_LINE: u64 = 64 * 1024;

/// A control request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Stop all vCPUs (devices stay up).
    Pause,
    /// Continue after a pause or snapshot.
    Resume,
    /// Write a snapshot into `dir` (created if missing).
    Snapshot {
        /// Target directory.
        dir: PathBuf,
        /// Only the memory pages that differ from the snapshot this VM was
        /// restored from (`memory.diff`; the base must stay in place).
        #[serde(default)]
        diff: bool,
    },
    /// Replace the guest with the snapshot in `dir`, reusing this VM
    /// (its KVM objects, memory slots and vCPUs): the fast path for pools.
    Restore {
        /// Snapshot directory.
        dir: PathBuf,
        /// Files for the saved disks, in order (see
        /// [`crate::RestoreOptions::disks`]); none: as saved.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        disks: Vec<PathBuf>,
    },
    /// End the VM and the VMM process.
    Shutdown,
    /// Counters.
    Stats,
    /// Where each vCPU is right now (instruction pointers; the vCPUs are
    /// stopped for a moment): a sampling profiler for the guest.
    Sample,
}

/// VM counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// "running" or "paused".
    pub state: String,
    /// vCPUs.
    pub vcpus: u8,
    /// Guest RAM in MiB.
    pub memory_mib: u32,
    /// Milliseconds since the VM started (or was restored).
    pub uptime_ms: u64,
    /// Console bytes the guest wrote.
    pub serial_bytes: u64,
    /// Console bytes dropped by the output limit.
    pub serial_dropped: u64,
    /// VMM process id.
    pub pid: u32,
    /// Guest writes to read-only pmem devices, dropped.
    #[serde(default)]
    pub pmem_guest_writes: u64,
}

/// What a snapshot wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// Directory.
    pub dir: PathBuf,
    /// Bytes of `state`.
    pub state_bytes: u64,
    /// Bytes of guest memory written (`memory`, or the pages in `memory.diff`).
    pub memory_bytes: u64,
    /// Time to pause the vCPUs (ms).
    pub pause_ms: f64,
    /// Time to write everything (ms).
    pub save_ms: f64,
}

/// A control reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Response {
    /// Whether the request succeeded.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// For `stats`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
    /// For `snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotInfo>,
    /// For `restore`: request to vCPUs started (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_ms: Option<f64>,
    /// For `sample`: each vCPU's instruction pointer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rips: Option<Vec<u64>>,
}

impl Response {
    /// Success with nothing else.
    pub fn ok() -> Self {
        Self {
            ok: true,
            ..Default::default()
        }
    }

    /// Failure with a message.
    pub fn error(msg: impl Into<String>) -> Self {
        Self {
            ok: false,
            error: Some(msg.into()),
            ..Default::default()
        }
    }
}

/// Errors of the control socket.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Socket I/O.
    #[error("control socket {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The reply was not valid.
    #[error("control socket {path}: bad reply: {source}")]
    Reply {
        /// The socket.
        path: PathBuf,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// The VMM answered with an error.
    #[error("{0}")]
    Refused(String),
}

/// Sends one request and waits for its reply.
pub fn call(sock: &Path, req: &Request, timeout: Duration) -> Result<Response, ApiError> {
    let io = |source| ApiError::Io {
        path: sock.into(),
        source,
    };
    let mut s = UnixStream::connect(sock).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut line = serde_json::to_vec(req).map_err(|source| ApiError::Reply {
        path: sock.into(),
        source,
    })?;
    line.push(b'\n');
    s.write_all(&line).map_err(io)?;
    let mut reply = String::new();
    BufReader::new(s.take(MAX_LINE))
        .read_line(&mut reply)
        .map_err(io)?;
    let r: Response = serde_json::from_str(&reply).map_err(|source| ApiError::Reply {
        path: sock.into(),
        source,
    })?;
    if !r.ok {
        return Err(ApiError::Refused(
            r.error.unwrap_or_else(|| "request failed".into()),
        ));
    }
    Ok(r)
}

/// A request from the socket, with where to send its reply.
pub type ControlMsg = (Request, Sender<Response>);

/// Serves `listener` on background threads, forwarding each request through
/// `forward` (wrapped by the caller into its event type) and writing replies.
pub fn serve(listener: UnixListener, forward: impl Fn(ControlMsg) -> bool + Send + Sync + 'static) {
    let forward = std::sync::Arc::new(forward);
    let spawn = std::thread::Builder::new()
        .name("api".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let fwd = forward.clone();
                let _ = std::thread::Builder::new()
                    .name("api-conn".into())
                    .spawn(move || handle(conn, &*fwd));
            }
        });
    // Without the thread there is no control socket; the VM still runs.
    let _ = spawn;
}

fn handle(conn: UnixStream, forward: &dyn Fn(ControlMsg) -> bool) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        match (&mut reader).take(MAX_LINE).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let resp = if !line.ends_with('\n') {
            // Over the limit: answer and drop the connection (no resync).
            let r = Response::error(format!("request longer than {MAX_LINE} bytes"));
            let _ = send(&mut out, &r);
            return;
        } else {
            match serde_json::from_str::<Request>(&line) {
                Err(e) => Response::error(format!("bad request: {e}")),
                Ok(req) => {
                    let (tx, rx) = mpsc::channel();
                    if !forward((req, tx)) {
                        Response::error("VM is shutting down")
                    } else {
                        rx.recv()
                            .unwrap_or_else(|_| Response::error("VM is shutting down"))
                    }
                }
            }
        };
        if send(&mut out, &resp).is_err() {
            return;
        }
    }
}

fn send(out: &mut UnixStream, r: &Response) -> std::io::Result<()> {
    let mut b = serde_json::to_vec(r).map_err(std::io::Error::other)?;
    b.push(b'\n');
    out.write_all(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format() {
        assert_eq!(
            serde_json::to_string(&Request::Snapshot {
                dir: "/x".into(),
                diff: false
            })
            .unwrap(),
            r#"{"op":"snapshot","dir":"/x","diff":false}"#
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"pause"}"#).unwrap(),
            Request::Pause
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"explode"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"snapshot","dir":"/x","y":1}"#).is_err());
        assert_eq!(
            serde_json::to_string(&Response::ok()).unwrap(),
            r#"{"ok":true}"#
        );
    }

    #[test]
    fn server_answers_bad_lines_and_keeps_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let l = UnixListener::bind(&path).unwrap();
        serve(l, |(req, tx)| {
            let r = match req {
                Request::Stats => Response::ok(),
                _ => Response::error("nope"),
            };
            tx.send(r).is_ok()
        });
        assert!(
            call(&path, &Request::Stats, Duration::from_secs(5))
                .unwrap()
                .ok
        );
        let e = call(&path, &Request::Pause, Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.to_string(), "nope");
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"garbage\n{\"op\":\"stats\"}\n").unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut l1 = String::new();
        r.read_line(&mut l1).unwrap();
        assert!(l1.contains("bad request"));
        let mut l2 = String::new();
        r.read_line(&mut l2).unwrap();
        assert_eq!(l2.trim(), r#"{"ok":true}"#);
        // An endless line is cut off.
        let mut s = UnixStream::connect(&path).unwrap();
        let _ = s.write_all(&vec![b'x'; MAX_LINE as usize + 10]);
        let mut l3 = String::new();
        BufReader::new(s).read_line(&mut l3).unwrap();
        assert!(l3.contains("longer than"));
    }
}
