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

/// The `shoal-agent` binary for host-mode use (the fake sandbox backend):
/// `$SHOAL_AGENT` if set, else this workspace's debug build, brought up
/// to date with `cargo build -p guest-agent --bin shoal-agent` once per
/// test binary (cargo only builds the binaries of the package under test).
/// Panics with the reason if it cannot be had: tests that need it fail.
pub fn host_agent() -> PathBuf {
    static A: OnceLock<PathBuf> = OnceLock::new();
    A.get_or_init(|| {
        if let Some(p) = std::env::var_os("SHOAL_AGENT") {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "SHOAL_AGENT={} is not a file", p.display());
            return p;
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace root")
            .to_path_buf();
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        let out = std::process::Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "-p",
                "guest-agent",
                "--bin",
                "shoal-agent",
            ])
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", &target)
            .output()
            .expect("running cargo to build shoal-agent");
        assert!(
            out.status.success(),
            "cargo build -p guest-agent --bin shoal-agent failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let p = target.join("debug/shoal-agent");
        assert!(p.is_file(), "{} was not built", p.display());
        p
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
