//! Read-only layers made from Debian packages (`shoal image build base
//! --packages P,Q -o OUT`, and the built-in language layers,
//! [`crate::lang_layers`]).
//!
//! A layer holds only what installing the packages adds to or changes in
//! the image it goes over, so that the guest's overlay of the two (the
//! layer on `/dev/pmem1` over the image on `/dev/pmem0`) is the image with
//! the packages installed. It is made the way the guest will see it,
//! with the host's overlayfs:
//!
//! 1. the image (erofs) is mounted read-only (loop) as the lower layer of
//!    an overlay whose upper layer is an empty directory;
//! 2. `apt-get update` and `apt-get install --no-install-recommends` run
//!    in a chroot of the overlay, with a fresh `/proc`, a tmpfs `/dev`
//!    holding the usual character devices, a tmpfs `/tmp`, the host's
//!    `/etc/resolv.conf` bound read-only over the image's (and, with
//!    `SHOAL_DEBIAN_MIRROR`, a sources list naming that mirror bound over
//!    the image's), so nothing of that reaches the upper layer;
//! 3. once unmounted, the upper directory is the difference: what
//!    sandboxes never need is removed from it (apt's lists and package
//!    cache, logs, docs, man pages, locales, `*-old` files; removing a name
//!    from the upper directory lets the image's version show through
//!    again), and the overlay's own bookkeeping xattrs
//!    (`trusted.overlay.origin`, `.impure`, ...) are dropped. Whiteouts
//!    (character devices 0:0: a file the packages deleted) and opaque
//!    directories (`trusted.overlay.opaque=y`) are kept: erofs stores both
//!    (erofs-utils 1.5 packs device nodes and xattrs; the guest kernel has
//!    `CONFIG_EROFS_FS_XATTR`), and the guest's overlayfs honours them in
//!    every lower layer but the bottom one, which is where the image is;
//! 4. `mkfs.erofs` packs it the way every Shoal image is packed (4 KiB
//!    blocks, `-E noinline_data` for DAX, `--preserve-mtime` so Python's
//!    `.pyc` files stay valid), padded to 2 MiB and checked.
//!
//! The dpkg database in the layer (`/var/lib/dpkg/status`) lists the base
//! packages and the new ones, so `apt-get install` in a guest over the
//! layer knows what is installed. Needs root (mounts, chroot), erofs and
//! overlayfs in the host kernel, and a Debian mirror.

use crate::image::{self, ImageError, ImageInfo, Stage};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Most packages one layer names.
pub const MAX_PACKAGES: usize = 64;
/// Longest `apt-get update` + `install` may take.
pub const APT_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// Paths (relative to the root) removed from the upper layer before it is
/// packed: the image's own version, if any, shows through again.
pub const DROPPED: &[&str] = &[
    "var/lib/apt/lists",
    "var/cache/apt",
    "var/log",
    "var/tmp",
    "tmp",
    "run",
    "dev",
    "proc",
    "sys",
    "root/.cache",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/linda",
    "usr/sbin/policy-rc.d",
    "etc/resolv.conf",
    "etc/apt/sources.list",
    "var/cache/ldconfig/aux-cache",
];

/// Directories whose `*-old` backups are dropped too.
const OLD_BACKUPS_IN: &[&str] = &["var/lib/dpkg", "var/cache/debconf"];

/// Checks a package list: 1 to [`MAX_PACKAGES`] Debian package names
/// (lower case letters, digits, `+ - .`, starting with a letter or digit;
/// at most 128 characters), so that nothing but names reaches apt-get.
pub fn check_packages(packages: &[String]) -> Result<(), ImageError> {
    if packages.is_empty() || packages.len() > MAX_PACKAGES {
        return Err(ImageError::Packages(format!(
            "{} packages: expected 1 to {MAX_PACKAGES}",
            packages.len()
        )));
    }
    for p in packages {
        let ok = !p.is_empty()
            && p.len() <= 128
            && p.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
        if !ok {
            return Err(ImageError::Packages(format!(
                "{p:?} is not a Debian package name (lower case letters, digits, + - .)"
            )));
        }
    }
    Ok(())
}

