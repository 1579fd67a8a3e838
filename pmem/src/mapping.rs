//! The host side of a pmem device: the image mapped read-only and shared,
//! owned by one value that also fixes the teardown order.
//!
//! ## Teardown order
//!
//! The VMM registers [`PmemMapping::region`] as a KVM memory slot with
//! `KVM_MEM_READONLY`. KVM resolves the slot through the host page tables
//! at fault time, so if the host range were unmapped while the slot still
//! pointed at it, the next `mmap` that reuses the address (a heap arena, a
//! guest RAM copy) would become readable by the guest. Therefore:
//!
//! 1. the KVM slot is removed (`KVM_SET_USER_MEMORY_REGION` with
//!    `memory_size = 0`), or the VM is gone (every vCPU thread joined and
//!    the VM and vCPU fds closed), **then**
//! 2. the range is unmapped, **then**
//! 3. the file is closed.
//!
//! [`PmemMapping`] runs 2 and 3 in [`PmemMapping::close`] or on drop, and
//! runs 1 itself through the hooks installed with
//! [`PmemMapping::set_before_unmap`] (install the slot removal right after
//! registering the slot). If a hook fails, the range is deliberately leaked
//! instead of unmapped. Without a hook, the VMM must drop the mapping after
//! the VM (declare it after the VM fd in the owning struct, or drop it
//! explicitly after joining the vCPUs).

use crate::fingerprint::{fingerprint, ImageFingerprint};
use crate::image::{examine, io_err, ImageError, ImageInfo};
use crate::layout::IMAGE_ALIGN;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Host alignment of the mapping: matching the guest's 2 MiB alignment lets
/// KVM use 2 MiB EPT entries where the host backs the file with huge pages.
const HOST_ALIGN: usize = 2 << 20;

/// Why an image could not be mapped or unmapped.
#[derive(Debug, thiserror::Error)]
pub enum MappingError {
    /// The image failed its checks.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The guest address is not 2 MiB-aligned.
    #[error("pmem guest address {0:#x} is not 2 MiB-aligned")]
    GuestAddr(u64),
    /// The guest range wraps around the address space.
    #[error("pmem image {path} ({len} bytes) does not fit at guest address {guest_addr:#x}")]
    GuestRange {
        /// The image.
        path: PathBuf,
        /// Its size.
        len: u64,
        /// The address.
        guest_addr: u64,
    },
    /// `mmap` failed.
    #[error("cannot map pmem image {path}: {source}")]
    Mmap {
        /// The image.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A before-unmap hook failed; the range was leaked, not unmapped.
    #[error("removing the guest mapping of pmem image {path} failed, host range leaked: {source}")]
    Hook {
        /// The image.
        path: PathBuf,
        /// The hook's error.
        source: io::Error,
    },
}

/// Where a mapping lives, for KVM slot registration and removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRegion {
    /// Guest-physical address (`guest_phys_addr`).
    pub guest_addr: u64,
    /// Length in bytes (`memory_size`).
    pub len: u64,
    /// Host virtual address (`userspace_addr`).
    pub host_addr: u64,
}

/// What a device needs from its mapping; cheap to clone.
#[derive(Debug, Clone)]
pub struct PmemBacking {
    /// Image path (saved in snapshots).
    pub path: PathBuf,
    /// The open image: the inode the guest actually sees.
    pub file: Arc<File>,
    /// Guest-physical start.
    pub guest_addr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl PmemBacking {
    /// Fingerprints the open image (for snapshots).
    pub fn fingerprint(&self) -> Result<ImageFingerprint, ImageError> {
        fingerprint(&self.file).map_err(io_err(&self.path, "cannot fingerprint"))
    }
}

type Hook = Box<dyn FnOnce(&SlotRegion) -> io::Result<()> + Send>;

/// An image mapped `MAP_SHARED`, `PROT_READ`, from a read-only fd: every VM
/// mapping the same file shares the host page cache, and none can write it
/// (`mprotect` to writable fails with `EACCES` on a read-only fd).
pub struct PmemMapping {
    path: PathBuf,
    file: Arc<File>,
    info: ImageInfo,
    /// Start of the mapping; owned by this value, unmapped once in `release`.
    host_addr: usize,
    len: u64,
    /// `len` as mapped.
    map_len: usize,
    guest_addr: u64,
    before_unmap: Vec<Hook>,
    released: bool,
}

impl std::fmt::Debug for PmemMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmemMapping")
            .field("path", &self.path)
            .field("host_addr", &format_args!("{:#x}", self.host_addr))
            .field("len", &self.len)
            .field("guest_addr", &format_args!("{:#x}", self.guest_addr))
            .field("hooks", &self.before_unmap.len())
            .finish()
    }
}

