//! The cache of built-in layers ([`crate::lang_layers`]):
//! `${SHOAL_CACHE:-~/.cache/shoal}/images/layer-NAME-KEY/NAME.erofs`, `KEY`
//! = a hash of the builder's revision, the package list, the mirror
//! override and the base image's identity; built with
//! [`crate::deb_layer`] on a miss.

use crate::deb_layer;
use crate::image::{self, ImageError};
use crate::lang_layers::Recipe;
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Bumped when the builder changes what it produces.
pub const BUILDER_REV: u32 = 2;

/// Cached layers unused this long are pruned.
const PRUNE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The identity of an erofs image for cache keys: its length and its
/// superblock (bytes 1024..1152: the build's UUID and time among them).
pub fn image_identity(path: &Path) -> Result<Vec<u8>, ImageError> {
    let mut f = std::fs::File::open(path).map_err(image::io("cannot open", path))?;
    let len = f
        .metadata()
        .map_err(image::io("cannot inspect", path))?
        .len();
    let mut sb = [0u8; 128];
    f.seek(SeekFrom::Start(1024))
        .and_then(|_| f.read_exact(&mut sb))
        .map_err(image::io("cannot read the superblock of", path))?;
    let mut id = len.to_le_bytes().to_vec();
    id.extend_from_slice(&sb);
    Ok(id)
}

/// The cache key of `packages` over the image whose identity is
/// `over_id`, with mirror override `mirror`.
pub fn cache_key(packages: &[String], over_id: &[u8], mirror: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(format!("shoal-deb-layer {BUILDER_REV}\n"));
    for p in packages {
        h.update(p.as_bytes());
        h.update(b"\n");
    }
    h.update(format!("mirror {mirror:?}\n"));
    h.update(over_id);
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The built-in layer `r` over the base image `base`: cached, else built
/// now (minutes: apt downloads; needs root). One build at a time per
/// cache (a second caller waits, then finds it cached).
pub fn build_cached(
    r: &Recipe,
    base: &Path,
    log: &mut dyn FnMut(&str),
) -> Result<PathBuf, ImageError> {
    let images = crate::paths::cache_dir().join("images");
    let packages = r.package_list();
    let mirror = deb_layer::mirror_override();
    let key = cache_key(&packages, &image_identity(base)?, mirror.as_deref());
    let dir = images.join(format!("layer-{}-{key}", r.name));
    let file = dir.join(format!("{}.erofs", r.name));
    if file.is_file() {
        touch(&dir);
        return Ok(file);
    }
    std::fs::create_dir_all(&images).map_err(image::io("cannot create", &images))?;
    let _lock = Lock::take(&images.join(".layers.lock"), log)?;
    if file.is_file() {
        touch(&dir);
        return Ok(file);
    }
    log(&format!(
        "building the '{}' layer: {} over {} (once; cached in {})",
        r.name,
        r.packages.join(" "),
        base.display(),
        dir.display()
    ));
    let t0 = std::time::Instant::now();
    let tmp = images.join(format!(".tmp.layer-{}-{}", r.name, std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).map_err(image::io("cannot create", &tmp))?;
    let built = deb_layer::build_deb_layer(
        base,
        &packages,
        &tmp.join(file.file_name().unwrap_or_default()),
        log,
    );
    let info = match built {
        Ok(i) => i,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, &dir).map_err(|e| {
        let _ = std::fs::remove_dir_all(&tmp);
        image::io("cannot publish", &dir)(e)
    })?;
    log(&format!(
        "'{}' layer: {:.1} MiB in {:.0} s",
        r.name,
        info.len as f64 / 1048576.0,
        t0.elapsed().as_secs_f64()
    ));
    prune(&images, r.name, &dir);
    Ok(file)
}

/// Marks a cached layer used.
fn touch(dir: &Path) {
    let _ = std::fs::File::open(dir).and_then(|f| f.set_modified(SystemTime::now()));
}

/// Removes the cached builds of layer `name` other than `keep` that were
/// unused for [`PRUNE_AFTER`] (installed copies are hard links and
/// templates pin their own, so nothing in use goes).
fn prune(images: &Path, name: &str, keep: &Path) {
    let prefix = format!("layer-{name}-");
    let Ok(rd) = std::fs::read_dir(images) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let n = e.file_name();
        let Some(rest) = n.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        // Another layer whose name starts like this one's has a '-' in
        // what follows; keys are 32 hex digits.
        if p == keep || rest.len() != 32 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > PRUNE_AFTER);
        if old {
            let _ = std::fs::remove_dir_all(&p);
        }
    }
}

/// An exclusive `flock` on a file, released when dropped (the lock
/// lives as long as the open file).
struct Lock {
    _file: std::fs::File,
}

impl Lock {
    fn take(path: &Path, log: &mut dyn FnMut(&str)) -> Result<Lock, ImageError> {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(image::io("cannot open", path))?;
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            log("waiting for another layer build to finish");
            // SAFETY: as above.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(image::io("cannot lock", path)(
                    std::io::Error::last_os_error(),
                ));
            }
        }
        Ok(Lock { _file: f })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_packages_mirror_and_base() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let k = cache_key(&p(&["g++"]), b"base-1", None);
        assert_eq!(k.len(), 32);
        assert_eq!(k, cache_key(&p(&["g++"]), b"base-1", None), "stable");
        let others = [
            cache_key(&p(&["g++", "make"]), b"base-1", None),
            cache_key(&p(&["g++"]), b"base-2", None),
            cache_key(&p(&["g++"]), b"base-1", Some("http://m/debian")),
        ];
        for o in others {
            assert_ne!(k, o);
        }
    }

    #[test]
    fn image_identity_is_length_and_superblock() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let mut data = vec![0u8; 4096];
        data[1024..1028].copy_from_slice(b"erof");
        std::fs::write(&a, &data).unwrap();
        let id = image_identity(&a).unwrap();
        assert_eq!(&id[..8], &4096u64.to_le_bytes());
        assert_eq!(&id[8..12], b"erof");
        data[1024 + 48] = 1; // the UUID
        std::fs::write(&a, &data).unwrap();
        assert_ne!(image_identity(&a).unwrap(), id);
        std::fs::write(&a, b"short").unwrap();
        let e = image_identity(&a).unwrap_err().to_string();
        assert!(e.contains("superblock"), "{e}");
    }
}
