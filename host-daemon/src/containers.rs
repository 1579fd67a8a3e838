//! Container sandboxes: `POST /v1/sandboxes {"image": REF}` where REF is
//! not a built-in image (`tiny`, `base`) but an OCI image in the host's
//! image store (`shoal image pull REF`; the store is `images/` in the
//! state directory, [`store_dir`]), by reference or by id (`sha256:...`).
//!
//! Its template (named `oci-ID-Nc-Mm[-HASH]`, ID the first 12 hex digits
//! of the image id; a derived name, reserved for the daemon:
//! [`crate::template_names`]) boots the agent layer
//! ([`shoal_images::artifacts::CONTAINER_ROOT`]) as the root with the
//! image's erofs layers over it, lowest first, and the guest's
//! `shoal.container=1` leaves the agent layer out of the overlay: the
//! commands see only the image and the upper layer. The layer files are
//! opened the one way the daemon opens files (beneath the store's layers
//! directory, no symbolic links:
//! [`open_layer`](shoal_images::layer_files::open_layer)) and pinned into
//! the template's directory by their descriptors; an image of more layers
//! than a guest takes has its lowest ones merged into one, once
//! ([`crate::container_layers`], which also keeps a removal of the image
//! from racing its first create). The first create of an image (at a
//! shape) boots and snapshots it; the rest restore from it.
//!
//! The image config gives the defaults of every exec ([`crate::exec_defaults`]):
//! its `Env` is the sandbox's environment under the request's (the request
//! wins), its `WorkingDir` the default cwd, its `User` the default user.

use crate::container_layers;
use crate::db::TemplateRow;
use crate::layer_files::OPEN_DEADLINE;
use crate::templates::{self, derived_template, register_and_build};
use crate::{inputs, ApiError, ApiResult, Daemon};
use image_store::reference::Reference;
use image_store::{digest_hex, Store, StoreError, StoredImage};
use shoal_api::images::ImageConfig;
use shoal_api::{RootRequest, TemplateState};
use shoal_images::artifacts::CONTAINER_IMAGE;
use shoal_images::layer_files::Layer;
use shoal_images::layers::Upper;
#[cfg(doc)]
use shoal_images::layers::MAX_LAYERS;
use shoal_runtime::sandbox::TemplateSpec;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The first word of a container template's name.
pub const PREFIX: &str = crate::template_names::OCI_PREFIX;
/// A container template's `source`: this and the image id.
pub const SOURCE: &str = "oci:";
/// Longest a create waits for an image's lowest layers to be merged (an
/// image of more than [`MAX_LAYERS`], once per image) or its layers to be
/// opened: then 504, the work goes on and a retry finds it.
const MERGE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// The daemon's image store: `images/` in its state directory (where
/// `shoal image pull` puts images by default).
pub fn store_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("images")
}

/// Whether `image` names a built-in image rather than an OCI image.
pub fn is_builtin(image: &str) -> bool {
    templates::IMAGES.contains(&image)
}

/// The stored image `reference` names (a reference as `docker pull` takes
/// it, or an image id): 404 naming `shoal image pull` when there is none.
pub fn lookup(store: &Store, reference: &str) -> ApiResult<StoredImage> {
    let key = if digest_hex(reference).is_ok() {
        reference.to_string()
    } else {
        Reference::parse(reference)
            .map_err(|e| {
                ApiError::BadRequest(format!(
                    "unknown image {reference:?}: not a built-in image ({:?}) nor an OCI \
                     reference: {e}",
                    templates::IMAGES
                ))
            })?
            .canonical()
    };
    store.resolve(&key).map_err(|e| match e {
        StoreError::NotFound(_) => ApiError::NotFound(format!(
            "unknown image {reference:?}: not a built-in image ({:?}) and not in this host's \
             image store ({}); pull it first with `shoal image pull {reference}`",
            templates::IMAGES,
            store.dir().display()
        )),
        other => ApiError::Internal(other.to_string()),
    })
}

