//! E2B compatibility: the stock `e2b` and `e2b-code-interpreter` SDKs
//! work against shoald with only `E2B_API_URL`, `E2B_SANDBOX_URL` and
//! `E2B_API_KEY` changed.
//!
//! - [`control`]: the control-plane REST API (`/sandboxes`, `/v2/sandboxes`,
//!   ...), authenticated by `X-API-KEY` (one of the daemon's tokens).
//! - [`envd`]: envd's data plane (Connect RPC `process.Process`,
//!   `filesystem.Filesystem`, `/files`, `/health`, `/envs`), carried to the
//!   guest agent over vsock.
//! - [`proxy`]: any other sandbox port (the code interpreter's 49999, a
//!   user's server), relayed to that port inside the guest.
//!
//! A data-plane request is recognised by its `E2b-Sandbox-Id` header
//! (without `X-API-KEY`: [`is_data_plane`]) and goes to [`data_plane`]
//! whatever its path, before the API's own authentication. On TCP it must carry the sandbox's access token, which
//! the control plane hands out as `envdAccessToken` (sent back by the SDK
//! as `X-Access-Token` on every envd call) and `trafficAccessToken` (sent
//! as `E2B-Traffic-Access-Token` to other ports): each is an HMAC of the
//! sandbox id under a key kept in the state directory ([`E2bState`]), so
//! no token is stored per sandbox and every sandbox, whichever API made
//! it, has one. On the Unix socket the peer is trusted as on the rest of
//! the API.

pub mod control;
mod control_ops;
mod control_wire;
pub mod envd;
pub mod interp;
mod network;
pub mod proxy;

use crate::auth::Tokens;
use crate::db::State;
use crate::listen::Peer;
use crate::Daemon;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

/// The port envd listens on in an E2B sandbox (what the SDK asks for).
pub const ENVD_PORT: u16 = 49983;
/// The code interpreter's port.
pub const CODE_INTERPRETER_PORT: u16 = 49999;
/// The header naming the sandbox of a data-plane request.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// The header naming the sandbox port of a data-plane request.
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
/// The header carrying the control plane's API key.
pub const API_KEY_HEADER: &str = "x-api-key";
/// The header carrying the sandbox's `envdAccessToken`.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// The header carrying the sandbox's `trafficAccessToken` (other ports).
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";
/// The envd version shoald reports (`envdVersion`): the lowest whose SDK
/// behaviour the data plane implements (see the README's E2B section).
pub const ENVD_VERSION: &str = "0.5.7";
/// The key file under the state directory.
const KEY_FILE: &str = "e2b.key";

/// The daemon's E2B state: the key the sandboxes' access tokens are
/// derived from.
pub struct E2bState {
    key: [u8; 32],
}

impl std::fmt::Debug for E2bState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("E2bState")
    }
}

