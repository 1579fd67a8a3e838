//! Pmem image files: the checks every image passes before it is mapped, and
//! padding for `shoal image build`.
//!
//! An image is a regular, non-empty file whose size is a multiple of 2 MiB
//! ([`IMAGE_ALIGN`], see [`crate::layout`] for why). When it holds an erofs
//! or ext2/3/4 file system, the superblock is read too: a file system that
//! claims more bytes than the file holds is a truncated image and refused;
//! its block size tells whether the guest can mount it with DAX (only with
//! blocks of the guest page size, 4 KiB).
//!
//! Images must not change while a VM maps them: the mapping is `MAP_SHARED`,
//! so the guest would see the change (and a shrunk file faults). Replace an
//! image by writing a new file and renaming it over the old one
//! ([`pad_image_to`] does); running VMs keep the old inode.

use crate::layout::IMAGE_ALIGN;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Guest page size: DAX needs file-system blocks of exactly this size.
pub const GUEST_PAGE_SIZE: u32 = 4096;

const EROFS_SB_OFFSET: usize = 1024;
const EROFS_MAGIC: u32 = 0xe0f5_e1e2;
const EXT_SB_OFFSET: usize = 1024;
const EXT_MAGIC: u16 = 0xef53;
const EXT4_FEATURE_INCOMPAT_64BIT: u32 = 0x80;

/// Why an image is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The file could not be opened, read or inspected.
    #[error("pmem image {path}: {what}: {source}")]
    Io {
        /// The image.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Not a regular file.
    #[error("pmem image {0} is not a regular file")]
    NotAFile(PathBuf),
    /// Zero bytes.
    #[error("pmem image {0} is empty (0 bytes); build it with `shoal image build`")]
    Empty(PathBuf),
    /// Size not a multiple of the alignment.
    #[error(
        "pmem image {path} is {len} bytes, not a multiple of {align} bytes ({align_mib} MiB): \
         a Linux guest maps pmem memory in whole 2 MiB sub-sections and refuses the device \
         otherwise (no /dev/pmem0). Pad it with `shoal image build`, which pads images to \
         {align_mib} MiB (it would become {padded} bytes)",
        align_mib = align / (1 << 20)
    )]
    Misaligned {
        /// The image.
        path: PathBuf,
        /// Its size.
        len: u64,
        /// The alignment it needs.
        align: u64,
        /// Its size once padded.
        padded: u64,
    },
    /// The file system inside claims more bytes than the file holds.
    #[error(
        "pmem image {path} is truncated: its {fs} file system is {fs_bytes} bytes but the \
         file holds only {len}; rebuild it with `shoal image build`"
    )]
    Truncated {
        /// The image.
        path: PathBuf,
        /// File-system kind.
        fs: FsKind,
        /// Size the file system claims.
        fs_bytes: u64,
        /// Size of the file.
        len: u64,
    },
    /// The padding alignment is not a power of two of at least 4 KiB.
    #[error("pad alignment {0} is not a power of two of at least 4096")]
    BadAlignment(u64),
    /// The image is too large to map on this host.
    #[error("pmem image {path} is {len} bytes, too large to map")]
    TooLarge {
        /// The image.
        path: PathBuf,
        /// Its size.
        len: u64,
    },
}

/// A file system recognised in an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FsKind {
    /// erofs.
    Erofs,
    /// ext2, ext3 or ext4 (one superblock format).
    Ext4,
}

impl std::fmt::Display for FsKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Erofs => "erofs",
            Self::Ext4 => "ext4",
        })
    }
}

/// What the superblock says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsInfo {
    /// The kind.
    pub kind: FsKind,
    /// Block size in bytes.
    pub block_size: u32,
    /// Bytes the file system spans (blocks x block size).
    pub fs_bytes: u64,
}

/// A checked image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// The image.
    pub path: PathBuf,
    /// Its size (a multiple of [`IMAGE_ALIGN`] once checked).
    pub len: u64,
    /// The file system found in it, if recognised.
    pub filesystem: Option<FsInfo>,
}

