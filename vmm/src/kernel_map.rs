//! Zero-copy kernel loading: the loadable segments of an ELF `vmlinux` are
//! mapped from the file (MAP_PRIVATE | MAP_FIXED) over the guest RAM they
//! belong to, instead of being copied into it. A boot then costs the VMM
//! no copy of the ~10 MB image; the guest reads the host page cache in
//! place (shared by every VM booting that kernel) and only the pages it
//! writes become private copies.
//!
//! Only segments whose file offset and guest address agree modulo the page
//! size, lie inside one RAM region and share no page with another segment
//! are mapped; anything else makes [`map_kernel`] return `None` and the
//! caller copies the kernel as usual. The bytes of a segment's last page
//! past its file size are zeroed (they are the start of its BSS). The
//! kernel file must not be modified while the VM runs: its page cache
//! pages back guest memory until the guest writes them.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

const PAGE: u64 = 4096;
const PT_LOAD: u32 = 1;
const MAX_PHDRS: u16 = 64;

struct Segment {
    offset: u64,
    paddr: u64,
    filesz: u64,
    memsz: u64,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default())
}

/// Reads and checks the loadable segments of an x86-64 ELF; `None` for
/// anything unexpected (the copying loader then reports it properly).
fn segments(f: &File, file_len: u64) -> Option<(u64, Vec<Segment>)> {
    let mut eh = [0u8; 64];
    f.read_exact_at(&mut eh, 0).ok()?;
    // Magic, 64-bit, little-endian, x86-64, 56-byte program headers.
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 || u16_at(&eh, 18) != 62 {
        return None;
    }
    let entry = u64_at(&eh, 24);
    let phoff = u64_at(&eh, 32);
    let (phentsize, phnum) = (u16_at(&eh, 54), u16_at(&eh, 56));
    if phentsize != 56 || phnum == 0 || phnum > MAX_PHDRS {
        return None;
    }
    let mut ph = vec![0u8; usize::from(phnum) * 56];
    f.read_exact_at(&mut ph, phoff).ok()?;
    let mut segs = Vec::new();
    for p in ph.chunks_exact(56) {
        if u32_at(p, 0) != PT_LOAD {
            continue;
        }
        let s = Segment {
            offset: u64_at(p, 8),
            paddr: u64_at(p, 24),
            filesz: u64_at(p, 32),
            memsz: u64_at(p, 40),
        };
        let file_end = s.offset.checked_add(s.filesz)?;
        if s.filesz > s.memsz || file_end > file_len || s.paddr.checked_add(s.memsz).is_none() {
            return None;
        }
        segs.push(s);
    }
    Some((entry, segs))
}

