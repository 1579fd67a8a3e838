//! virtio-pmem in the VMM on /dev/kvm, with a hand-made 64-bit guest (no
//! Linux): the image is a read-only memory slot above 4 GiB that the guest
//! reads directly; its writes are dropped and counted; the device's config
//! space tells where it is; snapshots map the same image again (restore and
//! reload into a live VM) and refuse a changed one; the CLI refuses bad
//! images with one clear line.

mod common;

use common::{small_config, spawn_with_api, vmm_error, VMM};
use shoal_test_support::{require_kvm, Console};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vmm::layout::VIRTIO_MMIO_BASE;
use vmm::persist::SnapshotState;
use vmm::{BootSource, ExitReason, PmemConfig, Vm, VmConfig};
use vmm_api::Client;

const MIB: u64 = 1 << 20;
const IMAGE_LEN: u64 = 4 * MIB;
/// Where `pmem::place` puts the first device of a small guest: 4 GiB.
const PMEM_GPA: u64 = 0x1_0000_0000;
const FIRST: u64 = 0x1122_3344_5566_7788;
const LAST: u64 = 0x8877_6655_4433_2211;

/// The guest's console; `resync` skips up to the first '\n' (a restored
/// guest may resume mid-round). No image qword used here contains 0x0a.
#[derive(Clone, Default)]
struct Capture {
    console: Console,
    resync: bool,
}

impl Capture {
    /// A writer for the VM's console.
    fn sink(&self) -> Option<Box<dyn std::io::Write + Send>> {
        Some(Box::new(self.console.clone()))
    }

    /// Complete rounds so far: (first qword, last qword, first qword after
    /// the guest wrote 0x55 to it).
    fn rounds(&self) -> Vec<(u64, u64, u64)> {
        let mut b = self.console.bytes();
        if self.resync {
            match b.iter().position(|&c| c == b'\n') {
                Some(i) => drop(b.drain(..=i)),
                None => return vec![],
            }
        }
        b.chunks_exact(25)
            .map(|c| {
                assert_eq!(c[24], b'\n', "round framing: {c:?}");
                let q = |i: usize| u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().unwrap());
                (q(0), q(1), q(2))
            })
            .collect()
    }
}

/// 64-bit guest (entered at 0x100000 in long mode with the first GiB
/// identity-mapped at PML4 0x9000 / PDPT 0xa000): maps 4..5 GiB with a new
/// page directory at 0xc000 (PDPT[4]), then forever: print the image's
/// first qword, its last qword (at +4 MiB - 8), write 0x55 over its first
/// byte, print the first qword again, print '\n' (25 bytes a round, on
/// COM1). Assembled from:
///
/// ```text
///     mov $0xc003,%eax; mov %rax,0xa020; mov $0xc000,%edi
///     movabs $0x100000083,%rax; mov $512,%ecx
/// 1:  mov %rax,(%rdi); add $0x200000,%rax; add $8,%rdi; dec %ecx; jnz 1b
///     mov %cr3,%rax; mov %rax,%cr3; movabs $0x100000000,%rbx
/// round:
///     mov (%rbx),%rax; call emit; mov 0x3ffff8(%rbx),%rax; call emit
///     movb $0x55,(%rbx); mov (%rbx),%rax; call emit
///     mov $0x3f8,%dx; mov $0xa,%al; out %al,(%dx); jmp round
/// emit: mov $0x3f8,%dx; mov $8,%ecx
/// 2:  out %al,(%dx); shr $8,%rax; dec %ecx; jnz 2b; ret
/// ```
const GUEST: &[u8] = &[
    0xb8, 0x03, 0xc0, 0x00, 0x00, 0x48, 0x89, 0x04, 0x25, 0x20, 0xa0, 0x00, 0x00, 0xbf, 0x00, 0xc0,
    0x00, 0x00, 0x48, 0xb8, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0xb9, 0x00, 0x02, 0x00,
    0x00, 0x48, 0x89, 0x07, 0x48, 0x05, 0x00, 0x00, 0x20, 0x00, 0x48, 0x83, 0xc7, 0x08, 0xff, 0xc9,
    0x75, 0xef, 0x0f, 0x20, 0xd8, 0x0f, 0x22, 0xd8, 0x48, 0xbb, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
    0x00, 0x00, 0x48, 0x8b, 0x03, 0xe8, 0x20, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x83, 0xf8, 0xff, 0x3f,
    0x00, 0xe8, 0x14, 0x00, 0x00, 0x00, 0xc6, 0x03, 0x55, 0x48, 0x8b, 0x03, 0xe8, 0x09, 0x00, 0x00,
    0x00, 0x66, 0xba, 0xf8, 0x03, 0xb0, 0x0a, 0xee, 0xeb, 0xd8, 0x66, 0xba, 0xf8, 0x03, 0xb9, 0x08,
    0x00, 0x00, 0x00, 0xee, 0x48, 0xc1, 0xe8, 0x08, 0xff, 0xc9, 0x75, 0xf7, 0xc3,
];