/// The mirror to use instead of the one in the image's sources list.
pub fn mirror_override() -> Option<String> {
    std::env::var("SHOAL_DEBIAN_MIRROR")
        .ok()
        .filter(|m| !m.trim().is_empty())
}

/// Builds the layer that installing `packages` into the erofs image
/// `over` makes, as a DAX-ready erofs image at `out` (replaced
/// atomically). `log` gets a line per step. See the module docs.
pub fn build_deb_layer(
    over: &Path,
    packages: &[String],
    out: &Path,
    log: &mut dyn FnMut(&str),
) -> Result<ImageInfo, ImageError> {
    check_packages(packages)?;
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(ImageError::NeedsRoot(
            "building a layer from Debian packages mounts the image and runs apt-get in a chroot",
        ));
    }
    if !over.is_file() {
        return Err(ImageError::Source {
            path: over.into(),
            why: "not an image file".into(),
        });
    }
    // Declared before the mounts: dropped (removed) after they are gone.
    let stage = Stage::for_overlay(out)?;
    let s = stage.dir.as_path();
    let (lower, upper, work, merged) = (
        s.join("lower"),
        s.join("upper"),
        s.join("work"),
        s.join("merged"),
    );
    for d in [&lower, &upper, &work, &merged] {
        std::fs::create_dir(d).map_err(image::io("cannot create", d))?;
    }
    set_mode(&upper, 0o755)?;
    // The image stays mounted until the upper layer is cleaned: that
    // looks names up in it.
    let mut base = Mounts::default();
    base.mount(
        Command::new("mount")
            .args(["-t", "erofs", "-o", "loop,ro"])
            .arg(over)
            .arg(&lower),
        &lower,
    )?;
    {
        let mut m = Mounts::default();
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off",
            lower.display(),
            upper.display(),
            work.display()
        );
        m.mount(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o", &opts])
                .arg(&merged),
            &merged,
        )?;
        prepare_chroot(&mut m, s, &merged)?;
        log(&format!(
            "apt-get install {} (in a chroot over {})",
            packages.join(" "),
            over.display()
        ));
        apt_install(&merged, packages, &s.join("apt.log"))?;
        m.unmount_all()?;
    }
    log("removing apt's lists and caches, docs, logs");
    clean_upper(&upper)?;
    let found = strip_overlay_marks(&upper, &lower)?;
    base.unmount_all()?;
    log(&format!(
        "layer: {} entries ({} whiteouts, {} opaque directories over the image's)",
        found.entries, found.whiteouts, found.opaque
    ));
    let raw = s.join("layer.erofs");
    image::run(
        Command::new("mkfs.erofs")
            .args(["--quiet", "-E", "noinline_data", "--preserve-mtime"])
            .arg(&raw)
            .arg(&upper),
    )?;
    pmem::pad_image_to(&raw, out, pmem::IMAGE_ALIGN)?;
    drop(stage);
    image::verify(out, false)
}

fn set_mode(p: &Path, mode: u32) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(image::io("cannot chmod", p))
}

