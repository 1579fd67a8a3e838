//! The pmem layers of a container sandbox: an OCI image's layers, lowest
//! first, and the lock that keeps a removal of the image from racing a
//! create of it.
//!
//! **More layers than a guest takes.** A guest gets at most
//! [`MAX_LAYERS`] image layers (one virtio-pmem device each, and the VMM
//! has 19 interrupt lines for all its virtio devices: raising the cap buys
//! little and costs every boot a device probe per layer). An image with
//! more (real ones have 10 to 30) has its lowest layers flattened into one
//! merged erofs layer ([`shoal_images::layer_merge`]: through the host's
//! overlayfs, so their whiteouts and opaque directories act exactly as the
//! guest's overlay would make them act) and the top `MAX_LAYERS - 1` kept
//! as they are, so their whiteouts and opaque directories act on the
//! merged layer as on any lower one. The merged layer is made once per
//! list of merged `diff_id`s (its name is their digest, in
//! `STATE/image-merges/`, [`merges_dir`]) and shared by every template of
//! every image with those lowest layers; it is removed with the last
//! image that needs it ([`prune_merges`]). Images of more than
//! [`MAX_IMAGE_LAYERS`] layers are refused with that number.
//!
//! **In use.** A create of an image holds [`use_lock`] for reading from
//! the lookup of the image until its template's row is recorded (that row
//! makes the image in use); a removal holds it for writing while it checks
//! the users and removes. So a removal either sees the template and is
//! refused (409), or removes the image before the create looks it up (a
//! create then gets 404 naming `shoal image pull`). The merge runs before,
//! without the lock ([`ensure_merged`]), so that a removal waiting for a
//! long merge does not hold back every other create; a removal during it
//! leaves the create a 404, and the merge's own work, once the merge ends,
//! looks the image up again under the lock and prunes a merged file renamed
//! into place after the removal's pruning (so a merge still running after
//! its create stopped waiting cleans up after itself too;
//! `containers::merge_and_settle`).

use crate::{ApiError, ApiResult};
use image_store::{Store, StoredImage};
use shoal_api::images::Image;
use shoal_images::layer_files::{open_layer, Layer, LayerFile};
use shoal_images::layers::{LayerError, MAX_LAYERS};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Most layers an image of a container sandbox may have.
pub const MAX_IMAGE_LAYERS: usize = 128;

/// Where merged layers are kept: `image-merges/` in the state directory.
pub fn merges_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("image-merges")
}

/// The lock a create holds (read) from the image's lookup to its
/// template's row, and a removal (write) while it checks and removes.
pub fn use_lock() -> Arc<tokio::sync::RwLock<()>> {
    static L: OnceLock<Arc<tokio::sync::RwLock<()>>> = OnceLock::new();
    L.get_or_init(Default::default).clone()
}

/// How many of the lowest of `n` layers are merged into one (0: none).
pub fn merged_count(n: usize) -> usize {
    if n > MAX_LAYERS {
        n - (MAX_LAYERS - 1)
    } else {
        0
    }
}

/// The merged layer's file name for `diff_ids` (the layers it merges,
/// lowest first).
pub fn merge_name(diff_ids: &[&str]) -> String {
    let d = image_store::layer::sha256_digest(diff_ids.join("\n").as_bytes());
    format!("{}.erofs", d.trim_start_matches("sha256:"))
}

/// The merged layer `img` needs, if it has more than [`MAX_LAYERS`].
fn merge_of(img: &Image) -> Option<String> {
    let k = merged_count(img.layers.len());
    (k > 0).then(|| {
        let ids: Vec<&str> = img.layers[..k].iter().map(|l| l.diff_id.as_str()).collect();
        merge_name(&ids)
    })
}

