//! `import_layout`: an OCI image layout directory (written here, no
//! registry) into the store, through the pull's checks: layers verified by
//! digest and converted once, the tag chosen, tampered or linked blobs
//! refused with nothing left behind.

use image_store::import::import_layout;
use image_store::registry::PullError;
use image_store::Store;
use shoal_test_support::registry::{tar_of, write_layout, Entry};
use std::path::Path;

fn layout(dir: &Path) -> Vec<(String, String)> {
    let base = tar_of(&[Entry::Dir("etc/"), Entry::File("etc/a", 0o644, b"a")]);
    let top = tar_of(&[Entry::Dir("opt/"), Entry::File("opt/b", 0o755, b"b")]);
    let config = serde_json::json!({"Env": ["A=1"], "WorkingDir": "/opt", "Cmd": ["/opt/b"]});
    write_layout(dir, "v1", &[(base, true), (top, false)], config)
}

fn blob(dir: &Path, digest: &str) -> std::path::PathBuf {
    dir.join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

#[test]
fn an_oci_layout_is_imported_with_its_layers_verified() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("layout");
    let want = layout(&dir);
    let store = Store::new(&t.path().join("store"));
    let r = "127.0.0.1:5000/imp/app:v1";
    let got = import_layout(&store, &dir, Some("v1"), Some(r)).unwrap();
    let img = &got.image;
    assert_eq!(img.refs, vec![r.to_string()]);
    let diff_ids: Vec<&str> = img.layers.iter().map(|l| l.diff_id.as_str()).collect();
    assert_eq!(diff_ids, vec![want[0].1.as_str(), want[1].1.as_str()]);
    assert_eq!(img.layers[0].digest, want[0].0);
    assert_eq!(img.config.env, vec!["A=1"]);
    assert_eq!(img.config.working_dir.as_deref(), Some("/opt"));
    assert_eq!(img.config.cmd, Some(vec!["/opt/b".to_string()]));
    for f in &got.layer_files {
        pmem::check_image(f).unwrap();
    }
    assert_eq!(store.resolve(r).unwrap(), got);
    // Untagged (the only manifest), unnamed: the same image by id.
    let again = import_layout(&store, &dir, None, None).unwrap();
    assert_eq!(again.image.id, img.id);
    assert_eq!(store.resolve(&img.id).unwrap().layer_files, got.layer_files);
    // A tag the layout lacks.
    let e = import_layout(&store, &dir, Some("v2"), None).unwrap_err();
    assert!(e.to_string().contains("no manifest tagged \"v2\""), "{e}");
}

#[test]
fn tampered_and_linked_blobs_are_refused_and_leave_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("layout");
    let want = layout(&dir);
    let store = Store::new(&t.path().join("store"));
    // A layer whose bytes are not its digest's.
    let top = blob(&dir, &want[1].0);
    let good = std::fs::read(&top).unwrap();
    let mut bad = good.clone();
    bad.extend_from_slice(&[0u8; 1024]);
    std::fs::write(&top, &bad).unwrap();
    let e = import_layout(&store, &dir, None, Some("127.0.0.1:5000/imp/app:v1")).unwrap_err();
    assert!(matches!(e, PullError::Layer(_)), "{e}");
    assert!(store.list().unwrap().is_empty());
    assert!(
        !store.layer_path(&want[1].1).unwrap().exists(),
        "no partial layer"
    );
    std::fs::write(&top, &good).unwrap();
    // A blob that is a symbolic link (to a copy of itself) is not followed.
    let copy = t.path().join("copy");
    std::fs::rename(&top, &copy).unwrap();
    std::os::unix::fs::symlink(&copy, &top).unwrap();
    let e = import_layout(&store, &dir, None, None).unwrap_err();
    assert!(e.to_string().contains(&top.display().to_string()), "{e}");
    assert!(store.list().unwrap().is_empty());
    std::fs::remove_file(&top).unwrap();
    std::fs::rename(&copy, &top).unwrap();
    import_layout(&store, &dir, None, None).unwrap();
    assert_eq!(store.list().unwrap().len(), 1);
}