/// `/proc`, `/dev`, `/tmp`, `resolv.conf` and (with a mirror override)
/// the sources list in the chroot, none of them written to the upper
/// layer.
fn prepare_chroot(m: &mut Mounts, stage: &Path, merged: &Path) -> Result<(), ImageError> {
    let (proc_, dev, tmp) = (merged.join("proc"), merged.join("dev"), merged.join("tmp"));
    for d in [&proc_, &dev, &tmp] {
        if !d.is_dir() || d.is_symlink() {
            return Err(ImageError::Source {
                path: d.clone(),
                why: "the image has no such directory (is it a Shoal root image?)".into(),
            });
        }
    }
    m.mount(
        Command::new("mount")
            .args(["-t", "proc", "proc"])
            .arg(&proc_),
        &proc_,
    )?;
    m.mount(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=0755,size=1m,nosuid", "shoal-dev"])
            .arg(&dev),
        &dev,
    )?;
    for (name, major, minor) in [
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
    ] {
        mknod_chr(&dev.join(name), major, minor)?;
    }
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(name))
            .map_err(image::io("cannot create", &dev.join(name)))?;
    }
    m.mount(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "shoal-tmp"])
            .arg(&tmp),
        &tmp,
    )?;
    // Name resolution for apt: the host's, bound over the image's (an
    // existing, normally empty, file in a Shoal image).
    let resolv = merged.join("etc/resolv.conf");
    if resolv.is_file() && !resolv.is_symlink() {
        bind_file(m, Path::new("/etc/resolv.conf"), &resolv)?;
    }
    if let Some(mirror) = mirror_override() {
        let list = stage.join("sources.list");
        std::fs::write(&list, format!("deb {} bookworm main\n", mirror.trim()))
            .map_err(image::io("cannot write", &list))?;
        let dst = merged.join("etc/apt/sources.list");
        if !dst.is_file() || dst.is_symlink() {
            return Err(ImageError::Source {
                path: dst,
                why: "the image has no /etc/apt/sources.list to point at SHOAL_DEBIAN_MIRROR"
                    .into(),
            });
        }
        bind_file(m, &list, &dst)?;
    }
    // Keep package scripts from starting services (removed before packing).
    let rc = merged.join("usr/sbin/policy-rc.d");
    std::fs::write(&rc, "#!/bin/sh\nexit 101\n").map_err(image::io("cannot write", &rc))?;
    set_mode(&rc, 0o755)
}

fn bind_file(m: &mut Mounts, src: &Path, dst: &Path) -> Result<(), ImageError> {
    m.mount(
        Command::new("mount")
            .args(["--bind", "-o", "ro"])
            .arg(src)
            .arg(dst),
        dst,
    )
}

fn mknod_chr(p: &Path, major: u32, minor: u32) -> Result<(), ImageError> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| ImageError::Source {
        path: p.into(),
        why: "a NUL in the path".into(),
    })?;
    // SAFETY: a NUL-terminated path alive for the call; mknod never
    // follows a link (it fails on any existing name). The directory is a
    // tmpfs we just mounted.
    let r = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    if r < 0 {
        return Err(image::io("cannot create", p)(
            std::io::Error::last_os_error(),
        ));
    }
    // The umask narrowed the mode.
    set_mode(p, 0o666)
}

/// The chroot's apt-get run: every line goes to `log_path`; on failure its
/// last lines are the error.
fn apt_install(merged: &Path, packages: &[String], log_path: &Path) -> Result<(), ImageError> {
    const SCRIPT: &str = "apt-get update -q\n\
        apt-get install -y -q --no-install-recommends \"$@\"\n\
        apt-get clean\n";
    let log = std::fs::File::create(log_path).map_err(image::io("cannot create", log_path))?;
    let log2 = log
        .try_clone()
        .map_err(image::io("cannot open", log_path))?;
    let status = Command::new("timeout")
        .args([
            "--kill-after=10",
            &APT_DEADLINE.as_secs().to_string(),
            "chroot",
        ])
        .arg(merged)
        .args(["/bin/sh", "-ec", SCRIPT, "sh"])
        .args(packages)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("LC_ALL", "C.UTF-8")
        .env("HOME", "/root")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .status()
        .map_err(|e| ImageError::Tool {
            tool: "chroot".into(),
            detail: format!("cannot run it: {e}"),
        })?;
    if status.success() {
        return Ok(());
    }
    let text = std::fs::read_to_string(log_path).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(8).collect();
    let why = if status.code() == Some(124) {
        format!("did not finish within {} s", APT_DEADLINE.as_secs())
    } else {
        status.to_string()
    };
    Err(ImageError::Tool {
        tool: "apt-get (in the layer's chroot)".into(),
        detail: format!(
            "{why}: {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ),
    })
}

/// Removes [`DROPPED`] and `*-old` backups from the upper directory.
fn clean_upper(upper: &Path) -> Result<(), ImageError> {
    for rel in DROPPED {
        remove_any(&upper.join(rel))?;
    }
    for dir in OLD_BACKUPS_IN {
        let d = upper.join(dir);
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_name().as_bytes().ends_with(b"-old") {
                remove_any(&e.path())?;
            }
        }
    }
    Ok(())
}