/// A minimal ELF64 executable with `GUEST` as its one segment at 1 MiB:
/// the VMM's Linux loader takes it like a vmlinux.
fn guest_elf() -> Vec<u8> {
    const LOAD: u64 = 0x10_0000;
    const OFF: u64 = 0x1000;
    let mut e = Vec::new();
    e.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&0x3eu16.to_le_bytes()); // x86-64
    e.extend_from_slice(&1u32.to_le_bytes());
    e.extend_from_slice(&LOAD.to_le_bytes()); // entry
    e.extend_from_slice(&64u64.to_le_bytes()); // phoff
    e.extend_from_slice(&0u64.to_le_bytes()); // shoff
    e.extend_from_slice(&0u32.to_le_bytes()); // flags
    for v in [64u16, 56, 1, 64, 0, 0] {
        e.extend_from_slice(&v.to_le_bytes()); // ehsize phentsize phnum shentsize shnum shstrndx
    }
    e.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    e.extend_from_slice(&5u32.to_le_bytes()); // R+X
    for v in [
        OFF,
        LOAD,
        LOAD,
        GUEST.len() as u64,
        GUEST.len() as u64,
        0x1000,
    ] {
        e.extend_from_slice(&v.to_le_bytes());
    }
    e.resize(usize::try_from(OFF).unwrap(), 0);
    e.extend_from_slice(GUEST);
    e
}

fn write_image(path: &Path, first: u64, last: u64) {
    let mut b = vec![0u8; usize::try_from(IMAGE_LEN).unwrap()];
    for (i, x) in b.iter_mut().enumerate() {
        *x = u8::try_from(i % 251).unwrap();
    }
    b[..8].copy_from_slice(&first.to_le_bytes());
    let n = b.len();
    b[n - 8..].copy_from_slice(&last.to_le_bytes());
    std::fs::write(path, b).unwrap();
}

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    kernel: PathBuf,
    image: PathBuf,
}

fn setup() -> Setup {
    require_kvm();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let kernel = root.join("guest.elf");
    std::fs::write(&kernel, guest_elf()).unwrap();
    let image = root.join("image.img");
    write_image(&image, FIRST, LAST);
    Setup {
        _dir: dir,
        root,
        kernel,
        image,
    }
}

fn config(s: &Setup) -> VmConfig {
    let boot = BootSource::Linux {
        kernel: s.kernel.clone(),
        cmdline: "console=ttyS0".into(),
        initrd: None,
    };
    VmConfig {
        pmem: vec![PmemConfig {
            path: s.image.clone(),
            fd: None,
        }],
        ..small_config(boot, 32)
    }
}

fn rd32(vm: &Vm, addr: u64) -> u32 {
    let mut b = [0u8; 4];
    assert!(vm.mmio_read(addr, &mut b), "nothing at {addr:#x}");
    u32::from_le_bytes(b)
}

