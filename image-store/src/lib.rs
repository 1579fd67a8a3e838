//! The host's OCI image store (contract skeleton; the store itself lands
//! with issue 16).
//!
//! A container sandbox's root is its image's layers, lowest first, each a
//! read-only erofs file mapped by virtio-pmem with DAX, plus the writable
//! upper layer; Shoal's agent comes from a separate layer.

use shoal_api::images::{Image, ImageConfig};
use std::path::{Path, PathBuf};

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No image by that reference or id.
    #[error("image {0}: not in the store; pull it with `shoal image pull {0}`")]
    NotFound(String),
}

/// What a sandbox of an image needs: its erofs layers, lowest first, and
/// its config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredImage {
    /// The image as the API shows it.
    pub image: Image,
    /// The converted layers' erofs files, lowest first.
    pub layer_files: Vec<PathBuf>,
}

impl StoredImage {
    /// Its config.
    pub fn config(&self) -> &ImageConfig {
        &self.image.config
    }
}

/// The store under one directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The store rooted at `dir` (created on first write).
    pub fn new(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
        }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
