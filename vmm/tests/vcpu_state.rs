//! vCPU state save -> restore on /dev/kvm, without a guest: what a restored
//! vCPU holds must equal what was saved, including state KVM only accepts
//! in a particular order.

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use shoal_test_support::kvm;
use snapshot::Persist;
use vmm::persist::{readable_msrs, VcpuRef, VcpuState};

const MSR_IA32_TSC: u32 = 0x10;
const MSR_TSC_DEADLINE: u32 = 0x6e0;
const APIC_LVTT: usize = 0x320;
/// LVT timer: vector 0xec, TSC-deadline mode (bits 17-18 = 0b10).
const LVTT_TSC_DEADLINE: u32 = 0xec | (0b10 << 17);

fn vm_and_vcpu(kvm: &Kvm) -> (VmFd, VcpuFd) {
    let vm = kvm.create_vm().expect("create VM");
    vm.create_irq_chip().expect("in-kernel irqchip");
    let vcpu = vm.create_vcpu(0).expect("create vCPU");
    let cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .expect("supported CPUID");
    vcpu.set_cpuid2(&cpuid).expect("set CPUID");
    (vm, vcpu)
}

fn get_msr(vcpu: &VcpuFd, index: u32) -> u64 {
    let mut m = Msrs::from_entries(&[kvm_msr_entry {
        index,
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(vcpu.get_msrs(&mut m).expect("KVM_GET_MSRS"), 1);
    m.as_slice()[0].data
}

fn set_msr(vcpu: &VcpuFd, index: u32, data: u64) {
    let m = Msrs::from_entries(&[kvm_msr_entry {
        index,
        data,
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(vcpu.set_msrs(&m).expect("KVM_SET_MSRS"), 1);
}

fn save(vcpu: &VcpuFd) -> VcpuState {
    let list = readable_msrs(vcpu, &[MSR_IA32_TSC, MSR_TSC_DEADLINE]);
    assert_eq!(list, [MSR_IA32_TSC, MSR_TSC_DEADLINE]);
    VcpuRef {
        fd: vcpu,
        msr_list: &list,
        xsave: false,
    }
    .save()
    .expect("save vCPU")
}

/// A guest that armed its TSC-deadline timer must find it armed after a
/// restore into a fresh vCPU (KVM drops the deadline MSR while the LAPIC
/// timer is not yet in TSC-deadline mode, so the order matters; a lost
/// deadline leaves a tickless guest idle forever).
#[test]
fn armed_tsc_deadline_survives_restore_into_a_fresh_vcpu() {
    let kvm = kvm();
    let (_vm, vcpu) = vm_and_vcpu(&kvm);
    let mut lapic = vcpu.get_lapic().expect("get LAPIC");
    for (i, b) in LVTT_TSC_DEADLINE.to_le_bytes().iter().enumerate() {
        lapic.regs[APIC_LVTT + i] = std::os::raw::c_char::from_ne_bytes([*b]);
    }
    vcpu.set_lapic(&lapic).expect("set LAPIC");
    // Far in the future: it must not fire during the test.
    let deadline = get_msr(&vcpu, MSR_IA32_TSC) + (1u64 << 44);
    set_msr(&vcpu, MSR_TSC_DEADLINE, deadline);
    assert_eq!(get_msr(&vcpu, MSR_TSC_DEADLINE), deadline, "armed");
    let state = save(&vcpu);

    let (_vm2, fresh) = vm_and_vcpu(&kvm);
    <VcpuRef<'_> as Persist>::restore(
        VcpuRef {
            fd: &fresh,
            msr_list: &[],
            xsave: false,
        },
        &state,
    )
    .expect("restore vCPU");
    assert_eq!(
        get_msr(&fresh, MSR_TSC_DEADLINE),
        deadline,
        "the restored vCPU lost its armed TSC deadline"
    );
}
