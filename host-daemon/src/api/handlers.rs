//! The route handlers, each with its OpenAPI operation
//! (`#[utoipa::path]`): the route table (`api::routes`) registers them in
//! the router and in the document at once. Bodies and queries
//! are parsed here (not by extractors) so that a bad one gets a clear
//! 400; the documented types are the ones parsed.

use super::wire::{
    flag, json_body, octal, path_arg, query, AdmissionErrors, Caller, Errors, Res, D,
};
use crate::db::{Filter, State};
use crate::{
    admission, commands, exec, inputs, lifecycle, metrics, ops, template_names, templates,
    ApiError, Daemon,
};
use agent_client::UploadOptions;
use axum::body::Body;
use axum::extract::State as AxState;
use axum::extract::{Path, RawQuery};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use shoal_api::{
    Command, CreateSandbox, CreateTemplate, DirEntry, Event, EventQuery, ExecEvent, ExecRequest,
    ExecResult, FileQuery, FileStat, Health, HostStats, ListFilter, MkdirQuery, Pool, RemoveQuery,
    RenameRequest, Sandbox, SetPool, SignalCommand, SnapshotRequest, Stats, StdinQuery, Template,
    UpdateSandbox, UploadQuery, Uploaded, WaitQuery,
};

/// Liveness (no token needed on TCP).
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, description = "The daemon answers", body = Health)))]
pub(super) async fn healthz() -> Json<Health> {
    Json(Health { ok: true })
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Metrics", body = String,
        content_type = "text/plain; version=0.0.4"), Errors))]
pub(super) async fn metrics_text(AxState(d): D) -> Res<impl IntoResponse> {
    let mut text = d.metrics.render(&gauges(&d)?);
    text.push_str(&crate::net::render_metrics(&d).await);
    text.push_str(&crate::balloon::render_metrics(&d));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text))
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
        frozen: crate::freeze::frozen_count(d),
        stock: (
            d.stock.len() as u64,
            d.stock.hits.load(std::sync::atomic::Ordering::Relaxed),
            d.stock.misses.load(std::sync::atomic::Ordering::Relaxed),
            d.stock.dead.load(std::sync::atomic::Ordering::Relaxed),
        ),
        by_priority: {
            let counts = d.db(|db| db.by_priority())?;
            shoal_api::Priority::ALL
                .iter()
                .map(|p| {
                    let n = counts
                        .iter()
                        .find(|(s, _)| s == p.as_str())
                        .map_or(0, |c| c.1);
                    (p.as_str(), n)
                })
                .collect()
        },
        smt_isolation: {
            let c = shoal_runtime::sched::core_sched();
            (c.isolates(), c.code())
        },
    })
}

/// Usage, limits, host memory and pools.
#[utoipa::path(get, path = "/v1/stats", tag = "meta",
    responses((status = 200, description = "Stats", body = Stats), Errors))]
pub(super) async fn stats(AxState(d): D) -> Res<Json<Stats>> {
    let u = d.db(|db| db.usage())?;
    let l = &d.cfg.limits;
    Ok(Json(Stats {
        version: env!("CARGO_PKG_VERSION").into(),
        usage: u,
        limits: l.clone(),
        memory_budget_mib: l.memory_budget_mib(),
        vcpu_budget: l.vcpu_budget(),
        host: HostStats {
            memory_total_mib: admission::meminfo_kib("MemTotal").unwrap_or(0) / 1024,
            memory_available_mib: admission::available_mib(),
            cpus: l.host_cpus,
            load1: std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| {
                s.split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
            }),
        },
        pools: templates::pools(&d)?,
    }))
}

/// Event log (create, kill, failure, pause, ...).
#[utoipa::path(get, path = "/v1/events", tag = "meta", params(EventQuery),
    responses((status = 200, description = "Events, oldest first", body = Vec<Event>), Errors))]
pub(super) async fn events(AxState(d): D, RawQuery(q): RawQuery) -> Res<Json<Vec<Event>>> {
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
        db.events(
            since,
            subject.as_deref(),
            u32::try_from(limit).unwrap_or(10_000),
        )
    })?))
}

/// Create a sandbox.
///
/// From a template or an image (restored, from a warm pool when there is
/// one). 429/503 when the host is full.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", request_body = CreateSandbox,
    responses((status = 201, description = "Created (running)", body = Sandbox), AdmissionErrors))]
