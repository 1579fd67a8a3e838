//! `PUT /v1/sandboxes/{id}/network` (the work: [`crate::net`]).

use super::wire::{json_body, Errors, Res, D};
use axum::body::Body;
use axum::extract::{Path, State as AxState};
use axum::Json;
use shoal_api::{NetworkSpec, Sandbox};

/// Change a networked sandbox's egress policy, at once.
///
/// The new `allow_out`, `deny_out` and `allow_dns` replace the old in one
/// nftables transaction: the guest's next packet to a destination no
/// longer allowed is dropped, established connection or not. Running or
/// paused; 409 for a sandbox created without `network` (a network device
/// cannot be added to a running guest).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "sandboxes",
    request_body = NetworkSpec,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The sandbox with its new policy", body = Sandbox),
        Errors))]
pub(super) async fn set_network(
    AxState(d): D,
    Path(id): Path<String>,
    b: Body,
) -> Res<Json<Sandbox>> {
    let spec: NetworkSpec = json_body(b, d.cfg.http.max_json_body).await?;
    Ok(Json(crate::net::set_network(&d, &id, spec).await?))
}
