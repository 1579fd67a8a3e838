use super::*;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

const MIB: u64 = 1 << 20;
const GPA: u64 = 0x1_0000_0000;

fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn image(len: u64) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&pattern(len)).unwrap();
    f.flush().unwrap();
    f
}

/// Reads `len` bytes at `off` through the mapping.
fn read_mapped(m: &PmemMapping, off: u64, len: usize) -> Vec<u8> {
    assert!(off + len as u64 <= m.len());
    let mut out = vec![0u8; len];
    // SAFETY: the range is inside the live mapping owned by `m` (checked
    // above); the test owns the file, so nothing truncates it meanwhile.
    unsafe {
        std::ptr::copy_nonoverlapping((m.host_addr() + off) as *const u8, out.as_mut_ptr(), len)
    };
    out
}

/// The `/proc/self/smaps` entry of the VMA starting at `addr`: (header, body).
fn smaps_entry(addr: u64) -> Option<(String, Vec<String>)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let prefix = format!("{addr:x}-");
    let mut lines = smaps.lines().peekable();
    while let Some(l) = lines.next() {
        if l.starts_with(&prefix) {
            let mut body = vec![];
            while let Some(n) = lines.peek() {
                if n.split_whitespace()
                    .next()
                    .is_some_and(|w| w.contains('-') && !w.ends_with(':'))
                {
                    break;
                }
                body.push(lines.next().unwrap().to_string());
            }
            return Some((l.to_string(), body));
        }
    }
    None
}

