//! The store's disk use and its cap: least-recently-used layers that no
//! image in use needs are evicted, with the images that had them.
//!
//! An image's last use is the mtime of `used/<id hex>` ([`Store::touch`]:
//! when a sandbox or template uses it, and each eviction pass for the
//! images in use then), else of its record (when it was pulled). A
//! layer's last use is the latest of the images that have it; a layer no
//! image has is the first to go.

use crate::{digest_hex, io_err, Store, StoreError};
use shoal_api::images::Image;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::SystemTime;

/// What the store holds on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Converted layers.
    pub layers: u64,
    /// Their bytes on disk (each once).
    pub layer_bytes: u64,
    /// Images.
    pub images: u64,
}

/// What an eviction pass did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Eviction {
    /// The layers removed (`diff_id`s), oldest first.
    pub layers: Vec<String>,
    /// The images removed with them (ids).
    pub images: Vec<String>,
    /// The store's use after.
    pub usage: Usage,
}

fn not_found_ok<T: Default>(r: io::Result<T>, path: &std::path::Path) -> Result<T, StoreError> {
    match r {
        Ok(v) => Ok(v),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(io_err(path)(e)),
    }
}

impl Store {
    pub(crate) fn used_path(&self, id: &str) -> Result<PathBuf, StoreError> {
        Ok(self.dir().join("used").join(digest_hex(id)?))
    }

    /// Records that image `id` is used now.
    pub fn touch(&self, id: &str) -> Result<(), StoreError> {
        let p = self.used_path(id)?;
        let dir = p.parent().expect("a parent");
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(io_err(&p))?;
        f.set_modified(SystemTime::now()).map_err(io_err(&p))
    }

    /// When image `id` was last used (or stored).
    pub fn last_used(&self, id: &str) -> Result<SystemTime, StoreError> {
        let used = self.used_path(id)?;
        if let Ok(m) = fs::metadata(&used).and_then(|m| m.modified()) {
            return Ok(m);
        }
        let rec = self
            .dir()
            .join("images")
            .join(format!("{}.json", digest_hex(id)?));
        fs::metadata(&rec)
            .and_then(|m| m.modified())
            .map_err(io_err(&rec))
    }

    /// The layer files on disk: diff_id → bytes.
    fn layer_files(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let dir = self.dir().join("layers");
        let mut out = BTreeMap::new();
        for e in not_found_ok(fs::read_dir(&dir).map(Some), &dir)?
            .into_iter()
            .flatten()
        {
            let e = e.map_err(io_err(&dir))?;
            let name = e.file_name();
            let Some(hex) = name.to_str().and_then(|n| n.strip_suffix(".erofs")) else {
                continue;
            };
            let diff_id = format!("sha256:{hex}");
            if digest_hex(&diff_id).is_err() {
                continue;
            }
            let len = e.metadata().map_err(io_err(&e.path()))?.len();
            out.insert(diff_id, len);
        }
        Ok(out)
    }

    /// The store's disk use.
    pub fn usage(&self) -> Result<Usage, StoreError> {
        let layers = self.layer_files()?;
        Ok(Usage {
            layers: layers.len() as u64,
            layer_bytes: layers.values().sum(),
            images: self.list()?.len() as u64,
        })
    }

    /// Removes an image's record and its references (not its layers).
    fn drop_image(&self, image: &Image) -> Result<(), StoreError> {
        for r in &image.refs {
            let p = self.ref_path(r);
            let pointed = fs::read_to_string(&p).is_ok_and(|id| id.trim() == image.id);
            if pointed {
                not_found_ok(fs::remove_file(&p), &p)?;
            }
        }
        for p in [self.image_path(&image.id)?, self.used_path(&image.id)?] {
            not_found_ok(fs::remove_file(&p), &p)?;
        }
        Ok(())
    }

    /// Evicts least-recently-used layers until the layers take at most
    /// `max_bytes`, never one an image in `keep` (ids: those in use, the
    /// one just pulled) has; each image that had an evicted layer goes
    /// with it. Stops when nothing more may go (the cap may stay
    /// exceeded).
    pub fn evict(&self, max_bytes: u64, keep: &BTreeSet<String>) -> Result<Eviction, StoreError> {
        let mut out = Eviction::default();
        let mut layers = self.layer_files()?;
        let mut images = self.list()?;
        let mut total: u64 = layers.values().sum();
        while total > max_bytes {
            let kept: BTreeSet<&str> = images
                .iter()
                .filter(|i| keep.contains(&i.id))
                .flat_map(|i| i.layers.iter().map(|l| l.diff_id.as_str()))
                .collect();
            // Each layer's last use; UNIX_EPOCH for one no image has.
            let mut when: BTreeMap<&str, SystemTime> = layers
                .keys()
                .filter(|d| !kept.contains(d.as_str()))
                .map(|d| (d.as_str(), SystemTime::UNIX_EPOCH))
                .collect();
            for i in &images {
                let t = self.last_used(&i.id)?;
                for l in &i.layers {
                    if let Some(w) = when.get_mut(l.diff_id.as_str()) {
                        *w = (*w).max(t);
                    }
                }
            }
            let Some((victim, _)) = when.into_iter().min_by_key(|(d, t)| (*t, *d)) else {
                break;
            };
            let victim = victim.to_string();
            let (gone, left): (Vec<Image>, Vec<Image>) = images
                .into_iter()
                .partition(|i| i.layers.iter().any(|l| l.diff_id == victim));
            for i in &gone {
                self.drop_image(i)?;
                out.images.push(i.id.clone());
            }
            images = left;
            let p = self.layer_path(&victim)?;
            not_found_ok(fs::remove_file(&p), &p)?;
            total -= layers.remove(&victim).unwrap_or(0);
            out.layers.push(victim);
        }
        out.usage = Usage {
            layers: layers.len() as u64,
            layer_bytes: total,
            images: images.len() as u64,
        };
        Ok(out)
    }
}