impl E2bState {
    /// Reads the key from `state_dir/e2b.key`, making it (32 random bytes,
    /// mode 0600) when there is none.
    pub fn open(state_dir: &Path) -> Result<E2bState, String> {
        let p = state_dir.join(KEY_FILE);
        let err = |e: std::io::Error| format!("{}: {e}", p.display());
        let mut key = [0u8; 32];
        match std::fs::File::open(&p) {
            Ok(mut f) => {
                f.read_exact(&mut key).map_err(err)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // SAFETY: getrandom writes at most key.len() bytes into key.
                let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
                if usize::try_from(n).ok() != Some(key.len()) {
                    return Err(err(std::io::Error::last_os_error()));
                }
                let tmp = state_dir.join(format!("{KEY_FILE}.tmp"));
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)
                    .map_err(err)?;
                f.write_all(&key).and_then(|()| f.sync_all()).map_err(err)?;
                std::fs::rename(&tmp, &p).map_err(err)?;
            }
            Err(e) => return Err(err(e)),
        }
        Ok(E2bState { key })
    }

    fn derive(&self, kind: &str, sandbox: &str) -> String {
        hex(&hmac_sha256(
            &self.key,
            format!("shoal-e2b:{kind}:{sandbox}").as_bytes(),
        ))
    }

    /// The sandbox's `envdAccessToken`.
    pub fn envd_token(&self, sandbox: &str) -> String {
        self.derive("envd", sandbox)
    }

    /// The sandbox's `trafficAccessToken`.
    pub fn traffic_token(&self, sandbox: &str) -> String {
        self.derive("traffic", sandbox)
    }

    /// Whether `req` may reach `port` of `sandbox`: envd's port takes the
    /// envd token, other ports either token (the code interpreter sends
    /// `X-Access-Token` on `/execute` but only the traffic token on
    /// `/contexts`). Compared in constant time.
    pub fn authorized(&self, req: &Request, sandbox: &str, port: u16) -> bool {
        let h = |name: &str| req.headers().get(name).map(|v| v.as_bytes());
        let envd = h(ACCESS_TOKEN_HEADER)
            .is_some_and(|t| constant_eq(t, self.envd_token(sandbox).as_bytes()));
        if port == ENVD_PORT {
            return envd;
        }
        envd || h(TRAFFIC_TOKEN_HEADER)
            .is_some_and(|t| constant_eq(t, self.traffic_token(sandbox).as_bytes()))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// HMAC-SHA256 (RFC 2104) of `msg` under a key of at most one block.
fn hmac_sha256(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    k[..32].copy_from_slice(key);
    let pad = |b: u8| k.map(|x| x ^ b);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// An E2B API error: `{"code": STATUS, "message": ...}` with that status.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"code": status.as_u16(), "message": message.into()});
    (status, axum::Json(body)).into_response()
}

/// A daemon error in E2B's shape (same status as the daemon's own API).
pub fn api_error(e: crate::ApiError) -> Response {
    let status =
        StatusCode::from_u16(e.code().status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(status, e.to_string())
}

/// What a data-plane request for a sandbox that is gone gets: 502 whose
/// message says "was not found", as E2B's proxy answers (the SDK raises
/// `SandboxNotRunningException`; `is_running()` returns false).
pub fn sandbox_not_found(sandbox: &str) -> Response {
    let body = serde_json::json!({
        "sandboxId": sandbox,
        "message": format!("The sandbox {sandbox} was not found"),
        "code": 502,
    });
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}

/// The E2B routes in front of `rest` (the daemon's own API): a
/// data-plane request ([`is_data_plane`]) goes to [`data_plane`] whatever its
/// path, before any other authentication; the control-plane routes to
/// [`control`] (their own `X-API-KEY` check); anything else to `rest`.
pub fn router(d: Arc<Daemon>, tokens: Option<Tokens>, rest: Router) -> Router {
    let dp = d.clone();
    control::router(d, tokens)
        .fallback_service(rest)
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let d = dp.clone();
            async move {
                if is_data_plane(&req) {
                    data_plane(d, req).await
                } else {
                    next.run(req).await
                }
            }
        }))
}

/// Whether `req` is for the data plane: it names a sandbox
/// (`E2b-Sandbox-Id`) and carries no `X-API-KEY`. The SDK never sends the
/// API key to a sandbox, but e2b 2.20 sends `E2b-Sandbox-Id` on its
/// control-plane connect call too.
pub fn is_data_plane(req: &Request) -> bool {
    req.headers().contains_key(SANDBOX_ID_HEADER) && !req.headers().contains_key(API_KEY_HEADER)
}

/// The sandbox id and port a data-plane request names, if it is one.
/// `Err` when the headers are there but malformed.
pub fn data_plane_target(req: &Request) -> Option<Result<(String, u16), String>> {
    let id = req.headers().get(SANDBOX_ID_HEADER)?;
    let id = match id.to_str() {
        Ok(s) if !s.is_empty() && s.len() <= 128 => s.to_string(),
        _ => return Some(Err("invalid E2b-Sandbox-Id header".into())),
    };
    let port = match req.headers().get(SANDBOX_PORT_HEADER) {
        None => ENVD_PORT,
        Some(p) => match p.to_str().ok().and_then(|s| s.parse::<u16>().ok()) {
            Some(p) if p != 0 => p,
            _ => return Some(Err("invalid E2b-Sandbox-Port header".into())),
        },
    };
    Some(Ok((id, port)))
}