fn smaps_kb(body: &[String], key: &str) -> u64 {
    body.iter()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[test]
fn maps_good_image_read_only_and_aligned() {
    let f = image(4 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    assert_eq!(m.len(), 4 * MIB);
    assert!(!m.is_empty());
    assert_eq!(m.guest_addr(), GPA);
    assert_eq!(m.path(), f.path());
    assert_eq!(m.host_addr() % (2 * MIB), 0, "host mapping 2 MiB-aligned");
    assert_eq!(
        m.region(),
        SlotRegion {
            guest_addr: GPA,
            len: 4 * MIB,
            host_addr: m.host_addr()
        }
    );
    let b = m.backing();
    assert_eq!(
        (b.guest_addr, b.len, b.path.as_path()),
        (GPA, 4 * MIB, f.path())
    );
    // Content visible through the host address, start, middle and end.
    let want = pattern(4 * MIB);
    assert_eq!(read_mapped(&m, 0, 4096), want[..4096]);
    assert_eq!(
        read_mapped(&m, 3 * MIB + 5, 100),
        want[usize::try_from(3 * MIB).unwrap() + 5..][..100]
    );
    assert_eq!(read_mapped(&m, 4 * MIB - 10, 10), want[want.len() - 10..]);
    // Shared, read-only VMA of exactly the image's length.
    let (header, _) = smaps_entry(m.host_addr()).expect("mapping in smaps");
    let mut words = header.split_whitespace();
    let range = words.next().unwrap();
    assert_eq!(words.next(), Some("r--s"), "{header}");
    let (lo, hi) = range.split_once('-').unwrap();
    let size = u64::from_str_radix(hi, 16).unwrap() - u64::from_str_radix(lo, 16).unwrap();
    assert_eq!(size, 4 * MIB);
}

#[test]
fn mapping_cannot_be_made_writable() {
    let f = image(2 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    // SAFETY: asks for write access on our own mapping; it must be refused
    // (read-only fd + MAP_SHARED), and if it were not, nothing writes.
    let rc = unsafe {
        libc::mprotect(
            m.host_addr() as *mut libc::c_void,
            usize::try_from(m.len()).unwrap(),
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    let err = std::io::Error::last_os_error();
    assert_eq!(rc, -1, "mprotect(PROT_WRITE) must fail");
    assert_eq!(err.raw_os_error(), Some(libc::EACCES));
}

#[test]
fn write_to_mapping_faults() {
    let f = image(2 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    let addr = m.host_addr() as *mut u8;
    // SAFETY: the child only performs one store and `_exit`s (both
    // async-signal-safe); it never returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: child process: a deliberate write to a read-only mapping,
        // expected to die with SIGSEGV; `_exit` only if it did not.
        unsafe {
            std::ptr::write_volatile(addr, 0x55);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid);
    assert!(libc::WIFSIGNALED(status), "child wrote to the mapping");
    assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
    assert_eq!(std::fs::read(f.path()).unwrap()[0], 0, "file untouched");
}

#[test]
fn bad_images_and_addresses_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("odd.img");
    std::fs::write(&p, pattern(3 * MIB)).unwrap();
    let e = PmemMapping::open(&p, GPA).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(
        e,
        MappingError::Image(ImageError::Misaligned { .. })
    ));
    assert!(
        msg.contains("odd.img") && msg.contains("shoal image build"),
        "{msg}"
    );

    let p = d.path().join("empty.img");
    std::fs::write(&p, b"").unwrap();
    let e = PmemMapping::open(&p, GPA).unwrap_err();
    assert!(
        matches!(e, MappingError::Image(ImageError::Empty(_))),
        "{e}"
    );
    assert!(e.to_string().contains("empty.img"));

    let e = PmemMapping::open(&d.path().join("missing.img"), GPA).unwrap_err();
    assert!(e.to_string().contains("missing.img"), "{e}");

    let f = image(2 * MIB);
    let e = PmemMapping::open(f.path(), GPA + 4096).unwrap_err();
    assert!(matches!(e, MappingError::GuestAddr(_)), "{e}");
    let e = PmemMapping::open(f.path(), !(2 * MIB - 1)).unwrap_err();
    assert!(matches!(e, MappingError::GuestRange { .. }), "{e}");
}

#[test]
fn two_mappings_share_the_page_cache() {
    let f = image(4 * MIB);
    let a = PmemMapping::open(f.path(), GPA).unwrap();
    let b = PmemMapping::open(f.path(), GPA + 4 * MIB).unwrap();
    assert_ne!(a.host_addr(), b.host_addr());
    assert_eq!(
        read_mapped(&a, 0, usize::try_from(4 * MIB).unwrap()),
        read_mapped(&b, 0, usize::try_from(4 * MIB).unwrap())
    );
    // A change to the file (a host-side write, never a guest's) shows in
    // both mappings at once: they map the page cache, not private copies.
    f.as_file().write_all_at(b"SHARED", 2 * MIB + 7).unwrap();
    assert_eq!(read_mapped(&a, 2 * MIB + 7, 6), b"SHARED");
    assert_eq!(read_mapped(&b, 2 * MIB + 7, 6), b"SHARED");
    // Both touched every page, so each resident page is mapped twice.
    let (_, body) = smaps_entry(b.host_addr()).unwrap();
    let rss = smaps_kb(&body, "Rss:");
    let shared = smaps_kb(&body, "Shared_Clean:") + smaps_kb(&body, "Shared_Dirty:");
    assert!(rss > 0, "{body:?}");
    assert_eq!(shared, rss, "every resident page shared: {body:?}");
}

fn mapped(addr: u64) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|l| l.starts_with(&format!("{addr:x}-")))
}

#[test]
fn teardown_runs_hooks_before_unmap_in_reverse_order() {
    let f = image(2 * MIB);
    let mut m = PmemMapping::open(f.path(), GPA).unwrap();
    let addr = m.host_addr();
    let log = std::sync::Arc::new(Mutex::new(Vec::new()));
    for name in ["first", "second"] {
        let log = log.clone();
        m.set_before_unmap(move |r| {
            // Still mapped while the hook (the KVM slot removal) runs.
            assert!(mapped(r.host_addr));
            assert_eq!(r.guest_addr, GPA);
            log.lock().unwrap().push(name);
            Ok(())
        });
    }
    m.close().unwrap();
    assert_eq!(*log.lock().unwrap(), ["second", "first"]);
    assert!(!mapped(addr), "unmapped after close");

    // Drop does the same.
    let ran = std::sync::Arc::new(AtomicBool::new(false));
    let mut m = PmemMapping::open(f.path(), GPA).unwrap();
    let addr = m.host_addr();
    let r2 = ran.clone();
    m.set_before_unmap(move |_| {
        r2.store(true, Ordering::SeqCst);
        Ok(())
    });
    drop(m);
    assert!(ran.load(Ordering::SeqCst));
    assert!(!mapped(addr));
}

#[test]
fn failed_hook_leaks_the_range_instead_of_unmapping() {
    let f = image(2 * MIB);
    let mut m = PmemMapping::open(f.path(), GPA).unwrap();
    let addr = m.host_addr();
    m.set_before_unmap(|_| Err(std::io::Error::other("KVM said no")));
    let e = m.close().unwrap_err();
    assert!(matches!(e, MappingError::Hook { .. }));
    assert!(e.to_string().contains("KVM said no"), "{e}");
    assert!(mapped(addr), "still mapped: the guest might reach it");
    // Clean up the deliberately leaked range.
    // SAFETY: the test owns this leaked mapping and nothing else uses it.
    unsafe { libc::munmap(addr as *mut libc::c_void, usize::try_from(2 * MIB).unwrap()) };
}
