//! The OpenAPI 3.0 document served at `/openapi.json`, written from a
//! table of operations (a unit test in `api` checks that it lists every
//! route and nothing else).

use serde_json::{json, Value};
use shoal_images::layers::{
    MAX_LAYERS, MAX_UPPER_DISK_MIB, MIN_UPPER_DISK_MIB, MIN_UPPER_SIZE_MIB,
};

struct Op {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    query: &'static [(&'static str, &'static str)],
    body: Option<&'static str>,
    ok: (u16, &'static str),
}

const SB: &str = "/v1/sandboxes/{id}";

const OPS: &[Op] = &[
    Op { method: "get", path: "/openapi.json", summary: "This document.", query: &[], body: None, ok: (200, "") },
    Op { method: "get", path: "/healthz", summary: "Liveness (no token needed on TCP).", query: &[], body: None, ok: (200, "") },
    Op { method: "get", path: "/metrics", summary: "Prometheus metrics (text exposition format).", query: &[], body: None, ok: (200, "") },
    Op { method: "get", path: "/v1/stats", summary: "Usage, limits, host memory and pools.", query: &[], body: None, ok: (200, "") },
    Op { method: "get", path: "/v1/events", summary: "Event log (create, kill, failure, pause, ...).", query: &[("since", "sequence number to start after"), ("sandbox", "only this sandbox or template"), ("limit", "at most this many (default 1000)")], body: None, ok: (200, "Event") },
    Op { method: "post", path: "/v1/sandboxes", summary: "Create a sandbox from a template or an image (restored, from a warm pool when there is one). 429/503 when the host is full.", query: &[], body: Some("CreateSandbox"), ok: (201, "Sandbox") },
    Op { method: "get", path: "/v1/sandboxes", summary: "List sandboxes.", query: &[("state", "starting|running|pausing|paused|failed|pooled"), ("template", "template name"), ("metadata", "KEY:VALUE[,KEY:VALUE] (all must match)")], body: None, ok: (200, "Sandbox") },
    Op { method: "get", path: SB, summary: "Get a sandbox.", query: &[], body: None, ok: (200, "Sandbox") },
    Op { method: "delete", path: SB, summary: "Kill a sandbox and remove everything it had.", query: &[], body: None, ok: (204, "") },
    Op { method: "post", path: "/v1/sandboxes/{id}/exec", summary: "Run a command and return its output when it exits (a paused sandbox is resumed first).", query: &[], body: Some("Exec"), ok: (200, "ExecResult") },
    Op { method: "post", path: "/v1/sandboxes/{id}/exec/stream", summary: "Run a command, streaming newline-delimited JSON events: start {pid}, stdout/stderr {data, encoding: utf8|base64}, then exit {exit_code, signal, timed_out} or error {message}.", query: &[], body: Some("Exec"), ok: (200, "") },
    Op { method: "put", path: "/v1/sandboxes/{id}/files", summary: "Upload a file (the raw request body, streamed).", query: &[("path", "absolute guest path (required)"), ("mode", "octal permission bits (default 644)"), ("append", "true to append"), ("parents", "true to create missing parent directories")], body: Some("raw"), ok: (201, "") },
    Op { method: "get", path: "/v1/sandboxes/{id}/files", summary: "Download a file (streamed raw body; x-file-size header).", query: &[("path", "absolute guest path (required)")], body: None, ok: (200, "") },
    Op { method: "delete", path: "/v1/sandboxes/{id}/files", summary: "Remove a file or directory.", query: &[("path", "absolute guest path (required)"), ("recursive", "true to remove a tree")], body: None, ok: (204, "") },
    Op { method: "get", path: "/v1/sandboxes/{id}/files/stat", summary: "A file's type, mode, size and mtime.", query: &[("path", "absolute guest path (required)")], body: None, ok: (200, "Stat") },
    Op { method: "get", path: "/v1/sandboxes/{id}/files/list", summary: "A directory's entries.", query: &[("path", "absolute guest path (required)")], body: None, ok: (200, "Entry") },
    Op { method: "post", path: "/v1/sandboxes/{id}/snapshot", summary: "Snapshot a running sandbox into a new template (the sandbox continues).", query: &[], body: Some("Snapshot"), ok: (201, "Template") },
    Op { method: "post", path: "/v1/sandboxes/{id}/pause", summary: "Pause: state to disk, the VMM process ends.", query: &[], body: None, ok: (200, "Sandbox") },
    Op { method: "post", path: "/v1/sandboxes/{id}/resume", summary: "Resume a paused sandbox (any exec or file request also does).", query: &[], body: None, ok: (200, "Sandbox") },
    Op { method: "post", path: "/v1/templates", summary: "Register a template: an image, with optional further read-only layers and a choice of upper layer (tmpfs of a size, or a scratch disk per sandbox), booted once and snapshotted (built in the background; poll GET).", query: &[], body: Some("CreateTemplate"), ok: (202, "Template") },
    Op { method: "get", path: "/v1/templates", summary: "List templates.", query: &[], body: None, ok: (200, "Template") },
    Op { method: "get", path: "/v1/templates/{name}", summary: "Get a template (state building|ready|failed).", query: &[], body: None, ok: (200, "Template") },
    Op { method: "delete", path: "/v1/templates/{name}", summary: "Delete a template and its pool.", query: &[], body: None, ok: (204, "") },
    Op { method: "get", path: "/v1/pools", summary: "Warm pools: target and ready sizes.", query: &[], body: None, ok: (200, "Pool") },
    Op { method: "put", path: "/v1/pools/{template}", summary: "Set a warm pool's target size (refilled in the background).", query: &[], body: Some("SetPool"), ok: (200, "Pool") },
    Op { method: "delete", path: "/v1/pools/{template}", summary: "Remove a pool and its warm sandboxes.", query: &[], body: None, ok: (204, "") },
];

fn obj(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required})
}

