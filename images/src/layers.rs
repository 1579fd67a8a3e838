//! What a template's root is made of beyond its image: further read-only
//! layers (erofs images on `/dev/pmem1..`, each over the one before in the
//! guest's overlay) and the overlay's upper layer, which takes every write:
//!
//! - **tmpfs** of a given size (`shoal.upper_size=NNm`; by default half of
//!   the guest's memory, always written out on the kernel command line), or
//! - a **scratch disk**: a sparse ext4 file of N MiB on virtio-blk
//!   (`shoal.upper=/dev/vda`), for writes larger than memory.
//!
//! A scratch disk is part of the guest's state: the template is booted with
//! the disk freshly formatted, and its snapshot directory keeps the disk as
//! it was at the snapshot ([`SCRATCH_DISK`]). Every sandbox restored from
//! the template gets its own copy of that file ([`clone_file`]: a reflink
//! where the file system has them, else a sparse copy) in its own
//! directory, and the VMM is pointed at the copy (`--restore-disk`). The
//! copy goes with the sandbox's directory: removed with the sandbox, kept
//! (and named by the pause snapshot) while it is paused.

use pmem::{FsKind, ImageInfo};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Most extra layers (the guest agent probes `/dev/pmem1` to `/dev/pmem8`).
pub const MAX_LAYERS: usize = 8;
/// Smallest tmpfs upper layer (MiB).
pub const MIN_UPPER_SIZE_MIB: u32 = 1;
/// Smallest scratch disk (MiB): room for ext4's own metadata.
pub const MIN_UPPER_DISK_MIB: u32 = 16;
/// Largest scratch disk (MiB): 1 TiB (sparse; the host pays for what the
/// guest writes).
pub const MAX_UPPER_DISK_MIB: u32 = 1 << 20;
/// A template's (or a sandbox's) scratch disk, in its directory.
pub const SCRATCH_DISK: &str = "scratch.ext4";

/// Why a layer or an upper-layer choice is unusable.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The image file failed the pmem checks (missing, misaligned,
    /// truncated, ...).
    #[error("layer: {0}")]
    Image(#[from] pmem::ImageError),
    /// Not an erofs image.
    #[error(
        "layer {path}: not an erofs image ({found}); build one with \
         `shoal image build DIR -o OUT --no-agent`"
    )]
    NotErofs {
        /// The file.
        path: PathBuf,
        /// What it holds instead.
        found: String,
    },
    /// Blocks the guest cannot map with DAX.
    #[error(
        "layer {path}: erofs with {block_size}-byte blocks; DAX needs 4096-byte blocks \
         (rebuild it with `shoal image build`)"
    )]
    NotDax {
        /// The file.
        path: PathBuf,
        /// Its block size.
        block_size: u32,
    },
    /// A relative path (the daemon's working directory is not the caller's).
    #[error(
        "layer {0:?}: give an absolute path (or the name of an image, tiny or base, or of a \
         built-in layer: `shoal image layers`)"
    )]
    NotAbsolute(String),
    /// A path outside the allowed layers directory, or one that cannot be
    /// opened there without following a symbolic link: the same words
    /// whether it exists or not, so that errors tell nothing about files
    /// outside the directory.
    #[error(
        "layer {layer:?}: not an allowed layer (give an image name, tiny or base, a built-in \
         layer such as fncall-python (`shoal image layers`), or an \
         erofs image file under {dir})"
    )]
    NotAllowed {
        /// The layer as given.
        layer: String,
        /// The directory layers may come from.
        dir: PathBuf,
    },
    /// Too many layers.
    #[error("{0} layers: at most {MAX_LAYERS}")]
    TooMany(usize),
    /// Both upper kinds asked for.
    #[error(
        "give upper_size_mib (a tmpfs upper layer) or upper_disk_mib (a scratch disk), not both"
    )]
    BothUppers,
    /// A tmpfs size out of bounds.
    #[error(
        "upper_size_mib {mib}: expected {MIN_UPPER_SIZE_MIB}..={max} (at most the guest's memory; \
         for more, use a scratch disk: upper_disk_mib)"
    )]
    UpperSize {
        /// The size asked for.
        mib: u32,
        /// The guest's memory.
        max: u32,
    },
    /// A scratch disk size out of bounds.
    #[error("upper_disk_mib {0}: expected {MIN_UPPER_DISK_MIB}..={MAX_UPPER_DISK_MIB}")]
    UpperDisk(u32),
    /// `mkfs.ext4` could not be run or failed.
    #[error("formatting the scratch disk {path}: {detail}")]
    Mkfs {
        /// The disk file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// File system.
    #[error("{0}: {1}")]
    Io(PathBuf, io::Error),
}

/// Where the overlay's upper layer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Upper {
    /// tmpfs in guest memory; `size_mib` `None`: half of the guest's memory.
    Tmpfs {
        /// Its size limit (MiB).
        size_mib: Option<u32>,
    },
    /// An ext4 scratch disk of this many MiB, one per sandbox.
    Disk {
        /// Its size (MiB).
        size_mib: u32,
    },
}

