//! Where pmem devices go in guest-physical space, and why there.
//!
//! ## Alignment
//!
//! A Linux guest maps a virtio-pmem range through the pmem block driver:
//! `virtio_pmem` registers the range as an nvdimm region with
//! `ND_REGION_PAGEMAP`, so on a kernel with ZONE_DEVICE the label-less raw
//! namespace on it is mapped with `struct page`s by `devm_memremap_pages()`,
//! and only then does the disk get `QUEUE_FLAG_DAX`. Two checks in Linux 6.1
//! set the alignment:
//!
//! * `nvdimm_namespace_common_probe()` (drivers/nvdimm/namespace_devs.c)
//!   refuses a namespace whose start or end is not a multiple of
//!   `memremap_compat_align()` — `SUBSECTION_SIZE`, 2 MiB, on x86-64 — with
//!   "misaligned, unable to map", and `/dev/pmem0` never appears (checked on
//!   the 6.1 guest: a start 1 MiB off, or a 3 MiB image, gives exactly that);
//! * `memremap_pages()` hot-adds the range with `arch_add_memory()`, whose
//!   `check_pfn_span()` (mm/memory_hotplug.c) needs sub-section (2 MiB)
//!   granularity with `SPARSEMEM_VMEMMAP` (which ZONE_DEVICE requires), a
//!   whole 128 MiB section only without it. Sub-section hotplug exists since
//!   Linux 5.3.
//!
//! So a 6.1 guest needs the **size** to be a multiple of 2 MiB
//! ([`IMAGE_ALIGN`]; images are padded to it by `shoal image build`) and the
//! **start** to be 2 MiB-aligned at least. 128 MiB (memory-block) alignment
//! is *not* needed: ZONE_DEVICE memory is never onlined as memory blocks.
//!
//! Starts are placed on 128 MiB ([`PLACEMENT_ALIGN`], one x86-64 memory
//! section) anyway: guest-physical space above RAM costs nothing, and a
//! device that shares no section with RAM or with another device avoids
//! every mixed-section corner of the kernel (`pmem_should_map_pages()` drops
//! the page map when a namespace is `REGION_MIXED` with System RAM, and
//! early "boot" sections get special-cased memmap handling).
//!
//! ## Range
//!
//! Devices go above 4 GiB and above all RAM, so they never overlap RAM or
//! the 32-bit MMIO gap (`0xc000_0000..0x1_0000_0000`) where the virtio-mmio
//! windows, IOAPIC and LAPIC live, and end below [`PHYS_LIMIT`].

use serde::{Deserialize, Serialize};

/// Size granularity of a pmem image (and so of a device): one Linux memory
/// sub-section, the unit `memremap_pages()` can hot-add with
/// `SPARSEMEM_VMEMMAP`.
pub const IMAGE_ALIGN: u64 = 2 << 20;

/// One x86-64 memory section (`SECTION_SIZE_BITS` = 27).
pub const SECTION_SIZE: u64 = 128 << 20;

/// Alignment of each device's start address chosen by [`place`].
pub const PLACEMENT_ALIGN: u64 = SECTION_SIZE;

/// Start of the 32-bit MMIO gap (same value as `vmm::layout::MMIO_GAP_START`).
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// End of the 32-bit MMIO gap: 4 GiB (same as `vmm::layout::MMIO_GAP_END`).
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;

/// Highest guest-physical address (exclusive) [`place`] uses: 512 GiB, the
/// smallest physical address width of x86-64 hosts KVM runs on (39 bits on
/// Intel client parts; the guest sees the host's width). Far below the guest
/// kernel's own limit (46 bits with 4-level paging) and within the default
/// KASLR direct-map padding above RAM.
pub const PHYS_LIMIT: u64 = 1 << 39;

/// A guest-physical range `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestRange {
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

impl GuestRange {
    /// One past the last byte, or `None` if that overflows.
    pub fn end(&self) -> Option<u64> {
        self.start.checked_add(self.len)
    }

    fn overlaps(&self, start: u64, len: u64) -> bool {
        let a_end = u128::from(self.start) + u128::from(self.len);
        let b_end = u128::from(start) + u128::from(len);
        u128::from(self.start) < b_end && u128::from(start) < a_end
    }
}

/// Why a set of pmem ranges cannot be placed or was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// A size is zero or not a multiple of [`IMAGE_ALIGN`].
    #[error(
        "pmem device {index}: size {len:#x} is not a non-zero multiple of 2 MiB \
         (pad the image with `shoal image build`)"
    )]
    BadSize {
        /// Device index.
        index: usize,
        /// The size.
        len: u64,
    },
    /// A start address is not 2 MiB-aligned.
    #[error("pmem device {index}: guest address {start:#x} is not 2 MiB-aligned")]
    Misaligned {
        /// Device index.
        index: usize,
        /// The address.
        start: u64,
    },
    /// A device overlaps guest RAM.
    #[error(
        "pmem device {index} [{start:#x}, +{len:#x}) overlaps guest RAM \
         [{ram_start:#x}, +{ram_len:#x})"
    )]
    OverlapsRam {
        /// Device index.
        index: usize,
        /// Device start.
        start: u64,
        /// Device length.
        len: u64,
        /// RAM range start.
        ram_start: u64,
        /// RAM range length.
        ram_len: u64,
    },
    /// A device overlaps the 32-bit MMIO gap.
    #[error("pmem device {index} [{start:#x}, +{len:#x}) overlaps the 32-bit MMIO gap")]
    OverlapsGap {
        /// Device index.
        index: usize,
        /// Device start.
        start: u64,
        /// Device length.
        len: u64,
    },
    /// Two devices overlap.
    #[error("pmem devices {a} and {b} overlap")]
    OverlapsDevice {
        /// First device.
        a: usize,
        /// Second device.
        b: usize,
    },
    /// The devices do not fit below the limit.
    #[error(
        "pmem device {index} would end at {end:#x}, beyond the guest-physical \
         limit {limit:#x}"
    )]
    OutOfSpace {
        /// Device index.
        index: usize,
        /// Where it would end (saturated).
        end: u64,
        /// The limit.
        limit: u64,
    },
}

