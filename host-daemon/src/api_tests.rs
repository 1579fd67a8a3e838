//! The generated document against the router and the shared types.

use super::*;
use crate::{api, Config};
use axum::body::Body;
use axum::http::{Method, Request};
use serde_json::{json, Value};
use shoal_api as t;
use shoal_images::layers;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tower::ServiceExt;
use utoipa::ToSchema;

/// A daemon on a temporary state directory: no VMM is ever started (the
/// requests below stop at validation or at a missing sandbox).
fn daemon(dir: &std::path::Path) -> Arc<Daemon> {
    Daemon::open(
        Config::for_tests(dir, 1024, 1, 1),
        Arc::new(shoal_runtime::backend::microvm::MicroVm::new(
            "/nonexistent/shoal-vmm",
            shoal_images::artifacts::Layout::at(dir.join("artifacts")),
        )),
    )
    .unwrap()
}

/// Status and error message of `method path` with an empty body.
async fn send(r: &axum::Router, method: &str, path: &str) -> (u16, String) {
    let req = Request::builder()
        .method(Method::from_bytes(method.to_uppercase().as_bytes()).unwrap())
        .uri(path)
        .body(Body::empty())
        .unwrap();
    let res = r.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let b = axum::body::to_bytes(res.into_body(), 1 << 24)
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&b).unwrap_or_default();
    (status, v["error"]["message"].as_str().unwrap_or("").into())
}

fn unrouted(status: u16, message: &str) -> bool {
    (status == 404 && message.contains("no such route"))
        || (status == 400 && message.contains("method not allowed"))
}

/// The routes of API v1 (as they were before the document was generated,
/// and those added since).
const V1: &[(&str, &str)] = &[
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
    ("post", "/v1/sandboxes/{id}/fork"),
    ("get", "/v1/sandboxes/{id}/screen"),
    ("post", "/v1/sandboxes/{id}/input"),
    ("post", "/v1/sandboxes/{id}/pause"),
    ("post", "/v1/sandboxes/{id}/resume"),
    ("patch", "/v1/sandboxes/{id}"),
    ("post", "/v1/sandboxes/{id}/files/mkdir"),
    ("post", "/v1/sandboxes/{id}/files/rename"),
    ("post", "/v1/sandboxes/{id}/commands"),
    ("get", "/v1/sandboxes/{id}/commands"),
    ("get", "/v1/sandboxes/{id}/commands/{cid}"),
    ("get", "/v1/sandboxes/{id}/commands/{cid}/stream"),
    ("post", "/v1/sandboxes/{id}/commands/{cid}/wait"),
    ("post", "/v1/sandboxes/{id}/commands/{cid}/signal"),
    ("post", "/v1/sandboxes/{id}/commands/{cid}/stdin"),
    ("post", "/v1/templates"),
    ("get", "/v1/templates"),
    ("get", "/v1/templates/{name}"),
    ("delete", "/v1/templates/{name}"),
    ("get", "/v1/pools"),
    ("put", "/v1/pools/{template}"),
    ("delete", "/v1/pools/{template}"),
    ("post", "/v1/fncall"),
    ("post", "/v1/fncall/batch"),
    ("get", "/v1/fncall/languages"),
    ("post", "/v1/images"),
    ("get", "/v1/images"),
    ("get", "/v1/images/{image}"),
    ("delete", "/v1/images/{image}"),
    ("put", "/v1/sandboxes/{id}/network"),
];

#[tokio::test]
async fn the_document_lists_exactly_the_routes_the_router_serves() {
    let dir = tempfile::tempdir().unwrap();
    let r = api::router(daemon(dir.path()), None);
    let documented: BTreeSet<(String, String)> = documented_routes().into_iter().collect();
    let v1: BTreeSet<(String, String)> = V1
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, v1, "routes added or lost");
    let paths: BTreeSet<&String> = documented.iter().map(|(_, p)| p).collect();
    for p in paths {
        let concrete = p
            .replace("{id}", "0123456789ab")
            .replace("{cid}", "1")
            .replace("{name}", "nope")
            .replace("{template}", "nope")
            .replace("{image}", "nope");
        for m in ["get", "put", "post", "delete", "patch"] {
            let (status, msg) = send(&r, m, &concrete).await;
            let served = !unrouted(status, &msg);
            let listed = documented.contains(&(m.to_string(), p.clone()));
            assert_eq!(
                served, listed,
                "{m} {p}: served {served}, documented {listed} (HTTP {status}: {msg})"
            );
        }
    }
    let (status, msg) = send(&r, "get", "/v1/nothing").await;
    assert!(unrouted(status, &msg), "{status} {msg}");
}

