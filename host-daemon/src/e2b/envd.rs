//! envd's data plane (not yet served: issue 15).

use crate::Daemon;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Serves one envd request for `sandbox`.
pub async fn serve(_d: Arc<Daemon>, _sandbox: String, _req: Request) -> Response {
    (StatusCode::NOT_IMPLEMENTED, "envd is not served yet").into_response()
}