fn schemas() -> Value {
    let s = |t: &str| json!({"type": t});
    let map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let layers = json!({"type": "array", "maxItems": MAX_LAYERS, "items": {"type": "string"},
        "description": "Further read-only layers over the image, lowest first (/dev/pmem1, ...): \
            absolute paths of erofs images built with `shoal image build DIR -o OUT --no-agent` \
            (4 KiB blocks, padded to 2 MiB), or image names (tiny, base)."});
    let upper_size = json!({"type": "integer", "minimum": MIN_UPPER_SIZE_MIB,
        "description": "Upper layer on tmpfs of this many MiB (at most the guest's memory; \
            default half of it). Writes beyond it fail with ENOSPC."});
    let upper_disk = json!({"type": "integer", "minimum": MIN_UPPER_DISK_MIB, "maximum": MAX_UPPER_DISK_MIB,
        "description": "Upper layer on a sparse ext4 scratch disk of this many MiB, one per sandbox \
            (copied from the template's at restore; kept while paused, removed with the sandbox). \
            Not with upper_size_mib."});
    json!({
        "Error": obj(json!({"error": obj(json!({"code": s("string"), "message": s("string")}), &["code", "message"])}), &["error"]),
        "CreateSandbox": obj(json!({
            "template": s("string"), "image": {"type": "string", "enum": ["tiny", "base"]},
            "vcpus": s("integer"), "memory_mib": s("integer"),
            "layers": layers.clone(), "upper_size_mib": upper_size.clone(), "upper_disk_mib": upper_disk.clone(),
            "ttl_s": s("integer"),
            "idle_timeout_s": s("integer"), "metadata": map, "env": map,
            "keep_running": s("boolean")}), &[]),
        "Sandbox": obj(json!({
            "id": s("string"), "template": s("string"),
            "state": {"type": "string", "enum": ["starting", "running", "pausing", "paused", "failed", "pooled"]},
            "vcpus": s("integer"), "memory_mib": s("integer"), "pid": s("integer"),
            "created_at": s("number"), "last_active": s("number"), "ttl_s": s("integer"),
            "idle_timeout_s": s("integer"), "metadata": map, "env": map, "error": s("string"),
            "from_pool": s("boolean")}), &["id", "state"]),
        "Exec": obj(json!({
            "cmd": {"type": "array", "items": s("string")}, "shell": s("string"), "env": map,
            "cwd": s("string"), "timeout_s": s("number"), "stdin": s("string"), "stdin_b64": s("string")}), &[]),
        "ExecResult": obj(json!({
            "exit_code": s("integer"), "signal": s("integer"), "timed_out": s("boolean"),
            "stdout": s("string"), "stderr": s("string"),
            "encoding": {"type": "string", "enum": ["utf8", "base64"]},
            "truncated": s("boolean"), "duration_ms": s("number")}), &["timed_out", "stdout", "stderr", "encoding"]),
        "Stat": obj(json!({"type": s("string"), "mode": s("integer"), "size": s("integer"), "mtime_ns": s("integer")}), &["type"]),
        "Entry": obj(json!({"name": s("string"), "type": s("string")}), &["name", "type"]),
        "Snapshot": obj(json!({"template": s("string")}), &[]),
        "CreateTemplate": obj(json!({"name": s("string"), "image": {"type": "string", "enum": ["tiny", "base"]},
            "vcpus": s("integer"), "memory_mib": s("integer"),
            "layers": layers.clone(), "upper_size_mib": upper_size.clone(), "upper_disk_mib": upper_disk.clone()}), &["name", "image"]),
        "Template": obj(json!({"name": s("string"), "source": s("string"), "vcpus": s("integer"),
            "memory_mib": s("integer"), "dir": s("string"),
            "state": {"type": "string", "enum": ["building", "ready", "failed"]},
            "error": s("string"), "created_at": s("number"), "owned": s("boolean"),
            "layers": layers, "upper_size_mib": upper_size, "upper_disk_mib": upper_disk}), &["name", "state"]),
        "Pool": obj(json!({"template": s("string"), "target": s("integer"), "ready": s("integer")}), &["template", "target", "ready"]),
        "SetPool": obj(json!({"target": s("integer")}), &["target"]),
        "Event": obj(json!({"seq": s("integer"), "ts": s("number"), "subject": s("string"), "kind": s("string"), "detail": s("string")}), &["seq"]),
    })
}