/// Opens an image read-only, close-on-exec, refusing a final symbolic link
/// (a path whose last component could be swapped for a link to another
/// file between whoever chose it and this open).
pub(crate) fn open_nofollow(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

impl PmemMapping {
    /// Opens the image at `path` read-only, checks it (see
    /// [`crate::check_image`]) and maps it for guest address `guest_addr`
    /// (from [`crate::place`], or a snapshot).
    pub fn open(path: &Path, guest_addr: u64) -> Result<Self, MappingError> {
        let file = open_nofollow(path).map_err(io_err(path, "cannot open"))?;
        Self::from_file(file, path, guest_addr)
    }

    /// Maps an already opened image (restore verifies the file it opened,
    /// then maps that same file; a boot maps the file it checked and
    /// placed, or one it inherited), named `path`.
    pub fn from_file(file: File, path: &Path, guest_addr: u64) -> Result<Self, MappingError> {
        if !guest_addr.is_multiple_of(IMAGE_ALIGN) {
            return Err(MappingError::GuestAddr(guest_addr));
        }
        let info = examine(&file, path)?;
        let len = info.len;
        if guest_addr.checked_add(len).is_none() {
            return Err(MappingError::GuestRange {
                path: path.to_path_buf(),
                len,
                guest_addr,
            });
        }
        let map_len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= isize::MAX as usize - HOST_ALIGN)
            .ok_or_else(|| ImageError::TooLarge {
                path: path.to_path_buf(),
                len,
            })?;
        let host_addr = map_aligned(&file, map_len).map_err(|source| MappingError::Mmap {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            file: Arc::new(file),
            info,
            host_addr,
            len,
            map_len,
            guest_addr,
            before_unmap: Vec::new(),
            released: false,
        })
    }

    /// Host virtual address of the first byte (KVM `userspace_addr`).
    pub fn host_addr(&self) -> u64 {
        self.host_addr as u64
    }

    /// Length in bytes: the image size, a multiple of 2 MiB.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: empty images are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Guest-physical address of the first byte.
    pub fn guest_addr(&self) -> u64 {
        self.guest_addr
    }

    /// The image path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the checks found (size, file system, DAX capability).
    pub fn info(&self) -> &ImageInfo {
        &self.info
    }

    /// The slot to register: read-only (`KVM_MEM_READONLY`), at
    /// [`PmemMapping::guest_addr`].
    pub fn region(&self) -> SlotRegion {
        SlotRegion {
            guest_addr: self.guest_addr,
            len: self.len,
            host_addr: self.host_addr as u64,
        }
    }

    /// What the device needs ([`crate::Pmem::new`]).
    pub fn backing(&self) -> PmemBacking {
        PmemBacking {
            path: self.path.clone(),
            file: self.file.clone(),
            guest_addr: self.guest_addr,
            len: self.len,
        }
    }

    /// Adds a hook run before the range is unmapped: the KVM slot removal.
    /// Hooks run in reverse order of installation, each once; if one fails,
    /// the rest still run but the range is leaked rather than unmapped.
    pub fn set_before_unmap<F>(&mut self, hook: F)
    where
        F: FnOnce(&SlotRegion) -> io::Result<()> + Send + 'static,
    {
        self.before_unmap.push(Box::new(hook));
    }

    /// Tears down in order: hooks (KVM slot removal), munmap, close.
    pub fn close(mut self) -> Result<(), MappingError> {
        self.release()
    }

    fn release(&mut self) -> Result<(), MappingError> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        let region = self.region();
        let mut failure = None;
        while let Some(hook) = self.before_unmap.pop() {
            if let Err(e) = hook(&region) {
                failure.get_or_insert(e);
            }
        }
        if let Some(source) = failure {
            // The guest may still reach this range: never hand it back to
            // the allocator.
            return Err(MappingError::Hook {
                path: self.path.clone(),
                source,
            });
        }
        // SAFETY: `host_addr..host_addr + len` is the mapping made in
        // `from_file`, owned by this value and unmapped only here (guarded by
        // `released`). No Rust reference into it exists: it is only handed
        // out as an integer address.
        let rc = unsafe { libc::munmap(self.host_addr as *mut libc::c_void, self.map_len) };
        if rc != 0 {
            log::warn!(
                "munmap of pmem image {} failed: {}",
                self.path.display(),
                io::Error::last_os_error()
            );
        }
        Ok(())
    }
}

impl Drop for PmemMapping {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            log::error!("{e}");
        }
        // The file closes when the last `Arc` (this or a device's) drops.
    }
}

/// Maps `len` bytes of `file` shared and read-only at a 2 MiB-aligned host
/// address: reserve `len + 2 MiB` of address space, map the file over the
/// aligned part, give back the slack.
fn map_aligned(file: &File, len: usize) -> io::Result<usize> {
    let reserve = len + HOST_ALIGN;
    // SAFETY: an anonymous, inaccessible reservation at an address the
    // kernel picks; it touches no existing memory. The result is checked.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            reserve,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = base as usize;
    let start = (base + HOST_ALIGN - 1) & !(HOST_ALIGN - 1);
    // SAFETY: `start..start + len` lies inside the reservation made above
    // (`start - base < HOST_ALIGN`), so MAP_FIXED replaces only address
    // space this function owns. The fd is open for reading; PROT_READ only.
    let p = unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            len,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_FIXED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // SAFETY: unmaps exactly the reservation made above, which nothing
        // else uses.
        unsafe { libc::munmap(base as *mut libc::c_void, reserve) };
        return Err(e);
    }
    let end = start + len;
    if start > base {
        // SAFETY: `base..start` is the unused head of our own reservation.
        unsafe { libc::munmap(base as *mut libc::c_void, start - base) };
    }
    if base + reserve > end {
        // SAFETY: `end..base + reserve` is the unused tail of our own
        // reservation.
        unsafe { libc::munmap(end as *mut libc::c_void, base + reserve - end) };
    }
    // Keep the image out of VMM core dumps; advisory, failure is harmless.
    // SAFETY: `start..end` is the file mapping made above.
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTDUMP) };
    Ok(start)
}

#[cfg(test)]
#[path = "mapping_tests.rs"]
mod tests;
