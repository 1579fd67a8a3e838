//! A `vm` template's own disk (a caller's raw or qcow2 image) instead of
//! the tiny image: what is checked before it is used, and how it boots.
//!
//! The disk is the base of every sandbox's qcow2 overlay, opened read-only
//! through it and never written. A qcow2 may name any host file as its
//! backing file or external data file, so a disk with either is refused;
//! its format is what `qemu-img info` finds (or what the caller gave, if
//! they agree), and QEMU is always told it (`-F`), never left to probe.
//! A raw disk must look like one: an ext2/3/4 file system at its start or
//! a partition table (MBR or GPT's protective MBR).
//!
//! How it boots ([`DiskBoot`]): on PVM hosts a distribution kernel cannot
//! run, so the default is Shoal's kernel (`-kernel`) with the disk's own
//! file system as the root (`root=/dev/vda rw`) and Shoal's agent inside
//! it as init; on hardware KVM a disk with its own bootloader can boot
//! through the firmware instead (`Firmware`: no `-kernel`).

use super::qemu_launch::{Firmware, QemuTools, VmImage};
use super::BackendError;
pub use crate::vm_disk::{DiskBoot, DiskError, VmDisk, DEFAULT_INIT, DEFAULT_ROOT};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The console line that says the agent is up.
pub const READY_MARKER: &str = "SHOAL-INIT-READY";
/// Longest `qemu-img` may take to look at a disk.
const QEMU_IMG_DEADLINE: Duration = Duration::from_secs(30);
/// Most of `qemu-img info`'s output that is read.
const MAX_INFO: u64 = 1 << 20;

/// What [`inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskInfo {
    /// `raw` or `qcow2`.
    pub format: String,
    /// The guest-visible size in bytes.
    pub virtual_size: u64,
}

/// Checks `file` (open, read-only, at `path`) as a base disk: a regular
/// file, `raw` or `qcow2` (`want`, if given, must be what `qemu-img info`
/// finds), no backing file or external data file, a consistent qcow2, a
/// raw disk with a file system or partition table; and still the same
/// file at `path` after. Blocking (runs `qemu-img`, within a deadline).
pub fn inspect(
    tools: &QemuTools,
    path: &Path,
    file: &File,
    want: Option<&str>,
) -> Result<DiskInfo, DiskError> {
    let shown = path.display();
    let bad = |m: String| Err(DiskError::Bad(format!("disk {shown}: {m}")));
    if let Some(w) = want {
        if !matches!(w, "raw" | "qcow2") {
            return bad(format!("format {w:?}: raw or qcow2"));
        }
    }
    let meta = file
        .metadata()
        .map_err(|e| DiskError::Bad(format!("disk {shown}: {e}")))?;
    if meta.is_dir() {
        return bad("a directory, not a disk image file".into());
    }
    if !meta.is_file() {
        return bad("not a regular file".into());
    }
    let out = run_deadline(
        Command::new(&tools.qemu_img)
            .args(["info", "--output=json", "--force-share"])
            .arg(path),
        QEMU_IMG_DEADLINE,
    )
    .map_err(|e| DiskError::Tool(tools.qemu_img.clone(), e))?;
    if !out.0 {
        return bad(format!("qemu-img info: {}", out.2.trim()));
    }
    let info: serde_json::Value = serde_json::from_slice(&out.1)
        .map_err(|e| DiskError::Bad(format!("disk {shown}: qemu-img info: {e}")))?;
    let format = info
        .get("format")
        .and_then(|f| f.as_str())
        .unwrap_or("")
        .to_string();
    if !matches!(format.as_str(), "raw" | "qcow2") {
        return bad(format!("a {format} image; raw or qcow2 only"));
    }
    if let Some(w) = want {
        if w != format {
            return bad(format!("given as {w}, but it is {format}"));
        }
    }
    if let Some(b) = info
        .get("backing-filename")
        .or_else(|| info.get("full-backing-filename"))
    {
        return bad(format!(
            "a qcow2 with a backing file ({b}): refused (it could name any host file); \
             flatten it first: qemu-img convert -O qcow2 IN OUT"
        ));
    }
    let data_file = info
        .pointer("/format-specific/data/data-file")
        .or_else(|| info.pointer("/format-specific/data/data-file-raw"));
    if data_file.is_some() {
        return bad("a qcow2 with an external data file: refused; convert it first".into());
    }
    let virtual_size = info
        .get("virtual-size")
        .and_then(|v| v.as_u64())
        .unwrap_or(0);
    if virtual_size < 1 << 20 {
        return bad(format!("{virtual_size} bytes: too small for a disk"));
    }
    if format == "qcow2" {
        let c = run_deadline(
            Command::new(&tools.qemu_img)
                .args(["check", "-q", "--force-share", "-f", "qcow2"])
                .arg(path),
            QEMU_IMG_DEADLINE,
        )
        .map_err(|e| DiskError::Tool(tools.qemu_img.clone(), e))?;
        if !c.0 {
            return bad(format!("qemu-img check: {}", c.2.trim()));
        }
    } else if !looks_like_disk(file) {
        return bad(
            "neither an ext2/3/4 file system nor a partition table at its start: \
             not a disk image"
                .into(),
        );
    }
    // qemu-img looked by path: it must have been this file.
    match std::fs::metadata(path) {
        Ok(m) if m.dev() == meta.dev() && m.ino() == meta.ino() => {}
        _ => return bad("replaced while it was checked".into()),
    }
    Ok(DiskInfo {
        format,
        virtual_size,
    })
}

