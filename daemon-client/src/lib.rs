//! A small blocking HTTP/1.1 client for shoald (Unix socket or TCP with a
//! bearer token): what the `shoal` CLI, the tests and `shoal bench load`
//! use. [`DaemonClient`]'s methods take and return the API's types
//! ([`shoal_api`], re-exported as [`api`]); errors are typed
//! ([`ClientError::Api`]: HTTP status, [`ErrorCode`], message; transport
//! and protocol errors apart). One connection per request; chunked
//! responses are decoded and request bodies can be streamed.
//!
//! ```no_run
//! use shoal_client::{api, DaemonClient};
//! let c = DaemonClient::from_env();
//! let sb = c.create(&api::CreateSandbox::from_image("tiny"))?;
//! let out = c.exec(&sb.id, &api::ExecRequest::shell("echo hi"))?;
//! print!("{}", out.stdout);
//! c.kill(&sb.id)?;
//! # Ok::<(), shoal_client::ClientError>(())
//! ```

mod commands;
mod typed;

pub use shoal_api as api;
pub use shoal_api::ErrorCode;
pub use typed::{Download, ExecStream};

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Errors talking to shoald.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connecting or I/O.
    #[error("shoald at {at}: {source}")]
    Io {
        /// Where.
        at: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The daemon answered with an error status.
    #[error("{message} (HTTP {status})")]
    Api {
        /// Status code.
        status: u16,
        /// The error code from the body (None when the body was not the
        /// API's error body).
        code: Option<ErrorCode>,
        /// Message from the body (or the body itself).
        message: String,
    },
    /// The reply could not be understood.
    #[error("shoald: bad reply: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The code of an API error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { code, .. } => *code,
            _ => None,
        }
    }

    /// Whether the daemon said there is no such thing (404).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }
}

/// Results of client calls.
pub type Result<T> = std::result::Result<T, ClientError>;

/// Where the daemon listens.
#[derive(Debug, Clone)]
pub enum Target {
    /// Unix socket.
    Unix(PathBuf),
    /// TCP `host:port` and bearer token.
    Tcp(String, Option<String>),
}

/// A request body.
pub enum Body<'a> {
    /// None.
    Empty,
    /// JSON bytes.
    Json(Vec<u8>),
    /// Raw bytes streamed from a reader (chunked).
    Stream(&'a mut dyn Read),
}

trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

/// A response: status, headers and a body reader.
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers (names lower-cased).
    pub headers: Vec<(String, String)>,
    body: Box<dyn Read + Send>,
}

impl Response {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body reader.
    pub fn reader(&mut self) -> &mut (dyn Read + Send) {
        &mut *self.body
    }

    /// The whole body.
    pub fn bytes(mut self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.body
            .read_to_end(&mut v)
            .map_err(|e| ClientError::Protocol(format!("reading the body: {e}")))?;
        Ok(v)
    }

    /// An error for a non-2xx status (from the JSON error body).
    fn into_error(self) -> ClientError {
        let status = self.status;
        let b = self.bytes().unwrap_or_default();
        match serde_json::from_slice::<api::ErrorBody>(&b) {
            Ok(e) => ClientError::Api {
                status,
                code: Some(e.error.code),
                message: e.error.message,
            },
            Err(_) => ClientError::Api {
                status,
                code: None,
                message: String::from_utf8_lossy(&b).into_owned(),
            },
        }
    }

    /// Ok for 2xx, else the daemon's error.
    pub fn ok(self) -> Result<Response> {
        if (200..300).contains(&self.status) {
            Ok(self)
        } else {
            Err(self.into_error())
        }
    }
}

struct Chunked<R> {
    r: R,
    left: u64,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.r.read_line(&mut line)?;
            let size = line.trim().split(';').next().unwrap_or("");
            self.left = u64::from_str_radix(size, 16).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk size")
            })?;
            if self.left == 0 {
                self.done = true;
                let mut l = String::new();
                self.r.read_line(&mut l)?;
                return Ok(0);
            }
        }
        let want = usize::try_from(self.left).map_or(buf.len(), |l| buf.len().min(l));
        let n = self.r.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.left -= n as u64;
        if self.left == 0 {
            let mut crlf = [0u8; 2];
            self.r.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}

/// The client.
#[derive(Debug, Clone)]
pub struct DaemonClient {
    /// Where the daemon is.
    pub target: Target,
    /// Read/write timeout per socket operation (None: wait forever).
    pub timeout: Option<Duration>,
}

impl DaemonClient {
    /// A client for the daemon on Unix socket `sock`.
    pub fn unix(sock: impl Into<PathBuf>) -> DaemonClient {
        DaemonClient {
            target: Target::Unix(sock.into()),
            timeout: Some(Duration::from_secs(900)),
        }
    }

    /// A client for the daemon on TCP `addr` (`HOST:PORT`) with a bearer
    /// token.
    pub fn tcp(addr: impl Into<String>, token: Option<String>) -> DaemonClient {
        DaemonClient {
            target: Target::Tcp(addr.into(), token),
            timeout: Some(Duration::from_secs(900)),
        }
    }

    /// A client for `spec`: `http://HOST:PORT` (token from `SHOAL_TOKEN`)
    /// or a Unix socket path.
    pub fn from_spec(spec: &str) -> DaemonClient {
        match spec.strip_prefix("http://") {
            Some(addr) => DaemonClient::tcp(
                addr.trim_end_matches('/'),
                std::env::var("SHOAL_TOKEN").ok(),
            ),
            None => DaemonClient::unix(spec),
        }
    }

