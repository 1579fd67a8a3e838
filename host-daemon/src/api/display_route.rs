//! `GET /v1/sandboxes/{id}/screen` and `POST /v1/sandboxes/{id}/input`
//! (the work: [`crate::display`]).

use super::wire::{json_body, AdmissionErrors, Res, D};
use crate::display;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use shoal_api::InputRequest;

/// A PNG of a `vm` sandbox's screen (409 for kinds without a display).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/screen", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The screen", body = Vec<u8>,
        content_type = "image/png"), AdmissionErrors))]
pub(super) async fn screen(axum::extract::State(d): D, Path(id): Path<String>) -> Res<Response> {
    let png = display::screen(&d, &id).await?;
    let mut r = Body::from(png).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("image/png"));
    Ok(r)
}

/// Keyboard and pointer events for a `vm` sandbox's display, sent in
/// order (400 for an invalid event, 409 for kinds without a display).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/input", tag = "sandboxes",
    request_body = InputRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 204, description = "Sent"), AdmissionErrors))]
pub(super) async fn input(
    axum::extract::State(d): D,
    Path(id): Path<String>,
    b: Body,
) -> Res<StatusCode> {
    let req: InputRequest = json_body(b, d.cfg.http.max_json_body).await?;
    display::input(&d, &id, req.events).await?;
    Ok(StatusCode::NO_CONTENT)
}