pub(super) async fn create(AxState(d): D, b: Body) -> Res<impl IntoResponse> {
    let req: CreateSandbox = json_body(b, d.cfg.http.max_json_body).await?;
    inputs::check_map(&req.metadata, &inputs::METADATA)?;
    inputs::check_map(&req.env, &inputs::ENV)?;
    if req.image.is_some() {
        let mem = req.memory_mib.unwrap_or(128);
        inputs::check_servable(&d.cfg.limits, req.vcpus.unwrap_or(1), mem)?;
        inputs::check_disk_servable(&d.cfg.limits, mem, req.upper_disk_mib)?;
    }
    Ok((StatusCode::CREATED, Json(lifecycle::create(&d, req).await?)))
}

/// List sandboxes.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", params(ListFilter),
    responses((status = 200, description = "Sandboxes", body = Vec<Sandbox>), Errors))]
pub(super) async fn list(AxState(d): D, RawQuery(q): RawQuery) -> Res<Json<Vec<Sandbox>>> {
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
    Ok(Json(rows.into_iter().map(Sandbox::from).collect()))
}

/// Get a sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The sandbox", body = Sandbox), Errors))]
pub(super) async fn get_one(AxState(d): D, Path(id): Path<String>) -> Res<Json<Sandbox>> {
    Ok(Json(Sandbox::from(ops::row(&d, &id)?)))
}

/// Kill a sandbox and remove everything it had.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 204, description = "Removed"), Errors))]
pub(super) async fn kill(AxState(d): D, Path(id): Path<String>) -> Res<StatusCode> {
    ops::row(&d, &id)?;
    ops::kill(&d, &id, "deleted through the API").await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Set a sandbox's TTL (from now), idle timeout and CPU class.
///
/// Each field is optional; `ttl_s` counts from this call (the sandbox is
/// killed that many seconds from now; 0: never). Kept across restarts.
/// A new `priority` applies at once to a running sandbox's VMM (its reply
/// then has `smt_isolation` and `warnings`).
#[utoipa::path(patch, path = "/v1/sandboxes/{id}", tag = "sandboxes", request_body = UpdateSandbox,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The sandbox", body = Sandbox), Errors))]
pub(super) async fn update(AxState(d): D, Path(id): Path<String>, b: Body) -> Res<Json<Sandbox>> {
    let req: UpdateSandbox = json_body(b, d.cfg.http.max_json_body).await?;
    if let Some(p) = req.priority {
        crate::cpu_class::set_priority(&d, &id, p).await?;
    }
    let mut v = lifecycle::update_limits(&d, &id, req)?;
    if req.priority.is_some() {
        crate::cpu_class::annotate(&d, &mut v);
    }
    Ok(Json(v))
}

/// Run a command and return its output when it exits.
///
/// A paused sandbox is resumed first.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "exec", request_body = ExecRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The command exited", body = ExecResult), AdmissionErrors))]
pub(super) async fn exec_once(
    AxState(d): D,
    Path(id): Path<String>,
    b: Body,
) -> Res<Json<ExecResult>> {
    let req: ExecRequest = json_body(b, d.cfg.http.max_json_body).await?;
    inputs::check_map(&req.env, &inputs::ENV)?;
    Ok(Json(exec::exec(&d, &id, req).await?))
}

/// Run a command, streaming its output.
///
/// Newline-delimited JSON events: `start` {pid, exec_id}, `stdout` and
/// `stderr` {data, encoding: utf8|base64}, then `exit` {exit_code, signal,
/// timed_out} or `error` {message}.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec/stream", tag = "exec", request_body = ExecRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "One ExecEvent per line", body = ExecEvent,
        content_type = "application/x-ndjson"), AdmissionErrors))]
pub(super) async fn exec_stream(
    AxState(d): D,
    Path(id): Path<String>,
    b: Body,
) -> Res<impl IntoResponse> {
    let req: ExecRequest = json_body(b, d.cfg.http.max_json_body).await?;
    inputs::check_map(&req.env, &inputs::ENV)?;
    let s = exec::exec_stream(&d, &id, req).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], s))
}

/// Upload a file (the raw request body, streamed).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files", request_body = Vec<u8>,
    params(("id" = String, Path, description = "Sandbox id"), UploadQuery),
    responses((status = 201, description = "Written", body = Uploaded), AdmissionErrors))]
