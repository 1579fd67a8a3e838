//! A cheap identity of an image's content, saved in snapshots so that a
//! restore onto a changed image is refused instead of showing the guest a
//! file system that changed under its page cache and DAX mappings.
//!
//! The content part is a SHA-256 over the size, the first and last MiB and
//! 62 evenly spaced 4 KiB blocks: at most ~2.3 MiB read, whatever the image
//! size. That catches rebuilt, repadded, truncated or swapped images; a
//! small in-place edit in the unsampled middle would slip through, which is
//! what the inode and mtime comparison is for: the same file (device and
//! inode) with a different mtime was modified in place and is refused too.
//! A byte-identical copy (another host, `cp`) has a new inode and passes.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};

const EDGE: u64 = 1 << 20;
const BLOCK_BYTES: usize = 4096;
const BLOCK: u64 = BLOCK_BYTES as u64;
const SAMPLES: u64 = 64;

/// Identity of an image file at snapshot time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageFingerprint {
    /// Size in bytes.
    pub len: u64,
    /// Device of the file system holding it.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Modification time, seconds.
    pub mtime_sec: i64,
    /// Modification time, nanoseconds.
    pub mtime_nsec: i64,
    /// SHA-256 of the size and the sampled content.
    pub sample_sha256: [u8; 32],
}

/// How an image differs from its fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageChange {
    /// Different size.
    #[error("its size is {now} bytes, it was {saved} bytes")]
    Size {
        /// At snapshot time.
        saved: u64,
        /// Now.
        now: u64,
    },
    /// Different sampled content.
    #[error("its content differs (sampled SHA-256 {now}, was {saved})")]
    Content {
        /// At snapshot time (hex).
        saved: String,
        /// Now (hex).
        now: String,
    },
    /// Same file, different modification time: modified in place.
    #[error("it was modified in place (same inode {ino}, mtime changed)")]
    ModifiedInPlace {
        /// The inode.
        ino: u64,
    },
}

fn hex(d: &[u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn read_full_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    file.read_exact_at(buf, off)
}

/// Fingerprints an open image (reads at most ~2.3 MiB).
pub fn fingerprint(file: &File) -> io::Result<ImageFingerprint> {
    let meta = file.metadata()?;
    let len = meta.len();
    let mut h = Sha256::new();
    h.update(len.to_le_bytes());
    let mut buf = vec![0u8; usize::try_from(EDGE.min(len)).unwrap_or(0)];
    read_full_at(file, &mut buf, 0)?;
    h.update(&buf);
    let tail = len - buf.len() as u64;
    read_full_at(file, &mut buf, tail)?;
    h.update(&buf);
    if len >= BLOCK * SAMPLES {
        let step = len / SAMPLES / BLOCK * BLOCK;
        let mut block = [0u8; BLOCK_BYTES];
        for i in 1..SAMPLES - 1 {
            read_full_at(file, &mut block, i * step)?;
            h.update(block);
        }
    }
    Ok(ImageFingerprint {
        len,
        dev: meta.dev(),
        ino: meta.ino(),
        mtime_sec: meta.mtime(),
        mtime_nsec: meta.mtime_nsec(),
        sample_sha256: h.finalize().into(),
    })
}

impl ImageFingerprint {
    /// Whether `meta` describes the very file this fingerprint was taken
    /// of, unmodified since: same device, inode, size and mtime. Content
    /// sampling is then unnecessary (a writer changes the mtime; setting it
    /// back by hand is a deliberate act this check does not defend against).
    pub fn same_file_unmodified(&self, meta: &std::fs::Metadata) -> bool {
        (
            meta.len(),
            meta.dev(),
            meta.ino(),
            meta.mtime(),
            meta.mtime_nsec(),
        ) == (
            self.len,
            self.dev,
            self.ino,
            self.mtime_sec,
            self.mtime_nsec,
        )
    }

    /// Compares `self` (saved) with `now` (the file found at restore).
    pub fn compare(&self, now: &ImageFingerprint) -> Result<(), ImageChange> {
        if self.len != now.len {
            return Err(ImageChange::Size {
                saved: self.len,
                now: now.len,
            });
        }
        if self.sample_sha256 != now.sample_sha256 {
            return Err(ImageChange::Content {
                saved: hex(&self.sample_sha256),
                now: hex(&now.sample_sha256),
            });
        }
        if (self.dev, self.ino) == (now.dev, now.ino)
            && (self.mtime_sec, self.mtime_nsec) != (now.mtime_sec, now.mtime_nsec)
        {
            return Err(ImageChange::ModifiedInPlace { ino: now.ino });
        }
        Ok(())
    }
}
