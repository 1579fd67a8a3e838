//! Safe extraction of an OCI layer tar into an empty directory.
//!
//! The tar comes from a registry and is hostile until proved otherwise:
//! - entry and hard-link paths with `..` or that are absolute are refused;
//! - no entry is ever written through a symbolic link (a parent that is
//!   one is refused), so an earlier `a -> /etc` cannot make `a/passwd`
//!   land on the host;
//! - a symbolic link whose relative target climbs above the layer's root
//!   is refused (absolute targets are kept: the guest resolves them in its
//!   own root, and nothing here follows them);
//! - device nodes are refused;
//! - `trusted.*` xattrs in the tar are dropped (only this code writes
//!   overlayfs metadata).
//!
//! OCI whiteouts become overlayfs ones: `.wh.NAME` → a 0:0 character
//! device `NAME`, `.wh..wh..opq` → `trusted.overlay.opaque=y` on its
//! directory. Modes, owners, mtimes and other xattrs are kept.

use std::ffi::CString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// What the tar holds that the store refuses, or why reading it failed.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    /// An entry path with `..`.
    #[error("tar entry {0:?}: a path with `..` is refused")]
    DotDot(String),
    /// An absolute entry path.
    #[error("tar entry {0:?}: an absolute path is refused")]
    Absolute(String),
    /// A path that goes through a symbolic link of the layer.
    #[error("tar entry {0:?}: its path goes through a symbolic link; refused")]
    ThroughSymlink(String),
    /// A symbolic link whose target leaves the layer.
    #[error("tar entry {path:?}: symbolic link to {target:?} leaves the layer; refused")]
    SymlinkEscapes {
        /// The entry.
        path: String,
        /// Its target.
        target: String,
    },
    /// A hard link whose target is outside, missing or a directory.
    #[error("tar entry {path:?}: hard link to {target:?}: {why}; refused")]
    BadHardlink {
        /// The entry.
        path: String,
        /// Its target.
        target: String,
        /// Why.
        why: &'static str,
    },
    /// A device node.
    #[error("tar entry {0:?}: device nodes are refused")]
    Device(String),
    /// An entry type this store does not know.
    #[error("tar entry {path:?}: unsupported entry type {kind}")]
    Unsupported {
        /// The entry.
        path: String,
        /// Its type byte.
        kind: u8,
    },
    /// Reading the tar, or writing the tree, failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        source: io::Error,
    },
}

fn ioe(what: impl Into<String>) -> impl FnOnce(io::Error) -> ExtractError {
    let what = what.into();
    move |source| ExtractError::Io { what, source }
}

/// The entry path as relative normal components; refuses `..` and
/// absolute paths. `.` alone gives an empty path (the root).
fn clean(raw: &Path) -> Result<PathBuf, ExtractError> {
    let shown = raw.to_string_lossy().into_owned();
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(ExtractError::DotDot(shown)),
            Component::RootDir | Component::Prefix(_) => return Err(ExtractError::Absolute(shown)),
        }
    }
    Ok(out)
}

/// Makes `rel`'s parent directories under `root` (mode 0755 when new),
/// refusing any that is a symbolic link or not a directory.
fn parents(root: &Path, rel: &Path) -> Result<(), ExtractError> {
    let mut cur = root.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(());
    };
    for c in parent.components() {
        cur.push(c);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(ExtractError::ThroughSymlink(rel.display().to_string()))
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                fs::remove_file(&cur).map_err(ioe(format!("removing {}", cur.display())))?;
                mkdir(&cur)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => mkdir(&cur)?,
            Err(e) => return Err(ioe(format!("inspecting {}", cur.display()))(e)),
        }
    }
    Ok(())
}

fn mkdir(p: &Path) -> Result<(), ExtractError> {
    fs::DirBuilder::new()
        .mode(0o755)
        .create(p)
        .map_err(ioe(format!("creating {}", p.display())))
}

/// Removes what is at `p` unless it is a directory and `keep_dir`.
fn clear(p: &Path, keep_dir: bool) -> Result<(), ExtractError> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() && keep_dir => Ok(()),
        Ok(m) if m.is_dir() => {
            fs::remove_dir_all(p).map_err(ioe(format!("removing {}", p.display())))
        }
        Ok(_) => fs::remove_file(p).map_err(ioe(format!("removing {}", p.display()))),
        Err(_) => Ok(()),
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("tar paths have no NUL")
}

