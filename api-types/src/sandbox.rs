//! Sandboxes: `POST /v1/sandboxes` ([`CreateSandbox`]), the view every
//! sandbox route answers with ([`Sandbox`]), its new limits
//! (`PATCH /v1/sandboxes/{id}`: [`UpdateSandbox`]), the list filters
//! ([`ListFilter`]) and `POST /v1/sandboxes/{id}/snapshot`
//! ([`SnapshotRequest`]).

use crate::network::NetworkSpec;
use crate::templates::RootRequest;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use utoipa::{IntoParams, ToSchema};

/// Lifecycle states of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Restored and waiting in a warm pool (not handed out yet; never
    /// listed).
    Pooled,
    /// The VMM is being started.
    Starting,
    /// Running.
    Running,
    /// Being paused (snapshot to disk).
    Pausing,
    /// State on disk, no VMM process.
    Paused,
    /// Its VMM died or could not be reattached; reclaimed.
    Failed,
}

impl SandboxState {
    /// Every state.
    pub const ALL: [SandboxState; 6] = [
        SandboxState::Pooled,
        SandboxState::Starting,
        SandboxState::Running,
        SandboxState::Pausing,
        SandboxState::Paused,
        SandboxState::Failed,
    ];

    /// Name as on the wire and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Pooled => "pooled",
            SandboxState::Starting => "starting",
            SandboxState::Running => "running",
            SandboxState::Pausing => "pausing",
            SandboxState::Paused => "paused",
            SandboxState::Failed => "failed",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<SandboxState> {
        SandboxState::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Whether a VMM process holds host resources in this state.
    pub fn has_vmm(self) -> bool {
        matches!(
            self,
            SandboxState::Pooled
                | SandboxState::Starting
                | SandboxState::Running
                | SandboxState::Pausing
        )
    }
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a sandbox's VMM is scheduled on the host's CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Normal scheduling, the normal CPU weight (more while it serves a
    /// fresh request), and, where the host kernel has core scheduling, its
    /// vCPUs kept off SMT siblings running other sandboxes.
    #[default]
    Latency,
    /// Runs only on CPU time no latency sandbox wants: every VMM thread
    /// `SCHED_IDLE` and a low CPU weight for its cgroup (batch work:
    /// rollouts nobody waits on).
    BestEffort,
}

impl Priority {
    /// Every priority.
    pub const ALL: [Priority; 2] = [Priority::Latency, Priority::BestEffort];

    /// Name as on the wire and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Latency => "latency",
            Priority::BestEffort => "best_effort",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Whether it is the default ([`Priority::Latency`]).
    pub fn is_latency(&self) -> bool {
        *self == Priority::Latency
    }
}

/// By hand, so that a bad value (a number, an unknown name) is refused
/// naming the choices.
impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Priority, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Priority;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a priority: \"latency\" or \"best_effort\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Priority, E> {
                Priority::parse(s).ok_or_else(|| {
                    E::custom(format!(
                        "unknown priority {s:?}: use \"latency\" or \"best_effort\""
                    ))
                })
            }
        }
        d.deserialize_str(V)
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /v1/sandboxes`: a sandbox from a template, or from an image
/// (whose template, booted once and cached, is used). 429/503 when the
/// host is full.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// A registered template's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Or an image: `tiny`, `base`, or an OCI image pulled into the
    /// host's image store (`shoal image pull REF`), by reference or id
    /// (`sha256:...`): a container sandbox whose root is the image's
    /// layers, with the image's Env, WorkingDir and User as exec defaults.
    /// Its template (booted once, cached) is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "tiny")]
    pub image: Option<String>,
    /// vCPUs (with `image`, default 1; a template fixes its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Guest memory in MiB (with `image`, default 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// Further read-only layers over the image, lowest first (with
    /// `image`; `/dev/pmem1`, ...): absolute paths of erofs images built
    /// with `shoal image build DIR -o OUT --no-agent` (4 KiB blocks, padded
    /// to 2 MiB), or image names (`tiny`, `base`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 8)]
    pub layers: Vec<String>,
    /// Upper layer on tmpfs of this many MiB (with `image`; at most the
    /// guest's memory; default half of it). Writes beyond it fail with
    /// ENOSPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub upper_size_mib: Option<u32>,
    /// Or the upper layer on a sparse ext4 scratch disk of this many MiB,
    /// one per sandbox (with `image`; copied from the template's at
    /// restore, kept while paused, removed with the sandbox). Not with
    /// `upper_size_mib`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 16, maximum = 1048576)]
    pub upper_disk_mib: Option<u32>,
    /// Killed this many seconds after creation (0: never).
    #[serde(default)]
    pub ttl_s: u64,
    /// Paused after this many seconds without API activity (0: never).
    #[serde(default)]
    pub idle_timeout_s: u64,
    /// Free-form labels (list filters match them): at most 64 keys of at
    /// most 128 bytes, values of at most 1024 bytes, 16 KiB in all.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Environment for every exec in the sandbox: at most 256 names of at
    /// most 256 bytes, values of at most 32 KiB, 256 KiB in all.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Never freeze it while idle (background processes keep running; it
    /// then costs CPU while idle).
    #[serde(default)]
    pub keep_running: bool,
    /// At its TTL, pause it (to disk) instead of killing it; the TTL is
    /// then cleared: a resume gives it none until one is set (`PATCH`).
    /// Sent only when true (a daemon before it refuses the field).
    #[serde(default, skip_serializing_if = "is_false")]
    pub pause_at_ttl: bool,
    /// A network device behind this egress policy (absent or `null`: no
    /// network device at all; one cannot be added later, the policy can
    /// be changed: `PUT /v1/sandboxes/{id}/network`). Sent only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    /// CPU class: `latency` (default) or `best_effort`. Sent only when
    /// not the default (a daemon before it refuses the field).
    #[serde(default, skip_serializing_if = "Priority::is_latency")]
    pub priority: Priority,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl CreateSandbox {
    /// A sandbox from the template `name`.
    pub fn from_template(name: impl Into<String>) -> CreateSandbox {
        CreateSandbox {
            template: Some(name.into()),
            ..Default::default()
        }
    }

    /// A sandbox from `image` (`tiny`, `base`) at the default shape.
    pub fn from_image(image: impl Into<String>) -> CreateSandbox {
        CreateSandbox {
            image: Some(image.into()),
            ..Default::default()
        }
    }

    /// The root it asks for beyond the image.
    pub fn root(&self) -> RootRequest {
        RootRequest {
            layers: self.layers.clone(),
            upper_size_mib: self.upper_size_mib,
            upper_disk_mib: self.upper_disk_mib,
        }
    }

    /// Sets the root fields from `root`.
    pub fn with_root(mut self, root: RootRequest) -> CreateSandbox {
        self.layers = root.layers;
        self.upper_size_mib = root.upper_size_mib;
        self.upper_disk_mib = root.upper_disk_mib;
        self
    }
}

/// A sandbox as every sandbox route shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    /// Id (12 hex digits).
    pub id: String,
    /// Template it was restored from.
    pub template: String,
    /// How its VM runs (its template's kind): `microvm` (our VMM; plain,
    /// FnCall and container sandboxes alike) or `vm` (a QEMU q35 guest
    /// with a display); empty from older daemons (theirs are microVMs).
    #[serde(default)]
    #[schema(example = "microvm")]
    pub kind: String,
    /// State.
    pub state: SandboxState,
    /// vCPUs.
    pub vcpus: u32,
    /// Guest memory (MiB).
    pub memory_mib: u32,
    /// VMM process id (while one runs).
    pub pid: Option<i32>,
    /// Seconds since the epoch.
    pub created_at: f64,
    /// Last API activity, seconds since the epoch.
    pub last_active: f64,
    /// TTL (s; 0 none).
    pub ttl_s: u64,
    /// Idle timeout (s; 0 none).
    pub idle_timeout_s: u64,
    /// Labels.
    pub metadata: BTreeMap<String, String>,
    /// Environment of every exec.
    pub env: BTreeMap<String, String>,
    /// Why it failed.
    pub error: Option<String>,
    /// Never frozen while idle.
    pub keep_running: bool,
    /// Paused, not killed, at its TTL.
    pub pause_at_ttl: bool,
    /// Its egress policy (`null`: it has no network device).
    #[serde(default)]
    pub network: Option<NetworkSpec>,
    /// The guest's IPv4 address (`null`: no network device).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "10.213.0.2")]
    pub guest_addr: Option<Ipv4Addr>,
    /// Served from a warm pool (only in the reply to a create).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_pool: Option<bool>,
    /// CPU class.
    #[serde(default)]
    pub priority: Priority,
    /// Whether its vCPUs are kept off SMT siblings that run other
    /// sandboxes' threads (only in the reply to a create or a priority
    /// change; `false` says why in `warnings`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smt_isolation: Option<bool>,
    /// What the host could not give it as asked (only in the reply to a
    /// create or a priority change): e.g. no SMT isolation on a kernel
    /// without core scheduling.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `PATCH /v1/sandboxes/{id}`: new limits (each optional; what is left
/// out stays). Answered with the [`Sandbox`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSandbox {
    /// Killed this many seconds from now (0: never). The sandbox's
    /// `ttl_s` becomes the seconds from its creation to then (rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// Paused after this many seconds without API activity (0: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_s: Option<u64>,
    /// A new CPU class, applied at once to a running sandbox's VMM (a
    /// paused one gets it when it resumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
}

/// `GET /v1/sandboxes` filters (all must match).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListFilter {
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
    /// Only sandboxes of this template.
    pub template: Option<String>,
    /// Only sandboxes with all these labels, as `KEY:VALUE[,KEY:VALUE]`.
    #[param(value_type = Option<String>, example = "run:ci,owner:me")]
    pub metadata: BTreeMap<String, String>,
}

impl ListFilter {
    /// The query string (`?state=...`, or "" for no filter).
    pub fn to_query(&self) -> String {
        let meta: Vec<String> = self
            .metadata
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        crate::query_string([
            ("state", self.state.map(|s| s.as_str().to_string())),
            ("template", self.template.clone()),
            ("metadata", (!meta.is_empty()).then(|| meta.join(","))),
        ])
    }
}

/// `POST /v1/sandboxes/{id}/snapshot`: a running sandbox into a new
/// template (the sandbox goes on).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Name of the new template (default `snap-ID-TIME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip() {
        for s in SandboxState::ALL {
            assert_eq!(SandboxState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert_eq!(SandboxState::parse("sleepy"), None);
    }

    #[test]
    fn create_bodies_are_minimal_and_strict() {
        let c = CreateSandbox::from_template("t");
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"template":"t","ttl_s":0,"idle_timeout_s":0,"keep_running":false}"#
        );
        let c: CreateSandbox = serde_json::from_str(r#"{"image":"tiny","vcpus":null}"#).unwrap();
        assert_eq!(c, CreateSandbox::from_image("tiny"));
        let e = serde_json::from_str::<CreateSandbox>(r#"{"image":"tiny","cpus":2}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn list_filters_as_query() {
        assert_eq!(ListFilter::default().to_query(), "");
        let f = ListFilter {
            state: Some(SandboxState::Running),
            template: Some("a b".into()),
            metadata: [("run".to_string(), "x".to_string())].into(),
        };
        assert_eq!(
            f.to_query(),
            "?state=running&template=a%20b&metadata=run%3Ax"
        );
    }

    #[test]
    fn sandbox_view_wire_format() {
        let s = Sandbox {
            id: "abc".into(),
            template: "t".into(),
            kind: "microvm".into(),
            state: SandboxState::Running,
            vcpus: 1,
            memory_mib: 128,
            pid: None,
            created_at: 1.5,
            last_active: 2.5,
            ttl_s: 0,
            idle_timeout_s: 0,
            metadata: BTreeMap::new(),
            env: BTreeMap::new(),
            error: None,
            keep_running: false,
            pause_at_ttl: false,
            network: None,
            guest_addr: None,
            from_pool: None,
            priority: Priority::Latency,
            smt_isolation: None,
            warnings: vec![],
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["priority"], "latency", "{v}");
        assert_eq!(v["kind"], "microvm", "{v}");
        assert!(v.get("smt_isolation").is_none() && v.get("warnings").is_none());
        assert!(v["pid"].is_null() && v["error"].is_null(), "{v}");
        assert!(v["network"].is_null() && v["guest_addr"].is_null(), "{v}");
        assert!(v.get("from_pool").is_none(), "{v}");
        assert_eq!(serde_json::from_value::<Sandbox>(v).unwrap(), s);
        let s = Sandbox {
            network: Some(NetworkSpec::allowing(["pypi.org"])),
            guest_addr: Some(Ipv4Addr::new(10, 213, 0, 2)),
            ..s
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["guest_addr"], "10.213.0.2", "{v}");
        assert_eq!(v["network"]["allow_out"][0], "pypi.org", "{v}");
        assert_eq!(serde_json::from_value::<Sandbox>(v).unwrap(), s);
        let s = Sandbox {
            kind: "vm".into(),
            ..s
        };
        let mut v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["kind"], "vm", "{v}");
        assert_eq!(serde_json::from_value::<Sandbox>(v.clone()).unwrap(), s);
        // An older daemon's view has no kind: read as empty.
        v.as_object_mut().unwrap().remove("kind");
        let old = serde_json::from_value::<Sandbox>(v).unwrap();
        assert_eq!(old.kind, "");
    }

    #[test]
    fn priority_is_sent_only_when_best_effort_and_checked() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.as_str()), Some(p));
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        let c = CreateSandbox::from_template("t");
        assert!(!serde_json::to_string(&c).unwrap().contains("priority"));
        let c: CreateSandbox =
            serde_json::from_str(r#"{"template":"t","priority":"best_effort"}"#).unwrap();
        assert_eq!(c.priority, Priority::BestEffort);
        assert!(serde_json::to_string(&c)
            .unwrap()
            .contains(r#""priority":"best_effort""#));
        let e = serde_json::from_str::<CreateSandbox>(r#"{"template":"t","priority":"high"}"#)
            .unwrap_err();
        assert!(
            e.to_string().contains(r#"use "latency" or "best_effort""#),
            "{e}"
        );
        let e = serde_json::from_str::<UpdateSandbox>(r#"{"priority":3}"#).unwrap_err();
        assert!(
            e.to_string().contains(r#""latency" or "best_effort""#),
            "{e}"
        );
        let u: UpdateSandbox = serde_json::from_str(r#"{"priority":"latency"}"#).unwrap();
        assert_eq!(u.priority, Some(Priority::Latency));
        assert_eq!(
            serde_json::to_string(&UpdateSandbox::default()).unwrap(),
            "{}"
        );
    }

    #[test]
    fn create_network_is_optional() {
        let c: CreateSandbox = serde_json::from_str(r#"{"image":"tiny","network":null}"#).unwrap();
        assert_eq!(c.network, None);
        let c: CreateSandbox =
            serde_json::from_str(r#"{"image":"tiny","network":{"allow_out":["1.2.3.4:53"]}}"#)
                .unwrap();
        assert_eq!(c.network, Some(NetworkSpec::allowing(["1.2.3.4:53"])));
        let e = serde_json::from_str::<CreateSandbox>(r#"{"image":"tiny","network":{"x":1}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}
