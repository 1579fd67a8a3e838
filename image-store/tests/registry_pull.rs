//! A pull from a real registry: Debian's `docker-registry` (the CNCF
//! distribution registry) on a loopback port with its storage in a
//! temporary directory, and a 2-layer image (a whiteout, an opaque
//! directory) built here and pushed with `skopeo copy`.
//!
//! Needs `apt-get install docker-registry skopeo`; fails (never skips)
//! without them.

use image_store::registry::{pull, PullError, PullOptions};
use image_store::Store;
use shoal_test_support::registry::{push, tar_of, write_layout, Entry, Registry};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Writes an OCI layout with the image at tag `v1`; returns the two
/// layers' (digest, diff_id).
fn build_layout(layout: &Path) -> Vec<(String, String)> {
    let base = tar_of(&[
        Entry::Dir("etc/"),
        Entry::File("etc/a.conf", 0o644, b"a"),
        Entry::File("etc/b.conf", 0o644, b"b"),
        Entry::Dir("opt/"),
        Entry::Dir("opt/d/"),
        Entry::File("opt/d/old", 0o644, b"old"),
    ]);
    let top = tar_of(&[
        Entry::File("etc/.wh.a.conf", 0o644, b""),
        Entry::Dir("opt/d/"),
        Entry::File("opt/d/.wh..wh..opq", 0o644, b""),
        Entry::File("opt/d/new", 0o644, b"new"),
    ]);
    let config = serde_json::json!({
        "Env": ["PATH=/usr/bin", "A=1"], "WorkingDir": "/opt", "User": "1000:1000",
        "Cmd": ["/bin/sh"], "Labels": {"k": "v"},
    });
    write_layout(layout, "v1", &[(base, true), (top, false)], config)
}

#[test]
fn pull_a_two_layer_image_with_whiteouts_from_a_real_registry() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::start(dir.path());
    let layout = dir.path().join("layout");
    let want = build_layout(&layout);
    push(dir.path(), &layout, "v1", &reg.reference("test/app:v1"));

    let store = Store::new(&dir.path().join("store"));
    let reference = format!("127.0.0.1:{}/test/app:v1", reg.port);
    let got = pull(&store, &reference, &PullOptions::default()).unwrap();
    let img = &got.image;
    assert_eq!(img.refs, vec![reference.clone()]);
    let diff_ids: Vec<_> = img.layers.iter().map(|l| l.diff_id.clone()).collect();
    assert_eq!(diff_ids, vec![want[0].1.clone(), want[1].1.clone()]);
    // The gzip layer went through as it was (skopeo compresses the plain
    // one on its way to a docker:// destination).
    assert_eq!(img.layers[0].digest, want[0].0);
    assert_eq!(img.config.env, vec!["PATH=/usr/bin", "A=1"]);
    assert_eq!(img.config.working_dir.as_deref(), Some("/opt"));
    assert_eq!(img.config.user.as_deref(), Some("1000:1000"));
    assert_eq!(img.config.cmd, Some(vec!["/bin/sh".to_string()]));
    assert_eq!(img.config.labels["k"], "v");
    assert_eq!(store.resolve(&reference).unwrap(), got);
    assert_eq!(store.resolve(&img.id).unwrap(), got);

    // The top layer: whiteout and opaque dir as overlayfs has them.
    let top = &got.layer_files[1];
    pmem::check_image(top).unwrap();
    let x = dir.path().join("x");
    let st = Command::new("fsck.erofs")
        .arg(format!("--extract={}", x.display()))
        .arg(top)
        .stdout(Stdio::null())
        .status()
        .expect("fsck.erofs");
    assert!(st.success());
    let wh = std::fs::symlink_metadata(x.join("etc/a.conf")).unwrap();
    assert!(wh.file_type().is_char_device(), "etc/a.conf is a whiteout");
    assert_eq!(std::fs::read(x.join("opt/d/new")).unwrap(), b"new");
    let dump = Command::new("dump.erofs")
        .arg("--path=/opt/d")
        .arg(top)
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(
        !dump.contains("Xattr size: 0"),
        "opaque xattr on /opt/d: {dump}"
    );
    let base = &got.layer_files[0];
    let y = dir.path().join("y");
    assert!(Command::new("fsck.erofs")
        .arg(format!("--extract={}", y.display()))
        .arg(base)
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success());
    assert_eq!(std::fs::read(y.join("opt/d/old")).unwrap(), b"old");

    // Pulled again: the layers are reused, and by digest works.
    let by_digest = format!("127.0.0.1:{}/test/app@{}", reg.port, img.manifest_digest);
    let again = pull(&store, &by_digest, &PullOptions::default()).unwrap();
    assert_eq!(again.layer_files, got.layer_files);

    // Unknown tags and repositories are named as such.
    for bad in ["test/app:nope", "test/nope:v1"] {
        let err = pull(
            &store,
            &format!("127.0.0.1:{}/{bad}", reg.port),
            &PullOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(err, PullError::NotFound { .. }), "{bad}: {err}");
        assert!(err.to_string().contains("not found"), "{err}");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
}