/// Serves one data-plane request: checks the access token (TCP) and that
/// the sandbox exists (502 "was not found" otherwise; a paused one is
/// resumed by what serves the request, with E2B's default timeout when E2B
/// paused it), then envd's port
/// goes to [`envd`], any other to [`proxy`].
pub async fn data_plane(d: Arc<Daemon>, req: Request) -> Response {
    let (id, port) = match data_plane_target(&req) {
        None => return error(StatusCode::BAD_REQUEST, "no E2b-Sandbox-Id header"),
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, e),
        Some(Ok(t)) => t,
    };
    let tcp = !matches!(req.extensions().get::<Peer>(), Some(Peer::Unix(_)));
    if tcp && !d.e2b.authorized(&req, &id, port) {
        return error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong X-Access-Token (the sandbox's envdAccessToken)",
        );
    }
    match crate::ops::row(&d, &id) {
        Ok(r) if matches!(r.state, State::Paused | State::Pausing) => {
            if !control_wire::auto_resumes(&r) {
                return sandbox_not_found(&id);
            }
            control_ops::auto_resumed(&d, &r)
        }
        Ok(r) if r.state != State::Failed => {}
        Ok(_) | Err(crate::ApiError::NotFound(_)) => return sandbox_not_found(&id),
        Err(e) => return api_error(e),
    }
    if port == ENVD_PORT {
        envd::serve(d, id, req).await
    } else {
        proxy::serve(d, id, port, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc4231_shape_and_tokens_differ_per_sandbox_and_kind() {
        // RFC 4231 test case 2 uses a 4-byte key; with a 32-byte key we
        // check against a value computed independently (Python's hmac).
        let key = [0x0bu8; 32];
        assert_eq!(
            hex(&hmac_sha256(&key, b"Hi There")),
            "198a607eb44bfbc69903a0f1cf2bbdc5ba0aa3f3d9ae3c1c7a3b1696a0b68cf7"
        );
        let dir = tempfile::tempdir().unwrap();
        let s = E2bState::open(dir.path()).unwrap();
        assert_ne!(s.envd_token("a"), s.envd_token("b"));
        assert_ne!(s.envd_token("a"), s.traffic_token("a"));
        // The key persists: a restarted daemon issues the same tokens.
        let again = E2bState::open(dir.path()).unwrap();
        assert_eq!(s.envd_token("a"), again.envd_token("a"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        let other = E2bState::open(tempfile::tempdir().unwrap().path()).unwrap();
        assert_ne!(s.envd_token("a"), other.envd_token("a"));
    }

    #[test]
    fn envd_port_takes_only_the_envd_token() {
        let dir = tempfile::tempdir().unwrap();
        let s = E2bState::open(dir.path()).unwrap();
        let req = |h: &str, v: &str| {
            axum::http::Request::builder()
                .header(h, v)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let envd = s.envd_token("sb");
        let traffic = s.traffic_token("sb");
        assert!(s.authorized(&req(ACCESS_TOKEN_HEADER, &envd), "sb", ENVD_PORT));
        assert!(!s.authorized(&req(ACCESS_TOKEN_HEADER, &envd), "other", ENVD_PORT));
        assert!(!s.authorized(&req(TRAFFIC_TOKEN_HEADER, &traffic), "sb", ENVD_PORT));
        assert!(s.authorized(&req(TRAFFIC_TOKEN_HEADER, &traffic), "sb", 49999));
        assert!(s.authorized(&req(ACCESS_TOKEN_HEADER, &envd), "sb", 49999));
        assert!(!s.authorized(&req(ACCESS_TOKEN_HEADER, &traffic), "sb", 49999));
        assert!(!s.authorized(&req("x-other", &envd), "sb", 49999));
    }
}