/// An ext2/3/4 superblock (magic 0xEF53 at byte 1080) or an MBR boot
/// signature (0x55AA at byte 510; GPT disks have one too).
fn looks_like_disk(file: &File) -> bool {
    let mut b = [0u8; 2048];
    let mut n = 0;
    while n < b.len() {
        match file.read_at(&mut b[n..], n as u64) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    let ext = n >= 1082 && b[1080] == 0x53 && b[1081] == 0xEF;
    let mbr = n >= 512 && b[510] == 0x55 && b[511] == 0xAA;
    ext || mbr
}

/// Runs `cmd` (stdin closed), killing it at `deadline`: (success, stdout
/// up to [`MAX_INFO`], stderr up to 64 KiB).
fn run_deadline(cmd: &mut Command, deadline: Duration) -> std::io::Result<(bool, Vec<u8>, String)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let (mut so, mut se) = (child.stdout.take(), child.stderr.take());
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(s) = so.as_mut() {
            let _ = s.take(MAX_INFO).read_to_end(&mut v);
        }
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(s) = se.as_mut() {
            let _ = s.take(64 << 10).read_to_end(&mut v);
        }
        String::from_utf8_lossy(&v).into_owned()
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("did not finish within {} s", deadline.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    Ok((status.success(), out, err))
}

/// The kernel command line for a disk booted with Shoal's kernel: the
/// backend's line for the tiny image (`append`, [`super::qemu::vm_cmdline`])
/// with its root, root type, `ro` and `init` replaced by the disk's (a
/// writable disk root: no overlay over it).
pub fn disk_cmdline(append: &str, root: &str, init: &str) -> String {
    let keep: Vec<&str> = append
        .split_whitespace()
        .take_while(|w| *w != "--")
        .filter(|w| {
            !(w.starts_with("root=")
                || w.starts_with("rootfstype=")
                || w.starts_with("init=")
                || matches!(*w, "ro" | "rw" | "shoal.overlay=1"))
        })
        .collect();
    format!("{} root={root} rw init={init} --", keep.join(" "))
}

/// The image a template boots: `disk` if it has one (with the kernel and
/// command line of the backend's `default` image when it boots with
/// Shoal's kernel), else the backend's `default`.
pub fn image_for(
    default: Option<&VmImage>,
    disk: Option<&VmDisk>,
) -> Result<VmImage, BackendError> {
    let no_default = || BackendError::Reply("no disk image configured for the vm kind".into());
    let Some(disk) = disk else {
        return default.cloned().ok_or_else(no_default);
    };
    disk.boot
        .check()
        .map_err(|e| BackendError::Reply(e.to_string()))?;
    let (kernel, append) = match &disk.boot {
        DiskBoot::Shoal { root, init } => {
            let d = default.ok_or_else(no_default)?;
            let k = d.kernel.clone().ok_or_else(|| {
                BackendError::Reply("the vm kind has no kernel configured".into())
            })?;
            (Some(k), disk_cmdline(&d.append, root, init))
        }
        DiskBoot::None => (None, String::new()),
    };
    Ok(VmImage {
        base: disk.base.clone(),
        base_format: disk.format.clone(),
        kernel,
        append,
        firmware: Firmware::Bios,
        ready_marker: Some(READY_MARKER.into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_command_line_replaces_root_and_init() {
        let base = super::super::qemu::vm_cmdline("console=ttyS0 pci=off", "shoal.pvm");
        assert_eq!(
            disk_cmdline(&base, "/dev/vda1", "/usr/local/sbin/shoal-agent"),
            "console=ttyS0 shoal.pvm root=/dev/vda1 rw init=/usr/local/sbin/shoal-agent --"
        );
    }

    #[test]
    fn boot_words_are_checked() {
        let b = |root: &str, init: &str| DiskBoot::Shoal {
            root: root.into(),
            init: init.into(),
        };
        assert!(b("/dev/vda", "/sbin/init").check().is_ok());
        for (r, i) in [
            ("vda", "/sbin/init"),
            ("/dev/vda", "/sbin/init x"),
            ("/dev/vda", "/sbin/\"i"),
            ("/dev/vda", ""),
        ] {
            assert!(b(r, i).check().is_err(), "{r:?} {i:?}");
        }
        assert!(DiskBoot::None.check().is_ok());
    }

    #[test]
    fn a_raw_disk_needs_a_file_system_or_a_partition_table() {
        let dir = std::env::temp_dir().join(format!("qemu-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d");
        let mut b = vec![0u8; 4096];
        std::fs::write(&p, &b).unwrap();
        assert!(!looks_like_disk(&File::open(&p).unwrap()));
        b[1080] = 0x53;
        b[1081] = 0xEF;
        std::fs::write(&p, &b).unwrap();
        assert!(looks_like_disk(&File::open(&p).unwrap()));
        b[1080] = 0;
        b[510] = 0x55;
        b[511] = 0xAA;
        std::fs::write(&p, &b).unwrap();
        assert!(looks_like_disk(&File::open(&p).unwrap()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
