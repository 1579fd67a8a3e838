//! Saved state of vCPUs and of the VM-wide KVM devices (PIC, IOAPIC, PIT,
//! kvmclock), and the snapshot directory's top-level state.

use crate::cpu::CpuProfile;
use devices::serial::SerialState;
use devices::virtio::persist::MmioState;
use kvm_bindings::{
    kvm_clock_data, kvm_cpuid_entry2, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state,
    kvm_msr_entry, kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
    CpuId, Msrs, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::{VcpuFd, VmFd};
use serde::{Deserialize, Serialize};
use snapshot::Persist;

/// Errors saving or restoring KVM state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A KVM ioctl failed.
    #[error("{what} failed: {source}")]
    Kvm {
        /// Which ioctl.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// KVM accepted only part of the saved MSRs.
    #[error("KVM refused saved MSR {0:#x}")]
    Msr(u32),
    /// A saved byte image has the wrong size.
    #[error(transparent)]
    Pod(#[from] snapshot::PodError),
    /// Too many saved entries.
    #[error("saved {0} has too many entries")]
    TooMany(&'static str),
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> StateError {
    move |source| StateError::Kvm { what, source }
}

/// Everything KVM holds for one vCPU.
#[derive(Serialize, Deserialize)]
pub struct VcpuState {
    /// CPUID table.
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// MSRs (index, value), in restore order.
    pub msrs: Vec<(u32, u64)>,
    /// General registers.
    pub regs: kvm_regs,
    /// Special registers.
    pub sregs: kvm_sregs,
    /// Legacy FPU image (`kvm_fpu` bytes), used when XSAVE is unavailable.
    pub fpu: Vec<u8>,
    /// XSAVE area, where KVM supports it.
    pub xsave: Option<kvm_xsave>,
    /// Extended control registers, where supported.
    pub xcrs: Option<kvm_xcrs>,
    /// Debug registers.
    pub debugregs: kvm_debugregs,
    /// Local APIC.
    pub lapic: kvm_lapic_state,
    /// Multiprocessing state.
    pub mp_state: kvm_mp_state,
    /// Pending events (exceptions, interrupts, NMIs).
    pub events: kvm_vcpu_events,
    /// TSC frequency (kHz), where readable.
    pub tsc_khz: Option<u32>,
}

/// MSR written last: writing it before the TSC would arm a stale deadline.
const MSR_TSC_DEADLINE: u32 = 0x6e0;
const MAX_SAVED_MSRS: usize = 1024;

/// A vCPU together with what saving it needs.
pub struct VcpuRef<'a> {
    /// The vCPU.
    pub fd: &'a VcpuFd,
    /// MSR indices to save (KVM's saveable list, probed).
    pub msr_list: &'a [u32],
    /// Whether KVM supports XSAVE/XCRS ioctls.
    pub xsave: bool,
}

/// Indices from `candidates` that `fd` can read (KVM stops a batch at the
/// first unreadable MSR, so probe and drop those).
pub fn readable_msrs(fd: &VcpuFd, candidates: &[u32]) -> Vec<u32> {
    let mut list: Vec<u32> = candidates.to_vec();
    let mut ok = Vec::with_capacity(list.len());
    while !list.is_empty() {
        let entries: Vec<kvm_msr_entry> = list
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let Ok(mut msrs) = Msrs::from_entries(&entries) else {
            break;
        };
        let n = fd.get_msrs(&mut msrs).unwrap_or(0);
        ok.extend_from_slice(&list[..n]);
        // list[n] failed; continue after it.
        list.drain(..(n + 1).min(list.len()));
    }
    ok
}

impl<'a> Persist for VcpuRef<'a> {
    type State = VcpuState;
    /// The freshly created vCPU to load the state into.
    type ConstructorArgs = VcpuRef<'a>;
    type Error = StateError;

    fn save(&self) -> Result<VcpuState, StateError> {
        let fd = self.fd;
        let entries: Vec<kvm_msr_entry> = self
            .msr_list
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|_| StateError::TooMany("MSR list"))?;
        let n = fd.get_msrs(&mut msrs).map_err(kvm("KVM_GET_MSRS"))?;
        if n < entries.len() {
            return Err(StateError::Msr(entries[n].index));
        }
        let mut msr_vals: Vec<(u32, u64)> =
            msrs.as_slice().iter().map(|e| (e.index, e.data)).collect();
        msr_vals.sort_by_key(|&(i, _)| i == MSR_TSC_DEADLINE);
        let fpu = fd.get_fpu().map_err(kvm("KVM_GET_FPU"))?;
        Ok(VcpuState {
            cpuid: fd
                .get_cpuid2(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
                .map_err(kvm("KVM_GET_CPUID2"))?
                .as_slice()
                .to_vec(),
            msrs: msr_vals,
            regs: fd.get_regs().map_err(kvm("KVM_GET_REGS"))?,
            sregs: fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?,
            // SAFETY: kvm_fpu is a repr(C) struct of integer fields and arrays.
            fpu: unsafe { snapshot::pod_to_bytes(&fpu) },
            xsave: if self.xsave {
                Some(fd.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?)
            } else {
                None
            },
            xcrs: if self.xsave { fd.get_xcrs().ok() } else { None },
            debugregs: fd.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?,
            lapic: fd.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?,
            mp_state: fd.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?,
            events: fd.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?,
            tsc_khz: fd.get_tsc_khz().ok(),
        })
    }

    fn restore(args: VcpuRef<'a>, s: &VcpuState) -> Result<Self, StateError> {
        restore_vcpu(args.fd, s)?;
        Ok(args)
    }
}

/// Loads `s` into a freshly created vCPU, in the order KVM needs.
fn restore_vcpu(fd: &VcpuFd, s: &VcpuState) -> Result<(), StateError> {
    if s.cpuid.len() > kvm_bindings::KVM_MAX_CPUID_ENTRIES {
        return Err(StateError::TooMany("CPUID"));
    }
    let cpuid = CpuId::from_entries(&s.cpuid).map_err(|_| StateError::TooMany("CPUID"))?;
    fd.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
    if let Some(khz) = s.tsc_khz {
        if fd.get_tsc_khz().ok() != Some(khz) {
            // Scaling may be unsupported; the guest then sees the host rate.
            let _ = fd.set_tsc_khz(khz);
        }
    }
    if s.msrs.len() > MAX_SAVED_MSRS {
        return Err(StateError::TooMany("MSR"));
    }
    // The TSC deadline is written after the LAPIC: KVM ignores the MSR
    // while the LVT timer is not in TSC-deadline mode, which a fresh vCPU's
    // is not until KVM_SET_LAPIC, so written earlier an armed guest timer
    // would be lost and the restored guest would wait for it forever.
    let deadline = s.msrs.iter().find(|(i, _)| *i == MSR_TSC_DEADLINE);
    let entries: Vec<kvm_msr_entry> = s
        .msrs
        .iter()
        .filter(|(i, _)| *i != MSR_TSC_DEADLINE)
        .map(|&(index, data)| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        })
        .collect();
    let msrs = Msrs::from_entries(&entries).map_err(|_| StateError::TooMany("MSR"))?;
    let n = fd.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
    if n < entries.len() {
        return Err(StateError::Msr(entries[n].index));
    }
    fd.set_regs(&s.regs).map_err(kvm("KVM_SET_REGS"))?;
    fd.set_sregs(&s.sregs).map_err(kvm("KVM_SET_SREGS"))?;
    match &s.xsave {
        // SAFETY: the buffer is a whole kvm_xsave read back from KVM_GET_XSAVE
        // (its size is fixed by the type), so KVM reads only inside it.
        Some(x) => unsafe { fd.set_xsave(x) }.map_err(kvm("KVM_SET_XSAVE"))?,
        None => {
            // SAFETY: kvm_fpu is integers only; any bytes are a valid value.
            let fpu: kvm_bindings::kvm_fpu =
                unsafe { snapshot::pod_from_bytes("kvm_fpu", &s.fpu)? };
            fd.set_fpu(&fpu).map_err(kvm("KVM_SET_FPU"))?;
        }
    }
    if let Some(x) = &s.xcrs {
        fd.set_xcrs(x).map_err(kvm("KVM_SET_XCRS"))?;
    }
    fd.set_debug_regs(&s.debugregs)
        .map_err(kvm("KVM_SET_DEBUGREGS"))?;
    fd.set_lapic(&s.lapic).map_err(kvm("KVM_SET_LAPIC"))?;
    if let Some(&(index, data)) = deadline {
        let e = [kvm_msr_entry {
            index,
            data,
            ..Default::default()
        }];
        let msrs = Msrs::from_entries(&e).map_err(|_| StateError::TooMany("MSR"))?;
        if fd.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))? != 1 {
            return Err(StateError::Msr(index));
        }
    }
    fd.set_mp_state(s.mp_state)
        .map_err(kvm("KVM_SET_MP_STATE"))?;
    fd.set_vcpu_events(&s.events)
        .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
    Ok(())
}