fn operation(o: &Op) -> Value {
    let mut params: Vec<Value> = Vec::new();
    for seg in o.path.split('/') {
        if let Some(n) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            params.push(
                json!({"name": n, "in": "path", "required": true, "schema": {"type": "string"}}),
            );
        }
    }
    for (n, d) in o.query {
        params.push(json!({"name": n, "in": "query", "required": *n == "path",
            "description": d, "schema": {"type": "string"}}));
    }
    let err = json!({"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let ok_content = match o.ok.1 {
        "" => json!({}),
        "Sandbox" | "Event" | "Entry" | "Pool" | "Template"
            if o.method == "get" && !o.path.contains('{') =>
        {
            json!({"application/json": {"schema": {"type": "array", "items": {"$ref": format!("#/components/schemas/{}", o.ok.1)}}}})
        }
        n => json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{n}")}}}),
    };
    let mut responses = json!({
        o.ok.0.to_string(): {"description": "success", "content": ok_content},
        "400": err, "401": err, "404": err, "409": err, "500": err, "502": err, "504": err,
    });
    if o.path == "/v1/sandboxes" && o.method == "post" || o.path.ends_with("/resume") {
        responses["429"] = json!({"description": "host full (admission quota); Retry-After", "content": err["content"]});
        responses["503"] =
            json!({"description": "host memory low; Retry-After", "content": err["content"]});
    }
    let mut op = json!({"summary": o.summary, "parameters": params, "responses": responses});
    match o.body {
        Some("raw") => {
            op["requestBody"] = json!({"required": true, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}});
        }
        Some(n) => {
            op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{n}")}}}});
        }
        None => {}
    }
    op
}

/// The document.
pub fn document() -> Value {
    let mut paths = serde_json::Map::new();
    for o in OPS {
        let e = paths.entry(o.path).or_insert_with(|| json!({}));
        e[o.method] = operation(o);
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "shoald",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Shoal host daemon: KVM microVM sandboxes restored from warm templates. \
                Unix socket by default; on TCP every route but /healthz needs 'Authorization: Bearer TOKEN'. \
                Errors are {\"error\":{\"code\",\"message\"}}.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    })
}