/// The schema reference (or `[name]` for an array of it) of a body.
fn body_ref(content: &Value) -> Option<String> {
    let (ct, c) = content.as_object()?.iter().next()?;
    let s = &c["schema"];
    let name = |v: &Value| {
        v["$ref"]
            .as_str()
            .map(|r| r.trim_start_matches("#/components/schemas/").to_string())
    };
    Some(match name(s) {
        Some(n) => format!("{ct} {n}"),
        None if s["type"] == "array" => match name(&s["items"]) {
            Some(n) => format!("{ct} [{n}]"),
            None => format!("{ct} {}", s),
        },
        None => format!("{ct} {}", s["type"].as_str().unwrap_or("?")),
    })
}

/// Method, path, request body, success status, success body.
type BodyRow = (
    &'static str,
    &'static str,
    Option<&'static str>,
    u16,
    Option<&'static str>,
);

const SB: &str = "application/json Sandbox";
const CMD: &str = "application/json Command";
const IMG: &str = "application/json Image";
const IMGS: &str = "application/json ImageList";
const POOLS: &str = "application/json [Pool]";
const CMDS: &str = "application/json [Command]";
const ND: &str = "application/x-ndjson ExecEvent";
const RES: &str = "application/json ExecResult";

#[test]
fn every_body_is_the_shared_type() {
    let j = "application/json";
    const PNG: &str =
        r#"image/png {"items":{"format":"int32","minimum":0,"type":"integer"},"type":"array"}"#;
    let want: &[BodyRow] = &[
        ("get", "/openapi.json", None, 200, None),
        (
            "get",
            "/healthz",
            None,
            200,
            Some("application/json Health"),
        ),
        (
            "get",
            "/metrics",
            None,
            200,
            Some("text/plain; version=0.0.4 string"),
        ),
        (
            "get",
            "/v1/stats",
            None,
            200,
            Some("application/json Stats"),
        ),
        (
            "get",
            "/v1/events",
            None,
            200,
            Some("application/json [Event]"),
        ),
        (
            "post",
            "/v1/sandboxes",
            Some("CreateSandbox"),
            201,
            Some("application/json Sandbox"),
        ),
        (
            "get",
            "/v1/sandboxes",
            None,
            200,
            Some("application/json [Sandbox]"),
        ),
        (
            "get",
            "/v1/sandboxes/{id}",
            None,
            200,
            Some("application/json Sandbox"),
        ),
        ("delete", "/v1/sandboxes/{id}", None, 204, None),
        (
            "post",
            "/v1/sandboxes/{id}/exec",
            Some("ExecRequest"),
            200,
            Some("application/json ExecResult"),
        ),
        (
            "post",
            "/v1/sandboxes/{id}/exec/stream",
            Some("ExecRequest"),
            200,
            Some("application/x-ndjson ExecEvent"),
        ),
        (
            "put",
            "/v1/sandboxes/{id}/files",
            Some("octet"),
            201,
            Some("application/json Uploaded"),
        ),
        ("get", "/v1/sandboxes/{id}/files", None, 200, Some("octet")),
        ("delete", "/v1/sandboxes/{id}/files", None, 204, None),
        (
            "get",
            "/v1/sandboxes/{id}/files/stat",
            None,
            200,
            Some("application/json FileStat"),
        ),
        (
            "get",
            "/v1/sandboxes/{id}/files/list",
            None,
            200,
            Some("application/json [DirEntry]"),
        ),
        (
            "post",
            "/v1/sandboxes/{id}/snapshot",
            Some("SnapshotRequest"),
            201,
            Some("application/json Template"),
        ),
        (
            "post",
            "/v1/sandboxes/{id}/fork",
            Some("ForkRequest"),
            201,
            Some("application/json Forked"),
        ),
        (
            "get",
            "/v1/sandboxes/{id}/screen",
            None,
            200,
            // utoipa's Vec<u8>: an array of bytes.
            Some(PNG),
        ),
        (
            "post",
            "/v1/sandboxes/{id}/input",
            Some("InputRequest"),
            204,
            None,
        ),
        (
            "post",
            "/v1/sandboxes/{id}/pause",
            None,
            200,
            Some("application/json Sandbox"),
        ),
        (
            "put",
            "/v1/sandboxes/{id}/network",
            Some("NetworkSpec"),
            200,
            Some("application/json Sandbox"),
        ),
        (
            "post",
            "/v1/sandboxes/{id}/resume",
            None,
            200,
            Some("application/json Sandbox"),
        ),
        (
            "post",
            "/v1/templates",
            Some("CreateTemplate"),
            202,
            Some("application/json Template"),
        ),
        (
            "get",
            "/v1/templates",
            None,
            200,
            Some("application/json [Template]"),
        ),
        (
            "get",
            "/v1/templates/{name}",
            None,
            200,
            Some("application/json Template"),
        ),
        ("delete", "/v1/templates/{name}", None, 204, None),
        ("get", "/v1/pools", None, 200, Some(POOLS)),
        (
            "put",
            "/v1/pools/{template}",
            Some("SetPool"),
            200,
            Some("application/json Pool"),
        ),
        ("delete", "/v1/pools/{template}", None, 204, None),
        (
            "patch",
            "/v1/sandboxes/{id}",
            Some("UpdateSandbox"),
            200,
            Some(SB),
        ),
        ("post", "/v1/sandboxes/{id}/files/mkdir", None, 204, None),
        (
            "post",
            "/v1/sandboxes/{id}/files/rename",
            Some("RenameRequest"),
            204,
            None,
        ),
        (
            "post",
            "/v1/sandboxes/{id}/commands",
            Some("ExecRequest"),
            201,
            Some(CMD),
        ),
        ("get", "/v1/sandboxes/{id}/commands", None, 200, Some(CMDS)),
        (
            "get",
            "/v1/sandboxes/{id}/commands/{cid}",
            None,
            200,
            Some(CMD),
        ),
        (
            "get",
            "/v1/sandboxes/{id}/commands/{cid}/stream",
            None,
            200,
            Some(ND),
        ),
        (
            "post",
            "/v1/sandboxes/{id}/commands/{cid}/wait",
            None,
            200,
            Some(RES),
        ),
        (
            "post",
            "/v1/sandboxes/{id}/commands/{cid}/signal",
            Some("SignalCommand"),
            204,
            None,
        ),
        (
            "post",
            "/v1/sandboxes/{id}/commands/{cid}/stdin",
            Some("octet"),
            204,
            None,
        ),
        (
            "post",
            "/v1/fncall",
            Some("FnCallRequest"),
            200,
            Some("application/json FnCallResult"),
        ),
        (
            "post",
            "/v1/fncall/batch",
            Some("BatchRequest"),
            200,
            Some("application/x-ndjson BatchItem"),
        ),
        (
            "get",
            "/v1/fncall/languages",
            None,
            200,
            Some("application/json [Language]"),
        ),
        ("post", "/v1/images", Some("PullImage"), 201, Some(IMG)),
        ("get", "/v1/images", None, 200, Some(IMGS)),
        ("get", "/v1/images/{image}", None, 200, Some(IMG)),
        ("delete", "/v1/images/{image}", None, 200, Some(IMG)),
    ];
    assert_eq!(want.len(), V1.len());
    let doc = document_json();
    for (m, p, req, status, res) in want {
        let op = &doc["paths"][p][m];
        assert!(op.is_object(), "{m} {p} missing");
        let got_req = body_ref(&op["requestBody"]["content"]);
        let want_req = req.map(|r| match r {
            "octet" => "application/octet-stream [integer]".to_string(),
            r => format!("{j} {r}"),
        });
        // A raw body: utoipa describes Vec<u8> as an array of bytes.
        let got_req = got_req.map(|g| {
            if g.starts_with("application/octet-stream") {
                "application/octet-stream [integer]".to_string()
            } else {
                g
            }
        });
        assert_eq!(got_req, want_req, "{m} {p} request body");
        let ok = &op["responses"][status.to_string()];
        assert!(ok.is_object(), "{m} {p}: no {status} response");
        let got = body_ref(&ok["content"]).map(|g| {
            if g.starts_with("application/octet-stream") {
                "octet".to_string()
            } else {
                g
            }
        });
        let got = if *p == "/openapi.json" { None } else { got };
        assert_eq!(got.as_deref(), *res, "{m} {p} response body");
        // Errors: the shared error body, admission's on routes that may
        // start a VMM.
        let may_restore = p.contains("{id}/")
            && !p.ends_with("/pause")
            && !p.ends_with("/network")
            && !(*m == "get" && (p.ends_with("/commands") || p.ends_with("{cid}")))
            || *p == "/v1/sandboxes" && *m == "post";
        for c in t::ErrorCode::ALL {
            let e = &op["responses"][c.status().to_string()];
            if c.retryable() && !may_restore || *p == "/openapi.json" || *p == "/healthz" {
                assert!(e.is_null(), "{m} {p} documents {c}");
                continue;
            }
            assert_eq!(
                body_ref(&e["content"]).as_deref(),
                Some("application/json Error"),
                "{m} {p}: error {c}"
            );
        }
    }
}

