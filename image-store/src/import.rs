//! Importing an OCI image layout directory (`oci-layout`, `index.json`,
//! `blobs/sha256/<hex>`: what `skopeo copy ... oci:DIR:TAG` or
//! `docker buildx --output type=oci,tar=false` write), or a `docker save`
//! tarball ([`crate::archive`]: the same layout in a tar as Docker 25+
//! writes it, or the legacy `manifest.json` + `<id>/layer.tar` one), into
//! the store,
//! through the pull's path: the index resolved to one manifest (the only
//! one, the one tagged as asked, or the linux/amd64 one), every document
//! and layer read from its blob file and verified against its digest while
//! it is read, each layer converted once ([`crate::layer::convert_layer`]).
//!
//! Blob files are opened without following symbolic links, by the
//! validated hex of their digest (no path from the layout is used), and
//! documents are read up to the pull's caps.

use crate::archive::Archive;
use crate::layer::{convert_layer, sha256_digest, Compression, LayerLimits};
use crate::reference::Reference;
use crate::registry::{
    finish, malformed, Descriptor, Manifest, OciConfig, PullError, CONFIG_CAP, DOCKER_LIST,
    DOCKER_MANIFEST, MANIFEST_CAP, OCI_INDEX, OCI_MANIFEST,
};
pub use crate::source::ImportOptions;
use crate::source::{blob_name, canonical_refs, read_capped, Dir, Source};
use crate::{io_err, Store, StoredImage};
use shoal_api::images::ImageLayer;
use std::path::Path;

/// The annotation naming a manifest's tag in an OCI layout's index.
const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The annotation Docker and containerd put the full image name in.
const IMAGE_NAME: &str = "io.containerd.image.name";

/// Imports the OCI layout directory or `docker save` tarball at `path`.
pub fn import(store: &Store, path: &Path, opts: &ImportOptions) -> Result<StoredImage, PullError> {
    let meta = std::fs::metadata(path).map_err(io_err(path))?;
    if meta.is_dir() {
        return import_from(store, &Dir(path), opts);
    }
    let archive = Archive::index(path)?;
    if archive.has("index.json") {
        import_from(store, &archive, opts)
    } else {
        crate::archive::import_legacy(store, &archive, opts)
    }
}

/// A document blob, its bytes checked against `digest`.
pub(crate) fn document(
    src: &dyn Source,
    digest: &str,
    cap: u64,
    what: &str,
) -> Result<Vec<u8>, PullError> {
    let body = read_capped(src, &blob_name(digest)?, cap, what)?;
    let actual = sha256_digest(&body);
    if actual != digest {
        return Err(PullError::Digest {
            what: what.to_string(),
            expected: digest.to_string(),
            actual,
        });
    }
    Ok(body)
}

/// Whether `name` (an index entry's ref.name or image name) is what
/// `tag` asks for: the same string, or the same canonical reference.
fn tag_matches(tag: &str, name: &str) -> bool {
    tag == name
        || matches!(
            (Reference::parse(tag), Reference::parse(name)),
            (Ok(a), Ok(b)) if a.canonical() == b.canonical()
        )
}

/// The manifest of the layout's index to import (its position): the one
/// tagged `tag` when given, else the only one, else the linux/amd64 one.
fn pick(index: &[Descriptor], entries: &[IndexEntry], tag: Option<&str>) -> Option<usize> {
    if let Some(t) = tag {
        return entries.iter().take(index.len()).position(|n| {
            n.annotations
                .get(REF_NAME)
                .into_iter()
                .chain(n.annotations.get(IMAGE_NAME))
                .any(|n| tag_matches(t, n))
        });
    }
    if index.len() == 1 {
        return Some(0);
    }
    index.iter().position(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
    })
}

