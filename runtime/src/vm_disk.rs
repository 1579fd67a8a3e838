//! A `vm` template's own disk as a template keeps it: how it boots and
//! what was checked ([`crate::backend::qemu_disk`] checks and boots it).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where the agent is in a disk made by `shoal image build --kind vm`.
pub const DEFAULT_INIT: &str = "/usr/local/sbin/shoal-agent";
/// The root device: the disk is the guest's first virtio disk.
pub const DEFAULT_ROOT: &str = "/dev/vda";
/// How a disk boots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kernel", rename_all = "lowercase")]
pub enum DiskBoot {
    /// Shoal's kernel (`-kernel`), the disk's file system on `root` as the
    /// root (read-write: writes land in the sandbox's overlay), `init`
    /// (a path inside the disk) as PID 1.
    Shoal {
        /// Root device (`/dev/vda`, or a partition such as `/dev/vda1`).
        root: String,
        /// The init program inside the disk (Shoal's agent).
        init: String,
    },
    /// No kernel: the firmware boots the disk's own bootloader (hardware
    /// KVM; stock kernels do not boot on PVM hosts). The guest's agent
    /// (a service) must print the ready marker on the first serial port.
    None,
}

impl DiskBoot {
    /// Checks the words that go on the kernel command line.
    pub fn check(&self) -> Result<(), DiskError> {
        if let DiskBoot::Shoal { root, init } = self {
            for (what, v) in [("root", root), ("init", init)] {
                let ok = v.starts_with('/')
                    && v.len() <= 255
                    && v.bytes()
                        .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'\\'));
                if !ok {
                    return Err(DiskError::Bad(format!(
                        "{what} {v:?}: an absolute path of at most 255 printable characters, \
                         no quotes or backslashes"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A caller's disk, checked (`backend::qemu_disk::inspect`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmDisk {
    /// The base image (never written).
    pub base: PathBuf,
    /// `raw` or `qcow2`.
    pub format: String,
    /// How it boots.
    pub boot: DiskBoot,
}

/// Why a disk is refused.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// Not usable as a disk (the message says why).
    #[error("{0}")]
    Bad(String),
    /// `qemu-img` could not be run.
    #[error("{0}: {1}")]
    Tool(PathBuf, std::io::Error),
}