impl Default for Upper {
    fn default() -> Self {
        Upper::Tmpfs { size_mib: None }
    }
}

impl Upper {
    /// The choice from an API request's `upper_size_mib` / `upper_disk_mib`,
    /// checked against a guest of `memory_mib`.
    pub fn from_request(
        size_mib: Option<u32>,
        disk_mib: Option<u32>,
        memory_mib: u32,
    ) -> Result<Upper, LayerError> {
        match (size_mib, disk_mib) {
            (Some(_), Some(_)) => Err(LayerError::BothUppers),
            (Some(s), None) if !(MIN_UPPER_SIZE_MIB..=memory_mib).contains(&s) => {
                Err(LayerError::UpperSize {
                    mib: s,
                    max: memory_mib,
                })
            }
            (s, None) => Ok(Upper::Tmpfs { size_mib: s }),
            (None, Some(d)) if !(MIN_UPPER_DISK_MIB..=MAX_UPPER_DISK_MIB).contains(&d) => {
                Err(LayerError::UpperDisk(d))
            }
            (None, Some(d)) => Ok(Upper::Disk { size_mib: d }),
        }
    }

    /// Checks the sizes against a guest of `memory_mib` (as
    /// [`Upper::from_request`] does).
    pub fn check(&self, memory_mib: u32) -> Result<(), LayerError> {
        let (size, disk) = match *self {
            Upper::Tmpfs { size_mib } => (size_mib, None),
            Upper::Disk { size_mib } => (None, Some(size_mib)),
        };
        Upper::from_request(size, disk, memory_mib).map(drop)
    }

    /// The tmpfs size the guest is given (`shoal.upper_size=`): the one
    /// asked for, else half of `memory_mib`. A scratch-disk upper gets it
    /// too: the guest falls back to tmpfs if the disk does not mount.
    pub fn tmpfs_mib(&self, memory_mib: u32) -> u32 {
        match self {
            Upper::Tmpfs { size_mib: Some(s) } => *s,
            _ => default_upper_size_mib(memory_mib),
        }
    }

    /// The scratch disk's size, if this is one.
    pub fn disk_mib(&self) -> Option<u32> {
        match self {
            Upper::Disk { size_mib } => Some(*size_mib),
            Upper::Tmpfs { .. } => None,
        }
    }

    /// Stable text for cache keys and names.
    pub fn key(&self) -> String {
        match self {
            Upper::Tmpfs { size_mib: None } => "tmpfs".into(),
            Upper::Tmpfs { size_mib: Some(s) } => format!("tmpfs:{s}"),
            Upper::Disk { size_mib } => format!("disk:{size_mib}"),
        }
    }
}

/// The default tmpfs upper layer: half of the guest's memory (at least
/// [`MIN_UPPER_SIZE_MIB`]).
pub fn default_upper_size_mib(memory_mib: u32) -> u32 {
    (memory_mib / 2).max(MIN_UPPER_SIZE_MIB)
}

/// Checks that `path` is a layer the guest can use: a pmem image (regular,
/// a multiple of 2 MiB, not truncated) holding erofs with 4 KiB blocks.
pub fn check_layer(path: &Path) -> Result<ImageInfo, LayerError> {
    check_layer_info(pmem::check_image(path)?, path)
}

/// The file-system half of [`check_layer`], on what [`pmem::check_image`]
/// or [`pmem::check_file`] found: erofs with 4 KiB blocks.
pub fn check_layer_info(info: ImageInfo, path: &Path) -> Result<ImageInfo, LayerError> {
    match info.filesystem {
        Some(fs) if fs.kind == FsKind::Erofs => {
            if fs.block_size != pmem::image::GUEST_PAGE_SIZE {
                return Err(LayerError::NotDax {
                    path: path.into(),
                    block_size: fs.block_size,
                });
            }
            Ok(info)
        }
        other => Err(LayerError::NotErofs {
            path: path.into(),
            found: other.map_or_else(
                || "no file system recognised".into(),
                |f| format!("{} file system", f.kind),
            ),
        }),
    }
}

/// Checks a request's layers: at most [`MAX_LAYERS`], each the name of
/// one of `images` (resolved later) or an absolute path to a usable layer
/// ([`check_layer`]).
pub fn check_layers(layers: &[String], images: &[&str]) -> Result<(), LayerError> {
    if layers.len() > MAX_LAYERS {
        return Err(LayerError::TooMany(layers.len()));
    }
    for l in layers {
        if images.contains(&l.as_str()) {
            continue;
        }
        if !Path::new(l).is_absolute() {
            return Err(LayerError::NotAbsolute(l.clone()));
        }
        check_layer(Path::new(l))?;
    }
    Ok(())
}

/// Identity of a file for cache keys: path, size, inode and mtime, so a
/// rebuilt image (a new file renamed over the old) makes a new key.
pub fn file_identity(path: &Path) -> String {
    match std::fs::metadata(path) {
        Ok(m) => format!(
            "{}:{}:{}:{}.{}",
            path.display(),
            m.len(),
            m.ino(),
            m.mtime(),
            m.mtime_nsec()
        ),
        Err(_) => path.display().to_string(),
    }
}

