//! The wire types of shoald's HTTP/JSON API: every request and response
//! body, the query strings, the streamed exec events and the error body.
//! The daemon (`shoald`), its Rust client (`shoal_client`), the `shoal`
//! CLI, the benchmarks and the tests all use these, and shoald's OpenAPI
//! document (`GET /openapi.json`) is generated from their schemas
//! ([`utoipa::ToSchema`]), so the three cannot drift apart.
//!
//! Conventions of the wire format, kept exactly:
//! - request bodies reject unknown fields (a typo is a 400, not ignored);
//!   every optional request field may be omitted or `null`;
//! - response bodies list every field, optional ones as `null` (except
//!   [`Sandbox::from_pool`], present only in a create's reply);
//! - errors are [`ErrorBody`]: `{"error":{"code":..,"message":..}}`.
//!
//! - [`sandbox`]: create, view, list filters, snapshot.
//! - [`network`]: a sandbox's network and egress policy.
//! - [`fork`]: fork a running sandbox into clones.
//! - [`fncall`]: one-shot stateless calls of untrusted code, and batches.
//! - [`exec`]: exec request, one-shot result, streamed events.
//! - [`commands`]: background commands (started, listed, streamed,
//!   waited for, signalled, written to).
//! - [`files`]: upload, download, stat, list, remove, mkdir, rename.
//! - [`templates`]: templates and warm pools.
//! - [`images`]: OCI images in the host's image store.
//! - [`stats`]: usage, limits, host, events.
//! - [`error`]: the error body and its codes.
//! - [`time`]: the calendar arithmetic behind RFC 3339 times.

pub mod commands;
pub mod display;
pub mod error;
pub mod exec;
pub mod files;
pub mod fncall;
pub mod fork;
pub mod images;
pub mod network;
pub mod sandbox;
pub mod stats;
pub mod templates;
pub mod time;

pub use commands::{Command, CommandState, SignalCommand, StdinQuery, WaitQuery};
pub use display::{InputEvent, InputRequest, MAX_INPUT_EVENTS, POINTER_MAX};
pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use exec::{Encoding, ExecEvent, ExecRequest, ExecResult};
pub use files::{
    DirEntry, FileQuery, FileStat, FileType, MkdirQuery, RemoveQuery, RenameRequest, UploadQuery,
    Uploaded,
};
pub use fncall::{
    BatchItem, BatchRequest, CompileResult, FnCallRequest, FnCallResult, FnCallStatus, Language,
};
pub use fork::{ForkRequest, Forked, MAX_FORK_COUNT};
pub use images::{Image, ImageList, PullImage};
pub use network::{NetworkSpec, MAX_POLICY_ENTRIES};
pub use sandbox::{
    CreateSandbox, ListFilter, Priority, Sandbox, SandboxState, SnapshotRequest, UpdateSandbox,
};
pub use stats::{Event, EventQuery, HostStats, Limits, Stats, Usage};
pub use templates::{
    CreateTemplate, Pool, RootRequest, SetPool, Template, TemplateDisk, TemplateState,
};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always true when the daemon answers.
    pub ok: bool,
}

/// Percent-encodes a query-string value (RFC 3986 unreserved characters
/// and `/` are kept).
pub fn encode_query_value(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_./~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// Builds `?k=v&k=v` from the pairs that are set ("" when none is).
pub(crate) fn query_string<'a>(
    pairs: impl IntoIterator<Item = (&'a str, Option<String>)>,
) -> String {
    let parts: Vec<String> = pairs
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode_query_value(&v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode_query_value("/tmp/a b&c=d"), "/tmp/a%20b%26c%3Dd");
        assert_eq!(query_string([("a", None), ("b", None)]), "");
        assert_eq!(
            query_string([
                ("a", Some("x y".into())),
                ("b", None),
                ("c", Some("1".into()))
            ]),
            "?a=x%20y&c=1"
        );
    }
}
