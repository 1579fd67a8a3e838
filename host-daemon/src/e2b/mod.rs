//! E2B compatibility: the stock `e2b` and `e2b-code-interpreter` SDKs
//! work against shoald with only `E2B_API_URL`, `E2B_SANDBOX_URL` and
//! `E2B_API_KEY` changed.
//!
//! - [`control`]: the control-plane REST API (`/sandboxes`, `/v2/sandboxes`,
//!   ...), authenticated by `X-API-KEY`.
//! - [`envd`]: envd's data plane (Connect RPC `process.Process`,
//!   `filesystem.Filesystem`, `/files`, `/health`, `/envs`), carried to the
//!   guest agent over vsock.
//! - [`proxy`]: any other sandbox port (the code interpreter's 49999, a
//!   user's server), relayed to that port inside the guest.
//!
//! A data-plane request is recognised by its `E2b-Sandbox-Id` header and
//! goes to [`data_plane`] whatever its path.

pub mod control;
pub mod envd;
pub mod interp;
pub mod proxy;

use crate::Daemon;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The port envd listens on in an E2B sandbox (what the SDK asks for).
pub const ENVD_PORT: u16 = 49983;
/// The code interpreter's port.
pub const CODE_INTERPRETER_PORT: u16 = 49999;
/// The header naming the sandbox of a data-plane request.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// The header naming the sandbox port of a data-plane request.
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";

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

/// Serves one data-plane request: envd's port to [`envd`], any other to
/// [`proxy`].
pub async fn data_plane(d: Arc<Daemon>, req: Request) -> Response {
    match data_plane_target(&req) {
        None => crate::ApiError::BadRequest("no E2b-Sandbox-Id header".into()).into_response(),
        Some(Err(e)) => crate::ApiError::BadRequest(e).into_response(),
        Some(Ok((id, ENVD_PORT))) => envd::serve(d, id, req).await,
        Some(Ok((id, port))) => proxy::serve(d, id, port, req).await,
    }
}
