//! Blocking host-side client of the agent protocol ([`crate::proto`]).
//!
//! A [`Client`] owns one connection (a plain Unix socket, or a VMM
//! hybrid-vsock Unix socket after the `CONNECT <port>` handshake) and one
//! reader thread that routes incoming frames by request id. It is `Clone`,
//! `Send` and `Sync`: any number of threads may issue calls on it at once,
//! and they share the connection. Streams (exec output, downloads) are
//! delivered through bounded channels of [`CHANNEL_FRAMES`] frames: a
//! handle that is not consumed eventually stalls the whole connection, so
//! consume or drop handles.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use thiserror::Error;

use crate::proto::{
    self, decode, put_data, put_empty, put_message, AttachRequest, ChmodRequest, DirEntries,
    ErrorReply, ExecStarted, FileDone, FileRead, FileWrite, Hello, Kind, Message, MkdirRequest,
    PathRequest, PostRestore, PowerAction, PowerRequest, ReadFrameError, RemoveRequest,
    RenameRequest, SignalRequest, HEADER_LEN, HELLO_MAGIC, MAX_PAYLOAD, PROTOCOL_VERSION,
};

pub use crate::proto::{
    AgentMode, Command, DirEntry, ErrorCode, ExecRequest, ExecResult, ExitStatus, FileStat,
    FileType, HealthReply, HelloOk, PostRestoreReply, User, VersionReply,
};

/// Frames buffered per request before the reader thread waits.
pub const CHANNEL_FRAMES: usize = 64;

/// Send buffer asked for on the socket, so a whole frame goes out at once
/// and the agent reads it in one system call.
const SNDBUF: libc::c_int = 4 << 20;

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
    /// The agent sent something this client did not expect.
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The errno of a remote I/O or spawn error.
    pub fn errno(&self) -> Option<i32> {
        match self {
            ClientError::Remote { errno, .. } if *errno != 0 => Some(*errno),
            _ => None,
        }
    }
}

/// Result of client calls.
pub type Result<T> = std::result::Result<T, ClientError>;

/// A frame as received.
struct Frame {
    kind: u8,
    payload: Vec<u8>,
}

impl Frame {
    /// Decodes the frame as `M`, or turns an error frame into an error.
    fn expect<M: Message>(self) -> Result<M> {
        if self.kind == M::KIND as u8 {
            return decode(&self.payload).map_err(|e| ClientError::Protocol(e.to_string()));
        }
        Err(self.unexpected())
    }

    fn expect_ok(self) -> Result<()> {
        if self.kind == Kind::Ok as u8 {
            return Ok(());
        }
        Err(self.unexpected())
    }

    fn unexpected(self) -> ClientError {
        if self.kind == Kind::Error as u8 {
            return match decode::<ErrorReply>(&self.payload) {
                Ok(e) => ClientError::Remote {
                    code: e.code,
                    errno: e.errno,
                    message: e.message,
                },
                Err(e) => ClientError::Protocol(format!("bad error frame: {e}")),
            };
        }
        ClientError::Protocol(format!("unexpected frame kind {:#04x}", self.kind))
    }
}

/// State shared with the reader thread.
struct Shared {
    routes: Mutex<HashMap<u32, SyncSender<Frame>>>,
    closed: AtomicBool,
    /// Last connection-level error (id 0) the agent sent.
    last_error: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Inner {
    writer: Mutex<UnixStream>,
    shared: Arc<Shared>,
    next_id: AtomicU32,
    timeout_ms: AtomicU64,
    hello: HelloOk,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Ends the reader thread (it sees EOF).
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }
}

/// A connection to the agent. Cheap to clone; all clones share it.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("agent", &self.inner.hello)
            .finish_non_exhaustive()
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