fn mknod(p: &Path, mode: libc::mode_t, dev: libc::dev_t) -> Result<(), ExtractError> {
    let c = cpath(p);
    // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
    if unsafe { libc::mknod(c.as_ptr(), mode, dev) } != 0 {
        return Err(ioe(format!("mknod {}", p.display()))(
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Owner and mtime of `p` itself (never a link's target).
fn own_and_time(p: &Path, uid: u64, gid: u64, mtime: u64) -> Result<(), ExtractError> {
    let c = cpath(p);
    let id = |v: u64| {
        libc::uid_t::try_from(v).map_err(|_| ExtractError::Io {
            what: format!("{}: owner", p.display()),
            source: io::Error::new(io::ErrorKind::InvalidData, format!("id {v} out of range")),
        })
    };
    let (uid, gid) = (id(uid)?, id(gid)?);
    // SAFETY: `c` is a valid NUL-terminated path; lchown does not follow.
    if unsafe { libc::lchown(c.as_ptr(), uid, gid) } != 0 {
        return Err(ioe(format!("chown {}", p.display()))(
            io::Error::last_os_error(),
        ));
    }
    let t = libc::timespec {
        tv_sec: libc::time_t::try_from(mtime).unwrap_or(libc::time_t::MAX),
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: valid path and a two-element timespec array; no follow.
    if unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } != 0
    {
        return Err(ioe(format!("utimensat {}", p.display()))(
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Whether a relative symlink target, taken from the link's directory
/// `dir` (relative to the root), climbs above the root.
fn escapes(dir: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth = dir.components().count();
    for c in target.components() {
        match c {
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return true,
            },
            Component::Normal(_) => depth += 1,
            _ => {}
        }
    }
    false
}

struct DirMeta {
    path: PathBuf,
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: u64,
}

/// Extracts the tar read from `tar` into `root` (created; must not exist).
pub fn extract(tar: impl Read, root: &Path) -> Result<(), ExtractError> {
    fs::DirBuilder::new()
        .mode(0o755)
        .create(root)
        .map_err(ioe(format!("creating {}", root.display())))?;
    let mut archive = tar::Archive::new(tar);
    let mut dirs: Vec<DirMeta> = Vec::new();
    let entries = archive.entries().map_err(ioe("reading the tar"))?;
    for entry in entries {
        let mut entry = entry.map_err(ioe("reading the tar"))?;
        let raw = entry
            .path()
            .map_err(ioe("reading a tar entry's path"))?
            .into_owned();
        let shown = raw.display().to_string();
        let rel = clean(&raw)?;
        let h = entry.header();
        let kind = h.entry_type();
        let mode = h.mode().map_err(ioe(format!("{shown}: mode")))? & 0o7777;
        let uid = h.uid().map_err(ioe(format!("{shown}: uid")))?;
        let gid = h.gid().map_err(ioe(format!("{shown}: gid")))?;
        let mtime = h.mtime().map_err(ioe(format!("{shown}: mtime")))?;
        if rel.as_os_str().is_empty() {
            if kind.is_dir() {
                dirs.push(DirMeta {
                    path: root.to_path_buf(),
                    mode,
                    uid,
                    gid,
                    mtime,
                });
            }
            continue;
        }
        parents(root, &rel)?;
        let dest = root.join(&rel);
        let name = rel.file_name().expect("a normal last component").as_bytes();
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            let dir = dest.parent().expect("under root");
            if hidden == b".wh..opq" {
                xattr::set(dir, "trusted.overlay.opaque", b"y")
                    .map_err(ioe(format!("{shown}: marking {} opaque", dir.display())))?;
            } else {
                let target = dir.join(std::ffi::OsStr::from_bytes(hidden));
                clear(&target, false)?;
                mknod(&target, libc::S_IFCHR, 0)?;
            }
            continue;
        }
        let xattrs = pax_xattrs(&mut entry, &shown)?;
        if kind.is_dir() {
            clear(&dest, true)?;
            if !dest.is_dir() {
                mkdir(&dest)?;
            }
            dirs.push(DirMeta {
                path: dest.clone(),
                mode,
                uid,
                gid,
                mtime,
            });
        } else if kind.is_file() {
            clear(&dest, false)?;
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&dest)
                .map_err(ioe(format!("creating {}", dest.display())))?;
            io::copy(&mut entry, &mut f).map_err(ioe(format!("{shown}: writing")))?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(ioe(format!("{shown}: link name")))?
                .unwrap_or_default()
                .into_owned();
            if escapes(rel.parent().unwrap_or(Path::new("")), &target) {
                return Err(ExtractError::SymlinkEscapes {
                    path: shown,
                    target: target.display().to_string(),
                });
            }
            clear(&dest, false)?;
            std::os::unix::fs::symlink(&target, &dest)
                .map_err(ioe(format!("creating {}", dest.display())))?;
        } else if kind.is_hard_link() {
            let target = entry
                .link_name()
                .map_err(ioe(format!("{shown}: link name")))?
                .unwrap_or_default()
                .into_owned();
            let bad = |why| ExtractError::BadHardlink {
                path: shown.clone(),
                target: target.display().to_string(),
                why,
            };
            let trel = match clean(&target) {
                Ok(t) if !t.as_os_str().is_empty() => t,
                _ => return Err(bad("the target is outside the layer")),
            };
            if parents_are_dirs(root, &trel).is_err() {
                return Err(bad("the target's path goes through a symbolic link"));
            }
            let src = root.join(&trel);
            match fs::symlink_metadata(&src) {
                Ok(m) if m.is_dir() => return Err(bad("the target is a directory")),
                Ok(_) => {}
                Err(_) => return Err(bad("the target is not earlier in the layer")),
            }
            clear(&dest, false)?;
            fs::hard_link(&src, &dest).map_err(ioe(format!("linking {}", dest.display())))?;
            continue;
        } else if kind == tar::EntryType::Fifo {
            clear(&dest, false)?;
            mknod(&dest, libc::S_IFIFO | 0o600, 0)?;
        } else if kind == tar::EntryType::Char || kind == tar::EntryType::Block {
            return Err(ExtractError::Device(shown));
        } else if matches!(
            kind,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader | tar::EntryType::GNULongName
        ) {
            continue;
        } else {
            return Err(ExtractError::Unsupported {
                path: shown,
                kind: kind.as_byte(),
            });
        }
        for (k, v) in xattrs {
            xattr::set(&dest, &k, &v).map_err(ioe(format!("{shown}: xattr {k}")))?;
        }
        own_and_time(&dest, uid, gid, mtime)?;
        if !kind.is_symlink() && !kind.is_dir() {
            // After chown, which clears set-id bits.
            fs::set_permissions(&dest, fs::Permissions::from_mode(mode))
                .map_err(ioe(format!("chmod {}", dest.display())))?;
        }
    }
    // Directories last, deepest first: their modes may forbid writes.
    for d in dirs.iter().rev() {
        own_and_time(&d.path, d.uid, d.gid, d.mtime)?;
        fs::set_permissions(&d.path, fs::Permissions::from_mode(d.mode))
            .map_err(ioe(format!("chmod {}", d.path.display())))?;
    }
    Ok(())
}

/// `rel`'s parents exist under `root` and none is a symbolic link.
fn parents_are_dirs(root: &Path, rel: &Path) -> Result<(), ()> {
    let mut cur = root.to_path_buf();
    for c in rel.parent().into_iter().flat_map(|p| p.components()) {
        cur.push(c);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => {}
            _ => return Err(()),
        }
    }
    Ok(())
}

/// The entry's `SCHILY.xattr.*` records, less `trusted.*`.
fn pax_xattrs<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    shown: &str,
) -> Result<Vec<(String, Vec<u8>)>, ExtractError> {
    let mut out = Vec::new();
    let Some(exts) = entry
        .pax_extensions()
        .map_err(ioe(format!("{shown}: pax headers")))?
    else {
        return Ok(out);
    };
    for ext in exts {
        let ext = ext.map_err(ioe(format!("{shown}: pax headers")))?;
        let Ok(key) = ext.key() else { continue };
        if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
            if !name.starts_with("trusted.") {
                out.push((name.to_string(), ext.value_bytes().to_vec()));
            }
        }
    }
    Ok(out)
}
