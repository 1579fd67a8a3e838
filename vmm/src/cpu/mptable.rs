//! Intel MultiProcessor table: tells a guest without ACPI about its CPUs,
//! the IOAPIC and how ISA interrupts 0..=23 are routed to it.

use crate::layout::{APIC_ADDR, IOAPIC_ADDR, IRQ_MAX, MPTABLE_ADDR};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Errors writing the MP table.
#[derive(Debug, thiserror::Error)]
pub enum MptableError {
    /// More vCPUs than one table (and the APIC ID space we use) supports.
    #[error("too many vCPUs for the MP table: {0} (max 254)")]
    TooManyCpus(u8),
    /// The table does not fit in guest memory.
    #[error("cannot write MP table to guest memory: {0}")]
    Write(vm_memory::GuestMemoryError),
}

const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;

fn checksum(b: &[u8]) -> u8 {
    b.iter().fold(0u8, |a, &x| a.wrapping_sub(x))
}

/// Builds the table bytes for `cpus` vCPUs, placed at `base`.
pub fn build(cpus: u8, base: u64) -> Result<Vec<u8>, MptableError> {
    if cpus == 0 || cpus > 254 {
        return Err(MptableError::TooManyCpus(cpus));
    }
    let ioapic_id = cpus + 1;
    let mut entries: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for id in 0..cpus {
        let flags = 1 | if id == 0 { 2 } else { 0 }; // enabled, boot processor
        entries.extend_from_slice(&[0, id, APIC_VERSION, flags]);
        entries.extend_from_slice(&0x600u32.to_le_bytes()); // signature: family 6
        entries.extend_from_slice(&0x201u32.to_le_bytes()); // FPU + APIC
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[1, 0]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    entries.extend_from_slice(&[2, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&IOAPIC_ADDR.to_le_bytes());
    count += 1;
    for irq in (0..=IRQ_MAX).filter_map(|i| u8::try_from(i).ok()) {
        // I/O interrupt: INT type, conforming polarity/trigger, bus 0.
        entries.extend_from_slice(&[3, 0, 0, 0, 0, irq, ioapic_id, irq]);
        count += 1;
    }
    // Local interrupts: ExtINT to LINT0 of the BSP, NMI to LINT1 of all.
    entries.extend_from_slice(&[4, 3, 0, 0, 0, 0, 0, 0]);
    entries.extend_from_slice(&[4, 1, 0, 0, 0, 0, 0xff, 1]);
    count += 2;

    let hdr_len = 44usize;
    let table_len = hdr_len + entries.len();
    let mut table = Vec::with_capacity(table_len);
    table.extend_from_slice(b"PCMP");
    // 44 + 8 bytes per entry, a few hundred bytes for 254 vCPUs.
    #[allow(clippy::cast_possible_truncation)]
    let table_len_u16 = table_len as u16;
    table.extend_from_slice(&table_len_u16.to_le_bytes());
    table.push(4); // spec revision 1.4
    table.push(0); // checksum, filled below
    table.extend_from_slice(b"SHOAL   ");
    table.extend_from_slice(b"MICROVM     ");
    table.extend_from_slice(&0u32.to_le_bytes()); // OEM table pointer
    table.extend_from_slice(&0u16.to_le_bytes()); // OEM table size
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&APIC_ADDR.to_le_bytes());
    table.extend_from_slice(&[0; 4]); // extended length, checksum, reserved
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    let mut fp = Vec::with_capacity(16);
    fp.extend_from_slice(b"_MP_");
    let table_addr = u32::try_from(base + 16).map_err(|_| MptableError::TooManyCpus(cpus))?;
    fp.extend_from_slice(&table_addr.to_le_bytes());
    fp.extend_from_slice(&[1, 4, 0, 0, 0, 0, 0, 0]); // length 1 x 16 bytes, rev 1.4
    fp[10] = checksum(&fp);

    fp.extend_from_slice(&table);
    Ok(fp)
}

/// Writes the MP table for `cpus` vCPUs into guest memory.
pub fn write(mem: &GuestMemoryMmap, cpus: u8) -> Result<(), MptableError> {
    let bytes = build(cpus, MPTABLE_ADDR)?;
    mem.write_slice(&bytes, GuestAddress(MPTABLE_ADDR))
        .map_err(MptableError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_and_counts() {
        let t = build(2, MPTABLE_ADDR).unwrap();
        assert_eq!(&t[0..4], b"_MP_");
        assert_eq!(t[..16].iter().fold(0u8, |a, &b| a.wrapping_add(b)), 0);
        let table = &t[16..];
        let len = u16::from_le_bytes([table[4], table[5]]) as usize;
        assert_eq!(len, table.len());
        assert_eq!(table.iter().fold(0u8, |a, &b| a.wrapping_add(b)), 0);
        let count = u16::from_le_bytes([table[34], table[35]]);
        assert_eq!(count, 2 + 1 + 1 + 24 + 2);
        assert!(build(0, 0).is_err());
        assert!(build(255, 0).is_err());
        // Fits below the end of base memory.
        assert!(MPTABLE_ADDR + build(254, MPTABLE_ADDR).unwrap().len() as u64 <= 0x10_0000);
    }
}
