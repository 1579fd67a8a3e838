//! envd's data plane, served by shoald itself and carried to the guest
//! agent over vsock (nothing of E2B's envd runs in the guest):
//!
//! - Connect RPC with the JSON codec ([`connect`]): `process.Process`
//!   ([`process`]) and `filesystem.Filesystem` ([`fs`]);
//! - HTTP `GET /health`, `GET /envs`, `GET|POST /files` ([`files`]).
//!
//! A sandbox that is gone (or failed) answers 502 with "The sandbox was not
//! found" (the SDK's `SandboxNotRunningException`); a paused one is resumed
//! by the request (but `GET /health` says it is not running, as E2B's does).
//! Requests run as the user they name ([`users`]), else the guest's `user`,
//! else root.

pub mod connect;
mod files;
mod fs;
pub mod multipart;
mod process;
pub mod users;
mod watch;

use crate::db::State;
use crate::freeze::Busy;
use crate::lifecycle::ensure_running;
use crate::ops::agent;
use crate::Daemon;
use agent_client::AsyncClient;
use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use connect::{Code, RpcError};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use users::GuestUser;

/// The largest `/etc/passwd` or `/etc/group` read from a guest.
const MAX_USER_DB: u64 = 1 << 20;

/// The 502 E2B's proxy answers for a sandbox that is not there.
fn not_found(id: &str) -> Response {
    let body = json!({
        "sandboxId": id,
        "message": format!("The sandbox {id} was not found"),
        "code": 502,
    });
    (
        StatusCode::BAD_GATEWAY,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// One request's way into its sandbox.
#[derive(Clone)]
pub(crate) struct Guest {
    d: Arc<Daemon>,
    id: String,
}

impl Guest {
    /// The agent connection (the sandbox resumed if paused) and the mark
    /// that keeps it from being frozen meanwhile.
    async fn client(&self) -> Result<(AsyncClient, Busy), RpcError> {
        let (_, live, busy) = ensure_running(&self.d, &self.id)
            .await
            .map_err(|e| self.unavailable(e))?;
        let c = agent(&self.d, &live)
            .await
            .map_err(|e| self.unavailable(e))?;
        Ok((c, busy))
    }

    /// An error of a call into the sandbox: a sandbox that went meanwhile
    /// "was not found" (else the error's own code).
    fn unavailable(&self, e: crate::ApiError) -> RpcError {
        if e.status() == 404 && crate::ops::row(&self.d, &self.id).is_err() {
            RpcError::new(
                Code::Unavailable,
                format!("The sandbox {} was not found", self.id),
            )
        } else {
            RpcError::from(e)
        }
    }

    /// The call deadline for one agent operation.
    fn op_timeout(&self) -> Duration {
        self.d.cfg.agent.file_op_timeout
    }

    /// A small guest file, whole (at most `cap` bytes; more is an error).
    async fn read_small(&self, c: &AsyncClient, path: &str, cap: u64) -> Result<Vec<u8>, RpcError> {
        let work = async {
            let mut dl = c.open_download(path, 0, Some(cap + 1)).await?;
            let mut v = Vec::new();
            while let Some(chunk) = dl.next_chunk().await? {
                v.extend_from_slice(&chunk);
                if v.len() as u64 > cap {
                    return Err(crate::ApiError::Sandbox(format!(
                        "{path} in the guest is over {cap} bytes"
                    )));
                }
            }
            Ok(v)
        };
        crate::within("reading a guest file", self.op_timeout(), work)
            .await
            .map_err(RpcError::from)
    }

    /// A user database of the guest (`/etc/passwd`, `/etc/group`); empty
    /// when the guest has none.
    async fn user_db(&self, c: &AsyncClient, path: &str) -> Result<String, RpcError> {
        match self.read_small(c, path, MAX_USER_DB).await {
            Ok(v) => Ok(String::from_utf8_lossy(&v).into_owned()),
            Err(e) if e.code == Code::NotFound => Ok(String::new()),
            Err(e) => Err(e),
        }
    }

    /// The user a request runs as (see [`users::resolve`]).
    async fn user(&self, c: &AsyncClient, asked: Option<&str>) -> Result<GuestUser, RpcError> {
        let passwd = self.user_db(c, "/etc/passwd").await?;
        users::resolve(&passwd, asked)
    }
}

/// Serves one envd request for `sandbox`.
pub async fn serve(d: Arc<Daemon>, sandbox: String, req: Request) -> Response {
    let state = match d.db(|db| db.sandbox(&sandbox)) {
        Ok(Some(r)) if !matches!(r.state, State::Pooled | State::Failed) => r.state,
        Ok(_) => return not_found(&sandbox),
        Err(e) => return e.into_response(),
    };
    let g = Guest { d, id: sandbox };
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match (method, path.as_str()) {
        (Method::GET, "/health") => match state {
            State::Running => StatusCode::NO_CONTENT.into_response(),
            _ => (
                StatusCode::BAD_GATEWAY,
                format!("sandbox {} is paused: it is not running", g.id),
            )
                .into_response(),
        },
        (Method::GET, "/envs") => envs(&g),
        (Method::GET, "/files") => files::download(&g, req).await,
        (Method::POST, "/files") => files::upload(&g, req).await,
        (Method::POST, p) if p.starts_with("/process.Process/") => {
            process::serve(&g, &p["/process.Process/".len()..], req).await
        }
        (Method::POST, p) if p.starts_with("/filesystem.Filesystem/") => {
            fs::serve(&g, &p["/filesystem.Filesystem/".len()..], req).await
        }
        (_, p) => RpcError::new(
            Code::Unimplemented,
            format!("envd has no route {p} (shoald serves envd's data plane)"),
        )
        .unary_response(),
    }
}

/// `GET /envs`: the sandbox's environment (set at create).
fn envs(g: &Guest) -> Response {
    match crate::ops::row(&g.d, &g.id) {
        Ok(r) => (
            StatusCode::OK,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&r.env).unwrap_or_else(|_| "{}".into()),
        )
            .into_response(),
        Err(_) => not_found(&g.id),
    }
}

/// Base64 (standard, padded) as ProtoJSON writes bytes.
fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Bytes from ProtoJSON (standard or URL-safe base64, padded or not).
fn unb64(s: &str) -> Result<Bytes, RpcError> {
    use base64::Engine;
    let t = s.trim_end_matches('=');
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(t)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t))
        .map(Bytes::from)
        .map_err(|e| RpcError::invalid(format!("invalid base64: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_through_base64_of_either_alphabet() {
        let data = b"\xff\xfe hi \x00";
        assert_eq!(&unb64(&b64(data)).unwrap()[..], data);
        assert_eq!(&unb64("__4").unwrap()[..], b"\xff\xfe");
        assert!(unb64("!").is_err());
    }
}
