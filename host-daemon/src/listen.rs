//! Serving the API on a listener (the Unix socket, or TCP) so that no
//! caller can hold the daemon's memory or descriptors: a connection is
//! accepted only while fewer than [`HttpLimits::max_connections`] of that
//! listener are open (the next ones wait in the kernel's backlog, costing
//! the daemon nothing); a request's head must arrive within
//! [`HttpLimits::header_timeout`] (also the most an idle keep-alive
//! connection is kept), in at most [`MAX_HEAD_BYTES`]; a request body or a
//! response that makes no progress for [`HttpLimits::idle_timeout`] ends
//! its connection. Body sizes are the handlers' (`api::wire`).
//!
//! Every request carries the [`Peer`] it came from (the Unix socket peer's
//! uid, from `SO_PEERCRED`) as an extension; `api` makes its
//! [`crate::auth::Principal`] of it.

use crate::metrics::Conns;
use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};
use tokio::time::Sleep;
use tower::ServiceExt;

/// Largest request head (request line and headers) read.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Limits of every listener (each listener has its own connection cap).
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// A request head must arrive within this (from the connection's start
    /// or the previous response: also the keep-alive idle time).
    pub header_timeout: Duration,
    /// A request body or a response that makes no progress for this long
    /// ends the connection.
    pub idle_timeout: Duration,
    /// Open connections per listener at most; more wait to be accepted.
    pub max_connections: usize,
    /// Largest JSON request body (bytes).
    pub max_json_body: usize,
    /// Largest upload (bytes; streamed, never held whole).
    pub max_upload: u64,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_connections: 512,
            max_json_body: 1 << 20,
            max_upload: 16 << 30,
        }
    }
}

/// Where a request came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// The Unix socket; the peer's uid (None if the kernel did not say).
    Unix(Option<u32>),
    /// TCP.
    Tcp(std::net::SocketAddr),
}

/// A listener the API is served on.
pub enum Listener {
    /// The Unix socket.
    Unix(UnixListener),
    /// TCP.
    Tcp(TcpListener),
}

/// Serves `app` on `l` until `stop` turns true; then stops accepting and
/// waits for open connections to finish their requests.
/// `conns` counts its open connections and those ended by a timeout.
pub async fn serve(
    l: Listener,
    app: Router,
    limits: HttpLimits,
    conns: Arc<Conns>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        // A slot first: past the cap, connections wait in the backlog.
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stop.changed() => break,
        };
        let accepted = tokio::select! {
            a = accept(&l) => a,
            _ = stop.changed() => break,
        };
        let (app, limits, stop, conns) = (app.clone(), limits.clone(), stop.clone(), conns.clone());
        match accepted {
            Ok(Accepted::Unix(s, peer)) => {
                tasks.spawn(async move {
                    counted(&conns, connection(s, peer, app, &limits, stop)).await;
                    drop(permit);
                });
            }
            Ok(Accepted::Tcp(s, peer)) => {
                let _ = s.set_nodelay(true);
                tasks.spawn(async move {
                    counted(&conns, connection(s, peer, app, &limits, stop)).await;
                    drop(permit);
                });
            }
            Err(e) => {
                // Out of descriptors, or the peer left before accept: wait
                // a little rather than spin.
                tracing::warn!("accept: {e}");
                drop(permit);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Reap finished connections.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Runs a connection, counted in `c`.
async fn counted(c: &Conns, conn: impl Future<Output = Result<(), hyper::Error>>) {
    c.open.fetch_add(1, Ordering::Relaxed);
    let r = conn.await;
    c.open.fetch_sub(1, Ordering::Relaxed);
    if let Err(e) = r {
        if timed_out(&e) {
            c.timed_out.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!("connection ended: {e}");
    }
}

/// Whether a connection ended for one of its deadlines (hyper's header
/// timeout, or [`IdleBody`]'s and [`StallIo`]'s).
fn timed_out(e: &hyper::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if s.downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::TimedOut)
        {
            return true;
        }
        src = s.source();
    }
    e.is_timeout()
}

enum Accepted {
    Unix(tokio::net::UnixStream, Peer),
    Tcp(tokio::net::TcpStream, Peer),
}

async fn accept(l: &Listener) -> io::Result<Accepted> {
    match l {
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            let uid = s.peer_cred().ok().map(|c| c.uid());
            Ok(Accepted::Unix(s, Peer::Unix(uid)))
        }
        Listener::Tcp(l) => {
            let (s, a) = l.accept().await?;
            Ok(Accepted::Tcp(s, Peer::Tcp(a)))
        }
    }
}

async fn connection<IO>(
    io: IO,
    peer: Peer,
    app: Router,
    limits: &HttpLimits,
    mut stop: watch::Receiver<bool>,
) -> Result<(), hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let idle = limits.idle_timeout;
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let mut req = req.map(|b| Body::new(IdleBody::new(b, idle)));
        req.extensions_mut().insert(peer.clone());
        app.clone().oneshot(req)
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES);
    let conn = b.serve_connection(TokioIo::new(StallIo::new(io, idle)), svc);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => return r,
        _ = stop.changed() => {}
    }
    // Stopping: the request in progress finishes, then the connection ends.
    conn.as_mut().graceful_shutdown();
    conn.await
}

/// A request body that fails when no frame arrives for `idle` while it
/// is read (a client that stops sending mid-body frees its connection and
/// handler; a handler that reads late is not held against the client).
struct IdleBody {
    inner: Incoming,
    idle: Duration,
    /// Armed while a read waits.
    timer: Option<Pin<Box<Sleep>>>,
}

impl IdleBody {
    fn new(inner: Incoming, idle: Duration) -> IdleBody {
        IdleBody {
            inner,
            idle,
            timer: None,
        }
    }
}

impl hyper::body::Body for IdleBody {
    type Data = hyper::body::Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                self.timer = None;
                Poll::Ready(r.map(|f| f.map_err(io::Error::other)))
            }
            Poll::Pending => {
                let idle = self.idle;
                let t = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match t.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the request body stalled for {idle:?}"),
                    )))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection whose writes fail when the peer takes nothing for `idle`
/// (a client that stops reading a response frees its connection).
struct StallIo<IO> {
    io: IO,
    idle: Duration,
    /// Armed while a write is pending.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<IO> StallIo<IO> {
    fn new(io: IO, idle: Duration) -> StallIo<IO> {
        StallIo {
            io,
            idle,
            stalled: None,
        }
    }

    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let idle = self.idle;
        let t = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        match t.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no response bytes for {idle:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for StallIo<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for StallIo<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Pending => self.pending(cx),
            r => {
                self.stalled = None;
                r
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Pending => self.pending(cx),
            r => {
                self.stalled = None;
                r
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.pending(cx),
            r => {
                self.stalled = None;
                r
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
#[path = "listen_tests.rs"]
pub(crate) mod tests;
