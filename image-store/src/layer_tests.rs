//! Layer conversion with tars built here: refusals leave nothing behind,
//! whiteouts become overlayfs ones, digests are checked.

use crate::layer::{convert_layer, sha256_digest, Compression, LayerError, LayerLimits};
use crate::Store;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

/// One tar entry: name written raw (so `..` and `/abs` can be made).
struct E<'a> {
    name: &'a str,
    kind: tar::EntryType,
    data: &'a [u8],
    link: &'a str,
    mode: u32,
}

fn e<'a>(name: &'a str, kind: tar::EntryType) -> E<'a> {
    E {
        name,
        kind,
        data: b"",
        link: "",
        mode: 0o644,
    }
}

fn file<'a>(name: &'a str, data: &'a [u8]) -> E<'a> {
    E {
        data,
        ..e(name, tar::EntryType::Regular)
    }
}

fn link<'a>(name: &'a str, kind: tar::EntryType, to: &'a str) -> E<'a> {
    E {
        link: to,
        ..e(name, kind)
    }
}

fn tar_of(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for en in entries {
        let mut h = tar::Header::new_gnu();
        let raw = &mut h.as_old_mut().name;
        raw[..en.name.len()].copy_from_slice(en.name.as_bytes());
        h.set_entry_type(en.kind);
        h.set_mode(en.mode);
        h.set_uid(1000);
        h.set_gid(1001);
        h.set_mtime(1_700_000_000);
        h.set_size(en.data.len() as u64);
        if !en.link.is_empty() {
            h.as_old_mut().linkname[..en.link.len()].copy_from_slice(en.link.as_bytes());
        }
        if en.kind == tar::EntryType::Char {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.set_cksum();
        b.append(&h, en.data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut g = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    g.write_all(data).unwrap();
    g.finish().unwrap()
}

/// The store's directory holds no layer and no leftovers.
fn assert_empty(store: &Store) {
    let layers = store.dir().join("layers");
    let left: Vec<_> = std::fs::read_dir(&layers)
        .map(|r| r.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn convert(store: &Store, tar: &[u8]) -> Result<crate::layer::ConvertedLayer, LayerError> {
    let d = sha256_digest(tar);
    convert_layer(
        store,
        tar,
        Compression::None,
        &d,
        Some(&d),
        LayerLimits::default(),
    )
}

fn refused(entries: &[E<'_>], want: &str) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    let err = convert(&store, &tar_of(entries)).unwrap_err();
    assert!(err.to_string().contains(want), "{err} lacks {want:?}");
    assert_empty(&store);
}

#[test]
fn dot_dot_and_absolute_paths_are_refused() {
    refused(&[file("a/../../etc/passwd", b"x")], "`..` is refused");
    refused(&[file("/etc/passwd", b"x")], "absolute path is refused");
}

#[test]
fn links_that_leave_the_layer_are_refused() {
    use tar::EntryType::{Link, Symlink};
    refused(
        &[link("a/b", Symlink, "../../etc")],
        "leaves the layer; refused",
    );
    // A symlink that stays inside may exist, but nothing is written
    // through any symlink.
    refused(
        &[link("etc", Symlink, "/etc"), file("etc/passwd", b"x")],
        "goes through a symbolic link",
    );
    refused(&[link("h", Link, "../outside")], "outside the layer");
    refused(&[link("h", Link, "/etc/passwd")], "outside the layer");
    refused(&[link("h", Link, "missing")], "not earlier in the layer");
    refused(
        &[link("s", Symlink, "/etc"), link("h", Link, "s/passwd")],
        "goes through a symbolic link",
    );
}

#[test]
fn device_nodes_are_refused() {
    refused(&[e("dev/null", tar::EntryType::Char)], "device nodes");
    refused(&[e("dev/sda", tar::EntryType::Block)], "device nodes");
}

#[test]
fn layers_over_the_size_caps_are_refused_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    // 64 KiB of zeros: a small gzip blob, a large tar.
    let tar = tar_of(&[file("big", &[0u8; 64 << 10])]);
    let gz = gzip(&tar);
    let (d, diff) = (sha256_digest(&gz), sha256_digest(&tar));
    let run = |limits| convert_layer(&store, &gz[..], Compression::Gzip, &d, Some(&diff), limits);
    let tar_cap = LayerLimits {
        max_blob_bytes: 1 << 20,
        max_tar_bytes: 32 << 10,
    };
    let err = run(tar_cap).unwrap_err();
    assert!(
        matches!(err, LayerError::TooLarge { what: "uncompressed tar", cap, .. } if cap == 32 << 10),
        "{err}"
    );
    assert!(
        err.to_string().contains("over the cap of 32768 bytes"),
        "{err}"
    );
    assert_empty(&store);
    let blob_cap = LayerLimits {
        max_blob_bytes: gz.len() as u64 - 1,
        max_tar_bytes: 1 << 20,
    };
    let err = run(blob_cap).unwrap_err();
    assert!(
        matches!(
            err,
            LayerError::TooLarge {
                what: "compressed blob",
                ..
            }
        ),
        "{err}"
    );
    assert_empty(&store);
    // At the caps exactly, it goes in.
    let exact = LayerLimits {
        max_blob_bytes: gz.len() as u64,
        max_tar_bytes: tar.len() as u64,
    };
    run(exact).unwrap();
}

#[test]
fn digest_mismatches_are_refused_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    let tar = tar_of(&[file("a", b"hello")]);
    let d = sha256_digest(&tar);
    let other = sha256_digest(b"other");
    let err = convert_layer(
        &store,
        &tar[..],
        Compression::None,
        &other,
        None,
        LayerLimits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, LayerError::BlobDigest { .. }), "{err}");
    assert_empty(&store);
    let gz = gzip(&tar);
    let err = convert_layer(
        &store,
        &gz[..],
        Compression::Gzip,
        &sha256_digest(&gz),
        Some(&other),
        LayerLimits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, LayerError::DiffId { .. }), "{err}");
    assert_empty(&store);
    // A truncated blob.
    let err = convert_layer(
        &store,
        &gz[..gz.len() / 2],
        Compression::Gzip,
        &d,
        None,
        LayerLimits::default(),
    )
    .unwrap_err();
    assert!(!err.to_string().is_empty());
    assert_empty(&store);
    assert!(matches!(
        Compression::from_media_type("application/vnd.oci.image.layer.v1.tar+lz4"),
        Err(LayerError::MediaType(_))
    ));
}

/// Extracts `img` with fsck.erofs (which also checks it), modes as stored.
fn unpack(img: &Path, to: &Path) {
    let st = Command::new("fsck.erofs")
        .arg(format!("--extract={}", to.display()))
        // Owners unchanged: a chown after the chmod would clear set-id bits.
        .args(["--preserve-perms", "--no-preserve-owner"])
        .arg(img)
        .stdout(Stdio::null())
        .status()
        .expect("fsck.erofs (erofs-utils) is installed");
    assert!(st.success(), "fsck.erofs rejected {}", img.display());
}

/// dump.erofs's view of one path.
fn dump(img: &Path, path: &str) -> String {
    let out = Command::new("dump.erofs")
        .arg(format!("--path={path}"))
        .arg(img)
        .output()
        .expect("dump.erofs (erofs-utils) is installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Bytes of xattrs `path` has in `img` (dump.erofs's "Xattr size").
fn xattr_bytes(img: &Path, path: &str) -> u32 {
    let d = dump(img, path);
    d.split("Xattr size:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no xattr size for {path}: {d}"))
}

#[test]
fn whiteouts_opaque_dirs_modes_owners_and_each_compression() {
    use tar::EntryType::{Directory, Link, Symlink};
    let tar = tar_of(&[
        E {
            mode: 0o750,
            ..e("opt/d/", Directory)
        },
        file("opt/d/.wh..wh..opq", b""),
        file("opt/d/new", b"new"),
        file("etc/.wh.a.conf", b""),
        E {
            mode: 0o4755,
            ..file("bin/tool", b"#!/bin/sh\n")
        },
        link("bin/same", Link, "bin/tool"),
        link("bin/sh", Symlink, "/usr/bin/dash"),
        link("lib/rel", Symlink, "../bin/tool"),
    ]);
    let diff_id = sha256_digest(&tar);
    let gz = gzip(&tar);
    let zst = zstd::encode_all(&tar[..], 1).unwrap();
    for (blob, comp) in [
        (tar.clone(), Compression::None),
        (gz, Compression::Gzip),
        (zst, Compression::Zstd),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let digest = sha256_digest(&blob);
        let got = convert_layer(
            &store,
            &blob[..],
            comp,
            &digest,
            Some(&diff_id),
            LayerLimits::default(),
        )
        .unwrap();
        assert_eq!(got.diff_id, diff_id);
        assert_eq!(got.path, store.layer_path(&diff_id).unwrap());
        assert_eq!(got.erofs_bytes % (2 << 20), 0, "padded for DAX");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("layers"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 1, "only the layer: {left:?}");
        pmem::check_image(&got.path).unwrap();

        let x = dir.path().join("x");
        unpack(&got.path, &x);
        let m = |p: &str| std::fs::symlink_metadata(x.join(p)).unwrap();
        let wh = m("etc/a.conf");
        assert!(
            wh.file_type().is_char_device() && wh.rdev() == 0,
            "whiteout"
        );
        assert!(!x.join("etc/.wh.a.conf").exists());
        assert!(!x.join("opt/d/.wh..wh..opq").exists());
        assert_eq!(std::fs::read(x.join("opt/d/new")).unwrap(), b"new");
        assert_eq!(m("opt/d").permissions().mode() & 0o7777, 0o750);
        assert_eq!(m("bin/tool").permissions().mode() & 0o7777, 0o4755);
        assert!(dump(&got.path, "/bin/tool").contains("Uid: 1000   Gid: 1001"));
        assert_eq!(m("bin/tool").mtime(), 1_700_000_000);
        let nid = |p: &str| {
            dump(&got.path, p)
                .split("NID:")
                .nth(1)
                .map(|r| r.split_whitespace().next().unwrap_or("").to_string())
        };
        assert_eq!(nid("/bin/same"), nid("/bin/tool"), "hard link");
        assert_eq!(
            std::fs::read_link(x.join("bin/sh")).unwrap(),
            Path::new("/usr/bin/dash")
        );
        // The opaque xattr (checked by name on the staged tree below).
        assert!(xattr_bytes(&got.path, "/opt/d") > 0, "opaque xattr kept");
        assert_eq!(xattr_bytes(&got.path, "/opt"), 0);
    }
}

#[test]
fn xattrs_on_the_staged_tree_opaque_set_trusted_from_the_tar_dropped() {
    let mut b = tar::Builder::new(Vec::new());
    b.append_pax_extensions([
        ("SCHILY.xattr.trusted.overlay.redirect", &b"/x"[..]),
        ("SCHILY.xattr.user.keep", &b"1"[..]),
    ])
    .unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_path("d/").unwrap();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o755);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(0);
    h.set_cksum();
    b.append(&h, &b""[..]).unwrap();
    let mut tar = b.into_inner().unwrap();
    // Remove the end blocks and add an opaque marker.
    tar.truncate(tar.len() - 1024);
    tar.extend(tar_of(&[file("o/.wh..wh..opq", b"")]));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    crate::extract::extract(&tar[..], &root).unwrap();
    let names = |p: &str| -> Vec<String> {
        xattr::list(root.join(p))
            .unwrap()
            .map(|n| n.to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(names("d"), vec!["user.keep".to_string()]);
    assert_eq!(names("o"), vec!["trusted.overlay.opaque".to_string()]);
    assert_eq!(
        xattr::get(root.join("o"), "trusted.overlay.opaque").unwrap(),
        Some(b"y".to_vec())
    );
}
