//! HTTP/JSON routes. Every error is `{"error":{"code":..,"message":..}}`
//! with a 4xx/5xx status; bodies and queries are parsed here so that a bad
//! one gets a clear 400, not a framework default.

use super::db::{Filter, State};
use super::exec::{self, ExecBody};
use super::ops::{self, CreateSandbox, SnapshotRequest};
use super::templates::{self, CreateTemplate, SetPool};
use super::{admission, metrics, openapi, ApiError, Daemon};
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, Request, State as AxState};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use guest_agent::client::UploadOptions;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::sync::Arc;

type D = AxState<Arc<Daemon>>;
type Res<T> = Result<T, ApiError>;

/// Every route: (method, path). The OpenAPI document must describe each
/// (a unit test checks).
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/openapi.json"),
    ("get", "/healthz"),
    ("get", "/metrics"),
    ("get", "/v1/stats"),
    ("get", "/v1/events"),
    ("post", "/v1/sandboxes"),
    ("get", "/v1/sandboxes"),
    ("get", "/v1/sandboxes/{id}"),
    ("delete", "/v1/sandboxes/{id}"),
    ("post", "/v1/sandboxes/{id}/exec"),
    ("post", "/v1/sandboxes/{id}/exec/stream"),
    ("put", "/v1/sandboxes/{id}/files"),
    ("get", "/v1/sandboxes/{id}/files"),
    ("delete", "/v1/sandboxes/{id}/files"),
    ("get", "/v1/sandboxes/{id}/files/stat"),
    ("get", "/v1/sandboxes/{id}/files/list"),
    ("post", "/v1/sandboxes/{id}/snapshot"),
    ("post", "/v1/sandboxes/{id}/pause"),
    ("post", "/v1/sandboxes/{id}/resume"),
    ("post", "/v1/templates"),
    ("get", "/v1/templates"),
    ("get", "/v1/templates/{name}"),
    ("delete", "/v1/templates/{name}"),
    ("get", "/v1/pools"),
    ("put", "/v1/pools/{template}"),
    ("delete", "/v1/pools/{template}"),
];

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::json!({"error": {"code": self.code(), "message": self.to_string()}});
        let mut r = (status, Json(body)).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

fn body<T: DeserializeOwned>(b: &Bytes) -> Res<T> {
    let b: &[u8] = if b.iter().all(|c| c.is_ascii_whitespace()) {
        b"{}"
    } else {
        b
    };
    serde_json::from_slice(b).map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}

fn query(q: &Option<String>) -> Res<HashMap<String, String>> {
    let mut m = HashMap::new();
    for kv in q
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|s| !s.is_empty())
    {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        m.insert(unescape(k)?, unescape(v)?);
    }
    Ok(m)
}

fn unescape(s: &str) -> Res<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let h = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| ApiError::BadRequest(format!("bad escape in query: {s}")))?;
                out.push(h);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| ApiError::BadRequest("query is not UTF-8".into()))
}

fn flag(q: &HashMap<String, String>, k: &str) -> Res<bool> {
    match q.get(k).map(String::as_str) {
        None | Some("false") | Some("0") => Ok(false),
        Some("") | Some("true") | Some("1") => Ok(true),
        Some(v) => Err(ApiError::BadRequest(format!(
            "{k}={v}: expected true or false"
        ))),
    }
}

fn path_arg(q: &HashMap<String, String>) -> Res<String> {
    q.get("path")
        .cloned()
        .ok_or_else(|| ApiError::BadRequest("missing ?path=/absolute/guest/path".into()))
}

async fn create(AxState(d): D, b: Bytes) -> Res<impl IntoResponse> {
    let req: CreateSandbox = body(&b)?;
    Ok((StatusCode::CREATED, Json(ops::create(&d, req).await?)))
}