/// Runs `vm` with a control socket until the guest printed at least
/// `rounds` rounds; then `at_rounds` runs with the socket (e.g. a
/// snapshot) and the VM is shut down. Returns what the guest printed and
/// the stats taken at that point.
fn run_rounds(
    vm: Vm,
    cap: &Capture,
    sock: &Path,
    rounds: usize,
    at_rounds: impl FnOnce(&Path),
) -> vmm_api::Stats {
    let runner = spawn_with_api(vm, sock, Duration::from_secs(300), false);
    let t = Duration::from_secs(30);
    let deadline = Instant::now() + Duration::from_secs(240);
    while cap.rounds().len() < rounds {
        assert!(
            !runner.is_finished(),
            "guest stopped: {:?}",
            runner.join().unwrap().exit
        );
        assert!(Instant::now() < deadline, "guest made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    let api = Client::new(sock, t);
    let mut stats = None;
    while stats.is_none() {
        stats = api.stats().ok();
    }
    at_rounds(sock);
    api.shutdown().unwrap();
    let out = runner.join().unwrap();
    assert_eq!(out.exit, ExitReason::Stopped);
    stats.unwrap()
}

fn assert_rounds_ok(cap: &Capture, what: &str) {
    let r = cap.rounds();
    assert!(!r.is_empty(), "{what}: no rounds");
    for (i, &(first, last, after)) in r.iter().enumerate() {
        assert_eq!(first, FIRST, "{what} round {i}: first qword");
        assert_eq!(last, LAST, "{what} round {i}: last qword");
        assert_eq!(after, FIRST, "{what} round {i}: the write was not dropped");
    }
}

#[test]
fn guest_reads_the_image_and_its_writes_are_dropped() {
    let s = setup();
    let before = std::fs::read(&s.image).unwrap();
    let cap = Capture::default();
    let vm = Vm::new(&config(&s), cap.sink()).unwrap();

    // One pmem device after the one RAM slot, at 4 GiB.
    let info = vm.pmem_info();
    assert_eq!(info.len(), 1);
    assert_eq!(
        (info[0].slot, info[0].guest_addr, info[0].len),
        (1, PMEM_GPA, IMAGE_LEN)
    );
    assert_eq!(info[0].path, s.image);
    // Announced like every virtio-mmio device; no disks or vsock, so it is
    // device 0.
    let cmdline = vm.cmdline().unwrap();
    assert!(
        cmdline.contains(&format!("virtio_mmio.device=4K@{VIRTIO_MMIO_BASE:#x}:5")),
        "{cmdline}"
    );
    // Config space through the MMIO bus, as the guest driver reads it.
    let base = VIRTIO_MMIO_BASE;
    assert_eq!(rd32(&vm, base), 0x7472_6976, "virtio magic");
    assert_eq!(rd32(&vm, base + 0x8), 27, "virtio-pmem device id");
    let start = u64::from(rd32(&vm, base + 0x100)) | u64::from(rd32(&vm, base + 0x104)) << 32;
    let size = u64::from(rd32(&vm, base + 0x108)) | u64::from(rd32(&vm, base + 0x10c)) << 32;
    assert_eq!((start, size), (PMEM_GPA, IMAGE_LEN));

    let stats = run_rounds(vm, &cap, &s.root.join("api.sock"), 3, |_| {});
    assert_rounds_ok(&cap, "boot");
    assert!(
        stats.pmem_guest_writes >= 2,
        "guest writes counted: {}",
        stats.pmem_guest_writes
    );
    assert_eq!(
        std::fs::read(&s.image).unwrap(),
        before,
        "image file unchanged"
    );
}

#[test]
fn an_inherited_descriptor_is_the_image_whatever_its_name_names() {
    use std::os::fd::AsRawFd;
    let s = setup();
    // The name given is a symbolic link to another file: the VMM maps the
    // descriptor it was handed, and only records the name.
    let other = s.root.join("other.img");
    std::fs::write(&other, vec![0u8; usize::try_from(IMAGE_LEN).unwrap()]).unwrap();
    let name = s.root.join("name.img");
    std::os::unix::fs::symlink(&other, &name).unwrap();
    let file = std::fs::File::open(&s.image).unwrap();
    let mut c = config(&s);
    c.pmem = vec![PmemConfig {
        path: name.clone(),
        fd: Some(file.as_raw_fd()),
    }];
    let cap = Capture::default();
    let vm = Vm::new(&c, cap.sink()).unwrap();
    assert_eq!(vm.pmem_info()[0].path, name);
    run_rounds(vm, &cap, &s.root.join("api.sock"), 2, |_| {});
    assert_rounds_ok(&cap, "booted from the inherited descriptor");
    // By path, the link itself is refused.
    let mut c = config(&s);
    c.pmem[0].path = name;
    let e = Vm::new(&c, None).err().expect("refused").to_string();
    assert!(e.contains("symbolic links"), "{e}");
}

fn take_snapshot(s: &Setup) -> PathBuf {
    let cap = Capture::default();
    let vm = Vm::new(&config(s), cap.sink()).unwrap();
    let snap = s.root.join("snap");
    let s2 = snap.clone();
    run_rounds(vm, &cap, &s.root.join("api.sock"), 1, move |sock| {
        Client::new(sock, Duration::from_secs(30))
            .snapshot(&s2, false)
            .unwrap();
    });
    snap
}

/// Restores `snap` and runs it for two more rounds.
fn restore_and_run(s: &Setup, snap: &Path) {
    let cap = Capture {
        resync: true,
        ..Capture::default()
    };
    let vm = Vm::restore(snap, cap.sink(), Default::default()).unwrap();
    let info = vm.pmem_info();
    assert_eq!(
        (info[0].slot, info[0].guest_addr, info[0].len),
        (1, PMEM_GPA, IMAGE_LEN)
    );
    run_rounds(vm, &cap, &s.root.join("restored.sock"), 2, |_| {});
    // The complete rounds after the snapshot point read the image through
    // the re-registered slot.
    assert_rounds_ok(&cap, "restored");
}

#[test]
fn snapshot_restore_and_reload_map_the_same_image() {
    let s = setup();
    let snap = take_snapshot(&s);
    let st: SnapshotState = snapshot::load(&snap.join("state")).unwrap();
    assert_eq!(st.pmem.len(), 1);
    assert_eq!(
        (
            st.pmem[0].path.as_path(),
            st.pmem[0].guest_addr,
            st.pmem[0].len
        ),
        (s.image.as_path(), PMEM_GPA, IMAGE_LEN)
    );
    assert_eq!(st.virtio.len(), 1);
    assert_eq!(st.virtio[0].device_type, 27);

    restore_and_run(&s, &snap);
    restore_and_run(&s, &snap);

    // Reload into a pre-warmed VM: maps the image; a second reload of the
    // same snapshot keeps that mapping and slot.
    let mut vm = Vm::prewarmed(32, 1, None, Default::default()).unwrap();
    assert!(vm.pmem_info().is_empty());
    vm.reload(&snap).unwrap();
    let first = vm.pmem_info();
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].slot, first[0].guest_addr), (1, PMEM_GPA));
    vm.reload(&snap).unwrap();
    assert_eq!(vm.pmem_info(), first, "same image: mapping reused");
    let base = VIRTIO_MMIO_BASE;
    assert_eq!(rd32(&vm, base + 0x8), 27);
    assert_eq!(u64::from(rd32(&vm, base + 0x100)), PMEM_GPA & 0xffff_ffff);
    assert_eq!(u64::from(rd32(&vm, base + 0x104)), PMEM_GPA >> 32);

    // A byte-identical copy renamed over the image (new inode) still
    // restores (the fingerprint samples the content).
    let copy = s.root.join("copy.img");
    std::fs::copy(&s.image, &copy).unwrap();
    std::fs::rename(&copy, &s.image).unwrap();
    restore_and_run(&s, &snap);
    // The live VM still maps the snapshot's own image (the old inode, held
    // open): it keeps that mapping rather than re-map the path.
    vm.reload(&snap).unwrap();
    assert_eq!(
        vm.pmem_info(),
        first,
        "the snapshot's image: mapping reused"
    );

    // A different image under the same name is refused by restore and by
    // a reload that has to map the path (a fresh pre-warmed VM); the live
    // VM that holds the snapshot's image open keeps working.
    let other = s.root.join("other.img");
    write_image(&other, FIRST ^ 1, LAST);
    std::fs::rename(&other, &s.image).unwrap();
    let e = Vm::restore(&snap, None, Default::default())
        .err()
        .expect("restore onto a changed image")
        .to_string();
    assert!(e.contains("changed since the snapshot"), "{e}");
    assert!(e.contains("image.img"), "{e}");
    let mut fresh = Vm::prewarmed(32, 1, None, Default::default()).unwrap();
    let e = fresh.reload(&snap).unwrap_err().to_string();
    assert!(e.contains("changed since the snapshot"), "{e}");
    assert!(fresh.pmem_info().is_empty());
    vm.reload(&snap).unwrap();
    assert_eq!(vm.pmem_info(), first);
    drop(vm);

    // Modified in place between the sampled blocks (same inode, same
    // sampled bytes, new mtime).
    write_image(&s.image, FIRST, LAST);
    let snap2 = {
        let s2 = Setup {
            _dir: tempfile::tempdir().unwrap(),
            root: s.root.join("second"),
            kernel: s.kernel.clone(),
            image: s.image.clone(),
        };
        std::fs::create_dir_all(&s2.root).unwrap();
        take_snapshot(&s2)
    };
    std::thread::sleep(Duration::from_millis(20));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&s.image)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[7], IMAGE_LEN / 2 + 8192).unwrap();
    drop(f);
    let e = Vm::restore(&snap2, None, Default::default())
        .err()
        .expect("restore onto an image modified in place")
        .to_string();
    assert!(e.contains("modified in place"), "{e}");
}

