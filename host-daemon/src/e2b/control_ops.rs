//! E2B control-plane operations on one sandbox: pause, connect and resume,
//! fork, snapshots, metrics, logs, network (its mapping in
//! [`super::network`]).
//!
//! - pause: shoald's pause (state to disk, the VM process ends); the TTL
//!   is cleared, as a paused E2B sandbox does not time out; 409 when
//!   already paused.
//! - connect (v1 and v2): resumes a paused sandbox (201) or answers for a
//!   running one (200); the timeout is set from now (a running sandbox's
//!   is only ever lengthened).
//! - fork: shoald's fork (live clones with their own memory); each clone
//!   gets `timeout` or inherits the source's TTL.
//! - snapshots: a snapshot is a shoald template made from the sandbox
//!   (`snapshotID` = its name, which `Sandbox.create` takes as
//!   templateID); deleted through `DELETE /templates/{id}`.
//! - metrics: from the VMM process on the host (see [`metric`]); logs:
//!   the daemon's events of the sandbox.

use super::control_wire::{self as w, rfc3339, Caller, E, R};
use super::{api_error, error};
use crate::db::{SandboxRow, State};
use crate::{fork, lifecycle, ops, template_names, templates, Daemon};
use axum::body::Body;
use axum::extract::{Path, RawQuery, State as AxState};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_api::{ForkRequest, SnapshotRequest, UpdateSandbox};
use std::sync::Arc;

/// The daemon, as the handlers take it.
pub(super) type D = AxState<Arc<Daemon>>;

/// A sandbox E2B may see: not failed, not pooled (404 otherwise).
pub(super) fn visible(d: &Daemon, id: &str) -> Result<SandboxRow, E> {
    match ops::row(d, id) {
        Ok(r) if w::e2b_state(r.state).is_some() => Ok(r),
        Ok(_) => Err(E::of(error(
            StatusCode::NOT_FOUND,
            format!("sandbox {id} not found"),
        ))),
        Err(crate::ApiError::NotFound(_)) => Err(E::of(error(
            StatusCode::NOT_FOUND,
            format!("sandbox {id} not found"),
        ))),
        Err(e) => Err(E::of(api_error(e))),
    }
}

/// Sets the TTL to `secs` from now.
pub(super) fn set_ttl(d: &Daemon, id: &str, secs: u64) -> Result<(), E> {
    lifecycle::update_limits(
        d,
        id,
        UpdateSandbox {
            ttl_s: Some(secs),
            ..UpdateSandbox::default()
        },
    )
    .map(|_| ())
    .map_err(|e| E::of(api_error(e)))
}