    /// The daemon `SHOAL_DAEMON` names ([`from_spec`](Self::from_spec)),
    /// else the local one on [`default_socket`].
    pub fn from_env() -> DaemonClient {
        match std::env::var("SHOAL_DAEMON") {
            Ok(s) if !s.is_empty() => DaemonClient::from_spec(&s),
            _ => DaemonClient::unix(default_socket()),
        }
    }

    /// Where it connects, for messages.
    pub fn target_display(&self) -> String {
        self.at()
    }

    fn at(&self) -> String {
        match &self.target {
            Target::Unix(p) => p.display().to_string(),
            Target::Tcp(a, _) => a.clone(),
        }
    }

    fn connect(&self) -> Result<Box<dyn Conn>> {
        let io = |source| ClientError::Io {
            at: self.at(),
            source,
        };
        Ok(match &self.target {
            Target::Unix(p) => {
                let s = UnixStream::connect(p).map_err(io)?;
                s.set_read_timeout(self.timeout).map_err(io)?;
                s.set_write_timeout(self.timeout).map_err(io)?;
                Box::new(s)
            }
            Target::Tcp(a, _) => {
                let s = TcpStream::connect(a).map_err(io)?;
                s.set_read_timeout(self.timeout).map_err(io)?;
                s.set_write_timeout(self.timeout).map_err(io)?;
                let _ = s.set_nodelay(true);
                Box::new(s)
            }
        })
    }

    /// Whether the daemon answers `/healthz`.
    pub fn ping(&self) -> bool {
        self.request("GET", "/healthz", Body::Empty)
            .is_ok_and(|r| r.status == 200)
    }

    /// Sends a request; returns the response whatever its status.
    pub fn request(&self, method: &str, path: &str, body: Body<'_>) -> Result<Response> {
        let mut s = self.connect()?;
        let io = |source| ClientError::Io {
            at: self.at(),
            source,
        };
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: shoald\r\nConnection: close\r\n");
        if let Target::Tcp(_, Some(t)) = &self.target {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        match &body {
            Body::Empty => head.push_str("Content-Length: 0\r\n\r\n"),
            Body::Json(b) => head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                b.len()
            )),
            Body::Stream(_) => head.push_str(
                "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
            ),
        }
        s.write_all(head.as_bytes()).map_err(io)?;
        // The daemon may answer before taking the whole body (413 for one
        // past its limit) and close: a failed write is then followed by
        // that answer, which is the error to give.
        let mut broken: Option<std::io::Error> = None;
        match body {
            Body::Empty => {}
            Body::Json(b) => broken = s.write_all(&b).err(),
            Body::Stream(r) => {
                let mut buf = vec![0u8; 256 * 1024];
                loop {
                    let n = r.read(&mut buf).map_err(io)?;
                    let w = if n == 0 {
                        s.write_all(b"0\r\n\r\n")
                    } else {
                        s.write_all(format!("{n:x}\r\n").as_bytes())
                            .and_then(|()| s.write_all(&buf[..n]))
                            .and_then(|()| s.write_all(b"\r\n"))
                    };
                    if let Err(e) = w {
                        broken = Some(e);
                        break;
                    }
                    if n == 0 {
                        break;
                    }
                }
            }
        }
        if broken.is_none() {
            broken = s.flush().err();
        }
        let mut r = BufReader::with_capacity(64 * 1024, s);
        let mut line = String::new();
        match r.read_line(&mut line) {
            Err(e) => return Err(io(broken.unwrap_or(e))),
            Ok(0) => {
                if let Some(e) = broken {
                    return Err(io(e));
                }
            }
            Ok(_) => {}
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ClientError::Protocol(format!("status line {line:?}")))?;
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            r.read_line(&mut h).map_err(io)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let body: Box<dyn Read + Send> =
            if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
                Box::new(Chunked {
                    r,
                    left: 0,
                    done: false,
                })
            } else if let Some(n) = get("content-length").and_then(|v| v.parse::<u64>().ok()) {
                Box::new(r.take(n))
            } else {
                Box::new(r)
            };
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    /// A JSON call: `body` serialized, a 2xx reply parsed as `T`.
    pub fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T> {
        let b = match body {
            Some(b) => {
                Body::Json(serde_json::to_vec(b).map_err(|e| ClientError::Protocol(e.to_string()))?)
            }
            None => Body::Empty,
        };
        let r = self.request(method, path, b)?.ok()?;
        let mut bytes = r.bytes()?;
        if bytes.is_empty() {
            bytes = b"null".to_vec();
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol(format!("{e}: {}", String::from_utf8_lossy(&bytes))))
    }
}

/// Percent-encodes a query value.
pub fn enc(s: &str) -> String {
    api::encode_query_value(s)
}

/// The local daemon's default socket: `daemon/shoald.sock` under
/// `$SHOAL_STATE`, else `$SHOAL_CACHE`, else `~/.cache/shoal` (where
/// `shoald` without `--state-dir` listens).
pub fn default_socket() -> PathBuf {
    let base = std::env::var_os("SHOAL_STATE")
        .or_else(|| std::env::var_os("SHOAL_CACHE"))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/shoal")
        });
    base.join("daemon").join("shoald.sock")
}