#[test]
fn snapshot_device_count_and_paths_are_checked() {
    let s = setup();
    let snap = take_snapshot(&s);
    let edit = |name: &str, f: &dyn Fn(&mut SnapshotState)| {
        let d = s.root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(snap.join("memory"), d.join("memory")).unwrap();
        let mut st: SnapshotState = snapshot::load(&snap.join("state")).unwrap();
        f(&mut st);
        snapshot::save(&d.join("state"), &st).unwrap();
        Vm::restore(&d, None, Default::default())
            .err()
            .expect("restore of an edited snapshot")
            .to_string()
    };
    // Config without its pmem device: the transport count no longer fits.
    let e = edit("no-pmem-config", &|st| {
        let mut c: VmConfig = serde_json::from_str(&st.config_json).unwrap();
        c.pmem.clear();
        st.config_json = serde_json::to_string(&c).unwrap();
    });
    assert!(
        e.contains("1 saved virtio devices, configuration has 0"),
        "{e}"
    );
    // Pmem state dropped: the configuration still names the device.
    let e = edit("no-pmem-state", &|st| st.pmem.clear());
    assert!(e.contains("0 saved, 1 configured"), "{e}");
    // State naming another file than the configuration.
    let e = edit("other-path", &|st| {
        st.pmem[0].path = "/elsewhere.img".into()
    });
    assert!(e.contains("/elsewhere.img"), "{e}");
    // Saved guest address overlapping RAM.
    let e = edit("in-ram", &|st| st.pmem[0].guest_addr = 0);
    assert!(e.contains("overlaps guest RAM"), "{e}");
}

