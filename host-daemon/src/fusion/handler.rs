//! The handlers of `/run_code` and `/v1/ping`.

use super::translate::{from_fncall, sandbox_error, to_fncall};
use super::wire::RunCodeRequest;
use super::MAX_BODY;
use crate::fncall::{registry, validate};
use crate::{ApiError, Daemon};
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use shoal_api::fncall::FnCallRequest;
use std::sync::Arc;

/// SandboxFusion's routes, for the API router.
pub fn routes() -> Router<Arc<Daemon>> {
    Router::new()
        .route("/run_code", post(run_code))
        .route("/v1/ping", get(ping))
}

/// `GET /v1/ping`: `"pong"`, as SandboxFusion answers.
async fn ping() -> Json<&'static str> {
    Json("pong")
}

/// `POST /run_code`.
async fn run_code(State(d): State<Arc<Daemon>>, b: Body) -> Response {
    let req: RunCodeRequest = match crate::api::wire::json_body(b, MAX_BODY).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let mut call = match to_fncall(req) {
        Ok(c) => c,
        Err(e) => return ApiError::BadRequest(e.to_string()).into_response(),
    };
    clamp_memory(&mut call);
    match crate::fncall::run_call(&d, call).await {
        Ok(r) => Json(from_fncall(r)).into_response(),
        Err(e) => error_response(e),
    }
}

/// SandboxFusion's `memory_limit_MB` is a ceiling (rlimits), often set
/// high out of habit: it is kept within what the language's template
/// allows (FnCall refuses a `memory_mib` outside that).
pub(super) fn clamp_memory(call: &mut FnCallRequest) {
    let (Some(m), Some(spec)) = (call.memory_mib, registry::find(&call.language)) else {
        return;
    };
    let max = validate::max_memory_mib(spec).max(validate::MIN_MEMORY_MIB);
    call.memory_mib = Some(m.clamp(validate::MIN_MEMORY_MIB, max));
}

/// An error of the FnCall core: the request's fault (4xx) or the host's
/// lack of room (429/503) as its HTTP status; anything else as
/// SandboxFusion's `SandboxError`.
fn error_response(e: ApiError) -> Response {
    let code = e.code();
    if code.status() < 500 || code.retryable() {
        return e.into_response();
    }
    Json(sandbox_error(&e.to_string())).into_response()
}
