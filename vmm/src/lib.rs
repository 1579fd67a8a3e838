//! Shoal's virtual machine monitor: builds a KVM microVM (memory, vCPUs,
//! devices, Linux boot) and runs it.

pub mod boot;
pub mod config;
pub mod cpu;
pub mod events;
pub mod evict_mode;
pub mod host;
mod kernel_map;
pub mod layout;
pub mod net_config;
pub mod persist;
pub mod seccomp;
pub mod vcpu;
pub mod vm;

pub use config::{BootSource, DiskConfig, PmemConfig, SerialOutput, VmConfig, VsockConfig};
pub use cpu::CpuProfile;
pub use net_config::{NetDeviceConfig, TapSource};
pub use vcpu::ExitReason;
pub use vm::{RestoreOptions, RunOptions, RunOutcome, Vm, VmError};
