//! A layered pmem root from a cold boot, checked from the boot log and the
//! host's files: the tiny image on `/dev/pmem0` (the kernel mounts it as
//! the root, erofs with DAX), a toolkit image on `/dev/pmem1` as a second
//! read-only lower layer, and the overlay's upper layer on an ext4 scratch
//! disk (virtio-blk) instead of tmpfs. The guest runs one script from the
//! toolkit layer as its command, then powers off; the host then finds the
//! guest's writes in the scratch disk and both images unchanged.
//!
//! One guest boot (~20-30 s on a PVM host). Needs the `shoal-vmm` binary
//! (`SHOAL_VMM` or the workspace build), root and /dev/kvm.

use shoal_images::artifacts;
use shoal_images::image::{build_image_with, AgentSource, BuildOptions, ImageSource};
use shoal_runtime::launch::{self, BootSpec, Monitor, RootKind};
use shoal_test_support::{cmdline, image, kernel, require_kvm};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const CHECK: &str = "#!/bin/sh
echo \"TOOLKIT $(cat /opt/toolkit/hello.txt)\"
echo layer-proof > /etc/layer-proof || exit 1
echo changed > /opt/toolkit/hello.txt || exit 1
echo \"AFTER $(cat /opt/toolkit/hello.txt)\"
grep -E ' / |/run/shoal/image' /proc/mounts
";

/// `debugfs -R "cat PATH"` on an ext4 image: a file's content, read on
/// the host without mounting it.
fn ext4_cat(img: &Path, path: &str) -> String {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("cat {path}"))
        .arg(img)
        .output()
        .expect("debugfs (e2fsprogs)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn toolkit_layer_and_scratch_disk_upper_from_a_cold_boot() {
    require_kvm();
    let dir = tempfile::Builder::new()
        .prefix("pmem-layers")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let base = image("tiny_erofs");
    // The toolkit layer: a directory with the check script.
    let src = dir.path().join("toolkit");
    std::fs::create_dir_all(src.join("opt/toolkit")).unwrap();
    std::fs::write(src.join("opt/toolkit/hello.txt"), "from-the-toolkit\n").unwrap();
    std::fs::write(src.join("opt/toolkit/check.sh"), CHECK).unwrap();
    let toolkit = dir.path().join("toolkit.erofs");
    let opts = BuildOptions {
        agent: AgentSource::None,
    };
    let info = build_image_with(ImageSource::Dir(src), &toolkit, &opts).unwrap();
    assert!(info.dax && info.len.is_multiple_of(2 << 20), "{info:?}");
    // The scratch disk: pre-formatted ext4 (no mkfs in the guest), inode
    // tables initialised here rather than by the guest kernel.
    let scratch = dir.path().join("scratch.ext4");
    let st = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096"])
        .args(["-E", "lazy_itable_init=0,lazy_journal_init=0"])
        .arg(&scratch)
        .arg("32M")
        .stdout(std::process::Stdio::null())
        .status()
        .expect("mkfs.ext4 (e2fsprogs)");
    assert!(st.success());
    let base_before = std::fs::read(&base).unwrap();
    let toolkit_before = std::fs::read(&toolkit).unwrap();

    let spec = BootSpec {
        kernel: kernel(),
        root: base.clone(),
        root_kind: RootKind::Pmem,
        // loglevel=7: the kernel's informational "Mounted root" line.
        cmdline: format!("{} loglevel=7", cmdline()),
        init_args: vec!["/bin/sh".into(), "/opt/toolkit/check.sh".into()],
        memory_mib: 128,
        vcpus: 1,
        vsock_uds: None,
        extra_pmem: vec![toolkit.clone()],
        upper_disk: Some(scratch.clone()),
        upper_size_mib: None,
    };
    let vmm = artifacts::vmm_binary().expect("shoal-vmm built");
    let mut log = String::new();
    let run = launch::boot(
        &spec,
        &Monitor::Shoal(vmm),
        Duration::from_secs(300),
        &mut |l| {
            log.push_str(l);
            log.push('\n');
        },
    )
    .unwrap_or_else(|e| panic!("boot: {e}\n{log}"));
    assert_eq!(run.guest_exit, Some(0), "{log}");

    // The kernel mounted the root from pmem0 with DAX, before init ran.
    let dax = log.find("erofs: DAX enabled").expect(&log);
    let root = log
        .find("VFS: Mounted root (erofs filesystem) readonly on device 259:0")
        .expect(&log);
    assert!(dax < root, "{log}");
    for bad in [
        "Turning off DAX",
        "unsupported blocksize for DAX",
        "falling back",
    ] {
        assert!(!log.contains(bad), "{bad}: {log}");
    }
    // Both layers visible, the upper one writable; the image seen with DAX.
    assert!(log.contains("TOOLKIT from-the-toolkit"), "{log}");
    assert!(log.contains("AFTER changed"), "{log}");
    assert!(log.contains("overlay / overlay rw"), "{log}");
    let image_line = log
        .lines()
        .find(|l| l.contains(" /run/shoal/image "))
        .expect(&log);
    assert!(
        image_line.contains("erofs ro") && image_line.contains("dax"),
        "{image_line}"
    );

    // The writes are in the scratch disk's upper directory, not the images.
    assert_eq!(
        ext4_cat(&scratch, "/upper/etc/layer-proof"),
        "layer-proof\n"
    );
    assert_eq!(
        ext4_cat(&scratch, "/upper/opt/toolkit/hello.txt"),
        "changed\n"
    );
    assert!(
        std::fs::read(&base).unwrap() == base_before,
        "base image changed"
    );
    assert!(
        std::fs::read(&toolkit).unwrap() == toolkit_before,
        "toolkit image changed"
    );
}
