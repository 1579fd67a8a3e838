use super::build::{self, Checkout, Event};
use super::*;
use std::os::unix::fs::MetadataExt;

#[test]
fn a_missing_file_names_itself_and_how_to_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let l = Layout::at(dir.path());
    let e = l.kernel().unwrap_err().to_string();
    assert!(e.contains("the guest kernel is not installed"), "{e}");
    assert!(
        e.contains(&dir.path().join("vmlinux").display().to_string()),
        "{e}"
    );
    assert!(e.contains("shoal artifacts build"), "{e}");
    assert!(e.contains("SHOAL_ARTIFACTS"), "{e}");
    let e = l.image("base").unwrap_err().to_string();
    assert!(
        e.contains("the 'base' image") && e.contains("images/base.erofs"),
        "{e}"
    );
    assert!(matches!(
        l.image("huge"),
        Err(ArtifactError::UnknownImage(_))
    ));
    assert!(l.status().iter().all(|(_, _, present)| !present));

    std::fs::write(dir.path().join("vmlinux"), "k").unwrap();
    std::fs::write(dir.path().join("cmdline"), "console=ttyS0 quiet\n").unwrap();
    assert_eq!(l.kernel().unwrap(), dir.path().join("vmlinux"));
    assert_eq!(l.cmdline().unwrap(), "console=ttyS0 quiet");
    let present: Vec<&str> = l
        .status()
        .iter()
        .filter(|(_, _, p)| *p)
        .map(|(i, _, _)| i.key)
        .collect();
    assert_eq!(present, ["vmlinux", "cmdline"]);
}

#[test]
fn script_lines_are_steps_progress_or_details() {
    assert_eq!(
        Event::parse("build-kernel.sh", "build-kernel: extracting x"),
        Event::Step("extracting x")
    );
    assert_eq!(
        Event::parse("build-kernel.sh", "build-kernel: progress 3/9 objects"),
        Event::Progress("3/9 objects")
    );
    assert_eq!(
        Event::parse("build-images.sh", "Get:1 http://deb.debian.org bookworm"),
        Event::Detail("Get:1 http://deb.debian.org bookworm")
    );
    assert_eq!(
        Event::parse("build-images.sh", "build-kernel: other script"),
        Event::Detail("build-kernel: other script")
    );
}

#[test]
fn install_links_replaces_atomically_and_skips_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let l = Layout::at(dir.path().join("inst"));
    let src = dir.path().join("built.erofs");
    std::fs::write(&src, "one").unwrap();
    let dst = build::install_file(&l, "tiny_erofs", &src).unwrap();
    assert_eq!(dst, l.dir.join("images/tiny.erofs"));
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    assert_eq!(ino(&dst), ino(&src), "a hard link on the same file system");
    // Installed again: nothing changes.
    build::install_file(&l, "tiny_erofs", &src).unwrap();
    assert_eq!(ino(&dst), ino(&src));
    // A rebuilt file replaces it; an open handle of the old one keeps its
    // contents (a restored VM maps it).
    let old = std::fs::File::open(&dst).unwrap();
    let src2 = dir.path().join("rebuilt.erofs");
    std::fs::write(&src2, "two").unwrap();
    build::install_file(&l, "tiny_erofs", &src2).unwrap();
    assert_eq!(std::fs::read_to_string(&dst).unwrap(), "two");
    assert_eq!(std::io::read_to_string(old).unwrap(), "one");
    assert_eq!(l.image("tiny").unwrap(), dst);
    // No temporary files left.
    let names: Vec<String> = std::fs::read_dir(l.dir.join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["tiny.erofs"]);

    build::install_cmdline(&l, " console=ttyS0 \n").unwrap();
    assert_eq!(l.cmdline().unwrap(), "console=ttyS0");
}

