//! File operations. Each is synchronous (local disk or tmpfs) and uses as
//! few system calls as it can: directory listings come from getdents64 with
//! a 64 KiB buffer and the types it reports, without a stat per entry.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd};

use super::os::{self, cstring, Errno, SysResult};
use agent_proto::{DirEntry, FileStat, FileType};

/// Deepest directory tree `remove --recursive` descends.
const MAX_DEPTH: usize = 256;
/// getdents64 buffer.
const DENTS_BUF: usize = 64 * 1024;

/// Checks a path from the wire: non-empty, no NUL, at most PATH_MAX.
pub fn path(bytes: &[u8]) -> SysResult<std::ffi::CString> {
    if bytes.is_empty() {
        return Err(Errno(libc::ENOENT));
    }
    if bytes.len() >= 4096 {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    cstring(bytes)
}

/// Converts st_mode to a file type.
fn file_type(mode: libc::mode_t) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFREG => FileType::File,
        libc::S_IFDIR => FileType::Dir,
        libc::S_IFLNK => FileType::Symlink,
        _ => FileType::Other,
    }
}

/// stat (or lstat).
pub fn stat(p: &[u8], nofollow: bool) -> SysResult<FileStat> {
    let st = os::stat(&path(p)?, nofollow)?;
    Ok(FileStat {
        file_type: file_type(st.st_mode),
        mode: st.st_mode & 0o7777,
        size: u64::try_from(st.st_size).unwrap_or(0),
        uid: st.st_uid,
        gid: st.st_gid,
        mtime_ns: st
            .st_mtime
            .saturating_mul(1_000_000_000)
            .saturating_add(st.st_mtime_nsec),
        nlink: st.st_nlink,
        ino: st.st_ino,
    })
}

