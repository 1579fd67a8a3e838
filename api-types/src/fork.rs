//! `POST /v1/sandboxes/{id}/fork`: a running sandbox snapshotted once and
//! restored into N live clones that continue from that instant, each with
//! its own memory (copy-on-write of the snapshot), upper layer, entropy
//! and clock; the source goes on.

use crate::error::ErrorDetail;
use crate::sandbox::Sandbox;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Most clones one fork makes.
pub const MAX_FORK_COUNT: u32 = 100;

/// The body of a fork.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many clones (1 to 100).
    pub count: u32,
    /// Labels of the clones (default: the source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

impl ForkRequest {
    /// `count` clones with the source's labels.
    pub fn new(count: u32) -> ForkRequest {
        ForkRequest {
            count,
            metadata: None,
        }
    }
}

/// The reply to a fork that made at least one clone (201): the clones
/// made, and why each of the others was not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Forked {
    /// The sandbox forked.
    pub source: String,
    /// The clones, running.
    pub sandboxes: Vec<Sandbox>,
    /// One entry per clone not made (admission refused it, or its restore
    /// failed).
    pub failed: Vec<ErrorDetail>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_bodies_are_strict() {
        let r: ForkRequest = serde_json::from_str(r#"{"count":3}"#).unwrap();
        assert_eq!(r, ForkRequest::new(3));
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"count":3}"#);
        assert!(serde_json::from_str::<ForkRequest>(r#"{"count":3,"n":1}"#).is_err());
        assert!(serde_json::from_str::<ForkRequest>(r#"{}"#).is_err());
        assert!(serde_json::from_str::<ForkRequest>(r#"{"count":-1}"#).is_err());
        let m: ForkRequest =
            serde_json::from_str(r#"{"count":1,"metadata":{"branch":"a"}}"#).unwrap();
        assert_eq!(m.metadata.unwrap()["branch"], "a");
    }
}
