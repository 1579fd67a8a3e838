//! The OpenAPI 3.1 document served at `/openapi.json`, generated: paths
//! and operations from the route table ([`crate::api::routes`]) and the
//! handlers' `#[utoipa::path]`, schemas from the [`shoal_api`] types the
//! daemon parses and answers with. Unit tests check that the document
//! lists exactly the routes the router serves and that every body in it
//! is the schema of its shared type.

use std::sync::OnceLock;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi;

/// The document's fixed parts (info, the error schema, the bearer
/// scheme); [`crate::api::routes`] adds every operation.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "shoald",
        description = "Shoal host daemon: KVM microVM sandboxes restored from warm templates. \
            Unix socket by default; on TCP every route but /healthz needs \
            'Authorization: Bearer TOKEN'. Errors are {\"error\":{\"code\",\"message\"}}; \
            429 and 503 come with Retry-After."
    ),
    components(schemas(shoal_api::ErrorBody, shoal_api::ErrorCode)),
    modifiers(&Bearer),
    tags(
        (name = "sandboxes", description = "Create, list, pause, resume, snapshot, kill"),
        (name = "exec", description = "Commands in a sandbox"),
        (name = "files", description = "Files in a sandbox"),
        (name = "templates", description = "Snapshots sandboxes are restored from"),
        (name = "pools", description = "Warm pools of restored sandboxes"),
        (name = "meta", description = "Health, metrics, stats, events, this document"),
    )
)]
pub struct ApiDoc;

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, doc: &mut OpenApi) {
        if let Some(c) = doc.components.as_mut() {
            c.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

/// The document.
pub fn document() -> &'static OpenApi {
    static DOC: OnceLock<OpenApi> = OnceLock::new();
    DOC.get_or_init(|| crate::api::routes().split_for_parts().1)
}

/// The document as JSON.
pub fn document_json() -> &'static serde_json::Value {
    static DOC: OnceLock<serde_json::Value> = OnceLock::new();
    DOC.get_or_init(|| serde_json::to_value(document()).unwrap_or_default())
}

/// HTTP methods, as the document names them.
pub const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Every route the document lists: (method, path), methods lower-case.
pub fn routes() -> Vec<(String, String)> {
    let mut v = Vec::new();
    if let Some(paths) = document_json()["paths"].as_object() {
        for (p, ops) in paths {
            for m in ops.as_object().into_iter().flat_map(|o| o.keys()) {
                if METHODS.contains(&m.as_str()) {
                    v.push((m.clone(), p.clone()));
                }
            }
        }
    }
    v
}

#[cfg(test)]
#[path = "openapi_tests.rs"]
mod tests;
