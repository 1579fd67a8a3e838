//! HTTP/JSON routes. Every error is `{"error":{"code":..,"message":..}}`
//! with a 4xx/5xx status; bodies and queries are parsed by the handlers
//! so that a bad one gets a clear 400, not a framework default.
//!
//! One table, [`routes`], lists every route with its handler; the router
//! and the OpenAPI 3.1 document served at `/openapi.json` ([`document`])
//! are both built from it (`utoipa-axum`), each operation described by
//! its handler's `#[utoipa::path]` and its bodies by the [`shoal_api`]
//! types. Unit tests check that the document lists exactly the routes the
//! router serves and that every body in it is the schema of its shared
//! type.

mod display_route;
mod fncall_route;
mod fork_route;
mod handlers;
mod images_route;
mod net_route;
pub(crate) mod wire;

use crate::auth::{Principal, Tokens};
use crate::listen::Peer;
use crate::{ApiError, Daemon};
use axum::extract::{Request, State as AxState};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use display_route::*;
use fncall_route::*;
use fork_route::*;
use handlers::*;
use images_route::*;
use net_route::*;
use std::sync::{Arc, OnceLock};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use wire::D;
pub use wire::{AdmissionErrors, Errors};

/// Every route and its handler: the router and the OpenAPI document are
/// both made from this table (routes of one path share one `routes!`).
pub fn routes() -> OpenApiRouter<Arc<Daemon>> {
    OpenApiRouter::with_openapi(<ApiDoc as utoipa::OpenApi>::openapi())
        .routes(routes!(openapi_json))
        .routes(routes!(healthz))
        .routes(routes!(metrics_text))
        .routes(routes!(stats))
        .routes(routes!(events))
        .routes(routes!(create, list))
        .routes(routes!(get_one, kill, update))
        .routes(routes!(exec_once))
        .routes(routes!(exec_stream))
        .routes(routes!(cmd_start, cmd_list))
        .routes(routes!(cmd_get))
        .routes(routes!(cmd_stream))
        .routes(routes!(cmd_wait))
        .routes(routes!(cmd_signal))
        .routes(routes!(cmd_stdin))
        .routes(routes!(upload, download, remove))
        .routes(routes!(stat))
        .routes(routes!(ls))
        .routes(routes!(mkdir))
        .routes(routes!(rename))
        .routes(routes!(snapshot))
        .routes(routes!(fork))
        .routes(routes!(screen))
        .routes(routes!(input))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(set_network))
        .routes(routes!(tpl_create, tpl_list))
        .routes(routes!(tpl_get, tpl_delete))
        .routes(routes!(pool_list))
        .routes(routes!(pool_set, pool_delete))
        .routes(routes!(fncall_once))
        .routes(routes!(fncall_batch))
        .routes(routes!(fncall_languages))
        .routes(routes!(img_pull, img_list))
        .routes(routes!(img_get, img_delete))
}

/// This document.
///
/// OpenAPI 3.1, generated from the route table and the API types.
#[utoipa::path(get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json")))]
async fn openapi_json() -> Json<serde_json::Value> {
    Json(document_json().clone())
}

/// The document's fixed parts (info, the error schema, the bearer
/// scheme); [`routes`] adds every operation.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "shoald",
        description = "Shoal host daemon: KVM microVM sandboxes restored from warm templates. \
            Unix socket by default; on TCP every route but /healthz needs \
            'Authorization: Bearer TOKEN'. Errors are {\"error\":{\"code\",\"message\"}}; \
            429 and 503 come with Retry-After."
    ),
    components(schemas(shoal_api::ErrorBody, shoal_api::ErrorCode)),
    modifiers(&Bearer),
    tags(
        (name = "sandboxes", description = "Create, list, pause, resume, snapshot, fork, kill"),
        (name = "exec", description = "Commands in a sandbox"),
        (name = "files", description = "Files in a sandbox"),
        (name = "templates", description = "Snapshots sandboxes are restored from"),
        (name = "pools", description = "Warm pools of restored sandboxes"),
        (name = "images", description = "OCI images in the host's image store"),
        (name = "fncall", description = "Stateless calls of code, each in a fresh clone"),
        (name = "meta", description = "Health, metrics, stats, events, this document"),
    )
)]
pub struct ApiDoc;

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, doc: &mut OpenApi) {
        if let Some(c) = doc.components.as_mut() {
            c.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

/// The document.
pub fn document() -> &'static OpenApi {
    static DOC: OnceLock<OpenApi> = OnceLock::new();
    DOC.get_or_init(|| routes().split_for_parts().1)
}

/// The document as JSON.
pub fn document_json() -> &'static serde_json::Value {
    static DOC: OnceLock<serde_json::Value> = OnceLock::new();
    DOC.get_or_init(|| serde_json::to_value(document()).unwrap_or_default())
}

