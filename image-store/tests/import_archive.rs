//! `docker save` tarballs (written here, no Docker) into the store: the
//! legacy format (`manifest.json`, `ID/layer.tar`, a shared layer as a
//! symbolic link) and the OCI layout in a tar that Docker 25+ writes;
//! digests verified, tags chosen, bad archives refused with nothing left.

use image_store::import::{import, ImportOptions};
use image_store::layer::{LayerError, LayerLimits};
use image_store::registry::PullError;
use image_store::Store;
use shoal_test_support::registry::{
    tar_of, write_docker_save, write_docker_save_oci, Entry, Saved,
};
use std::path::Path;

fn layers() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let base = tar_of(&[Entry::Dir("etc/"), Entry::File("etc/a", 0o644, b"a")]);
    let top = tar_of(&[Entry::Dir("opt/"), Entry::File("opt/b", 0o755, b"b")]);
    let other = tar_of(&[Entry::Dir("srv/"), Entry::File("srv/c", 0o644, b"c")]);
    (base, top, other)
}

fn assert_no_layers(store: &Store) {
    let left: Vec<_> = std::fs::read_dir(store.dir().join("layers"))
        .map(|r| r.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(store.list().unwrap().is_empty());
}

fn opts(tag: Option<&str>) -> ImportOptions {
    ImportOptions {
        tag: tag.map(str::to_string),
        ..Default::default()
    }
}

#[test]
fn a_legacy_docker_save_archive_is_imported_by_tag_with_shared_layers() {
    let t = tempfile::tempdir().unwrap();
    let (base, top, other) = layers();
    let file = t.path().join("save.tar");
    let want = write_docker_save(
        &file,
        &[
            Saved {
                repo_tags: &["app:v1", "registry.local:5000/team/app:v1"],
                layers: &[base.clone(), top],
                config: serde_json::json!({"Env": ["A=1"], "Cmd": ["/opt/b"]}),
            },
            Saved {
                repo_tags: &["other:v2"],
                layers: &[base, other],
                config: serde_json::json!({"WorkingDir": "/srv"}),
            },
        ],
    );
    let store = Store::new(&t.path().join("store"));
    // Two images: which one must be said.
    let e = import(&store, &file, &opts(None)).unwrap_err();
    assert!(e.to_string().contains("2 images: name one"), "{e}");
    let e = import(&store, &file, &opts(Some("nope:v1"))).unwrap_err();
    assert!(e.to_string().contains("no image tagged \"nope:v1\""), "{e}");

    let got = import(&store, &file, &opts(Some("app:v1"))).unwrap();
    let img = &got.image;
    assert_eq!(img.id, want[0].0);
    assert_eq!(
        img.refs,
        vec![
            "docker.io/library/app:v1".to_string(),
            "registry.local:5000/team/app:v1".to_string()
        ]
    );
    let diff_ids: Vec<&String> = img.layers.iter().map(|l| &l.diff_id).collect();
    assert_eq!(diff_ids, want[0].1.iter().collect::<Vec<_>>());
    assert_eq!(img.config.env, vec!["A=1"]);
    for f in &got.layer_files {
        pmem::check_image(f).unwrap();
    }
    assert_eq!(store.resolve("docker.io/library/app:v1").unwrap(), got);

    // The second by its canonical name; its base is a symbolic link to
    // the first's layer.tar, and is the same stored layer.
    let o = import(&store, &file, &opts(Some("docker.io/library/other:v2"))).unwrap();
    assert_eq!(o.image.id, want[1].0);
    assert_eq!(o.image.config.working_dir.as_deref(), Some("/srv"));
    assert_eq!(o.layer_files[0], got.layer_files[0]);
    assert_eq!(store.usage().unwrap().layers, 3);

    // --ref names it instead.
    let r = import(
        &store,
        &file,
        &ImportOptions {
            tag: Some("other:v2".into()),
            reference: Some("127.0.0.1:5000/mine/other:x".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r
        .image
        .refs
        .contains(&"127.0.0.1:5000/mine/other:x".to_string()));
}

#[test]
fn a_docker_25_oci_archive_is_imported_under_its_name() {
    let t = tempfile::tempdir().unwrap();
    let (base, top, _) = layers();
    let file = t.path().join("save.tar");
    let want = write_docker_save_oci(
        &file,
        &t.path().join("work"),
        "docker.io/library/app:v3",
        &[base, top],
        serde_json::json!({"User": "1000"}),
    );
    let store = Store::new(&t.path().join("store"));
    let got = import(&store, &file, &opts(None)).unwrap();
    assert_eq!(got.image.refs, vec!["docker.io/library/app:v3".to_string()]);
    assert_eq!(got.image.config.user.as_deref(), Some("1000"));
    let d: Vec<(String, String)> = got
        .image
        .layers
        .iter()
        .map(|l| (l.digest.clone(), l.diff_id.clone()))
        .collect();
    assert_eq!(d, want);
    // By its tag or its name.
    assert_eq!(
        import(&store, &file, &opts(Some("v3"))).unwrap().image.id,
        got.image.id
    );
    assert_eq!(
        import(&store, &file, &opts(Some("app:v3")))
            .unwrap()
            .image
            .id,
        got.image.id
    );
    let e = import(&store, &file, &opts(Some("v4"))).unwrap_err();
    assert!(e.to_string().contains("no manifest tagged"), "{e}");
}

/// Rewrites the archive with `f` applied to each entry's (name, data).
fn rewrite(src: &Path, dst: &Path, f: impl Fn(&str, Vec<u8>) -> Vec<u8>) {
    let mut a = tar::Archive::new(std::fs::File::open(src).unwrap());
    let mut b = tar::Builder::new(std::fs::File::create(dst).unwrap());
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().to_string();
        let mut h = e.header().clone();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).unwrap();
        if h.entry_type() == tar::EntryType::Symlink {
            let target = e.link_name().unwrap().unwrap().into_owned();
            b.append_link(&mut h, &name, target).unwrap();
            continue;
        }
        let data = f(&name, data);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append_data(&mut h, &name, &data[..]).unwrap();
    }
    b.finish().unwrap();
}

#[test]
fn tampered_oversized_and_foreign_archives_are_refused_and_leave_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (base, top, _) = layers();
    let good = t.path().join("save.tar");
    write_docker_save(
        &good,
        &[Saved {
            repo_tags: &["app:v1"],
            layers: &[base, top],
            config: serde_json::json!({}),
        }],
    );
    let store = Store::new(&t.path().join("store"));
    let bad = t.path().join("bad.tar");
    // A layer whose bytes are not the config's diff_id.
    rewrite(&good, &bad, |n, mut d| {
        if n.ends_with("layer.tar") && d.len() > 600 {
            d[520] ^= 1;
        }
        d
    });
    let e = import(&store, &bad, &opts(None)).unwrap_err();
    assert!(e.to_string().contains("mismatch"), "{e}");
    assert_no_layers(&store);
    // A config whose bytes are not its name's digest.
    rewrite(&good, &bad, |n, d| {
        if n.ends_with(".json") && !n.contains('/') && n != "manifest.json" {
            let mut d = d;
            d.push(b' ');
            return d;
        }
        d
    });
    let e = import(&store, &bad, &opts(None)).unwrap_err();
    assert!(matches!(e, PullError::Digest { .. }), "{e}");
    assert_no_layers(&store);
    // A manifest naming a layer outside the archive.
    rewrite(&good, &bad, |n, d| {
        if n == "manifest.json" {
            let s = String::from_utf8(d).unwrap();
            let i = s.find("\"Layers\":[\"").unwrap() + 11;
            let j = i + s[i..].find('"').unwrap();
            return format!("{}../../etc/passwd{}", &s[..i], &s[j..]).into_bytes();
        }
        d
    });
    let e = import(&store, &bad, &opts(None)).unwrap_err();
    assert!(e.to_string().contains("../../etc/passwd"), "{e}");
    assert_no_layers(&store);
    // Over a small layer cap.
    let e = import(
        &store,
        &good,
        &ImportOptions {
            limits: LayerLimits::both(1024),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, PullError::Layer(LayerError::TooLarge { .. })),
        "{e}"
    );
    assert_no_layers(&store);
    // Not an archive at all; an archive of something else.
    std::fs::write(&bad, b"hello").unwrap();
    let e = import(&store, &bad, &opts(None)).unwrap_err();
    assert!(e.to_string().contains("not a readable tar archive"), "{e}");
    let mut b = tar::Builder::new(std::fs::File::create(&bad).unwrap());
    let mut h = tar::Header::new_gnu();
    h.set_size(1);
    h.set_cksum();
    b.append_data(&mut h, "readme", &b"x"[..]).unwrap();
    b.finish().unwrap();
    let e = import(&store, &bad, &opts(None)).unwrap_err();
    assert!(
        e.to_string().contains("neither a docker save archive"),
        "{e}"
    );
    assert_no_layers(&store);
    // The good one still goes in.
    import(&store, &good, &opts(None)).unwrap();
}
