//! A sandbox's network (issue 18): what `POST /v1/sandboxes` asks for
//! (`network`) and `PUT /v1/sandboxes/{id}/network` changes. A sandbox
//! created without one has no network device at all; one created with
//! one gets a virtio-net device behind a default-drop egress policy.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// At most this many entries in `allow_out` and in `deny_out` each (the
/// host's limit, `shoal_hostnet::policy::MAX_ENTRIES`).
pub const MAX_POLICY_ENTRIES: usize = 256;

/// A sandbox's egress policy: everything out is dropped but what
/// `allow_out` allows and `deny_out` does not deny.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// Destinations let through: `CIDR[:port[-port]]` (`10.1.2.0/24:443`,
    /// `1.2.3.4`), `domain`, `*.domain` or `*` (every name: their
    /// addresses as the sandbox's DNS lookups answer them, for the
    /// answers' TTL).
    #[serde(default)]
    #[schema(max_items = 256, example = json!(["pypi.org", "10.1.2.0/24:443"]))]
    pub allow_out: Vec<String>,
    /// Destinations dropped even where `allow_out` allows them (same
    /// syntax).
    #[serde(default)]
    #[schema(max_items = 256)]
    pub deny_out: Vec<String>,
    /// Answer DNS lookups (only for the names `allow_out` allows).
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub allow_dns: bool,
}

fn yes() -> bool {
    true
}

impl NetworkSpec {
    /// A policy that lets `allow_out` through, with DNS.
    pub fn allowing(allow_out: impl IntoIterator<Item = impl Into<String>>) -> NetworkSpec {
        NetworkSpec {
            allow_out: allow_out.into_iter().map(Into::into).collect(),
            deny_out: Vec::new(),
            allow_dns: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_defaults_and_strictness() {
        let s: NetworkSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(
            s,
            NetworkSpec {
                allow_dns: true,
                ..Default::default()
            }
        );
        let s: NetworkSpec =
            serde_json::from_str(r#"{"allow_out":["pypi.org"],"allow_dns":false}"#).unwrap();
        assert_eq!(s.allow_out, ["pypi.org"]);
        assert!(!s.allow_dns);
        let e = serde_json::from_str::<NetworkSpec>(r#"{"allow":["x"]}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let v = serde_json::to_value(NetworkSpec::allowing(["a.b"])).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"allow_out":["a.b"],"deny_out":[],"allow_dns":true})
        );
    }
}
