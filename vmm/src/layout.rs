//! Guest-physical memory layout for x86-64 microVMs.

/// GDT location (boot-time, replaced by the kernel).
pub const GDT_ADDR: u64 = 0x500;
/// IDT location (empty, boot-time).
pub const IDT_ADDR: u64 = 0x520;
/// Linux boot parameters ("zero page").
pub const ZERO_PAGE: u64 = 0x7000;
/// Initial stack pointer.
pub const BOOT_STACK: u64 = 0x8ff0;
/// Identity-map page tables: PML4, PDPT, PD.
pub const PML4_ADDR: u64 = 0x9000;
/// Page-directory-pointer table.
pub const PDPT_ADDR: u64 = 0xa000;
/// Page directory (512 x 2 MiB = first 1 GiB).
pub const PD_ADDR: u64 = 0xb000;
/// Kernel command line.
pub const CMDLINE_ADDR: u64 = 0x20000;
/// Longest command line the x86 kernel accepts (COMMAND_LINE_SIZE).
pub const CMDLINE_MAX: usize = 2048;
/// The boot protocol's `setup_data` chain (one entry: the RNG seed), in the
/// page after the command line.
pub const SETUP_DATA_ADDR: u64 = 0x21000;
/// MP floating pointer and configuration table (in the EBDA).
pub const MPTABLE_ADDR: u64 = 0x9fc00;
/// End of the low RAM range given to the guest in e820.
pub const LOW_RAM_END: u64 = 0x9fc00;
/// Start of RAM above the legacy hole; the kernel loads here or higher.
pub const HIGH_RAM_START: u64 = 0x10_0000;
/// Start of the 32-bit MMIO gap.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// End of the 32-bit MMIO gap (4 GiB).
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// First virtio-mmio device window.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// First interrupt used by virtio devices (0-4 are legacy devices).
pub const VIRTIO_IRQ_BASE: u32 = 5;
/// Highest IOAPIC pin.
pub const IRQ_MAX: u32 = 23;
/// IOAPIC MMIO base.
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
/// Local APIC MMIO base.
pub const APIC_ADDR: u32 = 0xfee0_0000;
/// KVM's TSS (3 pages, inside the MMIO gap, unused by devices).
pub const KVM_TSS_ADDR: usize = 0xfffb_d000;

/// RAM ranges `(start, len)` for a guest of `mem_bytes`, skipping the MMIO gap.
pub fn ram_ranges(mem_bytes: u64) -> Vec<(u64, u64)> {
    if mem_bytes <= MMIO_GAP_START {
        vec![(0, mem_bytes)]
    } else {
        vec![
            (0, MMIO_GAP_START),
            (MMIO_GAP_END, mem_bytes - MMIO_GAP_START),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_skip_gap() {
        assert_eq!(ram_ranges(128 << 20), vec![(0, 128 << 20)]);
        let r = ram_ranges(4 << 30);
        assert_eq!(r[0], (0, MMIO_GAP_START));
        assert_eq!(r[1], (MMIO_GAP_END, (4 << 30) - MMIO_GAP_START));
        assert!(VIRTIO_MMIO_BASE >= MMIO_GAP_START && VIRTIO_MMIO_BASE < u64::from(IOAPIC_ADDR));
    }
}