/// Maps the kernel's segments into `mem`; returns (entry, end) when every
/// segment could be mapped, `None` (having changed nothing) otherwise.
/// Pages are faulted in on the guest's first touch. (Faulting them all in
/// up front with MAP_POPULATE cost the VMM ~8 ms of its start on PVM hosts,
/// and no longer made those boots faster: 8.70 s vs 8.73 s to VMM exit, five
/// boots each, with a background prefault instead of MAP_POPULATE.)
pub fn map_kernel(mem: &GuestMemoryMmap, f: &File, low: u64) -> Option<(u64, u64)> {
    let flags = libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE;
    let file_len = f.metadata().ok()?.len();
    let (entry, segs) = segments(f, file_len)?;
    if segs.is_empty() {
        return None;
    }
    // Page ranges must be congruent, inside RAM above `low`, disjoint.
    let mut pages: Vec<(u64, u64)> = Vec::new();
    for s in &segs {
        if s.offset % PAGE != s.paddr % PAGE || s.paddr < low {
            return None;
        }
        let start = s.paddr / PAGE * PAGE;
        let end = (s.paddr + s.memsz).div_ceil(PAGE) * PAGE;
        // One region, so the host range is contiguous.
        let r = mem.find_region(GuestAddress(start))?;
        if end > r.start_addr().0 + r.len() {
            return None;
        }
        pages.push((start, end));
    }
    let mut sorted = pages.clone();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0].1 > w[1].0) {
        return None;
    }
    let mut end_max = 0;
    for s in &segs {
        end_max = end_max.max(s.paddr + s.memsz);
        let start = s.paddr / PAGE * PAGE;
        let lead = s.paddr - start;
        let map_len = (lead + s.filesz).div_ceil(PAGE) * PAGE;
        if s.filesz == 0 {
            continue; // pure BSS: the RAM is fresh and zero already
        }
        let host = mem.get_host_address(GuestAddress(start)).ok()?;
        let len = usize::try_from(map_len).ok()?;
        let offset = libc::off_t::try_from(s.offset - lead).ok()?;
        // SAFETY: `host..host+map_len` lies inside one guest RAM region
        // owned by `mem` (checked above); MAP_FIXED replaces those pages of
        // that mapping with a private mapping of the file at a
        // page-aligned offset, which stays valid after `f` is closed. No
        // reference into the replaced pages is held.
        let p = unsafe {
            libc::mmap(
                host.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                f.as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            // Part of guest RAM may now be file-backed: the caller's copy
            // overwrites every segment anyway, and the rest is untouched.
            return None;
        }
        // Zero what the file has before the segment in its first page and
        // after it in its last page (neither belongs to the segment).
        let zero = |from: u64, len: u64| {
            // Less than a page.
            if let Some(len) = usize::try_from(len).ok().filter(|&l| l > 0) {
                let z = vec![0u8; len];
                let _ = vm_memory::Bytes::write_slice(mem, &z, GuestAddress(from));
            }
        };
        zero(start, lead);
        zero(s.paddr + s.filesz, start + map_len - (s.paddr + s.filesz));
    }
    Some((entry, end_max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use vm_memory::Bytes;

    /// An ELF with the given (offset, paddr, filesz, memsz) PT_LOADs; the
    /// file byte at offset o is (o % 251) + 1, never zero.
    fn elf(segs: &[(u64, u64, u64, u64)], len: usize) -> tempfile::NamedTempFile {
        let mut b: Vec<u8> = (0..len)
            .map(|o| u8::try_from(o % 251).unwrap() + 1)
            .collect();
        b[..64].fill(0);
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&62u16.to_le_bytes());
        b[24..32].copy_from_slice(&0x20_0123u64.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&u16::try_from(segs.len()).unwrap().to_le_bytes());
        for (i, &(off, pa, fs, ms)) in segs.iter().enumerate() {
            let p = &mut b[64 + i * 56..64 + (i + 1) * 56];
            p.fill(0);
            p[..4].copy_from_slice(&PT_LOAD.to_le_bytes());
            p[8..16].copy_from_slice(&off.to_le_bytes());
            p[24..32].copy_from_slice(&pa.to_le_bytes());
            p[32..40].copy_from_slice(&fs.to_le_bytes());
            p[40..48].copy_from_slice(&ms.to_le_bytes());
        }
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&b).unwrap();
        f
    }

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap()
    }

    fn byte(m: &GuestMemoryMmap, a: u64) -> u8 {
        m.read_obj(GuestAddress(a)).unwrap()
    }

    #[test]
    fn segments_are_mapped_with_zeroed_edges_and_bss() {
        // Text at 2 MiB (page-aligned), data at an unaligned but congruent
        // address with a BSS tail.
        let f = elf(
            &[
                (0x1000, 0x20_0000, 0x1800, 0x1800),
                (0x3100, 0x40_0100, 0x200, 0x3000),
            ],
            0x4000,
        );
        let m = mem();
        let (entry, end) = map_kernel(&m, f.as_file(), 0x10_0000).expect("mapped");
        assert_eq!((entry, end), (0x20_0123, 0x40_3100));
        let file_byte = |o: u64| (o % 251) as u8 + 1;
        assert_eq!(byte(&m, 0x20_0000), file_byte(0x1000));
        assert_eq!(byte(&m, 0x20_17ff), file_byte(0x27ff));
        assert_eq!(byte(&m, 0x20_1800), 0, "past filesz in the last page");
        assert_eq!(byte(&m, 0x40_00ff), 0, "before the segment in its page");
        assert_eq!(byte(&m, 0x40_0100), file_byte(0x3100));
        assert_eq!(byte(&m, 0x40_02ff), file_byte(0x32ff));
        assert_eq!(byte(&m, 0x40_0300), 0, "BSS");
        assert_eq!(byte(&m, 0x40_2fff), 0, "BSS");
        // Guest writes stay private to this memory, not the file.
        m.write_obj(0xaau8, GuestAddress(0x20_0000)).unwrap();
        let mut one = [0u8; 1];
        f.as_file().read_exact_at(&mut one, 0x1000).unwrap();
        assert_eq!(one[0], file_byte(0x1000));
    }

    #[test]
    fn unmappable_layouts_fall_back_to_copying() {
        let m = mem();
        let cases: [&[(u64, u64, u64, u64)]; 4] = [
            &[(0x1000, 0x20_0800, 0x100, 0x100)], // offset and address not congruent
            &[(0x1000, 0x8000, 0x100, 0x100)],    // below the low limit
            &[(0x1000, 0xff_f000, 0x2000, 0x2000)], // past the end of RAM
            &[
                (0x1000, 0x20_0000, 0x100, 0x100),
                (0x2000, 0x20_0800, 0x100, 0x100),
            ], // shared page
        ];
        for segs in cases {
            let f = elf(segs, 0x4000);
            assert!(
                map_kernel(&m, f.as_file(), 0x10_0000).is_none(),
                "{segs:x?}"
            );
        }
        // A truncated file or a non-ELF is left to the copying loader.
        let f = elf(&[(0x1000, 0x20_0000, 0x8000, 0x8000)], 0x4000);
        assert!(map_kernel(&m, f.as_file(), 0x10_0000).is_none());
        let mut junk = tempfile::NamedTempFile::new().unwrap();
        junk.write_all(&[0u8; 256]).unwrap();
        assert!(map_kernel(&m, junk.as_file(), 0x10_0000).is_none());
    }
}
