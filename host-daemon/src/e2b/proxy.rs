//! Other sandbox ports (the code interpreter's 49999, a user's server):
//! each request is relayed as HTTP/1.1 to `127.0.0.1:<port>` inside the
//! guest, over a TCP tunnel the guest agent opens
//! ([`agent_client::tcp_connect`]: one agent connection per forwarded TCP
//! connection, raw bytes, no framing).
//!
//! Both bodies stream: the request body is passed on as it arrives
//! (chunked or not) and the response body as the guest sends it, with no
//! buffering (NDJSON from `/execute` arrives line by line). The routing
//! headers (`E2b-Sandbox-Id`, `E2b-Sandbox-Port`), the API key and the
//! hop-by-hop headers are not passed on. Tunnels whose response ended are
//! kept for the next request to the same sandbox and port
//! ([`POOL_IDLE`], at most [`POOL_PER_PORT`] per port): a new one costs a
//! vsock connection and a handshake round trip.
//!
//! Errors are E2B's: a sandbox that does not exist (or is not running)
//! answers 502 with "The sandbox was not found", a port nothing listens on
//! 502 with "port is not open" (the SDKs raise `SandboxNotRunning` /
//! `SandboxUnreachable` or, in the code interpreter, `TimeoutException` on
//! them). Deadlines: [`CONNECT_TIMEOUT`] to open a tunnel, [`HEAD_TIMEOUT`]
//! for the guest's response head, and the response body ends with an error
//! once the guest has sent nothing for [`IDLE_TIMEOUT`].

use crate::freeze::Busy;
use crate::{ApiError, Daemon};
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Opening a tunnel: the agent connection, its handshake, the guest-side
/// connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// From the request's head sent to the guest's response head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest silence of the guest inside a response body.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long an idle tunnel is kept for reuse.
pub const POOL_IDLE: Duration = Duration::from_secs(30);
/// Idle tunnels kept per sandbox port.
pub const POOL_PER_PORT: usize = 8;
/// Idle tunnels kept in all.
const POOL_MAX: usize = 1024;

/// Request headers never passed to the guest: hop-by-hop ones (RFC 9110
/// 7.6.1), the routing headers and the API key.
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    super::SANDBOX_ID_HEADER,
    super::SANDBOX_PORT_HEADER,
    "x-api-key",
];

/// What went wrong, as E2B's proxy reports it.
#[derive(Debug)]
enum ProxyError {
    /// No such sandbox, or it is not running.
    NotFound,
    /// Nothing listens on the port.
    PortClosed,
    /// The guest failed otherwise (tunnel, HTTP, deadline).
    Guest(String),
    /// The request itself is wrong.
    BadRequest(String),
}

/// Relays one request to `port` inside `sandbox`.
pub async fn serve(d: Arc<Daemon>, sandbox: String, port: u16, req: Request) -> Response {
    match relay(&d, &sandbox, port, req).await {
        Ok(r) => r,
        Err(e) => error_response(&sandbox, port, e),
    }
}

fn error_response(sandbox: &str, port: u16, e: ProxyError) -> Response {
    let (status, message) = match e {
        ProxyError::NotFound => (
            StatusCode::BAD_GATEWAY,
            "The sandbox was not found".to_string(),
        ),
        ProxyError::PortClosed => (
            StatusCode::BAD_GATEWAY,
            "The sandbox is running but port is not open".to_string(),
        ),
        ProxyError::Guest(m) => (StatusCode::BAD_GATEWAY, m),
        ProxyError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
    };
    let body = serde_json::json!({
        "sandboxId": sandbox,
        "port": port,
        "message": message,
        "code": status.as_u16(),
    });
    (status, axum::Json(body)).into_response()
}

