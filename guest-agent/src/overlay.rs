//! A writable overlay root over a read-only (pmem, DAX) root file system.
//!
//! With `shoal.overlay=1` on the kernel command line (the host adds it when
//! the root is `/dev/pmem0` mounted read-only with DAX), PID 1 builds, right
//! after its usual mounts and before anything else runs:
//!
//! ```text
//! /run/.shoal/rw      tmpfs (size=shoal.upper_size, default: the kernel's
//!                     50% of RAM), or the ext4 disk shoal.upper=/dev/vdX
//!        /upper /work the overlay's upper and work directories
//! /run/.shoal/lN      /dev/pmemN (N = 1, 2, ...), erofs, ro, dax: extra
//!                     lower layers, when present (pmemN over pmemN-1 over /)
//! /run/.shoal/root    overlay: lowerdir=[lN:...:l1:]/, upper, work
//! ```
//!
//! then moves `/dev`, `/proc`, `/sys` (with its cgroup2 mount) and `/tmp`
//! into the new root, mounts a fresh `/run` there (with the image's own
//! root bound read-only at `/run/shoal/image`), and makes it the root of
//! PID 1 itself (`pivot_root(".", ".")`, then the old root is detached), so
//! every command the agent starts and every file operation it serves sees
//! the overlay: writes land in the upper layer, never in the image. The old
//! root's mounts (the staging `/run`, the upper file system, the extra
//! lowers) stay alive inside the overlay, which holds private references to
//! them, but are no longer reachable by path.
//!
//! With `shoal.container=1` as well (a container sandbox: the root on
//! pmem0 is only Shoal's agent layer, the image is pmem1..N), the lower
//! layers are only the extra ones (`lN:...:l1`, the image's layers, lowest
//! first): the agent's own root is not part of the new root at all, and is
//! not bound at `/run/shoal/image` either, so after the pivot nothing of it
//! is reachable by path (the agent's code stays mapped). The mount points
//! the agent moves in (`/dev`, `/proc`, `/sys`, `/tmp`, `/run`) are made in
//! the upper layer where the image has none.
//!
//! Every step is a direct syscall (about 20 in all, no fork). Any failure is
//! reported on the console and leaves the read-only root as it was, so a
//! broken option never makes the guest unusable. The scratch-disk upper
//! needs a pre-formatted ext4 file system (there is no mkfs in the guest);
//! if it cannot be mounted, the tmpfs upper is used instead.

use std::ffi::{CStr, CString};

use crate::sys::{errno, report};

/// Command-line words that configure the overlay.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Options {
    /// `shoal.overlay=1`: build the overlay.
    pub enabled: bool,
    /// `shoal.upper_size=SIZE`: tmpfs `size=` (digits with an optional
    /// k/m/g/% suffix).
    pub upper_size: Option<String>,
    /// `shoal.upper=/dev/NAME`: a pre-formatted ext4 disk for the upper
    /// layer instead of tmpfs.
    pub upper_dev: Option<String>,
    /// `shoal.container=1`: the root is only the agent's layer; the new
    /// root is the extra layers alone.
    pub container: bool,
}

/// A failed step.
#[derive(Debug, thiserror::Error)]
#[error("overlay root: {step}: {}", std::io::Error::from_raw_os_error(*errno))]
pub struct OverlayError {
    /// What failed.
    pub step: String,
    /// The errno.
    pub errno: i32,
}

fn fail(step: impl Into<String>) -> OverlayError {
    OverlayError {
        step: step.into(),
        errno: errno(),
    }
}

/// Reads the overlay options from the kernel command line. Malformed
/// values are reported and ignored.
pub fn parse(cmdline: &[u8]) -> Options {
    let mut o = Options::default();
    for word in cmdline.split(|c| c.is_ascii_whitespace()) {
        let Some((key, value)) = split_kv(word) else {
            continue;
        };
        match key {
            b"shoal.overlay" => o.enabled = value == b"1",
            b"shoal.container" => o.container = value == b"1",
            b"shoal.upper_size" => match std::str::from_utf8(value) {
                Ok(v) if valid_size(v) => o.upper_size = Some(v.to_string()),
                _ => report_bad("shoal.upper_size", value),
            },
            b"shoal.upper" => match std::str::from_utf8(value) {
                Ok(v) if valid_dev(v) => o.upper_dev = Some(v.to_string()),
                _ => report_bad("shoal.upper", value),
            },
            _ => {}
        }
    }
    o
}