async fn list(AxState(d): D, RawQuery(q): RawQuery) -> Res<impl IntoResponse> {
    let q = query(&q)?;
    let mut f = Filter::default();
    for (k, v) in &q {
        match k.as_str() {
            "state" => {
                f.state = Some(State::parse(v).ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "state={v}: expected starting, running, pausing, paused, failed or pooled"
                    ))
                })?)
            }
            "template" => f.template = Some(v.clone()),
            "metadata" => {
                for pair in v.split(',') {
                    let (a, b) = pair.split_once(':').ok_or_else(|| {
                        ApiError::BadRequest(format!(
                            "metadata={v}: expected KEY:VALUE[,KEY:VALUE]"
                        ))
                    })?;
                    f.metadata.push((a.into(), b.into()));
                }
            }
            o => {
                return Err(ApiError::BadRequest(format!(
                    "unknown filter '{o}' (state, template, metadata)"
                )))
            }
        }
    }
    let rows = d.db(|db| db.list_sandboxes(&f))?;
    Ok(Json(
        rows.into_iter()
            .map(ops::SandboxView::from)
            .collect::<Vec<_>>(),
    ))
}

async fn get_one(AxState(d): D, Path(id): Path<String>) -> Res<impl IntoResponse> {
    Ok(Json(ops::SandboxView::from(ops::row(&d, &id)?)))
}

async fn kill(AxState(d): D, Path(id): Path<String>) -> Res<impl IntoResponse> {
    ops::row(&d, &id)?;
    ops::kill(&d, &id, "deleted through the API").await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn exec_once(AxState(d): D, Path(id): Path<String>, b: Bytes) -> Res<impl IntoResponse> {
    let req: ExecBody = body(&b)?;
    Ok(Json(exec::exec(&d, &id, req).await?))
}

async fn exec_stream(AxState(d): D, Path(id): Path<String>, b: Bytes) -> Res<impl IntoResponse> {
    let req: ExecBody = body(&b)?;
    let s = exec::exec_stream(&d, &id, req).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], s))
}

async fn upload(
    AxState(d): D,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    b: Body,
) -> Res<impl IntoResponse> {
    let q = query(&q)?;
    let path = path_arg(&q)?;
    let mode = match q.get("mode") {
        None => 0o644,
        Some(m) => u32::from_str_radix(m, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| ApiError::BadRequest(format!("mode={m}: expected octal like 644")))?,
    };
    let opts = UploadOptions {
        mode,
        append: flag(&q, "append")?,
        create_parents: flag(&q, "parents")?,
    };
    let n = exec::upload(&d, &id, path, opts, b).await?;
    Ok((StatusCode::CREATED, Json(serde_json::json!({"bytes": n}))))
}

async fn download(AxState(d): D, Path(id): Path<String>, RawQuery(q): RawQuery) -> Res<Response> {
    let path = path_arg(&query(&q)?)?;
    let (size, b) = exec::download(&d, &id, path).await?;
    let mut r = Response::new(b);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r.headers_mut()
        .insert("x-file-size", HeaderValue::from(size));
    Ok(r)
}

