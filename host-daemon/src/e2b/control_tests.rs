//! The E2B routes' authentication, routing and validation, through the
//! daemon's whole router (no VMM is ever started: the requests stop at
//! authentication, validation or a missing sandbox).

use super::w;
use crate::auth::Tokens;
use crate::{Config, Daemon};
use axum::body::Body;
use axum::http::Request;
use serde_json::Value;
use std::sync::Arc;
use tower::ServiceExt;

pub(super) const KEY: &str = "0123456789abcdef-e2b";

pub(super) fn daemon(dir: &std::path::Path) -> Arc<Daemon> {
    Daemon::open(
        Config::for_tests(dir, 1024, 1, 1),
        Arc::new(shoal_runtime::backend::microvm::MicroVm::new(
            "/nonexistent/shoal-vmm",
            shoal_images::artifacts::Layout::at(dir.join("artifacts")),
        )),
    )
    .unwrap()
}

/// The E2B routes in front of a stand-in for the daemon's own API (which
/// answers 418 to anything that reaches it).
pub(super) fn routes(d: Arc<Daemon>) -> axum::Router {
    let rest = axum::Router::new().fallback(|| async { axum::http::StatusCode::IM_A_TEAPOT });
    crate::e2b::router(d, Some(Tokens::single(KEY)), rest)
}

pub(super) async fn send(
    r: &axum::Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value, axum::http::HeaderMap) {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let res = r
        .clone()
        .oneshot(b.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let h = res.headers().clone();
    let b = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, serde_json::from_slice(&b).unwrap_or_default(), h)
}

#[tokio::test]
async fn the_api_key_is_one_of_the_daemons_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let r = routes(daemon(dir.path()));
    // No key, a wrong one (same length, one byte off), a bearer token of
    // another daemon: 401 in E2B's shape.
    for h in [
        vec![],
        vec![("x-api-key", "0123456789abcdef-e2c")],
        vec![("authorization", "Bearer nope")],
    ] {
        let (s, v, _) = send(&r, "GET", "/v2/sandboxes", &h, "").await;
        assert_eq!(s, 401, "{h:?}: {v}");
        assert_eq!(v["code"], 401, "{v}");
        assert!(v["message"].as_str().unwrap().contains("API key"), "{v}");
    }
    let (s, v, _) = send(&r, "GET", "/v2/sandboxes", &[("X-API-Key", KEY)], "").await;
    assert_eq!((s, v.clone()), (200, serde_json::json!([])), "{v}");
    let auth = format!("Bearer {KEY}");
    let (s, _, _) = send(&r, "GET", "/sandboxes", &[("authorization", &auth)], "").await;
    assert_eq!(s, 200);
    // Health needs no key; other paths are the daemon's own API's.
    let (s, _, _) = send(&r, "GET", "/health", &[], "").await;
    assert_eq!(s, 204);
    let (s, _, _) = send(&r, "GET", "/v1/sandboxes", &[], "").await;
    assert_eq!(s, 418);
}