async fn relay(
    d: &Arc<Daemon>,
    sandbox: &str,
    port: u16,
    req: Request,
) -> Result<Response, ProxyError> {
    let (row, live, busy) = match crate::lifecycle::ensure_running(d, sandbox).await {
        Ok(r) => r,
        Err(ApiError::NotFound(_)) => return Err(ProxyError::NotFound),
        Err(e) => return Err(ProxyError::Guest(format!("sandbox '{sandbox}': {e}"))),
    };
    if port == super::CODE_INTERPRETER_PORT && !row.env.is_empty() {
        publish_envs(d, &live, sandbox, &row.env).await?;
    }
    let vm = live.vm().ok_or(ProxyError::NotFound)?;
    // The VM's identity: a tunnel never outlives the VM it was opened to
    // (a pause and resume makes a new one).
    let key = Key {
        sandbox: sandbox.to_string(),
        port,
        vm: Arc::as_ptr(&vm).cast::<()>() as usize,
    };
    let mut upstream = upstream_request(req)?;
    // A pooled tunnel the guest closed meanwhile gives the request back
    // unsent: then it goes on a new one.
    while let Some(mut sender) = pool_take(&key).await {
        match tokio::time::timeout(HEAD_TIMEOUT, sender.try_send_request(upstream)).await {
            Err(_) => return Err(ProxyError::Guest(head_timeout(port))),
            Ok(Ok(res)) => return Ok(respond(res, sender, key, busy)),
            Ok(Err(mut e)) => match e.take_message() {
                Some(back) => upstream = back,
                None => {
                    return Err(ProxyError::Guest(format!(
                        "port {port}: {}",
                        e.into_error()
                    )))
                }
            },
        }
    }
    let transport = vm.agent();
    let stream = match agent_client::tcp_connect(&transport, port, CONNECT_TIMEOUT).await {
        Ok(s) => s,
        Err(e) if e.errno() == Some(libc::ECONNREFUSED) => return Err(ProxyError::PortClosed),
        Err(e) => {
            return Err(ProxyError::Guest(format!(
                "port {port}: sandbox agent: {e}"
            )))
        }
    };
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = tokio::time::timeout(CONNECT_TIMEOUT, http1::handshake(io))
        .await
        .map_err(|_| ProxyError::Guest(format!("port {port}: HTTP handshake timed out")))?
        .map_err(|e| ProxyError::Guest(format!("port {port}: {e}")))?;
    // Drives the connection; ends when the tunnel closes or every handle
    // to it is dropped.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    match tokio::time::timeout(HEAD_TIMEOUT, sender.send_request(upstream)).await {
        Err(_) => Err(ProxyError::Guest(head_timeout(port))),
        Ok(Err(e)) => Err(ProxyError::Guest(format!("port {port}: {e}"))),
        Ok(Ok(res)) => Ok(respond(res, sender, key, busy)),
    }
}

fn head_timeout(port: u16) -> String {
    format!(
        "port {port}: no response within {} s",
        HEAD_TIMEOUT.as_secs()
    )
}

/// The request as the guest gets it: origin-form URI, HTTP/1.1, without
/// the headers in [`DROPPED`] (hyper frames the body again: by its length,
/// or chunked).
fn upstream_request(req: Request) -> Result<Request, ProxyError> {
    let (parts, body) = req.into_parts();
    let pq = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let uri: Uri = pq
        .parse()
        .map_err(|e| ProxyError::BadRequest(format!("bad request target: {e}")))?;
    let mut headers = strip(parts.headers);
    if !headers.contains_key(header::HOST) {
        headers.insert(header::HOST, HeaderValue::from_static("localhost"));
    }
    let mut out = Request::new(body);
    *out.method_mut() = parts.method;
    *out.uri_mut() = uri;
    *out.version_mut() = Version::HTTP_11;
    *out.headers_mut() = headers;
    Ok(out)
}

/// `h` without the [`DROPPED`] headers and those its `Connection` names.
fn strip(mut h: HeaderMap) -> HeaderMap {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in DROPPED {
        h.remove(*n);
    }
    for n in named {
        h.remove(n);
    }
    h
}

/// The guest's response, streamed back; the tunnel goes back to the pool
/// once its body has ended.
fn respond(
    res: hyper::Response<Incoming>,
    sender: SendRequest<Body>,
    key: Key,
    busy: Busy,
) -> Response {
    let (mut parts, body) = res.into_parts();
    parts.headers = strip(parts.headers);
    let body = GuestBody {
        inner: body,
        idle: Box::pin(tokio::time::sleep(IDLE_TIMEOUT)),
        back: Some((sender, key)),
        _busy: busy,
    };
    Response::from_parts(parts, Body::new(body))
}

/// A response body from the guest: ends with an error after
/// [`IDLE_TIMEOUT`] of silence, keeps the sandbox from being frozen while
/// it streams, and pools its tunnel once it has ended.
struct GuestBody {
    inner: Incoming,
    idle: Pin<Box<tokio::time::Sleep>>,
    back: Option<(SendRequest<Body>, Key)>,
    _busy: Busy,
}

impl GuestBody {
    fn ended(&mut self) {
        if let Some((sender, key)) = self.back.take() {
            pool_put(key, sender);
        }
    }
}

