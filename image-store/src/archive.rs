//! `docker save` tarballs: read in place (indexed once, each file then
//! read at its offset: no copy of the archive is made).
//!
//! Two formats: Docker 25+ writes an OCI layout in the tar (`oci-layout`,
//! `index.json`, `blobs/sha256/HEX`, plus a `manifest.json`), imported as
//! a layout directory is ([`crate::import`]); older Docker writes the
//! legacy one: `manifest.json` (`[{"Config": "HEX.json", "RepoTags":
//! [...], "Layers": ["HEX/layer.tar", ...]}]`), `repositories` and one
//! directory per layer, whose `layer.tar` may be a symbolic link to an
//! earlier one. Either way the config is checked against the digest its
//! name gives, and each layer against the config's `diff_id` (and its blob
//! name's digest) while it streams, through the pull's conversion.
//!
//! Only regular files and symbolic links that resolve to one inside the
//! archive are looked up, by names this code builds or checks: nothing in
//! the archive is written anywhere but the conversion's staging directory.

use crate::layer::{convert_layer, sha256_digest, Compression};
use crate::reference::Reference;
use crate::registry::{finish, malformed, OciConfig, PullError, CONFIG_CAP, MANIFEST_CAP};
use crate::source::{canonical_refs, read_capped, ImportOptions, Source};
use crate::{digest_hex, io_err, Store, StoredImage};
use serde::Deserialize;
use shoal_api::images::ImageLayer;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

/// The most entries an archive may have (each is a few bytes of index).
const MAX_ENTRIES: usize = 1 << 20;
/// The most symbolic links followed to reach a file.
const MAX_HOPS: usize = 8;

enum Item {
    /// A regular file's data: offset and length in the archive.
    File(u64, u64),
    /// A symbolic link's target, as a name inside the archive.
    Link(String),
}

/// A tar archive's files by name.
pub(crate) struct Archive {
    path: PathBuf,
    items: BTreeMap<String, Item>,
}

/// `name` made relative and plain (`./a/b` → `a/b`), or `None` when it
/// is absolute, climbs with `..` or is empty.
fn clean(name: &Path) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for c in name.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str()?),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

impl Archive {
    /// Reads the archive's headers.
    pub(crate) fn index(path: &Path) -> Result<Archive, PullError> {
        let what = path.display().to_string();
        let bad = |e: io::Error| malformed(&what, format!("not a readable tar archive: {e}"));
        let file = File::open(path).map_err(io_err(path))?;
        let mut tar = tar::Archive::new(file);
        let mut items = BTreeMap::new();
        // Seeking past each file: only the headers are read.
        for e in tar.entries_with_seek().map_err(bad)? {
            let e = e.map_err(bad)?;
            if items.len() >= MAX_ENTRIES {
                return Err(malformed(&what, format!("more than {MAX_ENTRIES} entries")));
            }
            let Some(name) = clean(&e.path().map_err(bad)?) else {
                continue;
            };
            let item = match e.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    Item::File(e.raw_file_position(), e.size())
                }
                tar::EntryType::Symlink => {
                    let Some(target) = e.link_name().map_err(bad)? else {
                        continue;
                    };
                    // Relative to the link's directory, and inside.
                    let dir = Path::new(&name).parent().unwrap_or(Path::new(""));
                    let joined = dir.join(&target);
                    let mut parts: Vec<String> = Vec::new();
                    let mut ok = !target.is_absolute();
                    for c in joined.components() {
                        match c {
                            Component::Normal(p) => parts.push(p.to_string_lossy().into()),
                            Component::ParentDir => ok &= parts.pop().is_some(),
                            Component::CurDir => {}
                            _ => ok = false,
                        }
                    }
                    if !ok || parts.is_empty() {
                        continue;
                    }
                    Item::Link(parts.join("/"))
                }
                _ => continue,
            };
            items.insert(name, item);
        }
        Ok(Archive {
            path: path.to_path_buf(),
            items,
        })
    }

    /// Whether it has a file (or a link to one) by this name.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    fn find(&self, name: &str) -> Option<(u64, u64)> {
        let mut name = name;
        for _ in 0..=MAX_HOPS {
            match self.items.get(name)? {
                Item::File(off, len) => return Some((*off, *len)),
                Item::Link(t) => name = t,
            }
        }
        None
    }
}

impl Source for Archive {
    fn open(&self, name: &str) -> Result<Box<dyn Read + '_>, PullError> {
        let (off, len) = self.find(name).ok_or_else(|| {
            malformed(
                &self.show(name),
                "not in the archive (or not a regular file)",
            )
        })?;
        let mut f = File::open(&self.path).map_err(io_err(&self.path))?;
        f.seek(SeekFrom::Start(off)).map_err(io_err(&self.path))?;
        Ok(Box::new(f.take(len)))
    }
    fn show(&self, name: &str) -> String {
        format!("{}: {name}", self.path.display())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SaveEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    #[serde(default)]
    layers: Vec<String>,
}

