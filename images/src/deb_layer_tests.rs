use super::*;

fn v(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| s.to_string()).collect()
}

#[test]
fn package_names_are_checked() {
    check_packages(&v(&["g++", "python3-numpy", "libstdc++-12-dev", "nodejs"])).unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&[], "0 packages"),
        (&["-oDebug::X=1"], "not a Debian package name"),
        (&["Nodejs"], "not a Debian package name"),
        (&["a b"], "not a Debian package name"),
        (&["a;rm -rf /"], "not a Debian package name"),
        (&[""], "not a Debian package name"),
        (&["nodejs/bookworm"], "not a Debian package name"),
    ];
    for (pkgs, want) in cases {
        let e = check_packages(&v(pkgs)).unwrap_err().to_string();
        assert!(e.contains(want), "{pkgs:?}: {e}");
    }
    let many: Vec<String> = (0..=MAX_PACKAGES).map(|i| format!("p{i}")).collect();
    let e = check_packages(&many).unwrap_err().to_string();
    assert!(e.contains("expected 1 to 64"), "{e}");
    let long = "a".repeat(129);
    assert!(check_packages(&[long]).is_err());
}

#[test]
fn every_built_in_layer_is_a_valid_package_list() {
    for r in crate::lang_layers::LAYERS {
        check_packages(&r.package_list()).unwrap_or_else(|e| panic!("{}: {e}", r.name));
    }
}

#[test]
fn only_the_opaque_mark_of_the_overlay_xattrs_stays() {
    assert!(keep_xattr(b"trusted.overlay.opaque", b"y"));
    assert!(!keep_xattr(b"trusted.overlay.opaque", b"x"));
    for n in [
        "origin", "impure", "nlink", "upper", "uuid", "redirect", "metacopy",
    ] {
        let name = format!("trusted.overlay.{n}");
        assert!(!keep_xattr(name.as_bytes(), b"whatever"), "{name}");
    }
    assert!(keep_xattr(b"security.capability", b"\x01"));
    assert!(keep_xattr(b"user.mime_type", b"text/plain"));
}

#[test]
fn cleaning_drops_caches_and_backups_only() {
    let dir = tempfile::tempdir().unwrap();
    let u = dir.path();
    let files = [
        "var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease",
        "var/cache/apt/archives/g++_12.deb",
        "var/log/dpkg.log",
        "usr/share/doc/g++/copyright",
        "etc/resolv.conf",
        "var/lib/dpkg/status-old",
        "var/cache/debconf/config.dat-old",
        "tmp/x",
        // Kept:
        "usr/bin/g++-12",
        "var/lib/dpkg/status",
        "var/lib/dpkg/info/g++.list",
        "var/cache/debconf/config.dat",
        "usr/share/g++/x",
    ];
    for f in files {
        let p = u.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, f).unwrap();
    }
    std::os::unix::fs::symlink("/etc/passwd", u.join("usr/share/man")).unwrap();
    clean_upper(u).unwrap();
    for f in &files[..8] {
        assert!(!u.join(f).exists(), "{f} kept");
    }
    for f in &files[8..] {
        assert!(u.join(f).is_file(), "{f} dropped");
    }
    assert!(!u.join("usr/share/man").exists() && !u.join("usr/share/man").is_symlink());
    assert!(
        std::path::Path::new("/etc/passwd").is_file(),
        "a link is removed, not followed"
    );
    assert!(u.join("var/lib/dpkg").is_dir());
}

#[test]
fn upper_walk_counts_entries_and_whiteouts() {
    let dir = tempfile::tempdir().unwrap();
    let u = dir.path();
    std::fs::create_dir_all(u.join("usr/bin")).unwrap();
    std::fs::write(u.join("usr/bin/tool"), "x").unwrap();
    std::os::unix::fs::symlink("tool", u.join("usr/bin/alias")).unwrap();
    let lower = tempfile::tempdir().unwrap();
    let s = strip_overlay_marks(u, lower.path()).unwrap();
    let want = UpperStats {
        entries: 4,
        whiteouts: 0,
        opaque: 0,
    };
    assert_eq!(s, want);
}

#[test]
fn lower_lookups_follow_no_links() {
    let lower = tempfile::tempdir().unwrap();
    let l = lower.path();
    std::fs::create_dir_all(l.join("usr/lib")).unwrap();
    std::fs::write(l.join("usr/lib/f"), "x").unwrap();
    std::os::unix::fs::symlink("usr/lib", l.join("lib")).unwrap();
    assert!(lower_kind(l, Path::new("usr/lib")).unwrap().is_dir());
    assert!(lower_kind(l, Path::new("usr/lib/f")).unwrap().is_file());
    assert!(lower_kind(l, Path::new("lib")).unwrap().is_symlink());
    assert!(
        lower_kind(l, Path::new("lib/f")).is_none(),
        "not through the link"
    );
    assert!(lower_kind(l, Path::new("usr/none")).is_none());
}

#[test]
fn the_builder_refuses_bad_input_before_touching_anything() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("l.erofs");
    let e = build_deb_layer(
        &dir.path().join("none.erofs"),
        &v(&["Bad Name"]),
        &out,
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not a Debian package name"), "{e}");
    let e = build_deb_layer(
        &dir.path().join("none.erofs"),
        &v(&["g++"]),
        &out,
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        assert!(e.contains("not an image file"), "{e}");
    } else {
        assert!(e.contains("run it as root"), "{e}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );
}
