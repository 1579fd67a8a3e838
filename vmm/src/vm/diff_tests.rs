//! Diff snapshots over a real `MAP_PRIVATE` file mapping: written pages
//! and pages the balloon gave back are in the diff, and a restore from it
//! shows zeros where the balloon gave pages back, not the base's bytes.

use super::*;
use devices::virtio::balloon::release::{Backing, MappedRegions};
use devices::virtio::balloon::{GiveBack, PageRange};
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress};

const PAGES: u64 = 16;

/// `file` mapped privately at guest address 0, as a restore maps it.
fn map_private(file: &File) -> GuestMemoryMmap {
    let len = usize::try_from(PAGES * PAGE).unwrap();
    let region = vm_memory::MmapRegion::build(
        Some(vm_memory::FileOffset::from_arc(
            Arc::new(file.try_clone().unwrap()),
            0,
        )),
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_NORESERVE,
    )
    .unwrap();
    GuestMemoryMmap::from_regions(vec![vm_memory::GuestRegionMmap::new(
        region,
        GuestAddress(0),
    )
    .unwrap()])
    .unwrap()
}

fn page_of(mem: &GuestMemoryMmap, p: u64) -> Vec<u8> {
    let mut b = vec![0u8; PAGE_BYTES];
    mem.read_slice(&mut b, GuestAddress(p * PAGE)).unwrap();
    b
}

#[test]
fn pages_given_back_by_the_balloon_restore_as_zeros_not_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("memory");
    std::fs::write(&base, vec![0xab; usize::try_from(PAGES * PAGE).unwrap()]).unwrap();
    let f = File::open(&base).unwrap();
    let mem = map_private(&f);

    // The guest writes page 1; the balloon gives back pages 4..6 (a fresh
    // anonymous mapping, untouched since: not present in pagemap).
    mem.write_slice(&[7u8; PAGE_BYTES], GuestAddress(PAGE))
        .unwrap();
    let mut spans = MappedRegions::new();
    spans.add(GuestAddress(0), PAGES * PAGE, Backing::PrivateFile);
    spans
        .give_back(
            &mem,
            PageRange {
                addr: 4 * PAGE,
                len: 2 * PAGE,
            },
        )
        .unwrap();

    let pages = private_pages(&mem, None).unwrap();
    assert_eq!(pages, [1, 4, 5]);
    let diff = dir.path().join("memory.diff");
    write_diff(&mem, &pages, &diff, PAGES * PAGE).unwrap();

    // Restored: the base mapped again, the diff read over it.
    let restored = map_private(&f);
    apply_diff(&restored, &pages, &diff).unwrap();
    assert_eq!(page_of(&restored, 1), vec![7u8; PAGE_BYTES]);
    for p in [4, 5] {
        assert_eq!(page_of(&restored, p), vec![0u8; PAGE_BYTES], "page {p}");
    }
    for p in [0, 2, 3, 6, PAGES - 1] {
        assert_eq!(page_of(&restored, p), vec![0xabu8; PAGE_BYTES], "page {p}");
    }
}