/// Properties and required properties of a component schema.
fn props(name: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let s = &document_json()["components"]["schemas"][name];
    let p = s["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{name} has no properties"))
        .keys()
        .cloned()
        .collect();
    let r = s["required"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    (p, r)
}

/// Each key of `v` (a full value of the type) is a documented property,
/// and each required property is in it.
fn check_fields(name: &str, v: Value) {
    let (p, r) = props(name);
    let keys: BTreeSet<String> = v.as_object().unwrap().keys().cloned().collect();
    for k in &keys {
        assert!(p.contains(k), "{name}.{k} is not documented");
    }
    for k in &r {
        assert!(keys.contains(k), "{name}.{k} is required but not sent");
    }
}

#[test]
fn every_field_is_documented() {
    let meta = BTreeMap::from([("k".to_string(), "v".to_string())]);
    let sandbox = t::CreateSandbox {
        template: Some("t".into()),
        image: Some("tiny".into()),
        vcpus: Some(1),
        memory_mib: Some(128),
        layers: vec!["/kit.img".into()],
        upper_size_mib: Some(8),
        upper_disk_mib: Some(64),
        ttl_s: 1,
        idle_timeout_s: 1,
        metadata: meta.clone(),
        env: meta.clone(),
        keep_running: true,
        pause_at_ttl: true,
        network: Some(t::NetworkSpec::allowing(["pypi.org"])),
        priority: t::Priority::BestEffort,
    };
    let template = t::CreateTemplate {
        kind: Some("vm".into()),
        vcpus: Some(1),
        memory_mib: Some(128),
        ..t::CreateTemplate::new("t", "tiny")
    }
    .with_root(sandbox.root());
    let exec = t::ExecRequest {
        cmd: Some(vec!["true".into()]),
        shell: Some("true".into()),
        env: meta.clone(),
        cwd: Some("/".into()),
        timeout_s: Some(1.0),
        stdin: Some("x".into()),
        stdin_b64: Some("eA==".into()),
        stdin_open: true,
    };
    let view = t::Sandbox {
        id: "i".into(),
        template: "t".into(),
        kind: "microvm".into(),
        state: t::SandboxState::Running,
        vcpus: 1,
        memory_mib: 128,
        pid: Some(1),
        created_at: 1.0,
        last_active: 1.0,
        ttl_s: 0,
        idle_timeout_s: 0,
        metadata: meta.clone(),
        env: meta,
        error: Some("e".into()),
        keep_running: false,
        pause_at_ttl: false,
        network: Some(t::NetworkSpec::allowing(["pypi.org"])),
        guest_addr: Some(std::net::Ipv4Addr::new(10, 0, 0, 2)),
        from_pool: Some(true),
        priority: t::Priority::BestEffort,
        smt_isolation: Some(false),
        warnings: vec!["w".into()],
    };
    let tpl = t::Template {
        name: "t".into(),
        source: "image:tiny".into(),
        vcpus: 1,
        memory_mib: 128,
        dir: "/d".into(),
        state: t::TemplateState::Ready,
        error: Some("e".into()),
        created_at: 1.0,
        owned: true,
        owner: Some("token:a".into()),
        layers: vec!["base".into()],
        upper_size_mib: Some(8),
        upper_disk_mib: Some(64),
        image: Some("sha256:ab".into()),
        network: false,
        kind: "vm".into(),
        disk: Some(t::TemplateDisk {
            path: "/l/d.qcow2".into(),
            format: "qcow2".into(),
            kernel: "shoal".into(),
            root: Some("/dev/vda".into()),
            init: Some("/sbin/shoal-agent".into()),
        }),
    };
    let command = t::Command {
        id: "1".into(),
        pid: 2,
        sandbox_id: "i".into(),
        state: t::CommandState::Exited,
        exit_code: Some(0),
        signal: Some(9),
        timed_out: false,
        started_at: 1.0,
    };
    let full = |v: &dyn erased::Ser| v.value();
    for (name, v) in [
        ("CreateSandbox", full(&sandbox)),
        ("CreateTemplate", full(&template)),
        ("ExecRequest", full(&exec)),
        ("SnapshotRequest", json!({"template": "x"})),
        ("ForkRequest", json!({"count": 2, "metadata": {"a": "b"}})),
        (
            "Forked",
            json!({"source": "s", "sandboxes": [full(&view)],
                "failed": [{"code": "host_full", "message": "m"}]}),
        ),
        ("SetPool", json!({"target": 1})),
        ("Sandbox", full(&view)),
        ("Template", full(&tpl)),
        (
            "UpdateSandbox",
            json!({"ttl_s": 1, "idle_timeout_s": 2, "priority": "latency"}),
        ),
        ("RenameRequest", json!({"from": "/a", "to": "/b"})),
        ("SignalCommand", json!({"signal": 15, "group": true})),
        ("Command", full(&command)),
        ("NetworkSpec", full(&sandbox.network)),
        (
            "InputRequest",
            json!({"events": [{"type": "key", "key": "a", "down": true}]}),
        ),
    ] {
        check_fields(name, v);
    }
    // The request types document exactly what they accept (unknown
    // fields are refused).
    for name in [
        "CreateSandbox",
        "CreateTemplate",
        "ExecRequest",
        "SnapshotRequest",
        "ForkRequest",
        "SetPool",
        "UpdateSandbox",
        "RenameRequest",
        "SignalCommand",
        "NetworkSpec",
        "InputRequest",
    ] {
        let s = &document_json()["components"]["schemas"][name];
        assert_eq!(s["additionalProperties"], false, "{name}");
    }
}

