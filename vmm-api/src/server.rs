//! The socket side of the server: a thread that accepts connections and a
//! fixed pool of workers (at most [`MAX_CONNECTIONS`] connections served at
//! once, each with a read deadline) that read request lines (capped at
//! [`MAX_LINE`]) and hand each request to the VMM as a [`Command`]; the VMM
//! answers through the command's typed [`Responder`], and the worker writes
//! the reply line.

use crate::wire::{
    busy_line, refusal_line, success_line, BalloonInfo, EvictInfo, ReplyBody, Request, RestoreInfo,
    Sample, SnapshotInfo, Stats, MAX_LINE,
};
use std::fmt::Display;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::marker::PhantomData;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The one way to answer a request: with its reply type `T`, or a refusal.
/// Dropped unanswered, the client hears "VM is shutting down".
#[must_use = "a request must be answered"]
pub struct Responder<T> {
    tx: Sender<Vec<u8>>,
    _reply: PhantomData<fn(T)>,
}

impl<T: ReplyBody> Responder<T> {
    fn new(tx: Sender<Vec<u8>>) -> Self {
        Self {
            tx,
            _reply: PhantomData,
        }
    }

    /// Answers with success.
    pub fn ok(self, body: T) {
        // The connection may be gone; nobody is left to tell.
        let _ = self.tx.send(success_line(&body));
    }

    /// Answers with a refusal.
    pub fn refuse(self, why: impl Display) {
        let _ = self.tx.send(refusal_line(&why.to_string()));
    }

    /// Answers with `r`.
    pub fn send<E: Display>(self, r: Result<T, E>) {
        match r {
            Ok(b) => self.ok(b),
            Err(e) => self.refuse(e),
        }
    }
}

/// A request from the socket with its [`Responder`].
pub enum Command {
    /// See [`Request::Pause`].
    Pause(Responder<()>),
    /// See [`Request::Resume`].
    Resume(Responder<()>),
    /// See [`Request::Shutdown`].
    Shutdown(Responder<()>),
    /// See [`Request::Stats`].
    Stats(Responder<Stats>),
    /// See [`Request::Sample`].
    Sample(Responder<Sample>),
    /// See [`Request::Balloon`].
    Balloon {
        /// New target in MiB, if any.
        target_mib: Option<u64>,
        /// The answer.
        reply: Responder<BalloonInfo>,
    },
    /// See [`Request::Evict`].
    Evict {
        /// Directory for the eviction file.
        dir: PathBuf,
        /// The answer.
        reply: Responder<EvictInfo>,
    },
    /// See [`Request::Snapshot`].
    Snapshot {
        /// Target directory.
        dir: PathBuf,
        /// Memory pages changed since the base snapshot only.
        diff: bool,
        /// The answer.
        reply: Responder<SnapshotInfo>,
    },
    /// See [`Request::Restore`].
    Restore {
        /// Snapshot directory.
        dir: PathBuf,
        /// Files for the saved disks, in order.
        disks: Vec<PathBuf>,
        /// The answer.
        reply: Responder<RestoreInfo>,
    },
}

impl Command {
    fn new(req: Request, tx: Sender<Vec<u8>>) -> Self {
        match req {
            Request::Pause => Self::Pause(Responder::new(tx)),
            Request::Resume => Self::Resume(Responder::new(tx)),
            Request::Shutdown => Self::Shutdown(Responder::new(tx)),
            Request::Stats => Self::Stats(Responder::new(tx)),
            Request::Sample => Self::Sample(Responder::new(tx)),
            Request::Balloon { target_mib } => Self::Balloon {
                target_mib,
                reply: Responder::new(tx),
            },
            Request::Evict { dir } => Self::Evict {
                dir,
                reply: Responder::new(tx),
            },
            Request::Snapshot { dir, diff } => Self::Snapshot {
                dir,
                diff,
                reply: Responder::new(tx),
            },
            Request::Restore { dir, disks } => Self::Restore {
                dir,
                disks,
                reply: Responder::new(tx),
            },
        }
    }

    /// Refuses the request, whatever it is.
    pub fn refuse(self, why: impl Display) {
        match self {
            Self::Pause(r) | Self::Resume(r) | Self::Shutdown(r) => r.refuse(why),
            Self::Stats(r) => r.refuse(why),
            Self::Sample(r) => r.refuse(why),
            Self::Balloon { reply, .. } => reply.refuse(why),
            Self::Evict { reply, .. } => reply.refuse(why),
            Self::Snapshot { reply, .. } => reply.refuse(why),
            Self::Restore { reply, .. } => reply.refuse(why),
        }
    }
}

/// Most control connections served at once; one more is answered with a
/// refusal line and closed. The daemon makes one call per connection, a
/// few at a time per VM.
pub const MAX_CONNECTIONS: usize = 4;

/// How long a connection may go without sending a whole request line.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs first on every server thread (the acceptor and each connection
/// worker), before it touches a connection: the VMM installs the thread's
/// seccomp filter here. If it fails on any thread, nothing is served (the
/// listener is closed).
pub type ThreadInit = Arc<dyn Fn(ServerThread) -> Result<(), String> + Send + Sync>;

