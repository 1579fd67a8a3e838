use super::*;

fn basic(userinfo: &str) -> Vec<u8> {
    let b = base64::engine::general_purpose::STANDARD.encode(userinfo);
    format!("Basic {b}").into_bytes()
}

#[test]
fn the_basic_password_is_what_follows_the_first_colon() {
    assert_eq!(basic_password(&basic("fusion:tok:en")).unwrap(), b"tok:en");
    assert_eq!(basic_password(&basic(":t")).unwrap(), b"t");
    assert_eq!(basic_password(&basic("u:")).unwrap(), b"");
    assert_eq!(basic_password(&basic("no-colon")), None);
    assert_eq!(basic_password(b"Bearer abc"), None);
    assert_eq!(basic_password(b"Basic !!!"), None);
}

#[test]
fn only_sandboxfusions_routes_are_fusion_paths() {
    assert!(is_fusion_path("/run_code") && is_fusion_path("/v1/ping"));
    assert!(!is_fusion_path("/run_code/") && !is_fusion_path("/v1/sandboxes"));
}

// The routes through the daemon's router, up to where a guest would be
// needed (no VMM is ever started: every request below is refused first).

use crate::auth::Tokens;
use crate::{api, Config, Daemon};
use axum::body::Body;
use axum::http::{header, Request};
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

const TOKEN: &str = "0123456789abcdef-token";

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

/// Status and body of a request.
async fn send(
    r: &axum::Router,
    method: &str,
    path: &str,
    auth: Option<String>,
    body: Vec<u8>,
) -> (u16, Value) {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(a) = auth {
        b = b.header(header::AUTHORIZATION, a);
    }
    let res = r
        .clone()
        .oneshot(b.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 24)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn run_code(r: &axum::Router, body: Value) -> (u16, String) {
    let (s, v) = send(r, "POST", "/run_code", None, body.to_string().into_bytes()).await;
    (s, v["error"]["message"].as_str().unwrap_or("").to_string())
}

fn basic_header(userinfo: &str) -> String {
    String::from_utf8(basic(userinfo)).unwrap()
}

#[tokio::test]
async fn ping_answers_pong() {
    let dir = tempfile::tempdir().unwrap();
    let r = api::router(daemon(dir.path()), None);
    assert_eq!(
        send(&r, "GET", "/v1/ping", None, vec![]).await,
        (200, json!("pong"))
    );
}

#[tokio::test]
async fn malformed_run_code_requests_are_400s_that_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let r = api::router(daemon(dir.path()), None);
    let (s, v) = send(&r, "POST", "/run_code", None, b"{not json".to_vec()).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid JSON body"),
        "{v}"
    );
    let cases: &[(Value, &str)] = &[
        (json!({"language": "python"}), "missing field `code`"),
        (json!({"code": "x"}), "missing field `language`"),
        (json!({"code": 3, "language": "python"}), "invalid type"),
        (
            json!({"code": "x", "language": "cobol"}),
            "unknown language 'cobol'",
        ),
        (
            json!({"code": "x", "language": "python", "run_timeout": -1}),
            "run_timeout must be",
        ),
        (
            json!({"code": "x", "language": "cpp", "compile_timeout": 0}),
            "compile_timeout must be",
        ),
        (
            json!({"code": "x", "language": "python", "files": {"a": "@@@"}}),
            "files['a'] is not base64",
        ),
        // One of SandboxFusion's languages this daemon does not run: the
        // FnCall core's refusal, naming those it does.
        (
            json!({"code": "x", "language": "java"}),
            "unknown language \"java\"",
        ),
        (
            json!({"code": "x".repeat((1 << 20) + 1), "language": "python"}),
            "code is 1048577 bytes",
        ),
    ];
    for (body, want) in cases {
        let (s, msg) = run_code(&r, body.clone()).await;
        assert_eq!(s, 400, "{body}: {msg}");
        assert!(msg.contains(want), "{want:?} not in {msg:?}");
    }
    let (s, msg) = run_code(
        &r,
        json!({"code": "x".repeat(MAX_BODY), "language": "python"}),
    )
    .await;
    assert_eq!(s, 413, "{msg}");
}

#[tokio::test]
async fn on_tcp_the_token_may_come_as_a_basic_password() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let r = api::router(d.clone(), Some(Tokens::single(TOKEN)));
    let ping = |auth: Option<String>| send(&r, "GET", "/v1/ping", auth, vec![]);
    assert_eq!(ping(None).await.0, 401);
    assert_eq!(
        ping(Some(basic_header("fusion:wrong-token-000000")))
            .await
            .0,
        401
    );
    assert_eq!(
        ping(Some(format!("Bearer {TOKEN}"))).await,
        (200, json!("pong"))
    );
    let ok = Some(basic_header(&format!("fusion:{TOKEN}")));
    assert_eq!(ping(ok.clone()).await, (200, json!("pong")));
    // Past authentication: the request's own 400.
    let body = json!({"code": "x", "language": "cobol"}).to_string();
    let (s, v) = send(&r, "POST", "/run_code", ok.clone(), body.into_bytes()).await;
    assert_eq!(s, 400, "{v}");
    // The Basic form is for SandboxFusion's routes only.
    let (s, _) = send(&r, "GET", "/v1/sandboxes", ok, vec![]).await;
    assert_eq!(s, 401);
}

#[tokio::test]
async fn run_code_without_token_opens_only_sandboxfusions_routes() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let r = api::router(d, Some(Tokens::single(TOKEN).with_open_fusion(true)));
    assert_eq!(
        send(&r, "GET", "/v1/ping", None, vec![]).await,
        (200, json!("pong"))
    );
    let body = json!({"code": "x", "language": "python", "run_timeout": 0}).to_string();
    let (s, v) = send(&r, "POST", "/run_code", None, body.into_bytes()).await;
    assert_eq!(s, 400, "{v}");
    for (m, p) in [("GET", "/v1/sandboxes"), ("POST", "/v1/fncall")] {
        assert_eq!(send(&r, m, p, None, vec![]).await.0, 401, "{m} {p}");
    }
}

#[test]
fn memory_limits_are_kept_within_the_templates() {
    use crate::fncall::{registry, validate};
    let max = validate::max_memory_mib(registry::find("python").unwrap());
    for (asked, got) in [(100_000, max), (1, validate::MIN_MEMORY_MIB), (64, 64)] {
        let mut c = shoal_api::fncall::FnCallRequest {
            language: "python".into(),
            memory_mib: Some(asked),
            ..Default::default()
        };
        handler::clamp_memory(&mut c);
        assert_eq!(c.memory_mib, Some(got), "asked {asked}");
    }
}