/// The image's layers as the guest gets them, opened beneath the store's
/// layers directory and `merges` (no symbolic links): at most
/// [`MAX_LAYERS`], the lowest ones merged (made now if not yet). Blocking.
pub fn open_layers(store: &Store, img: &StoredImage, merges: &Path) -> ApiResult<Vec<Layer>> {
    let n = img.layer_files.len();
    let shown = img.image.refs.first().unwrap_or(&img.image.id);
    if n > MAX_IMAGE_LAYERS {
        return Err(ApiError::BadRequest(format!(
            "image {shown} has {n} layers; container sandboxes take images of at most \
             {MAX_IMAGE_LAYERS} layers (squash it, e.g. `docker build --squash`)"
        )));
    }
    if n == 0 {
        return Err(ApiError::BadRequest(format!("image {shown} has no layers")));
    }
    if img.image.layers.len() != n {
        return Err(ApiError::Internal(format!(
            "image {shown}: {} layer records for {n} layer files",
            img.image.layers.len()
        )));
    }
    let dir = store.dir().join("layers");
    let open = |p: &Path| open_layer(&dir, &p.to_string_lossy()).map_err(ApiError::Layers);
    let k = merged_count(n);
    let mut out = Vec::with_capacity(n - k + 1);
    if let Some(name) = merge_of(&img.image) {
        let lowest: Vec<_> = img.layer_files[..k]
            .iter()
            .map(|p| open(p))
            .collect::<ApiResult<_>>()?;
        let merged = merges.join(name);
        merge_once(&lowest, &merged)?;
        let file = open_layer(merges, &merged.to_string_lossy()).map_err(ApiError::Layers)?;
        out.push(Layer::File(file));
    }
    for p in &img.layer_files[k..] {
        out.push(Layer::File(open(p)?));
    }
    Ok(out)
}

/// Makes the merged layer `img` needs (if it has more than [`MAX_LAYERS`]
/// layers) unless it exists. Blocking.
pub fn ensure_merged(store: &Store, img: &StoredImage, merges: &Path) -> ApiResult<()> {
    match merge_of(&img.image) {
        Some(name) if !merges.join(&name).is_file() => open_layers(store, img, merges).map(drop),
        _ => Ok(()),
    }
}

/// Makes `merged` from the open layer files `lowest` unless it exists
/// (one merge at a time: two creates of one image make it once).
fn merge_once(lowest: &[LayerFile], merged: &Path) -> ApiResult<()> {
    static MERGING: Mutex<()> = Mutex::new(());
    let _g = MERGING.lock().unwrap_or_else(|e| e.into_inner());
    if merged.is_file() {
        return Ok(());
    }
    // The very files opened and checked, by their descriptors (the mount
    // command opens them through this process's /proc).
    let pid = std::process::id();
    let paths: Vec<PathBuf> = lowest
        .iter()
        .map(|f| PathBuf::from(format!("/proc/{pid}/fd/{}", f.file.as_raw_fd())))
        .collect();
    let t0 = std::time::Instant::now();
    shoal_images::layer_merge::merge_layers(&paths, merged).map_err(|e| {
        ApiError::Internal(format!(
            "merging the lowest {} layers of the image into {}: {e}",
            lowest.len(),
            merged.display()
        ))
    })?;
    tracing::info!(
        layers = lowest.len(),
        merged = %merged.display(),
        secs = t0.elapsed().as_secs_f64(),
        "merged an image's lowest layers"
    );
    Ok(())
}

/// Bytes of the merged layers in `merges`. Blocking.
pub fn merges_bytes(merges: &Path) -> Result<u64, LayerError> {
    let entries = match std::fs::read_dir(merges) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(LayerError::Io(merges.into(), e)),
    };
    let mut n = 0;
    for e in entries {
        let e = e.map_err(|e| LayerError::Io(merges.into(), e))?;
        if e.file_name().to_string_lossy().ends_with(".erofs") {
            n += e.metadata().map_err(|x| LayerError::Io(e.path(), x))?.len();
        }
    }
    Ok(n)
}

