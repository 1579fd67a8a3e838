//! The balloon giving back real memory through `MappedRegions`: guest
//! memory of three regions mapped the three ways the VMM maps them
//! (anonymous, `MAP_PRIVATE` over a file as a restored clone's, shared
//! memfd), touched, then inflated and reported from the guest's side; the
//! pages leave the process (counted in /proc/self/pagemap), read as zeros
//! afterwards (never the file's old contents), and the files are
//! untouched (private) or punched (shared).

use devices::virtio::balloon::release::{Backing, MappedRegions};
use devices::virtio::balloon::{Balloon, BalloonConfig, GiveBack, PageRange};
use devices::virtio::mmio::status;
use devices::virtio::testing::{Driver, DATA};
use devices::virtio::VIRTIO_F_VERSION_1;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap,
    MmapRegion,
};

const MIB: u64 = 1 << 20;
const LOW: u64 = 0;
const PRIV: u64 = 4 * MIB;
const SHARED: u64 = 8 * MIB;
const LEN: u64 = 2 * MIB;
const PAGE: u64 = 4096;

fn us(v: u64) -> usize {
    usize::try_from(v).unwrap()
}

/// Pages of `[host, host + len)` present in this process's page tables.
fn present_pages(host: *const u8, len: u64) -> u64 {
    let mut f = File::open("/proc/self/pagemap").unwrap();
    let first = host as u64 / PAGE;
    let n = len / PAGE;
    let mut buf = vec![0u8; usize::try_from(n * 8).unwrap()];
    f.seek(SeekFrom::Start(first * 8)).unwrap();
    f.read_exact(&mut buf).unwrap();
    buf.chunks_exact(8)
        .filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) & (1 << 63) != 0)
        .count() as u64
}

