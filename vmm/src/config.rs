//! VM configuration, from command-line flags or a JSON file.

use crate::cpu::CpuProfile;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Errors in a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The JSON file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The JSON is malformed or has unknown fields.
    #[error("invalid config file {path}: {source}")]
    Parse {
        /// The path.
        path: PathBuf,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// A value is out of range.
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// What the guest boots.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum BootSource {
    /// A Linux kernel (uncompressed ELF vmlinux).
    Linux {
        /// vmlinux path.
        kernel: PathBuf,
        /// Kernel command line (the VMM appends device and profile words).
        #[serde(default = "default_cmdline")]
        cmdline: String,
        /// Optional initrd / initramfs.
        #[serde(default)]
        initrd: Option<PathBuf>,
    },
    /// Raw 16-bit code loaded at `addr` and entered in real mode (test guests).
    RealMode {
        /// Machine code.
        code: Vec<u8>,
        /// Load and entry address (below 64 KiB).
        addr: u16,
    },
}

fn default_cmdline() -> String {
    "console=ttyS0 reboot=k panic=-1".into()
}

/// One virtio-blk disk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    /// Backing file.
    pub path: PathBuf,
    /// Refuse guest writes.
    #[serde(default)]
    pub read_only: bool,
}

/// One virtio-pmem device: an image file mapped read-only into the guest
/// above RAM, for DAX (`/dev/pmem0`, `/dev/pmem1`, ... in order). The file
/// must be a non-empty multiple of 2 MiB; it is shared, never written.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PmemConfig {
    /// The image file (with `fd`: only its name, kept in snapshots).
    pub path: PathBuf,
    /// An inherited descriptor holding the image, used in place of opening
    /// `path` (so whoever started the VMM decides which file is mapped,
    /// also where the VMM cannot see the path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fd: Option<i32>,
}

/// The vsock device: guest context id and the host Unix socket that
/// carries host<->guest connections (`CONNECT <port>` protocol).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VsockConfig {
    /// Guest context id (3 and up).
    #[serde(default = "default_cid")]
    pub cid: u32,
    /// Host socket path (must not exist yet).
    pub uds_path: PathBuf,
}

fn default_cid() -> u32 {
    3
}

/// Where the serial console goes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SerialOutput {
    /// The VMM's stdout.
    #[default]
    Stdout,
    /// A file (created or truncated).
    File(PathBuf),
    /// Discarded.
    Null,
}

/// A whole VM.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// What to boot.
    pub boot: BootSource,
    /// Number of vCPUs (1..=254).
    #[serde(default = "one")]
    pub vcpus: u8,
    /// Guest memory in MiB.
    #[serde(default = "default_mem")]
    pub memory_mib: u32,
    /// virtio-blk disks, in order (/dev/vda, /dev/vdb, ...).
    #[serde(default)]
    pub disks: Vec<DiskConfig>,
    /// Serial console destination.
    #[serde(default)]
    pub serial: SerialOutput,
    /// Most bytes of guest console output kept; the rest is dropped.
    #[serde(default = "default_serial_limit")]
    pub serial_limit_bytes: u64,
    /// CPU profile; `None` picks one for the host.
    #[serde(default)]
    pub cpu_profile: Option<CpuProfile>,
    /// virtio-vsock device.
    #[serde(default)]
    pub vsock: Option<VsockConfig>,
    /// virtio-pmem devices, in order (/dev/pmem0, /dev/pmem1, ...); their
    /// virtio-mmio slots follow the disks and the vsock device.
    #[serde(default)]
    pub pmem: Vec<PmemConfig>,
    /// One virtio-net device on a TAP (after the pmem devices); none: the
    /// guest has no network device at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<crate::net_config::NetDeviceConfig>,
    /// One virtio-balloon device (after the net device): the host can ask
    /// the guest for memory back, the guest reports the pages it frees and
    /// its memory statistics. None: no balloon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<devices::virtio::balloon::BalloonConfig>,
}

fn one() -> u8 {
    1
}
fn default_mem() -> u32 {
    128
}
fn default_serial_limit() -> u64 {
    64 << 20
}

/// Most virtio devices one VM may have (IRQs 5..=23).
pub const MAX_VIRTIO_DEVICES: usize = 19;

impl VmConfig {
    /// A Linux VM with defaults.
    pub fn linux(kernel: PathBuf) -> Self {
        Self {
            boot: BootSource::Linux {
                kernel,
                cmdline: default_cmdline(),
                initrd: None,
            },
            vcpus: 1,
            memory_mib: default_mem(),
            disks: vec![],
            serial: SerialOutput::Stdout,
            serial_limit_bytes: default_serial_limit(),
            cpu_profile: None,
            vsock: None,
            pmem: vec![],
            net: None,
            balloon: None,
        }
    }

