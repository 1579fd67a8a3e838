use super::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;

fn whiteout(p: &Path) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path alive for the call.
    assert_eq!(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) }, 0);
}

fn opaque(p: &Path) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated path and name, a 1-byte value, all alive for
    // the call.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}

fn layer(dir: &Path, name: &str, files: &[(&str, &str)]) -> (PathBuf, PathBuf) {
    let root = dir.join(name);
    for (f, data) in files {
        let p = root.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    std::fs::create_dir_all(&root).unwrap();
    (root, dir.join(format!("{name}.erofs")))
}

fn pack(root: &Path, out: &Path) {
    let raw = out.with_extension("raw");
    image::pack_erofs(root, &raw, out).unwrap();
}

/// A mount of `layers` (highest first) read with `f`, then unmounted.
fn read_through(dir: &Path, layers: &[&Path], f: impl FnOnce(&Path)) {
    let mut m = Mounts::default();
    let mut lowers = vec![];
    for (i, l) in layers.iter().enumerate() {
        let at = dir.join(format!("check-l{i}"));
        std::fs::create_dir_all(&at).unwrap();
        m.mount(
            Command::new("mount")
                .args(["-t", "erofs", "-o", "loop,ro"])
                .arg(l)
                .arg(&at),
            &at,
        )
        .unwrap();
        lowers.push(at.display().to_string());
    }
    let at = if lowers.len() == 1 {
        PathBuf::from(&lowers[0])
    } else {
        let at = dir.join("check-merged");
        std::fs::create_dir_all(&at).unwrap();
        m.mount(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o"])
                .arg(format!("ro,lowerdir={}", lowers.join(":")))
                .arg(&at),
            &at,
        )
        .unwrap();
        at
    };
    f(&at);
    m.unmount_all().unwrap();
}

#[test]
fn merged_layers_are_what_the_overlay_of_them_shows() {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let dir = tempfile::tempdir().unwrap();
        let e = merge_layers(
            &[dir.path().join("a"), dir.path().join("b")],
            &dir.path().join("o"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("run it as root"), "{e}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (a, a_img) = layer(
        d,
        "a",
        &[
            ("keep", "a"),
            ("gone", "a"),
            ("op/old", "a"),
            ("over", "a"),
            ("x", "a"),
        ],
    );
    let (b, b_img) = layer(d, "b", &[("op/new", "b"), ("over", "b"), ("new", "b")]);
    whiteout(&b.join("gone"));
    opaque(&b.join("op"));
    let (c, c_img) = layer(d, "c", &[]);
    whiteout(&c.join("x"));
    for (root, img) in [(&a, &a_img), (&b, &b_img), (&c, &c_img)] {
        pack(root, img);
    }
    let merged = d.join("out/merged.erofs");
    merge_layers(&[a_img.clone(), b_img.clone()], &merged).unwrap();
    assert_eq!(
        std::fs::read_dir(d.join("out")).unwrap().count(),
        1,
        "only the merged layer is left"
    );
    // The merged layer alone: b over a, no whiteout or opaque mark left.
    read_through(d, &[&merged], |m| {
        let read = |p: &str| std::fs::read_to_string(m.join(p)).ok();
        assert_eq!(read("keep").as_deref(), Some("a"));
        assert_eq!(read("over").as_deref(), Some("b"));
        assert_eq!(read("new").as_deref(), Some("b"));
        assert_eq!(read("op/new").as_deref(), Some("b"));
        assert!(!m.join("op/old").exists(), "the opaque directory hides a's");
        assert!(
            std::fs::symlink_metadata(m.join("gone")).is_err(),
            "the whiteout and what it hid are gone"
        );
        let mut buf = [0u8; 8];
        let c = CString::new(m.join("op").as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated path and name; the buffer is 8 bytes.
        let n = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                c"trusted.overlay.opaque".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        assert!(n < 0, "no opaque mark is kept");
        for e in walk(m) {
            let t = std::fs::symlink_metadata(&e).unwrap().file_type();
            assert!(!t.is_char_device(), "a whiteout is left: {}", e.display());
        }
    });
    // A layer over the merged one still whites out what the merge holds.
    read_through(d, &[&c_img, &merged], |m| {
        assert!(!m.join("x").exists());
        assert!(m.join("keep").is_file());
    });
    let e = merge_layers(&[a_img], &d.join("one.erofs")).unwrap_err();
    assert!(e.to_string().contains("at least two"), "{e}");
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}