/// Opens a directory.
fn open_dir(p: &CStr) -> SysResult<OwnedFd> {
    os::open(p, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// Calls `f(name, d_type, ino)` for each entry of `dir` except `.`/`..`.
fn for_each_entry(
    dir: &OwnedFd,
    buf: &mut [u8],
    mut f: impl FnMut(&[u8], u8, u64) -> SysResult<()>,
) -> SysResult<()> {
    loop {
        let n = os::getdents(os::fd_ref(dir), buf)?;
        if n == 0 {
            return Ok(());
        }
        let mut rest = buf.get(..n).unwrap_or_default();
        // struct linux_dirent64 { u64 ino; i64 off; u16 reclen; u8 type; char name[] }
        while rest.len() >= 19 {
            let ino = u64::from_ne_bytes(
                rest.get(0..8)
                    .and_then(|s| s.try_into().ok())
                    .unwrap_or_default(),
            );
            let reclen = usize::from(u16::from_ne_bytes(
                rest.get(16..18)
                    .and_then(|s| s.try_into().ok())
                    .unwrap_or_default(),
            ));
            let d_type = rest.get(18).copied().unwrap_or(0);
            if reclen < 19 || reclen > rest.len() {
                return Err(Errno(libc::EIO));
            }
            let name_field = rest.get(19..reclen).unwrap_or_default();
            let name_len = name_field
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(name_field.len());
            let name = name_field.get(..name_len).unwrap_or_default();
            if name != b"." && name != b".." {
                f(name, d_type, ino)?;
            }
            rest = rest.get(reclen..).unwrap_or_default();
        }
    }
}

fn dtype(t: u8) -> FileType {
    match t {
        libc::DT_REG => FileType::File,
        libc::DT_DIR => FileType::Dir,
        libc::DT_LNK => FileType::Symlink,
        _ => FileType::Other,
    }
}

/// Lists a directory; `emit` is called with batches of entries whose
/// encoded size stays well under a frame.
pub fn list_dir(p: &[u8], mut emit: impl FnMut(Vec<DirEntry>)) -> SysResult<()> {
    let dir = open_dir(&path(p)?)?;
    let mut buf = vec![0u8; DENTS_BUF];
    let mut batch = Vec::new();
    let mut batch_bytes = 0usize;
    for_each_entry(&dir, &mut buf, |name, t, ino| {
        batch_bytes += name.len() + 17;
        batch.push(DirEntry {
            name: name.to_vec(),
            file_type: dtype(t),
            ino,
        });
        if batch_bytes > 512 * 1024 {
            emit(std::mem::take(&mut batch));
            batch_bytes = 0;
        }
        Ok(())
    })?;
    emit(batch);
    Ok(())
}

/// mkdir, or `mkdir -p` with `parents`.
pub fn mkdir(p: &[u8], mode: u32, parents: bool) -> SysResult<()> {
    let c = path(p)?;
    match os::mkdir(&c, mode) {
        Ok(()) => Ok(()),
        Err(Errno(libc::EEXIST)) if parents => match os::stat(&c, false) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => Ok(()),
            _ => Err(Errno(libc::EEXIST)),
        },
        Err(Errno(libc::ENOENT)) if parents => {
            make_parents(p)?;
            os::mkdir(&c, mode).or_else(|e| if e.0 == libc::EEXIST { Ok(()) } else { Err(e) })
        }
        Err(e) => Err(e),
    }
}

/// Creates every missing directory above `p` (mode 0755).
pub fn make_parents(p: &[u8]) -> SysResult<()> {
    let trimmed = p.strip_suffix(b"/").unwrap_or(p);
    let Some(slash) = trimmed.iter().rposition(|&b| b == b'/') else {
        return Ok(()); // relative single component: parent is the cwd
    };
    let parent = trimmed.get(..slash).unwrap_or_default();
    if parent.is_empty() {
        return Ok(()); // "/x"
    }
    let c = path(parent)?;
    match os::mkdir(&c, 0o755) {
        Ok(()) | Err(Errno(libc::EEXIST)) => Ok(()),
        Err(Errno(libc::ENOENT)) => {
            make_parents(parent)?;
            match os::mkdir(&c, 0o755) {
                Ok(()) | Err(Errno(libc::EEXIST)) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Removes a file, symlink or empty directory, or with `recursive` a whole
/// tree (symlinks are never followed).
pub fn remove(p: &[u8], recursive: bool) -> SysResult<()> {
    let c = path(p)?;
    match os::unlinkat(libc::AT_FDCWD, &c, 0) {
        Ok(()) => Ok(()),
        Err(Errno(libc::EISDIR | libc::EPERM)) => {
            if recursive {
                let dir = open_dir_nofollow(libc::AT_FDCWD, &c)?;
                let mut buf = vec![0u8; DENTS_BUF];
                empty_dir(&dir, &mut buf, 0)?;
            }
            os::unlinkat(libc::AT_FDCWD, &c, libc::AT_REMOVEDIR)
        }
        Err(e) => Err(e),
    }
}

fn open_dir_nofollow(at: i32, name: &CStr) -> SysResult<OwnedFd> {
    // SAFETY: name is NUL-terminated; `at` is an fd or AT_FDCWD.
    let fd = unsafe {
        libc::openat(
            at,
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Removes everything inside `dir`.
fn empty_dir(dir: &OwnedFd, buf: &mut [u8], depth: usize) -> SysResult<()> {
    if depth > MAX_DEPTH {
        return Err(Errno(libc::ELOOP));
    }
    // Collect names first: unlinking while iterating can skip entries.
    let mut names: Vec<(Vec<u8>, u8)> = Vec::new();
    for_each_entry(dir, buf, |name, t, _| {
        names.push((name.to_vec(), t));
        Ok(())
    })?;
    for (name, t) in names {
        let c = cstring(&name)?;
        let as_dir = match t {
            libc::DT_DIR => true,
            libc::DT_UNKNOWN => match os::unlinkat(dir.as_raw_fd(), &c, 0) {
                Ok(()) => continue,
                Err(Errno(libc::EISDIR | libc::EPERM)) => true,
                Err(e) => return Err(e),
            },
            _ => false,
        };
        if as_dir {
            let sub = open_dir_nofollow(dir.as_raw_fd(), &c)?;
            empty_dir(&sub, buf, depth + 1)?;
            drop(sub);
            os::unlinkat(dir.as_raw_fd(), &c, libc::AT_REMOVEDIR)?;
        } else {
            os::unlinkat(dir.as_raw_fd(), &c, 0)?;
        }
    }
    Ok(())
}

/// rename(2).
pub fn rename(from: &[u8], to: &[u8]) -> SysResult<()> {
    os::rename(&path(from)?, &path(to)?)
}

/// chmod(2).
pub fn chmod(p: &[u8], mode: u32) -> SysResult<()> {
    os::chmod(&path(p)?, mode & 0o7777)
}

/// Opens a file for an upload (create, truncate or append, set the mode).
pub fn open_write(p: &[u8], mode: u32, append: bool, parents: bool) -> SysResult<OwnedFd> {
    let c = path(p)?;
    let flags = libc::O_WRONLY
        | libc::O_CREAT
        | if append {
            libc::O_APPEND
        } else {
            libc::O_TRUNC
        };
    let mode = mode & 0o7777;
    let fd = match os::open(&c, flags, mode) {
        Err(Errno(libc::ENOENT)) if parents => {
            make_parents(p)?;
            os::open(&c, flags, mode)?
        }
        r => r?,
    };
    // The mode given to open is masked by the umask and ignored for an
    // existing file: set it explicitly.
    os::fchmod(os::fd_ref(&fd), mode)?;
    Ok(fd)
}

/// Opens a file for a download; returns the fd and the bytes to send if the
/// file is regular (None: read to EOF).
pub fn open_read(p: &[u8], offset: u64, limit: Option<u64>) -> SysResult<(OwnedFd, Option<u64>)> {
    let fd = os::open(&path(p)?, libc::O_RDONLY, 0)?;
    let st = os::fstat(os::fd_ref(&fd))?;
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        return Err(Errno(libc::EISDIR));
    }
    let mut want = limit;
    if st.st_mode & libc::S_IFMT == libc::S_IFREG {
        let avail = u64::try_from(st.st_size)
            .unwrap_or(0)
            .saturating_sub(offset);
        want = Some(want.map_or(avail, |l| l.min(avail)));
    }
    if offset > 0 {
        os::seek(os::fd_ref(&fd), offset)?;
    }
    Ok((fd, want))
}