async fn remove(
    AxState(d): D,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Res<impl IntoResponse> {
    let q = query(&q)?;
    exec::remove(&d, &id, path_arg(&q)?, flag(&q, "recursive")?).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn stat(
    AxState(d): D,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Res<impl IntoResponse> {
    Ok(Json(exec::stat(&d, &id, path_arg(&query(&q)?)?).await?))
}

async fn ls(
    AxState(d): D,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Res<impl IntoResponse> {
    Ok(Json(exec::list(&d, &id, path_arg(&query(&q)?)?).await?))
}

async fn snapshot(AxState(d): D, Path(id): Path<String>, b: Bytes) -> Res<impl IntoResponse> {
    let req: SnapshotRequest = body(&b)?;
    Ok((
        StatusCode::CREATED,
        Json(ops::snapshot(&d, &id, req).await?),
    ))
}

async fn pause(AxState(d): D, Path(id): Path<String>) -> Res<impl IntoResponse> {
    ops::row(&d, &id)?;
    Ok(Json(ops::pause(&d, &id).await?))
}

async fn resume(AxState(d): D, Path(id): Path<String>) -> Res<impl IntoResponse> {
    ops::row(&d, &id)?;
    Ok(Json(ops::resume(&d, &id).await?))
}

async fn tpl_create(AxState(d): D, b: Bytes) -> Res<impl IntoResponse> {
    let req: CreateTemplate = body(&b)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(templates::create_template(&d, req)?),
    ))
}

async fn tpl_list(AxState(d): D) -> Res<impl IntoResponse> {
    Ok(Json(d.db(|db| db.templates())?))
}

async fn tpl_get(AxState(d): D, Path(n): Path<String>) -> Res<impl IntoResponse> {
    d.db(|db| db.template(&n))?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no template '{n}'")))
}

async fn tpl_delete(AxState(d): D, Path(n): Path<String>) -> Res<impl IntoResponse> {
    templates::delete_template(&d, &n).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pool_list(AxState(d): D) -> Res<impl IntoResponse> {
    Ok(Json(templates::pools(&d)?))
}

async fn pool_set(AxState(d): D, Path(t): Path<String>, b: Bytes) -> Res<impl IntoResponse> {
    let req: SetPool = body(&b)?;
    Ok(Json(templates::set_pool(&d, &t, req).await?))
}

async fn pool_delete(AxState(d): D, Path(t): Path<String>) -> Res<impl IntoResponse> {
    templates::set_pool(&d, &t, SetPool { target: 0 }).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn gauges(d: &Daemon) -> Res<metrics::Gauges> {
    let u = d.db(|db| db.usage())?;
    let pools = templates::pools(d)?;
    let l = &d.cfg.limits;
    Ok(metrics::Gauges {
        by_state: State::ALL
            .iter()
            .map(|s| (s.as_str(), u.by_state.get(s.as_str()).copied().unwrap_or(0)))
            .collect(),
        pools: pools
            .into_iter()
            .map(|p| (p.template, u64::from(p.target), p.ready))
            .collect(),
        host_memory: (
            admission::meminfo_kib("MemTotal").unwrap_or(0) * 1024,
            admission::meminfo_kib("MemAvailable").unwrap_or(0) * 1024,
        ),
        reserved: (u.memory_mib << 20, u.vcpus),
        budget: (l.memory_budget_mib() << 20, l.vcpu_budget()),
        frozen: super::freeze::frozen_count(d),
    })
}

async fn metrics_text(AxState(d): D) -> Res<impl IntoResponse> {
    let text = d.metrics.render(&gauges(&d)?);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text))
}

async fn stats(AxState(d): D) -> Res<impl IntoResponse> {
    let u = d.db(|db| db.usage())?;
    Ok(Json(serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "usage": u,
        "limits": d.cfg.limits,
        "memory_budget_mib": d.cfg.limits.memory_budget_mib(),
        "vcpu_budget": d.cfg.limits.vcpu_budget(),
        "host": {
            "memory_total_mib": admission::meminfo_kib("MemTotal").unwrap_or(0) / 1024,
            "memory_available_mib": admission::available_mib(),
            "cpus": d.cfg.limits.host_cpus,
            "load1": std::fs::read_to_string("/proc/loadavg").ok()
                .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<f64>().ok())),
        },
        "pools": templates::pools(&d)?,
    })))
}

async fn events(AxState(d): D, RawQuery(q): RawQuery) -> Res<impl IntoResponse> {
    let q = query(&q)?;
    let num = |k: &str, dflt: i64| -> Res<i64> {
        q.get(k).map_or(Ok(dflt), |v| {
            v.parse()
                .map_err(|_| ApiError::BadRequest(format!("{k}={v}: expected a number")))
        })
    };
    let (since, limit) = (num("since", 0)?, num("limit", 1000)?.clamp(1, 10_000));
    let subject = q.get("sandbox").cloned();
    Ok(Json(d.db(|db| {
        db.events(since, subject.as_deref(), limit as u32)
    })?))
}

async fn count_status(AxState(d): D, req: Request, next: Next) -> Response {
    let r = next.run(req).await;
    d.metrics.response(r.status().as_u16());
    r
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route (see GET /openapi.json)".into())
}

