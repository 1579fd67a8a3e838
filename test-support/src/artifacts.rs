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

/// The guest kernel and the `tiny` image, built from this checkout
/// (cached) and installed into `${SHOAL_CACHE:-~/.cache/shoal}/artifacts`
/// once per test binary: the layout test daemons read (`--artifacts`).
pub fn artifacts() -> shoal_images::artifacts::Layout {
    use shoal_images::artifacts::{build, Layout};
    static L: OnceLock<Layout> = OnceLock::new();
    L.get_or_init(|| {
        let c = build::Checkout::find().expect("the tests run from a Shoal checkout");
        let l = Layout::in_cache();
        c.build_and_install(&l, &["tiny"], &mut |_| {}, &mut build::quiet_unless_slow())
            .unwrap_or_else(|e| {
                panic!(
                    "installing the guest artifacts into {}: {e}",
                    l.dir.display()
                )
            });
        l
    })
    .clone()
}

/// The guest kernel: built by the checkout's script (cached), or the
/// installed one without a checkout.
pub fn kernel() -> PathBuf {
    shoal_images::artifacts::kernel().unwrap_or_else(|e| panic!("the guest kernel: {e}"))
}

/// A guest image (`tiny_erofs`, `tiny_cpio`, `base_erofs`), found like
/// [`kernel`].
pub fn image(key: &str) -> PathBuf {
    shoal_images::artifacts::image(key).unwrap_or_else(|e| panic!("guest image {key}: {e}"))
}

/// The base kernel command line.
pub fn cmdline() -> String {
    shoal_images::artifacts::base_cmdline()
}
