//! The VMM's balloon device on /dev/kvm with a halted real-mode guest (no
//! driver): it sits in the MMIO slot after the other devices, takes its
//! target over the control socket (checked against guest memory), and
//! keeps it across a snapshot (the `balloon` file beside `state`); a VM
//! without one refuses the request and writes no such file.

mod common;

use common::{small_config, spawn_with_api};
use devices::virtio::balloon::{BalloonConfig, TYPE_BALLOON};
use shoal_test_support::{kvm_serial, Console};
use std::path::Path;
use std::time::Duration;
use vmm::layout::VIRTIO_MMIO_BASE;
use vmm::{BootSource, ExitReason, Vm, VmConfig};
use vmm_api::{ApiError, Client};

const T: Duration = Duration::from_secs(10);

/// 16 MiB, one vCPU halted for good.
fn config(balloon: bool) -> VmConfig {
    let boot = BootSource::RealMode {
        code: vec![0xf4, 0xeb, 0xfd],
        addr: 0x1000,
    };
    let mut c = small_config(boot, 16);
    c.balloon = balloon.then(|| BalloonConfig {
        stats_interval_s: 1,
        ..BalloonConfig::new()
    });
    c
}

fn rd32(vm: &Vm, addr: u64) -> u32 {
    let mut b = [0u8; 4];
    assert!(vm.mmio_read(addr, &mut b), "nothing at {addr:#x}");
    u32::from_le_bytes(b)
}

/// Runs `vm` with a control socket in `dir`, calls `f` with its client,
/// shuts it down.
fn with_api(vm: Vm, dir: &Path, name: &str, f: impl FnOnce(&Client)) {
    let sock = dir.join(name);
    let runner = spawn_with_api(vm, &sock, Duration::from_secs(120), false);
    let c = Client::new(&sock, T);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while c.stats().is_err() {
        assert!(std::time::Instant::now() < deadline, "no control socket");
        std::thread::sleep(Duration::from_millis(5));
    }
    f(&c);
    c.shutdown().unwrap();
    assert_eq!(runner.join().unwrap().exit, ExitReason::Stopped);
}

#[test]
fn balloon_target_over_the_control_socket_survives_a_snapshot() {
    let _one_vm_at_a_time = kvm_serial();
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    let vm = Vm::new(&config(true), Some(Box::new(Console::default()))).unwrap();
    // The only virtio device: slot 0.
    assert_eq!(rd32(&vm, VIRTIO_MMIO_BASE), 0x7472_6976);
    assert_eq!(rd32(&vm, VIRTIO_MMIO_BASE + 8), TYPE_BALLOON);
    with_api(vm, dir.path(), "a.sock", |c| {
        let b = c.balloon(Some(4)).unwrap();
        assert_eq!((b.target_mib, b.actual_mib, b.inflated_pages), (4, 0, 0));
        for too_big in [17, u64::MAX] {
            match c.balloon(Some(too_big)).unwrap_err() {
                ApiError::Refused { request, message } => {
                    assert_eq!(request, "balloon");
                    assert!(message.contains("balloon target"), "{message}");
                }
                e => panic!("{e:?}"),
            }
        }
        assert_eq!(c.balloon(None).unwrap().target_mib, 4);
        c.snapshot(&snap, false).unwrap();
    });
    assert!(snap.join("balloon").is_file());

    let vm = Vm::restore(
        &snap,
        Some(Box::new(Console::default())),
        Default::default(),
    )
    .unwrap();
    assert_eq!(rd32(&vm, VIRTIO_MMIO_BASE + 8), TYPE_BALLOON);
    with_api(vm, dir.path(), "b.sock", |c| {
        assert_eq!(c.balloon(None).unwrap().target_mib, 4);
    });

    // A corrupt balloon file is refused, not ignored.
    std::fs::write(snap.join("balloon"), b"not a snapshot").unwrap();
    let e = Vm::restore(&snap, None, Default::default()).err().unwrap();
    assert!(e.to_string().contains("balloon"), "{e}");
}

#[test]
fn a_vm_without_a_balloon_refuses_the_request() {
    let _one_vm_at_a_time = kvm_serial();
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("balloon"), b"stale").unwrap();
    let vm = Vm::new(&config(false), Some(Box::new(Console::default()))).unwrap();
    with_api(vm, dir.path(), "a.sock", |c| {
        match c.balloon(Some(1)).unwrap_err() {
            ApiError::Refused { message, .. } => {
                assert!(message.contains("no balloon"), "{message}")
            }
            e => panic!("{e:?}"),
        }
        c.snapshot(&snap, false).unwrap();
    });
    assert!(!snap.join("balloon").exists(), "a stale file is removed");
}
