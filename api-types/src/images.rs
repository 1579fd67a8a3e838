//! OCI images held by the host's image store: `POST /v1/images` (pull),
//! `GET /v1/images`, `GET /v1/images/{id}`, `DELETE /v1/images/{id}`, and
//! the image config a container sandbox's exec defaults follow.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `POST /v1/images`: pull an image from a registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullImage {
    /// `[registry/]repository[:tag|@digest]`, as `docker pull` takes it.
    #[serde(rename = "ref")]
    pub reference: String,
    /// Allow plain http to a registry that is not on loopback.
    #[serde(default)]
    pub insecure: Option<bool>,
}

/// The parts of an OCI image config a sandbox follows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ImageConfig {
    /// `KEY=VALUE` strings.
    #[serde(default)]
    pub env: Vec<String>,
    /// Working directory of execs; `None` means `/`.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// `user`, `uid`, `user:group` or `uid:gid`; `None` means root.
    #[serde(default)]
    pub user: Option<String>,
    /// Entrypoint.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Cmd.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// One layer of a stored image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ImageLayer {
    /// The compressed blob's digest (`sha256:...`) as the manifest names it.
    pub digest: String,
    /// The uncompressed tar's digest (the config's `diff_id`).
    pub diff_id: String,
    /// Bytes of the converted erofs layer on the host.
    pub erofs_bytes: u64,
}

/// An image in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Image {
    /// The config's digest (`sha256:...`): the image's identity.
    pub id: String,
    /// References (`registry/repo:tag`) that resolve to it.
    pub refs: Vec<String>,
    /// The manifest's digest.
    pub manifest_digest: String,
    /// Layers, lowest first.
    pub layers: Vec<ImageLayer>,
    /// The config a sandbox follows.
    pub config: ImageConfig,
    /// Host bytes of its layers (shared layers counted in each image).
    pub disk_bytes: u64,
    /// Sandboxes or templates that use it now.
    pub in_use: u32,
    /// When it was pulled or imported (RFC 3339).
    pub created_at: String,
}

/// The longest reference (or image id) the API takes: Docker's limit on
/// a repository name (255) plus a tag (128) or a digest, and the host.
pub const MAX_REF_LEN: usize = 512;

/// `GET /v1/images`: every stored image and the store's disk use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ImageList {
    /// The images, by id.
    pub images: Vec<Image>,
    /// Host bytes of the layers the images name, each shared layer
    /// counted once (what removing every image would free).
    pub disk_bytes: u64,
}
