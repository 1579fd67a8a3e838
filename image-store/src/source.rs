//! What an import reads from: a layout directory or an archive
//! ([`Source`]), files read up to a cap, and what an import is asked.

use crate::layer::LayerLimits;
use crate::reference::Reference;
use crate::registry::{malformed, PullError};
use crate::{digest_hex, io_err};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Where an import reads its files: a layout directory or an archive.
pub(crate) trait Source {
    /// Opens `name` (`index.json`, `blobs/sha256/HEX`, ...), a file of
    /// the source (never through a symbolic link that leaves it).
    fn open(&self, name: &str) -> Result<Box<dyn Read + '_>, PullError>;
    /// `name` as an error message shows it.
    fn show(&self, name: &str) -> String;
}

/// A layout directory.
pub(crate) struct Dir<'a>(pub(crate) &'a Path);

impl Source for Dir<'_> {
    fn open(&self, name: &str) -> Result<Box<dyn Read + '_>, PullError> {
        Ok(Box::new(open(&self.0.join(name))?))
    }
    fn show(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

/// What an import takes.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The manifest tagged this (an OCI layout's `ref.name`, or a
    /// `docker save` archive's `REPO:TAG`); default: the only one, or the
    /// linux/amd64 one.
    pub tag: Option<String>,
    /// Name the image this reference (default: the names the archive
    /// gives it, if any; else found by its id only).
    pub reference: Option<String>,
    /// Caps on each layer.
    pub limits: LayerLimits,
}

/// Opens a file beneath the layout without following a symbolic link.
fn open(path: &Path) -> Result<File, PullError> {
    Ok(std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err(path))?)
}

pub(crate) fn read_capped(
    src: &dyn Source,
    name: &str,
    cap: u64,
    what: &str,
) -> Result<Vec<u8>, PullError> {
    let mut body = Vec::new();
    src.open(name)?
        .take(cap + 1)
        .read_to_end(&mut body)
        .map_err(io_err(Path::new(&src.show(name))))?;
    if u64::try_from(body.len()).unwrap_or(u64::MAX) > cap {
        return Err(malformed(what, format!("larger than {cap} bytes")));
    }
    Ok(body)
}

pub(crate) fn blob_name(digest: &str) -> Result<String, PullError> {
    Ok(format!("blobs/sha256/{}", digest_hex(digest)?))
}

/// The canonical references `names` parse to (those that do).
pub(crate) fn canonical_refs<'a>(names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if let Ok(r) = Reference::parse(n) {
            let c = r.canonical();
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}
