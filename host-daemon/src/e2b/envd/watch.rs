//! Directory watching (`WatchDir`, and the polling `CreateWatcher` /
//! `GetWatcherEvents` / `RemoveWatcher`) by polling the guest's directory
//! from the host: each look lists it (recursively if asked) and compares
//! with the last look. A change undone between two looks (a file made and
//! removed) is not seen, and a rename shows as a remove and a create.

use super::connect::{self, Code, RpcError};
use super::{users, Guest};
use agent_client::{AsyncClient, FileType};
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::Response;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The most entries one look takes in.
const MAX_WATCHED: usize = 10_000;
/// The most events kept for a polling watcher between two reads.
const MAX_PENDING: usize = 10_000;
/// The most polling watchers the daemon keeps (all sandboxes).
const MAX_WATCHERS: usize = 1024;
/// How often a `WatchDir` stream looks.
const POLL: Duration = Duration::from_millis(250);

/// What a look notes of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub dir: bool,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
}

/// One look: entries by path relative to the watched directory.
pub(crate) type Look = BTreeMap<String, Seen>;

/// The events between two looks, as (relative name, event type).
pub(crate) fn diff(old: &Look, new: &Look) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for (k, o) in old {
        match new.get(k) {
            None => out.push((k.clone(), "EVENT_TYPE_REMOVE")),
            Some(n) if n.dir != o.dir => {
                out.push((k.clone(), "EVENT_TYPE_REMOVE"));
                out.push((k.clone(), "EVENT_TYPE_CREATE"));
            }
            Some(n) => {
                if !n.dir && (n.size != o.size || n.mtime_ns != o.mtime_ns) {
                    out.push((k.clone(), "EVENT_TYPE_WRITE"));
                }
                if n.mode != o.mode {
                    out.push((k.clone(), "EVENT_TYPE_CHMOD"));
                }
            }
        }
    }
    for k in new.keys() {
        if !old.contains_key(k) {
            out.push((k.clone(), "EVENT_TYPE_CREATE"));
        }
    }
    out
}

/// Looks at `dir` (and below it with `recursive`).
async fn look(c: &AsyncClient, dir: &str, recursive: bool) -> Result<Look, RpcError> {
    let api = |e| RpcError::from(crate::ApiError::from(e));
    let st = c.stat(dir).await.map_err(api)?;
    if st.file_type != FileType::Dir {
        return Err(RpcError::invalid(format!("path {dir} is not a directory")));
    }
    let mut out = Look::new();
    let mut todo = vec![String::new()];
    while let Some(rel) = todo.pop() {
        let abs = if rel.is_empty() {
            dir.to_string()
        } else {
            format!("{}/{rel}", dir.trim_end_matches('/'))
        };
        let names = match c.list_dir(&abs).await {
            Ok(v) => v,
            Err(_) if !rel.is_empty() => continue,
            Err(e) => return Err(api(e)),
        };
        for e in names {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            if name == "." || name == ".." {
                continue;
            }
            if out.len() >= MAX_WATCHED {
                return Err(RpcError::new(
                    Code::ResourceExhausted,
                    format!("more than {MAX_WATCHED} entries under {dir}"),
                ));
            }
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let p = format!("{}/{r}", dir.trim_end_matches('/'));
            let Ok(st) = c.lstat(&p).await else {
                continue;
            };
            let dir_entry = st.file_type == FileType::Dir;
            if dir_entry && recursive {
                todo.push(r.clone());
            }
            out.insert(
                r,
                Seen {
                    dir: dir_entry,
                    mode: st.mode,
                    size: st.size,
                    mtime_ns: st.mtime_ns,
                },
            );
        }
    }
    Ok(out)
}

/// A polling watcher.
struct Watcher {
    sandbox: String,
    dir: String,
    recursive: bool,
    last: Look,
}

fn watchers() -> &'static Mutex<HashMap<String, Arc<tokio::sync::Mutex<Watcher>>>> {
    static W: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<Watcher>>>>> = OnceLock::new();
    W.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The watched directory of a request, made absolute for its user.
async fn target(
    g: &Guest,
    c: &AsyncClient,
    m: &Value,
    h: &axum::http::HeaderMap,
) -> Result<(String, bool), RpcError> {
    let asked = users::basic_user(h)?;
    let user = g.user(c, asked.as_deref()).await?;
    let p = m["path"]
        .as_str()
        .ok_or_else(|| RpcError::invalid("path: expected a path"))?;
    Ok((
        users::absolute(p, &user)?,
        m["recursive"].as_bool().unwrap_or(false),
    ))
}

fn event_json(name: &str, t: &str) -> Value {
    json!({"name": name, "type": t})
}

