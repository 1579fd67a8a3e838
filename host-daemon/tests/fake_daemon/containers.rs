//! `{"image": REF}` creates of OCI images in the daemon's image store
//! (`STATE/images`): references resolved (or refused with what to do),
//! the template derived and the daemon's, the image's Env under the
//! request's and its WorkingDir the default cwd of execs. (The guest side,
//! a real image booted, is tests/tests/containers.rs.)

use super::harness::{read, refused, TestDaemon};
use image_store::Store;
use shoal_client::api::images::{Image, ImageConfig, ImageLayer};
use shoal_client::api::{CreateSandbox, CreateTemplate, ExecRequest, SnapshotRequest};
use std::collections::BTreeMap;

/// Puts an image of `n` layers (each a small real erofs file) with
/// `config` into the daemon's store as `reference`; returns its id.
pub(super) fn put_image(d: &TestDaemon, reference: &str, n: usize, config: ImageConfig) -> String {
    put_image_seeded(d, reference, n, config, 0)
}

/// [`put_image`] with layers and id of their own for each `seed`.
fn put_image_seeded(
    d: &TestDaemon,
    reference: &str,
    n: usize,
    config: ImageConfig,
    seed: usize,
) -> String {
    let store = Store::new(&d.state_dir().join("images"));
    let mut layers = vec![];
    for i in 0..n {
        let root = d.scratch(&format!("layer{i}"));
        std::fs::write(root.join(format!("f{i}")), "x").unwrap();
        let diff_id = format!("sha256:{seed:032x}{i:032x}");
        let out = store.layer_path(&diff_id).unwrap();
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let raw = d.scratch("raw").join(format!("{i}.raw"));
        shoal_images::image::pack_erofs(&root, &raw, &out).unwrap();
        layers.push(ImageLayer {
            digest: diff_id.clone(),
            diff_id,
            erofs_bytes: std::fs::metadata(&out).unwrap().len(),
        });
    }
    // Distinct in the 12 digits a template name takes.
    let id = format!("sha256:{:012x}{seed:052x}", 0xabc0 + n);
    store
        .put(&Image {
            id: id.clone(),
            refs: vec![reference.into()],
            manifest_digest: id.clone(),
            layers,
            config,
            disk_bytes: 0,
            in_use: 0,
            created_at: "2026-01-01T00:00:00Z".into(),
        })
        .unwrap();
    id
}