/// VM-wide in-kernel device state.
#[derive(Clone, Serialize, Deserialize)]
pub struct VmState {
    /// Master 8259.
    pub pic_master: kvm_irqchip,
    /// Slave 8259.
    pub pic_slave: kvm_irqchip,
    /// IOAPIC.
    pub ioapic: kvm_irqchip,
    /// 8254 PIT.
    pub pit: kvm_pit_state2,
    /// kvmclock.
    pub clock: kvm_clock_data,
}

fn chip(vm: &VmFd, id: u32) -> Result<kvm_irqchip, StateError> {
    let mut c = kvm_irqchip {
        chip_id: id,
        ..Default::default()
    };
    vm.get_irqchip(&mut c).map_err(kvm("KVM_GET_IRQCHIP"))?;
    Ok(c)
}

/// The VM's KVM file descriptor, for saving and restoring VM-wide state.
pub struct VmRef<'a>(pub &'a VmFd);

impl<'a> Persist for VmRef<'a> {
    type State = VmState;
    /// The VM (irqchip and PIT created) to load the state into.
    type ConstructorArgs = VmRef<'a>;
    type Error = StateError;

    fn save(&self) -> Result<VmState, StateError> {
        let vm = self.0;
        Ok(VmState {
            pic_master: chip(vm, KVM_IRQCHIP_PIC_MASTER)?,
            pic_slave: chip(vm, KVM_IRQCHIP_PIC_SLAVE)?,
            ioapic: chip(vm, KVM_IRQCHIP_IOAPIC)?,
            pit: vm.get_pit2().map_err(kvm("KVM_GET_PIT2"))?,
            clock: vm.get_clock().map_err(kvm("KVM_GET_CLOCK"))?,
        })
    }

