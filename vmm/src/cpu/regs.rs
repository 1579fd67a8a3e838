//! Boot-time register state: 64-bit long mode for Linux, or 16-bit real
//! mode for small hand-made test guests.

use crate::layout::{BOOT_STACK, GDT_ADDR, IDT_ADDR, PDPT_ADDR, PD_ADDR, PML4_ADDR, ZERO_PAGE};
use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs, Msrs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Errors setting up vCPU registers.
#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    /// A KVM register ioctl failed.
    #[error("{what} failed: {source}")]
    Kvm {
        /// Which ioctl.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// Writing boot tables to guest memory failed.
    #[error("cannot write {what} to guest memory: {source}")]
    Memory {
        /// What was being written.
        what: &'static str,
        /// The error.
        source: vm_memory::GuestMemoryError,
    },
    /// KVM accepted fewer MSRs than given.
    #[error("KVM refused boot MSR {0:#x}")]
    Msr(u32),
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> RegsError {
    move |source| RegsError::Kvm { what, source }
}

fn mem_err(what: &'static str) -> impl FnOnce(vm_memory::GuestMemoryError) -> RegsError {
    move |source| RegsError::Memory { what, source }
}

const X86_CR0_PE: u64 = 1;
const X86_CR0_ET: u64 = 1 << 4;
const X86_CR0_PG: u64 = 1 << 31;
const X86_CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// GDT entry from flags, base and limit (the usual packed format).
fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((u64::from(base) & 0xff00_0000) << 32)
        | ((u64::from(flags) & 0xf0ff) << 40)
        | ((u64::from(limit) & 0x000f_0000) << 32)
        | ((u64::from(base) & 0x00ff_ffff) << 16)
        | (u64::from(limit) & 0x0000_ffff)
}

fn segment(entry: u64, index: u8) -> kvm_segment {
    // Fields of at most 4 bits: masked, so they fit.
    #[allow(clippy::cast_possible_truncation)]
    let bits = |shift: u32, n: u32| ((entry >> shift) & ((1 << n) - 1)) as u8;
    kvm_segment {
        base: ((entry >> 16) & 0xff_ffff) | (((entry >> 56) & 0xff) << 24),
        // 20 bits, masked.
        #[allow(clippy::cast_possible_truncation)]
        limit: ((entry & 0xffff) | (((entry >> 48) & 0xf) << 16)) as u32,
        selector: u16::from(index) * 8,
        type_: bits(40, 4),
        present: bits(47, 1),
        dpl: bits(45, 2),
        db: bits(54, 1),
        s: bits(44, 1),
        l: bits(53, 1),
        g: bits(55, 1),
        avl: bits(52, 1),
        padding: 0,
        unusable: u8::from(bits(47, 1) == 0),
    }
}

/// Sets up 64-bit long mode with an identity map of the first 1 GiB and
/// enters the Linux kernel at `entry` with `rsi` pointing at the zero page.
pub fn setup_long_mode(
    vcpu: &VcpuFd,
    mem: &GuestMemoryMmap,
    entry: u64,
    boot_msrs: &[u32],
) -> Result<(), RegsError> {
    let gdt = [
        gdt_entry(0, 0, 0),
        gdt_entry(0xa09b, 0, 0xfffff), // 64-bit code
        gdt_entry(0xc093, 0, 0xfffff), // data
        gdt_entry(0x808b, 0, 0xfffff), // TSS
    ];
    for (i, e) in gdt.iter().enumerate() {
        mem.write_obj(*e, GuestAddress(GDT_ADDR + 8 * i as u64))
            .map_err(mem_err("GDT"))?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_ADDR))
        .map_err(mem_err("IDT"))?;
    // PML4[0] -> PDPT, PDPT[0] -> PD, PD maps 512 x 2 MiB.
    mem.write_obj(PDPT_ADDR | 0x03, GuestAddress(PML4_ADDR))
        .map_err(mem_err("PML4"))?;
    mem.write_obj(PD_ADDR | 0x03, GuestAddress(PDPT_ADDR))
        .map_err(mem_err("PDPT"))?;
    for i in 0..512u64 {
        mem.write_obj((i << 21) | 0x83, GuestAddress(PD_ADDR + i * 8))
            .map_err(mem_err("PD"))?;
    }

    let mut sregs: kvm_sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    let code = segment(gdt[1], 1);
    let data = segment(gdt[2], 2);
    sregs.gdt.base = GDT_ADDR;
    // Four 8-byte entries.
    #[allow(clippy::cast_possible_truncation)]
    let limit = (std::mem::size_of_val(&gdt) - 1) as u16;
    sregs.gdt.limit = limit;
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 7;
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment(gdt[3], 3);
    sregs.cr0 |= X86_CR0_PE | X86_CR0_ET | X86_CR0_PG;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.efer |= EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs).map_err(kvm("KVM_SET_SREGS"))?;

    let regs = kvm_regs {
        rflags: 0x2,
        rip: entry,
        rsp: BOOT_STACK,
        rbp: BOOT_STACK,
        rsi: ZERO_PAGE,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(kvm("KVM_SET_REGS"))?;
    setup_fpu(vcpu)?;
    setup_msrs(vcpu, boot_msrs)
}