/// Creates `path` as a sparse file of `mib` MiB holding an empty ext4 file
/// system for the upper layer: 4 KiB blocks, no journal (the disk lives
/// and dies with its sandbox, and snapshots capture it together with guest
/// memory), no reserved blocks, inode tables initialised here so that the
/// guest kernel has no lazy initialisation to do (they stay holes).
pub fn format_scratch(path: &Path, mib: u32) -> Result<(), LayerError> {
    if !(MIN_UPPER_DISK_MIB..=MAX_UPPER_DISK_MIB).contains(&mib) {
        return Err(LayerError::UpperDisk(mib));
    }
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| LayerError::Io(path.into(), e))?;
    let res = f
        .set_len(u64::from(mib) << 20)
        .map_err(|e| LayerError::Io(path.into(), e))
        .and_then(|()| mkfs(path));
    if res.is_err() {
        let _ = std::fs::remove_file(path);
    }
    res
}

fn mkfs(path: &Path) -> Result<(), LayerError> {
    let err = |detail: String| LayerError::Mkfs {
        path: path.into(),
        detail,
    };
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-m", "0", "-O", "^has_journal"])
        .args(["-E", "lazy_itable_init=0", "-L", "shoal-upper"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| err(format!("cannot run mkfs.ext4 (install e2fsprogs): {e}")))?;
    if !out.status.success() {
        return Err(err(format!(
            "mkfs.ext4 failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The scratch disk in a template's or sandbox's directory, if it has one.
pub fn scratch_disk(dir: &Path) -> Option<PathBuf> {
    let p = dir.join(SCRATCH_DISK);
    p.is_file().then_some(p)
}

/// Copies `src` to the new file `dst` (mode 0600; it must not exist): a
/// reflink where the file system shares extents, else a copy of the data
/// regions only, so a sparse file stays sparse. Returns the bytes copied
/// (0 for a reflink). `dst` is removed again on failure.
pub fn clone_file(src: &Path, dst: &Path) -> Result<u64, LayerError> {
    let input = File::open(src).map_err(|e| LayerError::Io(src.into(), e))?;
    clone_open(&input, src, dst)
}

/// [`clone_file`] from an already open file (`src` names it in errors).
pub fn clone_open(input: &File, src: &Path, dst: &Path) -> Result<u64, LayerError> {
    let len = input
        .metadata()
        .map_err(|e| LayerError::Io(src.into(), e))?
        .len();
    let out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)
        .map_err(|e| LayerError::Io(dst.into(), e))?;
    let res = (|| {
        // SAFETY: FICLONE takes the source fd as its argument; both fds are
        // open for the duration of the call and nothing else is passed.
        let rc = unsafe { libc::ioctl(out.as_raw_fd(), libc::FICLONE, input.as_raw_fd()) };
        if rc == 0 {
            return Ok(0);
        }
        out.set_len(len)
            .map_err(|e| LayerError::Io(dst.into(), e))?;
        copy_data(input, &out, len).map_err(|e| LayerError::Io(dst.into(), e))
    })();
    match res {
        Ok(n) => Ok(n),
        Err(e) => {
            drop(out);
            let _ = std::fs::remove_file(dst);
            Err(e)
        }
    }
}

/// `lseek(fd, off, whence)`, `None` at ENXIO (no data/hole after `off`).
fn seek(f: &File, off: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let off =
        libc::off_t::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    // SAFETY: lseek on an fd we own; no memory is passed.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // r >= 0 here.
    Ok(Some(r.unsigned_abs()))
}

/// Copies the data regions of `input` (found with SEEK_DATA/SEEK_HOLE)
/// into `out` at the same offsets (`out` already has the full length).
fn copy_data(input: &File, out: &File, len: u64) -> io::Result<u64> {
    let mut copied = 0u64;
    let mut pos = 0u64;
    while pos < len {
        let Some(start) = seek(input, pos, libc::SEEK_DATA)? else {
            break;
        };
        let end = seek(input, start, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        let overflow = || io::Error::from_raw_os_error(libc::EOVERFLOW);
        let mut off_in = libc::loff_t::try_from(start).map_err(|_| overflow())?;
        let mut off_out = off_in;
        // off_in only grows from a non-negative start.
        while off_in.unsigned_abs() < end {
            let left = end - off_in.unsigned_abs();
            let want = usize::try_from(left.min(1 << 30)).map_err(|_| overflow())?;
            // SAFETY: both fds are open; the offsets are locals the kernel
            // updates; no user memory is involved.
            let n = unsafe {
                libc::copy_file_range(
                    input.as_raw_fd(),
                    &mut off_in,
                    out.as_raw_fd(),
                    &mut off_out,
                    want,
                    0,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank while being copied",
                ));
            }
            // n > 0 here.
            copied += n.unsigned_abs() as u64;
        }
        pos = end;
    }
    Ok(copied)
}

#[cfg(test)]
#[path = "layers_tests.rs"]
mod tests;
