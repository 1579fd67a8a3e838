//! A small QMP (QEMU Machine Protocol) client: line-delimited JSON over
//! QEMU's Unix control socket. QEMU is a process we started, but what it
//! says is still bounded: every read has a deadline and every line a size
//! cap, and a reply that is not the answer to the command sent is skipped
//! (events) or refused.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Longest line accepted from QEMU (a `query-*` reply is a few KiB).
pub const MAX_LINE: usize = 1 << 20;

/// Errors of a QMP exchange.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// The socket could not be reached or failed.
    #[error("QMP socket {path}: {source}")]
    Io {
        /// The socket.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// QEMU said nothing (complete) in time.
    #[error("QMP: no reply to {what} within {timeout:?}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The time allowed.
        timeout: Duration,
    },
    /// QEMU closed the socket (it ended).
    #[error("QMP: QEMU closed the socket while waiting for {0}")]
    Closed(String),
    /// A line longer than [`MAX_LINE`].
    #[error("QMP: a line over {MAX_LINE} bytes")]
    TooLong,
    /// A line that is not a JSON object.
    #[error("QMP: bad JSON from QEMU: {0}")]
    Json(String),
    /// QEMU refused the command.
    #[error("QMP {command}: {class}: {desc}")]
    Command {
        /// The command.
        command: String,
        /// QEMU's error class.
        class: String,
        /// QEMU's description.
        desc: String,
    },
}

/// One QMP session (capabilities negotiated).
#[derive(Debug)]
pub struct Qmp {
    sock: UnixStream,
    path: String,
    buf: Vec<u8>,
    next_id: u64,
}

impl Qmp {
    /// Connects to `path`, reads QEMU's greeting and leaves capabilities
    /// negotiation mode, all within `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let p = path.display().to_string();
        let sock = UnixStream::connect(path).map_err(|source| QmpError::Io {
            path: p.clone(),
            source,
        })?;
        let mut q = Qmp {
            sock,
            path: p,
            buf: Vec::new(),
            next_id: 1,
        };
        let end = Instant::now() + timeout;
        let greeting = q.read_obj("the greeting", end, timeout)?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Json(format!("not a QMP greeting: {greeting}")));
        }
        q.execute_until("qmp_capabilities", None, end, timeout)?;
        Ok(q)
    }

    /// Runs `command` (with `args`) and returns its `return` value, within
    /// `timeout`.
    pub fn execute(
        &mut self,
        command: &str,
        args: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        self.execute_until(command, args, Instant::now() + timeout, timeout)
    }

    fn execute_until(
        &mut self,
        command: &str,
        args: Option<Value>,
        end: Instant,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({ "execute": command, "id": id });
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let mut line = msg.to_string();
        line.push('\n');
        self.sock
            .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
            .and_then(|()| self.sock.write_all(line.as_bytes()))
            .map_err(|source| QmpError::Io {
                path: self.path.clone(),
                source,
            })?;
        loop {
            let v = self.read_obj(command, end, timeout)?;
            // Events (and anything not answering this id) are skipped.
            if v.get("id").and_then(Value::as_u64) != Some(id) {
                continue;
            }
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            let e = v.get("error").cloned().unwrap_or(Value::Null);
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
            return Err(QmpError::Command {
                command: command.into(),
                class: s("class"),
                desc: s("desc"),
            });
        }
    }

    /// Reads one line (a JSON object) before `end`.
    fn read_obj(&mut self, what: &str, end: Instant, timeout: Duration) -> Result<Value, QmpError> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let v: Value = serde_json::from_slice(&line).map_err(|e| {
                    QmpError::Json(format!("{e}: {}", String::from_utf8_lossy(&line)))
                })?;
                if !v.is_object() {
                    return Err(QmpError::Json(v.to_string()));
                }
                return Ok(v);
            }
            if self.buf.len() > MAX_LINE {
                return Err(QmpError::TooLong);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(QmpError::Timeout {
                    what: what.into(),
                    timeout,
                });
            }
            let io = |source| QmpError::Io {
                path: self.path.clone(),
                source,
            };
            self.sock.set_read_timeout(Some(left)).map_err(io)?;
            let mut chunk = [0u8; 8192];
            match self.sock.read(&mut chunk) {
                Ok(0) => return Err(QmpError::Closed(what.into())),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(QmpError::Io {
                        path: self.path.clone(),
                        source,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn serve(script: &'static [&'static str]) -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("qmp.sock");
        let l = UnixListener::bind(&p).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            for line in script {
                if let Some(reply) = line.strip_prefix("<") {
                    let mut got = String::new();
                    std::io::BufRead::read_line(&mut r, &mut got).unwrap();
                    s.write_all(reply.as_bytes()).unwrap();
                } else {
                    s.write_all(line.as_bytes()).unwrap();
                }
            }
            std::thread::sleep(Duration::from_secs(2));
        });
        (d, p)
    }

    #[test]
    fn commands_get_their_own_reply_past_events() {
        let (_d, p) = serve(&[
            "{\"QMP\":{}}\n",
            "<{\"return\":{},\"id\":1}\n",
            "<{\"event\":\"STOP\"}\n{\"return\":{\"status\":\"paused\"},\"id\":2}\n",
            "<{\"error\":{\"class\":\"GenericError\",\"desc\":\"no\"},\"id\":3}\n",
        ]);
        let t = Duration::from_secs(2);
        let mut q = Qmp::connect(&p, t).unwrap();
        let r = q.execute("query-status", None, t).unwrap();
        assert_eq!(r["status"], "paused");
        let e = q.execute("stop", None, t).unwrap_err();
        assert!(e.to_string().contains("GenericError: no"), "{e}");
    }

    #[test]
    fn a_silent_qemu_times_out_and_a_long_line_is_refused() {
        let (_d, p) = serve(&["{\"QMP\":{}}\n"]);
        let e = Qmp::connect(&p, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, QmpError::Timeout { .. }), "{e}");
        let long: &'static str = Box::leak("x".repeat(MAX_LINE + 10).into_boxed_str());
        let (_d2, p2) = serve(Box::leak(Box::new([long])));
        let e = Qmp::connect(&p2, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, QmpError::TooLong), "{e}");
    }
}
