//! The host's OCI image store.
//!
//! A container sandbox's root is its image's layers, lowest first, each a
//! read-only erofs file mapped by virtio-pmem with DAX, plus the writable
//! upper layer; Shoal's agent comes from a separate layer.
//!
//! On disk, under the store's directory:
//! - `layers/<diff_id hex>.erofs`: one converted layer, shared by every
//!   image that has it (named by the uncompressed tar's digest);
//! - `images/<id hex>.json`: one [`Image`] (its `id` is the config digest);
//! - `refs/<ref, '/' and ':' escaped>`: a reference's image id;
//! - `used/<id hex>`: its mtime is when the image was last used (the LRU
//!   cap's clock, [`Store::evict`]).
//!
//! Records are written to a temporary name and renamed into place, so a
//! reader sees a whole record or none.

mod archive;
pub mod auth;
pub mod extract;
pub mod import;
pub mod layer;
#[cfg(test)]
mod layer_tests;
mod lru;
#[cfg(test)]
mod lru_tests;
pub mod reference;
pub mod registry;
mod source;

pub use lru::{Eviction, Usage};
use shoal_api::images::{Image, ImageConfig};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No image by that reference or id.
    #[error("image {0}: not in the store; pull it with `shoal image pull {0}`")]
    NotFound(String),
    /// A digest that is not `sha256:` and 64 lowercase hex digits.
    #[error("bad digest {0:?}: want sha256: and 64 lowercase hex digits")]
    BadDigest(String),
    /// A record on disk that does not parse.
    #[error("image store record {path}: {source}")]
    Record {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A layer an image names is missing from the store.
    #[error("image {image}: layer {diff_id} is missing from the store ({path})")]
    MissingLayer {
        /// The image.
        image: String,
        /// The layer.
        diff_id: String,
        /// Where it should be.
        path: PathBuf,
    },
    /// The image is used by sandboxes or templates.
    #[error("image {image}: in use by {users} sandboxes or templates; remove those first")]
    InUse {
        /// The image.
        image: String,
        /// How many.
        users: u32,
    },
    /// I/O on the store's files.
    #[error("image store {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The hex part of a `sha256:` digest, checked.
pub fn digest_hex(digest: &str) -> Result<&str, StoreError> {
    match digest.strip_prefix("sha256:") {
        Some(h)
            if h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(h)
        }
        _ => Err(StoreError::BadDigest(digest.to_string())),
    }
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

    /// Where the layer with this `diff_id` lives (whether or not it does).
    pub fn layer_path(&self, diff_id: &str) -> Result<PathBuf, StoreError> {
        Ok(self
            .dir
            .join("layers")
            .join(format!("{}.erofs", digest_hex(diff_id)?)))
    }

    fn image_path(&self, id: &str) -> Result<PathBuf, StoreError> {
        Ok(self
            .dir
            .join("images")
            .join(format!("{}.json", digest_hex(id)?)))
    }

    fn ref_path(&self, reference: &str) -> PathBuf {
        let name: String = reference
            .chars()
            .map(|c| match c {
                '/' => '%',
                ':' => '+',
                c => c,
            })
            .collect();
        self.dir.join("refs").join(name)
    }

    /// Records `image` (whose layers are already at [`Store::layer_path`])
    /// and points each of its `refs` at it; the references an earlier
    /// record of the same image had (and that still point at it) are kept.
    pub fn put(&self, image: &Image) -> Result<StoredImage, StoreError> {
        let mut image = image.clone();
        if let Ok(old) = self.resolve(&image.id) {
            for r in old.image.refs {
                let still =
                    fs::read_to_string(self.ref_path(&r)).is_ok_and(|id| id.trim() == image.id);
                if still && !image.refs.contains(&r) {
                    image.refs.push(r);
                }
            }
        }
        let image = &image;
        let stored = self.stored(image.clone())?;
        let path = self.image_path(&image.id)?;
        let body = serde_json::to_vec_pretty(image).expect("an Image serializes");
        write_atomic(&path, &body)?;
        for r in &image.refs {
            write_atomic(&self.ref_path(r), image.id.as_bytes())?;
        }
        Ok(stored)
    }

    /// The image a reference (or an image id, `sha256:...`) names.
    pub fn resolve(&self, reference: &str) -> Result<StoredImage, StoreError> {
        let id = if digest_hex(reference).is_ok() {
            reference.to_string()
        } else {
            let p = self.ref_path(reference);
            match fs::read_to_string(&p) {
                Ok(id) => id.trim().to_string(),
                // No such ref (a name too long for a file is none either).
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        || e.raw_os_error() == Some(libc::ENAMETOOLONG) =>
                {
                    return Err(StoreError::NotFound(reference.to_string()))
                }
                Err(e) => return Err(io_err(&p)(e)),
            }
        };
        let path = self.image_path(&id)?;
        let body = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(reference.to_string()))
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        let image: Image =
            serde_json::from_slice(&body).map_err(|source| StoreError::Record { path, source })?;
        self.stored(image)
    }

    /// Every image in the store, by id.
    pub fn list(&self) -> Result<Vec<Image>, StoreError> {
        let dir = self.dir.join("images");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&dir)(e)),
        };
        let mut out = Vec::new();
        for e in entries {
            let path = e.map_err(io_err(&dir))?.path();
            if path.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let body = fs::read(&path).map_err(io_err(&path))?;
            let image: Image = serde_json::from_slice(&body)
                .map_err(|source| StoreError::Record { path, source })?;
            out.push(image);
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Removes a reference; when no reference is left to its image (or
    /// `reference` is the image id), the image and the layers no other
    /// image uses. Refuses an image in use. Returns the image.
    pub fn remove(&self, reference: &str) -> Result<Image, StoreError> {
        let image = self.resolve(reference)?.image;
        if image.in_use > 0 {
            return Err(StoreError::InUse {
                image: image.id,
                users: image.in_use,
            });
        }
        let named = reference.to_string();
        let refs: Vec<&String> = if digest_hex(reference).is_ok() {
            image.refs.iter().collect()
        } else {
            vec![&named]
        };
        for r in &refs {
            let p = self.ref_path(r);
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&p)(e)),
            }
        }
        let left: Vec<String> = image
            .refs
            .iter()
            .filter(|r| !refs.contains(r))
            .filter(|r| self.ref_path(r).is_file())
            .cloned()
            .collect();
        if !left.is_empty() {
            let kept = Image {
                refs: left,
                ..image.clone()
            };
            let path = self.image_path(&image.id)?;
            write_atomic(
                &path,
                &serde_json::to_vec_pretty(&kept).expect("an Image serializes"),
            )?;
            return Ok(image);
        }
        let path = self.image_path(&image.id)?;
        fs::remove_file(&path).map_err(io_err(&path))?;
        let used = self.used_path(&image.id)?;
        match fs::remove_file(&used) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&used)(e)),
        }
        let others = self.list()?;
        for l in &image.layers {
            if others
                .iter()
                .any(|o| o.layers.iter().any(|x| x.diff_id == l.diff_id))
            {
                continue;
            }
            let p = self.layer_path(&l.diff_id)?;
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&p)(e)),
            }
        }
        Ok(image)
    }

    fn stored(&self, image: Image) -> Result<StoredImage, StoreError> {
        let mut layer_files = Vec::with_capacity(image.layers.len());
        for l in &image.layers {
            let path = self.layer_path(&l.diff_id)?;
            if !path.is_file() {
                return Err(StoreError::MissingLayer {
                    image: image.id.clone(),
                    diff_id: l.diff_id.clone(),
                    path,
                });
            }
            layer_files.push(path);
        }
        Ok(StoredImage { image, layer_files })
    }
}

