//! The guest kernel, images and command line, and the cached test
//! template.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The cached template of the `tiny` image (1 vCPU, 128 MiB), booted and
/// snapshotted on first use, once per test binary.
pub fn tiny_template() -> PathBuf {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| {
        crate::require_kvm();
        let spec = shoal_runtime::sandbox::TemplateSpec::new("tiny", 1, 128);
        shoal_runtime::sandbox::template(&spec, &mut |l| eprintln!("{l}"))
            .unwrap_or_else(|e| panic!("the tiny template: {e}"))
    })
    .clone()
}

/// The guest kernel (built by scripts/build-kernel.sh if missing).
pub fn kernel() -> PathBuf {
    shoal_images::artifacts::kernel().unwrap_or_else(|e| panic!("the guest kernel: {e}"))
}

/// A guest image (`tiny_erofs`, `tiny_cpio`, `base_erofs`).
pub fn image(key: &str) -> PathBuf {
    shoal_images::artifacts::image(key).unwrap_or_else(|e| panic!("guest image {key}: {e}"))
}

/// The base kernel command line.
pub fn cmdline() -> String {
    shoal_images::artifacts::base_cmdline()
}
