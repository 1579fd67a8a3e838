//! The tokio client.
//!
//! An [`AsyncClient`] owns one connection and two tasks, never a thread:
//! a reader that cuts the stream into frames and hands each to the channel
//! of its request, and a writer that sends queued frames in order. Any
//! number of requests share the connection at once. Every buffer is
//! bounded (per-request channels of [`Config::channel_frames`] frames, a
//! write queue of [`Config::write_buffer`] bytes, the caps of
//! [`Limits`]), and every wait has a deadline ([`Config`]) that, when it
//! passes, returns [`ClientError::Timeout`] and frees what the call held.
//! The reader does not wait for a request that has stopped reading:
//! frames for a request whose channel is full queue behind it (up to
//! [`Config::stall_buffer`] bytes), fed into the channel by a task of
//! their own, while the reader goes on with the other requests. Past that
//! backlog, a consumer still taking frames (slower than the agent, not
//! gone) holds the reader until its backlog is back under the cap — the
//! agent is then slowed down through the socket, as with any reader — and
//! a consumer that has taken nothing for [`PROGRESS_WINDOW`] (at most
//! [`Config::stall_timeout`]) loses that stream ([`ClientError::Stalled`]),
//! not the connection. Dropping every clone of the client closes the
//! connection and ends both tasks.

mod ops;
mod streams;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use agent_proto::{FrameDecoder, FrameError, Hello, HelloOk, Kind, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout_at, Instant};

pub use streams::{AsyncDownload, AsyncExecHandle, AsyncExecStdin, AsyncUpload};

use crate::error::{ClientError, Result};
use crate::session::{self, classify, Frame, Incoming, Limits, Routes, CHANNEL_FRAMES};
use crate::transport::{connect_async, retry_delay, set_sndbuf, Transport};

/// Bytes asked of each read of the connection.
const READ_CHUNK: usize = 256 << 10;
/// Default [`Config::stall_buffer`].
const STALL_BUFFER: usize = 8 << 20;
/// A consumer whose backlog is over [`Config::stall_buffer`] and that has
/// taken no frame for this long is taken to have stopped reading (its
/// stream is dropped); one that took a frame more recently is waited for.
pub const PROGRESS_WINDOW: Duration = Duration::from_secs(1);

/// Deadlines and bounds of an [`AsyncClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Connecting and the handshake.
    pub connect_timeout: Duration,
    /// Each request/response call, and each frame of a transfer (upload,
    /// download, listing): the agent must answer or make progress within
    /// it.
    pub call_timeout: Duration,
    /// How long after an exec's own timeout its result may come before
    /// the handle gives up; an exec without a timeout has no deadline
    /// unless one is set ([`AsyncExecHandle::set_deadline`]).
    pub exec_slack: Duration,
    /// How long the reader waits for a request whose channel is full
    /// before it drops that request's stream.
    pub stall_timeout: Duration,
    /// Frames buffered per request.
    pub channel_frames: usize,
    /// Bytes of frames queued per request beyond its full channel; past
    /// them the reader waits for a consumer that is still reading, and
    /// drops the stream of one that is not ([`PROGRESS_WINDOW`]).
    pub stall_buffer: usize,
    /// Bytes of outgoing frames queued for the writer at most.
    pub write_buffer: usize,
    /// Caps on what one call accumulates.
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            connect_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(60),
            exec_slack: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(60),
            channel_frames: CHANNEL_FRAMES,
            stall_buffer: STALL_BUFFER,
            write_buffer: 4 << 20,
            limits: Limits::default(),
        }
    }
}

/// A frame queued for the writer, holding its share of the write budget.
struct Outgoing {
    bytes: Vec<u8>,
    _permit: OwnedSemaphorePermit,
}