/// Removes a file, link, whiteout or directory tree, never following a
/// link; a missing one is fine.
fn remove_any(p: &Path) -> Result<(), ImageError> {
    let r = match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
    };
    r.map_err(image::io("cannot remove", p))
}

/// What [`strip_overlay_marks`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UpperStats {
    /// Files, directories, links and nodes below the root.
    pub entries: u64,
    /// Whiteouts (character devices 0:0) kept: each hides a name of the
    /// image.
    pub whiteouts: u64,
    /// Opaque directories kept: each hides a directory of the image.
    pub opaque: u64,
}

/// Whether an xattr the host's overlayfs set on an upper-layer entry stays
/// in the layer: only the opaque mark (`y`); the rest (`origin`,
/// `impure`, `nlink`, `upper`, `uuid`, ...) describes the host's lower
/// layer and means nothing, or something wrong, in the guest.
pub fn keep_xattr(name: &[u8], value: &[u8]) -> bool {
    match name.strip_prefix(b"trusted.overlay.") {
        None => true,
        Some(b"opaque") => value == b"y",
        Some(_) => false,
    }
}

/// What `rel` is in the tree at `lower` as overlayfs sees it: every
/// component before the last must be a real directory (overlayfs never
/// follows a lower layer's link to merge a directory).
fn lower_kind(lower: &Path, rel: &Path) -> Option<std::fs::FileType> {
    let mut cur = lower.to_path_buf();
    let mut comps = rel.components().peekable();
    while let Some(c) = comps.next() {
        cur.push(c);
        let t = std::fs::symlink_metadata(&cur).ok()?.file_type();
        if comps.peek().is_none() {
            return Some(t);
        }
        if !t.is_dir() {
            return None;
        }
    }
    None
}

/// Walks the upper directory `root` (never following links) against the
/// image it was made over (`lower`, mounted): drops the overlay xattrs
/// [`keep_xattr`] refuses, and the marks that hide nothing of the image
/// (whiteouts of names it lacks; the opaque mark the host's overlayfs
/// puts on every directory created where the image has none), so that
/// layers made over the same image stack without hiding each other's
/// files. Counts what is kept.
pub fn strip_overlay_marks(root: &Path, lower: &Path) -> Result<UpperStats, ImageError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut stats = UpperStats::default();
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).map_err(image::io("cannot inspect", &p))?;
        let rel = p.strip_prefix(root).unwrap_or(Path::new(""));
        if p != root {
            stats.entries += 1;
        }
        if m.file_type().is_char_device() && m.rdev() == 0 {
            if lower_kind(lower, rel).is_some() {
                stats.whiteouts += 1;
            } else {
                std::fs::remove_file(&p).map_err(image::io("cannot remove", &p))?;
                stats.entries -= 1;
                continue;
            }
        }
        if m.is_dir() {
            let opaque = xattrs::get(&p, b"trusted.overlay.opaque")
                .map_err(image::io("cannot read the xattrs of", &p))?
                .is_some_and(|v| v == b"y");
            if opaque {
                if p != root && lower_kind(lower, rel).is_some_and(|t| t.is_dir()) {
                    stats.opaque += 1;
                } else {
                    xattrs::remove(&p, b"trusted.overlay.opaque")
                        .map_err(image::io("cannot remove an xattr of", &p))?;
                }
            }
            for e in std::fs::read_dir(&p).map_err(image::io("cannot list", &p))? {
                todo.push(e.map_err(image::io("cannot list", &p))?.path());
            }
        }
        for name in xattrs::list(&p).map_err(image::io("cannot list the xattrs of", &p))? {
            if !name.starts_with(b"trusted.overlay.") {
                continue;
            }
            let value = xattrs::get(&p, &name)
                .map_err(image::io("cannot read the xattrs of", &p))?
                .unwrap_or_default();
            if !keep_xattr(&name, &value) {
                xattrs::remove(&p, &name).map_err(image::io("cannot remove an xattr of", &p))?;
            }
        }
    }
    Ok(stats)
}