impl ImageInfo {
    /// Whether the guest can mount the file system with DAX: `Some(true)`
    /// for 4 KiB blocks, `Some(false)` otherwise (it still mounts, through
    /// the guest page cache), `None` for an unrecognised file system.
    pub fn dax_capable(&self) -> Option<bool> {
        self.filesystem.map(|f| f.block_size == GUEST_PAGE_SIZE)
    }
}

/// Checks the image at `path` the way [`crate::PmemMapping::open`] will:
/// a regular, non-empty file, a multiple of 2 MiB, not truncated.
pub fn check_image(path: &Path) -> Result<ImageInfo, ImageError> {
    let file = File::open(path).map_err(io_err(path, "cannot open"))?;
    examine(&file, path)
}

/// Pads the image at `path` in place with zeros to a multiple of `alignment`
/// (use [`IMAGE_ALIGN`]) and checks it. The growth is one `ftruncate` (other
/// readers see the old or the new size, never a partial one) followed by an
/// fsync; an already aligned image is left untouched.
///
/// In place, the inode stays the same: VMs running on the image keep working
/// (they map only the old length), but snapshots taken before refuse to
/// restore since the image changed. Prefer [`pad_image_to`] for images that
/// may be in use.
pub fn pad_image(path: &Path, alignment: u64) -> Result<ImageInfo, ImageError> {
    check_alignment(alignment)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err(path, "cannot open for padding"))?;
    let len = regular_len(&file, path)?;
    let padded = padded_len(len, alignment, path)?;
    if padded != len {
        file.set_len(padded).map_err(io_err(path, "cannot pad"))?;
        file.sync_all().map_err(io_err(path, "cannot sync"))?;
    }
    examine_aligned(&file, path, alignment)
}

/// Writes a zero-padded copy of `src` to `dst` atomically: the copy goes to a
/// temporary file next to `dst`, is padded and fsynced, then renamed over
/// `dst` (which may be `src` itself). Readers of `dst` see the old file or
/// the complete new one; VMs mapping the old file keep their inode.
pub fn pad_image_to(src: &Path, dst: &Path, alignment: u64) -> Result<ImageInfo, ImageError> {
    check_alignment(alignment)?;
    let mut input = File::open(src).map_err(io_err(src, "cannot open"))?;
    let len = regular_len(&input, src)?;
    let padded = padded_len(len, alignment, src)?;
    let dir = match dst.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = dst
        .file_name()
        .map_or_else(|| "image".into(), |n| n.to_string_lossy().into_owned());
    let (tmp_path, mut tmp) = create_temp(&dir, &name)?;
    let result = (|| {
        io::copy(&mut input, &mut tmp).map_err(io_err(&tmp_path, "cannot copy image"))?;
        tmp.set_len(padded)
            .map_err(io_err(&tmp_path, "cannot pad"))?;
        tmp.sync_all().map_err(io_err(&tmp_path, "cannot sync"))?;
        examine_aligned(&tmp, &tmp_path, alignment)?;
        std::fs::rename(&tmp_path, dst).map_err(io_err(dst, "cannot rename padded image"))?;
        // Make the rename durable; a failure here leaves a correct file.
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp_path);
        return Err(e);
    }
    check_image(dst)
}

fn create_temp(dir: &Path, name: &str) -> Result<(PathBuf, File), ImageError> {
    let pid = std::process::id();
    for n in 0..100u32 {
        let p = dir.join(format!(".{name}.pad-{pid}-{n}"));
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => return Ok((p, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(&p, "cannot create temporary file")(e)),
        }
    }
    Err(ImageError::Io {
        path: dir.to_path_buf(),
        what: "cannot create temporary file",
        source: io::ErrorKind::AlreadyExists.into(),
    })
}

fn check_alignment(alignment: u64) -> Result<(), ImageError> {
    if !alignment.is_power_of_two() || alignment < 4096 {
        return Err(ImageError::BadAlignment(alignment));
    }
    Ok(())
}

fn padded_len(len: u64, alignment: u64, path: &Path) -> Result<u64, ImageError> {
    if len == 0 {
        return Err(ImageError::Empty(path.to_path_buf()));
    }
    len.checked_next_multiple_of(alignment)
        .ok_or_else(|| ImageError::TooLarge {
            path: path.to_path_buf(),
            len,
        })
}

