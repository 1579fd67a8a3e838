//! vCPU architectural set-up: CPUID profiles, registers, MSRs, MP table.

pub mod cpuid;
pub mod mptable;
pub mod regs;

pub use cpuid::CpuProfile;