/// A checkout whose scripts print what the real ones print, quickly.
fn fake_checkout(dir: &Path) -> Checkout {
    let s = dir.join("scripts");
    std::fs::create_dir_all(&s).unwrap();
    std::fs::create_dir_all(dir.join("kernel-configs")).unwrap();
    std::fs::write(
        dir.join("kernel-configs/cmdline"),
        "console=ttyS0 panic=-1\n",
    )
    .unwrap();
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    for f in ["vmlinux", "tiny.erofs", "tiny.cpio"] {
        std::fs::write(out.join(f), f).unwrap();
    }
    std::fs::write(
        s.join("build-kernel.sh"),
        format!(
            "echo 'build-kernel: installing missing packages: gcc' >&2\n\
             echo 'Setting up gcc' >&2\n\
             echo 'build-kernel: progress 1/2 objects' >&2\n\
             echo {}/vmlinux\n",
            out.display()
        ),
    )
    .unwrap();
    std::fs::write(
        s.join("build-images.sh"),
        format!(
            "[ \"$1\" = tiny ] || {{ echo \"build-images: error: no $1\" >&2; exit 3; }}\n\
             echo 'build-images: tiny: building' >&2\n\
             echo tiny_erofs={0}/tiny.erofs\necho tiny_cpio={0}/tiny.cpio\n",
            out.display()
        ),
    )
    .unwrap();
    Checkout::at(dir).unwrap()
}

#[test]
fn a_checkout_builds_and_installs_with_every_line_reported() {
    let dir = tempfile::tempdir().unwrap();
    let c = fake_checkout(dir.path());
    let l = Layout::at(dir.path().join("inst"));
    let mut steps = vec![];
    let mut lines = vec![];
    c.build_and_install(
        &l,
        &["tiny"],
        &mut |s: &str| steps.push(s.to_string()),
        &mut |e: Event<'_>| lines.push(format!("{e:?}")),
    )
    .unwrap();
    assert_eq!(steps, ["guest kernel", "'tiny' image", "install"]);
    assert_eq!(
        lines,
        [
            "Step(\"installing missing packages: gcc\")",
            "Detail(\"Setting up gcc\")",
            "Progress(\"1/2 objects\")",
            "Step(\"tiny: building\")",
        ]
    );
    assert_eq!(
        std::fs::read_to_string(l.kernel().unwrap()).unwrap(),
        "vmlinux"
    );
    assert_eq!(
        std::fs::read_to_string(l.image("tiny").unwrap()).unwrap(),
        "tiny.erofs"
    );
    assert!(l.file("tiny_cpio").is_ok());
    assert_eq!(l.cmdline().unwrap(), "console=ttyS0 panic=-1");

    // A failing script: its error, and the failure reported after its lines.
    let mut failed = false;
    struct R<'a>(&'a mut Vec<String>, &'a mut bool);
    impl build::Report for R<'_> {
        fn event(&mut self, e: Event<'_>) {
            self.0.push(format!("{e:?}"));
        }
        fn failed(&mut self) {
            *self.1 = true;
        }
    }
    let mut got = vec![];
    let e = c.images("base", &mut R(&mut got, &mut failed)).unwrap_err();
    assert!(matches!(e, ArtifactError::Failed { .. }), "{e}");
    assert!(failed);
    assert_eq!(got, ["Step(\"error: no base\")"]);
}

#[test]
fn no_checkout_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = Checkout::at(dir.path()).unwrap_err().to_string();
    assert!(e.contains("no Shoal source checkout"), "{e}");
}

#[test]
fn built_in_layers_are_named_layers_and_install_beside_the_images() {
    let dir = tempfile::tempdir().unwrap();
    let l = Layout::at(dir.path());
    for r in crate::lang_layers::LAYERS {
        assert!(!IMAGES.contains(&r.name), "{} is an image name", r.name);
        assert!(is_named_layer(r.name), "{}", r.name);
        let key = format!("{}_erofs", r.name);
        let (rel, what) = key_path(&key).unwrap();
        assert_eq!(rel, format!("images/{}.erofs", r.name));
        let e = l.image(r.name).unwrap_err().to_string();
        assert!(e.contains(&what) && e.contains("is not installed"), "{e}");
        let src = dir.path().join("built.erofs");
        std::fs::write(&src, r.name).unwrap();
        let dst = build::install_file(&l, &key, &src).unwrap();
        assert_eq!(dst, dir.path().join(&rel));
        assert_eq!(l.image(r.name).unwrap(), dst);
        std::fs::remove_file(&src).unwrap();
    }
    for n in ["tiny", "base"] {
        assert!(is_named_layer(n));
    }
    for n in ["", "fncall", "fncall-python_erofs", "/x", "Base"] {
        assert!(!is_named_layer(n), "{n}");
    }
    assert!(key_path("nope_erofs").is_none());
    let e = l.image("nope").unwrap_err().to_string();
    assert!(
        e.contains("fncall-cpp") && e.contains("expected tiny or base"),
        "{e}"
    );
}
