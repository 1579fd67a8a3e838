//! KVM ioctl numbers the filters allow (the same definitions as
//! `kvm-ioctls`, which keeps its own private).

#![allow(non_snake_case)] // the kernel's names

use kvm_bindings::*;
use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iow_nr, ioctl_iowr_nr};

// /dev/kvm
ioctl_io_nr!(KVM_CHECK_EXTENSION, KVMIO, 0x03);
ioctl_io_nr!(KVM_GET_VCPU_MMAP_SIZE, KVMIO, 0x04);
ioctl_iowr_nr!(KVM_GET_SUPPORTED_CPUID, KVMIO, 0x05, kvm_cpuid2);

// VM
ioctl_io_nr!(KVM_CREATE_VCPU, KVMIO, 0x41);
ioctl_iow_nr!(
    KVM_SET_USER_MEMORY_REGION,
    KVMIO,
    0x46,
    kvm_userspace_memory_region
);
ioctl_iow_nr!(KVM_IRQFD, KVMIO, 0x76, kvm_irqfd);
ioctl_iowr_nr!(KVM_GET_IRQCHIP, KVMIO, 0x62, kvm_irqchip);
ioctl_ior_nr!(KVM_SET_IRQCHIP, KVMIO, 0x63, kvm_irqchip);
ioctl_iow_nr!(KVM_SET_CLOCK, KVMIO, 0x7b, kvm_clock_data);
ioctl_ior_nr!(KVM_GET_CLOCK, KVMIO, 0x7c, kvm_clock_data);
ioctl_ior_nr!(KVM_GET_PIT2, KVMIO, 0x9f, kvm_pit_state2);
ioctl_iow_nr!(KVM_SET_PIT2, KVMIO, 0xa0, kvm_pit_state2);

// vCPU
ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
ioctl_iow_nr!(KVM_SET_REGS, KVMIO, 0x82, kvm_regs);
ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
ioctl_iow_nr!(KVM_SET_SREGS, KVMIO, 0x84, kvm_sregs);
ioctl_iowr_nr!(KVM_TRANSLATE, KVMIO, 0x85, kvm_translation);
ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);
ioctl_iow_nr!(KVM_SET_MSRS, KVMIO, 0x89, kvm_msrs);
ioctl_ior_nr!(KVM_GET_FPU, KVMIO, 0x8c, kvm_fpu);
ioctl_iow_nr!(KVM_SET_FPU, KVMIO, 0x8d, kvm_fpu);
ioctl_ior_nr!(KVM_GET_LAPIC, KVMIO, 0x8e, kvm_lapic_state);
ioctl_iow_nr!(KVM_SET_LAPIC, KVMIO, 0x8f, kvm_lapic_state);
ioctl_iow_nr!(KVM_SET_CPUID2, KVMIO, 0x90, kvm_cpuid2);
ioctl_iowr_nr!(KVM_GET_CPUID2, KVMIO, 0x91, kvm_cpuid2);
ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_mp_state);
ioctl_iow_nr!(KVM_SET_MP_STATE, KVMIO, 0x99, kvm_mp_state);
ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, KVMIO, 0x9f, kvm_vcpu_events);
ioctl_iow_nr!(KVM_SET_VCPU_EVENTS, KVMIO, 0xa0, kvm_vcpu_events);
ioctl_ior_nr!(KVM_GET_DEBUGREGS, KVMIO, 0xa1, kvm_debugregs);
ioctl_iow_nr!(KVM_SET_DEBUGREGS, KVMIO, 0xa2, kvm_debugregs);
ioctl_io_nr!(KVM_SET_TSC_KHZ, KVMIO, 0xa2);
ioctl_io_nr!(KVM_GET_TSC_KHZ, KVMIO, 0xa3);
ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_xsave);
ioctl_iow_nr!(KVM_SET_XSAVE, KVMIO, 0xa5, kvm_xsave);
ioctl_ior_nr!(KVM_GET_XCRS, KVMIO, 0xa6, kvm_xcrs);
ioctl_iow_nr!(KVM_SET_XCRS, KVMIO, 0xa7, kvm_xcrs);
ioctl_ior_nr!(KVM_GET_XSAVE2, KVMIO, 0xcf, kvm_xsave);

/// What a vCPU thread asks of its own vCPU: run it, and read its state
/// (saving a snapshot, reporting where a guest stopped).
pub fn vcpu_thread() -> Vec<u64> {
    vec![
        KVM_RUN(),
        KVM_GET_REGS(),
        KVM_GET_SREGS(),
        KVM_TRANSLATE(),
        KVM_GET_MSRS(),
        KVM_GET_FPU(),
        KVM_GET_LAPIC(),
        KVM_GET_CPUID2(),
        KVM_GET_MP_STATE(),
        KVM_GET_VCPU_EVENTS(),
        KVM_GET_DEBUGREGS(),
        KVM_GET_TSC_KHZ(),
        KVM_GET_XSAVE(),
        KVM_GET_XSAVE2(),
        KVM_GET_XCRS(),
    ]
}

/// What the main thread asks of KVM once set up: restoring a snapshot
/// into the (pre-warmed) VM, saving one, and pmem slots.
pub fn main_thread() -> Vec<u64> {
    vec![
        KVM_CHECK_EXTENSION(),
        KVM_GET_VCPU_MMAP_SIZE(),
        KVM_GET_SUPPORTED_CPUID(),
        KVM_CREATE_VCPU(),
        KVM_SET_USER_MEMORY_REGION(),
        KVM_IRQFD(),
        KVM_GET_IRQCHIP(),
        KVM_SET_IRQCHIP(),
        KVM_GET_CLOCK(),
        KVM_SET_CLOCK(),
        KVM_GET_PIT2(),
        KVM_SET_PIT2(),
        KVM_SET_REGS(),
        KVM_SET_SREGS(),
        KVM_SET_MSRS(),
        KVM_SET_FPU(),
        KVM_SET_LAPIC(),
        KVM_SET_CPUID2(),
        KVM_SET_MP_STATE(),
        KVM_SET_VCPU_EVENTS(),
        KVM_SET_DEBUGREGS(),
        KVM_SET_TSC_KHZ(),
        KVM_SET_XSAVE(),
        KVM_SET_XCRS(),
    ]
}