fn split_kv(word: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = word.iter().position(|&c| c == b'=')?;
    Some((word.get(..i)?, word.get(i + 1..)?))
}

fn report_bad(key: &str, value: &[u8]) {
    crate::sys::write_all(
        2,
        format!(
            "shoal-agent: ignoring {key}={}: malformed\n",
            String::from_utf8_lossy(value)
        )
        .as_bytes(),
    );
}

/// `123`, `64m`, `1G`, `25%`: nothing that could add a mount option.
fn valid_size(v: &str) -> bool {
    let digits = v.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G', '%']);
    !digits.is_empty() && v.len() - digits.len() <= 1 && digits.bytes().all(|b| b.is_ascii_digit())
}

/// `/dev/` followed by a plain device name.
fn valid_dev(v: &str) -> bool {
    v.strip_prefix("/dev/").is_some_and(|n| {
        !n.is_empty()
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

const STAGE: &CStr = c"/run/.shoal";
const RW: &CStr = c"/run/.shoal/rw";
const UPPER: &CStr = c"/run/.shoal/rw/upper";
const WORK: &CStr = c"/run/.shoal/rw/work";
const ROOT: &CStr = c"/run/.shoal/root";
/// Where the image's own root appears in the new root.
const IMAGE_VIEW: &CStr = c"/run/.shoal/root/run/shoal/image";
/// Mounts moved into the new root as they are (`/run` is not: the staging
/// area lives in it; the new root gets a fresh one). `/tmp` (the last) only
/// with a scratch-disk upper: with a tmpfs upper, /tmp is a directory of
/// the overlay, so it shares the upper layer's cap.
const MOVED: [(&CStr, &CStr); 4] = [
    (c"/dev", c"/run/.shoal/root/dev"),
    (c"/proc", c"/run/.shoal/root/proc"),
    (c"/sys", c"/run/.shoal/root/sys"),
    (c"/tmp", c"/run/.shoal/root/tmp"),
];
/// Size of the new root's fresh `/run`.
const RUN_SIZE: &CStr = c"mode=755,size=8m";
/// Extra pmem devices probed as lower layers (pmem1..).
const MAX_EXTRA_LOWERS: usize = 8;

fn mkdir(path: &CStr, mode: libc::mode_t, exist_ok: bool) -> Result<(), OverlayError> {
    // SAFETY: `path` is a NUL-terminated string.
    if unsafe { libc::mkdir(path.as_ptr(), mode) } == 0 || (exist_ok && errno() == libc::EEXIST) {
        return Ok(());
    }
    Err(fail(format!("mkdir {}", path.to_string_lossy())))
}

fn mount(
    source: &CStr,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> Result<(), OverlayError> {
    // SAFETY: every pointer is NULL or a NUL-terminated string that
    // outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.map_or(std::ptr::null(), CStr::as_ptr),
            flags,
            data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(fail(format!(
            "mount {} on {}",
            source.to_string_lossy(),
            target.to_string_lossy()
        )))
    }
}

fn cstr(s: String) -> Result<CString, OverlayError> {
    CString::new(s).map_err(|_| OverlayError {
        step: "path with a NUL byte".into(),
        errno: libc::EINVAL,
    })
}

/// Builds the overlay and moves PID 1 into it (see the module comment).
/// On error the root is left as it was (a partially moved set of mounts is
/// moved back).
pub fn setup(o: &Options) -> Result<(), OverlayError> {
    let total = crate::server::guest::total_memory().unwrap_or(0);
    let budget = crate::server::guest::tmpfs_budget(total);
    mkdir(STAGE, 0o700, true)?;
    mkdir(RW, 0o755, true)?;
    let upper = mount_upper(o, total, budget)?;
    mkdir(UPPER, 0o755, true)?;
    mkdir(WORK, 0o700, true)?;
    let lowers = mount_extra_lowers();
    if o.container && lowers.is_empty() {
        return Err(OverlayError {
            step: "shoal.container=1 without image layers (/dev/pmem1..)".into(),
            errno: libc::ENODEV,
        });
    }
    let data = cstr(format!(
        "lowerdir={},upperdir={},workdir={}",
        lowerdir(&lowers, o.container),
        UPPER.to_string_lossy(),
        WORK.to_string_lossy()
    ))?;
    mkdir(ROOT, 0o755, true)?;
    mount(c"overlay", ROOT, Some(c"overlay"), 0, Some(&data))?;
    if o.container {
        make_mount_points()?;
    }
    switch_root(upper, budget, !o.container)
}

/// The overlay's `lowerdir=`: the extra layers, highest first, over the
/// agent's root `/` unless this is a container (`container`).
fn lowerdir(lowers: &[CString], container: bool) -> String {
    let mut dirs: Vec<String> = lowers
        .iter()
        .rev()
        .map(|l| l.to_string_lossy().into_owned())
        .collect();
    if !container {
        dirs.push("/".into());
    }
    dirs.join(":")
}

/// The mount points the agent needs in a container's root, made (in the
/// upper layer) where the image has none.
fn make_mount_points() -> Result<(), OverlayError> {
    for (dir, mode) in [
        (c"/run/.shoal/root/dev", 0o755),
        (c"/run/.shoal/root/proc", 0o555),
        (c"/run/.shoal/root/sys", 0o555),
        (c"/run/.shoal/root/tmp", 0o1777),
        (c"/run/.shoal/root/run", 0o755),
    ] {
        mkdir(dir, mode, true)?;
    }
    Ok(())
}

/// What the upper layer ended up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpperKind {
    Tmpfs,
    Disk,
}

/// Bytes of a `shoal.upper_size` value (`123`, `64m`, `1G`, `25%` of
/// `total`); None if malformed.
fn size_bytes(v: &str, total: u64) -> Option<u64> {
    let (digits, mult) = match v.as_bytes().last()? {
        b'k' | b'K' => (v.get(..v.len() - 1)?, 1 << 10),
        b'm' | b'M' => (v.get(..v.len() - 1)?, 1 << 20),
        b'g' | b'G' => (v.get(..v.len() - 1)?, 1 << 30),
        b'%' => {
            let pct: u64 = v.get(..v.len() - 1)?.parse().ok()?;
            return Some(total / 100 * pct.min(100));
        }
        _ => (v, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

/// The tmpfs upper layer's size: the one asked for (default half of RAM,
/// like the kernel's), at most `budget`.
fn upper_size(asked: Option<&str>, total: u64, budget: u64) -> u64 {
    asked
        .and_then(|v| size_bytes(v, total))
        .unwrap_or(total / 2)
        .min(budget)
}

/// The upper file system on `/run/.shoal/rw`: the ext4 disk if one is
/// named and mounts, tmpfs otherwise (of at most `budget` bytes, see
/// [`crate::server::guest::tmpfs_budget`]).
fn mount_upper(o: &Options, total: u64, budget: u64) -> Result<UpperKind, OverlayError> {
    if let Some(dev) = &o.upper_dev {
        let d = cstr(dev.clone())?;
        match mount(&d, RW, Some(c"ext4"), libc::MS_NOATIME, None) {
            Ok(()) => return Ok(UpperKind::Disk),
            Err(e) => report(
                &format!("{} (falling back to a tmpfs upper layer)", e.step),
                e.errno,
            ),
        }
    }
    let size = upper_size(o.upper_size.as_deref(), total, budget);
    let data = if size == 0 {
        c"mode=755".into() // RAM unknown: the kernel's default
    } else {
        cstr(format!("mode=755,size={size}"))?
    };
    mount(c"tmpfs", RW, Some(c"tmpfs"), libc::MS_NOATIME, Some(&data))?;
    Ok(UpperKind::Tmpfs)
}

/// Mounts `/dev/pmem1`, `/dev/pmem2`, ... (as long as they exist) read-only
/// with DAX; returns their mount points, lowest first. A device that does
/// not mount is reported and ends the probe.
fn mount_extra_lowers() -> Vec<CString> {
    let mut out = Vec::new();
    for i in 1..=MAX_EXTRA_LOWERS {
        let (Ok(dev), Ok(dir)) = (
            cstr(format!("/dev/pmem{i}")),
            cstr(format!("{}/l{i}", STAGE.to_string_lossy())),
        ) else {
            break;
        };
        // SAFETY: `dev` is a NUL-terminated string.
        if unsafe { libc::access(dev.as_ptr(), libc::F_OK) } != 0 {
            break;
        }
        let mounted = mkdir(&dir, 0o755, true)
            .and_then(|()| mount(&dev, &dir, Some(c"erofs"), libc::MS_RDONLY, Some(c"dax")));
        match mounted {
            Ok(()) => out.push(dir),
            Err(e) => {
                report(&e.step, e.errno);
                break;
            }
        }
    }
    out
}

/// Moves the kernel file systems into the overlay, mounts a fresh `/run`
/// there (with the image's root bound at `/run/shoal/image` when
/// `show_root`) and pivots PID 1 into it. With a tmpfs upper, the boot's /tmp is
/// left behind (it goes with the old root) and /tmp is the overlay's
/// directory; with a disk upper it is moved and capped at `budget`.
fn switch_root(upper: UpperKind, budget: u64, show_root: bool) -> Result<(), OverlayError> {
    let mut moved = 0;
    let mut result = Ok(());
    let keep = if upper == UpperKind::Tmpfs {
        MOVED.len() - 1
    } else {
        MOVED.len()
    };
    for (from, to) in MOVED.into_iter().take(keep) {
        match mount(from, to, None, libc::MS_MOVE, None) {
            Ok(()) => moved += 1,
            // A mount point the image lacks (e.g. no /sys mounted): the
            // source is not a mount, skip it; anything else aborts.
            Err(e) if e.errno == libc::EINVAL => {}
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_ok() {
        match upper {
            UpperKind::Tmpfs => {
                // The image normally has /tmp; a new one lands in the upper.
                let _ = mkdir(c"/run/.shoal/root/tmp", 0o1777, true);
            }
            UpperKind::Disk if budget > 0 => {
                if let Ok(data) = cstr(format!("mode=1777,size={budget}")) {
                    let flags = libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV;
                    let tmp = c"/run/.shoal/root/tmp";
                    if let Err(e) = mount(c"tmpfs", tmp, None, flags, Some(&data)) {
                        report(&e.step, e.errno);
                    }
                }
            }
            UpperKind::Disk => {}
        }
        result = mount(
            c"tmpfs",
            c"/run/.shoal/root/run",
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(RUN_SIZE),
        )
        .map(|()| {
            if show_root {
                show_image();
            }
        })
        .and_then(|()| pivot());
    }
    if result.is_err() {
        // Put back what was moved (best effort), so the old root works.
        for (from, to) in MOVED.iter().take(moved) {
            let _ = mount(to, from, None, libc::MS_MOVE, None);
        }
    }
    result
}

/// Binds the image's root (only it, not the mounts on it) at
/// `/run/shoal/image` in the new root: the pristine read-only image stays
/// reachable, and /proc/mounts shows how it is mounted (erofs, dax).
/// Optional: a failure is only reported.
fn show_image() {
    let r = mkdir(c"/run/.shoal/root/run/shoal", 0o755, true)
        .and_then(|()| mkdir(IMAGE_VIEW, 0o755, true))
        .and_then(|()| mount(c"/", IMAGE_VIEW, None, libc::MS_BIND, None));
    if let Err(e) = r {
        report(&e.step, e.errno);
    }
}

fn pivot() -> Result<(), OverlayError> {
    // SAFETY: ROOT is a NUL-terminated string.
    if unsafe { libc::chdir(ROOT.as_ptr()) } != 0 {
        return Err(fail("chdir to the overlay"));
    }
    // pivot_root(".", "."): the old root ends up mounted over the new one
    // at "/"; detaching it leaves the overlay as the root.
    // SAFETY: two NUL-terminated strings; no memory is passed back.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) };
    if rc != 0 {
        let e = fail("pivot_root");
        // SAFETY: a NUL-terminated static string.
        unsafe { libc::chdir(c"/".as_ptr()) };
        return Err(e);
    }
    // SAFETY: a NUL-terminated static string.
    if unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) } != 0 {
        // The overlay is the root already; the old one stays visible
        // underneath, which is harmless.
        report("detach the old root", errno());
    }
    // SAFETY: a NUL-terminated static string.
    unsafe { libc::chdir(c"/".as_ptr()) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tmpfs_upper_is_capped_below_the_user_cgroup() {
        let mib = 1u64 << 20;
        assert_eq!(size_bytes("64m", 0), Some(64 * mib));
        assert_eq!(size_bytes("2G", 0), Some(2 << 30));
        assert_eq!(size_bytes("4096", 0), Some(4096));
        assert_eq!(size_bytes("25%", 400), Some(100));
        assert_eq!(size_bytes("x", 0), None);
        let total = 120 * mib;
        let budget = crate::server::guest::tmpfs_budget(total);
        // memory.max of the user cgroup is total - 24 MiB; the upper
        // leaves 24 MiB of it for processes.
        assert_eq!(crate::server::guest::user_memory_max(total), 96 * mib);
        assert_eq!(budget, 72 * mib);
        assert_eq!(upper_size(Some("64m"), total, budget), 64 * mib);
        assert_eq!(upper_size(Some("128m"), total, budget), budget);
        assert_eq!(upper_size(None, total, budget), 60 * mib);
        // A small guest still gets half of the cgroup's limit.
        let small = 56 * mib;
        assert_eq!(crate::server::guest::tmpfs_budget(small), 16 * mib);
    }

    #[test]
    fn options_from_the_command_line() {
        assert_eq!(parse(b"console=ttyS0 ro -- /bin/sh\n"), Options::default());
        let o = parse(b"root=/dev/pmem0 shoal.overlay=1 shoal.upper_size=64m --\n");
        assert!(o.enabled);
        assert_eq!(o.upper_size.as_deref(), Some("64m"));
        assert_eq!(o.upper_dev, None);
        assert!(!parse(b"shoal.overlay=0").enabled);
        assert!(!parse(b"shoal.overlay").enabled);
        let o = parse(b"shoal.overlay=1 shoal.upper=/dev/vdb shoal.upper_size=25%");
        assert_eq!(o.upper_dev.as_deref(), Some("/dev/vdb"));
        assert_eq!(o.upper_size.as_deref(), Some("25%"));
        // Nothing that could smuggle in mount options or other paths.
        let o = parse(b"shoal.upper_size=64m,mode=777 shoal.upper=/etc/passwd");
        assert_eq!((o.upper_size, o.upper_dev), (None, None));
        let o = parse(b"shoal.upper_size=m shoal.upper_size=12mm shoal.upper=/dev/../x");
        assert_eq!((o.upper_size, o.upper_dev), (None, None));
        assert_eq!(
            parse(b"shoal.upper_size=1048576").upper_size.as_deref(),
            Some("1048576")
        );
        assert!(parse(b"shoal.overlay=1 shoal.container=1").container);
        assert!(!parse(b"shoal.overlay=1 shoal.container=0").container);
    }

    #[test]
    fn a_containers_lower_layers_leave_the_agent_root_out() {
        let l = [c"/run/.shoal/l1".to_owned(), c"/run/.shoal/l2".to_owned()];
        assert_eq!(lowerdir(&l, false), "/run/.shoal/l2:/run/.shoal/l1:/");
        assert_eq!(lowerdir(&l, true), "/run/.shoal/l2:/run/.shoal/l1");
        assert_eq!(lowerdir(&[], false), "/");
    }
}