#[tokio::test]
async fn unknown_sandboxes_are_404_and_bad_requests_400() {
    let dir = tempfile::tempdir().unwrap();
    let r = routes(daemon(dir.path()));
    let k = [("x-api-key", KEY)];
    for (m, p) in [
        ("GET", "/sandboxes/0123456789ab"),
        ("DELETE", "/sandboxes/0123456789ab"),
        ("POST", "/sandboxes/0123456789ab/timeout"),
        ("POST", "/sandboxes/0123456789ab/pause"),
        ("POST", "/v2/sandboxes/0123456789ab/connect"),
        ("POST", "/sandboxes/0123456789ab/connect"),
        ("POST", "/sandboxes/0123456789ab/fork"),
        ("GET", "/sandboxes/0123456789ab/logs"),
    ] {
        let body = if p.ends_with("timeout") {
            r#"{"timeout":5}"#
        } else {
            ""
        };
        let (s, v, _) = send(&r, m, p, &k, body).await;
        assert_eq!(s, 404, "{m} {p}: {v}");
        assert_eq!(v["code"], 404, "{v}");
    }
    for (body, want) in [
        (
            r#"{"templateID":"base","network":{"denyOut":["example.com"]}}"#,
            "network.denyOut",
        ),
        (
            r#"{"templateID":"base","network":{"allowOut":["a.test"],"denyOut":["1.1.1.1"]}}"#,
            "domains need denyOut",
        ),
        (
            r#"{"templateID":"base","network":{"rules":{"a.test":[{}]}}}"#,
            "network.rules",
        ),
        (
            r#"{"templateID":"base","network":{"maskRequestHost":"${PORT}-x.test"}}"#,
            "network.maskRequestHost",
        ),
        (
            r#"{"templateID":"base","network":{"allowPublicTraffic":true}}"#,
            "allowPublicTraffic",
        ),
        (
            r#"{"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]}"#,
            "volumeMounts",
        ),
        (r#"{"templateID":"base","timeout":0}"#, "timeout"),
        (r#"{"timeout":10}"#, "templateID"),
        (r#"{"templateID":7}"#, "invalid JSON"),
    ] {
        let (s, v, _) = send(&r, "POST", "/v2/sandboxes", &k, body).await;
        assert_eq!(s, 400, "{body}: {v}");
        assert!(v["message"].as_str().unwrap().contains(want), "{body}: {v}");
    }
    let (s, v, _) = send(
        &r,
        "POST",
        "/sandboxes",
        &k,
        r#"{"templateID":"nope","timeout":10,"secure":true,"unknownField":1}"#,
    )
    .await;
    assert_eq!(s, 404, "{v}");
    assert!(v["message"].as_str().unwrap().contains("nope"), "{v}");
    let (s, v, _) = send(&r, "GET", "/v2/sandboxes?state=dead", &k, "").await;
    assert_eq!(s, 400, "{v}");
}

#[tokio::test]
async fn the_data_plane_needs_the_sandboxs_token_on_tcp_and_says_when_it_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let r = routes(d.clone());
    let id = "0123456789ab";
    let sb = [("e2b-sandbox-id", id), ("e2b-sandbox-port", "49983")];
    // No token, or another sandbox's: 401.
    let other = d.e2b.envd_token("ba9876543210");
    for h in [vec![], vec![("x-access-token", other.as_str())]] {
        let h: Vec<_> = sb.iter().copied().chain(h).collect();
        let (s, v, _) = send(&r, "GET", "/health", &h, "").await;
        assert_eq!(s, 401, "{h:?}: {v}");
    }
    let tok = d.e2b.envd_token(id);
    let h: Vec<_> = sb
        .iter()
        .copied()
        .chain([("x-access-token", tok.as_str())])
        .collect();
    let (s, v, _) = send(&r, "GET", "/health", &h, "").await;
    assert_eq!(s, 502, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("was not found"),
        "{v}"
    );
    // Port 49999 takes the traffic token too.
    let traffic = d.e2b.traffic_token(id);
    let h = [
        ("e2b-sandbox-id", id),
        ("e2b-sandbox-port", "49999"),
        ("e2b-traffic-access-token", traffic.as_str()),
    ];
    let (s, _, _) = send(&r, "POST", "/contexts", &h, "{}").await;
    assert_eq!(s, 502);
    let (s, v, _) = send(&r, "GET", "/health", &[("e2b-sandbox-id", "")], "").await;
    assert_eq!(s, 400, "{v}");
    // With the API key it is a control-plane call (e2b 2.20's connect
    // sends E2b-Sandbox-Id too).
    let h: Vec<_> = sb.iter().copied().chain([("x-api-key", KEY)]).collect();
    let (s, v, _) = send(
        &r,
        "POST",
        "/sandboxes/0123456789ab/connect",
        &h,
        r#"{"timeout":5}"#,
    )
    .await;
    assert_eq!(s, 404, "{v}");
    let (s, _, _) = send(&r, "GET", "/health", &h, "").await;
    assert_eq!(s, 204);
}

#[test]
fn times_round_trip_rfc3339() {
    assert_eq!(w::rfc3339(0.0), "1970-01-01T00:00:00.000Z");
    assert_eq!(w::rfc3339(951_782_400.5), "2000-02-29T00:00:00.500Z");
    assert_eq!(
        w::parse_rfc3339("2000-02-29T01:00:00.250+01:00"),
        Some(951_782_400.25)
    );
    assert_eq!(w::parse_rfc3339("1970-01-01T00:00:00Z"), Some(0.0));
    for bad in [
        "",
        "2000-02-29",
        "2000-13-01T00:00:00Z",
        "2000-02-29T00:00:00",
    ] {
        assert_eq!(w::parse_rfc3339(bad), None, "{bad}");
    }
    let t = 1_790_000_000.123;
    let back = w::parse_rfc3339(&w::rfc3339(t)).unwrap();
    assert!((back - t).abs() < 1e-3, "{back}");
}

#[test]
fn list_queries_read_the_sdks_double_escaped_metadata() {
    // What e2b 2.63 sends for metadata {"a b": "x&y", "k": "v"}, states
    // and a page.
    let q = w::ListQuery::parse(Some(
        "metadata=a%252520b%3Dx%252526y%26k%3Dv&state=running%2Cpaused&limit=2&nextToken=1.5_ab\
         &order=desc&somethingNew=1",
    ))
    .unwrap();
    assert_eq!(
        q.metadata,
        vec![("a b".into(), "x&y".into()), ("k".into(), "v".into())]
    );
    assert_eq!(q.states, vec!["running", "paused"]);
    assert_eq!((q.limit, q.desc), (2, true));
    assert_eq!(q.next_token.as_deref(), Some("1.5_ab"));
    assert!(w::template_matches("base-1c-128m", "base"));
    assert!(w::template_matches("base", "base"));
    assert!(!w::template_matches("base-x", "base"));
    assert!(!w::template_matches("basement", "base"));
}
