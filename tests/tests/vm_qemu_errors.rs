//! The `vm` kind (QEMU, q35) on firmware alone (SeaBIOS, no bootable
//! disk: a guest whose screen shows text and that runs until killed):
//! screenshots, pause/resume, snapshot and restore into clones, kill with
//! nothing left behind; and the failures a user meets first: a bad disk
//! image, missing OVMF when UEFI is asked for, and QEMU dying in the
//! middle of a request. Real QEMU on /dev/kvm (PVM hosts run SeaBIOS fine).

use shoal_runtime::backend::qemu::{Qemu, QemuVm};
use shoal_runtime::backend::qemu_launch::{Firmware, QemuTools, VmSpec};
use shoal_runtime::backend::{BackendError, InputEvent, SandboxBackend, SandboxVm, Source};
use shoal_test_support::kvm_serial;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn spec(base: &Path) -> VmSpec {
    VmSpec {
        vcpus: 1,
        memory_mib: 128,
        base: base.to_path_buf(),
        base_format: "raw".into(),
        kernel: None,
        append: String::new(),
        firmware: Firmware::Bios,
        ready_marker: None,
        serial_console: false,
        net: false,
    }
}

/// Width, height and the number of distinct colours of a PNG.
fn png_info(png: &[u8]) -> (u32, u32, usize) {
    let d = png::Decoder::new(png);
    let mut r = d.read_info().expect("a PNG");
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).expect("PNG pixels");
    let px = info.line_size / info.width as usize;
    let mut colours: Vec<&[u8]> = buf[..info.buffer_size()].chunks(px).collect();
    colours.sort_unstable();
    colours.dedup();
    (info.width, info.height, colours.len())
}

/// QEMU processes whose command line names `dir`.
fn qemus_under(dir: &Path) -> Vec<i32> {
    shoal_runtime::vm::processes_under(dir, "qemu-system-x86_64")
        .iter()
        .map(|p| p.pid)
        .collect()
}