impl ExecRequest {
    /// Runs `argv` (argv\[0\] looked up in PATH), stdin from /dev/null.
    pub fn argv<I, S>(argv: I) -> ExecRequest
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        Self::new(Command::Argv(
            argv.into_iter().map(|s| s.as_ref().to_vec()).collect(),
        ))
    }

    /// Runs `/bin/sh -c script`, stdin from /dev/null.
    pub fn shell(script: impl AsRef<[u8]>) -> ExecRequest {
        Self::new(Command::Shell(script.as_ref().to_vec()))
    }

    fn new(command: Command) -> ExecRequest {
        ExecRequest {
            command,
            env: Vec::new(),
            clear_env: false,
            cwd: None,
            user: None,
            stdin: false,
            timeout_ms: 0,
        }
    }

    /// Gives the command a stdin pipe (write with [`ExecHandle::write_stdin`]).
    pub fn with_stdin(mut self) -> Self {
        self.stdin = true;
        self
    }

    /// Kills the process tree after `t`.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout_ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1);
        self
    }

    /// Sets an environment variable.
    pub fn with_env(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        self.env
            .push((name.as_ref().to_vec(), value.as_ref().to_vec()));
        self
    }

    /// Sets the working directory.
    pub fn with_cwd(mut self, dir: impl AsRef<Path>) -> Self {
        self.cwd = Some(dir.as_ref().as_os_str().as_bytes().to_vec());
        self
    }

    /// Runs as `uid`/`gid`.
    pub fn with_user(mut self, uid: u32, gid: u32) -> Self {
        self.user = Some(User { uid, gid });
        self
    }
}

/// Options of [`Client::upload`].
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

/// Removes a route when a call ends, however it ends.
struct Route<'a> {
    client: &'a Client,
    id: u32,
    rx: Receiver<Frame>,
    /// Handed over to a handle that unregisters itself.
    kept: bool,
}

impl Route<'_> {
    /// Keeps the route registered and returns its receiver.
    fn keep(mut self) -> Receiver<Frame> {
        self.kept = true;
        let (_, dummy) = sync_channel(0);
        std::mem::replace(&mut self.rx, dummy)
    }
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.client.unregister(self.id);
        }
    }
}

fn path_bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

impl Client {
    /// Connects to an agent listening on a Unix socket
    /// (`shoal-agent --listen unix:PATH`).
    pub fn connect_unix(path: impl AsRef<Path>) -> Result<Client> {
        let s = UnixStream::connect(path)?;
        Client::from_stream(s)
    }

    /// Connects through a VMM's hybrid-vsock Unix socket: sends
    /// `CONNECT <port>\n`, expects `OK <n>\n`, then speaks the protocol.
    pub fn connect_vsock(uds: impl AsRef<Path>, port: u32) -> Result<Client> {
        let mut s = UnixStream::connect(uds)?;
        s.write_all(format!("CONNECT {port}\n").as_bytes())?;
        // Byte by byte: nothing after the newline may be consumed.
        let mut line = Vec::new();
        loop {
            let mut b = [0u8; 1];
            if s.read(&mut b)? == 0 {
                return Err(ClientError::VsockHandshake(format!(
                    "connection closed after {:?}",
                    String::from_utf8_lossy(&line)
                )));
            }
            if b[0] == b'\n' {
                break;
            }
            line.push(b[0]);
            if line.len() > 64 {
                return Err(ClientError::VsockHandshake("reply line too long".into()));
            }
        }
        if !line.starts_with(b"OK") {
            return Err(ClientError::VsockHandshake(
                String::from_utf8_lossy(&line).into_owned(),
            ));
        }
        Client::from_stream(s)
    }

