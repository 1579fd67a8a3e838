//! `POST /v1/fncall`, `POST /v1/fncall/batch` and `GET /v1/fncall/languages`
//! (the work: [`crate::fncall`]).

use super::wire::{json_body, Errors, Res, D};
use crate::fncall;
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use shoal_api::{BatchItem, BatchRequest, FnCallRequest, FnCallResult, Language};

/// Run code once in a fresh sandbox.
///
/// The call runs in a new copy-on-write clone of its language's template
/// (python: interpreter started, modules imported, waiting for the code),
/// destroyed after it answers: nothing of one call is seen by another.
/// 200 with the result however the program ended (`status`: success,
/// failed, compile_error, timeout, out_of_memory, or sandbox_error when
/// the sandbox, not the program, failed); 400 for a malformed request
/// (unknown language, code over 1 MiB, bad base64, a timeout out of
/// 0 < t <= 300).
#[utoipa::path(post, path = "/v1/fncall", tag = "fncall", request_body = FnCallRequest,
    responses((status = 200, description = "How the call ended", body = FnCallResult),
        Errors))]
pub(super) async fn fncall_once(axum::extract::State(d): D, b: Body) -> Res<Json<FnCallResult>> {
    let req: FnCallRequest = json_body(b, fncall::MAX_CALL_BODY).await?;
    Ok(Json(fncall::run_call(&d, req).await?))
}

/// Run many calls, streaming results as they finish.
///
/// Newline-delimited JSON, one `BatchItem` {index, result} per call in the
/// order they finish; `concurrency` calls at a time (default 16). A call
/// malformed by itself is a `sandbox_error` item saying why; a malformed
/// batch (over 10,000 calls, a bad concurrency) is a 400.
#[utoipa::path(post, path = "/v1/fncall/batch", tag = "fncall", request_body = BatchRequest,
    responses((status = 200, description = "One BatchItem per line", body = BatchItem,
        content_type = "application/x-ndjson"), Errors))]
pub(super) async fn fncall_batch(axum::extract::State(d): D, b: Body) -> Res<impl IntoResponse> {
    let req: BatchRequest = json_body(b, fncall::MAX_BATCH_BODY).await?;
    let rx = fncall::run_batch(&d, req)?;
    let lines = futures_util::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        let mut line = serde_json::to_vec(&item).unwrap_or_default();
        line.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), rx))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    ))
}

/// The languages FnCall runs.
#[utoipa::path(get, path = "/v1/fncall/languages", tag = "fncall",
    responses((status = 200, description = "Every language", body = Vec<Language>), Errors))]
pub(super) async fn fncall_languages(axum::extract::State(d): D) -> Json<Vec<Language>> {
    Json(fncall::languages(&d))
}
