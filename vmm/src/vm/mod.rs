//! Building a VM from a [`VmConfig`] (boot), from a snapshot (restore, or
//! reload into an existing VM), and running it.

mod balloon_dev;
mod build;
mod diff;
mod evict;
mod maps;
mod net_dev;
mod pmem_dev;
mod restore;
mod run;

pub use pmem_dev::{PmemError, PmemInfo};

/// Entry points for the fuzz targets (`fuzz/`), not an API.
#[doc(hidden)]
pub mod fuzzing {
    use std::path::Path;

    /// Decodes a snapshot `state` file's bytes and runs restore's checks
    /// on it (everything before guest memory is mapped, with no disk files
    /// from the caller): the error restore would report, or the
    /// configuration it would restore.
    pub fn check_state_file(bytes: &[u8]) -> Result<crate::VmConfig, super::VmError> {
        let dir = Path::new("/fuzz/snapshot");
        let st: crate::persist::SnapshotState =
            snapshot::read_from(&mut &bytes[..], &dir.join("state"))?;
        let mut cfg = super::restore::check_state(dir, &st)?;
        super::restore::override_disks(dir, &mut cfg, &[])?;
        Ok(cfg)
    }
}
pub use run::{profile_kernel_args, RunOptions, RunOutcome};

use crate::boot::BootError;
use crate::config::{ConfigError, SerialOutput, VmConfig};
use crate::cpu::mptable::MptableError;
use crate::cpu::regs::RegsError;
use crate::cpu::CpuProfile;
use crate::persist::StateError;
use crate::vcpu::VcpuReport;
use devices::bus::BusError;
use devices::serial::{BoundedSink, Serial};
use devices::virtio::blk::BlockError;
use devices::virtio::mmio::MmioTransport;
use devices::virtio::persist::MmioRestoreError;
use devices::{Bus, IrqLine};
use kvm_ioctls::VmFd;
use snapshot::SnapshotError;
use std::io::Write;
use std::sync::{Arc, Mutex};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// Errors building or running a VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// /dev/kvm could not be opened.
    #[error("cannot open /dev/kvm: {0} (is KVM available and accessible to this user?)")]
    KvmOpen(kvm_ioctls::Error),
    /// A KVM ioctl failed.
    #[error("{what} failed: {source}")]
    Kvm {
        /// Which step.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// Guest memory could not be allocated or mapped.
    #[error("cannot set up {0} MiB of guest memory")]
    Memory(u32),
    /// Kernel, initrd or command line.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// vCPU register set-up.
    #[error(transparent)]
    Regs(#[from] RegsError),
    /// MP table.
    #[error(transparent)]
    Mptable(#[from] MptableError),
    /// A disk.
    #[error(transparent)]
    Block(#[from] BlockError),
    /// Device placement.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// Serial output file or eventfds.
    #[error("{what}: {source}")]
    Io {
        /// What failed.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A vCPU thread could not be started.
    #[error("cannot start vCPU thread: {0}")]
    Thread(std::io::Error),
    /// Snapshot state file.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// KVM state save/restore.
    #[error("snapshot: {0}")]
    State(#[from] StateError),
    /// A device's saved state does not fit.
    #[error("snapshot: {0}")]
    DeviceState(String),
    /// The snapshot was taken elsewhere or is inconsistent.
    #[error("cannot restore snapshot {dir}: {reason}")]
    Incompatible {
        /// The snapshot.
        dir: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// The control socket could not be created.
    #[error("cannot create control socket {path}: {source}")]
    ApiSocket {
        /// The path.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The vsock device.
    #[error(transparent)]
    Vsock(#[from] devices::virtio::vsock::VsockError),
    /// The event thread.
    #[error(transparent)]
    Events(#[from] crate::events::EventError),
    /// A virtio-pmem device.
    #[error(transparent)]
    Pmem(#[from] PmemError),
    /// A seccomp filter could not be built or installed.
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
    /// The VM has no guest loaded (a pre-warmed VM waits for a restore).
    #[error("no guest is loaded (restore a snapshot into this VM first)")]
    NotLoaded,
}

impl From<MmioRestoreError> for VmError {
    fn from(e: MmioRestoreError) -> Self {
        VmError::DeviceState(e.to_string())
    }
}

/// What the controller thread receives.
pub enum Event {
    /// From a vCPU thread.
    Vcpu(VcpuReport),
    /// From the control socket.
    Control(vmm_api::Command),
}

impl From<VcpuReport> for Event {
    fn from(r: VcpuReport) -> Self {
        Event::Vcpu(r)
    }
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmError {
    let what = what.into();
    move |source| VmError::Io { what, source }
}

/// A built VM: KVM objects, guest memory, devices and vCPU file descriptors.
pub struct Vm {
    config: VmConfig,
    vm_fd: VmFd,
    mem: GuestMemoryMmap,
    vcpus: Vec<kvm_ioctls::VcpuFd>,
    pio: Bus,
    mmio: Bus,
    reset_evt: EventFd,
    serial: Arc<Mutex<Serial>>,
    virtio: Vec<Arc<Mutex<MmioTransport>>>,
    /// Interrupt lines registered as irqfds (unregistered on reload).
    irq_lines: Vec<IrqLine>,
    profile: CpuProfile,
    cmdline: Option<String>,
    /// MSR indices KVM can save (probed once).
    supported_msrs: Vec<u32>,
    msr_list: Arc<Vec<u32>>,
    xsave: bool,
    /// Whether a guest is loaded (false for a pre-warmed, empty VM).
    loaded: bool,
    /// Device event handlers not yet handed to the event thread.
    subscribers: Vec<crate::events::Subscriber>,
    /// The event thread, while running.
    events: Option<crate::events::EventThread>,
    /// Ids of the subscribers the event thread holds.
    subscriber_ids: Vec<event_manager::SubscriberId>,
    /// Control handle of the vsock device, if any.
    vsock: Option<devices::virtio::vsock::VsockHandle>,
    /// The vsock socket path this VM owns (kept across reloads).
    vsock_path: Option<std::path::PathBuf>,
    /// The full snapshot whose memory file backs guest memory (restored
    /// VMs); diff snapshots are taken against it.
    memory_base: Option<std::path::PathBuf>,
    /// Mapped pmem images with their read-only KVM slots, in device order.
    /// Each removes its own slot before unmapping, so drop order does not
    /// matter.
    pmem: Vec<pmem_dev::PmemDev>,
    /// Handle of the net device, if any (its counters).
    net: Option<devices::virtio::net::NetHandle>,
    /// The TAP and MAC a pre-warmed VM gives the net device of the
    /// snapshot it reloads (`--restore-net`).
    net_override: Option<crate::net_config::NetDeviceConfig>,
    /// Handle of the balloon device, if any.
    balloon: Option<devices::virtio::balloon::BalloonHandle>,
    /// How each span of guest RAM is mapped now, shared with the balloon
    /// device (which gives pages back by it); see `balloon_dev`.
    ram_spans: Arc<Mutex<devices::virtio::balloon::release::MappedRegions>>,
    /// Cold-memory eviction (`evict`): its file and counters.
    evictor: evict::Evictor,
}

/// What a restore may change about the saved VM.
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Where the console goes (default: as saved).
    pub serial: Option<SerialOutput>,
    /// The vsock host socket (default: as saved; each VM needs its own).
    pub vsock_uds: Option<std::path::PathBuf>,
    /// Files for the saved virtio-blk disks, in order (`/dev/vda`, ...):
    /// each replaces the saved disk's path; disks without one keep theirs.
    /// A writable disk's contents are part of the guest's state, so every
    /// VM restored from one snapshot needs its own copy of the file as it
    /// was when the snapshot was taken (same size, same bytes).
    pub disks: Vec<std::path::PathBuf>,
    /// The TAP, MAC and limits of the snapshot's net device. Required
    /// when the snapshot has one (a clone never sends with its template's
    /// identity) and refused when it has none.
    pub net: Option<crate::net_config::NetDeviceConfig>,
}

/// Where console output of a new or restored VM goes.
fn console_sink(
    cfg: &VmConfig,
    console: Option<Box<dyn Write + Send>>,
) -> Result<BoundedSink, VmError> {
    let out: Box<dyn Write + Send> = match console {
        Some(c) => c,
        None => match &cfg.serial {
            SerialOutput::Stdout => Box::new(std::io::stdout()),
            SerialOutput::File(p) => Box::new(
                std::fs::File::create(p)
                    .map_err(io_err(format!("cannot create serial file {}", p.display())))?,
            ),
            SerialOutput::Null => Box::new(std::io::sink()),
        },
    };
    Ok(BoundedSink::new(out, cfg.serial_limit_bytes))
}

fn default_profile(cfg: &VmConfig) -> CpuProfile {
    cfg.cpu_profile.unwrap_or_else(|| {
        CpuProfile::auto(crate::host::kvm_kind() != crate::host::KvmKind::Hardware)
    })
}
