//! `GET|POST /v1/images`, `GET|DELETE /v1/images/{image}` (the work:
//! [`crate::images`]). A reference's `/` is `%2F` in the path.

use super::wire::{json_body, Caller, Errors, Res, D};
use crate::images;
use axum::body::Body;
use axum::extract::{Path, State as AxState};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use shoal_api::images::{Image, ImageList, PullImage};

/// List the host's OCI images, with disk use.
///
/// Each image's `disk_bytes` counts its layers (a layer shared between
/// images in each); the list's `disk_bytes` counts every stored layer
/// once. `in_use`: the templates and live sandboxes of the image.
#[utoipa::path(get, path = "/v1/images", tag = "images",
    responses((status = 200, description = "Images by id and the store's disk use",
        body = ImageList), Errors))]
pub(super) async fn img_list(AxState(d): D) -> Res<Json<ImageList>> {
    Ok(Json(images::list(&d).await?))
}

/// Pull an OCI image from a registry into the host's image store.
///
/// Https, or plain http to a loopback registry (or any with `insecure`);
/// every blob's digest is verified and each layer converted once to a
/// DAX-ready erofs layer. Answers when the image is stored.
#[utoipa::path(post, path = "/v1/images", tag = "images", request_body = PullImage,
    responses((status = 201, description = "Pulled (or already stored)", body = Image), Errors))]
pub(super) async fn img_pull(AxState(d): D, b: Body) -> Res<impl IntoResponse> {
    let req: PullImage = json_body(b, d.cfg.http.max_json_body).await?;
    Ok((
        StatusCode::CREATED,
        Json(images::pull_image(&d, req).await?),
    ))
}

/// Inspect an image: layers, config, disk use, users.
#[utoipa::path(get, path = "/v1/images/{image}", tag = "images",
    params(("image" = String, Path, description = "A reference (`/` as %2F) or an image id (`sha256:...`)")),
    responses((status = 200, description = "The image", body = Image), Errors))]
pub(super) async fn img_get(AxState(d): D, Path(r): Path<String>) -> Res<Json<Image>> {
    Ok(Json(images::get(&d, &r).await?))
}

/// Remove a reference (by id: the image) and the layers no other image has.
///
/// 409 `conflict` while a template of the image or a live sandbox of one
/// exists (the message names them); admins only (403 otherwise).
#[utoipa::path(delete, path = "/v1/images/{image}", tag = "images",
    params(("image" = String, Path, description = "A reference (`/` as %2F) or an image id (`sha256:...`)")),
    responses((status = 200, description = "Removed: the image as it was", body = Image), Errors))]
pub(super) async fn img_delete(
    AxState(d): D,
    Caller(who): Caller,
    Path(r): Path<String>,
) -> Res<Json<Image>> {
    Ok(Json(images::remove(&d, &r, &who).await?))
}