/// The digest a file's name gives (`HEX.json`, `blobs/sha256/HEX`,
/// `HEX/layer.tar` is none: that is a layer id, not a digest).
fn named_digest(name: &str) -> Option<String> {
    let hex = name
        .strip_prefix("blobs/sha256/")
        .or_else(|| name.strip_suffix(".json"))?;
    let d = format!("sha256:{hex}");
    digest_hex(&d).ok()?;
    Some(d)
}

/// The compression a blob's first bytes show.
fn sniff(src: &Archive, name: &str) -> Result<Compression, PullError> {
    let mut head = [0u8; 4];
    let mut r = src.open(name)?;
    let mut n = 0;
    while n < head.len() {
        match r.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(io_err(Path::new(&src.show(name)))(e).into()),
        }
    }
    Ok(match head {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd] => Compression::Zstd,
        _ => Compression::None,
    })
}

/// The `sha256:` digest of one file of the archive.
fn hash(src: &Archive, name: &str) -> Result<String, PullError> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut r = src.open(name)?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = r
            .read(&mut buf)
            .map_err(io_err(Path::new(&src.show(name))))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("sha256:{:x}", h.finalize()))
}

/// Imports the image of a legacy `docker save` archive: the entry of its
/// `manifest.json` tagged `opts.tag` (`REPO:TAG`), else its only one. Its
/// `manifest_digest` is that of the archive's `manifest.json`, the nearest
/// such a tarball has to a manifest.
pub(crate) fn import_legacy(
    store: &Store,
    src: &Archive,
    opts: &ImportOptions,
) -> Result<StoredImage, PullError> {
    let what = src.show("manifest.json");
    if !src.has("manifest.json") {
        return Err(malformed(
            &src.path.display().to_string(),
            "neither a docker save archive (no manifest.json) nor an OCI layout (no index.json)",
        ));
    }
    let body = read_capped(src, "manifest.json", MANIFEST_CAP, &what)?;
    let entries: Vec<SaveEntry> = serde_json::from_slice(&body).map_err(|e| malformed(&what, e))?;
    let tags = |e: &SaveEntry| e.repo_tags.clone().unwrap_or_default();
    let entry = match opts.tag.as_deref() {
        Some(t) => {
            let want = Reference::parse(t).map(|r| r.canonical()).ok();
            entries.iter().find(|e| {
                let c = canonical_refs(&tags(e));
                tags(e).iter().any(|x| x == t) || want.as_ref().is_some_and(|w| c.contains(w))
            })
        }
        None if entries.len() == 1 => entries.first(),
        None => None,
    }
    .ok_or_else(|| {
        malformed(
            &what,
            match &opts.tag {
                Some(t) => format!("no image tagged {t:?}"),
                None => format!("{} images: name one with a tag (REPO:TAG)", entries.len()),
            },
        )
    })?;
    let cwhat = src.show(&entry.config);
    let id = named_digest(&entry.config)
        .ok_or_else(|| malformed(&cwhat, "the config's name is not its digest (HEX.json)"))?;
    let cbody = read_capped(src, &entry.config, CONFIG_CAP, &cwhat)?;
    let actual = sha256_digest(&cbody);
    if actual != id {
        return Err(PullError::Digest {
            what: cwhat,
            expected: id,
            actual,
        });
    }
    let oci: OciConfig = serde_json::from_slice(&cbody).map_err(|e| malformed(&cwhat, e))?;
    oci.check_layers(entry.layers.len(), &cwhat)?;
    let mut layers = Vec::with_capacity(entry.layers.len());
    for (name, diff_id) in entry.layers.iter().zip(&oci.rootfs.diff_ids) {
        let path = store.layer_path(diff_id)?;
        let comp = sniff(src, name)?;
        let digest = match named_digest(name) {
            Some(d) => d,
            // A legacy layer.tar is the tar itself: its digest is the
            // diff_id (checked as it streams); a compressed one is hashed
            // first.
            None if comp == Compression::None => diff_id.clone(),
            None => hash(src, name)?,
        };
        if !path.is_file() {
            convert_layer(
                store,
                src.open(name)?,
                comp,
                &digest,
                Some(diff_id),
                opts.limits,
            )?;
        }
        let erofs_bytes = std::fs::metadata(&path).map_err(io_err(&path))?.len();
        layers.push(ImageLayer {
            digest,
            diff_id: diff_id.clone(),
            erofs_bytes,
        });
    }
    let refs = match &opts.reference {
        Some(r) => vec![Reference::parse(r)?.canonical()],
        None => canonical_refs(&tags(entry)),
    };
    finish(store, oci, id, sha256_digest(&body), layers, refs)
}