/// Which server thread a [`ThreadInit`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerThread {
    /// The thread accepting connections.
    Acceptor,
    /// A worker serving connections, one at a time.
    Worker,
}

/// How [`serve_with`] serves.
#[derive(Clone)]
pub struct ServeOptions {
    /// Connections served at once (worker threads, started up front).
    pub max_connections: usize,
    /// Read deadline for each request line.
    pub idle_timeout: Duration,
    /// Run first on each server thread.
    pub init: Option<ThreadInit>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            idle_timeout: IDLE_TIMEOUT,
            init: None,
        }
    }
}

/// Serves `listener` with [`ServeOptions::default`].
pub fn serve(
    listener: UnixListener,
    forward: impl Fn(Command) -> bool + Send + Sync + 'static,
) -> std::io::Result<()> {
    serve_with(listener, ServeOptions::default(), forward)
}

/// Serves `listener` on background threads (one accepting, and a fixed
/// pool of `max_connections` workers, so no caller can make the VMM start
/// threads), handing each request to `forward`, which passes it on to the
/// VMM's controller and returns false once the VM is going away. Returns
/// at once: the threads run `init` meanwhile, and the acceptor takes its
/// first connection once every thread's `init` has succeeded.
pub fn serve_with(
    listener: UnixListener,
    opts: ServeOptions,
    forward: impl Fn(Command) -> bool + Send + Sync + 'static,
) -> std::io::Result<()> {
    let forward: Arc<dyn Fn(Command) -> bool + Send + Sync> = Arc::new(forward);
    let max = opts.max_connections.max(1);
    let active = Arc::new(AtomicUsize::new(0));
    // Never full: at most `max` connections are handed over at once.
    let (conn_tx, conn_rx) = mpsc::sync_channel::<UnixStream>(max);
    let conn_rx = Arc::new(Mutex::new(conn_rx));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let init = opts.init.clone();
    let run_init = move |which| init.as_ref().map_or(Ok(()), |f| f(which));
    for _ in 0..max {
        let (rx, fwd, active, ready) = (
            conn_rx.clone(),
            forward.clone(),
            active.clone(),
            ready_tx.clone(),
        );
        let run_init = run_init.clone();
        let idle = opts.idle_timeout;
        std::thread::Builder::new()
            .name("api-conn".into())
            .spawn(move || {
                let ok = run_init(ServerThread::Worker);
                let failed = ok.is_err();
                let _ = ready.send(ok);
                if failed {
                    return;
                }
                loop {
                    // The lock is only held while waiting for the next one.
                    let next = lock(&rx).recv();
                    let Ok(conn) = next else { return };
                    handle(conn, idle, &*fwd);
                    active.fetch_sub(1, Ordering::AcqRel);
                }
            })?;
    }
    drop(ready_tx);
    std::thread::Builder::new()
        .name("api".into())
        .spawn(move || {
            if run_init(ServerThread::Acceptor).is_err() {
                return;
            }
            for _ in 0..max {
                // A worker that failed (or ended) closes the listener.
                if !matches!(ready_rx.recv(), Ok(Ok(()))) {
                    return;
                }
            }
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                if active.fetch_add(1, Ordering::AcqRel) >= max {
                    active.fetch_sub(1, Ordering::AcqRel);
                    // Best effort: the caller may not read; never wait on it.
                    let _ = conn.set_nonblocking(true);
                    let _ = conn.write_all(&busy_line(&format!(
                        "too many control connections (at most {max} at once); try again"
                    )));
                    continue;
                }
                if conn_tx.send(conn).is_err() {
                    return;
                }
            }
        })?;
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn handle(conn: UnixStream, idle: Duration, forward: &dyn Fn(Command) -> bool) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    // A caller that stops reading or writing cannot hold the worker.
    if conn.set_read_timeout(Some(idle)).is_err() || out.set_write_timeout(Some(idle)).is_err() {
        return;
    }
    let mut reader = BufReader::new(conn);
    let cap = u64::try_from(MAX_LINE).unwrap_or(u64::MAX);
    loop {
        let mut line = Vec::new();
        match (&mut reader).take(cap).read_until(b'\n', &mut line) {
            Ok(0) => return,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                let _ = out.write_all(&refusal_line(&format!(
                    "no request within {} ms; closing the connection",
                    idle.as_millis()
                )));
                return;
            }
            Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            // Over the limit (or cut short): answer and drop the
            // connection, which cannot be resynchronized.
            let _ = out.write_all(&refusal_line(&format!(
                "request longer than {MAX_LINE} bytes"
            )));
            return;
        }
        let reply = match serde_json::from_slice::<Request>(&line) {
            Err(e) => refusal_line(&format!("bad request: {e}")),
            Ok(req) => {
                let (tx, rx) = mpsc::channel();
                if forward(Command::new(req, tx)) {
                    rx.recv()
                        .unwrap_or_else(|_| refusal_line("VM is shutting down"))
                } else {
                    refusal_line("VM is shutting down")
                }
            }
        };
        if out.write_all(&reply).is_err() {
            return;
        }
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
