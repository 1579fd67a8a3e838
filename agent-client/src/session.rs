//! The sans-I/O session core shared by the blocking and the tokio client:
//! request ids and routes, the bytes of every request, and the checks and
//! state machines that turn the agent's frames into results. The two
//! clients differ only in how they move bytes and wait; everything they
//! decide about the agent's answers is decided here, once.
//!
//! The agent is not trusted: every frame is checked against what the
//! request can receive (kind, decodability, counts), and everything a call
//! accumulates is capped by [`Limits`].

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use agent_proto::{
    decode, put_data, put_empty, put_message, DirEntries, DirEntry, ErrorCode, ErrorReply,
    ExecResult, ExecStarted, FileDone, FileWrite, Hello, HelloOk, Kind, Message, PathRequest,
    RawFrame, HEADER_LEN, MAX_PAYLOAD,
};

use crate::error::{ClientError, Result};

/// Caps on what one call may accumulate from the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of stdout plus stderr that collecting an exec's output
    /// ([`crate::ExecHandle::wait`], `exec_simple`) holds in memory.
    pub max_collected_output: usize,
    /// Most bytes a whole-file read (`read_file`) holds in memory.
    pub max_read_file: usize,
    /// Most entries a directory listing may have.
    pub max_dir_entries: usize,
    /// Most bytes a directory listing may hold: its names, and
    /// [`DIR_ENTRY_OVERHEAD`] per entry.
    pub max_dir_bytes: usize,
    /// Most requests in flight at once on one connection.
    pub max_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_collected_output: 1 << 30,
            max_read_file: 1 << 30,
            max_dir_entries: 1 << 20,
            max_dir_bytes: 64 << 20,
            max_in_flight: 1 << 16,
        }
    }
}

/// What one directory entry counts against [`Limits::max_dir_bytes`]
/// besides its name (what holding it costs).
pub const DIR_ENTRY_OVERHEAD: usize = 32;

/// Frames buffered per request before the connection's reader waits.
pub const CHANNEL_FRAMES: usize = 64;

/// Most bytes of a vsock `OK <n>` reply line.
const HANDSHAKE_LINE_MAX: usize = 64;

/// A frame as received, routed to a request.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) kind: u8,
    pub(crate) payload: Vec<u8>,
}

impl From<RawFrame> for Frame {
    fn from(f: RawFrame) -> Self {
        Frame {
            kind: f.header.kind,
            payload: f.payload,
        }
    }
}

impl Frame {
    pub(crate) fn is(&self, kind: Kind) -> bool {
        self.kind == kind as u8
    }

    /// Decodes the frame as `M`, or turns an error frame into an error.
    pub(crate) fn expect<M: Message>(self) -> Result<M> {
        if self.is(M::KIND) {
            return decode(&self.payload)
                .map_err(|e| ClientError::Protocol(format!("bad {:?} frame: {e}", M::KIND)));
        }
        Err(self.unexpected())
    }

    pub(crate) fn expect_ok(self) -> Result<()> {
        if self.is(Kind::Ok) && self.payload.is_empty() {
            return Ok(());
        }
        Err(self.unexpected())
    }

    /// The error for a frame the request did not expect: the agent's own
    /// error, or a protocol error.
    pub(crate) fn unexpected(self) -> ClientError {
        if self.is(Kind::Error) {
            return match decode::<ErrorReply>(&self.payload) {
                Ok(e) => ClientError::Remote {
                    code: e.code,
                    errno: e.errno,
                    message: e.message,
                },
                Err(e) => ClientError::Protocol(format!("bad error frame: {e}")),
            };
        }
        if self.is(Kind::Ok) {
            return ClientError::Protocol(format!(
                "Ok frame with a {}-byte payload",
                self.payload.len()
            ));
        }
        ClientError::Protocol(format!("unexpected frame kind {:#04x}", self.kind))
    }
}

// ------------------------------------------------------------------ routes

/// The requests in flight on one connection: request id to the sender of
/// that request's frames. Ids are never 0 (reserved for connection-level
/// messages) and never reused while in use. Once closed, nothing registers.
#[derive(Debug)]
pub(crate) struct Routes<S> {
    map: HashMap<u32, S>,
    next: u32,
    closed: bool,
    max: usize,
}