/// Serialization to a JSON value through a trait object (for the table
/// above).
mod erased {
    pub trait Ser {
        fn value(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Ser for T {
        fn value(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap()
        }
    }
}

#[test]
fn query_parameters_are_the_shared_query_types() {
    let doc = document_json();
    let names = |m: &str, p: &str| -> BTreeSet<String> {
        doc["paths"][p][m]["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|q| q["in"] == "query")
            .map(|q| q["name"].as_str().unwrap().to_string())
            .collect()
    };
    let keys = |q: String| -> BTreeSet<String> {
        q.trim_start_matches('?')
            .split('&')
            .map(|kv| kv.split('=').next().unwrap().to_string())
            .collect()
    };
    let list = t::ListFilter {
        state: Some(t::SandboxState::Paused),
        template: Some("t".into()),
        metadata: [("a".to_string(), "b".to_string())].into(),
    };
    let upload = t::UploadQuery {
        path: "/p".into(),
        mode: Some(0o600),
        append: Some(true),
        parents: Some(true),
    };
    let file = t::FileQuery { path: "/p".into() };
    let rm = t::RemoveQuery {
        path: "/p".into(),
        recursive: Some(true),
    };
    let ev = t::EventQuery {
        since: Some(1),
        sandbox: Some("s".into()),
        limit: Some(2),
    };
    let f = "/v1/sandboxes/{id}/files";
    let c = "/v1/sandboxes/{id}/commands/{cid}";
    let mkdir = t::MkdirQuery {
        parents: Some(true),
        mode: Some(0o700),
        ..t::MkdirQuery::new("/d")
    };
    let wait = t::WaitQuery {
        timeout_s: Some(1.0),
    };
    let stdin = t::StdinQuery { close: Some(true) };
    for (m, p, q) in [
        ("get", "/v1/sandboxes", list.to_query()),
        ("put", f, upload.to_query()),
        ("get", f, file.to_query()),
        ("delete", f, rm.to_query()),
        ("get", "/v1/sandboxes/{id}/files/stat", file.to_query()),
        ("get", "/v1/sandboxes/{id}/files/list", file.to_query()),
        ("get", "/v1/events", ev.to_query()),
        ("post", "/v1/sandboxes/{id}/files/mkdir", mkdir.to_query()),
        ("post", &format!("{c}/wait"), wait.to_query()),
        ("post", &format!("{c}/stdin"), stdin.to_query()),
    ] {
        assert_eq!(names(m, p), keys(q), "{m} {p}");
    }
    // `path` is required wherever it is taken.
    for q in doc["paths"][f]["put"]["parameters"].as_array().unwrap() {
        assert_eq!(
            q["required"],
            q["name"] == "path" || q["in"] == "path",
            "{q}"
        );
    }
}

#[test]
fn served_document_is_the_generated_one() {
    let doc = document_json();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["title"], "shoald");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

// The document's schemas and the bounds it states, beside: this file
// would be too long.
#[path = "api_schema_tests.rs"]
mod schemas;

#[path = "api_bounds_tests.rs"]
mod bounds;