/// The image `reference` names and its layers as the guest gets them
/// ([`container_layers::open_layers`]: at most [`MAX_LAYERS`], the lowest
/// merged beyond that). Blocking.
fn open_image(
    store: &Store,
    reference: &str,
    merges: &Path,
) -> ApiResult<(StoredImage, Vec<Layer>)> {
    let img = lookup(store, reference)?;
    let layers = container_layers::open_layers(store, &img, merges)?;
    // Its last use, for the store's LRU cap (best effort: a store that
    // cannot record it still serves the image).
    if let Err(e) = store.touch(&img.image.id) {
        tracing::warn!(image = %img.image.id, "recording the image's use: {e}");
    }
    Ok((img, layers))
}

/// The name of the template of image `id` (`sha256:...`) at this shape
/// and upper layer.
pub fn template_name(id: &str, vcpus: u32, mem: u32, root: &RootRequest) -> ApiResult<String> {
    let hex = digest_hex(id).map_err(|e| ApiError::Internal(e.to_string()))?;
    let short = hex.get(..12).unwrap_or(hex);
    Ok(templates::image_template_name(
        &format!("{PREFIX}-{short}"),
        vcpus,
        mem,
        root,
    ))
}

/// The template of OCI image `reference` at this shape and root, built
/// on first use (see [`templates::derived_template`]), and the image's
/// config.
pub async fn oci_template(
    d: &Arc<Daemon>,
    reference: &str,
    vcpus: u32,
    mem: u32,
    root: &RootRequest,
    net: bool,
) -> ApiResult<(TemplateRow, ImageConfig)> {
    if !root.layers.is_empty() {
        return Err(ApiError::BadRequest(
            "'layers' cannot be added to an OCI image's sandbox (yet): its layers are the image's"
                .into(),
        ));
    }
    templates::check_size(vcpus, mem)?;
    inputs::check_servable(&d.cfg.limits, vcpus, mem)?;
    inputs::check_disk_servable(&d.cfg.limits, mem, root.upper_disk_mib)?;
    let upper = Upper::from_request(root.upper_size_mib, root.upper_disk_mib, mem)
        .map_err(ApiError::Layers)?;
    let store = Store::new(&store_dir(&d.cfg.state_dir));
    let merges = container_layers::merges_dir(&d.cfg.state_dir);
    // The slow part first, without the lock (a removal waiting for it
    // would hold back every other create): the merge of an image's lowest
    // layers, once; it reads the layers through its open descriptors.
    let (s, m, r) = (
        Store::new(&store_dir(&d.cfg.state_dir)),
        merges.clone(),
        reference.to_string(),
    );
    let merged = crate::blocking(
        "merging the image's lowest layers",
        MERGE_DEADLINE,
        move || merge_and_settle(&s, &r, &m),
    )
    .await;
    match merged {
        // Removed meanwhile: the lookup below says so (and prunes).
        Ok(()) | Err(ApiError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    let r = reference.to_string();
    // Held from the lookup until the template's row is recorded (or found):
    // a removal of the image waits, then sees the row (409), or went first
    // (the lookup's 404). Moved into the blocking work, so that a deadline
    // passed does not free it while the layers are still being opened.
    let guard = container_layers::use_lock().read_owned().await;
    let (guard, img, layers) =
        crate::blocking("opening the image's layers", MERGE_DEADLINE, move || {
            match open_image(&store, &r, &merges) {
                Ok((img, layers)) => Ok((guard, img, layers)),
                Err(e @ ApiError::NotFound(_)) => {
                    // A merge made for it while it was being removed goes
                    // (no removal runs while this holds the lock).
                    if let Ok(left) = store.list() {
                        let _ = container_layers::prune_merges(&merges, &left);
                    }
                    Err(e)
                }
                Err(e) => Err(e),
            }
        })
        .await?;
    let id = img.image.id.clone();
    let name = crate::template_names::with_net(template_name(&id, vcpus, mem, root)?, net);
    let source = format!("{SOURCE}{id}");
    let vcpus8 = u8::try_from(vcpus)
        .map_err(|_| ApiError::BadRequest(format!("vcpus {vcpus}: too many")))?;
    let t = derived_template(d, &name, |d| {
        let row = TemplateRow {
            name: name.clone(),
            source: source.clone(),
            kind: d.backend.kind(),
            vcpus,
            memory_mib: mem,
            dir: d.cfg.new_template_dir(&name),
            state: TemplateState::Building,
            error: None,
            created_at: crate::db::now(),
            owned: true,
            owner: Some(crate::template_names::DAEMON.into()),
            image: Some(id.clone()),
            root: RootRequest {
                layers: vec![],
                upper_size_mib: upper.disk_mib().is_none().then(|| upper.tmpfs_mib(mem)),
                upper_disk_mib: upper.disk_mib(),
            },
            net,
            disk: None,
        };
        let spec = TemplateSpec {
            upper,
            balloon: d.cfg.balloon,
            ..TemplateSpec::new(CONTAINER_IMAGE, vcpus8, mem)
        };
        let r = register_and_build(d, row, spec, layers);
        drop(guard);
        r
    })
    .await?;
    // Two images whose ids share 12 hex digits would share a name: the
    // template found must be this image's.
    if t.source != source {
        return Err(ApiError::Conflict(format!(
            "template '{name}' is of {}, not of image {id}; remove it (DELETE \
             /v1/templates/{name}) to use this image",
            t.source
        )));
    }
    Ok((t, img.image.config))
}

/// Makes the merged layer image `reference` needs (if any), then settles
/// with a removal that ran meanwhile: under [`container_layers::use_lock`]
/// (no removal in progress), if the image is gone, the merged layers no
/// stored image needs are pruned (a merge renamed into place after the
/// removal's pruning), and the answer is the lookup's 404, not whatever the
/// merge met with the image's files gone. This runs in the merge's own
/// blocking work, so a merge still running after its create stopped waiting
/// for it (past [`MERGE_DEADLINE`]) cleans up after itself too. Blocking.
fn merge_and_settle(store: &Store, reference: &str, merges: &Path) -> ApiResult<()> {
    let made = lookup(store, reference)
        .and_then(|img| container_layers::ensure_merged(store, &img, merges));
    let lock = container_layers::use_lock();
    let _no_removal = lock.blocking_read();
    match lookup(store, reference) {
        Err(gone @ ApiError::NotFound(_)) => {
            match store.list() {
                Ok(left) => {
                    if let Err(e) = container_layers::prune_merges(merges, &left) {
                        tracing::warn!("pruning merged layers after a removal: {e}");
                    }
                }
                Err(e) => tracing::warn!("listing the image store to prune merged layers: {e}"),
            }
            Err(gone)
        }
        _ => made,
    }
}

/// The sandbox environment of an image sandbox: the image's `Env`
/// (`KEY=VALUE`; malformed entries are skipped) under `asked` (the
/// request's, which wins).
pub fn merged_env(
    config: &ImageConfig,
    asked: std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    let mut env: std::collections::BTreeMap<String, String> = config
        .env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| !k.is_empty() && !k.contains('\0'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.extend(asked);
    env
}

/// The image config of a sandbox's template, when it is a container's or
/// a snapshot of a container sandbox (its row's `image`; None for any
/// other sandbox, or when its template or image is gone).
pub async fn config_of(d: &Daemon, template: &str) -> ApiResult<Option<Arc<ImageConfig>>> {
    // A built-in image's derived template is never a container's.
    if crate::template_names::derived_image(template).is_some_and(|i| i != PREFIX) {
        return Ok(None);
    }
    let Some(t) = d.db(|db| db.template(template))? else {
        return Ok(None);
    };
    let Some(id) = t.image else {
        return Ok(None);
    };
    // An image id is the digest of its config, so a config read once stays
    // right: execs of container sandboxes do not re-read the store.
    let key = (d.cfg.state_dir.clone(), id.clone());
    if let Some(c) = config_cache().lock().expect("config cache").get(&key) {
        return Ok(Some(c.clone()));
    }
    let store = Store::new(&store_dir(&d.cfg.state_dir));
    let cfg = crate::blocking("reading the image config", OPEN_DEADLINE, move || {
        Ok(store.resolve(&id).ok().map(|i| Arc::new(i.image.config)))
    })
    .await?;
    if let Some(c) = &cfg {
        let mut cache = config_cache().lock().expect("config cache");
        if cache.len() >= CONFIG_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, c.clone());
    }
    Ok(cfg)
}

/// Image configs kept by [`config_of`] at most (then it starts afresh).
const CONFIG_CACHE_MAX: usize = 1024;

type ConfigCache = Mutex<HashMap<(PathBuf, String), Arc<ImageConfig>>>;

/// Image configs by (state directory, image id).
fn config_cache() -> &'static ConfigCache {
    static C: OnceLock<ConfigCache> = OnceLock::new();
    C.get_or_init(Default::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_env_is_under_the_requests() {
        let c = ImageConfig {
            env: vec![
                "PATH=/usr/bin:/bin".into(),
                "A=image".into(),
                "B=x=y".into(),
                "junk".into(),
                "=v".into(),
            ],
            ..Default::default()
        };
        let asked = [("A".to_string(), "request".to_string())].into();
        let env = merged_env(&c, asked);
        assert_eq!(env["A"], "request");
        assert_eq!(env["B"], "x=y");
        assert_eq!(env["PATH"], "/usr/bin:/bin");
        assert_eq!(env.len(), 3, "{env:?}");
    }

    #[test]
    fn a_merge_that_outlives_its_image_removes_what_it_made() {
        // The image was removed while its merge ran and the merged file was
        // renamed into place after the removal's pruning: the merge's own
        // work finds the image gone, prunes the file and answers 404.
        let state = tempfile::tempdir().unwrap();
        let store = Store::new(&store_dir(state.path()));
        let merges = container_layers::merges_dir(state.path());
        std::fs::create_dir_all(&merges).unwrap();
        let stray = merges.join(container_layers::merge_name(&["sha256:a", "sha256:b"]));
        std::fs::write(&stray, b"merged").unwrap();
        let r = merge_and_settle(&store, "127.0.0.1:5000/team/gone:1", &merges);
        assert!(
            matches!(r, Err(ApiError::NotFound(ref m)) if m.contains("shoal image pull")),
            "{r:?}"
        );
        assert!(
            !stray.exists(),
            "the merged layer of a removed image is left"
        );
        // A reference that is no image name at all is a 400, and prunes nothing.
        std::fs::write(&stray, b"merged").unwrap();
        let r = merge_and_settle(&store, "Not A Ref", &merges);
        assert!(matches!(r, Err(ApiError::BadRequest(_))), "{r:?}");
        assert!(stray.exists());
    }

    #[test]
    fn template_names_are_derived_and_reserved() {
        let id = format!("sha256:{}", "ab".repeat(32));
        let n = template_name(&id, 1, 128, &RootRequest::default()).unwrap();
        assert_eq!(n, "oci-abababababab-1c-128m");
        assert_eq!(crate::template_names::derived_image(&n), Some(PREFIX));
        let root = RootRequest {
            upper_disk_mib: Some(64),
            ..Default::default()
        };
        let h = template_name(&id, 1, 128, &root).unwrap();
        assert!(h.starts_with("oci-abababababab-1c-128m-"), "{h}");
        assert_eq!(crate::template_names::derived_image(&h), Some(PREFIX));
        crate::ops::check_name("template", &h).unwrap();
    }
}