fn memfd(len: u64) -> File {
    // SAFETY: a fresh memfd with a constant name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"balloon-test".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and is owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

fn blocks(f: &File) -> u64 {
    use std::os::unix::fs::MetadataExt;
    f.metadata().unwrap().blocks()
}

struct Setup {
    mem: GuestMemoryMmap,
    regions: MappedRegions,
    template: File,
    shared: File,
}

/// Low region anonymous (rings, buffers and inflated pages), a clone's
/// private mapping of a "template" file full of 0xAB, and a shared memfd.
fn setup() -> Setup {
    let mut template = tempfile::tempfile().unwrap();
    template.write_all(&vec![0xABu8; us(LEN)]).unwrap();
    let shared = memfd(LEN);
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let anon = GuestRegionMmap::new(MmapRegion::new(us(LEN)).unwrap(), GuestAddress(LOW)).unwrap();
    let private = MmapRegion::build(
        Some(FileOffset::new(template.try_clone().unwrap(), 0)),
        us(LEN),
        rw,
        libc::MAP_PRIVATE,
    )
    .unwrap();
    let shared_map = MmapRegion::build(
        Some(FileOffset::new(shared.try_clone().unwrap(), 0)),
        us(LEN),
        rw,
        libc::MAP_SHARED,
    )
    .unwrap();
    let mem = GuestMemoryMmap::from_regions(vec![
        anon,
        GuestRegionMmap::new(private, GuestAddress(PRIV)).unwrap(),
        GuestRegionMmap::new(shared_map, GuestAddress(SHARED)).unwrap(),
    ])
    .unwrap();
    let mut regions = MappedRegions::new();
    regions
        .add(GuestAddress(LOW), LEN, Backing::Anonymous)
        .add(GuestAddress(PRIV), LEN, Backing::PrivateFile)
        .add(GuestAddress(SHARED), LEN, Backing::Shared);
    Setup {
        mem,
        regions,
        template,
        shared,
    }
}

fn host(mem: &GuestMemoryMmap, addr: u64) -> *const u8 {
    mem.get_host_address(GuestAddress(addr)).unwrap() as *const u8
}

fn touch(mem: &GuestMemoryMmap, addr: u64, len: u64, byte: u8) {
    mem.write_slice(&vec![byte; us(len)], GuestAddress(addr))
        .unwrap();
}

fn all_zero(mem: &GuestMemoryMmap, addr: u64, len: u64) -> bool {
    let mut b = vec![1u8; us(len)];
    mem.read_slice(&mut b, GuestAddress(addr)).unwrap();
    b.iter().all(|&x| x == 0)
}

#[test]
fn a_private_file_mapping_reads_zeros_after_give_back_not_the_file() {
    let mut s = setup();
    // What a plain MADV_DONTNEED would do on the private mapping: the
    // template's bytes come back. This is why it is not used there.
    touch(&s.mem, PRIV, PAGE, 0x11);
    let p = host(&s.mem, PRIV);
    // SAFETY: one page of the private mapping `s.mem` owns; the test reads
    // it only through `s.mem` afterwards.
    let r = unsafe { libc::madvise(p as *mut _, us(PAGE), libc::MADV_DONTNEED) };
    assert_eq!(r, 0);
    let mut b = [0u8; 1];
    s.mem.read_slice(&mut b, GuestAddress(PRIV)).unwrap();
    assert_eq!(b[0], 0xAB, "DONTNEED on MAP_PRIVATE shows the file again");

    touch(&s.mem, PRIV, LEN, 0x22);
    assert_eq!(present_pages(p, LEN), LEN / PAGE);
    s.regions
        .give_back(
            &s.mem,
            PageRange {
                addr: PRIV,
                len: LEN,
            },
        )
        .unwrap();
    assert_eq!(present_pages(p, LEN), 0, "private copies dropped");
    assert!(
        all_zero(&s.mem, PRIV, LEN),
        "zeros, not the template's 0xAB"
    );
    // Reading zero pages maps the shared zero page at most; writing works.
    touch(&s.mem, PRIV + PAGE, PAGE, 0x33);
    let mut b = [0u8; 2];
    s.mem
        .read_slice(&mut b[..1], GuestAddress(PRIV + PAGE))
        .unwrap();
    s.mem
        .read_slice(&mut b[1..], GuestAddress(PRIV + 2 * PAGE))
        .unwrap();
    assert_eq!(b, [0x33, 0]);
    // The template file is untouched.
    let mut f = [0u8; 16];
    s.template.read_exact_at(&mut f, 0).unwrap();
    assert_eq!(f, [0xAB; 16]);
}

#[test]
fn inflate_and_reporting_drop_resident_pages_of_all_three_mappings() {
    let s = setup();
    let shared_fd = s.shared.as_raw_fd();
    assert!(shared_fd >= 0);
    let dev = Balloon::new(&BalloonConfig::new(), &s.mem, Box::new(s.regions.clone()));
    let h = dev.handle();
    let mut d = Driver::with_mem(Box::new(dev), s.mem.clone());
    let f = (1u64 << VIRTIO_F_VERSION_1) | (1 << 1) | (1 << 5);
    assert_ne!(
        d.bring_up_queues(f, &[16, 16, 16, 16]) & status::DRIVER_OK,
        0
    );

    // Inflate the upper half of the low (anonymous) region, page by page.
    let (inf, inf_len) = (LEN / 2, LEN / 2);
    touch(&s.mem, inf, inf_len, 0x44);
    touch(&s.mem, PRIV, LEN, 0x55);
    touch(&s.mem, SHARED, LEN, 0x66);
    let ph = |a| host(&s.mem, a);
    assert_eq!(present_pages(ph(inf), inf_len), inf_len / PAGE);
    assert!(blocks(&s.shared) * 512 >= LEN, "memfd holds its pages");

    let list: Vec<u8> = (inf / PAGE..(inf + inf_len) / PAGE)
        .flat_map(|p| u32::try_from(p).unwrap().to_le_bytes())
        .collect();
    d.mem.write_slice(&list, GuestAddress(DATA)).unwrap();
    d.push_chain(&[(DATA, u32::try_from(list.len()).unwrap(), false)]);
    d.notify();
    assert_eq!(d.take_used().len(), 1);
    assert_eq!(
        present_pages(ph(inf), inf_len),
        0,
        "anonymous pages dropped"
    );
    assert!(all_zero(&s.mem, inf, inf_len));

    // Report both file-backed regions, 1 MiB per descriptor.
    d.push_chain_on(
        3,
        &[
            (PRIV, u32::try_from(MIB).unwrap(), true),
            (PRIV + MIB, u32::try_from(MIB).unwrap(), true),
            (SHARED, u32::try_from(LEN).unwrap(), true),
        ],
    );
    d.notify_queue(3);
    assert_eq!(d.take_used_on(3).len(), 1);
    assert_eq!(present_pages(ph(PRIV), LEN), 0, "private copies dropped");
    assert_eq!(present_pages(ph(SHARED), LEN), 0, "shared pages unmapped");
    assert_eq!(blocks(&s.shared), 0, "memfd hole punched");
    assert!(all_zero(&s.mem, PRIV, LEN), "no template data");
    assert!(all_zero(&s.mem, SHARED, LEN));
    let c = h.counters();
    assert_eq!(c.inflated_pages, inf_len / PAGE);
    assert_eq!(c.reported_bytes, 2 * LEN);
    assert_eq!(
        (c.give_back_errors, c.refused_reports, c.refused_pfns),
        (0, 0, 0)
    );
}

/// Past the replacement budget a private file range is dropped all the
/// same, but reads the file again (and the fallback is counted).
#[test]
fn past_the_replacement_budget_private_pages_are_dropped_with_dontneed() {
    let s = setup();
    let p = host(&s.mem, PRIV);
    let mut budgeted = MappedRegions::new().with_replace_budget(1);
    budgeted.add(GuestAddress(PRIV), LEN, Backing::PrivateFile);
    touch(&s.mem, PRIV, 2 * PAGE, 0x44);
    for i in 0..2 {
        budgeted
            .give_back(
                &s.mem,
                PageRange {
                    addr: PRIV + i * PAGE,
                    len: PAGE,
                },
            )
            .unwrap();
    }
    assert_eq!(budgeted.fallbacks(), 1);
    assert_eq!(present_pages(p, 2 * PAGE), 0);
    let mut b = [0u8; 2];
    s.mem.read_slice(&mut b[..1], GuestAddress(PRIV)).unwrap();
    s.mem
        .read_slice(&mut b[1..], GuestAddress(PRIV + PAGE))
        .unwrap();
    assert_eq!(b, [0, 0xAB]);
}
