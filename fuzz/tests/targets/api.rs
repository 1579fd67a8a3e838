//! The API's JSON bodies and queries, through the real router of a daemon
//! (shoald's `api::router` over a state directory, with a VMM that does not
//! exist, so nothing is ever started): JSON values built from the request
//! types' field names and any other names, numbers at and past every
//! limit, nesting, and raw bytes, sent to every route that takes a body.
//! Checks: every answer is a status with the API's JSON error body and a
//! known code (never a panic, never a 500); a body that does not parse as
//! the route's request type is refused (400, or the 403/404/413 that
//! comes before the body is read); the daemon still answers `/healthz`.

use axum::body::Body;
use axum::http::{Method, Request};
use bolero::{check, TypeGenerator};
use serde_json::{Map, Number, Value};
use shoald::admission::Limits;
use shoald::{api, Config, Daemon};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tower::ServiceExt;

const FIELDS: &[&str] = &[
    "cmd",
    "cwd",
    "encoding",
    "env",
    "id",
    "idle_timeout_s",
    "image",
    "keep_running",
    "layers",
    "memory_mib",
    "metadata",
    "name",
    "pause_at_ttl",
    "shell",
    "signal",
    "stdin",
    "template",
    "timeout_s",
    "ttl_s",
    "upper_disk_mib",
    "upper_size_mib",
    "vcpus",
    "root",
    "size",
    "min",
    "max",
    "target",
    "path",
    "mode",
    "dir",
    "owner",
];

#[derive(Debug, Clone, TypeGenerator)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Limit(u8),
    Float(f64),
    Str(String),
    Long(u16),
    Arr(Vec<Json>),
    Obj(Vec<(Key, Json)>),
}

#[derive(Debug, Clone, TypeGenerator)]
enum Key {
    Field(u8),
    Other(String),
}

#[derive(Debug, Clone, TypeGenerator)]
enum Body_ {
    Json(Json),
    Raw(Vec<u8>),
}

#[derive(Debug, Clone, TypeGenerator)]
struct Input {
    route: u8,
    body: Body_,
    query: Vec<(Key, String)>,
}

impl Json {
    fn value(&self, depth: u32) -> Value {
        if depth > 8 {
            return Value::Null;
        }
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Int(i) => Value::Number((*i).into()),
            Json::Limit(l) => {
                let v: [u64; 8] = [0, 1, 254, 255, 256, 1 << 20, u64::from(u32::MAX), u64::MAX];
                Value::Number(v[usize::from(*l % 8)].into())
            }
            Json::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Json::Str(s) => Value::String(s.clone()),
            Json::Long(n) => Value::String("x".repeat(usize::from(*n) * 16)),
            Json::Arr(a) => Value::Array(a.iter().take(16).map(|j| j.value(depth + 1)).collect()),
            Json::Obj(o) => Value::Object(
                o.iter()
                    .take(16)
                    .map(|(k, v)| (k.name(), v.value(depth + 1)))
                    .collect::<Map<_, _>>(),
            ),
        }
    }
}

impl Key {
    fn name(&self) -> String {
        match self {
            Key::Field(i) => FIELDS[usize::from(*i) % FIELDS.len()].into(),
            Key::Other(s) => s.clone(),
        }
    }
}

/// Routes that take a body or a query, and whether the body must parse as
/// the route's request type for it to be anything but a 400.
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/sandboxes"),
    ("POST", "/v1/sandboxes/0123456789ab/exec"),
    ("POST", "/v1/sandboxes/0123456789ab/exec/stream"),
    ("POST", "/v1/sandboxes/0123456789ab/snapshot"),
    ("POST", "/v1/templates"),
    ("PUT", "/v1/pools/nope"),
    ("PUT", "/v1/sandboxes/0123456789ab/files"),
    ("GET", "/v1/sandboxes/0123456789ab/files"),
    ("GET", "/v1/sandboxes"),
    ("GET", "/v1/events"),
];

