//! E2B's control-plane REST API, as the stock SDKs call it: create
//! (`POST /sandboxes`, `POST /v2/sandboxes`), get, list (v1 and v2), kill,
//! timeout, refreshes and health here; pause, connect/resume, fork,
//! snapshots, metrics and logs in [`super::control_ops`]; the JSON shapes
//! in [`super::control_wire`].
//!
//! Authentication: on TCP the `X-API-KEY` header (or `Authorization:
//! Bearer`) must be one of the daemon's tokens (constant-time compare;
//! 401 otherwise), whose name is the caller's
//! [`Principal`](crate::auth::Principal); on the Unix socket the caller is
//! the peer. `GET /health` needs neither, as on E2B.
//!
//! How E2B's concepts map onto shoald's:
//! - `templateID`: a template's name, or else an image's (`base`, `tiny`:
//!   its template at the default shape, built on first use);
//! - `timeout`: the TTL from now (default 300 s); on pause the TTL is
//!   cleared (a paused E2B sandbox does not time out) and connect/resume
//!   sets it again;
//! - `metadata`: the sandbox's labels; `envVars`: its default environment;
//! - sandboxes made here are never frozen while idle (`keep_running`): E2B
//!   sandboxes run background processes until their timeout;
//! - failed and pooled sandboxes do not exist for E2B (404, not listed);
//! - `network` rules and `allow_internet_access`: shoald's sandbox
//!   networks, mapped by [`super::network`].

use super::control_ops::{set_ttl, visible, D};
use super::control_wire::{self as w, E, R};
use super::network as net;
use super::{api_error, error};
use crate::auth::{Principal, Tokens};
use crate::db::{Filter, SandboxRow};
use crate::listen::Peer;
use crate::{inputs, lifecycle, ops, Daemon};
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use shoal_api::CreateSandbox;
use std::sync::Arc;

/// The control-plane routes, behind the `X-API-KEY` check on TCP
/// (`tokens`) or the peer's uid on the Unix socket.
pub fn router(d: Arc<Daemon>, tokens: Option<Tokens>) -> Router {
    use super::control_ops as o;
    let authed = Router::new()
        .route("/sandboxes", post(create_v1).get(list_v1))
        .route("/v2/sandboxes", post(create_v2).get(list_v2))
        .route("/sandboxes/metrics", get(o::metrics_many))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/pause", post(o::pause))
        .route("/sandboxes/{id}/resume", post(o::resume))
        .route("/sandboxes/{id}/connect", post(o::connect_v1))
        .route("/v2/sandboxes/{id}/connect", post(o::connect_v2))
        .route("/sandboxes/{id}/fork", post(o::fork))
        .route("/sandboxes/{id}/snapshots", post(o::snapshot))
        .route("/snapshots", get(o::list_snapshots))
        .route("/templates/{id}", delete(o::delete_snapshot))
        .route("/sandboxes/{id}/metrics", get(o::metrics_one))
        .route("/sandboxes/{id}/logs", get(o::logs_v1))
        .route("/v2/sandboxes/{id}/logs", get(o::logs_v2))
        .route("/sandboxes/{id}/network", axum::routing::put(o::network));
    let tokens = tokens.map(Arc::new);
    let authed = authed.route_layer(middleware::from_fn(move |req: Request, next: Next| {
        let t = tokens.clone();
        async move { authenticate(t.as_deref(), req, next).await }
    }));
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .merge(authed)
        .method_not_allowed_fallback(|| async {
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this E2B route",
            )
        })
        .with_state(d)
}