/// Now, as RFC 3339 UTC (`2026-12-01T23:00:00Z`).
pub(crate) fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    shoal_api::time::rfc3339_secs(secs)
}

fn write_atomic(path: &Path, body: &[u8]) -> Result<(), StoreError> {
    let dir = path.parent().expect("store paths have a parent");
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, body).map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::images::ImageLayer;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const ID: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn image() -> Image {
        Image {
            id: ID.into(),
            refs: vec!["localhost:5000/test/app:v1".into()],
            manifest_digest: D1.into(),
            layers: vec![ImageLayer {
                digest: D1.into(),
                diff_id: D1.into(),
                erofs_bytes: 4,
            }],
            config: ImageConfig::default(),
            disk_bytes: 4,
            in_use: 0,
            created_at: "2026-12-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn put_then_resolve_by_ref_and_id_and_refuses_missing_layers() {
        let dir = std::env::temp_dir().join(format!("image-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let store = Store::new(&dir);
        assert!(matches!(
            store.put(&image()),
            Err(StoreError::MissingLayer { .. })
        ));
        let layer = store.layer_path(D1).unwrap();
        fs::create_dir_all(layer.parent().unwrap()).unwrap();
        fs::write(&layer, b"fake").unwrap();
        let put = store.put(&image()).unwrap();
        assert_eq!(put.layer_files, vec![layer]);
        assert_eq!(store.resolve("localhost:5000/test/app:v1").unwrap(), put);
        assert_eq!(store.resolve(ID).unwrap(), put);
        assert!(matches!(
            store.resolve("nope:v1"),
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(store.list().unwrap(), vec![put.image.clone()]);
        // The same image under a second reference keeps the first; removing
        // one reference leaves the image to the other.
        let second = Image {
            refs: vec!["localhost:5000/test/app:v2".into()],
            ..image()
        };
        let both = store.put(&second).unwrap();
        assert_eq!(
            both.image.refs,
            vec!["localhost:5000/test/app:v2", "localhost:5000/test/app:v1"]
        );
        store.remove("localhost:5000/test/app:v2").unwrap();
        assert_eq!(store.resolve(ID).unwrap(), put, "v1 is left");
        store.remove("localhost:5000/test/app:v1").unwrap();
        assert!(store.list().unwrap().is_empty());
        assert!(
            !store.layer_path(D1).unwrap().exists(),
            "its only layer went too"
        );
        assert!(matches!(
            store.resolve("localhost:5000/test/app:v1"),
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            store.layer_path("md5:x"),
            Err(StoreError::BadDigest(_))
        ));
        let long = format!("localhost:5000/{}:v1", "a".repeat(300));
        assert!(matches!(store.resolve(&long), Err(StoreError::NotFound(_))));
        fs::remove_dir_all(&dir).unwrap();
    }
}
