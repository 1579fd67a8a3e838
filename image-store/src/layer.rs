//! One OCI layer blob → one DAX-ready erofs layer in the store.
//!
//! The blob streams once: its digest is computed as it is read, it is
//! decompressed (gzip, zstd or none), the tar's digest (the `diff_id`) is
//! computed as that is read, and the tar is extracted into a staging
//! directory inside the store, refusing anything that could reach outside
//! it ([`crate::extract`]). OCI whiteouts become overlayfs ones. Only when
//! both digests match is the tree packed the way every Shoal layer is
//! packed ([`shoal_images::image::pack_erofs`]) and renamed to
//! [`Store::layer_path`]; on any failure nothing is left behind.

use crate::extract::{extract, ExtractError};
use crate::{digest_hex, Store, StoreError};
use sha2::{Digest, Sha256};
use std::io::{self, Read};
use std::path::PathBuf;

/// How a layer blob is compressed (from its media type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip (one or more members).
    Gzip,
    /// zstd.
    Zstd,
}

impl Compression {
    /// The compression an OCI or Docker v2 layer media type names.
    pub fn from_media_type(media_type: &str) -> Result<Compression, LayerError> {
        let mt = media_type.replace(".nondistributable", "");
        match mt.as_str() {
            "application/vnd.oci.image.layer.v1.tar" => Ok(Compression::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Ok(Compression::Gzip),
            "application/vnd.oci.image.layer.v1.tar+zstd" => Ok(Compression::Zstd),
            _ => Err(LayerError::MediaType(media_type.to_string())),
        }
    }
}

/// Why a layer could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// A media type that is not a layer this store reads.
    #[error(
        "unsupported layer media type {0:?} (want an OCI or Docker v2 tar, gzip or zstd layer)"
    )]
    MediaType(String),
    /// The blob's bytes do not hash to the digest the manifest names.
    #[error("layer blob digest mismatch: the manifest names {expected}, the bytes are {actual}")]
    BlobDigest {
        /// From the manifest.
        expected: String,
        /// Of the bytes read.
        actual: String,
    },
    /// The uncompressed tar does not hash to the config's `diff_id`.
    #[error("layer {blob}: diff_id mismatch: the config names {expected}, the tar is {actual}")]
    DiffId {
        /// The blob.
        blob: String,
        /// From the config.
        expected: String,
        /// Of the tar.
        actual: String,
    },
    /// Reading or decompressing the blob failed.
    #[error("layer {blob}: reading the blob: {source}")]
    Read {
        /// The blob.
        blob: String,
        /// Why.
        source: io::Error,
    },
    /// The tar holds something the store refuses.
    #[error("layer {blob}: {source}")]
    Tar {
        /// The blob.
        blob: String,
        /// What.
        source: ExtractError,
    },
    /// Packing it as erofs failed.
    #[error("layer {blob}: packing it as erofs: {source}")]
    Pack {
        /// The blob.
        blob: String,
        /// Why.
        source: shoal_images::image::ImageError,
    },
    /// The blob or its tar is larger than the store's cap.
    #[error(
        "layer {blob}: its {what} is over the cap of {cap} bytes (raise it with \
         --max-layer-bytes)"
    )]
    TooLarge {
        /// The blob.
        blob: String,
        /// `compressed blob` or `uncompressed tar`.
        what: &'static str,
        /// The cap.
        cap: u64,
    },
    /// A store error (bad digest, I/O).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The default cap on a layer's blob and on its uncompressed tar: 8 GiB.
pub const DEFAULT_MAX_LAYER_BYTES: u64 = 8 << 30;

/// Caps on one layer, checked while it streams: a blob or tar over one
/// fails the conversion (and leaves nothing behind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerLimits {
    /// The most bytes of the blob as stored (compressed).
    pub max_blob_bytes: u64,
    /// The most bytes of its tar (uncompressed).
    pub max_tar_bytes: u64,
}

impl LayerLimits {
    /// The same cap on both.
    pub fn both(cap: u64) -> LayerLimits {
        LayerLimits {
            max_blob_bytes: cap,
            max_tar_bytes: cap,
        }
    }
}

impl Default for LayerLimits {
    fn default() -> Self {
        LayerLimits::both(DEFAULT_MAX_LAYER_BYTES)
    }
}

/// A layer now in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertedLayer {
    /// The blob's digest.
    pub digest: String,
    /// The tar's digest.
    pub diff_id: String,
    /// The erofs file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub erofs_bytes: u64,
}

