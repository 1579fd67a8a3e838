//! Other sandbox ports (not yet served: issue 15).

use crate::Daemon;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Relays one request to `port` inside `sandbox`.
pub async fn serve(_d: Arc<Daemon>, _sandbox: String, _port: u16, _req: Request) -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        "sandbox ports are not served yet",
    )
        .into_response()
}