impl<S> Routes<S> {
    pub(crate) fn new(max: usize) -> Self {
        Routes {
            map: HashMap::new(),
            next: 1,
            closed: false,
            max: max.max(1),
        }
    }

    /// Registers `tx` under a fresh id.
    pub(crate) fn insert(&mut self, tx: S) -> Result<u32> {
        if self.closed {
            return Err(ClientError::Disconnected);
        }
        if self.map.len() >= self.max {
            return Err(ClientError::Busy(self.max));
        }
        // At most max + 1 tries: fewer than max ids are taken.
        loop {
            let id = self.next;
            self.next = self.next.wrapping_add(1);
            if id != 0 && !self.map.contains_key(&id) {
                self.map.insert(id, tx);
                return Ok(id);
            }
        }
    }

    pub(crate) fn get(&self, id: u32) -> Option<&S> {
        self.map.get(&id)
    }

    pub(crate) fn remove(&mut self, id: u32) -> Option<S> {
        self.map.remove(&id)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Refuses new requests and drops every sender (their receivers then
    /// see the end of their stream).
    pub(crate) fn close(&mut self) {
        self.closed = true;
        self.map.clear();
    }
}

/// What the reader does with one incoming frame.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// Deliver to the request with this id (if it is still registered).
    Route(u32, Frame),
    /// A connection-level error from the agent (id 0), with its message.
    ConnectionError(String),
    /// Nothing to do (an id-0 frame that is not an error).
    Ignore,
}

/// Classifies a frame read from the agent.
pub(crate) fn classify(f: RawFrame) -> Incoming {
    let id = f.header.id;
    let frame = Frame::from(f);
    if id != 0 {
        return Incoming::Route(id, frame);
    }
    if frame.is(Kind::Error) {
        let msg = decode::<ErrorReply>(&frame.payload)
            .map(|e| e.message)
            .unwrap_or_else(|e| format!("undecodable connection error: {e}"));
        return Incoming::ConnectionError(msg);
    }
    Incoming::Ignore
}

// ---------------------------------------------------------------- requests

/// The Hello this crate sends.
pub(crate) fn default_hello() -> Hello {
    Hello::new(format!("shoal-client/{}", env!("CARGO_PKG_VERSION")))
}

pub(crate) fn message<M: Message>(id: u32, m: &M) -> Vec<u8> {
    let mut buf = Vec::new();
    put_message(&mut buf, id, m);
    buf
}

pub(crate) fn empty(kind: Kind, id: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER_LEN);
    put_empty(&mut buf, kind, id);
    buf
}

pub(crate) fn path_bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

pub(crate) fn path_request(kind: Kind, id: u32, path: &Path, nofollow: bool) -> Vec<u8> {
    let mut buf = Vec::new();
    PathRequest {
        path: path_bytes(path),
        nofollow,
    }
    .put_as(&mut buf, kind, id);
    buf
}

/// `data` as frames of `kind`, split at [`MAX_PAYLOAD`] (none for empty
/// data).
pub(crate) fn data_frames<'a>(
    kind: Kind,
    id: u32,
    data: &'a [u8],
) -> impl Iterator<Item = Vec<u8>> + 'a {
    data.chunks(MAX_PAYLOAD).map(move |chunk| {
        let mut buf = Vec::with_capacity(HEADER_LEN + chunk.len());
        put_data(&mut buf, kind, id, chunk);
        buf
    })
}

/// Options of an upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadOptions {
    /// Permission bits of the file.
    pub mode: u32,
    /// Append instead of truncating.
    pub append: bool,
    /// Create missing parent directories.
    pub create_parents: bool,
}

impl Default for UploadOptions {
    fn default() -> Self {
        UploadOptions {
            mode: 0o644,
            append: false,
            create_parents: false,
        }
    }
}

pub(crate) fn upload_open(id: u32, path: &Path, opts: UploadOptions) -> Vec<u8> {
    message(
        id,
        &FileWrite {
            path: path_bytes(path),
            mode: opts.mode,
            append: opts.append,
            create_parents: opts.create_parents,
        },
    )
}

// ----------------------------------------------------------------- replies