/// State shared by the client handles and the two tasks.
struct Shared {
    routes: Mutex<Routes<mpsc::Sender<Frame>>>,
    /// Frames waiting behind a full channel, per request id.
    backlogs: Mutex<std::collections::HashMap<u32, Backlog>>,
    /// Signalled whenever a backlog's consumer takes a frame.
    drained: tokio::sync::Notify,
    /// Last connection-level error: one the agent sent (request id 0), or
    /// why the reader stopped on a bad stream.
    last_error: Mutex<Option<String>>,
    /// The reader stopped because the agent broke the protocol.
    bad_stream: AtomicBool,
    /// Set to true to stop both tasks.
    stop: watch::Sender<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn close(&self) {
        lock(&self.routes).close();
        self.stop.send_replace(true);
    }
}

struct Inner {
    shared: Arc<Shared>,
    out: mpsc::UnboundedSender<Outgoing>,
    budget: Arc<Semaphore>,
    hello: HelloOk,
    config: Config,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.close();
    }
}

/// A connection to the agent. Cheap to clone; all clones share it.
#[derive(Clone)]
pub struct AsyncClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AsyncClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncClient")
            .field("agent", &self.inner.hello)
            .finish_non_exhaustive()
    }
}

/// Frames of one request waiting for room in its channel.
struct Backlog {
    frames: std::collections::VecDeque<Frame>,
    bytes: usize,
    /// When its consumer last took a frame (or the backlog began).
    progress: tokio::time::Instant,
}

/// A registered request: its id and the receiving end of its frames.
/// Dropping it unregisters the request, whatever ended the call.
struct Route {
    shared: Arc<Shared>,
    id: u32,
    rx: mpsc::Receiver<Frame>,
}

impl Drop for Route {
    fn drop(&mut self) {
        lock(&self.shared.routes).remove(self.id);
    }
}

impl AsyncClient {
    /// Connects over `transport` and does the handshake, all within
    /// [`Config::connect_timeout`].
    pub async fn connect(transport: &Transport, config: Config) -> Result<AsyncClient> {
        let deadline = Instant::now() + config.connect_timeout;
        let s = timeout_at(deadline, connect_async(transport))
            .await
            .map_err(|_| ClientError::Timeout)??;
        Self::handshake(s, session::default_hello(), config, deadline).await
    }

