//! The blocking client.
//!
//! A [`Client`] owns one connection and one reader thread that routes
//! incoming frames by request id. It is `Clone`, `Send` and `Sync`: any
//! number of threads may issue calls on it at once, and they share the
//! connection. Streams (exec output, downloads) are delivered through
//! bounded channels of [`CHANNEL_FRAMES`] frames: a handle that is not
//! consumed eventually stalls the whole connection, so consume or drop
//! handles. (The tokio client, [`crate::AsyncClient`], needs no thread.)

mod exec;
mod ops;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agent_proto::{FrameDecoder, FrameError, Hello, HelloOk, Kind, Message};

pub use exec::{ExecHandle, ExecStdin};

use crate::error::{ClientError, Result};
use crate::session::{self, classify, Frame, Incoming, Limits, Routes, CHANNEL_FRAMES};
use crate::transport::{connect_blocking, retry_delay, set_sndbuf, Transport};

/// Bytes asked of each `read` of the connection.
const READ_CHUNK: usize = 256 << 10;

/// State shared with the reader thread.
struct Shared {
    routes: Mutex<Routes<SyncSender<Frame>>>,
    /// Last connection-level error: one the agent sent (request id 0), or
    /// why the reader stopped on a bad stream.
    last_error: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Inner {
    writer: Mutex<UnixStream>,
    shared: Arc<Shared>,
    timeout_ms: AtomicU64,
    hello: HelloOk,
    limits: Limits,
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

impl Client {
    /// Connects to an agent listening on a Unix socket
    /// (`shoal-agent --listen unix:PATH`).
    pub fn connect_unix(path: impl AsRef<Path>) -> Result<Client> {
        Client::connect(&Transport::Unix(path.as_ref().to_path_buf()))
    }

    /// Connects through a VMM's hybrid-vsock Unix socket: sends
    /// `CONNECT <port>\n`, expects `OK <n>\n`, then speaks the protocol.
    pub fn connect_vsock(uds: impl AsRef<Path>, port: u32) -> Result<Client> {
        Client::connect(&Transport::HybridVsock {
            uds: uds.as_ref().to_path_buf(),
            port,
        })
    }

    /// [`Client::connect_vsock`], retried until `timeout` (every 1 ms for
    /// the first 100 ms, when a just-restored VM's socket is about to
    /// appear, then every 10 ms) while the socket is missing, refuses, or
    /// the guest is not listening yet (e.g. right after boot or restore). A
    /// version mismatch or a refused handshake is returned at once.
    pub fn connect_vsock_retry(
        uds: impl AsRef<Path>,
        port: u32,
        timeout: Duration,
    ) -> Result<Client> {
        let t = Transport::HybridVsock {
            uds: uds.as_ref().to_path_buf(),
            port,
        };
        Client::connect_retry(&t, timeout)
    }

    /// Connects over `transport` and does the handshake.
    pub fn connect(transport: &Transport) -> Result<Client> {
        Client::from_stream(connect_blocking(transport)?)
    }

    /// [`Client::connect`], retried as [`Client::connect_vsock_retry`]
    /// describes.
    pub fn connect_retry(transport: &Transport, timeout: Duration) -> Result<Client> {
        let start = Instant::now();
        let deadline = start + timeout;
        loop {
            match Client::connect(transport) {
                Ok(c) => return Ok(c),
                Err(e) => match retry_delay(start, deadline, e.is_retryable_connect()) {
                    Some(d) => std::thread::sleep(d),
                    None => return Err(e),
                },
            }
        }
    }

    /// Speaks the protocol on an already connected stream.
    pub fn from_stream(s: UnixStream) -> Result<Client> {
        Client::from_stream_with_hello(s, session::default_hello())
    }

    /// As [`Client::from_stream`] with a given Hello (tests use it to
    /// present another version).
    pub fn from_stream_with_hello(s: UnixStream, hello: Hello) -> Result<Client> {
        Client::handshake(s, hello, Limits::default())
    }

    /// As [`Client::from_stream`], with other caps than the default ones.
    pub fn from_stream_with_limits(s: UnixStream, limits: Limits) -> Result<Client> {
        Client::handshake(s, session::default_hello(), limits)
    }

    fn handshake(mut s: UnixStream, hello: Hello, limits: Limits) -> Result<Client> {
        set_sndbuf(&s);
        s.write_all(&session::message(0, &hello))?;
        let mut dec = FrameDecoder::new();
        let first = loop {
            if let Some(f) = dec
                .next_frame()
                .map_err(|e| ClientError::Protocol(e.to_string()))?
            {
                break f;
            }
            // Whatever follows the reply in this read stays in `dec`,
            // which the reader thread takes over.
            let n = s.read(dec.spare(READ_CHUNK))?;
            if n == 0 {
                return Err(ClientError::Disconnected);
            }
            dec.commit(n);
        };
        let ok = session::hello_reply(first.into())?;
        let shared = Arc::new(Shared {
            routes: Mutex::new(Routes::new(limits.max_in_flight)),
            last_error: Mutex::new(None),
        });
        let read_half = s.try_clone()?;
        let reader_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("shoal-agent-reader".into())
            .spawn(move || reader(read_half, dec, &reader_shared))?;
        Ok(Client {
            inner: Arc::new(Inner {
                writer: Mutex::new(s),
                shared,
                timeout_ms: AtomicU64::new(0),
                hello: ok,
                limits,
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
        lock(&self.inner.shared.routes).is_closed()
    }

    /// Last connection-level error message the agent sent (request id 0),
    /// or why the client stopped reading a bad stream.
    pub fn last_connection_error(&self) -> Option<String> {
        lock(&self.inner.shared.last_error).clone()
    }

    fn register(&self) -> Result<Route<'_>> {
        let (tx, rx) = sync_channel(CHANNEL_FRAMES);
        let inserted = lock(&self.inner.shared.routes).insert(tx);
        let id = inserted.map_err(|e| match e {
            ClientError::Disconnected => self.ended(),
            e => e,
        })?;
        Ok(Route {
            client: self,
            id,
            rx,
            kept: false,
        })
    }

    fn unregister(&self, id: u32) {
        lock(&self.inner.shared.routes).remove(id);
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
        self.send_raw(&session::message(id, m))
    }

    fn send_empty(&self, kind: Kind, id: u32) -> Result<()> {
        self.send_raw(&session::empty(kind, id))
    }

    /// Sends `data` as frames of `kind`, split at
    /// [`agent_proto::MAX_PAYLOAD`].
    fn send_data(&self, kind: Kind, id: u32, data: &[u8]) -> Result<()> {
        for frame in session::data_frames(kind, id, data) {
            self.send_raw(&frame)?;
        }
        Ok(())
    }

    /// The next frame of a route; `timed` applies the call timeout.
    fn recv(&self, rx: &Receiver<Frame>, timed: bool) -> Result<Frame> {
        let ms = self.inner.timeout_ms.load(Ordering::Relaxed);
        if timed && ms > 0 {
            return match rx.recv_timeout(Duration::from_millis(ms)) {
                Ok(f) => Ok(f),
                Err(RecvTimeoutError::Timeout) => Err(ClientError::Timeout),
                Err(RecvTimeoutError::Disconnected) => Err(self.ended()),
            };
        }
        rx.recv().map_err(|_| self.ended())
    }

    /// Why a route's stream ended without its last frame.
    fn ended(&self) -> ClientError {
        match self.last_connection_error() {
            Some(e) if e.starts_with(BAD_STREAM) => ClientError::Protocol(e),
            _ => ClientError::Disconnected,
        }
    }
}

/// Prefix of the reason recorded when the reader gave up on a bad stream.
const BAD_STREAM: &str = "bad stream from the agent: ";

/// The reader thread: routes frames by request id until the stream ends.
fn reader(mut s: UnixStream, mut dec: FrameDecoder, shared: &Shared) {
    let why = loop {
        match dec.next_frame() {
            Ok(Some(f)) => {
                dispatch(shared, classify(f));
                continue;
            }
            Ok(None) => {}
            Err(e) => break Some(e),
        }
        match s.read(dec.spare(READ_CHUNK)) {
            Ok(0) => break (!dec.at_boundary()).then_some(FrameError::Truncated),
            Ok(n) => dec.commit(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break None,
        }
    };
    if let Some(e) = why {
        *lock(&shared.last_error) = Some(format!("{BAD_STREAM}{e}"));
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    lock(&shared.routes).close();
}

fn dispatch(shared: &Shared, incoming: Incoming) {
    match incoming {
        Incoming::Route(id, frame) => {
            let tx = lock(&shared.routes).get(id).cloned();
            // No route: a dropped handle's stream, discarded.
            if let Some(tx) = tx {
                if tx.send(frame).is_err() {
                    lock(&shared.routes).remove(id);
                }
            }
        }
        Incoming::ConnectionError(msg) => *lock(&shared.last_error) = Some(msg),
        Incoming::Ignore => {}
    }
}