async fn authenticate(tokens: Option<&Tokens>, mut req: Request, next: Next) -> Response {
    let who = match tokens {
        // The Unix socket: the peer.
        None => match req.extensions().get::<Peer>() {
            Some(Peer::Unix(Some(uid))) => Some(Principal::Uid(*uid)),
            _ => None,
        },
        Some(t) => {
            let h = req.headers();
            let key = h
                .get(super::API_KEY_HEADER)
                .map(HeaderValue::as_bytes)
                .or_else(|| {
                    h.get(header::AUTHORIZATION)
                        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
                });
            key.and_then(|k| t.principal(k))
        }
    };
    match who {
        Some(p) => {
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        None if tokens.is_none() => error(
            StatusCode::FORBIDDEN,
            "the caller is unknown (no peer credentials)",
        ),
        None => error(
            StatusCode::UNAUTHORIZED,
            "Invalid API key: X-API-KEY must be one of shoald's tokens",
        ),
    }
}

async fn create_v1(State(d): D, b: Body) -> R {
    create(d, b).await
}

async fn create_v2(State(d): D, b: Body) -> R {
    create(d, b).await
}

/// The shoald create request for an E2B one, or a 400 saying what is not
/// supported.
fn to_create(d: &Daemon, n: w::NewSandbox) -> Result<CreateSandbox, E> {
    let bad = |m: String| E::of(error(StatusCode::BAD_REQUEST, m));
    if n.template_id.is_empty() {
        return Err(bad("templateID is required".into()));
    }
    let egress = net::parse_create(n.network.as_ref()).map_err(bad)?;
    if n.mcp.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(bad("mcp is not supported by shoald".into()));
    }
    if n.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(bad("volumeMounts are not supported by shoald".into()));
    }
    if n.iam.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(bad("iam is not supported by shoald".into()));
    }
    let network = net::create_spec(egress, n.allow_internet_access, d.cfg.net.e2b_internet)
        .map_err(bad)?
        .map(|s| net::fit(d, s));
    let ttl = match n.timeout {
        None => w::DEFAULT_TIMEOUT_S,
        Some(0) => return Err(bad("timeout must be at least 1 second".into())),
        Some(t) => t,
    };
    let metadata = n.metadata.unwrap_or_default();
    let env = n.env_vars.unwrap_or_default();
    inputs::check_map(&metadata, &inputs::METADATA).map_err(|e| E::of(api_error(e)))?;
    inputs::check_map(&env, &inputs::ENV).map_err(|e| E::of(api_error(e)))?;
    let template = d
        .db(|db| db.template(&n.template_id))
        .map_err(|e| E::of(api_error(e)))?;
    let req = CreateSandbox {
        ttl_s: ttl,
        metadata,
        env,
        keep_running: true,
        pause_at_ttl: n.auto_pause == Some(true),
        ..Default::default()
    };
    let networked = network.is_some();
    let req = CreateSandbox { network, ..req };
    match template {
        // A networked sandbox of a template booted without a network
        // device: the same image, shape and layers, from the daemon's
        // networked template of them (booted on first use).
        Some(t) if networked && !t.net => match t.source.strip_prefix("image:") {
            Some(img) if t.image.is_none() && crate::templates::IMAGES.contains(&img) => {
                Ok(CreateSandbox {
                    image: Some(img.to_string()),
                    vcpus: Some(t.vcpus),
                    memory_mib: Some(t.memory_mib),
                    ..req
                }
                .with_root(t.root))
            }
            _ => Err(bad(format!(
                "template '{}' has no network device and was not made from an image: a \
                 sandbox with a network needs a template made with \"network\": true, or an \
                 image's",
                t.name
            ))),
        },
        Some(t) => Ok(CreateSandbox {
            template: Some(t.name),
            ..req
        }),
        None if crate::templates::IMAGES.contains(&n.template_id.as_str()) => Ok(CreateSandbox {
            image: Some(n.template_id),
            ..req
        }),
        None => Err(E::of(error(
            StatusCode::NOT_FOUND,
            format!(
                "template '{}' not found: templateID must be a shoald template or an image ({})",
                n.template_id,
                crate::templates::IMAGES.join(", ")
            ),
        ))),
    }
}

