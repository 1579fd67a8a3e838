//! Helpers of the VMM's integration tests that name the VMM's types
//! (`shoal-test-support`, the home of what tests share, must not depend on
//! `vmm`: the VMM's tests depend on it).

#![allow(dead_code)] // each test binary uses some of these

use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;
use vmm::{BootSource, RunOptions, RunOutcome, SerialOutput, Vm, VmConfig};

/// A one-vCPU VM booting `boot` in `memory_mib`, with no devices and its
/// console kept to 1 MiB (given to `Vm::new`'s writer).
pub fn small_config(boot: BootSource, memory_mib: u32) -> VmConfig {
    VmConfig {
        boot,
        vcpus: 1,
        memory_mib,
        disks: vec![],
        serial: SerialOutput::Null,
        serial_limit_bytes: 1 << 20,
        cpu_profile: None,
        vsock: None,
        pmem: vec![],
        net: None,
        balloon: None,
    }
}

/// Runs `vm` on a thread, stopped after `timeout`, with its control
/// socket at `sock`; with `keep_alive` the VM stays up when its guest
/// ends (a pre-warmed VM waiting for restores).
pub fn spawn_with_api(
    vm: Vm,
    sock: &Path,
    timeout: Duration,
    keep_alive: bool,
) -> JoinHandle<RunOutcome> {
    let api_sock = Some(sock.to_path_buf());
    std::thread::spawn(move || {
        vm.run_with(RunOptions {
            timeout: Some(timeout),
            api_sock,
            keep_alive,
            ready: None,
            seccomp: None,
        })
        .unwrap()
    })
}

/// The `shoal-vmm` binary of this build.
pub const VMM: &str = env!("CARGO_BIN_EXE_shoal-vmm");

/// Runs `shoal-vmm args`, which must fail with exit status 1 and one line
/// `shoal-vmm: error: ...` on stderr, never a panic; returns that stderr.
pub fn vmm_error(args: &[&str]) -> String {
    let out = std::process::Command::new(VMM).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "panic for {args:?}: {err}");
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    let lines: Vec<_> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: expected one line, got:\n{err}");
    assert!(lines[0].starts_with("shoal-vmm: error: "), "{err}");
    err
}
