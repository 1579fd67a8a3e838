//! Snapshot and restore of small hand-made guests on /dev/kvm: a guest
//! snapshotted mid-computation continues in every clone; bad snapshots are
//! refused with clear errors. Each test holds `kvm_serial()` while its VMs
//! exist: run in parallel in one process, they failed intermittently on a
//! PVM host (see its documentation).

mod common;

use common::{small_config, spawn_with_api};
use shoal_test_support::{kvm_serial, Console};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vmm::persist::SnapshotState;
use vmm::{BootSource, ExitReason, Vm, VmConfig};
use vmm_api::{Client, VmState};

const ITERS: u32 = 1 << 18;
const DOT_EVERY: u32 = 1 << 12;

/// A client of the VMM's control socket at `sock`.
fn api(sock: &Path, t: Duration) -> Client {
    Client::new(sock, t)
}

/// Real-mode guest: for ecx = ITERS..1 { ebx = ebx*31 + ecx; in al,0x80;
/// print '.' every DOT_EVERY }, then print ebx (4 bytes LE) and '\n', reset.
fn program() -> Vec<u8> {
    let mut c = vec![0xba, 0xf8, 0x03, 0x66, 0x31, 0xdb, 0x66, 0xb9];
    c.extend_from_slice(&ITERS.to_le_bytes());
    c.extend_from_slice(&[
        0x66, 0x6b, 0xdb, 0x1f, // imul ebx,ebx,31
        0x66, 0x01, 0xcb, // add ebx,ecx
        0xe4, 0x80, // in al,0x80 (an exit per iteration)
        0xf7, 0xc1, 0xff, 0x0f, // test cx,0x0fff
        0x75, 0x03, // jnz +3
        0xb0, 0x2e, 0xee, // mov al,'.'; out dx,al
        0x66, 0x49, // dec ecx
        0x75, 0xea, // jnz loop
    ]);
    for _ in 0..4 {
        c.extend_from_slice(&[0x88, 0xd8, 0xee, 0x66, 0xc1, 0xeb, 0x08]);
    }
    c.extend_from_slice(&[0xb0, 0x0a, 0xee, 0xb0, 0xfe, 0xe6, 0x64, 0xf4, 0xeb, 0xfd]);
    c
}

fn expected() -> Vec<u8> {
    let mut ebx: u32 = 0;
    for ecx in (1..=ITERS).rev() {
        ebx = ebx.wrapping_mul(31).wrapping_add(ecx);
    }
    let mut v = ebx.to_le_bytes().to_vec();
    v.push(b'\n');
    v
}

fn config() -> VmConfig {
    let boot = BootSource::RealMode {
        code: program(),
        addr: 0x1000,
    };
    small_config(boot, 16)
}

fn split(out: &[u8]) -> (usize, Vec<u8>) {
    let dots = out.iter().take_while(|&&b| b == b'.').count();
    (dots, out[dots..].to_vec())
}