    /// Reads a JSON config file.
    pub fn from_json_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let s = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let c: Self = serde_json::from_str(&s).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })?;
        c.validate()?;
        Ok(c)
    }

    /// Checks ranges that serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.vcpus == 0 || self.vcpus > 254 {
            return Err(ConfigError::Invalid(format!(
                "vcpus must be 1..=254, got {}",
                self.vcpus
            )));
        }
        if self.memory_mib < 16 {
            return Err(ConfigError::Invalid(format!(
                "memory_mib must be at least 16, got {}",
                self.memory_mib
            )));
        }
        if u64::from(self.memory_mib) > (1 << 20) {
            return Err(ConfigError::Invalid(format!(
                "memory_mib {} exceeds 1 TiB",
                self.memory_mib
            )));
        }
        if let Some(v) = &self.vsock {
            if v.cid < 3 || v.cid == u32::MAX {
                return Err(ConfigError::Invalid(format!(
                    "vsock cid must be 3..{}, got {}",
                    u32::MAX,
                    v.cid
                )));
            }
        }
        if self.virtio_devices() > MAX_VIRTIO_DEVICES {
            return Err(ConfigError::Invalid(format!(
                "at most {MAX_VIRTIO_DEVICES} virtio devices (disks + vsock + pmem), got {} \
                 ({} disks, {} pmem)",
                self.virtio_devices(),
                self.disks.len(),
                self.pmem.len()
            )));
        }
        if let Some(fd) = self.pmem.iter().find_map(|p| p.fd.filter(|&fd| fd < 3)) {
            return Err(ConfigError::Invalid(format!(
                "pmem descriptor {fd}: must be 3 or above"
            )));
        }
        if let Some(n) = &self.net {
            if let crate::net_config::TapSource::Fd(fd) = n.tap {
                if fd < 3 {
                    return Err(ConfigError::Invalid(format!(
                        "net descriptor {fd}: must be 3 or above"
                    )));
                }
            }
            n.mac
                .validate()
                .map_err(|e| ConfigError::Invalid(format!("net: {e}")))?;
        }
        if let BootSource::RealMode { code, addr } = &self.boot {
            if usize::from(*addr) + code.len() > 0x1_0000 || code.is_empty() {
                return Err(ConfigError::Invalid(
                    "real-mode code must be non-empty and end below 64 KiB".into(),
                ));
            }
        }
        Ok(())
    }

    /// Guest memory in bytes.
    pub fn mem_bytes(&self) -> u64 {
        u64::from(self.memory_mib) << 20
    }

    /// Number of virtio-mmio devices: disks, then vsock, then pmem, then
    /// net, then balloon.
    pub fn virtio_devices(&self) -> usize {
        self.disks.len()
            + usize::from(self.vsock.is_some())
            + self.pmem.len()
            + usize::from(self.net.is_some())
            + usize::from(self.balloon.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_defaults_and_unknown_fields() {
        let c: VmConfig =
            serde_json::from_str(r#"{"boot":{"type":"linux","kernel":"/k"}}"#).unwrap();
        assert_eq!(c.vcpus, 1);
        assert_eq!(c.memory_mib, 128);
        assert_eq!(c.serial, SerialOutput::Stdout);
        c.validate().unwrap();
        assert!(serde_json::from_str::<VmConfig>(
            r#"{"boot":{"type":"linux","kernel":"/k"},"vcpu":2}"#
        )
        .is_err());
        let c: VmConfig = serde_json::from_str(
            r#"{"boot":{"type":"linux","kernel":"/k"},"disks":[{"path":"/d","read_only":true}],
                "serial":{"file":"/tmp/x"},"cpu_profile":"pvm"}"#,
        )
        .unwrap();
        assert!(c.disks[0].read_only);
        assert_eq!(c.cpu_profile, Some(CpuProfile::Pvm));
        assert!(c.pmem.is_empty(), "pmem defaults to none");
        assert!(c.balloon.is_none(), "no balloon unless asked");
        let c: VmConfig = serde_json::from_str(
            r#"{"boot":{"type":"linux","kernel":"/k"},"balloon":{"deflate_on_oom":true}}"#,
        )
        .unwrap();
        let b = c.balloon.unwrap();
        assert!(b.deflate_on_oom && b.stats && b.free_page_reporting);
        assert_eq!(c.virtio_devices(), 1);
        assert!(serde_json::from_str::<VmConfig>(
            r#"{"boot":{"type":"linux","kernel":"/k"},"balloon":{"stats_secs":1}}"#
        )
        .is_err());
        let c: VmConfig = serde_json::from_str(
            r#"{"boot":{"type":"linux","kernel":"/k"},"pmem":[{"path":"/a.img"},{"path":"/b"}]}"#,
        )
        .unwrap();
        assert_eq!(c.pmem[1].path, PathBuf::from("/b"));
        assert!(serde_json::from_str::<VmConfig>(
            r#"{"boot":{"type":"linux","kernel":"/k"},"pmem":[{"path":"/a","ro":true}]}"#
        )
        .is_err());
    }

    #[test]
    fn ranges_are_checked() {
        let mut c = VmConfig::linux("/k".into());
        c.vcpus = 0;
        assert!(c.validate().unwrap_err().to_string().contains("vcpus"));
        c.vcpus = 1;
        c.memory_mib = 4;
        assert!(c.validate().unwrap_err().to_string().contains("memory_mib"));
        c.memory_mib = 64;
        c.disks = vec![
            DiskConfig {
                path: "/d".into(),
                read_only: false
            };
            20
        ];
        assert!(c.validate().unwrap_err().to_string().contains("disks"));
        c.disks.truncate(10);
        c.pmem = vec![
            PmemConfig {
                path: "/p".into(),
                fd: None
            };
            10
        ];
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("10 pmem"), "{e}");
        c.pmem.truncate(9);
        c.validate().unwrap();
    }
}
