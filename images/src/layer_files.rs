//! Layers named by API callers, opened once and safely.
//!
//! A caller of the daemon names a layer as an image name (`tiny`, `base`)
//! or as a path; the daemon runs as root, so a path is only taken from one
//! allow-listed directory (the daemon's layers directory), and is opened
//! exactly once, beneath that directory, without following any symbolic
//! link (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or one
//! `O_NOFOLLOW` component at a time where the kernel has no `openat2`),
//! with `O_NONBLOCK` (a FIFO or a device cannot hang the open) and
//! `O_CLOEXEC`. What is checked (a regular file holding erofs with 4 KiB
//! blocks) is that open file, and the same file is what the guest maps:
//! the template pins it by its descriptor ([`LayerFile::file`]), so
//! renaming or swapping the path afterwards changes nothing.
//!
//! Every way a path can fail before it is open (outside the directory,
//! missing, a symbolic link, unreadable) gives the same
//! [`LayerError::NotAllowed`], so errors say nothing about files
//! elsewhere on the host.

use crate::layers::{self, LayerError};
use pmem::ImageInfo;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// One layer of a request, as the daemon passes it on.
#[derive(Debug, Clone)]
pub enum Layer {
    /// An image by name (`tiny`, `base`), resolved by whoever boots it.
    Image(String),
    /// A caller's file, already open and checked.
    File(LayerFile),
}

impl Layer {
    /// The layer as the API names it (image name or path).
    pub fn name(&self) -> String {
        match self {
            Layer::Image(n) => n.clone(),
            Layer::File(f) => f.path.display().to_string(),
        }
    }
}

/// A caller's layer file, opened by [`open_layer`].
#[derive(Debug, Clone)]
pub struct LayerFile {
    /// The path the caller gave.
    pub path: PathBuf,
    /// The open file (read-only, close-on-exec): the one that was checked.
    pub file: Arc<File>,
    /// What the checks found.
    pub info: ImageInfo,
}

impl LayerFile {
    /// [`layers::file_identity`] of the open file (path as given, size,
    /// inode, mtime), without looking the path up again.
    pub fn identity(&self) -> String {
        match self.file.metadata() {
            Ok(m) => format!(
                "{}:{}:{}:{}.{}",
                self.path.display(),
                m.len(),
                m.ino(),
                m.mtime(),
                m.mtime_nsec()
            ),
            Err(_) => self.path.display().to_string(),
        }
    }
}

/// Opens layer `layer` (an absolute path) from under `dir` and checks it
/// (see the module documentation). Blocking: call it off any async
/// runtime.
pub fn open_layer(dir: &Path, layer: &str) -> Result<LayerFile, LayerError> {
    let path = Path::new(layer);
    if !path.is_absolute() {
        return Err(LayerError::NotAbsolute(layer.into()));
    }
    let not_allowed = || LayerError::NotAllowed {
        layer: layer.into(),
        dir: dir.into(),
    };
    let rel = beneath(dir, path).ok_or_else(not_allowed)?;
    let dirfd = open_dir(dir).map_err(|_| not_allowed())?;
    let fd = open_beneath(&dirfd, &rel).map_err(|_| not_allowed())?;
    let file = File::from(fd);
    // Regular file, size, superblock: all on the open file.
    let info = pmem::check_file(&file, path)?;
    let info = layers::check_layer_info(info, path)?;
    // O_NONBLOCK served the open; a regular file does not need it after.
    // SAFETY: F_SETFL on a descriptor we own; no memory is passed.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, 0) };
    Ok(LayerFile {
        path: path.into(),
        file: Arc::new(file),
        info,
    })
}

/// Where [`open_beneath_dir`] found no file to open.
#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    /// Not an absolute path lexically beneath the directory (no `.`, `..`).
    #[error("not an absolute path under {0}")]
    Outside(PathBuf),
    /// The open failed (missing, a symbolic link on the way: `ELOOP` or
    /// `EXDEV`, unreadable, ...).
    #[error(transparent)]
    Open(#[from] std::io::Error),
}

/// Opens the caller-named `path` read-only from beneath `dir` as
/// [`open_layer`] does (no symbolic links, `O_NONBLOCK` for the open only,
/// close-on-exec), without looking at its contents. Blocking.
pub fn open_beneath_dir(dir: &Path, path: &Path) -> Result<File, BeneathError> {
    let rel = beneath(dir, path).ok_or_else(|| BeneathError::Outside(dir.into()))?;
    let dirfd = open_dir(dir)?;
    let file = File::from(open_beneath(&dirfd, &rel)?);
    // SAFETY: F_SETFL on a descriptor we own; no memory is passed.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, 0) };
    Ok(file)
}

/// `path` relative to `dir`, if it is lexically beneath it with plain
/// components only (no `.`, `..`, nothing after a root).
fn beneath(dir: &Path, path: &Path) -> Option<PathBuf> {
    if !dir.is_absolute() {
        return None;
    }
    let rel = path.strip_prefix(dir).ok()?;
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    (plain && rel.components().next().is_some()).then(|| rel.into())
}

const FILE_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;

fn cstr(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn check_fd(fd: libc::c_int) -> std::io::Result<OwnedFd> {
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned, owned by nothing
    // else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The allowed directory itself (the operator's configuration: its own
/// path may go through symbolic links).
fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    let c = cstr(dir)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    check_fd(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })
}

/// Opens `rel` beneath `dirfd` without following symbolic links:
/// `openat2`, else component by component.
pub(crate) fn open_beneath(dirfd: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    match openat2(dirfd, rel) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::E2BIG)) => {
            open_by_components(dirfd, rel)
        }
        r => r,
    }
}

fn openat2(dirfd: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    let c = cstr(rel)?;
    // SAFETY: open_how is plain integers; all zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    // Flags are non-negative.
    how.flags = FILE_FLAGS.unsigned_abs().into();
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads the NUL-terminated path and one open_how of the
    // size passed, both alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let fd = libc::c_int::try_from(r).map_err(|_| std::io::Error::other("openat2 result"))?;
    check_fd(fd)
}

/// The fallback: each directory opened with `O_NOFOLLOW | O_DIRECTORY`
/// relative to the one before, the file with `O_NOFOLLOW` (only plain
/// components reach here: [`beneath`]).
fn open_by_components(dirfd: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    let parts: Vec<&std::ffi::OsStr> = rel.iter().collect();
    let Some((last, dirs)) = parts.split_last() else {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    };
    let mut cur: Option<OwnedFd> = None;
    for d in dirs {
        let c = cstr(Path::new(d))?;
        let at = cur.as_ref().unwrap_or(dirfd).as_raw_fd();
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated name that outlives the call, relative
        // to a descriptor we hold.
        cur = Some(check_fd(unsafe { libc::openat(at, c.as_ptr(), flags) })?);
    }
    let c = cstr(Path::new(last))?;
    let at = cur.as_ref().unwrap_or(dirfd).as_raw_fd();
    // SAFETY: as above.
    check_fd(unsafe { libc::openat(at, c.as_ptr(), FILE_FLAGS) })
}

#[cfg(test)]
#[path = "layer_files_tests.rs"]
mod tests;