/// Checks the agent's answer to the Hello.
pub(crate) fn hello_reply(f: Frame) -> Result<HelloOk> {
    match f.expect::<HelloOk>() {
        Ok(ok) => Ok(ok),
        Err(ClientError::Remote { code, message, .. }) => {
            Err(if code == ErrorCode::VersionMismatch {
                ClientError::VersionMismatch(message)
            } else {
                ClientError::Handshake(message)
            })
        }
        Err(e) => Err(e),
    }
}

/// Checks `ExecStarted` (the first answer to `Exec` and `Attach`).
pub(crate) fn exec_started(f: Frame) -> Result<ExecStarted> {
    let s: ExecStarted = f.expect()?;
    if s.pid <= 0 {
        return Err(ClientError::Protocol(format!(
            "exec started with pid {}",
            s.pid
        )));
    }
    Ok(s)
}

/// One event of a running exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// Bytes from stdout.
    Stdout(Vec<u8>),
    /// Bytes from stderr.
    Stderr(Vec<u8>),
    /// The command finished; no more events follow.
    Exit(ExecResult),
}

/// The frames of one exec after `ExecStarted`: output, then one result.
#[derive(Debug, Default)]
pub(crate) struct ExecStream {
    finished: bool,
}

impl ExecStream {
    pub(crate) fn finished(&self) -> bool {
        self.finished
    }

    /// The event a frame carries. After the result (or an error) the
    /// stream is finished.
    pub(crate) fn on_frame(&mut self, f: Frame) -> Result<ExecEvent> {
        if self.finished {
            return Err(ClientError::Protocol("frame after the exec's end".into()));
        }
        match Kind::from_u8(f.kind) {
            Some(Kind::Stdout) => Ok(ExecEvent::Stdout(f.payload)),
            Some(Kind::Stderr) => Ok(ExecEvent::Stderr(f.payload)),
            _ => {
                self.finished = true;
                if f.is(Kind::ExecExit) {
                    Ok(ExecEvent::Exit(f.expect()?))
                } else {
                    Err(f.unexpected())
                }
            }
        }
    }
}

/// Output and result of a finished exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Everything written to stdout.
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub result: ExecResult,
}

/// Collects an exec's events into an [`ExecOutput`], within a cap.
#[derive(Debug)]
pub(crate) struct Collector {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    cap: usize,
}

impl Collector {
    pub(crate) fn new(cap: usize) -> Self {
        Collector {
            stdout: Vec::new(),
            stderr: Vec::new(),
            cap,
        }
    }

    /// Takes one event; the output once the result came.
    pub(crate) fn push(&mut self, ev: ExecEvent) -> Result<Option<ExecOutput>> {
        let held = self.stdout.len() + self.stderr.len();
        let (dst, d) = match ev {
            ExecEvent::Stdout(d) => (&mut self.stdout, d),
            ExecEvent::Stderr(d) => (&mut self.stderr, d),
            ExecEvent::Exit(result) => {
                return Ok(Some(ExecOutput {
                    stdout: std::mem::take(&mut self.stdout),
                    stderr: std::mem::take(&mut self.stderr),
                    result,
                }))
            }
        };
        if held.saturating_add(d.len()) > self.cap {
            return Err(ClientError::Limit(format!(
                "exec output above {} bytes; stream it instead of collecting it",
                self.cap
            )));
        }
        dst.extend_from_slice(&d);
        Ok(None)
    }
}

/// One step of a download.
#[derive(Debug)]
pub(crate) enum DownloadStep {
    /// Bytes of the file, in order.
    Chunk(Vec<u8>),
    /// The end: this many bytes in all (checked against what came).
    Done(u64),
}

/// The frames of a `FileRead`: chunks, then `FileDone` with their sum.
#[derive(Debug)]
pub(crate) struct Download {
    total: u64,
    limit: Option<u64>,
    cap: Option<usize>,
}

impl Download {
    /// A download of at most `limit` bytes (as asked of the agent), held in
    /// memory up to `cap` bytes if the caller collects it.
    pub(crate) fn new(limit: Option<u64>, cap: Option<usize>) -> Self {
        Download {
            total: 0,
            limit,
            cap,
        }
    }