fn align_up(v: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    v.checked_add(align - 1).map(|x| x & !(align - 1))
}

/// Places devices of `sizes` bytes above all of `ram` (`(start, len)` ranges,
/// e.g. `vmm::layout::ram_ranges(mem)`) and above 4 GiB, each on a
/// [`PLACEMENT_ALIGN`] boundary, in order, below [`PHYS_LIMIT`].
///
/// Deterministic: the same RAM and sizes give the same addresses (a restored
/// VM still takes its addresses from the snapshot, not from here).
pub fn place(ram: &[(u64, u64)], sizes: &[u64]) -> Result<Vec<GuestRange>, LayoutError> {
    place_within(ram, sizes, PHYS_LIMIT)
}

/// [`place`] with an explicit guest-physical `limit` (exclusive).
pub fn place_within(
    ram: &[(u64, u64)],
    sizes: &[u64],
    limit: u64,
) -> Result<Vec<GuestRange>, LayoutError> {
    let ram_end = ram
        .iter()
        .map(|&(s, l)| s.saturating_add(l))
        .max()
        .unwrap_or(0);
    let mut cursor = align_up(ram_end.max(MMIO_GAP_END), PLACEMENT_ALIGN).unwrap_or(u64::MAX);
    let mut out = Vec::with_capacity(sizes.len());
    for (index, &len) in sizes.iter().enumerate() {
        if len == 0 || !len.is_multiple_of(IMAGE_ALIGN) {
            return Err(LayoutError::BadSize { index, len });
        }
        let end = cursor.checked_add(len).filter(|&e| e <= limit);
        let Some(end) = end else {
            return Err(LayoutError::OutOfSpace {
                index,
                end: cursor.saturating_add(len),
                limit,
            });
        };
        out.push(GuestRange { start: cursor, len });
        cursor = align_up(end, PLACEMENT_ALIGN).unwrap_or(u64::MAX);
    }
    check_placement_within(ram, &out, limit)?;
    Ok(out)
}

/// Checks ranges the VMM got elsewhere (a snapshot, a config): each is a
/// non-empty multiple of 2 MiB, starts 2 MiB-aligned, ends below
/// [`PHYS_LIMIT`], and overlaps neither `ram`, the MMIO gap nor another.
pub fn check_placement(ram: &[(u64, u64)], ranges: &[GuestRange]) -> Result<(), LayoutError> {
    check_placement_within(ram, ranges, PHYS_LIMIT)
}

/// [`check_placement`] with an explicit limit.
pub fn check_placement_within(
    ram: &[(u64, u64)],
    ranges: &[GuestRange],
    limit: u64,
) -> Result<(), LayoutError> {
    for (index, r) in ranges.iter().enumerate() {
        if r.len == 0 || !r.len.is_multiple_of(IMAGE_ALIGN) {
            return Err(LayoutError::BadSize { index, len: r.len });
        }
        if !r.start.is_multiple_of(IMAGE_ALIGN) {
            return Err(LayoutError::Misaligned {
                index,
                start: r.start,
            });
        }
        match r.end() {
            Some(end) if end <= limit => {}
            _ => {
                return Err(LayoutError::OutOfSpace {
                    index,
                    end: r.start.saturating_add(r.len),
                    limit,
                })
            }
        }
        if let Some(&(ram_start, ram_len)) = ram.iter().find(|&&(s, l)| r.overlaps(s, l)) {
            return Err(LayoutError::OverlapsRam {
                index,
                start: r.start,
                len: r.len,
                ram_start,
                ram_len,
            });
        }
        if r.overlaps(MMIO_GAP_START, MMIO_GAP_END - MMIO_GAP_START) {
            return Err(LayoutError::OverlapsGap {
                index,
                start: r.start,
                len: r.len,
            });
        }
        if let Some(a) = ranges[..index]
            .iter()
            .position(|o| r.overlaps(o.start, o.len))
        {
            return Err(LayoutError::OverlapsDevice { a, b: index });
        }
    }
    Ok(())
}

/// Guest RAM the guest kernel spends on `struct page`s for a pmem device of
/// `len` bytes in raw (ZONE_DEVICE, memmap-in-RAM) mode: 64 bytes per 4 KiB
/// page, i.e. `len / 64` (16 MiB per GiB of image). Size guest RAM for it.
pub fn guest_memmap_overhead(len: u64) -> u64 {
    len / 64
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