    /// [`Client::connect_vsock`], retried until `timeout` (every 1 ms for
    /// the first 100 ms, when a just-restored VM's socket is about to
    /// appear, then every 10 ms) while
    /// the socket is missing, refuses, or the guest is not listening yet
    /// (e.g. right after boot or restore). A version mismatch or a refused
    /// handshake is returned at once.
    pub fn connect_vsock_retry(
        uds: impl AsRef<Path>,
        port: u32,
        timeout: Duration,
    ) -> Result<Client> {
        let start = std::time::Instant::now();
        let deadline = start + timeout;
        loop {
            match Client::connect_vsock(uds.as_ref(), port) {
                Ok(c) => return Ok(c),
                Err(
                    e @ (ClientError::Io(_)
                    | ClientError::VsockHandshake(_)
                    | ClientError::Disconnected),
                ) => {
                    let now = std::time::Instant::now();
                    if now >= deadline {
                        return Err(e);
                    }
                    let fast = now.duration_since(start) < Duration::from_millis(100);
                    std::thread::sleep(Duration::from_millis(if fast { 1 } else { 10 }));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Speaks the protocol on an already connected stream.
    pub fn from_stream(s: UnixStream) -> Result<Client> {
        Client::from_stream_with_hello(
            s,
            Hello {
                magic: HELLO_MAGIC,
                version: PROTOCOL_VERSION,
                client: format!("shoal-client/{}", env!("CARGO_PKG_VERSION")),
            },
        )
    }

    /// As [`Client::from_stream`] with a given Hello (tests use it to
    /// present another version).
    pub fn from_stream_with_hello(mut s: UnixStream, hello: Hello) -> Result<Client> {
        let sndbuf: libc::c_int = SNDBUF;
        // SAFETY: the option value is an int of the given size; failure
        // only leaves the default buffer.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                std::ptr::addr_of!(sndbuf).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        let mut buf = Vec::new();
        put_message(&mut buf, 0, &hello);
        s.write_all(&buf)?;
        let mut payload = Vec::new();
        let h = match proto::read_frame(&mut s, &mut payload) {
            Ok(Some(h)) => h,
            Ok(None) => return Err(ClientError::Disconnected),
            Err(ReadFrameError::Io(e)) => return Err(e.into()),
            Err(ReadFrameError::Frame(e)) => return Err(ClientError::Protocol(e.to_string())),
        };
        let frame = Frame {
            kind: h.kind,
            payload,
        };
        let ok = match frame.expect::<HelloOk>() {
            Ok(ok) => ok,
            Err(ClientError::Remote { code, message, .. }) => {
                return Err(if code == ErrorCode::VersionMismatch {
                    ClientError::VersionMismatch(message)
                } else {
                    ClientError::Handshake(message)
                });
            }
            Err(e) => return Err(e),
        };
        let shared = Arc::new(Shared {
            routes: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            last_error: Mutex::new(None),
        });
        let read_half = s.try_clone()?;
        let reader_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("shoal-agent-reader".into())
            .spawn(move || reader(read_half, &reader_shared))?;
        Ok(Client {
            inner: Arc::new(Inner {
                writer: Mutex::new(s),
                shared,
                next_id: AtomicU32::new(1),
                timeout_ms: AtomicU64::new(0),
                hello: ok,
            }),
        })
    }

    /// What the agent said in the handshake.
    pub fn agent_info(&self) -> &HelloOk {
        &self.inner.hello
    }

    /// Timeout for request/response calls (not for exec events or
    /// transfers); None waits forever (the default).
    pub fn set_timeout(&self, t: Option<Duration>) {
        let ms = t.map_or(0, |t| {
            u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)
        });
        self.inner.timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// The connection is known to be closed.
    pub fn is_closed(&self) -> bool {
        self.inner.shared.closed.load(Ordering::Acquire)
    }

    /// Last connection-level error message the agent sent (request id 0).
    pub fn last_connection_error(&self) -> Option<String> {
        lock(&self.inner.shared.last_error).clone()
    }

    fn register(&self) -> Result<Route<'_>> {
        if self.is_closed() {
            return Err(ClientError::Disconnected);
        }
        let (tx, rx) = sync_channel(CHANNEL_FRAMES);
        let mut routes = lock(&self.inner.shared.routes);
        let id = loop {
            let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 && !routes.contains_key(&id) {
                break id;
            }
        };
        routes.insert(id, tx);
        drop(routes);
        // The reader may have closed in between: its clear() ran before
        // our insert, so check again.
        if self.is_closed() {
            self.unregister(id);
            return Err(ClientError::Disconnected);
        }
        Ok(Route {
            client: self,
            id,
            rx,
            kept: false,
        })
    }

    fn unregister(&self, id: u32) {
        lock(&self.inner.shared.routes).remove(&id);
    }

    fn send_raw(&self, buf: &[u8]) -> Result<()> {
        lock(&self.inner.writer).write_all(buf).map_err(|e| {
            if self.is_closed() {
                ClientError::Disconnected
            } else {
                ClientError::Io(e)
            }
        })
    }

    fn send_message<M: Message>(&self, id: u32, m: &M) -> Result<()> {
        let mut buf = Vec::new();
        put_message(&mut buf, id, m);
        self.send_raw(&buf)
    }

    fn send_empty(&self, kind: Kind, id: u32) -> Result<()> {
        let mut buf = Vec::with_capacity(HEADER_LEN);
        put_empty(&mut buf, kind, id);
        self.send_raw(&buf)
    }

    /// Sends `data` as frames of `kind`, split at [`MAX_PAYLOAD`].
    fn send_data(&self, kind: Kind, id: u32, data: &[u8]) -> Result<()> {
        for chunk in data.chunks(MAX_PAYLOAD) {
            let mut buf = Vec::with_capacity(HEADER_LEN + chunk.len());
            put_data(&mut buf, kind, id, chunk);
            self.send_raw(&buf)?;
        }
        Ok(())
    }

    fn recv(&self, route: &Route<'_>, timed: bool) -> Result<Frame> {
        let ms = self.inner.timeout_ms.load(Ordering::Relaxed);
        if timed && ms > 0 {
            return match route.rx.recv_timeout(Duration::from_millis(ms)) {
                Ok(f) => Ok(f),
                Err(RecvTimeoutError::Timeout) => Err(ClientError::Timeout),
                Err(RecvTimeoutError::Disconnected) => Err(ClientError::Disconnected),
            };
        }
        route.rx.recv().map_err(|_| ClientError::Disconnected)
    }

    /// Sends a control request and returns the first answer frame.
    fn call<M: Message>(&self, m: &M) -> Result<Frame> {
        let route = self.register()?;
        self.send_message(route.id, m)?;
        self.recv(&route, true)
    }

    fn call_empty(&self, kind: Kind) -> Result<Frame> {
        let route = self.register()?;
        self.send_empty(kind, route.id)?;
        self.recv(&route, true)
    }

    fn call_path(&self, kind: Kind, path: &Path, nofollow: bool) -> Result<Frame> {
        let route = self.register()?;
        let mut buf = Vec::new();
        PathRequest {
            path: path_bytes(path),
            nofollow,
        }
        .put_as(&mut buf, kind, route.id);
        self.send_raw(&buf)?;
        self.recv(&route, true)
    }

    // ---------------------------------------------------------------- exec

    /// Starts a command; the handle streams its output and result.
    pub fn exec(&self, req: &ExecRequest) -> Result<ExecHandle> {
        self.start(|id| self.send_message(id, req))
    }

    /// Runs a command to completion and collects its output.
    pub fn exec_simple(&self, req: &ExecRequest) -> Result<ExecOutput> {
        self.exec(req)?.wait()
    }

    /// Re-attaches to an exec by id (e.g. from a new connection after the
    /// old one was lost): the output kept since is delivered first.
    pub fn attach(&self, exec_id: u64) -> Result<ExecHandle> {
        self.start(|id| self.send_message(id, &AttachRequest { exec_id }))
    }

    fn start(&self, send: impl FnOnce(u32) -> Result<()>) -> Result<ExecHandle> {
        let route = self.register()?;
        send(route.id)?;
        let started: ExecStarted = self.recv(&route, true)?.expect()?;
        // Hand the route over to the handle (it unregisters on drop).
        let id = route.id;
        let rx = route.keep();
        Ok(ExecHandle {
            client: self.clone(),
            id,
            exec_id: started.exec_id,
            pid: started.pid,
            rx,
            finished: false,
        })
    }

    /// Sends `signal` to a running exec (its process group with `group`).
    pub fn signal(&self, exec_id: u64, signal: i32, group: bool) -> Result<()> {
        self.call(&SignalRequest {
            exec_id,
            signal,
            group,
        })?
        .expect_ok()
    }

    // --------------------------------------------------------------- files

    /// Streams `src` into the file at `path` (created or truncated);
    /// returns the bytes written.
    pub fn upload(
        &self,
        src: &mut dyn Read,
        path: impl AsRef<Path>,
        opts: UploadOptions,
    ) -> Result<u64> {
        let route = self.register()?;
        self.send_message(
            route.id,
            &FileWrite {
                path: path_bytes(path.as_ref()),
                mode: opts.mode,
                append: opts.append,
                create_parents: opts.create_parents,
            },
        )?;
        let mut buf = vec![0u8; HEADER_LEN + MAX_PAYLOAD];
        loop {
            // Fill a whole frame unless the source ends.
            let mut n = 0;
            while n < MAX_PAYLOAD {
                let dst = buf.get_mut(HEADER_LEN + n..).unwrap_or_default();
                match src.read(dst) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if n == 0 {
                break;
            }
            let frame = buf.get_mut(..HEADER_LEN + n).unwrap_or_default();
            let hdr = proto::Header {
                len: n as u32, // n <= MAX_PAYLOAD
                kind: Kind::FileData as u8,
                id: route.id,
            };
            if let Some(h) = frame.get_mut(..HEADER_LEN) {
                h.copy_from_slice(&hdr.encode());
            }
            self.send_raw(frame)?;
            // An early error (e.g. the open failed) ends the upload.
            match route.rx.try_recv() {
                Ok(f) => return Err(f.unexpected()),
                Err(TryRecvError::Disconnected) => return Err(ClientError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            if n < MAX_PAYLOAD {
                break;
            }
        }
        self.send_empty(Kind::FileEnd, route.id)?;
        let done: FileDone = self.recv(&route, false)?.expect()?;
        Ok(done.bytes)
    }

    /// Uploads a byte slice.
    pub fn write_file(&self, path: impl AsRef<Path>, data: &[u8], mode: u32) -> Result<u64> {
        let opts = UploadOptions {
            mode,
            ..UploadOptions::default()
        };
        self.upload(&mut &data[..], path, opts)
    }

    /// Streams the file at `path` into `dst`; returns the bytes read.
    pub fn download(&self, path: impl AsRef<Path>, dst: &mut dyn Write) -> Result<u64> {
        self.download_range(path, 0, None, dst)
    }

    /// Streams at most `limit` bytes from `offset` of the file into `dst`.
    pub fn download_range(
        &self,
        path: impl AsRef<Path>,
        offset: u64,
        limit: Option<u64>,
        dst: &mut dyn Write,
    ) -> Result<u64> {
        let route = self.register()?;
        self.send_message(
            route.id,
            &FileRead {
                path: path_bytes(path.as_ref()),
                offset,
                limit,
            },
        )?;
        let mut total = 0u64;
        loop {
            let f = self.recv(&route, false)?;
            if f.kind == Kind::FileChunk as u8 {
                dst.write_all(&f.payload)?;
                total += f.payload.len() as u64;
                continue;
            }
            let done: FileDone = f.expect()?;
            if done.bytes != total {
                return Err(ClientError::Protocol(format!(
                    "download: agent sent {} bytes, received {total}",
                    done.bytes
                )));
            }
            return Ok(total);
        }
    }

    /// Reads a whole file.
    pub fn read_file(&self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.download(path, &mut v)?;
        Ok(v)
    }

    /// stat(2) (symlinks followed).
    pub fn stat(&self, path: impl AsRef<Path>) -> Result<FileStat> {
        self.call_path(Kind::Stat, path.as_ref(), false)?.expect()
    }

    /// lstat(2) (a final symlink is described itself).
    pub fn lstat(&self, path: impl AsRef<Path>) -> Result<FileStat> {
        self.call_path(Kind::Stat, path.as_ref(), true)?.expect()
    }

    /// Lists a directory (without `.` and `..`), in directory order.
    pub fn list_dir(&self, path: impl AsRef<Path>) -> Result<Vec<DirEntry>> {
        let route = self.register()?;
        let mut buf = Vec::new();
        PathRequest {
            path: path_bytes(path.as_ref()),
            nofollow: false,
        }
        .put_as(&mut buf, Kind::ListDir, route.id);
        self.send_raw(&buf)?;
        let mut all = Vec::new();
        loop {
            let part: DirEntries = self.recv(&route, true)?.expect()?;
            all.extend(part.entries);
            if part.last {
                return Ok(all);
            }
        }
    }

    /// mkdir(2), or `mkdir -p` with `parents`.
    pub fn mkdir(&self, path: impl AsRef<Path>, mode: u32, parents: bool) -> Result<()> {
        self.call(&MkdirRequest {
            path: path_bytes(path.as_ref()),
            mode,
            parents,
        })?
        .expect_ok()
    }

    /// Removes a file, symlink or empty directory (any tree with
    /// `recursive`).
    pub fn remove(&self, path: impl AsRef<Path>, recursive: bool) -> Result<()> {
        self.call(&RemoveRequest {
            path: path_bytes(path.as_ref()),
            recursive,
        })?
        .expect_ok()
    }

    /// rename(2).
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        self.call(&RenameRequest {
            from: path_bytes(from.as_ref()),
            to: path_bytes(to.as_ref()),
        })?
        .expect_ok()
    }

    /// chmod(2).
    pub fn chmod(&self, path: impl AsRef<Path>, mode: u32) -> Result<()> {
        self.call(&ChmodRequest {
            path: path_bytes(path.as_ref()),
            mode,
        })?
        .expect_ok()
    }

    // -------------------------------------------------------------- system

    /// Liveness and counters.
    pub fn health(&self) -> Result<HealthReply> {
        self.call_empty(Kind::Health)?.expect()
    }

    /// Protocol and agent version.
    pub fn version(&self) -> Result<VersionReply> {
        self.call_empty(Kind::Version)?.expect()
    }

    /// After a snapshot restore: reseed the guest RNG with `entropy` and
    /// set its clock to `unix_time_ns` (0: leave the clock).
    pub fn post_restore(&self, entropy: [u8; 64], unix_time_ns: u64) -> Result<PostRestoreReply> {
        self.call(&PostRestore {
            entropy,
            unix_time_ns,
        })?
        .expect()
    }

    /// Powers the guest off (a host-mode agent exits). The connection
    /// closing instead of the `Ok` (the VM went down first) counts as
    /// success.
    pub fn poweroff(&self) -> Result<()> {
        self.power(PowerAction::Poweroff)
    }

    /// Reboots the guest (a host-mode agent exits); as [`Client::poweroff`].
    pub fn reboot(&self) -> Result<()> {
        self.power(PowerAction::Reboot)
    }

    fn power(&self, action: PowerAction) -> Result<()> {
        match self.call(&PowerRequest { action }) {
            Ok(f) => f.expect_ok(),
            Err(ClientError::Disconnected) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The reader thread: routes frames by request id until the stream ends.
fn reader(s: UnixStream, shared: &Shared) {
    let mut r = BufReader::with_capacity(2 * (HEADER_LEN + MAX_PAYLOAD), s);
    loop {
        let mut payload = Vec::new();
        let h = match proto::read_frame(&mut r, &mut payload) {
            Ok(Some(h)) => h,
            Ok(None) | Err(_) => break,
        };
        let tx = lock(&shared.routes).get(&h.id).cloned();
        match tx {
            Some(tx) => {
                let frame = Frame {
                    kind: h.kind,
                    payload,
                };
                if tx.send(frame).is_err() {
                    lock(&shared.routes).remove(&h.id);
                }
            }
            None if h.kind == Kind::Error as u8 => {
                let msg = decode::<ErrorReply>(&payload)
                    .map(|e| e.message)
                    .unwrap_or_else(|e| e.to_string());
                *lock(&shared.last_error) = Some(msg);
            }
            None => {} // a dropped handle's stream: discarded
        }
    }
    shared.closed.store(true, Ordering::Release);
    lock(&shared.routes).clear();
}

/// A running (or re-attached) exec.
pub struct ExecHandle {
    client: Client,
    id: u32,
    exec_id: u64,
    pid: i32,
    rx: Receiver<Frame>,
    finished: bool,
}

impl std::fmt::Debug for ExecHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecHandle")
            .field("exec_id", &self.exec_id)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Drop for ExecHandle {
    fn drop(&mut self) {
        self.client.unregister(self.id);
    }
}

impl ExecHandle {
    /// Agent-wide exec id (for [`Client::attach`] and [`Client::signal`]).
    pub fn exec_id(&self) -> u64 {
        self.exec_id
    }

    /// Process id of the command in the guest.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The next output chunk or the result; `Ok(None)` after the result.
    pub fn next_event(&mut self) -> Result<Option<ExecEvent>> {
        if self.finished {
            return Ok(None);
        }
        let f = self.rx.recv().map_err(|_| ClientError::Disconnected)?;
        let ev = match Kind::from_u8(f.kind) {
            Some(Kind::Stdout) => ExecEvent::Stdout(f.payload),
            Some(Kind::Stderr) => ExecEvent::Stderr(f.payload),
            Some(Kind::ExecExit) => {
                self.finished = true;
                ExecEvent::Exit(f.expect()?)
            }
            _ => {
                self.finished = true;
                return Err(f.unexpected());
            }
        };
        Ok(Some(ev))
    }

    /// Writes to the command's stdin (the exec must have been started with
    /// [`ExecRequest::with_stdin`]; otherwise the data is dropped).
    pub fn write_stdin(&self, data: &[u8]) -> Result<()> {
        self.client.send_data(Kind::Stdin, self.id, data)
    }

    /// Closes the command's stdin (after what was written has been
    /// delivered).
    pub fn close_stdin(&self) -> Result<()> {
        self.client.send_empty(Kind::StdinClose, self.id)
    }

    /// A writer for the command's stdin that can be moved to another
    /// thread (while this one reads the output).
    pub fn stdin(&self) -> ExecStdin {
        ExecStdin {
            client: self.client.clone(),
            id: self.id,
        }
    }

    /// Sends a signal to the command (its whole process group with
    /// `group`).
    pub fn signal(&self, signal: i32, group: bool) -> Result<()> {
        self.client.signal(self.exec_id, signal, group)
    }

    /// Collects all output and the result.
    pub fn wait(mut self) -> Result<ExecOutput> {
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let result = self.wait_with(&mut stdout, &mut stderr)?;
        Ok(ExecOutput {
            stdout,
            stderr,
            result,
        })
    }

    /// Streams output into `stdout` and `stderr` until the result.
    pub fn wait_with(
        &mut self,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
    ) -> Result<ExecResult> {
        loop {
            match self.next_event()? {
                Some(ExecEvent::Stdout(d)) => stdout.write_all(&d)?,
                Some(ExecEvent::Stderr(d)) => stderr.write_all(&d)?,
                Some(ExecEvent::Exit(r)) => return Ok(r),
                None => return Err(ClientError::Protocol("exec already finished".into())),
            }
        }
    }
}

/// Writes to an exec's stdin; `Clone` and `Send`. Each `write` sends the
/// whole buffer (in frames of at most [`MAX_PAYLOAD`]).
#[derive(Clone)]
pub struct ExecStdin {
    client: Client,
    id: u32,
}

impl std::fmt::Debug for ExecStdin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStdin").field("id", &self.id).finish()
    }
}

impl ExecStdin {
    /// Closes the command's stdin.
    pub fn close(&self) -> Result<()> {
        self.client.send_empty(Kind::StdinClose, self.id)
    }
}

impl Write for ExecStdin {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.client
            .send_data(Kind::Stdin, self.id, buf)
            .map_err(std::io::Error::other)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