/// The API router (on TCP, `token` is required as a bearer token).
pub fn router(d: Arc<Daemon>, token: Option<String>) -> Router {
    let sb = "/v1/sandboxes/{id}";
    let r = Router::new()
        .route("/openapi.json", get(|| async { Json(openapi::document()) }))
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({"ok": true})) }),
        )
        .route("/metrics", get(metrics_text))
        .route("/v1/stats", get(stats))
        .route("/v1/events", get(events))
        .route("/v1/sandboxes", post(create).get(list))
        .route(sb, get(get_one).delete(kill))
        .route(&format!("{sb}/exec"), post(exec_once))
        .route(&format!("{sb}/exec/stream"), post(exec_stream))
        .route(
            &format!("{sb}/files"),
            put(upload).get(download).delete(remove),
        )
        .route(&format!("{sb}/files/stat"), get(stat))
        .route(&format!("{sb}/files/list"), get(ls))
        .route(&format!("{sb}/snapshot"), post(snapshot))
        .route(&format!("{sb}/pause"), post(pause))
        .route(&format!("{sb}/resume"), post(resume))
        .route("/v1/templates", post(tpl_create).get(tpl_list))
        .route("/v1/templates/{name}", get(tpl_get).delete(tpl_delete))
        .route("/v1/pools", get(pool_list))
        .route("/v1/pools/{template}", put(pool_set).delete(pool_delete))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async {
            ApiError::BadRequest("method not allowed on this route (see GET /openapi.json)".into())
        })
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(d.clone(), count_status))
        .with_state(d);
    match token {
        None => r,
        Some(t) => r.layer(middleware::from_fn(move |req: Request, next: Next| {
            let want = format!("Bearer {t}");
            async move {
                let ok = req.uri().path() == "/healthz"
                    || req
                        .headers()
                        .get(header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| constant_eq(v.as_bytes(), want.as_bytes()));
                if ok {
                    next.run(req).await
                } else {
                    ApiError::Unauthorized("missing or wrong 'Authorization: Bearer TOKEN'".into())
                        .into_response()
                }
            }
        })),
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing() {
        let q = query(&Some("path=%2Ftmp%2Fa+b&recursive".into())).unwrap();
        assert_eq!(q["path"], "/tmp/a b");
        assert!(flag(&q, "recursive").unwrap());
        assert!(query(&Some("path=%zz".into())).is_err());
        assert!(query(&Some("path=%2".into())).is_err());
    }

    #[test]
    fn request_bodies_are_documented() {
        let doc = openapi::document();
        let sandbox = ops::CreateSandbox {
            template: Some("t".into()),
            image: Some("tiny".into()),
            vcpus: Some(1),
            memory_mib: Some(128),
            layers: vec!["/kit.img".into()],
            upper_size_mib: Some(8),
            upper_disk_mib: Some(64),
            ..Default::default()
        };
        let template = CreateTemplate {
            name: "t".into(),
            image: "tiny".into(),
            vcpus: Some(1),
            memory_mib: Some(128),
            layers: vec!["/kit.img".into()],
            upper_size_mib: Some(8),
            upper_disk_mib: Some(64),
        };
        for (schema, v) in [
            ("CreateSandbox", serde_json::to_value(&sandbox).unwrap()),
            ("CreateTemplate", serde_json::to_value(&template).unwrap()),
        ] {
            let props = &doc["components"]["schemas"][schema]["properties"];
            for k in v.as_object().unwrap().keys() {
                assert!(props[k].is_object(), "{schema}.{k} is not documented");
            }
        }
        let t = &doc["components"]["schemas"]["Template"]["properties"];
        for k in ["layers", "upper_size_mib", "upper_disk_mib"] {
            assert!(t[k].is_object(), "Template.{k} is not documented");
        }
    }

    #[test]
    fn every_route_is_documented() {
        let doc = openapi::document();
        for (m, p) in ROUTES {
            assert!(
                doc["paths"][p][m].is_object(),
                "{m} {p} is missing from the OpenAPI document"
            );
        }
        let n: usize = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_object().unwrap().len())
            .sum();
        assert_eq!(
            n,
            ROUTES.len(),
            "the document lists routes that do not exist"
        );
    }
}
