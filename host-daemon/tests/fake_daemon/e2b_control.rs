//! E2B's control plane at the HTTP level, over the daemon's Unix socket
//! (the caller is the peer: no API key), on fake sandboxes: create with
//! metadata, envs and timeout, get, list with filters and pages, timeout,
//! refresh, pause (twice), connect, fork, snapshots, metrics, logs, kill.
//! The SDKs' own runs are in sdk/python/e2b_tests.

use crate::harness::*;
use serde_json::{json, Value};
use shoal_client::{Body, DaemonClient};

fn call(
    c: &DaemonClient,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value, Option<String>) {
    let b = match body {
        None => Body::Empty,
        Some(v) => Body::Json(serde_json::to_vec(&v).unwrap()),
    };
    let r = c.request(method, path, b).unwrap();
    let status = r.status;
    let next = r.header("x-next-token").map(str::to_string);
    let bytes = r.bytes().unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        next,
    )
}

fn end_in(v: &Value) -> f64 {
    let end = v["endAt"].as_str().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    parse_rfc3339(end) - now
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` (what shoald writes) to epoch seconds.
fn parse_rfc3339(s: &str) -> f64 {
    let n = |a: usize, b: usize| s[a..b].parse::<i64>().unwrap();
    let (y, m, d) = (n(0, 4), n(5, 7), n(8, 10));
    let (y2, m2) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86_400 + n(11, 13) * 3600 + n(14, 16) * 60 + n(17, 19);
    secs as f64
        + s[19..s.len() - 1]
            .trim_start_matches('.')
            .parse::<f64>()
            .map_or(0.0, |ms| ms / 1000.0)
}

#[test]
fn the_e2b_control_plane_over_the_unix_socket() {
    let d = TestDaemon::start();
    let c = &d.c;
    let (s, sb, _) = call(
        c,
        "POST",
        "/v2/sandboxes",
        Some(
            json!({"templateID": "tiny", "timeout": 60, "metadata": {"run": "e2b", "n": "1"},
                    "envVars": {"GREETING": "hi"}, "allow_internet_access": true, "somethingNew": 1}),
        ),
    );
    assert_eq!(s, 201, "{sb}");
    let id = sb["sandboxID"].as_str().unwrap().to_string();
    for k in [
        "templateID",
        "clientID",
        "envdVersion",
        "envdAccessToken",
        "trafficAccessToken",
    ] {
        assert!(sb[k].is_string(), "{k}: {sb}");
    }
    assert_eq!(sb["envdVersion"], "0.5.7");
    assert!(sb.get("domain").is_none(), "{sb}");
    // envVars are the sandbox's environment.
    assert_eq!(d.sh(&id, "echo $GREETING").unwrap().1, "hi\n");
    // The v1 route too; this one has no timeout given: E2B's default.
    let (s, other, _) = call(
        c,
        "POST",
        "/sandboxes",
        Some(json!({"templateID": "tiny", "metadata": {"run": "e2b"}})),
    );
    assert_eq!(s, 201, "{other}");
    let other_id = other["sandboxID"].as_str().unwrap().to_string();

    let (s, info, _) = call(c, "GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(s, 200, "{info}");
    assert_eq!(info["state"], "running");
    assert_eq!(info["metadata"], json!({"run": "e2b", "n": "1"}));
    assert_eq!(info["envdAccessToken"], sb["envdAccessToken"]);
    assert_eq!(
        (info["cpuCount"].as_u64(), info["memoryMB"].as_u64()),
        (Some(1), Some(128))
    );
    assert!((50.0..=61.0).contains(&end_in(&info)), "{info}");
    let (_, oinfo, _) = call(c, "GET", &format!("/sandboxes/{other_id}"), None);
    assert!((290.0..=301.0).contains(&end_in(&oinfo)), "{oinfo}");

    assert_eq!(
        call(
            c,
            "POST",
            &format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 600}))
        )
        .0,
        204
    );
    let (_, info, _) = call(c, "GET", &format!("/sandboxes/{id}"), None);
    assert!((590.0..=601.0).contains(&end_in(&info)), "{info}");
    // A refresh never shortens.
    assert_eq!(
        call(
            c,
            "POST",
            &format!("/sandboxes/{id}/refreshes"),
            Some(json!({"duration": 5}))
        )
        .0,
        204
    );
    let (_, info, _) = call(c, "GET", &format!("/sandboxes/{id}"), None);
    assert!(end_in(&info) > 590.0, "{info}");

    // Lists: metadata filter (the SDK's double escaping), pages.
    let (s, l, _) = call(c, "GET", "/v2/sandboxes?metadata=run%3De2b%26n%3D1", None);
    assert_eq!(s, 200, "{l}");
    assert_eq!(l.as_array().unwrap().len(), 1, "{l}");
    assert_eq!(l[0]["sandboxID"], id.as_str());
    let (_, p1, next) = call(c, "GET", "/v2/sandboxes?metadata=run%3De2b&limit=1", None);
    let next = next.expect("a next page");
    let (_, p2, none) = call(
        c,
        "GET",
        &format!("/v2/sandboxes?metadata=run%3De2b&limit=1&nextToken={next}"),
        None,
    );
    assert_eq!(none, None);
    let mut ids = vec![p1[0]["sandboxID"].clone(), p2[0]["sandboxID"].clone()];
    ids.sort_by_key(|v| v.to_string());
    let mut want = vec![json!(id), json!(other_id)];
    want.sort_by_key(|v| v.to_string());
    assert_eq!(ids, want);
    let (_, v1, _) = call(c, "GET", "/sandboxes", None);
    assert_eq!(v1.as_array().unwrap().len(), 2);

    // Pause, twice (409), list paused, connect (201 resumed, 200 running).
    assert_eq!(
        call(c, "POST", &format!("/sandboxes/{id}/pause"), None).0,
        204
    );
    assert_eq!(
        call(c, "POST", &format!("/sandboxes/{id}/pause"), None).0,
        409
    );
    let (_, info, _) = call(c, "GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(info["state"], "paused");
    assert!(
        end_in(&info) > 1e9,
        "a paused sandbox has no timeout: {info}"
    );
    let (_, paused, _) = call(c, "GET", "/v2/sandboxes?state=paused", None);
    assert_eq!(paused.as_array().unwrap().len(), 1, "{paused}");
    assert_eq!(
        call(
            c,
            "POST",
            &format!("/sandboxes/{id}/resume"),
            Some(json!({}))
        )
        .0,
        201
    );
    assert_eq!(
        call(
            c,
            "POST",
            &format!("/sandboxes/{id}/resume"),
            Some(json!({}))
        )
        .0,
        409
    );
    assert_eq!(
        call(c, "POST", &format!("/sandboxes/{id}/pause"), None).0,
        204
    );
    let (s, v, _) = call(
        c,
        "POST",
        &format!("/v2/sandboxes/{id}/connect"),
        Some(json!({"timeout": 100})),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["sandboxID"], id.as_str());
    let (_, info, _) = call(c, "GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(info["state"], "running");
    assert!((90.0..=101.0).contains(&end_in(&info)), "{info}");
    assert_eq!(d.sh(&id, "echo $GREETING").unwrap().1, "hi\n");
    let (s, _, _) = call(
        c,
        "POST",
        &format!("/sandboxes/{id}/connect"),
        Some(json!({"timeout": 10})),
    );
    assert_eq!(s, 200);
    // Paused through E2B and reached by the data plane instead of a
    // connect: E2B's default timeout from then.
    assert_eq!(
        call(c, "POST", &format!("/sandboxes/{other_id}/pause"), None).0,
        204
    );
    let (_, oinfo, _) = call(c, "GET", &format!("/sandboxes/{other_id}"), None);
    assert_eq!(oinfo["state"], "paused");
    let sock = d.state_dir().join("shoald.sock");
    let mut u = std::os::unix::net::UnixStream::connect(sock).unwrap();
    use std::io::{Read, Write};
    write!(u, "GET /health HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {other_id}\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    u.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 "), "{reply}");
    let (_, oinfo, _) = call(c, "GET", &format!("/sandboxes/{other_id}"), None);
    assert!((290.0..=301.0).contains(&end_in(&oinfo)), "{oinfo}");
    // Whatever the data plane did, a connect makes it run.
    let (s, _, _) = call(
        c,
        "POST",
        &format!("/v2/sandboxes/{other_id}/connect"),
        Some(json!({})),
    );
    assert!(s == 200 || s == 201, "{s}");

    // Fork: one clone, its own sandbox, the labels inherited.
    let (s, f, _) = call(
        c,
        "POST",
        &format!("/sandboxes/{id}/fork"),
        Some(json!({"count": 1, "timeout": 30})),
    );
    assert_eq!(s, 201, "{f}");
    let clone = f[0]["sandbox"]["sandboxID"].as_str().unwrap().to_string();
    assert_ne!(clone, id);
    let (_, ci, _) = call(c, "GET", &format!("/sandboxes/{clone}"), None);
    assert_eq!(ci["metadata"], json!({"run": "e2b", "n": "1"}));
    assert!((20.0..=31.0).contains(&end_in(&ci)), "{ci}");

    // Snapshots: a template, listed by sandbox, a create from it, deleted.
    let (s, snap, _) = call(
        c,
        "POST",
        &format!("/sandboxes/{id}/snapshots"),
        Some(json!({"name": "e2b-snap"})),
    );
    assert_eq!(s, 201, "{snap}");
    assert_eq!(
        snap,
        json!({"snapshotID": "e2b-snap", "names": ["e2b-snap"]})
    );
    let (_, ls, _) = call(c, "GET", &format!("/snapshots?sandboxID={id}"), None);
    assert_eq!(ls, json!([snap]));
    let (s, from, _) = call(
        c,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "e2b-snap"})),
    );
    assert_eq!(s, 201, "{from}");
    assert_eq!(from["templateID"], "e2b-snap");
    let from_id = from["sandboxID"].as_str().unwrap().to_string();
    assert_eq!(
        call(c, "DELETE", &format!("/sandboxes/{from_id}"), None).0,
        204
    );
    assert_eq!(call(c, "DELETE", "/templates/e2b-snap", None).0, 204);
    assert_eq!(
        call(c, "GET", &format!("/snapshots?sandboxID={id}"), None).1,
        json!([])
    );

    // Metrics (the fake VM is a host process) and logs (its events).
    let (s, m, _) = call(c, "GET", &format!("/sandboxes/{id}/metrics"), None);
    assert_eq!(s, 200, "{m}");
    assert_eq!(m.as_array().unwrap().len(), 1, "{m}");
    assert!(m[0]["memUsed"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m[0]["memTotal"].as_u64(), Some(128 << 20));
    let (_, many, _) = call(
        c,
        "GET",
        &format!("/sandboxes/metrics?sandbox_ids={id},{other_id}"),
        None,
    );
    assert_eq!(many["sandboxes"].as_object().unwrap().len(), 2, "{many}");
    let (_, logs, _) = call(c, "GET", &format!("/sandboxes/{id}/logs"), None);
    let lines: Vec<&str> = logs["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["line"].as_str().unwrap())
        .collect();
    assert!(lines.iter().any(|l| l.starts_with("paused")), "{lines:?}");
    let (_, v2, _) = call(
        c,
        "GET",
        &format!("/v2/sandboxes/{id}/logs?search=resumed"),
        None,
    );
    assert!(!v2["logs"].as_array().unwrap().is_empty(), "{v2}");

    // Network: a sandbox created without one cannot get one (409); what
    // shoald cannot do is a 400 first.
    let put = |body| call(c, "PUT", &format!("/sandboxes/{id}/network"), Some(body));
    let (s, m, _) = put(json!({"denyOut": ["0.0.0.0/0"]}));
    assert_eq!(s, 409, "{m}");
    assert!(
        m["message"].as_str().unwrap().contains("has no network"),
        "{m}"
    );
    assert_eq!(put(json!({})).0, 409);
    let (s, m, _) = put(json!({"rules": {"a.test": [{}]}}));
    assert_eq!(s, 400, "{m}");
    let (_, info, _) = call(c, "GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(info["allowInternetAccess"], false, "{info}");
    assert!(info.get("network").is_none(), "{info}");

    for s in [&id, &other_id, &clone] {
        assert_eq!(call(c, "DELETE", &format!("/sandboxes/{s}"), None).0, 204);
        assert_eq!(call(c, "DELETE", &format!("/sandboxes/{s}"), None).0, 404);
        assert_eq!(call(c, "GET", &format!("/sandboxes/{s}"), None).0, 404);
    }
    assert_eq!(call(c, "GET", "/v2/sandboxes", None).1, json!([]));
}
