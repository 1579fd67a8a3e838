//! Every bad configuration ends `shoal-vmm` with a one-line error and a
//! nonzero exit status, never a panic.

mod common;

use common::{vmm_error, VMM};
use std::process::Command;

fn expect_error(args: &[&str], needle: &str) {
    let err = vmm_error(args);
    assert!(err.contains(needle), "{args:?}: want {needle:?} in {err}");
}

#[test]
fn bad_configs_each_give_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    std::fs::write(d("not-elf"), b"this is not a kernel").unwrap();
    std::fs::write(d("disk"), vec![0u8; 4096]).unwrap();
    let big = std::fs::File::create(d("big-initrd")).unwrap();
    big.set_len(64 << 20).unwrap();
    std::fs::write(
        d("bad.json"),
        br#"{"boot":{"type":"linux","kernel":"/k"},"cpus":2}"#,
    )
    .unwrap();
    std::fs::write(d("broken.json"), b"{").unwrap();

    expect_error(&[], "no kernel");
    // Net device specs (checked before the kernel is opened).
    let k = d("not-elf");
    for (spec, needle) in [
        ("mac=02:00:00:00:00:01", "expected fd:N or tap=NAME"),
        ("fd:1,mac=02:00:00:00:00:01", "3 or above"),
        ("fd:9", "mac=XX"),
        ("fd:9,mac=ff:ff:ff:ff:ff:ff", "unicast"),
        ("fd:9,mac=02:00:00:00:00:01,rx_bps=fast", "> 0"),
    ] {
        expect_error(&["--kernel", &k, "--net", spec], needle);
    }
    // A descriptor that is not a TAP.
    expect_error(
        &["--kernel", &k, "--net", "fd:200,mac=02:00:00:00:00:01"],
        "net: ",
    );
    expect_error(
        &[
            "--kernel",
            &k,
            "--restore-net",
            "fd:9,mac=02:00:00:00:00:01",
        ],
        "--restore-net needs --restore or --prewarm",
    );
    expect_error(&["--kernel", &d("missing")], "cannot open kernel");
    expect_error(
        &["--kernel", &d("not-elf")],
        "expected an uncompressed ELF vmlinux",
    );
    expect_error(
        &["--kernel", &d("not-elf"), "--disk", &d("missing-disk")],
        "cannot open disk image",
    );
    expect_error(
        &[
            "--kernel",
            &d("not-elf"),
            "--disk",
            &format!("{},rx", d("disk")),
        ],
        "unknown option 'rx'",
    );
    expect_error(
        &["--kernel", &d("not-elf"), "--vcpus", "0"],
        "vcpus must be",
    );
    expect_error(
        &["--kernel", &d("not-elf"), "--memory", "4"],
        "memory_mib must be",
    );
    expect_error(
        &["--kernel", &d("not-elf"), "--serial", "tty"],
        "expected stdout, null or file:PATH",
    );
    expect_error(
        &["--kernel", &d("not-elf"), "--cpu-profile", "vmx"],
        "unknown CPU profile",
    );
    expect_error(&["--config", &d("bad.json")], "unknown field `cpus`");
    expect_error(&["--config", &d("broken.json")], "invalid config file");
    expect_error(&["--config", &d("missing.json")], "cannot read config file");
    expect_error(
        &[
            "--kernel",
            &d("not-elf"),
            "--serial",
            &format!("file:{}", d("no/such/dir/log")),
        ],
        "cannot create serial file",
    );
}

#[test]
fn boot_stage_errors_need_a_kernel() {
    // These are checked after the kernel loads: the real guest kernel.
    let kernel = shoal_test_support::kernel();
    let k = kernel.to_string_lossy().into_owned();
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big-initrd");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    expect_error(
        &[
            "--kernel",
            &k,
            "--memory",
            "32",
            "--initrd",
            &big.to_string_lossy(),
        ],
        "does not fit in guest memory",
    );
    let long = "x".repeat(3000);
    expect_error(&["--kernel", &k, "--cmdline", &long], "; the limit is 2047");
}

#[test]
fn check_host_reports_kvm() {
    let out = Command::new(VMM)
        .args(["--check-host", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(["hardware", "pvm", "none"].contains(&v["kvm"].as_str().unwrap()));
    assert!(v["checks"].as_array().unwrap().len() >= 7);
}