/// `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`.
pub(super) async fn polling(
    g: &Guest,
    method: &str,
    m: &Value,
    h: &axum::http::HeaderMap,
) -> Result<Value, RpcError> {
    match method {
        "CreateWatcher" => {
            let (c, _busy) = g.client().await?;
            let (dir, recursive) = target(g, &c, m, h).await?;
            let last = look(&c, &dir, recursive).await?;
            let id = shoal_runtime::fresh::random_id();
            let mut all = lock(watchers());
            // Watchers of sandboxes that are gone go first.
            all.retain(|_, w| {
                w.try_lock()
                    .map_or(true, |w| g.d.live(&w.sandbox).is_some())
            });
            if all.len() >= MAX_WATCHERS {
                return Err(RpcError::new(
                    Code::ResourceExhausted,
                    format!("at most {MAX_WATCHERS} watchers"),
                ));
            }
            let w = Watcher {
                sandbox: g.id.clone(),
                dir,
                recursive,
                last,
            };
            all.insert(id.clone(), Arc::new(tokio::sync::Mutex::new(w)));
            Ok(json!({"watcherId": id}))
        }
        "GetWatcherEvents" | "RemoveWatcher" => {
            let id = m["watcherId"].as_str().unwrap_or_default();
            let w = lock(watchers()).get(id).cloned();
            let w = w
                .filter(|_| !id.is_empty())
                .ok_or_else(|| RpcError::new(Code::NotFound, format!("watcher {id} not found")))?;
            if method == "RemoveWatcher" {
                lock(watchers()).remove(id);
                return Ok(json!({}));
            }
            let mut w = w.lock().await;
            if w.sandbox != g.id {
                return Err(RpcError::new(
                    Code::NotFound,
                    format!("watcher {id} not found"),
                ));
            }
            let (c, _busy) = g.client().await?;
            let now = look(&c, &w.dir, w.recursive).await?;
            let mut evs: Vec<Value> = diff(&w.last, &now)
                .iter()
                .map(|(n, t)| event_json(n, t))
                .collect();
            evs.truncate(MAX_PENDING);
            w.last = now;
            Ok(json!({"events": evs}))
        }
        _ => Err(RpcError::new(
            Code::Unimplemented,
            format!("no method {method}"),
        )),
    }
}

/// `WatchDir`: `start`, then the events of each look, keepalives, until
/// the client leaves, the call's deadline or the sandbox goes.
pub(super) async fn watch_dir(g: &Guest, req: Request) -> Result<Response, RpcError> {
    let h = req.headers().clone();
    let limit = connect::timeout(&h)?;
    let body = connect::read_body(req.into_body(), 1 << 20, g.op_timeout()).await?;
    let m = connect::single_message(&body)?;
    let (c, _busy) = g.client().await?;
    let (dir, recursive) = target(g, &c, &m, &h).await?;
    let first = look(&c, &dir, recursive).await?;
    let every = connect::keepalive(&h);
    let end = limit.map(|l| tokio::time::Instant::now() + l);
    let g2 = g.clone();
    let msg = |v: Value| connect::message(&v);
    let start = msg(json!({"start": {}}));
    let state = Some((first, tokio::time::Instant::now()));
    let rest = futures_util::stream::unfold(state, move |st| {
        let (g, dir) = (g2.clone(), dir.clone());
        async move {
            let (last, mut ping) = st?;
            if end.is_some_and(|e| tokio::time::Instant::now() >= e) {
                return Some((connect::end_of_stream(None), None));
            }
            tokio::time::sleep(POLL).await;
            let now = match g.client().await {
                Ok((c, _busy)) => look(&c, &dir, recursive).await,
                Err(e) => Err(e),
            };
            let now = match now {
                Ok(n) => n,
                Err(e) => return Some((connect::end_of_stream(Some(&e)), None)),
            };
            let mut out: Vec<u8> = Vec::new();
            for (n, t) in diff(&last, &now) {
                out.extend_from_slice(&msg(json!({"filesystem": event_json(&n, t)})));
            }
            if out.is_empty() && ping.elapsed() >= every {
                out.extend_from_slice(&msg(json!({"keepalive": {}})));
            }
            if !out.is_empty() {
                ping = tokio::time::Instant::now();
            }
            Some((Bytes::from(out), Some((now, ping))))
        }
    });
    use futures_util::StreamExt;
    let all = futures_util::stream::once(async move { start })
        .chain(rest)
        .map(Ok::<_, std::convert::Infallible>);
    Ok(connect::stream_response(Body::from_stream(all)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(size: u64, mode: u32) -> Seen {
        Seen {
            dir: false,
            mode,
            size,
            mtime_ns: 1,
        }
    }

    #[test]
    fn looks_differ_by_creates_writes_removes_and_chmods() {
        let mut a = Look::new();
        a.insert("gone".into(), seen(1, 0o644));
        a.insert("same".into(), seen(1, 0o644));
        a.insert("grown".into(), seen(1, 0o644));
        a.insert("chmod".into(), seen(1, 0o644));
        let mut b = a.clone();
        b.remove("gone");
        b.insert("grown".into(), seen(2, 0o644));
        b.insert("chmod".into(), seen(1, 0o600));
        b.insert("new".into(), seen(0, 0o644));
        let d = diff(&a, &b);
        assert_eq!(
            d,
            [
                ("chmod".to_string(), "EVENT_TYPE_CHMOD"),
                ("gone".to_string(), "EVENT_TYPE_REMOVE"),
                ("grown".to_string(), "EVENT_TYPE_WRITE"),
                ("new".to_string(), "EVENT_TYPE_CREATE"),
            ]
        );
        assert!(diff(&b, &b).is_empty());
    }
}