/// "Flat" real mode at `entry`: all segments based at 0, data segments with
/// a 4 GiB limit so 32-bit addresses (MMIO above 1 MiB) are reachable
/// (test guests).
pub fn setup_real_mode(vcpu: &VcpuFd, entry: u16) -> Result<(), RegsError> {
    let mut sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    for seg in [&mut sregs.ds, &mut sregs.es, &mut sregs.fs, &mut sregs.gs] {
        seg.base = 0;
        seg.selector = 0;
        seg.limit = 0xffff_ffff;
        seg.g = 1;
    }
    vcpu.set_sregs(&sregs).map_err(kvm("KVM_SET_SREGS"))?;
    let regs = kvm_regs {
        rflags: 0x2,
        rip: u64::from(entry),
        rsp: 0x7000,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(kvm("KVM_SET_REGS"))?;
    setup_fpu(vcpu)
}

fn setup_fpu(vcpu: &VcpuFd) -> Result<(), RegsError> {
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(kvm("KVM_SET_FPU"))
}

/// MSRs given boot values, as (index, value).
pub const BOOT_MSRS: &[(u32, u64)] = &[
    (0x174, 0),             // IA32_SYSENTER_CS
    (0x175, 0),             // IA32_SYSENTER_ESP
    (0x176, 0),             // IA32_SYSENTER_EIP
    (0xc000_0081, 0),       // STAR
    (0xc000_0082, 0),       // LSTAR
    (0xc000_0083, 0),       // CSTAR
    (0xc000_0084, 0),       // SYSCALL_MASK
    (0xc000_0102, 0),       // KERNEL_GS_BASE
    (0x10, 0),              // TSC
    (0x1a0, 1),             // IA32_MISC_ENABLE: fast strings
    (0x2ff, (1 << 11) | 6), // MTRR default type: enabled, write-back
];

/// Sets those [`BOOT_MSRS`] that KVM lists as supported (`supported`).
fn setup_msrs(vcpu: &VcpuFd, supported: &[u32]) -> Result<(), RegsError> {
    let entries: Vec<kvm_msr_entry> = BOOT_MSRS
        .iter()
        .filter(|(i, _)| supported.contains(i))
        .map(|&(index, data)| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        })
        .collect();
    let msrs = Msrs::from_entries(&entries).map_err(|_| RegsError::Msr(0))?;
    let n = vcpu.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
    if n < entries.len() {
        return Err(RegsError::Msr(entries[n].index));
    }
    Ok(())
}

/// Routes LINT0 as ExtINT (legacy PIC) and LINT1 as NMI, as firmware would.
pub fn setup_lapic(vcpu: &VcpuFd) -> Result<(), RegsError> {
    let mut lapic = vcpu.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?;
    let set = |regs: &mut [i8; 1024], off: usize, mode: u32| {
        let mut b = [0u8; 4];
        for (i, x) in b.iter_mut().enumerate() {
            *x = regs[off + i].to_ne_bytes()[0];
        }
        let v = (u32::from_le_bytes(b) & !0x700) | (mode << 8);
        for (i, x) in v.to_le_bytes().iter().enumerate() {
            regs[off + i] = i8::from_ne_bytes([*x]);
        }
    };
    set(&mut lapic.regs, 0x350, 7); // LVT LINT0: ExtINT
    set(&mut lapic.regs, 0x360, 4); // LVT LINT1: NMI
    vcpu.set_lapic(&lapic).map_err(kvm("KVM_SET_LAPIC"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_decode() {
        let code = segment(gdt_entry(0xa09b, 0, 0xfffff), 1);
        assert_eq!(code.l, 1);
        assert_eq!(code.type_, 0xb);
        assert_eq!(code.present, 1);
        assert_eq!(code.limit, 0xfffff);
        assert_eq!(code.selector, 8);
        let data = segment(gdt_entry(0xc093, 0x1234_5678, 0xfffff), 2);
        assert_eq!(data.db, 1);
        assert_eq!(data.base, 0x1234_5678);
        assert_eq!(data.l, 0);
    }
}