/// `POST /sandboxes/{id}/pause`.
pub async fn pause(AxState(d): D, Path(id): Path<String>) -> R {
    let r = visible(&d, &id)?;
    if matches!(r.state, State::Paused | State::Pausing) {
        return Err(E::of(error(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        )));
    }
    lifecycle::pause(&d, &id)
        .await
        .map_err(|e| E::of(api_error(e)))?;
    set_ttl(&d, &id, 0)?;
    // Resumed by a data-plane request instead of a connect, it gets E2B's
    // default timeout again ([`auto_resumed`]).
    if let Err(e) = std::fs::write(r.dir.join(AUTO_RESUME_FILE), b"") {
        tracing::warn!(sandbox = %id, "e2b: {}: {e}", AUTO_RESUME_FILE);
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Marks `r` as not resumed by traffic ([`w::NO_AUTO_RESUME_FILE`]); a
/// sandbox that cannot be marked is removed and the create fails.
pub(crate) fn no_auto_resume(d: &Arc<Daemon>, r: &SandboxRow) -> Result<(), E> {
    if let Err(e) = std::fs::write(r.dir.join(w::NO_AUTO_RESUME_FILE), b"") {
        let d = d.clone();
        let id = r.id.clone();
        tokio::spawn(async move { crate::ops::kill(&d, &id, "create failed").await });
        return Err(E::of(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("marking the sandbox not auto-resumed: {e}"),
        )));
    }
    Ok(())
}

/// In the directory of a sandbox paused through E2B (whose TTL was then
/// cleared), until it is connected to or resumed by the data plane.
const AUTO_RESUME_FILE: &str = "e2b-paused";

/// A data-plane request for a paused sandbox (which it resumes): a
/// sandbox E2B paused gets E2B's default timeout from now, as a connect
/// without one would give (shoald's own pauses keep their TTL).
pub(crate) fn auto_resumed(d: &Daemon, r: &SandboxRow) {
    let e2b_paused = std::fs::remove_file(r.dir.join(AUTO_RESUME_FILE)).is_ok();
    // Paused at its timeout (`autoPause`): its TTL was cleared.
    let timed_out = r.pause_at_ttl && r.ttl_s == 0;
    if e2b_paused || timed_out {
        if let Err(e) = set_ttl(d, &r.id, w::DEFAULT_TIMEOUT_S) {
            tracing::warn!(sandbox = %r.id, "e2b: timeout on auto-resume: {:?}", e.0.status());
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct ConnectBody {
    timeout: Option<u64>,
}

/// Resumes `id` if paused; sets its timeout (`secs` from now; a running
/// sandbox's is only lengthened). The status says which: 201 resumed, 200
/// already running.
async fn connect(d: &Arc<Daemon>, id: &str, secs: u64) -> R {
    let r = visible(d, id)?;
    let status = if matches!(r.state, State::Paused | State::Pausing) {
        let _ = std::fs::remove_file(r.dir.join(AUTO_RESUME_FILE));
        lifecycle::resume(d, id)
            .await
            .map_err(|e| E::of(api_error(e)))?;
        set_ttl(d, id, secs)?;
        StatusCode::CREATED
    } else {
        if w::end_at(&r) < crate::db::now() + secs as f64 {
            set_ttl(d, id, secs)?;
        }
        StatusCode::OK
    };
    let r = visible(d, id)?;
    Ok((status, Json(w::sandbox(d, &r))).into_response())
}

fn timeout_of(b: &ConnectBody) -> Result<u64, E> {
    match b.timeout {
        None => Ok(w::DEFAULT_TIMEOUT_S),
        Some(0) => Err(E::of(error(
            StatusCode::BAD_REQUEST,
            "timeout must be at least 1 second",
        ))),
        Some(t) => Ok(t),
    }
}

/// `POST /sandboxes/{id}/connect` (SDKs before 2.51).
pub async fn connect_v1(AxState(d): D, Path(id): Path<String>, b: Body) -> R {
    let b: ConnectBody = w::json(b, d.cfg.http.max_json_body).await?;
    let secs = timeout_of(&b)?;
    connect(&d, &id, secs).await
}

/// `POST /v2/sandboxes/{id}/connect`.
pub async fn connect_v2(AxState(d): D, Path(id): Path<String>, b: Body) -> R {
    let b: ConnectBody = w::json(b, d.cfg.http.max_json_body).await?;
    let secs = timeout_of(&b)?;
    connect(&d, &id, secs).await
}

/// `POST /sandboxes/{id}/resume` (legacy): 409 when running.
pub async fn resume(AxState(d): D, Path(id): Path<String>, b: Body) -> R {
    let b: ConnectBody = w::json(b, d.cfg.http.max_json_body).await?;
    let secs = timeout_of(&b)?;
    let r = visible(&d, &id)?;
    if !matches!(r.state, State::Paused | State::Pausing) {
        return Err(E::of(error(
            StatusCode::CONFLICT,
            format!("sandbox {id} can't be resumed: it is already running"),
        )));
    }
    connect(&d, &id, secs).await
}

#[derive(Debug, Default, Deserialize)]
struct ForkBody {
    timeout: Option<u64>,
    count: Option<u32>,
}

/// `POST /sandboxes/{id}/fork`: 201 with one `{"sandbox"}` per clone and
/// one `{"error"}` per clone that could not be made.
pub async fn fork(AxState(d): D, Path(id): Path<String>, b: Body) -> R {
    let b: ForkBody = w::json(b, d.cfg.http.max_json_body).await?;
    visible(&d, &id)?;
    let count = b.count.unwrap_or(1);
    let forked = fork::fork(&d, &id, ForkRequest::new(count))
        .await
        .map_err(|e| E::of(api_error(e)))?;
    let mut out: Vec<Value> = Vec::new();
    for s in &forked.sandboxes {
        if let Some(t) = b.timeout.filter(|&t| t > 0) {
            set_ttl(&d, &s.id, t)?;
        }
        let r = visible(&d, &s.id)?;
        out.push(json!({"sandbox": w::sandbox(&d, &r)}));
    }
    for f in &forked.failed {
        out.push(json!({"error": {"code": f.code.status(), "message": f.message}}));
    }
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

#[derive(Debug, Default, Deserialize)]
struct SnapshotBody {
    name: Option<String>,
}

/// `POST /sandboxes/{id}/snapshots`: 201 `{"snapshotID", "names"}`.
pub async fn snapshot(AxState(d): D, Caller(who): Caller, Path(id): Path<String>, b: Body) -> R {
    let b: SnapshotBody = w::json(b, d.cfg.http.max_json_body).await?;
    visible(&d, &id)?;
    if let Some(n) = &b.name {
        template_names::check_snapshot_name(n).map_err(|e| E::of(api_error(e)))?;
    }
    let t = lifecycle::snapshot(&d, &id, SnapshotRequest { template: b.name }, &who)
        .await
        .map_err(|e| E::of(api_error(e)))?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"snapshotID": t.name, "names": [t.name]})),
    )
        .into_response())
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`: the templates
/// made from sandboxes, oldest first.
pub async fn list_snapshots(AxState(d): D, RawQuery(q): RawQuery) -> R {
    let mut sandbox = None;
    let mut name = None;
    let mut limit = 100usize;
    let mut after = None;
    for (k, v) in w::form(q.as_deref().unwrap_or(""))? {
        match k.as_str() {
            "sandboxID" => sandbox = Some(v),
            "name" => name = Some(v),
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        E::of(error(StatusCode::BAD_REQUEST, "limit: expected 1..=1000"))
                    })?
            }
            "nextToken" => after = Some(v).filter(|v| !v.is_empty()),
            _ => {}
        }
    }
    let mut all: Vec<_> = d
        .db(|db| db.templates())
        .map_err(|e| E::of(api_error(e)))?
        .into_iter()
        .filter(|t| t.source.starts_with("sandbox:"))
        .filter(|t| {
            sandbox
                .as_ref()
                .is_none_or(|s| t.source.strip_prefix("sandbox:") == Some(s.as_str()))
        })
        .filter(|t| name.as_ref().is_none_or(|n| &t.name == n))
        .collect();
    all.sort_by(|a, b| {
        a.created_at
            .total_cmp(&b.created_at)
            .then(a.name.cmp(&b.name))
    });
    let start = after
        .and_then(|a| all.iter().position(|t| t.name == a).map(|i| i + 1))
        .unwrap_or(0);
    let end = (start + limit).min(all.len());
    let page: Vec<Value> = all[start.min(end)..end]
        .iter()
        .map(|t| json!({"snapshotID": t.name, "names": [t.name]}))
        .collect();
    let mut res = Json(page).into_response();
    if end < all.len() {
        if let Ok(v) = axum::http::HeaderValue::from_str(&all[end - 1].name) {
            res.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(res)
}

/// `DELETE /templates/{id}`: deletes a template (a snapshot), if the
/// caller may (its maker or an admin).
pub async fn delete_snapshot(AxState(d): D, Caller(who): Caller, Path(id): Path<String>) -> R {
    templates::delete_template(&d, &id, &who)
        .await
        .map_err(|e| E::of(api_error(e)))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// One `SandboxMetric` of a running sandbox, read from its VMM process on
/// the host: CPU use averaged since the process started (per vCPU),
/// memory as the process's resident set (what the guest has touched, at
/// most its memory), disk as the host blocks the sandbox's directory
/// holds. `None` while it has no VM (paused).
fn metric(r: &SandboxRow) -> Option<Value> {
    let pid = r.pid.filter(|&p| p > 0)?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    // utime, stime, starttime are fields 14, 15, 22 (1-based): 11, 12, 19 here.
    let (ut, st, start) = (num(11)?, num(12)?, num(19)?);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let ran = (uptime - start / hz).max(1e-3);
    let pct = ((ut + st) / hz / ran / f64::from(r.vcpus.max(1)) * 100.0).clamp(0.0, 100.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let mem_total = u64::from(r.memory_mib) << 20;
    let disk_used = dir_blocks(&r.dir);
    let now = crate::db::now();
    Some(json!({
        "timestamp": rfc3339(now),
        "timestampUnix": std::time::Duration::try_from_secs_f64(now).map_or(0, |t| t.as_secs()),
        "cpuCount": r.vcpus,
        "cpuUsedPct": pct,
        "memUsed": (rss_kib << 10).min(mem_total),
        "memTotal": mem_total,
        "memCache": 0,
        "diskUsed": disk_used,
        "diskTotal": disk_used,
    }))
}

/// Bytes of host blocks under `dir` (not following links; a few levels).
fn dir_blocks(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(p: &std::path::Path, depth: u32) -> u64 {
        let Ok(m) = std::fs::symlink_metadata(p) else {
            return 0;
        };
        let mut n = m.blocks() * 512;
        if m.is_dir() && depth < 4 {
            if let Ok(rd) = std::fs::read_dir(p) {
                n += rd
                    .flatten()
                    .take(10_000)
                    .map(|e| walk(&e.path(), depth + 1))
                    .sum::<u64>();
            }
        }
        n
    }
    walk(dir, 0)
}

/// `GET /sandboxes/{id}/metrics`: the current sample (none while paused).
pub async fn metrics_one(AxState(d): D, Path(id): Path<String>) -> R {
    let r = visible(&d, &id)?;
    let v: Vec<Value> = metric(&r).into_iter().collect();
    Ok(Json(v).into_response())
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: `{"sandboxes": {id: metric}}`
/// (at most 100 ids; unknown or paused ones are left out).
pub async fn metrics_many(AxState(d): D, RawQuery(q): RawQuery) -> R {
    let mut out = serde_json::Map::new();
    for (k, v) in w::form(q.as_deref().unwrap_or(""))? {
        if k != "sandbox_ids" {
            continue;
        }
        for id in v.split(',').filter(|s| !s.is_empty()).take(100) {
            if let Some(m) = visible(&d, id).ok().as_ref().and_then(metric) {
                out.insert(id.to_string(), m);
            }
        }
    }
    Ok(Json(json!({ "sandboxes": out })).into_response())
}

fn events(d: &Daemon, id: &str, limit: u32) -> Result<Vec<shoal_api::Event>, E> {
    d.db(|db| db.events(0, Some(id), limit))
        .map_err(|e| E::of(api_error(e)))
}

fn level(kind: &str) -> &'static str {
    if kind.contains("fail") || kind.contains("error") {
        "error"
    } else {
        "info"
    }
}

fn limit_of(q: &[(String, String)]) -> Result<u32, E> {
    q.iter()
        .find(|(k, _)| k == "limit")
        .map_or(Ok(1000), |(_, v)| {
            v.parse::<u32>()
                .ok()
                .filter(|n| (1..=10_000).contains(n))
                .ok_or_else(|| E::of(error(StatusCode::BAD_REQUEST, "limit: expected 1..=10000")))
        })
}

/// `GET /sandboxes/{id}/logs?start=MS&limit=`: the daemon's events of the
/// sandbox as log lines.
pub async fn logs_v1(AxState(d): D, Path(id): Path<String>, RawQuery(q): RawQuery) -> R {
    visible(&d, &id)?;
    let q = w::form(q.as_deref().unwrap_or(""))?;
    let start_ms = q
        .iter()
        .find(|(k, _)| k == "start")
        .and_then(|(_, v)| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let ev = events(&d, &id, limit_of(&q)?)?;
    let ev = ev.iter().filter(|e| e.ts * 1000.0 >= start_ms);
    let (mut logs, mut entries) = (Vec::new(), Vec::new());
    for e in ev {
        let line = format!("{}: {}", e.kind, e.detail);
        logs.push(json!({"timestamp": rfc3339(e.ts), "line": line}));
        entries.push(json!({
            "timestamp": rfc3339(e.ts),
            "message": line,
            "level": level(&e.kind),
            "fields": {"event": e.kind},
        }));
    }
    Ok(Json(json!({"logs": logs, "logEntries": entries})).into_response())
}

/// `GET /v2/sandboxes/{id}/logs?cursor=MS&limit=&direction=&level=&search=`.
pub async fn logs_v2(AxState(d): D, Path(id): Path<String>, RawQuery(q): RawQuery) -> R {
    visible(&d, &id)?;
    let q = w::form(q.as_deref().unwrap_or(""))?;
    let get = |k: &str| q.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
    let cursor = get("cursor").and_then(|v| v.parse::<f64>().ok());
    let backward = get("direction") == Some("backward");
    let want_level = get("level");
    let search = get("search");
    let mut ev = events(&d, &id, 10_000)?;
    if backward {
        ev.reverse();
    }
    let limit = limit_of(&q)? as usize;
    let logs: Vec<Value> = ev
        .iter()
        .filter(|e| {
            cursor.is_none_or(|c| {
                if backward {
                    e.ts * 1000.0 <= c
                } else {
                    e.ts * 1000.0 >= c
                }
            })
        })
        .filter(|e| want_level.is_none_or(|l| level(&e.kind) == l))
        .filter(|e| search.is_none_or(|s| e.detail.contains(s) || e.kind.contains(s)))
        .take(limit)
        .map(|e| {
            json!({
                "timestamp": rfc3339(e.ts),
                "message": format!("{}: {}", e.kind, e.detail),
                "level": level(&e.kind),
                "fields": {"event": e.kind},
            })
        })
        .collect();
    Ok(Json(json!({ "logs": logs })).into_response())
}

/// `PUT /sandboxes/{id}/network`: the sandbox's egress becomes the body's
/// (the whole configuration, as on E2B; mapped as a create's,
/// [`super::network`]), in force at once: 204; 404 for a sandbox not
/// found, 409 for one without a network (it cannot get one later) or
/// paused (as E2B answers for a sandbox not running).
pub async fn network(AxState(d): D, Path(id): Path<String>, b: Body) -> R {
    let v: Value = w::json(b, d.cfg.http.max_json_body).await?;
    let r = visible(&d, &id)?;
    let spec =
        super::network::update_spec(&v).map_err(|m| E::of(error(StatusCode::BAD_REQUEST, m)))?;
    if r.net.is_none() {
        return Err(E::of(error(
            StatusCode::CONFLICT,
            format!(
                "sandbox {id} has no network: it was created without network rules (or \
                 internet access, see shoald --e2b-internet), and one cannot be added later"
            ),
        )));
    }
    if matches!(r.state, State::Paused | State::Pausing) {
        return Err(E::of(error(
            StatusCode::CONFLICT,
            format!("sandbox {id} is paused: connect to it before changing its network"),
        )));
    }
    let spec = super::network::fit(&d, spec);
    crate::net::set_network(&d, &id, spec)
        .await
        .map_err(|e| E::of(api_error(e)))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
