//! The host's OCI images through the daemon: list (with disk use),
//! inspect, pull (the image store's pull, off the async runtime) and
//! remove, which refuses an image in use.
//!
//! An image is in use while a template of it exists (a row whose `image`
//! is its id: a container's template, source `oci:ID`,
//! [`crate::containers::SOURCE`], or a snapshot of a container sandbox) or
//! a sandbox that is not failed was restored from one: a container
//! template is named
//! `oci-<12 hex of ID>-...` ([`crate::containers::template_name`]), which
//! still names the image after its template was deleted.

use crate::auth::Principal;
use crate::containers::{self, PREFIX, SOURCE};
use crate::db::{Filter, State};
use crate::{ApiError, ApiResult, Daemon};
use image_store::layer::LayerLimits;
use image_store::registry::{pull, PullError, PullOptions};
use image_store::{digest_hex, Store, StoreError};
use shoal_api::images::{Image, ImageList, PullImage, MAX_REF_LEN};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How the daemon's pulls go (shoald's flags).
#[derive(Debug, Clone, Default)]
pub struct ImageOptions {
    /// Caps on each layer (`--max-layer-bytes`).
    pub limits: LayerLimits,
    /// Registry credentials (`--registry-auth-file`; default: the image
    /// store's default file).
    pub auth_file: Option<PathBuf>,
    /// Evict least-recently-used layers no image in use needs once the
    /// layers take more (`--image-store-max-bytes`); `None`: no cap.
    pub max_bytes: Option<u64>,
}

/// How long a pull may take (each registry read has its own 60 s).
pub const PULL_DEADLINE: Duration = Duration::from_secs(3600);
/// How long reading or removing the store's records may take.
const STORE_DEADLINE: Duration = Duration::from_secs(60);

/// One pull or removal at a time: the store's records are replaced by
/// rename, and a removal must not drop a layer a pull is about to name.
static STORE_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn store(d: &Daemon) -> Store {
    Store::new(&containers::store_dir(&d.cfg.state_dir))
}

