//! The `vm` kind's backend for `shoald` (QEMU q35), when this host has
//! QEMU, our kernel and the tiny image.

use anyhow::{anyhow, Context, Result};
use shoal_runtime::backend::qemu::{vm_cmdline, Qemu, VmImage};
use shoal_runtime::backend::qemu_launch::{Firmware, QemuTools};
use shoal_runtime::backend::qemu_probe::probe;
use std::path::Path;

/// The `vm` backend (templates boot our kernel on the installed tiny
/// image, with Shoal's agent as PID 1), or why this host cannot run it.
pub fn backend(artifacts: &shoal_images::artifacts::Layout) -> Result<Qemu> {
    let tools = QemuTools::default();
    let host = probe(&tools.qemu, &tools.qemu_img);
    if host.qemu.is_none() || !host.qemu_img {
        return Err(anyhow!(
            "{} or {} does not run",
            tools.qemu.display(),
            tools.qemu_img.display()
        ));
    }
    let kernel = artifacts.kernel()?;
    let base = artifacts.image("tiny")?;
    for p in [&kernel, &base] {
        if !Path::new(p).is_file() {
            return Err(anyhow!("{} is not installed", p.display()));
        }
    }
    let pvm = vmm::vm::profile_kernel_args(None).context("reading KVM's CPUID")?;
    Ok(Qemu::new(
        tools,
        Some(VmImage {
            base,
            base_format: "raw".into(),
            kernel: Some(kernel),
            append: vm_cmdline(&artifacts.cmdline()?, &pvm),
            firmware: Firmware::Bios,
            ready_marker: Some("SHOAL-INIT-READY".into()),
        }),
    ))
}