pub(crate) fn io_err(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> ImageError {
    let path = path.to_path_buf();
    move |source| ImageError::Io { path, what, source }
}

/// Size of an open regular file.
fn regular_len(file: &File, path: &Path) -> Result<u64, ImageError> {
    let meta = file.metadata().map_err(io_err(path, "cannot stat"))?;
    if !meta.is_file() {
        return Err(ImageError::NotAFile(path.to_path_buf()));
    }
    Ok(meta.len())
}

/// [`check_image`] on an already open file (named `path` in errors), so
/// that what is checked is what gets mapped.
pub fn check_file(file: &File, path: &Path) -> Result<ImageInfo, ImageError> {
    examine(file, path)
}

/// All image checks, on an already open file (so what is checked is what
/// gets mapped).
pub(crate) fn examine(file: &File, path: &Path) -> Result<ImageInfo, ImageError> {
    examine_aligned(file, path, IMAGE_ALIGN)
}

fn examine_aligned(file: &File, path: &Path, align: u64) -> Result<ImageInfo, ImageError> {
    let len = regular_len(file, path)?;
    if len == 0 {
        return Err(ImageError::Empty(path.to_path_buf()));
    }
    if !len.is_multiple_of(align) {
        return Err(ImageError::Misaligned {
            path: path.to_path_buf(),
            len,
            align,
            padded: len.checked_next_multiple_of(align).unwrap_or(u64::MAX),
        });
    }
    let filesystem = detect_fs(file).map_err(io_err(path, "cannot read superblock"))?;
    if let Some(fs) = filesystem {
        if fs.fs_bytes > len {
            return Err(ImageError::Truncated {
                path: path.to_path_buf(),
                fs: fs.kind,
                fs_bytes: fs.fs_bytes,
                len,
            });
        }
    }
    Ok(ImageInfo {
        path: path.to_path_buf(),
        len,
        filesystem,
    })
}

/// Reads the first 4 KiB and recognises erofs and ext2/3/4 superblocks.
fn detect_fs(file: &File) -> io::Result<Option<FsInfo>> {
    let mut head = [0u8; 4096];
    let mut n = 0;
    while n < head.len() {
        match file.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(parse_superblock(&head[..n]))
}

fn le16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

fn le32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// Parses an erofs or ext superblock out of the image's first bytes.
/// Implausible values make the file system "unrecognised", never an error.
pub(crate) fn parse_superblock(head: &[u8]) -> Option<FsInfo> {
    if le32(head, EROFS_SB_OFFSET) == Some(EROFS_MAGIC) {
        // struct erofs_super_block: blkszbits at +12 (u8), blocks at +36.
        let bits = u32::from(*head.get(EROFS_SB_OFFSET + 12)?);
        if !(9..=16).contains(&bits) {
            return None;
        }
        let blocks = u64::from(le32(head, EROFS_SB_OFFSET + 36)?);
        return Some(FsInfo {
            kind: FsKind::Erofs,
            block_size: 1 << bits,
            fs_bytes: blocks << bits,
        });
    }
    if le16(head, EXT_SB_OFFSET + 56) == Some(EXT_MAGIC) {
        // struct ext4_super_block: s_blocks_count_lo +4, s_log_block_size
        // +24, s_feature_incompat +96, s_blocks_count_hi +0x150.
        let log = le32(head, EXT_SB_OFFSET + 24)?;
        if log > 6 {
            return None;
        }
        let block_size = 1024u32 << log;
        let mut blocks = u64::from(le32(head, EXT_SB_OFFSET + 4)?);
        let incompat = le32(head, EXT_SB_OFFSET + 96)?;
        if incompat & EXT4_FEATURE_INCOMPAT_64BIT != 0 {
            blocks |= u64::from(le32(head, EXT_SB_OFFSET + 0x150)?) << 32;
        }
        return Some(FsInfo {
            kind: FsKind::Ext4,
            block_size,
            fs_bytes: blocks.checked_mul(u64::from(block_size))?,
        });
    }
    None
}

#[cfg(test)]
#[path = "image_tests.rs"]
mod tests;
