//! The built-in language layers (`shoal_images::lang_layers`: Debian
//! packages over `base`, built by `deb_layer` from this checkout, cached):
//! on the host, each layer's dpkg database must list base's packages and
//! its own; in a real guest, one template of `base` with all four layers
//! stacked (`/dev/pmem1..4`) and one sandbox restored from it must show
//! every layer's files (layers made over one base hide nothing of each
//! other), while base alone has none of them.
//!
//! Each layer's programs are run, over base alone, where they are used:
//! python with numpy, g++ and node by FnCall's tests (tests/fncall.rs and
//! the SDK's SandboxFusion tests; each language's template is base plus
//! its one layer), pandas and matplotlib by the E2B code-interpreter tests
//! (its template is base plus `code-interpreter`). Running them here too
//! cost ~10 minutes on a loaded PVM host: each maps and faults in tens of
//! MiB of binaries and libraries through the emulated guest kernel.
//!
//! One template boot for the binary. Building the layers the first time
//! takes minutes (apt downloads; needs root and a Debian mirror).

use agent_client::ExitStatus;
use shoal_runtime::sandbox::{self, TemplateSpec};
use shoal_test_support::{image, require_kvm, require_root, sh, RunningSandbox};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The layers, lowest first (`/dev/pmem1` is the first).
const LAYERS: [&str; 4] = [
    "fncall-python",
    "fncall-cpp",
    "fncall-nodejs",
    "code-interpreter",
];

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    eprintln!("{what}: {:.1} s", t.elapsed().as_secs_f64());
    r
}

/// The packages a layer's dpkg database lists as installed (read on the
/// host from the mounted layer).
fn installed(root: &Path) -> Vec<String> {
    let status = std::fs::read_to_string(root.join("var/lib/dpkg/status"))
        .unwrap_or_else(|e| panic!("{}: no dpkg database: {e}", root.display()));
    status
        .split("\n\n")
        .filter(|p| p.lines().any(|l| l == "Status: install ok installed"))
        .filter_map(|p| p.lines().find_map(|l| l.strip_prefix("Package: ")))
        .map(String::from)
        .collect()
}

/// Mounts a layer read-only on the host for the duration of `f`.
fn with_mounted<T>(img: &Path, f: impl FnOnce(&Path) -> T) -> T {
    let dir = tempfile::tempdir().unwrap();
    let st = Command::new("mount")
        .args(["-t", "erofs", "-o", "loop,ro"])
        .arg(img)
        .arg(dir.path())
        .status()
        .expect("mount");
    assert!(st.success(), "mount {} (erofs, loop)", img.display());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(dir.path())));
    let st = Command::new("umount")
        .arg(dir.path())
        .status()
        .expect("umount");
    assert!(st.success(), "umount {}", dir.path().display());
    r.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

#[test]
fn each_language_layer_lists_its_packages_and_shows_in_the_stack() {
    require_kvm();
    require_root("building the layers mounts the base image and runs apt-get in a chroot");
    let files: Vec<PathBuf> = timed("the layers (built or cached)", || {
        LAYERS
            .iter()
            .map(|l| image(&format!("{l}_erofs")))
            .collect()
    });
    // The dpkg database of each layer: base's packages and its own.
    for (layer, file) in LAYERS.iter().zip(&files) {
        let r = shoal_images::lang_layers::recipe(layer).expect("a built-in layer");
        let have = with_mounted(file, installed);
        for p in ["python3", "bash", "dpkg", "libc6"]
            .iter()
            .chain(r.packages)
        {
            assert!(have.iter().any(|h| h == p), "{layer}: {p} not installed");
        }
    }
    let spec = TemplateSpec {
        layers: files,
        ..TemplateSpec::new("base", 1, 512)
    };
    let t = timed("the template", || {
        sandbox::template(&spec, &mut |l| eprintln!("{l}"))
            .unwrap_or_else(|e| panic!("the base template with the language layers: {e}"))
    });
    let (_r, c) = timed("restore", || RunningSandbox::start(&t));

    // The stack shows every layer's tools; base alone has none of them.
    let tools = [
        "usr/bin/g++-12",
        "usr/bin/node",
        "usr/lib/python3/dist-packages/numpy/__init__.py",
        "usr/lib/python3/dist-packages/pandas/__init__.py",
        "usr/lib/python3/dist-packages/matplotlib/__init__.py",
    ]
    .join(" ");
    let (out, err, st) = sh(
        &c,
        &format!("cd / && ls {tools} | wc -l; cd /run/shoal/image && ls {tools} 2>&1"),
    );
    assert_eq!(st, ExitStatus::Exited(2), "{out}{err}");
    let (count, missing) = out.split_once('\n').unwrap_or((&out, ""));
    assert_eq!(count, "5", "every layer's files in the stack: {out}{err}");
    assert_eq!(
        missing.matches("No such file or directory").count(),
        5,
        "base alone has none of them: {out}{err}"
    );
}

