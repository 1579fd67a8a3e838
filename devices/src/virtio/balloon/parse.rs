//! Pure checks on what the guest hands the balloon: PFNs and reported
//! ranges against guest memory (coalesced into ranges that each lie in one
//! region), and stats buffers.

use super::{MAX_STATS_ENTRIES, PAGE_SIZE};
use serde::{Deserialize, Serialize};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// A page-aligned guest range inside one guest memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRange {
    /// Guest-physical start.
    pub addr: u64,
    /// Length in bytes (a multiple of [`PAGE_SIZE`], not zero).
    pub len: u64,
}

/// Why a guest range was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Zero length.
    #[error("empty range")]
    Empty,
    /// Start or length not a multiple of the page size.
    #[error("range {addr:#x}+{len:#x} is not page aligned")]
    Unaligned {
        /// Start.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// Not inside one guest memory region (outside memory, over a hole,
    /// or wrapping the address space).
    #[error("range {addr:#x}+{len:#x} is not inside guest memory")]
    Outside {
        /// Start.
        addr: u64,
        /// Length.
        len: u64,
    },
}

/// Start of the region holding all of `[addr, addr + len)`, if one does.
fn region_of(mem: &GuestMemoryMmap, addr: u64, len: u64) -> Option<u64> {
    let end = addr.checked_add(len)?;
    let r = mem.find_region(GuestAddress(addr))?;
    let start = r.start_addr().0;
    let r_end = start.checked_add(r.len())?;
    (end <= r_end).then_some(start)
}

/// Checks a reported range: not empty, page aligned, inside one region.
pub fn check_range(mem: &GuestMemoryMmap, addr: u64, len: u64) -> Result<PageRange, RangeError> {
    if len == 0 {
        return Err(RangeError::Empty);
    }
    if !addr.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
        return Err(RangeError::Unaligned { addr, len });
    }
    region_of(mem, addr, len).ok_or(RangeError::Outside { addr, len })?;
    Ok(PageRange { addr, len })
}

/// Joins PFNs, in the order given, into ranges: a page right after the
/// current range and in the same region extends it.
#[derive(Debug, Default)]
pub struct Coalescer {
    cur: Option<(PageRange, u64)>,
}

impl Coalescer {
    /// Adds PFN `pfn`: `Err` if its page is not inside guest memory;
    /// `Ok(Some(r))` when it closes range `r` (which the caller gives back).
    pub fn push(
        &mut self,
        mem: &GuestMemoryMmap,
        pfn: u32,
    ) -> Result<Option<PageRange>, RangeError> {
        let addr = u64::from(pfn) * PAGE_SIZE;
        let region = region_of(mem, addr, PAGE_SIZE).ok_or(RangeError::Outside {
            addr,
            len: PAGE_SIZE,
        })?;
        if let Some((r, reg)) = &mut self.cur {
            if *reg == region && r.addr + r.len == addr {
                r.len += PAGE_SIZE;
                return Ok(None);
            }
        }
        let done = self.cur.replace((
            PageRange {
                addr,
                len: PAGE_SIZE,
            },
            region,
        ));
        Ok(done.map(|(r, _)| r))
    }

    /// The range still open.
    pub fn finish(self) -> Option<PageRange> {
        self.cur.map(|(r, _)| r)
    }
}

/// Bytes of one stats entry: le16 tag, le64 value (packed).
pub const STATS_ENTRY_LEN: usize = 10;

/// The guest's memory statistics (virtio 1.2, 5.5.6.3, and the tags Linux
/// added since), latest value of each; `None` until the guest sent it.
/// Memory amounts are in bytes, the rest are counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonStats {
    /// Tag 0: bytes swapped in.
    pub swap_in: Option<u64>,
    /// Tag 1: bytes swapped out.
    pub swap_out: Option<u64>,
    /// Tag 2: major page faults.
    pub major_faults: Option<u64>,
    /// Tag 3: minor page faults.
    pub minor_faults: Option<u64>,
    /// Tag 4: free memory.
    pub free_memory: Option<u64>,
    /// Tag 5: total memory.
    pub total_memory: Option<u64>,
    /// Tag 6: available memory (an estimate).
    pub available_memory: Option<u64>,
    /// Tag 7: disk caches.
    pub disk_caches: Option<u64>,
    /// Tag 8: hugetlb page allocations.
    pub hugetlb_allocations: Option<u64>,
    /// Tag 9: hugetlb page allocation failures.
    pub hugetlb_failures: Option<u64>,
    /// Tag 10: OOM kills.
    pub oom_kills: Option<u64>,
    /// Tag 11: allocation stalls.
    pub alloc_stalls: Option<u64>,
    /// Tag 12: pages scanned by kswapd.
    pub async_scans: Option<u64>,
    /// Tag 13: pages scanned directly.
    pub direct_scans: Option<u64>,
    /// Tag 14: pages reclaimed by kswapd.
    pub async_reclaims: Option<u64>,
    /// Tag 15: pages reclaimed directly.
    pub direct_reclaims: Option<u64>,
}

impl BalloonStats {
    /// Records `value` for `tag`; false for a tag this device does not know.
    pub fn set(&mut self, tag: u16, value: u64) -> bool {
        let slot = match tag {
            0 => &mut self.swap_in,
            1 => &mut self.swap_out,
            2 => &mut self.major_faults,
            3 => &mut self.minor_faults,
            4 => &mut self.free_memory,
            5 => &mut self.total_memory,
            6 => &mut self.available_memory,
            7 => &mut self.disk_caches,
            8 => &mut self.hugetlb_allocations,
            9 => &mut self.hugetlb_failures,
            10 => &mut self.oom_kills,
            11 => &mut self.alloc_stalls,
            12 => &mut self.async_scans,
            13 => &mut self.direct_scans,
            14 => &mut self.async_reclaims,
            15 => &mut self.direct_reclaims,
            _ => return false,
        };
        *slot = Some(value);
        true
    }
}

