//! Helpers for Shoal's tests: the integration tests, which boot real
//! guests on /dev/kvm, and the tests without KVM that run the agent as a
//! host process ([`host_agent`]).

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Panics with a clear message when /dev/kvm is unusable: these tests must
/// fail, not skip, on a host without KVM.
pub fn require_kvm() {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        panic!("integration tests boot real guests and need /dev/kvm (read-write): {e}");
    }
}

/// The cached template of the `tiny` image (1 vCPU, 128 MiB), booted and
/// snapshotted on first use, once per test binary.
pub fn tiny_template() -> PathBuf {
    static T: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        require_kvm();
        let spec = shoal_runtime::sandbox::TemplateSpec::new("tiny", 1, 128);
        shoal_runtime::sandbox::template(&spec, &mut |l| eprintln!("{l}")).expect("template")
    })
    .clone()
}

/// The `shoal-agent` binary for host-mode use (the fake sandbox backend):
/// `$SHOAL_AGENT` if set, else this workspace's debug build, brought up
/// to date with `cargo build -p guest-agent --bin shoal-agent` once per
/// test binary (cargo only builds the binaries of the package under test).
/// Panics with the reason if it cannot be had: tests that need it fail.
pub fn host_agent() -> PathBuf {
    static A: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
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
    static L: std::sync::OnceLock<Layout> = std::sync::OnceLock::new();
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

/// The guest kernel (built by scripts/build-kernel.sh if missing).
pub fn kernel() -> PathBuf {
    shoal_images::artifacts::kernel().expect("guest kernel")
}

/// A guest image (`tiny_erofs`, `tiny_cpio`, `base_erofs`).
pub fn image(key: &str) -> PathBuf {
    shoal_images::artifacts::image(key).expect("guest image")
}

/// The base kernel command line.
pub fn cmdline() -> String {
    shoal_images::artifacts::base_cmdline()
}

/// Collects console output in memory.
#[derive(Clone, Default)]
pub struct Console(pub Arc<Mutex<Vec<u8>>>);

impl Console {
    /// Everything so far, lossily decoded.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl Write for Console {
    fn write(&mut self, d: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(d);
        Ok(d.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
