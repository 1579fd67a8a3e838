//! Boots our guest kernel on /dev/kvm with the tiny image (about 20 s per
//! boot on a PVM host, well under a second on hardware KVM).

use shoal_test_support::{cmdline, image, kernel, require_kvm, Console};
use std::io::Write;
use std::time::Duration;
use vmm::{BootSource, DiskConfig, ExitReason, RunOutcome, SerialOutput, Vm, VmConfig};

const BOOT_LIMIT: Duration = Duration::from_secs(300);

fn linux(cmd: String, initrd: Option<std::path::PathBuf>, disks: Vec<DiskConfig>) -> VmConfig {
    VmConfig {
        boot: BootSource::Linux {
            kernel: kernel(),
            cmdline: cmd,
            initrd,
        },
        vcpus: 1,
        memory_mib: 128,
        disks,
        serial: SerialOutput::Null,
        serial_limit_bytes: 16 << 20,
        cpu_profile: None,
        vsock: None,
        pmem: vec![],
        net: None,
        balloon: None,
    }
}

/// Runs `cfg` to its end (within [`BOOT_LIMIT`]): how it ended and what
/// the guest printed.
fn boot(cfg: &VmConfig) -> (RunOutcome, String) {
    let console = Console::default();
    let vm = Vm::new(cfg, Some(Box::new(console.clone()))).unwrap();
    let out = vm.run(Some(BOOT_LIMIT)).unwrap();
    (out, console.text())
}

#[test]
fn boots_to_init_with_ro_and_rw_disks_and_exits_on_reboot() {
    require_kvm();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.img");
    let scratch = dir.path().join("scratch.img");
    let pattern = b"SHOAL-DATA-0123456789-abcdefghij"; // 32 bytes
    let mut d = pattern.to_vec();
    d.resize(1 << 20, 0);
    std::fs::write(&data, &d).unwrap();
    std::fs::write(&scratch, vec![0u8; 1 << 20]).unwrap();
    let script = "head -c 32 /dev/vdb; echo; \
                  (echo x > /dev/vdb) 2>/dev/null && echo RO-WRITE-ACCEPTED || echo RO-WRITE-REFUSED; \
                  echo shoal-wrote-this > /dev/vdc";
    let cmd = format!(
        "{} root=/dev/vda rootfstype=erofs ro init=/sbin/shoal-agent -- /bin/sh -c \"{script}\"",
        cmdline()
    );
    let cfg = linux(
        cmd,
        None,
        vec![
            DiskConfig {
                path: image("tiny_erofs"),
                read_only: true,
            },
            DiskConfig {
                path: data.clone(),
                read_only: true,
            },
            DiskConfig {
                path: scratch.clone(),
                read_only: false,
            },
        ],
    );
    let (out, text) = boot(&cfg);
    assert_eq!(out.exit, ExitReason::Reset, "console:\n{text}");
    assert!(text.contains("SHOAL-INIT-READY"), "no init marker:\n{text}");
    assert!(
        text.contains(std::str::from_utf8(pattern).unwrap()),
        "guest did not read the data disk:\n{text}"
    );
    assert!(text.contains("RO-WRITE-REFUSED"), "{text}");
    assert!(text.contains("SHOAL-EXIT 0"), "{text}");
    let written = std::fs::read(&scratch).unwrap();
    assert_eq!(
        &written[..17],
        b"shoal-wrote-this\n",
        "host sees the guest's write"
    );
    assert_eq!(std::fs::read(&data).unwrap(), d, "read-only disk unchanged");
}

#[test]
fn initrd_only_boot() {
    require_kvm();
    // loglevel=7: the informational kernel lines checked below.
    let cmd = format!(
        "{} loglevel=7 -- /bin/busybox echo initrd-boot-ok",
        cmdline()
    );
    let cfg = linux(cmd, Some(image("tiny_cpio")), vec![]);
    let (out, text) = boot(&cfg);
    assert_eq!(out.exit, ExitReason::Reset, "console:\n{text}");
    // The guest's tty turns "\n" into "\r\n".
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
    assert!(lines.contains(&"SHOAL-INIT-READY"), "{text}");
    assert!(lines.contains(&"initrd-boot-ok"), "{text}");
    assert!(text.contains("SHOAL-EXIT 0"), "{text}");
    assert!(out.first_run.unwrap() <= out.first_console_byte.unwrap());
    // The VMM's RNG seed (setup_data) made the guest CRNG ready in
    // setup_arch(), before start_kernel() prints the command line.
    let crng = text.find("random: crng init done");
    let cmdline_line = text.find("Kernel command line:");
    assert!(
        matches!((crng, cmdline_line), (Some(a), Some(b)) if a < b),
        "CRNG not ready before the command line was printed:\n{text}"
    );
    if vmm::host::kvm_kind().as_str() == "pvm" {
        // The PVM profile's kernel words reached our kernel's patches.
        assert!(
            text.contains("shoal.pvm: PVM host workarounds enabled"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "shoal.tick_mult: busy tick every {} jiffies",
                vmm::cpu::cpuid::PVM_TICK_MULT
            )),
            "{text}"
        );
    }
}

#[test]
fn kernel_panic_ends_the_vm() {
    require_kvm();
    // No root device and no initrd: the kernel panics; with panic=-1 it
    // reboots at once and the VMM ends instead of hanging.
    let cmd = format!("{} root=/dev/vda", cmdline());
    let cfg = linux(cmd, None, vec![]);
    let (out, text) = boot(&cfg);
    assert_eq!(out.exit, ExitReason::Reset, "console:\n{text}");
    assert!(text.contains("Kernel panic"), "{text}");
    let _ = std::io::stderr().flush();
}