#[derive(serde::Deserialize)]
struct IndexEntry {
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(serde::Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<IndexEntry>,
}

/// Imports the image of the OCI layout at `dir` (its manifest tagged
/// `tag`, or the only or linux/amd64 one) and names it `reference` when
/// given (else it is found by its id).
pub fn import_layout(
    store: &Store,
    dir: &Path,
    tag: Option<&str>,
    reference: Option<&str>,
) -> Result<StoredImage, PullError> {
    let opts = ImportOptions {
        tag: tag.map(str::to_string),
        reference: reference.map(str::to_string),
        limits: LayerLimits::default(),
    };
    import_from(store, &Dir(dir), &opts)
}

/// Imports the image of an OCI layout read from `src`.
fn import_from(
    store: &Store,
    src: &dyn Source,
    opts: &ImportOptions,
) -> Result<StoredImage, PullError> {
    let tag = opts.tag.as_deref();
    let mut refs = match &opts.reference {
        Some(r) => vec![Reference::parse(r)?.canonical()],
        None => vec![],
    };
    let what = src.show("index.json");
    let body = read_capped(src, "index.json", MANIFEST_CAP, &what)?;
    let index: Manifest = serde_json::from_slice(&body).map_err(|e| malformed(&what, e))?;
    let entries = serde_json::from_slice::<Index>(&body)
        .map_err(|e| malformed(&what, e))?
        .manifests;
    let at = pick(&index.manifests, &entries, tag).ok_or_else(|| {
        malformed(
            &what,
            match tag {
                Some(t) => format!("no manifest tagged {t:?}"),
                None => {
                    "several manifests and none for linux/amd64: name one with a tag".to_string()
                }
            },
        )
    })?;
    if opts.reference.is_none() {
        // The name Docker gave it (`docker save` writes it here).
        refs = canonical_refs(entries.get(at).and_then(|e| e.annotations.get(IMAGE_NAME)));
    }
    let mut d = index.manifests[at].digest.clone();
    // An index inside: its linux/amd64 manifest (one level, as a pull).
    let mut mwhat = format!("manifest {d}");
    let mut manifest: Manifest = serde_json::from_slice(&document(src, &d, MANIFEST_CAP, &mwhat)?)
        .map_err(|e| malformed(&mwhat, e))?;
    let is_index = |m: &Manifest, media: &str| {
        media == OCI_INDEX
            || media == DOCKER_LIST
            || (!m.manifests.is_empty() && m.config.is_none())
    };
    let media_of = |m: &Manifest, desc: &str| m.media_type.clone().unwrap_or(desc.to_string());
    if is_index(&manifest, &media_of(&manifest, "")) {
        let i = pick(&manifest.manifests, &[], None)
            .ok_or_else(|| malformed(&mwhat, "the image index has no linux/amd64 manifest"))?;
        d = manifest.manifests[i].digest.clone();
        mwhat = format!("manifest {d}");
        manifest = serde_json::from_slice(&document(src, &d, MANIFEST_CAP, &mwhat)?)
            .map_err(|e| malformed(&mwhat, e))?;
    }
    let mt = media_of(&manifest, OCI_MANIFEST);
    if mt != OCI_MANIFEST && mt != DOCKER_MANIFEST {
        return Err(PullError::MediaType {
            what: mwhat,
            media_type: mt,
        });
    }
    let config = manifest
        .config
        .as_ref()
        .ok_or_else(|| malformed(&mwhat, "no config"))?;
    let cwhat = format!("config {}", config.digest);
    let oci: OciConfig =
        serde_json::from_slice(&document(src, &config.digest, CONFIG_CAP, &cwhat)?)
            .map_err(|e| malformed(&cwhat, e))?;
    oci.check_layers(manifest.layers.len(), &cwhat)?;
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for (l, diff_id) in manifest.layers.iter().zip(&oci.rootfs.diff_ids) {
        let comp = Compression::from_media_type(&l.media_type)?;
        let path = store.layer_path(diff_id)?;
        if !path.is_file() {
            let blob = src.open(&blob_name(&l.digest)?)?;
            convert_layer(store, blob, comp, &l.digest, Some(diff_id), opts.limits)?;
        }
        let erofs_bytes = std::fs::metadata(&path).map_err(io_err(&path))?.len();
        layers.push(ImageLayer {
            digest: l.digest.clone(),
            diff_id: diff_id.clone(),
            erofs_bytes,
        });
    }
    finish(store, oci, config.digest.clone(), d, layers, refs)
}