/// A reference or image id from a caller: at most [`MAX_REF_LEN`] bytes,
/// printable ASCII.
pub fn check_ref(r: &str) -> ApiResult<()> {
    if r.is_empty() || r.len() > MAX_REF_LEN || !r.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::BadRequest(format!(
            "image reference {:?}: want 1 to {MAX_REF_LEN} printable ASCII characters",
            r.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound(_) => ApiError::NotFound(e.to_string()),
        StoreError::BadDigest(_) => ApiError::BadRequest(e.to_string()),
        StoreError::InUse { .. } => ApiError::Conflict(e.to_string()),
        other => ApiError::Internal(other.to_string()),
    }
}

fn pull_error(reference: &str, e: PullError) -> ApiError {
    let m = format!("pulling {reference}: {e}");
    match e {
        PullError::NotFound { .. } => ApiError::NotFound(m),
        PullError::Reference(_)
        | PullError::Digest { .. }
        | PullError::MediaType { .. }
        | PullError::Malformed { .. }
        | PullError::Layer(_) => ApiError::BadRequest(m),
        PullError::Http { .. } | PullError::Store(_) => ApiError::Internal(m),
    }
}

/// What uses each image now: image id -> templates and live sandboxes.
async fn users(d: &Daemon) -> ApiResult<BTreeMap<String, Vec<String>>> {
    let (templates, sandboxes) = d.db(|db| {
        let f = Filter {
            include_pooled: true,
            ..Default::default()
        };
        Ok((db.templates()?, db.list_sandboxes(&f)?))
    })?;
    let mut image_of_template: BTreeMap<String, String> = BTreeMap::new();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in &templates {
        if let Some(id) = t.image.as_deref() {
            out.entry(id.to_string())
                .or_default()
                .push(format!("template {}", t.name));
            image_of_template.insert(t.name.clone(), id.to_string());
        }
    }
    for s in sandboxes.iter().filter(|s| s.state != State::Failed) {
        let id = match image_of_template.get(&s.template) {
            Some(id) => id.clone(),
            // Its template was deleted: the name's 12 hex digits.
            None => match short_id(&s.template) {
                Some(short) => format!("{SOURCE}{short}"),
                None => continue,
            },
        };
        out.entry(id).or_default().push(format!("sandbox {}", s.id));
    }
    Ok(out)
}

/// The 12 hex digits of the image id in a container template's name.
fn short_id(template: &str) -> Option<&str> {
    let rest = template.strip_prefix(PREFIX)?.strip_prefix('-')?;
    let short = rest.get(..12)?;
    (short.bytes().all(|b| b.is_ascii_hexdigit()) && rest[12..].starts_with('-')).then_some(short)
}

/// The users of image `id` in `all` (by full id, or by the 12 hex digits
/// a deleted template's sandboxes keep).
fn users_of(all: &BTreeMap<String, Vec<String>>, id: &str) -> Vec<String> {
    let hex = digest_hex(id).unwrap_or_default();
    let short = format!("{SOURCE}{}", hex.get(..12).unwrap_or(hex));
    let mut v: Vec<String> = all.get(id).cloned().unwrap_or_default();
    v.extend(all.get(&short).cloned().unwrap_or_default());
    v
}

fn with_use(mut i: Image, all: &BTreeMap<String, Vec<String>>) -> Image {
    i.in_use = u32::try_from(users_of(all, &i.id).len()).unwrap_or(u32::MAX);
    i
}

/// `GET /v1/images`.
pub async fn list(d: &Arc<Daemon>) -> ApiResult<ImageList> {
    let s = store(d);
    let merges = crate::container_layers::merges_dir(&d.cfg.state_dir);
    let (images, merged_bytes) = crate::blocking("listing images", STORE_DEADLINE, move || {
        let merged = crate::container_layers::merges_bytes(&merges).map_err(ApiError::Layers)?;
        Ok((s.list().map_err(store_error)?, merged))
    })
    .await?;
    let all = users(d).await?;
    let mut layers: BTreeMap<&str, u64> = BTreeMap::new();
    for i in &images {
        for l in &i.layers {
            layers.insert(&l.diff_id, l.erofs_bytes);
        }
    }
    // And the merged layers of images of more than 8 (freed with them).
    let disk_bytes = layers.values().sum::<u64>() + merged_bytes;
    let images = images.iter().map(|i| with_use(i.clone(), &all)).collect();
    Ok(ImageList { images, disk_bytes })
}

/// `GET /v1/images/{ref-or-id}`.
pub async fn get(d: &Arc<Daemon>, reference: &str) -> ApiResult<Image> {
    check_ref(reference)?;
    let s = store(d);
    let r = reference.to_string();
    let img = crate::blocking("reading an image", STORE_DEADLINE, move || {
        containers::lookup(&s, &r)
    })
    .await?;
    Ok(with_use(img.image, &users(d).await?))
}

/// `POST /v1/images`: pulls `req.reference` into the store (plain http
/// only to a loopback registry or with `insecure`).
pub async fn pull_image(d: &Arc<Daemon>, req: PullImage) -> ApiResult<Image> {
    check_ref(&req.reference)?;
    let _g = STORE_LOCK.lock().await;
    let s = store(d);
    let r = req.reference.clone();
    let opts = PullOptions {
        insecure: req.insecure.unwrap_or(false),
        limits: d.cfg.images.limits,
        auth_file: d.cfg.images.auth_file.clone(),
    };
    let got = crate::blocking("pulling an image", PULL_DEADLINE, move || {
        pull(&s, &r, &opts).map_err(|e| pull_error(&r, e))
    })
    .await?;
    d.event(&got.image.id, "image_pulled", &req.reference);
    let all = users(d).await?;
    if let Some(max) = d.cfg.images.max_bytes {
        evict(d, max, &all, &got.image.id).await?;
    }
    Ok(with_use(got.image, &all))
}

/// Keeps the store's layers, and the merged layers made of them, under
/// `max` bytes: least-recently-used layers no image in use (nor `pulled`)
/// needs go, with their images and the merged layers only they needed.
/// The merged layers of the images kept count against `max` (those of an
/// image not in use that the LRU order spares are counted only once it is
/// in use). The images in use are marked used now, so that the LRU order
/// follows sandboxes and templates.
async fn evict(
    d: &Arc<Daemon>,
    max: u64,
    all: &BTreeMap<String, Vec<String>>,
    pulled: &str,
) -> ApiResult<()> {
    let s = store(d);
    let all = all.clone();
    let pulled = pulled.to_string();
    let merges = crate::container_layers::merges_dir(&d.cfg.state_dir);
    let (gone, merged) = crate::blocking("evicting images", STORE_DEADLINE, move || {
        let images = s.list().map_err(store_error)?;
        let mut keep = BTreeSet::from([pulled]);
        for i in &images {
            if !users_of(&all, &i.id).is_empty() {
                s.touch(&i.id).map_err(store_error)?;
                keep.insert(i.id.clone());
            }
        }
        let kept: Vec<Image> = images
            .iter()
            .filter(|i| keep.contains(&i.id))
            .cloned()
            .collect();
        let pinned =
            crate::container_layers::merged_bytes_of(&merges, &kept).map_err(ApiError::Layers)?;
        let gone = s
            .evict(max.saturating_sub(pinned), &keep)
            .map_err(store_error)?;
        let left: Vec<Image> = images
            .into_iter()
            .filter(|i| !gone.images.contains(&i.id))
            .collect();
        crate::container_layers::prune_merges(&merges, &left).map_err(ApiError::Layers)?;
        let merged = crate::container_layers::merges_bytes(&merges).map_err(ApiError::Layers)?;
        Ok((gone, merged))
    })
    .await?;
    for id in &gone.images {
        d.event(id, "image_evicted", &format!("store over {max} bytes"));
    }
    let total = gone.usage.layer_bytes + merged;
    if total > max {
        tracing::warn!(
            bytes = total,
            merged_bytes = merged,
            max,
            "the image store is over its cap: every layer left is in use"
        );
    }
    Ok(())
}

/// `DELETE /v1/images/{ref-or-id}`: removes a reference (by id, the
/// image), and the layers no other image has; 409 while the image is in
/// use. Admins only: images are the host's.
pub async fn remove(d: &Arc<Daemon>, reference: &str, who: &Principal) -> ApiResult<Image> {
    check_ref(reference)?;
    if !who.is_admin() {
        return Err(ApiError::Forbidden(format!(
            "removing image {reference}: only an admin may remove the host's images"
        )));
    }
    let _g = STORE_LOCK.lock().await;
    // No create of an image is between its lookup and its template's row
    // while this checks and removes (crate::container_layers).
    let _u = crate::container_layers::use_lock().write_owned().await;
    let s = store(d);
    let r = reference.to_string();
    let img = crate::blocking("reading an image", STORE_DEADLINE, move || {
        containers::lookup(&s, &r)
    })
    .await?
    .image;
    let using = users_of(&users(d).await?, &img.id);
    if !using.is_empty() {
        let shown: Vec<&str> = using.iter().take(8).map(String::as_str).collect();
        return Err(ApiError::Conflict(format!(
            "image {reference} ({}) is in use by {} ({}{}); kill its sandboxes and delete its \
             templates (DELETE /v1/templates/NAME, as an admin) first",
            img.id,
            using.len(),
            shown.join(", "),
            if using.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        )));
    }
    let s = store(d);
    let key = if digest_hex(reference).is_ok() {
        reference.to_string()
    } else {
        // As `lookup` resolved it: the canonical reference.
        image_store::reference::Reference::parse(reference)
            .map_err(|e| ApiError::BadRequest(e.to_string()))?
            .canonical()
    };
    let merges = crate::container_layers::merges_dir(&d.cfg.state_dir);
    let gone = crate::blocking("removing an image", STORE_DEADLINE, move || {
        let gone = s.remove(&key).map_err(store_error)?;
        // The merged layers no image left needs go too.
        let left = s.list().map_err(store_error)?;
        crate::container_layers::prune_merges(&merges, &left).map_err(ApiError::Layers)?;
        Ok(gone)
    })
    .await?;
    d.event(&gone.id, "image_removed", reference);
    Ok(gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_ids_come_from_container_template_names_only() {
        assert_eq!(short_id("oci-abcdef012345-1c-128m"), Some("abcdef012345"));
        assert_eq!(
            short_id("oci-abcdef012345-2c-256m-0a1b"),
            Some("abcdef012345")
        );
        assert_eq!(short_id("base-1c-128m"), None);
        assert_eq!(short_id("oci-xyz"), None);
        assert_eq!(short_id("ocifoo-abcdef012345-1c"), None);
        assert_eq!(short_id("oci-abcdef01234z-1c-128m"), None);
    }

    #[tokio::test]
    async fn only_admins_remove_and_unknown_images_are_404() {
        let dir = tempfile::tempdir().unwrap();
        let d = Daemon::open(
            crate::Config::for_tests(dir.path(), 1024, 1, 1),
            Arc::new(shoal_runtime::backend::microvm::MicroVm::new(
                "/nonexistent/shoal-vmm",
                shoal_images::artifacts::Layout::at(dir.path().join("artifacts")),
            )),
        )
        .unwrap();
        let tenant = Principal::Token("alice".into());
        let e = remove(&d, "127.0.0.1:5000/a:1", &tenant).await.unwrap_err();
        assert!(matches!(e, ApiError::Forbidden(_)), "{e}");
        let e = remove(&d, "127.0.0.1:5000/a:1", &Principal::Daemon)
            .await
            .unwrap_err();
        assert!(matches!(e, ApiError::NotFound(_)), "{e}");
        let l = list(&d).await.unwrap();
        assert!(l.images.is_empty() && l.disk_bytes == 0);
    }

    #[test]
    fn references_are_bounded() {
        check_ref("127.0.0.1:5000/a/b:1").unwrap();
        assert!(check_ref("").is_err());
        assert!(check_ref(&"a".repeat(MAX_REF_LEN + 1)).is_err());
        assert!(check_ref("a b").is_err());
        assert!(check_ref("a\u{e9}").is_err());
    }
}