pub(super) async fn upload(
    AxState(d): D,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    b: Body,
) -> Res<impl IntoResponse> {
    let q = query(&q)?;
    let path = path_arg(&q)?;
    let mode = octal(&q, 0o644)?;
    let opts = UploadOptions {
        mode,
        append: flag(&q, "append")?,
        create_parents: flag(&q, "parents")?,
    };
    let max = d.cfg.http.max_upload;
    let (b, seen) = super::wire::capped_body(b, max)?;
    match exec::upload(&d, &id, path, opts, b).await {
        Ok(bytes) => Ok((StatusCode::CREATED, Json(Uploaded { bytes }))),
        Err(_) if seen.load(std::sync::atomic::Ordering::Relaxed) > max => {
            Err(super::wire::upload_too_large(max))
        }
        Err(e) => Err(e),
    }
}

/// Download a file (streamed raw body).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, description = "The file's bytes", body = Vec<u8>,
        headers(("x-file-size" = u64, description = "The file's size"))), AdmissionErrors))]
pub(super) async fn download(
    AxState(d): D,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Res<Response> {
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

/// Remove a file or directory.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), RemoveQuery),
    responses((status = 204, description = "Removed"), AdmissionErrors))]
pub(super) async fn remove(
    AxState(d): D,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Res<StatusCode> {
    let q = query(&q)?;
    exec::remove(&d, &id, path_arg(&q)?, flag(&q, "recursive")?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A file's type, mode, size and mtime.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, description = "Its metadata", body = FileStat), AdmissionErrors))]
pub(super) async fn stat(
    AxState(d): D,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Res<Json<FileStat>> {
    Ok(Json(exec::stat(&d, &id, path_arg(&query(&q)?)?).await?))
}

/// A directory's entries.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, description = "Entries by name", body = Vec<DirEntry>), AdmissionErrors))]
pub(super) async fn ls(
    AxState(d): D,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Res<Json<Vec<DirEntry>>> {
    Ok(Json(exec::list(&d, &id, path_arg(&query(&q)?)?).await?))
}

/// Make a directory (`mkdir -p` with `parents`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), MkdirQuery),
    responses((status = 204, description = "Made"), AdmissionErrors))]
pub(super) async fn mkdir(
    AxState(d): D,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Res<StatusCode> {
    let q = query(&q)?;
    let mode = octal(&q, 0o755)?;
    exec::mkdir(&d, &id, path_arg(&q)?, mode, flag(&q, "parents")?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Rename a file or directory (rename(2): an existing `to` is replaced).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/rename", tag = "files",
    request_body = RenameRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 204, description = "Renamed"), AdmissionErrors))]
pub(super) async fn rename(AxState(d): D, Path(id): Path<String>, b: Body) -> Res<StatusCode> {
    let req: RenameRequest = json_body(b, d.cfg.http.max_json_body).await?;
    exec::rename(&d, &id, req.from, req.to).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Snapshot a running sandbox into a new template (the sandbox goes on).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshot", tag = "sandboxes",
    request_body = SnapshotRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 201, description = "The new template (ready)", body = Template), AdmissionErrors))]
pub(super) async fn snapshot(
    AxState(d): D,
    Caller(who): Caller,
    Path(id): Path<String>,
    b: Body,
) -> Res<impl IntoResponse> {
    let req: SnapshotRequest = json_body(b, d.cfg.http.max_json_body).await?;
    if let Some(n) = &req.template {
        template_names::check_snapshot_name(n)?;
    }
    let t = lifecycle::snapshot(&d, &id, req, &who).await?;
    Ok((StatusCode::CREATED, Json(Template::from(t))))
}

/// Pause: state to disk, the VMM process ends.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "Paused", body = Sandbox), Errors))]
pub(super) async fn pause(AxState(d): D, Path(id): Path<String>) -> Res<Json<Sandbox>> {
    ops::row(&d, &id)?;
    Ok(Json(lifecycle::pause(&d, &id).await?))
}

/// Resume a paused sandbox (any exec or file request also does).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "Running", body = Sandbox), AdmissionErrors))]
pub(super) async fn resume(AxState(d): D, Path(id): Path<String>) -> Res<Json<Sandbox>> {
    ops::row(&d, &id)?;
    Ok(Json(lifecycle::resume(&d, &id).await?))
}