/// HTTP methods, as the document names them.
pub const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Every route the document lists: (method, path), methods lower-case.
pub fn documented_routes() -> Vec<(String, String)> {
    let mut v = Vec::new();
    if let Some(paths) = document_json()["paths"].as_object() {
        for (p, ops) in paths {
            for m in ops.as_object().into_iter().flat_map(|o| o.keys()) {
                if METHODS.contains(&m.as_str()) {
                    v.push((m.clone(), p.clone()));
                }
            }
        }
    }
    v
}

async fn count_status(AxState(d): D, req: Request, next: Next) -> Response {
    let r = next.run(req).await;
    d.metrics.response(r.status().as_u16());
    r
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route (see GET /openapi.json)".into())
}

/// The API router: on TCP (`tokens`) every route but `/healthz` needs one
/// of the bearer tokens (SandboxFusion's routes also take it as a Basic
/// password, or none with [`Tokens::with_open_fusion`]), whose name is the
/// caller's
/// [`Principal`]; on the Unix socket the caller is
/// the peer's uid ([`crate::listen::Peer`]).
///
/// E2B compatibility ([`crate::e2b`]) shares the listener: a request with
/// an `E2b-Sandbox-Id` header is the data plane
/// ([`crate::e2b::data_plane`], which checks the sandbox's own access
/// token), before any of the API's authentication; E2B's control-plane
/// routes (`/sandboxes`, `/v2/sandboxes`, ...) take the same tokens as
/// `X-API-KEY` ([`crate::e2b::control::router`]); everything else is the
/// daemon's own API.
pub fn router(d: Arc<Daemon>, tokens: Option<Tokens>) -> Router {
    let shoal = shoal_router(d.clone(), tokens.clone());
    crate::e2b::router(d.clone(), tokens, shoal)
        // Bodies are read by the handlers, each within its own limit
        // (`wire::json_body`, uploads streamed with theirs).
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(d, count_status))
}

/// The daemon's own API ([`routes`]) behind its bearer-token check.
fn shoal_router(d: Arc<Daemon>, tokens: Option<Tokens>) -> Router {
    let (r, _) = routes().split_for_parts();
    let r = r
        // SandboxFusion's /run_code and /v1/ping: a foreign API, outside
        // the document (see crate::fusion).
        .merge(crate::fusion::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(|| async {
            ApiError::BadRequest("method not allowed on this route (see GET /openapi.json)".into())
        })
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(d);
    match tokens {
        None => r.layer(middleware::from_fn(
            |mut req: Request, next: Next| async move {
                if let Some(Peer::Unix(Some(uid))) = req.extensions().get::<Peer>().cloned() {
                    req.extensions_mut().insert(Principal::Uid(uid));
                }
                next.run(req).await
            },
        )),
        Some(t) => {
            let t = Arc::new(t);
            r.layer(middleware::from_fn(move |mut req: Request, next: Next| {
                let t = t.clone();
                async move {
                    let auth = req.headers().get(header::AUTHORIZATION);
                    let fusion = crate::fusion::is_fusion_path(req.uri().path());
                    let who = auth
                        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
                        .and_then(|b| t.principal(b))
                        .or_else(|| {
                            // SandboxFusion's clients send the endpoint
                            // URL's user-info instead (see crate::fusion).
                            if !fusion {
                                return None;
                            }
                            t.principal(&crate::fusion::basic_password(auth?.as_bytes())?)
                        });
                    match who {
                        Some(p) => {
                            req.extensions_mut().insert(p);
                            next.run(req).await
                        }
                        None if req.uri().path() == "/healthz" => next.run(req).await,
                        None if fusion && t.open_fusion() => next.run(req).await,
                        None => ApiError::Unauthorized(
                            "missing or wrong 'Authorization: Bearer TOKEN'".into(),
                        )
                        .into_response(),
                    }
                }
            }))
        }
    }
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