    /// [`AsyncClient::connect`], retried until `timeout` while the socket
    /// is missing, refuses, the guest is not listening yet, or an attempt
    /// outlives [`Config::connect_timeout`] (every 1 ms for the first
    /// 100 ms, then every 10 ms); a version mismatch or a refused handshake
    /// is returned at once.
    pub async fn connect_retry(
        transport: &Transport,
        config: Config,
        timeout: Duration,
    ) -> Result<AsyncClient> {
        let start = std::time::Instant::now();
        let deadline = start + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let attempt = Config {
                connect_timeout: config
                    .connect_timeout
                    .min(left.max(Duration::from_millis(1))),
                ..config
            };
            match Self::connect(transport, attempt).await {
                Ok(c) => return Ok(c),
                // An attempt that ran out of its own connect timeout (a
                // peer that accepted but never answered) is retried too.
                Err(e) => match retry_delay(
                    start,
                    deadline,
                    e.is_retryable_connect() || matches!(e, ClientError::Timeout),
                ) {
                    Some(d) => tokio::time::sleep(d).await,
                    None => return Err(e),
                },
            }
        }
    }

    /// Speaks the protocol on an already connected stream.
    pub async fn from_stream(s: UnixStream, config: Config) -> Result<AsyncClient> {
        let deadline = Instant::now() + config.connect_timeout;
        Self::handshake(s, session::default_hello(), config, deadline).await
    }

    /// As [`AsyncClient::from_stream`] with a given Hello (tests use it to
    /// present another version).
    pub async fn from_stream_with_hello(
        s: UnixStream,
        hello: Hello,
        config: Config,
    ) -> Result<AsyncClient> {
        let deadline = Instant::now() + config.connect_timeout;
        Self::handshake(s, hello, config, deadline).await
    }

    async fn handshake(
        mut s: UnixStream,
        hello: Hello,
        config: Config,
        deadline: Instant,
    ) -> Result<AsyncClient> {
        set_sndbuf(&s);
        let exchange = async {
            s.write_all(&session::message(0, &hello)).await?;
            let mut dec = FrameDecoder::new();
            loop {
                if let Some(f) = dec
                    .next_frame()
                    .map_err(|e| ClientError::Protocol(e.to_string()))?
                {
                    // What followed the reply stays in `dec` for the reader.
                    return Ok::<_, ClientError>((session::hello_reply(f.into())?, dec));
                }
                let n = s.read(dec.spare(READ_CHUNK)).await?;
                if n == 0 {
                    return Err(ClientError::Disconnected);
                }
                dec.commit(n);
            }
        };
        let (hello_ok, dec) = timeout_at(deadline, exchange)
            .await
            .map_err(|_| ClientError::Timeout)??;
        let (stop, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            routes: Mutex::new(Routes::new(config.limits.max_in_flight)),
            backlogs: Mutex::new(std::collections::HashMap::new()),
            drained: tokio::sync::Notify::new(),
            last_error: Mutex::new(None),
            bad_stream: AtomicBool::new(false),
            stop,
        });
        let (rd, wr) = s.into_split();
        let (out, out_rx) = mpsc::unbounded_channel();
        let budget = Arc::new(Semaphore::new(config.write_buffer.max(1)));
        let stall = Stall {
            timeout: config.stall_timeout,
            buffer: config.stall_buffer,
        };
        tokio::spawn(reader(rd, dec, Arc::clone(&shared), stall));
        tokio::spawn(writer(wr, out_rx, Arc::clone(&shared), Arc::clone(&budget)));
        Ok(AsyncClient {
            inner: Arc::new(Inner {
                shared,
                out,
                budget,
                hello: hello_ok,
                config,
            }),
        })
    }

    /// What the agent said in the handshake.
    pub fn agent_info(&self) -> &HelloOk {
        &self.inner.hello
    }

    /// The deadlines and bounds this client was made with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The connection is known to be closed.
    pub fn is_closed(&self) -> bool {
        lock(&self.inner.shared.routes).is_closed()
    }

    /// Requests registered now (calls in progress and open handles).
    pub fn in_flight(&self) -> usize {
        lock(&self.inner.shared.routes).len()
    }

    /// Last connection-level error message the agent sent (request id 0),
    /// or why the client stopped reading a bad stream.
    pub fn last_connection_error(&self) -> Option<String> {
        lock(&self.inner.shared.last_error).clone()
    }

    /// Closes the connection now (other clones see it closed).
    pub fn close(&self) {
        self.inner.shared.close();
    }

    fn call_deadline(&self) -> Instant {
        Instant::now() + self.inner.config.call_timeout
    }

    fn register(&self) -> Result<Route> {
        let (tx, rx) = mpsc::channel(self.inner.config.channel_frames.max(1));
        let inserted = lock(&self.inner.shared.routes).insert(tx);
        let id = inserted.map_err(|e| match e {
            ClientError::Disconnected => self.ended(),
            e => e,
        })?;
        Ok(Route {
            shared: Arc::clone(&self.inner.shared),
            id,
            rx,
        })
    }

    /// Queues one whole frame for the writer, waiting (until `deadline`)
    /// for room in the write budget. A frame is queued whole or not at all,
    /// so a call cancelled here never leaves half a frame on the stream.
    async fn send(&self, bytes: Vec<u8>, deadline: Instant) -> Result<()> {
        if self.is_closed() {
            return Err(self.ended());
        }
        let cap = self.inner.config.write_buffer.max(1);
        let n = u32::try_from(bytes.len().clamp(1, cap)).unwrap_or(u32::MAX);
        let permit = timeout_at(
            deadline,
            Arc::clone(&self.inner.budget).acquire_many_owned(n),
        )
        .await
        .map_err(|_| ClientError::Timeout)?
        .map_err(|_| self.ended())?;
        self.inner
            .out
            .send(Outgoing {
                bytes,
                _permit: permit,
            })
            .map_err(|_| self.ended())
    }

    /// Queues a frame only if there is room now (for clean-ups in `Drop`).
    fn try_send(&self, bytes: Vec<u8>) {
        let n = u32::try_from(bytes.len().max(1)).unwrap_or(u32::MAX);
        if let Ok(permit) = Arc::clone(&self.inner.budget).try_acquire_many_owned(n) {
            let _ = self.inner.out.send(Outgoing {
                bytes,
                _permit: permit,
            });
        }
    }

    async fn send_message<M: Message>(&self, id: u32, m: &M, deadline: Instant) -> Result<()> {
        self.send(session::message(id, m), deadline).await
    }

    async fn send_empty(&self, kind: Kind, id: u32, deadline: Instant) -> Result<()> {
        self.send(session::empty(kind, id), deadline).await
    }

    async fn send_data(&self, kind: Kind, id: u32, data: &[u8]) -> Result<()> {
        for frame in session::data_frames(kind, id, data) {
            self.send(frame, self.call_deadline()).await?;
        }
        Ok(())
    }

    /// The next frame of a route, by `deadline` if there is one.
    async fn recv(&self, route: &mut Route, deadline: Option<Instant>) -> Result<Frame> {
        let got = match deadline {
            Some(d) => timeout_at(d, route.rx.recv())
                .await
                .map_err(|_| ClientError::Timeout)?,
            None => route.rx.recv().await,
        };
        got.ok_or_else(|| self.ended())
    }

    /// Why a stream ended without its last frame: the connection closed
    /// (cleanly, or because the agent broke the protocol), or, while it is
    /// still open, the stream was dropped for stalling.
    fn ended(&self) -> ClientError {
        let shared = &self.inner.shared;
        if !lock(&shared.routes).is_closed() {
            return ClientError::Stalled(self.inner.config.stall_timeout);
        }
        if shared.bad_stream.load(Ordering::Acquire) {
            let why = self.last_connection_error().unwrap_or_default();
            return ClientError::Protocol(why);
        }
        ClientError::Disconnected
    }
}