/// Whether `body` parses as the request type of route `i` (None: the
/// route's body is not JSON).
fn parses(i: usize, body: &[u8]) -> Option<bool> {
    let b: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    use shoal_api as t;
    Some(match i {
        0 => serde_json::from_slice::<t::CreateSandbox>(b).is_ok(),
        1 | 2 => serde_json::from_slice::<t::ExecRequest>(b).is_ok(),
        3 => serde_json::from_slice::<t::SnapshotRequest>(b).is_ok(),
        4 => serde_json::from_slice::<t::CreateTemplate>(b).is_ok(),
        5 => serde_json::from_slice::<t::SetPool>(b).is_ok(),
        _ => return None,
    })
}

struct World {
    rt: tokio::runtime::Runtime,
    router: axum::Router,
    _dir: tempfile::TempDir,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let d = rt.block_on(async {
            Daemon::open(
                Config {
                    state_dir: dir.path().into(),
                    limits: Limits {
                        host_memory_mib: 1024,
                        host_cpus: 1,
                        memory_overcommit: 1.0,
                        cpu_overcommit: 1.0,
                        min_available_mib: 0,
                        max_vms: 1,
                        disk_budget_mib: 0,
                        min_free_disk_mib: 0,
                        disk_overcommit: 1.0,
                    },
                    agent_timeout: Duration::from_secs(1),
                    sweep_interval: Duration::from_secs(3600),
                    pools: false,
                    freeze_after: None,
                    max_restores: 1,
                    agent: Default::default(),
                    http: Default::default(),
                    layers_dir: None,
                    vmm_stock: 0,
                    images: Default::default(),
                    net: Default::default(),
                    evict: Default::default(),
                    balloon: None,
                },
                Arc::new(shoal_runtime::backend::microvm::MicroVm::new(
                    "/nonexistent/shoal-vmm",
                    shoal_images::artifacts::Layout::at(dir.path().join("artifacts")),
                )),
            )
            .unwrap()
        });
        World {
            router: api::router(d, None),
            rt,
            _dir: dir,
        }
    })
}

async fn send(r: &axum::Router, method: &str, uri: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let res = r.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let b = axum::body::to_bytes(res.into_body(), 1 << 24)
        .await
        .unwrap();
    (status, b.to_vec())
}

fn encode_query(q: &[(Key, String)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    q.iter()
        .take(8)
        .map(|(k, v)| format!("{}={}", enc(&k.name()), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

#[test]
fn api_bodies() {
    check!()
        .with_type::<Input>()
        .with_test_time(shoal_fuzz::budget())
        .for_each(run);
}

fn run(input: &Input) {
    let w = world();
    let i = usize::from(input.route) % ROUTES.len();
    let (method, path) = ROUTES[i];
    let body = match &input.body {
        Body_::Json(j) => serde_json::to_vec(&j.value(0)).unwrap(),
        Body_::Raw(b) => b.clone(),
    };
    let q = encode_query(&input.query);
    let uri = if q.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{q}")
    };
    let (status, answer) = w.rt.block_on(send(&w.router, method, &uri, body.clone()));
    assert!((200..600).contains(&status), "status {status}");
    assert_ne!(
        status,
        500,
        "an internal error for {method} {uri}: {}",
        String::from_utf8_lossy(&answer)
    );
    if status >= 400 {
        let v: Value = serde_json::from_slice(&answer).unwrap_or_else(|_| {
            panic!(
                "a {status} without a JSON body: {:?}",
                String::from_utf8_lossy(&answer)
            )
        });
        let code = v["error"]["code"].as_str().unwrap_or_default();
        let known = shoal_api::ErrorCode::ALL
            .iter()
            .find(|c| c.as_str() == code);
        let known = known.unwrap_or_else(|| panic!("unknown error code in {v}"));
        assert_eq!(known.status(), status, "{v}");
    }
    if parses(i, &body) == Some(false) {
        // Refused: a 400, or a refusal that comes before the body is read
        // (the route's owner check, a missing sandbox, the body limit).
        assert!(
            [400, 403, 404, 413].contains(&status),
            "an ill-typed body for {method} {path} got {status}: {}",
            short(&body)
        );
    }
    let (h, _) = w.rt.block_on(send(&w.router, "GET", "/healthz", vec![]));
    assert_eq!(h, 200, "the daemon stopped answering");
}

/// The start of `b`, for messages.
fn short(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned()
}
