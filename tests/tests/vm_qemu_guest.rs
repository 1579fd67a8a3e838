//! The `vm` kind with a real guest: our kernel (PCI, virtio-pci,
//! virtio-console) booted by QEMU `q35` (KVM, SeaBIOS, PVH entry) from a
//! read-only base image (the tiny erofs image, raw) under a per-sandbox
//! qcow2 overlay, its agent reached over one virtio-serial port through
//! the host bridge (no vhost-vsock on these hosts). One cold boot, then:
//! exec, files, a screenshot, pause and resume, a snapshot restored as two
//! clones that diverge, and kill with nothing left behind.
//!
//! On PVM hosts the kernel needs the `clearcpuid=`/`shoal.pvm` words our
//! VMM adds (QEMU adds none); they come from the same code.

use agent_client::{Client, ExecRequest};
use shoal_runtime::backend::qemu::Qemu;
use shoal_runtime::backend::qemu_launch::{Firmware, QemuTools, VmSpec};
use shoal_runtime::backend::{SandboxBackend, SandboxVm, Source};
use shoal_test_support::kvm_serial;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Kills every QEMU under its directory when dropped.
struct KillUnder(PathBuf);

impl Drop for KillUnder {
    fn drop(&mut self) {
        for p in shoal_runtime::vm::processes_under(&self.0, "qemu-system-x86_64") {
            p.kill();
        }
    }
}

fn spec() -> VmSpec {
    let pvm = vmm::vm::profile_kernel_args(None).expect("read KVM's CPUID");
    VmSpec {
        vcpus: 1,
        memory_mib: 256,
        base: shoal_test_support::image("tiny_erofs"),
        base_format: "raw".into(),
        kernel: Some(shoal_test_support::kernel()),
        append: shoal_runtime::backend::qemu::vm_cmdline(&shoal_test_support::cmdline(), &pvm),
        firmware: Firmware::Bios,
        ready_marker: Some("SHOAL-INIT-READY".into()),
        serial_console: false,
        net: false,
    }
}

fn connect(vm: &dyn SandboxVm) -> Client {
    let c = Client::connect_retry(&vm.agent(), Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("agent over virtio-serial: {e}; {}", vm.last_words()));
    c.set_timeout(Some(Duration::from_secs(60)));
    c
}

fn sh(c: &Client, script: &str) -> String {
    let out = c
        .exec_simple(&ExecRequest::argv(["/bin/sh", "-c", script]))
        .unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    assert_eq!(
        out.result.status,
        agent_client::ExitStatus::Exited(0),
        "{script:?}: {out:?}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn png_size(png: &[u8]) -> (u32, u32) {
    let r = png::Decoder::new(png).read_info().expect("a PNG");
    (r.info().width, r.info().height)
}

fn gone(dir: &Path) -> bool {
    shoal_runtime::vm::processes_under(dir, "qemu-system-x86_64").is_empty()
}

#[test]
fn a_q35_guest_runs_commands_over_virtio_serial_and_forks_into_clones() {
    let _kvm = kvm_serial();
    let t = tempfile::tempdir().unwrap();
    let _reap = KillUnder(t.path().to_path_buf());
    let be = Qemu::new(QemuTools::default(), None);

    let t0 = Instant::now();
    let vm = be.boot(&t.path().join("src"), &spec()).expect("cold boot");
    eprintln!("cold boot to the agent's ready line: {:?}", t0.elapsed());
    let c = connect(&*vm);
    eprintln!("first agent connection: {:?}", t0.elapsed());
    assert_eq!(sh(&c, "echo hello from q35"), "hello from q35\n");
    // The guest sees its disk over virtio-pci.
    assert!(sh(&c, "cat /proc/partitions").contains("vda"));

    let data: Vec<u8> = (0..100_000u32)
        .map(|i| u8::try_from(i * 7 % 251).unwrap())
        .collect();
    c.write_file("/tmp/data", &data, 0o644)
        .expect("write a file");
    assert_eq!(c.read_file("/tmp/data").expect("read it back"), data);

    let png = vm.screen().expect("screenshot");
    assert_eq!(&png[1..4], b"PNG");
    let (w, h) = png_size(&png);
    assert!(w >= 640 && h >= 400, "a VGA-sized screen: {w}x{h}");

    vm.freeze().unwrap();
    assert!(vm.stats().unwrap().frozen);
    vm.thaw().unwrap();
    assert_eq!(sh(&c, "echo after resume"), "after resume\n");

    c.write_file("/tmp/who", b"source", 0o644).unwrap();
    let snap = t.path().join("snap");
    let t0 = Instant::now();
    vm.snapshot(&snap).expect("snapshot");
    eprintln!("snapshot: {:?}", t0.elapsed());
    let clones: Vec<_> = ["c1", "c2"]
        .iter()
        .map(|n| {
            let t0 = Instant::now();
            let v = be
                .restore(&t.path().join(n), &Source::Snapshot(snap.clone()), None)
                .expect("restore a clone");
            let c = connect(&*v);
            eprintln!("restore {n} to a connected agent: {:?}", t0.elapsed());
            (v, c)
        })
        .collect();
    std::fs::remove_dir_all(&snap).unwrap();
    for (i, (_, cc)) in clones.iter().enumerate() {
        assert_eq!(cc.read_file("/tmp/who").unwrap(), b"source");
        cc.write_file("/tmp/who", format!("clone {i}").as_bytes(), 0o644)
            .unwrap();
    }
    for (i, (_, cc)) in clones.iter().enumerate() {
        assert_eq!(
            cc.read_file("/tmp/who").unwrap(),
            format!("clone {i}").as_bytes()
        );
        assert_eq!(cc.read_file("/tmp/data").unwrap(), data);
    }
    assert_eq!(
        c.read_file("/tmp/who").unwrap(),
        b"source",
        "the source is untouched"
    );

    drop(c);
    for v in [&*vm as &dyn SandboxVm, &*clones[0].0, &*clones[1].0] {
        v.destroy(Duration::from_secs(5));
    }
    assert!(gone(t.path()), "no QEMU left");
    for d in ["src", "c1", "c2"] {
        let q = t.path().join(d).join("qemu");
        for f in ["qmp.sock", "agent.sock", "agent-port.sock"] {
            assert!(!q.join(f).exists(), "{d}: {f} left behind");
        }
    }
    let cats = shoal_runtime::vm::processes_under(t.path(), "cat");
    assert!(cats.is_empty(), "no migration helper left");
}