/// The reader task: frames to their requests until the stream ends, the
/// agent breaks the protocol, or the client stops.
async fn reader(mut rd: OwnedReadHalf, mut dec: FrameDecoder, shared: Arc<Shared>, stall: Stall) {
    let stop = shared.stop.subscribe();
    let why: Option<FrameError> = 'read: loop {
        loop {
            match dec.next_frame() {
                Ok(Some(f)) => {
                    if let Some(id) = dispatch(&shared, classify(f), stall, &stop) {
                        if !wait_backlog(&shared, id, stall, &stop).await {
                            break 'read None;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => break 'read Some(e),
            }
        }
        let mut stop = stop.clone();
        let got = tokio::select! {
            _ = stop.wait_for(|s| *s) => None,
            r = rd.read(dec.spare(READ_CHUNK)) => Some(r),
        };
        match got {
            None | Some(Err(_)) => break None,
            Some(Ok(0)) => break (!dec.at_boundary()).then_some(FrameError::Truncated),
            Some(Ok(n)) => dec.commit(n),
        }
    };
    if let Some(e) = why {
        *lock(&shared.last_error) = Some(format!("bad stream from the agent: {e}"));
        shared.bad_stream.store(true, Ordering::Release);
    }
    shared.close();
}

/// How a request that does not take its frames is treated.
#[derive(Clone, Copy)]
struct Stall {
    timeout: Duration,
    buffer: usize,
}

/// Delivers one frame without waiting: into its request's channel, or,
/// when that is full (or already has a backlog), into the request's
/// backlog, which a task of its own feeds into the channel. Returns the
/// request's id when its backlog is now over the cap (the reader then
/// [`wait_backlog`]s).
fn dispatch(
    shared: &Arc<Shared>,
    incoming: Incoming,
    stall: Stall,
    stop: &watch::Receiver<bool>,
) -> Option<u32> {
    let (id, frame) = match incoming {
        Incoming::Route(id, frame) => (id, frame),
        Incoming::ConnectionError(msg) => {
            *lock(&shared.last_error) = Some(msg);
            return None;
        }
        Incoming::Ignore => return None,
    };
    // No route: a finished or dropped request's frame, discarded.
    let tx = lock(&shared.routes).get(id).cloned()?;
    let mut backlogs = lock(&shared.backlogs);
    if let Some(b) = backlogs.get_mut(&id) {
        b.bytes += frame.payload.len();
        b.frames.push_back(frame);
        return (b.bytes > stall.buffer).then_some(id);
    }
    let frame = match tx.try_send(frame) {
        Ok(()) => return None,
        Err(mpsc::error::TrySendError::Closed(_)) => {
            lock(&shared.routes).remove(id);
            return None;
        }
        Err(mpsc::error::TrySendError::Full(frame)) => frame,
    };
    let b = Backlog {
        bytes: frame.payload.len(),
        frames: std::collections::VecDeque::from([frame]),
        progress: tokio::time::Instant::now(),
    };
    backlogs.insert(id, b);
    drop(backlogs);
    tokio::spawn(feed_backlog(
        Arc::clone(shared),
        id,
        tx,
        stall.timeout,
        stop.clone(),
    ));
    None
}

/// Request `id`'s backlog is over the cap: waits while its consumer keeps
/// taking frames, until the backlog is back under the cap; drops the
/// stream once the consumer has taken nothing for [`PROGRESS_WINDOW`]
/// (or [`Config::stall_timeout`], if shorter). False when the client
/// stopped meanwhile.
async fn wait_backlog(
    shared: &Arc<Shared>,
    id: u32,
    stall: Stall,
    stop: &watch::Receiver<bool>,
) -> bool {
    let window = PROGRESS_WINDOW.min(stall.timeout);
    loop {
        // Registered before the check, so no wake-up is missed.
        let drained = shared.drained.notified();
        let last = {
            let mut backlogs = lock(&shared.backlogs);
            match backlogs.get(&id) {
                Some(b) if b.bytes > stall.buffer => {
                    if b.progress.elapsed() >= window {
                        // Stopped reading: drop the stream (its feeder
                        // ends too), not the connection.
                        backlogs.remove(&id);
                        lock(&shared.routes).remove(id);
                        return true;
                    }
                    b.progress
                }
                _ => return true,
            }
        };
        let mut stop = stop.clone();
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return false,
            _ = timeout_at(last + window, drained) => {}
        }
    }
}

/// Feeds request `id`'s backlog into its channel, in order, until the
/// backlog is empty (then new frames go to the channel directly again).
/// A channel that takes no frame for `stall` loses its stream.
async fn feed_backlog(
    shared: Arc<Shared>,
    id: u32,
    tx: mpsc::Sender<Frame>,
    stall: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let frame = {
            let mut backlogs = lock(&shared.backlogs);
            let Some(b) = backlogs.get_mut(&id) else {
                return; // dropped by the reader
            };
            match b.frames.pop_front() {
                Some(f) => {
                    b.bytes -= f.payload.len();
                    b.progress = tokio::time::Instant::now();
                    f
                }
                None => {
                    backlogs.remove(&id);
                    return;
                }
            }
        };
        let sent = tokio::select! {
            _ = stop.wait_for(|s| *s) => false,
            r = tokio::time::timeout(stall, tx.send(frame)) => matches!(r, Ok(Ok(()))),
        };
        shared.drained.notify_waiters();
        if !sent {
            // Gone, stalled, or the client stopped: drop the stream (if
            // the id still names it).
            lock(&shared.backlogs).remove(&id);
            let mut routes = lock(&shared.routes);
            if routes.get(id).is_some_and(|t| t.same_channel(&tx)) {
                routes.remove(id);
            }
            return;
        }
    }
}

/// The writer task: queued frames to the socket, in order.
async fn writer(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    shared: Arc<Shared>,
    budget: Arc<Semaphore>,
) {
    let mut stop = shared.stop.subscribe();
    loop {
        // Queued frames first: those queued before the client was dropped
        // still go out, as far as the socket takes them without waiting
        // (a peer that does not read cannot hold the task).
        let next = tokio::select! {
            biased;
            o = rx.recv() => o,
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some(o) = next else { break };
        let ok = tokio::select! {
            biased;
            r = wr.write_all(&o.bytes) => r.is_ok(),
            _ = stop.wait_for(|s| *s) => false,
        };
        if !ok {
            break;
        }
    }
    budget.close();
    shared.close();
    let _ = wr.shutdown().await;
}
