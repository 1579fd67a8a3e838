//! Templates (an image booted once and snapshotted, or a sandbox's
//! snapshot) and their warm pools: `POST /v1/templates`
//! ([`CreateTemplate`]), [`Template`], [`Pool`] and
//! `PUT /v1/pools/{template}` ([`SetPool`]).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use utoipa::ToSchema;

/// States of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TemplateState {
    /// Being built (booted and snapshotted) in the background.
    Building,
    /// Ready: sandboxes can be restored from it.
    Ready,
    /// The build failed (see `error`).
    Failed,
}

impl TemplateState {
    /// Every state.
    pub const ALL: [TemplateState; 3] = [
        TemplateState::Building,
        TemplateState::Ready,
        TemplateState::Failed,
    ];

    /// Name as on the wire and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            TemplateState::Building => "building",
            TemplateState::Ready => "ready",
            TemplateState::Failed => "failed",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<TemplateState> {
        TemplateState::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

impl std::fmt::Display for TemplateState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /v1/templates`: register a template: an image, with optional
/// further read-only layers and a choice of upper layer, booted once and
/// snapshotted in the background (poll `GET /v1/templates/{name}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTemplate {
    /// Name (1-64 letters, digits, `-`, `_` or `.`).
    pub name: String,
    /// Image (`tiny` or `base`); may be left out (empty) for a `vm`
    /// template with its own `disk`.
    #[schema(example = "tiny")]
    #[serde(default)]
    pub image: String,
    /// vCPUs (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Guest memory in MiB (default 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// Further read-only layers over the image, lowest first
    /// (`/dev/pmem1`, ...): absolute paths of erofs images built with
    /// `shoal image build DIR -o OUT --no-agent` (4 KiB blocks, padded to
    /// 2 MiB), or image names (`tiny`, `base`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 8)]
    pub layers: Vec<String>,
    /// Upper layer on tmpfs of this many MiB (at most the guest's memory;
    /// default half of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub upper_size_mib: Option<u32>,
    /// Or the upper layer on a sparse ext4 scratch disk of this many MiB,
    /// one per sandbox. Not with `upper_size_mib`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 16, maximum = 1048576)]
    pub upper_disk_mib: Option<u32>,
    /// Boot it with a network device: its sandboxes are created with a
    /// `network` (each on its own slot), and only they use it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub network: bool,
    /// The kind of its sandboxes: `microvm` (default) or `vm` (a QEMU q35
    /// guest with a display: `/screen`, `/input`; the tiny image only, no
    /// layers or upper layer choice; a `network` needs the agent; the
    /// daemon runs it where the host has QEMU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "microvm")]
    pub kind: Option<String>,
    /// A `vm` template's own disk instead of an image: an absolute path of
    /// a raw or qcow2 file under the daemon's layers directory (no backing
    /// file; never written: each sandbox gets a qcow2 overlay over it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    /// Its format, `raw` or `qcow2` (default: what `qemu-img info` finds;
    /// if given, it must agree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_format: Option<String>,
    /// How the disk boots: `shoal` (default: Shoal's kernel, the disk's
    /// file system as the root, `disk_init` as PID 1; needed on PVM hosts)
    /// or `none` (the firmware boots the disk's own bootloader; hardware
    /// KVM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "shoal")]
    pub disk_kernel: Option<String>,
    /// With `disk_kernel: shoal`, the root device (default `/dev/vda`; a
    /// partition: `/dev/vda1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_root: Option<String>,
    /// With `disk_kernel: shoal`, Shoal's agent inside the disk, run as
    /// init (default `/usr/local/sbin/shoal-agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_init: Option<String>,
    /// `vm` kind only: `false` boots the guest without Shoal's agent, with
    /// a shell on its serial console instead (`init=/bin/sh`), and exec
    /// and files go through that console (stdout and stderr together,
    /// files up to 1 MiB, one request at a time). Default `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<bool>,
}

/// A `vm` template's own disk, as the daemon checked and keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TemplateDisk {
    /// The base image (never written).
    pub path: String,
    /// `raw` or `qcow2`.
    pub format: String,
    /// `shoal` (Shoal's kernel) or `none` (the firmware boots the disk).
    pub kernel: String,
    /// Root device (with Shoal's kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// Init inside the disk (with Shoal's kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<String>,
}

impl CreateTemplate {
    /// A template of `image` at the default shape.
    pub fn new(name: impl Into<String>, image: impl Into<String>) -> CreateTemplate {
        CreateTemplate {
            kind: None,
            agent: None,
            name: name.into(),
            image: image.into(),
            vcpus: None,
            memory_mib: None,
            layers: Vec::new(),
            upper_size_mib: None,
            upper_disk_mib: None,
            network: false,
            disk: None,
            disk_format: None,
            disk_kernel: None,
            disk_root: None,
            disk_init: None,
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
    pub fn with_root(mut self, root: RootRequest) -> CreateTemplate {
        self.layers = root.layers;
        self.upper_size_mib = root.upper_size_mib;
        self.upper_disk_mib = root.upper_disk_mib;
        self
    }
}

/// What a template's root has beyond its image: the fields of
/// [`CreateTemplate`] and [`CreateSandbox`](crate::CreateSandbox) (with
/// `image`) that choose layers and the upper layer; stored as it is with
/// each template.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootRequest {
    /// Further read-only layers over the image, lowest first (`/dev/pmem1`,
    /// ...): absolute paths of erofs images built with
    /// `shoal image build DIR -o OUT --no-agent` (4 KiB blocks, padded to
    /// 2 MiB), or image names (`tiny`, `base`). At most 8.
    #[serde(default)]
    pub layers: Vec<String>,
    /// A tmpfs upper layer of this many MiB (default: half the memory).
    #[serde(default)]
    pub upper_size_mib: Option<u32>,
    /// Or an ext4 scratch disk of this many MiB per sandbox as the upper
    /// layer (16 MiB to 1 TiB).
    #[serde(default)]
    pub upper_disk_mib: Option<u32>,
}

impl RootRequest {
    /// Whether anything differs from the plain image.
    pub fn is_default(&self) -> bool {
        self == &RootRequest::default()
    }
}

/// A template as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Template {
    /// Name.
    pub name: String,
    /// What it was made from: `image:NAME` or `sandbox:ID`.
    pub source: String,
    /// vCPUs.
    pub vcpus: u32,
    /// Guest memory (MiB).
    pub memory_mib: u32,
    /// Snapshot directory on the host, under the daemon's state directory
    /// (being written while building).
    #[schema(value_type = String)]
    pub dir: PathBuf,
    /// State.
    pub state: TemplateState,
    /// Why it failed.
    pub error: Option<String>,
    /// Seconds since the epoch.
    pub created_at: f64,
    /// The daemon owns `dir` (removed with the template).
    pub owned: bool,
    /// Who made it, the only caller (with the daemon's admin) that may
    /// delete it or change its pool: `uid:N` (a Unix socket caller),
    /// `token:NAME` (a TCP caller's token), `daemon` (the templates of
    /// `{"image": ...}` creates, whose names are reserved); null for
    /// templates of older daemons.
    #[serde(default)]
    pub owner: Option<String>,
    /// Further read-only layers over the image, lowest first.
    #[schema(max_items = 8)]
    pub layers: Vec<String>,
    /// Size of the tmpfs upper layer (MiB), when the upper layer is tmpfs.
    pub upper_size_mib: Option<u32>,
    /// Size of each sandbox's scratch disk (MiB), when the upper layer is
    /// one.
    pub upper_disk_mib: Option<u32>,
    /// The OCI image (`sha256:...`, its manifest's digest) whose layers are
    /// its root, for a container sandbox's template or a snapshot of one
    /// (its sandboxes keep that image's user, working directory and
    /// environment); null for the templates of built-in images.
    #[serde(default)]
    pub image: Option<String>,
    /// Booted with a network device: sandboxes of it are created with a
    /// `network`, each on its own slot.
    #[serde(default)]
    pub network: bool,
    /// The kind of its sandboxes: `microvm`, or `vm` (a QEMU q35 guest
    /// with a display); empty from older daemons (theirs are microVMs).
    #[serde(default)]
    pub kind: String,
    /// A `vm` template's own disk (null: it boots `source`'s image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<TemplateDisk>,
}

/// A warm pool: sandboxes of a template restored ahead of time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Pool {
    /// Template.
    pub template: String,
    /// Target size.
    pub target: u32,
    /// Sandboxes ready now.
    pub ready: u64,
}