/// Mounts made for a build, unmounted (last first) when dropped.
#[derive(Default)]
pub(crate) struct Mounts(Vec<PathBuf>);

impl Mounts {
    /// Runs a `mount` command that mounts on `at`.
    pub(crate) fn mount(&mut self, cmd: &mut Command, at: &Path) -> Result<(), ImageError> {
        image::run(cmd)?;
        self.0.push(at.to_path_buf());
        Ok(())
    }

    /// Unmounts everything, last first; the first failure is returned
    /// (after a lazy detach, so nothing stays reachable below the stage).
    pub(crate) fn unmount_all(&mut self) -> Result<(), ImageError> {
        let mut first = None;
        while let Some(at) = self.0.pop() {
            if let Err(e) = umount(&at, 0) {
                let _ = umount(&at, libc::MNT_DETACH);
                first.get_or_insert(image::io("cannot unmount", &at)(e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        while let Some(at) = self.0.pop() {
            if umount(&at, 0).is_err() {
                let _ = umount(&at, libc::MNT_DETACH);
            }
        }
    }
}

fn umount(at: &Path, flags: libc::c_int) -> std::io::Result<()> {
    let c = CString::new(at.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path alive for the call; no other memory.
    let r = unsafe { libc::umount2(c.as_ptr(), flags | libc::UMOUNT_NOFOLLOW) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Extended attributes of a path itself (never a link's target).
mod xattrs {
    use std::ffi::CString;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn cpath(p: &Path) -> io::Result<CString> {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn cname(n: &[u8]) -> io::Result<CString> {
        CString::new(n).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    /// The names, each without its NUL.
    pub(super) fn list(p: &Path) -> io::Result<Vec<Vec<u8>>> {
        let c = cpath(p)?;
        let mut buf = vec![0u8; 4096];
        loop {
            // SAFETY: the buffer is ours and its length is passed; the
            // path is NUL-terminated and alive for the call.
            let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                buf.truncate(n.unsigned_abs());
                return Ok(buf
                    .split(|&b| b == 0)
                    .filter(|s| !s.is_empty())
                    .map(<[u8]>::to_vec)
                    .collect());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ERANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
                Some(libc::ENOTSUP) => return Ok(vec![]),
                _ => return Err(e),
            }
        }
    }

    /// The value, `None` when the path has no such attribute.
    pub(super) fn get(p: &Path, name: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let (c, n) = (cpath(p)?, cname(name)?);
        let mut buf = vec![0u8; 256];
        loop {
            // SAFETY: as in `list`; the name is NUL-terminated too.
            let r = unsafe {
                libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            };
            if r >= 0 {
                buf.truncate(r.unsigned_abs());
                return Ok(Some(buf));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ERANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 8, 0),
                Some(libc::ENODATA) | Some(libc::ENOTSUP) => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    pub(super) fn remove(p: &Path, name: &[u8]) -> io::Result<()> {
        let (c, n) = (cpath(p)?, cname(name)?);
        // SAFETY: two NUL-terminated strings alive for the call.
        if unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "deb_layer_tests.rs"]
mod tests;