/// Runs the guest with a control socket, snapshots it after a few dots,
/// shuts it down. Returns (dots before the snapshot, snapshot dir).
fn snapshot_mid_run(dir: &Path) -> usize {
    let sock = dir.join("api.sock");
    let snap = dir.join("snap");
    let vm = Vm::new(&config(), Some(Box::new(Console::default()))).unwrap();
    let runner = spawn_with_api(vm, &sock, Duration::from_secs(120), false);
    let t = Duration::from_secs(10);
    let deadline = Instant::now() + Duration::from_secs(60);
    let before;
    loop {
        if let Ok(st) = api(&sock, t).stats() {
            if st.serial_bytes >= 3 {
                let info = api(&sock, t).snapshot(&snap, false).unwrap();
                assert!(info.memory_bytes == 16 << 20 && info.state_bytes > 0);
                let st = api(&sock, t).stats().unwrap();
                assert_eq!(st.state, VmState::Paused);
                before = usize::try_from(st.serial_bytes).unwrap();
                api(&sock, t).shutdown().unwrap();
                break;
            }
        }
        assert!(Instant::now() < deadline, "guest made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = runner.join().unwrap();
    assert_eq!(out.exit, ExitReason::Stopped);
    assert!(
        before < (ITERS / DOT_EVERY) as usize,
        "snapshot was not mid-run"
    );
    before
}

#[test]
fn clones_continue_a_computation_from_the_snapshot() {
    let _one_vm_at_a_time = kvm_serial();
    let dir = tempfile::tempdir().unwrap();
    let before = snapshot_mid_run(dir.path());
    let snap = dir.path().join("snap");
    let total = (ITERS / DOT_EVERY) as usize;
    for i in 0..10 {
        let cap = Console::default();
        let vm = Vm::restore(&snap, Some(Box::new(cap.clone())), Default::default()).unwrap();
        let out = vm.run(Some(Duration::from_secs(120))).unwrap();
        assert_eq!(out.exit, ExitReason::Reset, "clone {i}");
        let (dots, tail) = split(&cap.bytes());
        assert_eq!(
            before + dots,
            total,
            "clone {i} resumed at the snapshot point"
        );
        assert_eq!(tail, expected(), "clone {i} computed the right result");
    }
}

fn take_snapshot(dir: &Path) -> PathBuf {
    snapshot_mid_run(dir);
    dir.join("snap")
}

fn restore_err(snap: &Path) -> String {
    match Vm::restore(snap, Some(Box::new(Console::default())), Default::default()) {
        Ok(_) => panic!("restore of a bad snapshot succeeded"),
        Err(e) => e.to_string(),
    }
}

fn edit_state(snap: &Path, f: impl FnOnce(&mut SnapshotState)) {
    let mut st: SnapshotState = snapshot::load(&snap.join("state")).unwrap();
    f(&mut st);
    snapshot::save(&snap.join("state"), &st).unwrap();
}

#[test]
fn bad_snapshots_are_refused_clearly() {
    let _one_vm_at_a_time = kvm_serial();
    let dir = tempfile::tempdir().unwrap();
    let snap = take_snapshot(dir.path());
    let state = std::fs::read(snap.join("state")).unwrap();
    let copy = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["state", "memory"] {
            std::fs::copy(snap.join(f), d.join(f)).unwrap();
        }
        d
    };

    let d = copy("corrupt");
    let mut b = state.clone();
    let n = b.len() - 10;
    b[n] ^= 0x55;
    std::fs::write(d.join("state"), &b).unwrap();
    assert!(restore_err(&d).contains("checksum"), "{}", restore_err(&d));

    let d = copy("truncated");
    std::fs::write(d.join("state"), &state[..state.len() / 2]).unwrap();
    assert!(restore_err(&d).contains("truncated"));

    let d = copy("version");
    let mut b = state.clone();
    b[8..12].copy_from_slice(&999u32.to_le_bytes());
    std::fs::write(d.join("state"), &b).unwrap();
    assert!(restore_err(&d).contains("version 999"));

    let d = copy("short-memory");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("memory"))
        .unwrap();
    f.set_len(1 << 20).unwrap();
    assert!(restore_err(&d).contains("memory file is"));

    let d = copy("other-host");
    edit_state(&d, |s| {
        s.meta.host_kvm = if s.meta.host_kvm == "pvm" {
            "hardware"
        } else {
            "pvm"
        }
        .into()
    });
    assert!(restore_err(&d).contains("KVM host"));

    let d = copy("other-memory-size");
    edit_state(&d, |s| s.meta.memory_bytes *= 2);
    assert!(restore_err(&d).contains("memory layout"));

    let d = copy("other-devices");
    edit_state(&d, |s| {
        let mut c: VmConfig = serde_json::from_str(&s.config_json).unwrap();
        c.disks.push(vmm::DiskConfig {
            path: "/dev/null".into(),
            read_only: true,
        });
        s.config_json = serde_json::to_string(&c).unwrap();
    });
    assert!(restore_err(&d).contains("virtio devices"));

    let d = copy("no-memory");
    std::fs::remove_file(d.join("memory")).unwrap();
    assert!(restore_err(&d).contains("memory"));

    // More disk files than the snapshot has disks.
    let opts = vmm::RestoreOptions {
        disks: vec![dir.path().join("scratch.img")],
        ..Default::default()
    };
    let e = match Vm::restore(&snap, Some(Box::new(Console::default())), opts) {
        Ok(_) => panic!("a disk override for a snapshot without disks was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("1 disk files given for a snapshot with 0 disks"),
        "{e}"
    );

    // The original still restores.
    assert!(Vm::restore(
        &snap,
        Some(Box::new(Console::default())),
        Default::default()
    )
    .is_ok());
}

/// Runs `cfg` on a thread with a control socket in `dir`; returns once the
/// socket answers.
fn run_with_api(cfg: &VmConfig, dir: &Path) -> (PathBuf, std::thread::JoinHandle<vmm::RunOutcome>) {
    let sock = dir.join("api.sock");
    let vm = Vm::new(cfg, Some(Box::new(Console::default()))).unwrap();
    let runner = spawn_with_api(vm, &sock, Duration::from_secs(120), false);
    while api(&sock, Duration::from_secs(10)).stats().is_err() {
        std::thread::sleep(Duration::from_millis(5));
    }
    (sock, runner)
}

#[test]
fn pause_resume_and_stats() {
    let _one_vm_at_a_time = kvm_serial();
    let dir = tempfile::tempdir().unwrap();
    let (sock, runner) = run_with_api(&config(), dir.path());
    let t = Duration::from_secs(10);
    api(&sock, t).pause().unwrap();
    // Sampling a paused guest leaves it paused.
    let rips = api(&sock, t).sample().unwrap();
    assert!((0x1000..0x1000 + program().len() as u64).contains(&rips[0]));
    let a = api(&sock, t).stats().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let b = api(&sock, t).stats().unwrap();
    assert_eq!(a.state, VmState::Paused);
    assert_eq!(a.serial_bytes, b.serial_bytes, "no progress while paused");
    api(&sock, t).resume().unwrap();
    let out = runner.join().unwrap();
    assert_eq!(
        out.exit,
        ExitReason::Reset,
        "resumed guest ran to completion"
    );
}

#[test]
fn sampling_a_running_guest_finds_it_and_leaves_it_running() {
    let _one_vm_at_a_time = kvm_serial();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.boot = BootSource::RealMode {
        // 1: in al,0x80; jmp 1b. (A real-mode `jmp $` would be emulated
        // in-kernel on PVM hosts, which never leave KVM_RUN for a signal.)
        code: vec![0xe4, 0x80, 0xeb, 0xfc],
        addr: 0x1000,
    };
    let (sock, runner) = run_with_api(&cfg, dir.path());
    let t = Duration::from_secs(10);
    for _ in 0..3 {
        let rips = api(&sock, t).sample().unwrap();
        assert_eq!(rips.len(), 1);
        assert!((0x1000..0x1004).contains(&rips[0]), "rip {:#x}", rips[0]);
        let st = api(&sock, t).stats().unwrap();
        assert_eq!(st.state, VmState::Running);
    }
    api(&sock, t).shutdown().unwrap();
    assert_eq!(runner.join().unwrap().exit, ExitReason::Stopped);
}

#[test]
fn prewarmed_vm_reloads_snapshots_repeatedly() {
    let _one_vm_at_a_time = kvm_serial();
    let dir = tempfile::tempdir().unwrap();
    let before = snapshot_mid_run(dir.path());
    let snap = dir.path().join("snap");
    let total = (ITERS / DOT_EVERY) as usize;
    let sock = dir.path().join("pool.sock");
    let cap = Console::default();
    let vm = Vm::prewarmed(16, 1, Some(Box::new(cap.clone())), Default::default()).unwrap();
    let runner = spawn_with_api(vm, &sock, Duration::from_secs(300), true);
    let t = Duration::from_secs(30);
    let wait_empty = || {
        let end = Instant::now() + Duration::from_secs(120);
        loop {
            let st = api(&sock, t).stats().map(|s| s.state);
            if matches!(st, Ok(VmState::Empty)) {
                return;
            }
            assert!(Instant::now() < end, "guest did not finish");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_empty();
    let e = api(&sock, t).pause().unwrap_err();
    assert!(e.to_string().contains("no guest"), "{e}");
    // Twice from empty, then once replacing a running guest.
    for round in 0..3 {
        let r = api(&sock, t).restore(&snap, &[]).unwrap();
        assert!(r.restore_ms > 0.0);
        if round == 2 {
            // Replace the running guest at once: its output restarts.
            api(&sock, t).restore(&snap, &[]).unwrap();
        }
        wait_empty();
    }
    api(&sock, t).shutdown().unwrap();
    runner.join().unwrap();
    let out = cap.bytes();
    let results: Vec<&[u8]> = out
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(results.len(), 3, "three completed guests");
    for r in results {
        let (dots, tail) = split(r);
        let mut tail = tail;
        tail.push(b'\n');
        assert_eq!(tail, expected());
        assert!(
            dots + before >= total,
            "each run resumed at or before the snapshot point"
        );
    }
    // A snapshot of another memory size is refused.
    let mut other = Vm::prewarmed(
        32,
        1,
        Some(Box::new(Console::default())),
        Default::default(),
    )
    .unwrap();
    let e = other.reload(&snap).unwrap_err().to_string();
    assert!(e.contains("16 MiB") && e.contains("32 MiB"), "{e}");
}

#[test]
fn diff_snapshot_of_a_restored_vm_continues_correctly() {
    let _one_vm_at_a_time = kvm_serial();
    let dir = tempfile::tempdir().unwrap();
    let before = snapshot_mid_run(dir.path());
    let snap = dir.path().join("snap");
    let total = (ITERS / DOT_EVERY) as usize;
    // Restore, let it run a little further, take a diff snapshot.
    let sock = dir.path().join("clone.sock");
    let cap = Console::default();
    let vm = Vm::restore(&snap, Some(Box::new(cap.clone())), Default::default()).unwrap();
    let runner = spawn_with_api(vm, &sock, Duration::from_secs(120), false);
    let t = Duration::from_secs(30);
    let diff_dir = dir.path().join("diff");
    let end = Instant::now() + Duration::from_secs(60);
    let at_diff = loop {
        if let Ok(st) = api(&sock, t).stats() {
            if st.serial_bytes >= 2 {
                let info = api(&sock, t).snapshot(&diff_dir, true).unwrap();
                assert!(
                    info.memory_bytes < 4 << 20,
                    "the diff holds only written pages, not all 16 MiB: {}",
                    info.memory_bytes
                );
                let n = api(&sock, t).stats().unwrap().serial_bytes;
                api(&sock, t).shutdown().unwrap();
                break usize::try_from(n).unwrap();
            }
        }
        assert!(Instant::now() < end);
        std::thread::sleep(Duration::from_millis(5));
    };
    runner.join().unwrap();
    assert!(!diff_dir.join("memory").exists());
    assert!(diff_dir.join("memory.diff").exists());
    for i in 0..2 {
        let cap = Console::default();
        let vm = Vm::restore(&diff_dir, Some(Box::new(cap.clone())), Default::default()).unwrap();
        let out = vm.run(Some(Duration::from_secs(120))).unwrap();
        assert_eq!(out.exit, ExitReason::Reset, "diff clone {i}");
        let (dots, tail) = split(&cap.bytes());
        assert_eq!(
            before + at_diff + dots,
            total,
            "diff clone {i} resumed at the diff point"
        );
        assert_eq!(tail, expected(), "diff clone {i} result");
    }
    // Without its base the diff is refused clearly.
    std::fs::rename(snap.join("memory"), snap.join("moved")).unwrap();
    let e = Vm::restore(
        &diff_dir,
        Some(Box::new(Console::default())),
        Default::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("diff snapshot"), "{e}");
}