/// `PUT /v1/pools/{template}`: a pool's target size (refilled in the
/// background).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPool {
    /// Target size (0 removes the pool; at most 10000).
    pub target: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip() {
        for s in TemplateState::ALL {
            assert_eq!(TemplateState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    #[test]
    fn template_wire_format() {
        let t = Template {
            name: "t".into(),
            source: "image:tiny".into(),
            vcpus: 1,
            memory_mib: 128,
            dir: "/d".into(),
            state: TemplateState::Ready,
            error: None,
            created_at: 1.0,
            owned: false,
            owner: Some("token:a".into()),
            layers: vec![],
            upper_size_mib: Some(64),
            upper_disk_mib: None,
            image: Some("sha256:ab".into()),
            network: true,
            kind: "vm".into(),
            disk: None,
        };
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["image"], "sha256:ab");
        assert_eq!(
            (&v["network"], &v["kind"]),
            (&serde_json::json!(true), &serde_json::json!("vm"))
        );
        assert_eq!(v["dir"], "/d");
        assert_eq!(v["layers"], serde_json::json!([]));
        assert!(v["error"].is_null() && v["upper_disk_mib"].is_null(), "{v}");
        assert_eq!(serde_json::from_value::<Template>(v).unwrap(), t);
        let c = CreateTemplate::new("t", "tiny");
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"name":"t","image":"tiny"}"#
        );
        assert!(serde_json::from_str::<SetPool>(r#"{"target":1,"x":2}"#).is_err());
    }
}