#[test]
fn oci_images_are_resolved_in_the_store_with_their_exec_defaults() {
    let d = TestDaemon::start();
    let create = |image: &str, env: &[(&str, &str)]| {
        d.c.create(&CreateSandbox {
            image: Some(image.into()),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
    };
    // Not pulled: 404 naming the command that pulls it.
    let (st, _, m) = refused(create("127.0.0.1:5000/test/app:1", &[]).unwrap_err());
    assert_eq!(st, 404, "{m}");
    assert!(
        m.contains("shoal image pull 127.0.0.1:5000/test/app:1"),
        "{m}"
    );
    let (st, _, m) = refused(create("Not A Ref!", &[]).unwrap_err());
    assert_eq!(st, 400, "{m}");

    let work = d.scratch("work");
    let config = ImageConfig {
        env: vec!["FROM_IMAGE=yes".into(), "A=image".into()],
        working_dir: Some(work.display().to_string()),
        ..Default::default()
    };
    let reference = "127.0.0.1:5000/test/app:1";
    let id = put_image(&d, reference, 2, config);
    let a = create(reference, &[("A", "request")]).expect("create of a stored image");
    let want_env = BTreeMap::from([
        ("A".to_string(), "request".to_string()),
        ("FROM_IMAGE".to_string(), "yes".to_string()),
    ]);
    assert_eq!(a.env, want_env, "the image's Env under the request's");
    let tpl = format!("oci-{}-1c-128m", &id["sha256:".len()..][..12]);
    assert_eq!(a.template, tpl);
    let r = d.c.exec(&a.id, &ExecRequest::argv(["pwd"])).unwrap();
    assert_eq!(r.stdout.trim(), work.display().to_string(), "WorkingDir");
    let r =
        d.c.exec(
            &a.id,
            &ExecRequest {
                cwd: Some("/".into()),
                ..ExecRequest::argv(["pwd"])
            },
        )
        .unwrap();
    assert_eq!(r.stdout.trim(), "/", "a request's cwd wins");
    // No Entrypoint or Cmd: an empty cmd is refused with the reason.
    let e =
        d.c.exec(&a.id, &ExecRequest::argv(Vec::<String>::new()))
            .unwrap_err();
    let (st, _, m) = refused(e);
    assert_eq!(st, 400, "{m}");
    assert!(m.contains("no Entrypoint or Cmd"), "{m}");

    // A snapshot of it keeps the image's exec defaults: its sandboxes get
    // the image's Env (under their request's) and WorkingDir, and the
    // image stays in use while the snapshot is there.
    let snap =
        d.c.snapshot(
            &a.id,
            &SnapshotRequest {
                template: Some("snap-of-a".into()),
            },
        )
        .expect("snapshot");
    let from_snap =
        d.c.create(&CreateSandbox {
            template: Some(snap.name.clone()),
            env: [("B".to_string(), "request".to_string())].into(),
            ..Default::default()
        })
        .expect("a create from the snapshot");
    assert_eq!(
        from_snap.env,
        BTreeMap::from([
            ("A".to_string(), "image".to_string()),
            ("B".to_string(), "request".to_string()),
            ("FROM_IMAGE".to_string(), "yes".to_string()),
        ])
    );
    let r =
        d.c.exec(&from_snap.id, &ExecRequest::argv(["pwd"]))
            .unwrap();
    assert_eq!(r.stdout.trim(), work.display().to_string(), "WorkingDir");
    assert_eq!(
        d.c.image(&id).unwrap().in_use,
        4,
        "2 templates, 2 sandboxes"
    );
    d.c.kill(&from_snap.id).unwrap();
    d.c.delete_template(&snap.name).unwrap();

    // By id too, the same template; it is the daemon's and its name is
    // reserved.
    let b = create(&id, &[]).unwrap();
    assert_eq!(b.template, tpl);
    let templates = d.c.templates().unwrap();
    let t = templates.iter().find(|t| t.name == tpl).expect("listed");
    assert_eq!(t.source, format!("oci:{id}"));
    assert_eq!(t.owner.as_deref(), Some("daemon"));
    assert_eq!(templates.len(), 1, "one template for both: {templates:?}");
    let e =
        d.c.create_template(&CreateTemplate::new(tpl.as_str(), "tiny"))
            .unwrap_err();
    assert_eq!(refused(e).0, 403);
}

#[test]
fn images_of_more_layers_than_a_guest_takes_have_their_lowest_merged_once() {
    let d = TestDaemon::start();
    let create = |image: &str| {
        d.c.create(&CreateSandbox {
            image: Some(image.into()),
            ..Default::default()
        })
    };
    let merges = d.state_dir().join("image-merges");
    let merged = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&merges)
            .map(|r| {
                r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    // 12 layers: the lowest 5 merged into one, the guest gets 8.
    let twelve = "127.0.0.1:5000/test/twelve:1";
    let id = put_image(&d, twelve, 12, ImageConfig::default());
    let a = create(twelve).expect("a create of a 12-layer image");
    let first = merged();
    assert_eq!(first.len(), 1, "one merged layer: {first:?}");
    // The image list's disk use counts it.
    let l = d.c.images().unwrap();
    let layers: u64 = l.images[0].layers.iter().map(|x| x.erofs_bytes).sum();
    let size = std::fs::metadata(merges.join(&first[0])).unwrap().len();
    assert_eq!(l.disk_bytes, layers + size);
    let t = d.c.templates().unwrap();
    let t = t.iter().find(|t| t.name == a.template).unwrap();
    let spec = read(&t.dir.join(shoal_runtime::backend::fake::TEMPLATE_MARKER));
    assert_eq!(spec.matches(".erofs").count(), 8, "{spec}");
    assert!(
        spec.contains(&format!("image-merges/{}", first[0])),
        "{spec}"
    );
    // The second create (and one of another shape) reuses it.
    let b = create(&id).unwrap();
    let c =
        d.c.create(&CreateSandbox {
            image: Some(id.clone()),
            memory_mib: Some(256),
            ..Default::default()
        })
        .unwrap();
    assert_ne!(c.template, a.template);
    assert_eq!(merged(), first, "merged once");
    // 13 layers (the same lowest 5 and one more merged): its own merge.
    let thirteen = "127.0.0.1:5000/test/thirteen:1";
    put_image(&d, thirteen, 13, ImageConfig::default());
    let e = create(thirteen).unwrap();
    assert_eq!(merged().len(), 2);

    // A removal takes the merged layer no image left needs.
    for s in [&a, &b, &c, &e] {
        d.c.kill(&s.id).unwrap();
    }
    for t in [&a.template, &c.template, &e.template] {
        d.c.delete_template(t).unwrap();
    }
    d.c.remove_image(thirteen).unwrap();
    assert_eq!(merged(), first, "the 12-layer image's stays");
    d.c.remove_image(twelve).unwrap();
    assert!(merged().is_empty(), "{:?}", merged());

    // Truly too many: a clear 400 naming the cap.
    put_image(
        &d,
        "127.0.0.1:5000/test/huge:1",
        129,
        ImageConfig::default(),
    );
    let (st, _, m) = refused(create("127.0.0.1:5000/test/huge:1").unwrap_err());
    assert_eq!(st, 400, "{m}");
    assert!(m.contains("129 layers") && m.contains("at most 128"), "{m}");
    assert!(merged().is_empty(), "nothing merged for it");
}

#[test]
fn a_removal_racing_a_first_create_is_refused_or_the_create_is_not_found() {
    let d = TestDaemon::start();
    // Nine layers: the create merges (~0.1 s here), looks the image up
    // again and opens its layers, then records its template's row; the
    // removal starts 0 to 165 ms in, across all of that. (Without the
    // lock, a round soon has both succeed, or a create that fails to open
    // a removed layer.)
    for round in 0..12 {
        let reference = format!("127.0.0.1:5000/test/race{round}:1");
        let id = put_image_seeded(&d, &reference, 9, ImageConfig::default(), round + 1);
        let (created, removed) = std::thread::scope(|s| {
            let c = s.spawn(|| {
                d.c.create(&CreateSandbox {
                    image: Some(reference.clone()),
                    ..Default::default()
                })
            });
            let r = s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(15 * round as u64));
                d.c.remove_image(&reference)
            });
            (c.join().unwrap(), r.join().unwrap())
        });
        match (created, removed) {
            (Ok(sb), Err(e)) => {
                let (st, _, m) = refused(e);
                assert_eq!(st, 409, "round {round}: {m}");
                // Its layers are all there.
                assert_eq!(d.c.image(&id).unwrap().layers.len(), 9);
                d.c.kill(&sb.id).unwrap();
                d.c.delete_template(&sb.template).unwrap();
                d.c.remove_image(&id).unwrap();
            }
            (Err(e), Ok(_)) => {
                let (st, _, m) = refused(e);
                assert_eq!(st, 404, "round {round}: {m}");
                assert!(m.contains("shoal image pull"), "{m}");
            }
            (c, r) => panic!("round {round}: create {c:?}, removal {r:?}"),
        }
        let merges = d.state_dir().join("image-merges");
        let left = std::fs::read_dir(&merges).map_or(0, |r| r.count());
        assert_eq!(
            left, 0,
            "round {round}: a merged layer of a removed image is left"
        );
    }
}