/// A reader that hashes what passes through it, and fails once more than
/// `cap` bytes have.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    read: u64,
    cap: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read = self.read.saturating_add(n as u64);
        if self.read > self.cap {
            return Err(io::Error::other(format!(
                "over the cap of {} bytes",
                self.cap
            )));
        }
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

impl<R> Hashing<R> {
    fn new(inner: R) -> Self {
        Self::capped(inner, u64::MAX)
    }
    fn capped(inner: R, cap: u64) -> Self {
        Hashing {
            inner,
            hash: Sha256::new(),
            read: 0,
            cap,
        }
    }
    fn over(&self) -> bool {
        self.read > self.cap
    }
    fn digest(self) -> String {
        let d = self.hash.finalize();
        let mut s = String::with_capacity(71);
        s.push_str("sha256:");
        for b in d {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

/// Converts the layer blob `blob` (compressed as `compression`) whose
/// digest must be `digest` and, when the image config names it, whose
/// tar's digest must be `diff_id`, into the store's erofs layer for that
/// `diff_id`. A blob or tar over `limits` fails.
pub fn convert_layer(
    store: &Store,
    blob: impl Read,
    compression: Compression,
    digest: &str,
    diff_id: Option<&str>,
    limits: LayerLimits,
) -> Result<ConvertedLayer, LayerError> {
    digest_hex(digest)?;
    if let Some(d) = diff_id {
        digest_hex(d)?;
    }
    let layers = store.dir().join("layers");
    std::fs::create_dir_all(&layers).map_err(crate::io_err(&layers))?;
    // Ours alone (0700), removed on drop whatever happens.
    let stage = tempfile::Builder::new()
        .prefix(".stage-")
        .tempdir_in(&layers)
        .map_err(crate::io_err(&layers))?;
    let root = stage.path().join("root");
    let read_err = |source| LayerError::Read {
        blob: digest.to_string(),
        source,
    };

    let mut outer = Hashing::capped(blob, limits.max_blob_bytes);
    let too_large = |what| LayerError::TooLarge {
        blob: digest.to_string(),
        what,
        cap: if what == "compressed blob" {
            limits.max_blob_bytes
        } else {
            limits.max_tar_bytes
        },
    };
    let inner = (|| {
        let dec: Box<dyn Read + '_> = match compression {
            Compression::None => Box::new(&mut outer),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(&mut outer)),
            Compression::Zstd => {
                Box::new(zstd::stream::read::Decoder::new(&mut outer).map_err(read_err)?)
            }
        };
        let mut tar = Hashing::capped(dec, limits.max_tar_bytes);
        let extracted = extract(&mut tar, &root);
        // Whatever the tar parser left (its end blocks, padding) is part
        // of both digests.
        let drained = io::copy(&mut tar, &mut io::sink());
        if tar.over() {
            return Err(too_large("uncompressed tar"));
        }
        match extracted {
            Ok(()) => {}
            // A short or corrupt stream shows up as a tar error: say
            // which when the digest is the cause.
            Err(source) => {
                return Err(LayerError::Tar {
                    blob: digest.to_string(),
                    source,
                })
            }
        }
        drained.map_err(read_err)?;
        Ok(tar.digest())
    })();
    let drained = inner.and_then(|d| {
        io::copy(&mut outer, &mut io::sink()).map_err(read_err)?;
        Ok(d)
    });
    if outer.over() {
        return Err(too_large("compressed blob"));
    }
    let actual_diff_id = drained?;
    let actual = outer.digest();
    if actual != digest {
        return Err(LayerError::BlobDigest {
            expected: digest.to_string(),
            actual,
        });
    }
    if let Some(want) = diff_id {
        if want != actual_diff_id {
            return Err(LayerError::DiffId {
                blob: digest.to_string(),
                expected: want.to_string(),
                actual: actual_diff_id,
            });
        }
    }
    let out = store.layer_path(&actual_diff_id)?;
    let tmp_out = stage.path().join("layer.erofs");
    let raw = stage.path().join("raw.erofs");
    let pack_err = |source| LayerError::Pack {
        blob: digest.to_string(),
        source,
    };
    let info = shoal_images::image::pack_erofs(&root, &raw, &tmp_out).map_err(pack_err)?;
    std::fs::rename(&tmp_out, &out).map_err(crate::io_err(&out))?;
    Ok(ConvertedLayer {
        digest: digest.to_string(),
        diff_id: actual_diff_id,
        path: out,
        erofs_bytes: info.len,
    })
}

/// The `sha256:` digest of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    let mut h = Hashing::new(io::empty());
    h.hash.update(bytes);
    h.digest()
}