impl hyper::body::Body for GuestBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.ended();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(f))) => {
                let deadline = tokio::time::Instant::now() + IDLE_TIMEOUT;
                this.idle.as_mut().reset(deadline);
                if this.inner.is_end_stream() {
                    this.ended();
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.back = None;
                Poll::Ready(Some(Err(std::io::Error::other(e))))
            }
            Poll::Pending => match this.idle.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.back = None;
                    Poll::Ready(Some(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the sandbox sent nothing for {} s", IDLE_TIMEOUT.as_secs()),
                    ))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Where the code interpreter reads the sandbox's create-time environment
/// (E2B's reads envd's `/envs`).
pub const ENVS_FILE: &str = "/run/e2b/envs.json";

/// Writes the sandbox's environment to [`ENVS_FILE`] once per sandbox
/// (per daemon run) before its first code-interpreter request.
async fn publish_envs(
    d: &Arc<Daemon>,
    live: &crate::Live,
    sandbox: &str,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<(), ProxyError> {
    static DONE: std::sync::OnceLock<Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    let done = DONE.get_or_init(Default::default);
    let seen = |d: &Mutex<std::collections::HashSet<String>>| {
        d.lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(sandbox)
    };
    if seen(done) {
        return Ok(());
    }
    let data = serde_json::to_vec(env).map_err(|e| ProxyError::Guest(e.to_string()))?;
    let fail = |e: String| ProxyError::Guest(format!("writing {ENVS_FILE}: {e}"));
    let c = crate::ops::agent(d, live)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let write = async {
        let opts = agent_client::UploadOptions {
            mode: 0o644,
            append: false,
            create_parents: true,
        };
        let mut up = c.open_upload(ENVS_FILE, opts).await?;
        up.write(&data).await?;
        up.finish().await
    };
    tokio::time::timeout(d.cfg.agent.call_timeout, write)
        .await
        .map_err(|_| fail("timed out".into()))?
        .map_err(|e| fail(e.to_string()))?;
    let mut set = done.lock().unwrap_or_else(|e| e.into_inner());
    if set.len() >= 100_000 {
        set.clear();
    }
    set.insert(sandbox.to_string());
    Ok(())
}

// ------------------------------------------------------------------ pool

/// Which tunnels are interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    sandbox: String,
    port: u16,
    vm: usize,
}

type Pool = HashMap<Key, Vec<(SendRequest<Body>, Instant)>>;

fn pool() -> &'static Mutex<Pool> {
    static POOL: std::sync::OnceLock<Mutex<Pool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock() -> std::sync::MutexGuard<'static, Pool> {
    pool().lock().unwrap_or_else(|e| e.into_inner())
}

/// The freshest idle tunnel for `key` that is ready for a request.
async fn pool_take(key: &Key) -> Option<SendRequest<Body>> {
    loop {
        let (mut sender, _since) = {
            let mut p = lock();
            let now = Instant::now();
            p.retain(|_, v| {
                v.retain(|(s, at)| !s.is_closed() && now.duration_since(*at) < POOL_IDLE);
                !v.is_empty()
            });
            p.get_mut(key)?.pop()?
        };
        // Ready at once unless the guest is closing it (then it is dropped).
        if let Ok(Ok(())) = tokio::time::timeout(Duration::from_millis(100), sender.ready()).await {
            return Some(sender);
        }
    }
}

fn pool_put(key: Key, sender: SendRequest<Body>) {
    if sender.is_closed() {
        return;
    }
    let mut p = lock();
    let total: usize = p.values().map(Vec::len).sum();
    let v = p.entry(key).or_default();
    if v.len() < POOL_PER_PORT && total < POOL_MAX {
        v.push((sender, Instant::now()));
    }
}

/// Drops the idle tunnels of `sandbox` (before its VM is snapshotted, so
/// no open connection is saved with it).
pub fn forget(sandbox: &str) {
    lock().retain(|k, _| k.sandbox != sandbox);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_routing_and_key_headers_are_not_passed_on() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("transfer-encoding", "chunked"),
            ("e2b-sandbox-id", "abc"),
            ("e2b-sandbox-port", "49999"),
            ("x-api-key", "secret"),
            ("content-type", "application/json"),
            ("x-access-token", "t"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        let out = strip(h);
        let mut names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-type", "x-access-token"]);
    }

    #[test]
    fn upstream_requests_are_origin_form_http11() {
        let req = Request::builder()
            .method("POST")
            .uri("http://127.0.0.1:3000/execute?x=1")
            .version(Version::HTTP_10)
            .body(Body::empty())
            .unwrap();
        let up = upstream_request(req).unwrap();
        assert_eq!(up.uri().to_string(), "/execute?x=1");
        assert_eq!(up.version(), Version::HTTP_11);
        assert_eq!(up.headers()[header::HOST], "localhost");
    }

    #[test]
    fn errors_carry_the_phrases_the_sdks_match() {
        let r = error_response("sb", 49999, ProxyError::NotFound);
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        let r = error_response("sb", 8080, ProxyError::PortClosed);
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let body = rt
            .block_on(axum::body::to_bytes(r.into_body(), 1 << 16))
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(v["message"].as_str().unwrap().contains("port is not open"));
        assert_eq!(
            (v["code"].as_u64(), v["port"].as_u64()),
            (Some(502), Some(8080))
        );
        assert_eq!(v["sandboxId"], "sb");
    }
}