/// What parsing one stats buffer found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsParse {
    /// Entries with a known tag, recorded.
    pub known: usize,
    /// Entries with a tag this device does not know, ignored.
    pub unknown: usize,
    /// Whether the buffer held more than [`MAX_STATS_ENTRIES`] entries
    /// (those past it were not read).
    pub truncated: bool,
    /// Whether the buffer ended in a partial entry (ignored).
    pub partial: bool,
}

/// Parses `buf` (whole entries, at most [`MAX_STATS_ENTRIES`]) into `into`.
pub fn parse_stats(buf: &[u8], into: &mut BalloonStats) -> StatsParse {
    let mut p = StatsParse {
        partial: !buf.len().is_multiple_of(STATS_ENTRY_LEN),
        ..Default::default()
    };
    let entries = buf.chunks_exact(STATS_ENTRY_LEN);
    p.truncated = entries.len() > MAX_STATS_ENTRIES;
    for e in entries.take(MAX_STATS_ENTRIES) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&e[2..]);
        if into.set(tag, u64::from_le_bytes(v)) {
            p.known += 1;
        } else {
            p.unknown += 1;
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holey() -> GuestMemoryMmap {
        // 64 KiB at 0, a 64 KiB hole, 64 KiB at 128 KiB.
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x10000),
            (GuestAddress(0x20000), 0x10000),
        ])
        .unwrap()
    }

    fn entry(tag: u16, v: u64) -> Vec<u8> {
        let mut e = tag.to_le_bytes().to_vec();
        e.extend_from_slice(&v.to_le_bytes());
        e
    }

    #[test]
    fn ranges_must_be_aligned_and_inside_one_region() {
        let m = holey();
        assert_eq!(
            check_range(&m, 0, 0x1000),
            Ok(PageRange {
                addr: 0,
                len: 0x1000
            })
        );
        assert_eq!(check_range(&m, 0x20000, 0x10000).unwrap().len, 0x10000);
        assert_eq!(check_range(&m, 0, 0), Err(RangeError::Empty));
        assert!(matches!(
            check_range(&m, 0x800, 0x1000),
            Err(RangeError::Unaligned { .. })
        ));
        assert!(matches!(
            check_range(&m, 0, 0x1800),
            Err(RangeError::Unaligned { .. })
        ));
        // Over the hole, in the hole, past the end, wrapping.
        for (a, l) in [
            (0xf000, 0x2000),
            (0x10000, 0x1000),
            (0x2f000, 0x2000),
            (u64::MAX - 0xfff, 0x2000),
        ] {
            assert!(
                matches!(
                    check_range(&m, a & !0xfff, l),
                    Err(RangeError::Outside { .. })
                ),
                "{a:#x}"
            );
        }
    }

    #[test]
    fn pfns_coalesce_within_a_region_only() {
        let m = holey();
        let mut c = Coalescer::default();
        let mut out = vec![];
        // 14, 15 are the last pages of region 0; 32 is the first of region 1
        // (not adjacent); 16 is in the hole; 33, 34 extend; 0 restarts.
        for pfn in [14u32, 15, 32, 33, 34, 0, 16, u32::MAX] {
            match c.push(&m, pfn) {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {}
                Err(e) => assert!(matches!(e, RangeError::Outside { .. }), "{pfn}"),
            }
        }
        out.extend(c.finish());
        assert_eq!(
            out,
            vec![
                PageRange {
                    addr: 0xe000,
                    len: 0x2000
                },
                PageRange {
                    addr: 0x20000,
                    len: 0x3000
                },
                PageRange {
                    addr: 0,
                    len: 0x1000
                },
            ]
        );
        // Adjacent addresses in different regions do not join.
        let m2 = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
        ])
        .unwrap();
        let mut c = Coalescer::default();
        assert_eq!(c.push(&m2, 0), Ok(None));
        assert_eq!(
            c.push(&m2, 1),
            Ok(Some(PageRange {
                addr: 0,
                len: 0x1000
            }))
        );
        assert_eq!(
            c.finish(),
            Some(PageRange {
                addr: 0x1000,
                len: 0x1000
            })
        );
    }

    #[test]
    fn stats_keep_known_tags_and_bound_the_entries() {
        let mut s = BalloonStats::default();
        let mut buf = entry(4, 100);
        buf.extend(entry(99, 1));
        buf.extend(entry(5, 200));
        buf.extend([1, 2, 3]);
        let p = parse_stats(&buf, &mut s);
        assert_eq!(
            p,
            StatsParse {
                known: 2,
                unknown: 1,
                truncated: false,
                partial: true
            }
        );
        assert_eq!(
            (s.free_memory, s.total_memory, s.swap_in),
            (Some(100), Some(200), None)
        );
        // The latest value wins; too many entries: the first ones only.
        let mut big = vec![];
        for i in 0..(MAX_STATS_ENTRIES as u64 + 10) {
            big.extend(entry(4, i));
        }
        let p = parse_stats(&big, &mut s);
        assert!(p.truncated);
        assert_eq!(p.known, MAX_STATS_ENTRIES);
        assert_eq!(s.free_memory, Some(MAX_STATS_ENTRIES as u64 - 1));
        assert_eq!(parse_stats(&[], &mut s), StatsParse::default());
        assert!(parse_stats(&[1], &mut s).partial);
    }
}
