//! The socket side of the server: threads that accept connections, read
//! request lines (capped at [`MAX_LINE`]) and hand each request to the VMM
//! as a [`Command`]; the VMM answers through the command's typed
//! [`Responder`], and the thread writes the reply line.

use crate::wire::{
    refusal_line, success_line, ReplyBody, Request, RestoreInfo, Sample, SnapshotInfo, Stats,
    MAX_LINE,
};
use std::fmt::Display;
use std::io::{BufRead, BufReader, Read, Write};
use std::marker::PhantomData;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;

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
            Self::Snapshot { reply, .. } => reply.refuse(why),
            Self::Restore { reply, .. } => reply.refuse(why),
        }
    }
}

/// Serves `listener` on background threads (one accepting, one per
/// connection), handing each request to `forward`, which passes it on to
/// the VMM's controller and returns false once the VM is going away.
pub fn serve(
    listener: UnixListener,
    forward: impl Fn(Command) -> bool + Send + Sync + 'static,
) -> std::io::Result<()> {
    let forward = Arc::new(forward);
    std::thread::Builder::new()
        .name("api".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let fwd = forward.clone();
                // Out of threads: the connection closes unanswered, and the
                // client reports that.
                let _ = std::thread::Builder::new()
                    .name("api-conn".into())
                    .spawn(move || handle(conn, &*fwd));
            }
        })
        .map(drop)
}

fn handle(conn: UnixStream, forward: &dyn Fn(Command) -> bool) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    let cap = u64::try_from(MAX_LINE).unwrap_or(u64::MAX);
    loop {
        let mut line = Vec::new();
        match (&mut reader).take(cap).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
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