/// The builder's handling of the host overlay's marks, on real whiteouts
/// and `trusted.overlay.*` xattrs (root: mknod, trusted xattrs): marks
/// that hide something of the image stay, the rest goes.
#[test]
fn overlay_marks_that_hide_nothing_of_the_image_are_dropped() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    require_root("whiteouts are device nodes and overlay marks are trusted.* xattrs");
    let dir = tempfile::Builder::new()
        .prefix("lang-marks")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
    for d in ["etc", "usr/share"] {
        std::fs::create_dir_all(lower.join(d)).unwrap();
        std::fs::create_dir_all(upper.join(d)).unwrap();
    }
    std::fs::write(lower.join("etc/gone"), "x").unwrap();
    std::fs::create_dir_all(upper.join("usr/newdir")).unwrap();
    std::fs::write(upper.join("usr/share/x"), "x").unwrap();
    for w in ["etc/gone", "etc/never"] {
        let st = Command::new("mknod")
            .arg(upper.join(w))
            .args(["c", "0", "0"])
            .status()
            .unwrap();
        assert!(st.success(), "mknod {w}");
    }
    let setfattr = |p: &str, name: &str, value: &str| {
        let c =
            std::ffi::CString::new(upper.join(p).into_os_string().into_encoded_bytes()).unwrap();
        let n = std::ffi::CString::new(name).unwrap();
        // SAFETY: NUL-terminated strings and a value buffer alive for the
        // call, its length passed.
        let r = unsafe {
            libc::lsetxattr(
                c.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(
            r,
            0,
            "setxattr {p} {name}: {}",
            std::io::Error::last_os_error()
        );
    };
    setfattr("usr/newdir", "trusted.overlay.opaque", "y");
    setfattr("usr/share", "trusted.overlay.opaque", "y");
    setfattr("usr/share/x", "trusted.overlay.origin", "\u{1}");
    setfattr("usr/share/x", "user.kept", "1");
    let stats = shoal_images::deb_layer::strip_overlay_marks(&upper, &lower).unwrap();
    assert_eq!((stats.whiteouts, stats.opaque), (1, 1), "{stats:?}");
    let gone = std::fs::symlink_metadata(upper.join("etc/gone")).unwrap();
    assert!(gone.file_type().is_char_device() && gone.rdev() == 0);
    assert!(std::fs::symlink_metadata(upper.join("etc/never")).is_err());
    let xattrs = |p: &str| {
        let out = Command::new("python3")
            .args([
                "-c",
                "import os,sys; print(sorted(os.listxattr(sys.argv[1], follow_symlinks=False)))",
            ])
            .arg(upper.join(p))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(xattrs("usr/newdir"), "[]");
    assert_eq!(xattrs("usr/share"), "['trusted.overlay.opaque']");
    assert_eq!(xattrs("usr/share/x"), "['user.kept']");
}
