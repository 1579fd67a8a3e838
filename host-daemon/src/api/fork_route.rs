//! `POST /v1/sandboxes/{id}/fork` (the work: [`crate::fork`]).

use super::wire::{json_body, AdmissionErrors, Res, D};
use crate::fork;
use axum::body::Body;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use shoal_api::{ForkRequest, Forked};

/// Fork a running sandbox into 1 to 100 live clones.
///
/// The sandbox is snapshotted once (its vCPUs paused meanwhile; it goes
/// on) and each clone is restored from that snapshot: it continues from
/// that instant with its own memory (copy-on-write of the snapshot), its
/// own upper layer, fresh entropy and clock, and a new id; it inherits
/// the source's template, shape, environment, TTL, idle timeout and
/// labels (`metadata` replaces the labels). Clones are admitted as
/// creates are. 201 when at least one clone was made (`failed` says why
/// each of the others was not); otherwise the error of the first failure
/// (a full host: 429 `host_full` with `Retry-After`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", tag = "sandboxes",
    request_body = ForkRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 201, description = "The clones made (running), and why the others were not",
        body = Forked), AdmissionErrors))]
pub(super) async fn fork(
    axum::extract::State(d): D,
    Path(id): Path<String>,
    b: Body,
) -> Res<impl IntoResponse> {
    let req: ForkRequest = json_body(b, d.cfg.http.max_json_body).await?;
    let r = fork::fork(&d, &id, req).await?;
    Ok((StatusCode::CREATED, Json(r)))
}
