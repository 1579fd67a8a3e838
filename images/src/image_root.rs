//! Writing into a staged root file system without following its links:
//! the tree came from an archive, so any of its names may be a symbolic
//! link to anywhere on the host (`dev -> /etc`). Every directory is opened
//! relative to the one above it with `O_NOFOLLOW | O_DIRECTORY`, and every
//! node is made with `*at` calls in the directory it belongs to.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

fn cname(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn fd_of(r: libc::c_int) -> io::Result<OwnedFd> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned, owned by nothing
    // else.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

fn ok(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What a name directly in a directory is, without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Nothing by that name.
    Missing,
    /// A directory.
    Dir,
    /// A symbolic link.
    Link,
    /// Anything else.
    Other,
}

/// A directory of the staged tree, open.
#[derive(Debug)]
pub(super) struct Dir(OwnedFd);

impl Dir {
    /// The root itself (made by us).
    pub(super) fn open(path: &Path) -> io::Result<Dir> {
        let c = cname(path.as_os_str())?;
        // SAFETY: a NUL-terminated path alive for the call.
        fd_of(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })
        .map(Dir)
    }

    /// What `name` is.
    pub(super) fn kind(&self, name: &str) -> io::Result<Kind> {
        let c = cname(OsStr::new(name))?;
        // SAFETY: fstatat writes one stat struct we own; the name is
        // NUL-terminated and alive for the call.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let r = unsafe {
            libc::fstatat(
                self.0.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(Kind::Missing),
                _ => Err(e),
            };
        }
        Ok(match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Link,
            _ => Kind::Other,
        })
    }

    /// Makes directory `name` with exactly `mode` (not narrowed by the
    /// umask).
    pub(super) fn mkdir(&self, name: &str, mode: u32) -> io::Result<()> {
        let c = cname(OsStr::new(name))?;
        // SAFETY: a NUL-terminated name alive for the call, relative to a
        // directory we hold.
        ok(unsafe { libc::mkdirat(self.0.as_raw_fd(), c.as_ptr(), 0o700) })?;
        // The umask narrowed the mode: set it on the directory itself,
        // opened without following a link.
        let d = self.subdir(name)?;
        // SAFETY: fchmod on a descriptor we own.
        ok(unsafe { libc::fchmod(d.0.as_raw_fd(), mode) })
    }

    /// The directory `name` in this one, never through a link.
    pub(super) fn subdir(&self, name: &str) -> io::Result<Dir> {
        let c = cname(OsStr::new(name))?;
        // SAFETY: a NUL-terminated name alive for the call.
        fd_of(unsafe {
            libc::openat(
                self.0.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })
        .map(Dir)
    }

    /// The directory at `rel` below this one, made (mode 0755) where
    /// missing; any link on the way is an error (ELOOP / ENOTDIR).
    pub(super) fn subdirs(&self, rel: &Path) -> io::Result<Dir> {
        let mut cur = self.subdir(".")?;
        for c in rel.components() {
            let Component::Normal(n) = c else {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            };
            let n = n
                .to_str()
                .ok_or(io::Error::from_raw_os_error(libc::EINVAL))?;
            if cur.kind(n)? == Kind::Missing {
                cur.mkdir(n, 0o755)?;
            }
            cur = cur.subdir(n)?;
        }
        Ok(cur)
    }

    /// Makes the character device `name` (`major:minor`, `mode`).
    pub(super) fn mknod_chr(
        &self,
        name: &str,
        major: u32,
        minor: u32,
        mode: u32,
    ) -> io::Result<()> {
        let c = cname(OsStr::new(name))?;
        // SAFETY: a NUL-terminated name alive for the call, relative to a
        // directory we hold; mknodat never follows a link (it fails with
        // EEXIST on any existing name).
        ok(unsafe {
            libc::mknodat(
                self.0.as_raw_fd(),
                c.as_ptr(),
                libc::S_IFCHR | 0o600,
                libc::makedev(major, minor),
            )
        })?;
        // SAFETY: as above; fchmodat without AT_SYMLINK_NOFOLLOW follows a
        // link, but the name was just made as a device node by us.
        ok(unsafe { libc::fchmodat(self.0.as_raw_fd(), c.as_ptr(), mode, 0) })
    }

    /// Replaces `name` with a new regular file of `mode` holding what
    /// `src` holds.
    pub(super) fn write_file(&self, name: &str, src: &Path, mode: u32) -> io::Result<()> {
        let c = cname(OsStr::new(name))?;
        // SAFETY: a NUL-terminated name alive for the call; unlinkat removes
        // a link itself, never its target.
        let r = unsafe { libc::unlinkat(self.0.as_raw_fd(), c.as_ptr(), 0) };
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT) {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above; O_EXCL|O_NOFOLLOW: a new file, never a link.
        let fd = fd_of(unsafe {
            libc::openat(
                self.0.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            )
        })?;
        let mut out = File::from(fd);
        io::copy(&mut File::open(src)?, &mut out)?;
        // SAFETY: fchmod on a descriptor we own.
        ok(unsafe { libc::fchmod(out.as_raw_fd(), mode) })
    }
}