/// Register a template.
///
/// An image, with optional further read-only layers and a choice of upper
/// layer (tmpfs of a size, or a scratch disk per sandbox), booted once and
/// snapshotted (built in the background; poll GET).
#[utoipa::path(post, path = "/v1/templates", tag = "templates", request_body = CreateTemplate,
    responses((status = 202, description = "Registered (building)", body = Template), Errors))]
pub(super) async fn tpl_create(
    AxState(d): D,
    Caller(who): Caller,
    b: Body,
) -> Res<impl IntoResponse> {
    let req: CreateTemplate = json_body(b, d.cfg.http.max_json_body).await?;
    // Another kind than the default (`vm`): its own checks, the same
    // registration and build.
    let t = match crate::vm_templates::other_kind(&d, req.kind.as_deref())? {
        Some(kind) => {
            let disk = crate::vm_disk::checked(&d, &req, kind).await?;
            crate::vm_templates::create(&d, req, kind, &who, disk)?
        }
        None => {
            crate::vm_disk::refuse(&req)?;
            templates::create_template(&d, req, &who).await?
        }
    };
    Ok((StatusCode::ACCEPTED, Json(Template::from(t))))
}

/// List templates.
#[utoipa::path(get, path = "/v1/templates", tag = "templates",
    responses((status = 200, description = "Templates by name", body = Vec<Template>), Errors))]
pub(super) async fn tpl_list(AxState(d): D) -> Res<Json<Vec<Template>>> {
    let rows = d.db(|db| db.templates())?;
    Ok(Json(rows.into_iter().map(Template::from).collect()))
}

/// Get a template (state building, ready or failed).
#[utoipa::path(get, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses((status = 200, description = "The template", body = Template), Errors))]
pub(super) async fn tpl_get(AxState(d): D, Path(n): Path<String>) -> Res<Json<Template>> {
    d.db(|db| db.template(&n))?
        .map(|t| Json(Template::from(t)))
        .ok_or_else(|| ApiError::NotFound(format!("no template '{n}'")))
}

/// Delete a template and its pool.
#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses((status = 204, description = "Removed"), Errors))]
pub(super) async fn tpl_delete(
    AxState(d): D,
    Caller(who): Caller,
    Path(n): Path<String>,
) -> Res<StatusCode> {
    templates::delete_template(&d, &n, &who).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Warm pools: target and ready sizes.
#[utoipa::path(get, path = "/v1/pools", tag = "pools",
    responses((status = 200, description = "Pools", body = Vec<Pool>), Errors))]
pub(super) async fn pool_list(AxState(d): D) -> Res<Json<Vec<Pool>>> {
    Ok(Json(templates::pools(&d)?))
}

/// Set a warm pool's target size (refilled in the background).
#[utoipa::path(put, path = "/v1/pools/{template}", tag = "pools", request_body = SetPool,
    params(("template" = String, Path, description = "Template name")),
    responses((status = 200, description = "The pool", body = Pool), Errors))]
pub(super) async fn pool_set(
    AxState(d): D,
    Caller(who): Caller,
    Path(t): Path<String>,
    b: Body,
) -> Res<Json<Pool>> {
    let req: SetPool = json_body(b, d.cfg.http.max_json_body).await?;
    Ok(Json(templates::set_pool(&d, &t, req, &who).await?))
}

/// Remove a pool and its warm sandboxes.
#[utoipa::path(delete, path = "/v1/pools/{template}", tag = "pools",
    params(("template" = String, Path, description = "Template name")),
    responses((status = 204, description = "Removed"), Errors))]
pub(super) async fn pool_delete(
    AxState(d): D,
    Caller(who): Caller,
    Path(t): Path<String>,
) -> Res<StatusCode> {
    templates::set_pool(&d, &t, SetPool { target: 0 }, &who).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Start a background command.
///
/// The body is an exec request; `stdin_open` keeps its standard input
/// open for `POST .../stdin`. A paused sandbox is resumed first. The
/// command runs on after this answers; its output is kept (the first MiB
/// of each stream and the latest MiB past it, by default) for streams
/// and waits from any connection.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands", tag = "exec", request_body = ExecRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 201, description = "Started (running)", body = Command), AdmissionErrors))]
pub(super) async fn cmd_start(
    AxState(d): D,
    Path(id): Path<String>,
    b: Body,
) -> Res<impl IntoResponse> {
    let req: ExecRequest = json_body(b, d.cfg.http.max_json_body).await?;
    inputs::check_map(&req.env, &inputs::ENV)?;
    Ok((
        StatusCode::CREATED,
        Json(commands::start(&d, &id, req).await?),
    ))
}

/// List the sandbox's background commands (running, and the finished
/// ones it still remembers), oldest first.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "Commands", body = Vec<Command>), Errors))]
pub(super) async fn cmd_list(AxState(d): D, Path(id): Path<String>) -> Res<Json<Vec<Command>>> {
    Ok(Json(commands::list(&d, &id)?))
}

/// A background command.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands/{cid}", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id"),
        ("cid" = String, Path, description = "Command id")),
    responses((status = 200, description = "The command", body = Command), Errors))]