#[test]
fn two_vms_share_one_image() {
    let s = setup();
    let a = Vm::new(&config(&s), None).unwrap();
    let b = Vm::new(&config(&s), None).unwrap();
    let (ia, ib) = (a.pmem_info(), b.pmem_info());
    assert_eq!(ia[0].guest_addr, ib[0].guest_addr);
    assert_ne!(ia[0].host_addr, ib[0].host_addr, "one mapping per VM");
    drop(a);
    // b's mapping is untouched by a's teardown.
    let cap = Capture::default();
    drop(b);
    let vm = Vm::new(&config(&s), cap.sink()).unwrap();
    run_rounds(vm, &cap, &s.root.join("api.sock"), 1, |_| {});
    assert_rounds_ok(&cap, "after teardown of others");
}

#[test]
fn cli_refuses_missing_misaligned_and_truncated_images() {
    let s = setup();
    let kernel = s.kernel.to_string_lossy().into_owned();
    let p = |n: &str| s.root.join(n).to_string_lossy().into_owned();

    let e = vmm_error(&["--kernel", &kernel, "--pmem", &p("missing.img")]);
    assert!(
        e.contains("missing.img") && e.contains("No such file"),
        "{e}"
    );

    std::fs::write(p("odd.img"), vec![0u8; 3 << 20]).unwrap();
    let e = vmm_error(&["--kernel", &kernel, "--pmem", &p("odd.img")]);
    assert!(
        e.contains("odd.img") && e.contains("not a multiple of 2097152"),
        "{e}"
    );
    assert!(e.contains("shoal image build"), "{e}");

    std::fs::write(p("empty.img"), b"").unwrap();
    let e = vmm_error(&["--kernel", &kernel, "--pmem", &p("empty.img")]);
    assert!(e.contains("empty"), "{e}");

    // An erofs superblock claiming 8 MiB in a 2 MiB file: truncated.
    let mut t = vec![0u8; 2 << 20];
    t[1024..1028].copy_from_slice(&0xe0f5_e1e2u32.to_le_bytes());
    t[1024 + 12] = 12;
    t[1024 + 36..1024 + 40].copy_from_slice(&2048u32.to_le_bytes());
    std::fs::write(p("trunc.img"), t).unwrap();
    let e = vmm_error(&["--kernel", &kernel, "--pmem", &p("trunc.img")]);
    assert!(e.contains("truncated"), "{e}");

    // Inherited descriptors: a number of 3 or above, open, and a name.
    for (arg, want) in [
        ("fd:1=/x", "3 or above"),
        ("fd:7", "expected fd:N=PATH"),
        ("fd:x=/x", "not a descriptor number"),
        (
            "fd:99=/named.img",
            "/named.img: cannot use the inherited descriptor",
        ),
    ] {
        let e = vmm_error(&["--kernel", &kernel, "--pmem", arg]);
        assert!(e.contains(want), "{arg}: {e}");
    }

    // A directory.
    let e = vmm_error(&["--kernel", &kernel, "--pmem", &s.root.to_string_lossy()]);
    assert!(e.contains("not a regular file"), "{e}");

    // Conflicts with a snapshot restore.
    let out = std::process::Command::new(VMM)
        .args(["--restore", "/nonexistent", "--pmem", &p("odd.img")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