    fn restore(args: VmRef<'a>, s: &VmState) -> Result<Self, StateError> {
        restore_vm(args.0, s)?;
        Ok(args)
    }
}

/// Loads `s` into a VM whose irqchip and PIT exist.
fn restore_vm(vm: &VmFd, s: &VmState) -> Result<(), StateError> {
    for (c, id) in [
        (&s.pic_master, KVM_IRQCHIP_PIC_MASTER),
        (&s.pic_slave, KVM_IRQCHIP_PIC_SLAVE),
        (&s.ioapic, KVM_IRQCHIP_IOAPIC),
    ] {
        let mut c = *c;
        c.chip_id = id; // never trust the saved id to pick the chip
        vm.set_irqchip(&c).map_err(kvm("KVM_SET_IRQCHIP"))?;
    }
    vm.set_pit2(&s.pit).map_err(kvm("KVM_SET_PIT2"))?;
    let mut clock = s.clock;
    // Only the clock value is restored; host-specific flags are not.
    clock.flags = 0;
    vm.set_clock(&clock).map_err(kvm("KVM_SET_CLOCK"))?;
    Ok(())
}

/// Identity of the host a snapshot was taken on; restore refuses others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// `shoal-vmm` version that wrote it.
    pub vmm_version: String,
    /// "hardware" or "pvm".
    pub host_kvm: String,
    /// CPU profile the guest ran with.
    pub cpu_profile: CpuProfile,
    /// Guest RAM bytes.
    pub memory_bytes: u64,
    /// vCPU count.
    pub vcpus: u8,
}

/// Everything in a snapshot's `state` file.
#[derive(Serialize, Deserialize)]
pub struct SnapshotState {
    /// Host and shape.
    pub meta: SnapshotMeta,
    /// The VM's configuration (JSON).
    pub config_json: String,
    /// In-kernel devices and clock.
    pub vm: VmState,
    /// One per vCPU.
    pub vcpus: Vec<VcpuState>,
    /// COM1.
    pub serial: SerialState,
    /// One per virtio-mmio device, in slot order.
    pub virtio: Vec<MmioState>,
    /// Guest RAM regions (guest address, length), in `memory` file order.
    pub memory_regions: Vec<(u64, u64)>,
    /// Host connections were open on the vsock device when the snapshot was
    /// taken: the restored guest must be told (TRANSPORT_RESET) that they
    /// are gone. Without any, the reset (a guest round trip) is skipped.
    pub vsock_had_connections: bool,
    /// For a diff snapshot: the full snapshot whose `memory` this one's
    /// `memory.diff` pages apply to.
    pub diff_base: Option<std::path::PathBuf>,
    /// For a diff snapshot: the memory-file page numbers in `memory.diff`.
    pub diff_pages: Vec<u64>,
    /// One per virtio-pmem device, in order (their transports are the last
    /// entries of `virtio`). Images are not copied: restore maps the same
    /// files again and refuses changed ones.
    pub pmem: Vec<pmem::PmemState>,
}