pub(super) async fn cmd_get(
    AxState(d): D,
    Path((id, cid)): Path<(String, String)>,
) -> Res<Json<Command>> {
    Ok(Json(commands::find(&d, &id, &cid)?.view()))
}

/// Stream a background command's output (re-attach).
///
/// Newline-delimited JSON events as `/exec/stream`'s: `start`, the output
/// kept so far, live output, then `exit` (or `error`). From any
/// connection, any number at once; the command is not killed when a
/// stream ends.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands/{cid}/stream", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id"),
        ("cid" = String, Path, description = "Command id")),
    responses((status = 200, description = "One ExecEvent per line", body = ExecEvent,
        content_type = "application/x-ndjson"), AdmissionErrors))]
pub(super) async fn cmd_stream(
    AxState(d): D,
    Path((id, cid)): Path<(String, String)>,
) -> Res<impl IntoResponse> {
    let c = commands::find(&d, &id, &cid)?;
    let s = commands::stream(&d, c).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], s))
}

/// Wait for a background command to end: its result and kept output.
///
/// 504 `deadline_exceeded` when `timeout_s` passes first (the command
/// goes on); 502 `sandbox_error` when the command was lost.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}/wait", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id"),
        ("cid" = String, Path, description = "Command id"), WaitQuery),
    responses((status = 200, description = "The command ended", body = ExecResult), AdmissionErrors))]
pub(super) async fn cmd_wait(
    AxState(d): D,
    Path((id, cid)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Res<Json<ExecResult>> {
    let q = query(&q)?;
    let timeout = match q.get("timeout_s") {
        None => None,
        Some(v) => Some(
            v.parse::<f64>()
                .ok()
                .filter(|t| *t >= 0.0 && *t <= 86_400.0)
                .map(std::time::Duration::from_secs_f64)
                .ok_or_else(|| {
                    ApiError::BadRequest(format!("timeout_s={v}: expected 0 <= seconds <= 86400"))
                })?,
        ),
    };
    let c = commands::find(&d, &id, &cid)?;
    Ok(Json(commands::wait(&d, c, timeout).await?))
}

/// Send a signal to a background command (its process group by default).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}/signal", tag = "exec",
    request_body = SignalCommand,
    params(("id" = String, Path, description = "Sandbox id"),
        ("cid" = String, Path, description = "Command id")),
    responses((status = 204, description = "Sent"), AdmissionErrors))]
pub(super) async fn cmd_signal(
    AxState(d): D,
    Path((id, cid)): Path<(String, String)>,
    b: Body,
) -> Res<StatusCode> {
    let req: SignalCommand = json_body(b, d.cfg.http.max_json_body).await?;
    let c = commands::find(&d, &id, &cid)?;
    commands::signal(&d, c, req).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Write to a background command's stdin (the raw body, streamed).
///
/// The command must have been started with `stdin_open`; `close=true`
/// closes its stdin after the body (an empty body only closes it).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}/stdin", tag = "exec",
    request_body = Vec<u8>,
    params(("id" = String, Path, description = "Sandbox id"),
        ("cid" = String, Path, description = "Command id"), StdinQuery),
    responses((status = 204, description = "Written"), AdmissionErrors))]
pub(super) async fn cmd_stdin(
    AxState(d): D,
    Path((id, cid)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    b: Body,
) -> Res<StatusCode> {
    let close = flag(&query(&q)?, "close")?;
    let c = commands::find(&d, &id, &cid)?;
    commands::stdin(&d, c, b, close).await?;
    Ok(StatusCode::NO_CONTENT)
}