/// Waits (up to 30 s) until the screen is in VGA text mode (720x400) and
/// shows more than one colour (SeaBIOS has printed its banner); returns
/// that PNG.
fn screen_with_text(vm: &QemuVm) -> Vec<u8> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let png = vm.screen().expect("screendump");
        let (w, h, colours) = png_info(&png);
        if (w, h, colours > 1) == (720, 400, true) || Instant::now() > end {
            return png;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Kills every QEMU under its directory when dropped (a failed assertion
/// leaves none running).
struct KillUnder(PathBuf);

impl Drop for KillUnder {
    fn drop(&mut self) {
        for p in shoal_runtime::vm::processes_under(&self.0, "qemu-system-x86_64") {
            p.kill();
        }
    }
}

fn raw_disk(dir: &Path) -> PathBuf {
    let p = dir.join("blank.raw");
    std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
    p
}

#[test]
fn firmware_vm_screens_pauses_snapshots_restores_and_leaves_nothing() {
    let _kvm = kvm_serial();
    let t = tempfile::tempdir().unwrap();
    let _reap = KillUnder(t.path().to_path_buf());
    let base = raw_disk(t.path());
    let be = Qemu::new(QemuTools::default(), None);
    let a_dir = t.path().join("a");
    let vm = be.boot(&a_dir, &spec(&base)).expect("boot SeaBIOS");
    let cgroups = vm.cgroups().to_vec();
    assert!(!cgroups.is_empty(), "QEMU runs in its own cgroup");
    for c in &cgroups {
        let procs = std::fs::read_to_string(c.join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l == vm.pid().to_string()),
            "{c:?}: {procs}"
        );
    }

    let png = screen_with_text(&vm);
    let (w, h, colours) = png_info(&png);
    assert_eq!((w, h), (720, 400), "SeaBIOS's VGA text mode");
    assert!(colours > 1, "the screen shows SeaBIOS's text, not a blank");
    vm.input(&[InputEvent::Key {
        key: "ret".into(),
        down: true,
    }])
    .expect("a key press");
    let e = vm
        .input(&[InputEvent::Key {
            key: "Ret\"".into(),
            down: true,
        }])
        .unwrap_err();
    assert!(e.to_string().contains("key code"), "{e}");

    vm.freeze().unwrap();
    assert!(vm.stats().unwrap().frozen);
    vm.thaw().unwrap();
    assert!(!vm.stats().unwrap().frozen);

    let snap = t.path().join("snap");
    let t0 = Instant::now();
    vm.snapshot(&snap).expect("snapshot");
    eprintln!("snapshot: {:?}", t0.elapsed());
    assert!(!vm.stats().unwrap().frozen, "the source runs on");
    let clones: Vec<_> = ["c1", "c2"]
        .iter()
        .map(|n| {
            let t0 = Instant::now();
            let c = be
                .restore(&t.path().join(n), &Source::Snapshot(snap.clone()), None)
                .expect("restore a clone");
            eprintln!("restore {n}: {:?}", t0.elapsed());
            c
        })
        .collect();
    std::fs::remove_dir_all(&snap).unwrap();
    for c in &clones {
        assert!(!c.stats().unwrap().frozen, "a clone runs");
        let (w, h, colours) = png_info(&c.screen().unwrap());
        assert_eq!((w, h), (720, 400));
        assert!(colours > 1, "a clone's screen is the source's");
    }

    // Pause to disk and back.
    let st = clones[0].pause_to_disk().expect("pause to disk");
    assert!(!clones[0].alive());
    assert!(be.can_resume(&t.path().join("c1"), &st));
    let back = be
        .restore(&t.path().join("c1"), &Source::Paused(st), None)
        .expect("resume from disk");
    assert!(!back.stats().unwrap().frozen);

    // A daemon restart finds a running VM again by its state.
    let again = be
        .reattach(&t.path().join("c2"), &clones[1].state())
        .expect("reattach");
    assert!(!again.frozen);

    for v in [&*vm as &dyn SandboxVm, &*back, &*clones[1]] {
        v.destroy(Duration::from_secs(5));
        assert!(!v.alive());
    }
    assert!(qemus_under(t.path()).is_empty(), "no QEMU left");
    for c in &cgroups {
        assert!(!c.exists(), "cgroup {c:?} removed");
    }
    for d in ["a", "c1", "c2"] {
        let q = t.path().join(d).join("qemu");
        assert!(!q.join("qmp.sock").exists(), "{q:?}: no socket left");
        assert!(
            !q.join("paused.vmstate").exists(),
            "{q:?}: no saved state left"
        );
    }
}

#[test]
fn bad_images_missing_ovmf_and_a_dying_qemu_are_clear_errors() {
    let _kvm = kvm_serial();
    let t = tempfile::tempdir().unwrap();
    let _reap = KillUnder(t.path().to_path_buf());
    let be = Qemu::new(QemuTools::default(), None);

    // A qcow2 that is not one.
    let bad = t.path().join("bad.qcow2");
    std::fs::write(&bad, b"QFI\xfbnot really a qcow2 image").unwrap();
    let e = be
        .boot(
            &t.path().join("b"),
            &VmSpec {
                base: bad,
                base_format: "qcow2".into(),
                ..spec(&raw_disk(t.path()))
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("bad.qcow2"), "{e}");
    assert!(e.to_string().contains("qemu-img"), "{e}");
    // A disk that does not exist.
    let e = be
        .boot(&t.path().join("b"), &spec(&t.path().join("none.raw")))
        .unwrap_err();
    assert!(e.to_string().contains("none.raw"), "{e}");

    // UEFI without OVMF.
    let e = be
        .boot(
            &t.path().join("u"),
            &VmSpec {
                firmware: Firmware::Uefi {
                    code: "/nonexistent/OVMF_CODE.fd".into(),
                    vars: "/nonexistent/OVMF_VARS.fd".into(),
                },
                ..spec(&raw_disk(t.path()))
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("OVMF"), "{e}");
    assert!(e.to_string().contains("ovmf"), "names the package: {e}");

    // QEMU dies in the middle of a request.
    let vm = be
        .boot(&t.path().join("d"), &spec(&raw_disk(t.path())))
        .unwrap();
    vm.freeze().unwrap();
    vm.kill();
    let e = vm.thaw().unwrap_err();
    assert!(
        matches!(e, BackendError::Exited { .. } | BackendError::Gone(_)),
        "{e:?}"
    );
    let e = vm.screen().unwrap_err();
    assert!(
        matches!(e, BackendError::Exited { .. } | BackendError::Gone(_)),
        "{e:?}"
    );
    vm.destroy(Duration::from_secs(5));
    assert!(qemus_under(t.path()).is_empty());
    for c in vm.cgroups() {
        assert!(!c.exists(), "cgroup {c:?} removed");
    }

    // After a daemon restart: a VM no sandbox claims is reclaimed, a
    // half-started one is discarded (with its cgroup), the kept one stays.
    let keep = be
        .boot(&t.path().join("k"), &spec(&raw_disk(t.path())))
        .unwrap();
    let stray = be
        .boot(&t.path().join("s"), &spec(&raw_disk(t.path())))
        .unwrap();
    let half = be
        .boot(&t.path().join("h"), &spec(&raw_disk(t.path())))
        .unwrap();
    let half_cgroups = half.cgroups().to_vec();
    be.discard(&t.path().join("h"), &half.state());
    assert!(!half.alive());
    for c in &half_cgroups {
        assert!(!c.exists(), "discard removes cgroup {c:?}");
    }
    let kept = keep.pid();
    assert_eq!(be.reclaim_strays(t.path(), &|pid| pid == kept), 1);
    assert!(!stray.alive() && keep.alive());
    stray.destroy(Duration::from_secs(5));
    keep.destroy(Duration::from_secs(5));
    assert!(qemus_under(t.path()).is_empty());
}