    pub(crate) fn on_frame(&mut self, f: Frame) -> Result<DownloadStep> {
        if f.is(Kind::FileChunk) {
            let n = u64::try_from(f.payload.len()).unwrap_or(u64::MAX);
            self.total = self.total.saturating_add(n);
            if self.limit.is_some_and(|l| self.total > l) {
                return Err(ClientError::Protocol(format!(
                    "download: the agent sent {} bytes, more than the {} asked for",
                    self.total,
                    self.limit.unwrap_or_default()
                )));
            }
            if let Some(cap) = self.cap {
                if usize::try_from(self.total).map_or(true, |t| t > cap) {
                    return Err(ClientError::Limit(format!(
                        "file above {cap} bytes; download it into a writer instead"
                    )));
                }
            }
            return Ok(DownloadStep::Chunk(f.payload));
        }
        let done: FileDone = f.expect()?;
        if done.bytes != self.total {
            return Err(ClientError::Protocol(format!(
                "download: agent sent {} bytes, received {}",
                done.bytes, self.total
            )));
        }
        Ok(DownloadStep::Done(self.total))
    }
}

/// An answer that came before an upload's `FileEnd`: always an error (the
/// agent answers an upload only at its end, or when it failed).
pub(crate) fn early_upload_reply(f: Frame) -> ClientError {
    f.unexpected()
}

/// Checks the `FileDone` that ends an upload of `sent` bytes.
pub(crate) fn upload_done(f: Frame, sent: u64) -> Result<u64> {
    let done: FileDone = f.expect()?;
    if done.bytes != sent {
        return Err(ClientError::Protocol(format!(
            "upload: sent {sent} bytes, the agent wrote {}",
            done.bytes
        )));
    }
    Ok(done.bytes)
}

/// The parts of a directory listing, accumulated within caps on entries
/// and bytes.
#[derive(Debug)]
pub(crate) struct Listing {
    entries: Vec<DirEntry>,
    bytes: usize,
    cap: usize,
    max_bytes: usize,
}

impl Listing {
    pub(crate) fn new(limits: &Limits) -> Self {
        Listing {
            entries: Vec::new(),
            bytes: 0,
            cap: limits.max_dir_entries,
            max_bytes: limits.max_dir_bytes,
        }
    }

    /// Takes one part; all entries once the last part came.
    pub(crate) fn on_frame(&mut self, f: Frame) -> Result<Option<Vec<DirEntry>>> {
        let part: DirEntries = f.expect()?;
        if self.entries.len() + part.entries.len() > self.cap {
            return Err(ClientError::Limit(format!(
                "directory listing above {} entries",
                self.cap
            )));
        }
        let part_bytes = part.entries.iter().fold(0usize, |n, e| {
            n.saturating_add(e.name.len() + DIR_ENTRY_OVERHEAD)
        });
        self.bytes = self.bytes.saturating_add(part_bytes);
        if self.bytes > self.max_bytes {
            return Err(ClientError::Limit(format!(
                "directory listing above {} bytes",
                self.max_bytes
            )));
        }
        self.entries.extend(part.entries);
        Ok(part.last.then(|| std::mem::take(&mut self.entries)))
    }
}

// --------------------------------------------------------------- handshake

/// The line that asks a hybrid vsock socket for `port`.
pub(crate) fn vsock_connect_line(port: u32) -> Vec<u8> {
    format!("CONNECT {port}\n").into_bytes()
}

/// Accumulates the hybrid vsock reply line (`OK <n>\n`) one byte at a time:
/// nothing after the newline may be consumed, it belongs to the protocol.
#[derive(Debug, Default)]
pub(crate) struct VsockReply {
    line: Vec<u8>,
}

impl VsockReply {
    /// Takes one byte; `Some(result)` once the line is complete.
    pub(crate) fn push(&mut self, b: u8) -> Option<Result<()>> {
        if b == b'\n' {
            return Some(if self.line.starts_with(b"OK") {
                Ok(())
            } else {
                Err(ClientError::VsockHandshake(
                    String::from_utf8_lossy(&self.line).into_owned(),
                ))
            });
        }
        self.line.push(b);
        if self.line.len() > HANDSHAKE_LINE_MAX {
            return Some(Err(ClientError::VsockHandshake(
                "reply line too long".into(),
            )));
        }
        None
    }

    /// The error for a stream that ended before the line did.
    pub(crate) fn closed(&self) -> ClientError {
        ClientError::VsockHandshake(format!(
            "connection closed after {:?}",
            String::from_utf8_lossy(&self.line)
        ))
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
