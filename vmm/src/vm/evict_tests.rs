//! Eviction over real mappings in this process: a private file mapping
//! (a clone over its template) and anonymous memory (a booted VM).

use super::*;
use crate::evict_mode::swaps_listed;
use vm_memory::{Bytes, GuestAddress};

const PAGES: u64 = 64;

fn template(dir: &Path) -> File {
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("memory"))
        .unwrap();
    for p in 0..PAGES {
        f.write_all_at(&[u8::try_from(p).unwrap() + 100; PAGE_BYTES], p * PAGE)
            .unwrap();
    }
    f
}

fn map_private(file: &File) -> GuestMemoryMmap {
    let len = usize::try_from(PAGES * PAGE).unwrap();
    let region = vm_memory::MmapRegion::build(
        Some(vm_memory::FileOffset::from_arc(
            std::sync::Arc::new(file.try_clone().unwrap()),
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

fn contents(mem: &GuestMemoryMmap) -> Vec<u8> {
    let mut b = vec![0u8; usize::try_from(PAGES * PAGE).unwrap()];
    mem.read_slice(&mut b, GuestAddress(0)).unwrap();
    b
}

fn dir() -> tempfile::TempDir {
    // Beside the sources when the temporary directory is tmpfs (which
    // eviction refuses).
    let t = tempfile::tempdir().unwrap();
    if Evictor::default()
        .open(t.path(), PAGE)
        .is_err_and(|e| e.to_string().contains("tmpfs"))
    {
        return tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    }
    t
}

#[test]
fn runs_bridge_short_gaps_and_stop_at_long_ones_and_regions() {
    use Class::*;
    let mut c = vec![Zero; 40];
    c[1] = Private;
    c[3] = Private; // zero gap of 1: bridged
    let copies = usize::try_from(COPY_GAP).unwrap();
    c[4..4 + copies + 1].fill(Other);
    c[4 + copies + 1] = Private; // too many copies: a new run
                                 // ...bridged over zeros to 30, and cut at the region's end.
    c[30] = Private;
    c[31] = Private;
    assert_eq!(
        runs(&c, &[(0, 31), (31, 40)]),
        vec![(1, 4), (21, 31), (31, 32)]
    );
    assert!(runs(&[FromFile, Zero, Other], &[(0, 3)]).is_empty());
}

#[test]
fn swap_detection_reads_proc_swaps() {
    assert!(!swaps_listed("Filename\tType\tSize\tUsed\tPriority\n"));
    assert!(swaps_listed(
        "Filename\tType\tSize\tUsed\tPriority\n/dev/zram0 partition 1024 0 100\n"
    ));
}

#[test]
fn a_clone_keeps_its_bytes_and_its_private_pages_leave_ram() {
    let d = dir();
    let f = template(d.path());
    let mem = map_private(&f);
    // Pages 2, 3, 10 and 40 written; page 5 read only.
    for p in [2u64, 3, 10, 40] {
        mem.write_slice(&[u8::try_from(p).unwrap(); 100], GuestAddress(p * PAGE + 7))
            .unwrap();
    }
    let mut one = [0u8; 1];
    mem.read_slice(&mut one, GuestAddress(5 * PAGE)).unwrap();
    let before = contents(&mem);
    let mut spans = MappedRegions::new();
    let mut ev = Evictor::default();
    let pass = ev.evict(&mem, &mut spans, d.path(), Mode::File).unwrap();
    assert_eq!(pass.pages, 4);
    // 2..4 and 10 (a gap of 6 template pages, copied) are one run; 40 its own.
    assert_eq!(pass.mappings, 2);
    assert_eq!(pass.written_bytes, (4 + 6) * PAGE);
    assert_eq!(pass.faulted_back_pages, 0);
    let id = ev.file_id().unwrap().clone();
    // No private page is left; the guest reads the same bytes.
    let (classes, _) = classify(&mem, Some(&id)).unwrap();
    assert!(!classes.contains(&Class::Private));
    assert_eq!(contents(&mem), before);
    // A diff snapshot counts every evicted page as written.
    let diff = crate::vm::diff::private_pages(&mem, Some(&id)).unwrap();
    for p in [2, 3, 10, 40] {
        assert!(diff.contains(&p), "page {p} in {diff:?}");
    }
    // Touched again: a write makes a private copy, reads bring file pages
    // back; all found back at the next pass, and out of RAM again after it.
    mem.write_slice(&[9u8; 10], GuestAddress(40 * PAGE))
        .unwrap();
    let after = contents(&mem);
    let pass = ev.evict(&mem, &mut spans, d.path(), Mode::File).unwrap();
    assert_eq!(pass.pages, 1);
    // Pages 2..11 and 40 (the read above touched them all).
    assert_eq!(pass.faulted_back_pages, 10);
    let (classes, back) = classify(&mem, Some(&id)).unwrap();
    assert_eq!(back, 0, "{classes:?}");
    assert_eq!(contents(&mem), after);
    assert_eq!(ev.totals(), (2, 5, 10));
    // The balloon replaces evicted ranges (zeros), never re-exposes them.
    use devices::virtio::balloon::{GiveBack, PageRange};
    spans
        .give_back(
            &mem,
            PageRange {
                addr: 2 * PAGE,
                len: PAGE,
            },
        )
        .unwrap();
    let mut b = vec![1u8; PAGE_BYTES];
    mem.read_slice(&mut b, GuestAddress(2 * PAGE)).unwrap();
    assert!(b.iter().all(|&x| x == 0));
}

#[test]
fn a_booted_vm_evicts_written_pages_and_untouched_ones_stay_zero() {
    let d = dir();
    let mem =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), usize::try_from(PAGES * PAGE).unwrap())])
            .unwrap();
    mem.write_slice(&[7u8; 3 * PAGE_BYTES], GuestAddress(8 * PAGE))
        .unwrap();
    mem.write_slice(&[0u8; 10], GuestAddress(20 * PAGE))
        .unwrap(); // present, all zero
    let mut before = vec![0u8; usize::try_from(PAGES * PAGE).unwrap()];
    before[8 * PAGE_BYTES..11 * PAGE_BYTES].fill(7);
    let mut spans = MappedRegions::new();
    let mut ev = Evictor::default();
    let pass = ev.evict(&mem, &mut spans, d.path(), Mode::File).unwrap();
    assert_eq!(pass.pages, 4);
    assert_eq!(pass.mappings, 1, "zero gaps are bridged for free");
    assert_eq!(pass.written_bytes, 3 * PAGE, "all-zero pages stay holes");
    assert_eq!(contents(&mem), before);
    assert!(ev.file_bytes() >= 3 * PAGE);
    ev.forget_mappings();
    assert_eq!(ev.file_bytes(), 0);
}

#[test]
fn tmpfs_is_refused() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        panic!("/dev/shm is missing: this test needs a tmpfs to refuse");
    }
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 * PAGE_BYTES)]).unwrap();
    mem.write_slice(&[1u8; 8], GuestAddress(0)).unwrap();
    let e = Evictor::default()
        .evict(&mem, &mut MappedRegions::new(), shm, Mode::File)
        .unwrap_err();
    assert!(e.to_string().contains("tmpfs"), "{e}");
}