async fn create(d: Arc<Daemon>, b: Body) -> R {
    let n: w::NewSandbox = w::json(b, d.cfg.http.max_json_body).await?;
    if super::interp::is_template(&n.template_id) {
        // The code interpreter's template is the daemon's, made on first use.
        super::interp::ensure_template(&d)
            .await
            .map_err(|e| E::of(api_error(e)))?;
    }
    let no_auto_resume = n.auto_resume.as_ref().and_then(|a| a.enabled) == Some(false);
    let req = to_create(&d, n)?;
    let v = lifecycle::create(&d, req)
        .await
        .map_err(|e| E::of(api_error(e)))?;
    let r = visible(&d, &v.id)?;
    if no_auto_resume {
        super::control_ops::no_auto_resume(&d, &r)?;
    }
    Ok((StatusCode::CREATED, Json(w::sandbox(&d, &r))).into_response())
}

async fn get_one(State(d): D, Path(id): Path<String>) -> R {
    let r = visible(&d, &id)?;
    Ok(Json(w::detail(&d, &r)).into_response())
}

async fn kill(State(d): D, Path(id): Path<String>) -> R {
    visible(&d, &id)?;
    ops::kill(&d, &id, "killed through the E2B API")
        .await
        .map_err(|e| E::of(api_error(e)))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn set_timeout(State(d): D, Path(id): Path<String>, b: Body) -> R {
    let t: w::TimeoutBody = w::json(b, d.cfg.http.max_json_body).await?;
    visible(&d, &id)?;
    let secs = t.timeout.filter(|&s| s > 0).ok_or_else(|| {
        E::of(error(
            StatusCode::BAD_REQUEST,
            "timeout (>= 1 s) is required",
        ))
    })?;
    set_ttl(&d, &id, secs)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/refreshes`: keeps the sandbox alive `duration`
/// seconds from now (default 60 s, at most 3600 as on E2B), never
/// shortening its timeout.
async fn refresh(State(d): D, Path(id): Path<String>, b: Body) -> R {
    let t: w::RefreshBody = w::json(b, d.cfg.http.max_json_body).await?;
    let r = visible(&d, &id)?;
    let secs = t.duration.unwrap_or(60).clamp(1, 3600);
    let end = w::end_at(&r);
    if r.ttl_s != 0 && end < crate::db::now() + secs as f64 {
        set_ttl(&d, &id, secs)?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list_v1(State(d): D, RawQuery(q): RawQuery) -> R {
    let q = w::ListQuery::parse(q.as_deref())?;
    let rows = listed(&d, &q)?;
    let all: Vec<_> = rows.iter().map(|r| w::listed(&d, r)).collect();
    Ok(Json(all).into_response())
}

async fn list_v2(State(d): D, RawQuery(q): RawQuery) -> R {
    let q = w::ListQuery::parse(q.as_deref())?;
    let rows = listed(&d, &q)?;
    let (page, next) = w::page(&rows, q.next_token.as_deref(), q.limit, q.desc)?;
    let body: Vec<_> = page.iter().map(|r| w::listed(&d, r)).collect();
    let mut res = Json(body).into_response();
    if let Some(t) = next.and_then(|t| HeaderValue::from_str(&t).ok()) {
        res.headers_mut().insert("x-next-token", t);
    }
    Ok(res)
}

/// The sandboxes matching `q`, oldest first (`order=desc`: newest).
fn listed(d: &Daemon, q: &w::ListQuery) -> Result<Vec<SandboxRow>, E> {
    let f = Filter {
        metadata: q.metadata.clone(),
        ..Default::default()
    };
    let mut rows: Vec<SandboxRow> = d
        .db(|db| db.list_sandboxes(&f))
        .map_err(|e| E::of(api_error(e)))?
        .into_iter()
        .filter(|r| {
            w::e2b_state(r.state).is_some_and(|s| q.states.is_empty() || q.states.contains(&s))
        })
        .filter(|r| {
            q.template
                .as_ref()
                .is_none_or(|t| w::template_matches(&r.template, t))
        })
        .filter(|r| q.started_after.is_none_or(|t| r.created_at >= t))
        .collect();
    rows.sort_by(|a, b| a.created_at.total_cmp(&b.created_at).then(a.id.cmp(&b.id)));
    if q.desc {
        rows.reverse();
    }
    Ok(rows)
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "control_net_tests.rs"]
mod net_tests;