/// Bytes of the merged layers in `merges` that `images` need (those made
/// so far). Blocking.
pub fn merged_bytes_of(merges: &Path, images: &[Image]) -> Result<u64, LayerError> {
    let mut names: Vec<String> = images.iter().filter_map(merge_of).collect();
    names.sort();
    names.dedup();
    let mut n = 0;
    for name in names {
        let p = merges.join(&name);
        match std::fs::metadata(&p) {
            Ok(m) => n += m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LayerError::Io(p, e)),
        }
    }
    Ok(n)
}

/// Removes the merged layers in `merges` that none of `images` needs.
/// Blocking.
pub fn prune_merges(merges: &Path, images: &[Image]) -> Result<usize, LayerError> {
    let keep: Vec<String> = images.iter().filter_map(merge_of).collect();
    let entries = match std::fs::read_dir(merges) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(LayerError::Io(merges.into(), e)),
    };
    let mut gone = 0;
    for e in entries {
        let e = e.map_err(|e| LayerError::Io(merges.into(), e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".erofs") && !keep.contains(&name) {
            std::fs::remove_file(e.path()).map_err(|x| LayerError::Io(e.path(), x))?;
            gone += 1;
        }
    }
    Ok(gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_layers_are_merged_beyond_the_cap() {
        assert_eq!(merged_count(1), 0);
        assert_eq!(merged_count(MAX_LAYERS), 0);
        assert_eq!(merged_count(MAX_LAYERS + 1), 2);
        assert_eq!(merged_count(12), 12 - (MAX_LAYERS - 1));
        // Whatever is merged, the guest gets MAX_LAYERS.
        for n in MAX_LAYERS + 1..=MAX_IMAGE_LAYERS {
            assert_eq!(n - merged_count(n) + 1, MAX_LAYERS, "{n}");
        }
        let a = merge_name(&["sha256:1", "sha256:2"]);
        assert_ne!(a, merge_name(&["sha256:2", "sha256:1"]), "order counts");
        assert_ne!(a, merge_name(&["sha256:1", "sha256:2", "sha256:3"]));
        assert!(a.ends_with(".erofs") && a.len() == 64 + 6, "{a}");
    }

    fn image(id: &str, layers: usize) -> Image {
        Image {
            id: id.into(),
            refs: vec![],
            manifest_digest: String::new(),
            layers: (0..layers)
                .map(|i| shoal_api::images::ImageLayer {
                    digest: format!("sha256:b{i}"),
                    diff_id: format!("sha256:{id}{i}"),
                    erofs_bytes: 1,
                })
                .collect(),
            config: Default::default(),
            disk_bytes: 0,
            in_use: 0,
            created_at: String::new(),
        }
    }

    #[test]
    fn merged_layers_are_counted_for_the_images_that_need_them_and_pruned_without_them() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, small) = (image("a", 12), image("b", 20), image("c", 3));
        let write = |img: &Image, len: usize| {
            std::fs::write(dir.path().join(merge_of(img).unwrap()), vec![0u8; len]).unwrap()
        };
        write(&a, 4096);
        write(&b, 8192);
        std::fs::write(dir.path().join("note.txt"), b"not a layer").unwrap();
        assert!(merge_of(&small).is_none());
        let of = |imgs: &[Image]| merged_bytes_of(dir.path(), imgs).unwrap();
        assert_eq!(of(std::slice::from_ref(&a)), 4096);
        assert_eq!(
            of(&[a.clone(), a.clone(), b.clone()]),
            4096 + 8192,
            "each once"
        );
        assert_eq!(of(std::slice::from_ref(&small)), 0);
        assert_eq!(of(&[image("d", 12)]), 0, "not made yet");
        assert_eq!(merges_bytes(dir.path()).unwrap(), 4096 + 8192);
        // `b` evicted: its merged layer goes, `a`'s and other files stay.
        assert_eq!(prune_merges(dir.path(), &[a.clone(), small]).unwrap(), 1);
        assert_eq!(merges_bytes(dir.path()).unwrap(), 4096);
        assert!(dir.path().join("note.txt").is_file());
        assert_eq!(merged_bytes_of(&dir.path().join("none"), &[a]).unwrap(), 0);
    }
}
