//! The image API (`GET|POST /v1/images`, `GET|DELETE /v1/images/{image}`):
//! list with disk use, inspect by reference and id, removal refused (409)
//! while a template or a live sandbox of the image exists, and a real pull
//! through the daemon from a loopback `docker-registry`.

use super::containers::put_image;
use super::harness::{refused, Opts, TestDaemon};
use shoal_client::api::images::{ImageConfig, PullImage};
use shoal_client::api::CreateSandbox;
use shoal_test_support::registry::{push, tar_of, write_layout, Entry, Registry};

#[test]
fn images_are_listed_inspected_and_not_removed_while_in_use() {
    let d = TestDaemon::start();
    let l = d.c.images().unwrap();
    assert!(l.images.is_empty() && l.disk_bytes == 0, "{l:?}");

    // Two images sharing their lowest layer.
    let a_ref = "127.0.0.1:5000/test/a:1";
    let a = put_image(&d, a_ref, 2, ImageConfig::default());
    let b = put_image(&d, "127.0.0.1:5000/test/b:1", 1, ImageConfig::default());
    let l = d.c.images().unwrap();
    let ids: Vec<&str> = l.images.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&a.as_str()) && ids.contains(&b.as_str()));
    let ia = l.images.iter().find(|i| i.id == a).unwrap();
    let layer_sum: u64 = ia.layers.iter().map(|x| x.erofs_bytes).sum();
    assert!(layer_sum > 0);
    assert_eq!(l.disk_bytes, layer_sum, "the shared layer counted once");
    assert!(l.images.iter().all(|i| i.in_use == 0));

    // Inspect by reference and by id; unknown and unbounded ones refused.
    assert_eq!(d.c.image(a_ref).unwrap().id, a);
    assert_eq!(d.c.image(&a).unwrap().refs, vec![a_ref.to_string()]);
    let (st, _, m) = refused(d.c.image("127.0.0.1:5000/test/none:1").unwrap_err());
    assert_eq!(st, 404, "{m}");
    assert!(m.contains("shoal image pull"), "{m}");
    let long = format!("127.0.0.1:5000/{}:1", "a".repeat(600));
    assert_eq!(refused(d.c.image(&long).unwrap_err()).0, 400);

    // In use by a sandbox and its template: 409 naming them.
    let s =
        d.c.create(&CreateSandbox {
            image: Some(a_ref.into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        d.c.image(&a).unwrap().in_use,
        2,
        "the template and the sandbox"
    );
    let (st, _, m) = refused(d.c.remove_image(a_ref).unwrap_err());
    assert_eq!(st, 409, "{m}");
    assert!(m.contains(&format!("sandbox {}", s.id)), "{m}");
    assert!(m.contains(&format!("template {}", s.template)), "{m}");
    d.c.kill(&s.id).unwrap();
    let (st, _, m) = refused(d.c.remove_image(&a).unwrap_err());
    assert_eq!(st, 409, "the template is left: {m}");
    d.c.delete_template(&s.template).unwrap();
    assert_eq!(d.c.image(&a).unwrap().in_use, 0);

    // Removed: its own layer goes, the shared one stays with b.
    let gone = d.c.remove_image(a_ref).unwrap();
    assert_eq!(gone.id, a);
    let l = d.c.images().unwrap();
    assert_eq!(l.images.len(), 1);
    assert_eq!(l.images[0].id, b);
    assert_eq!(l.disk_bytes, l.images[0].layers[0].erofs_bytes);
    assert_eq!(refused(d.c.image(&a).unwrap_err()).0, 404);
    let layers = d.state_dir().join("images/layers");
    assert_eq!(std::fs::read_dir(layers).unwrap().count(), 1);

    // The document lists the routes.
    let doc = d.c.openapi().unwrap();
    assert!(doc["paths"]["/v1/images"]["post"].is_object());
    assert!(doc["paths"]["/v1/images/{image}"]["delete"].is_object());
    assert!(doc["components"]["schemas"]["ImageList"].is_object());
}

#[test]
fn a_pull_through_the_daemon_from_a_real_registry() {
    let d = TestDaemon::start();
    let dir = d.scratch("registry");
    let reg = Registry::start(&dir);
    let layout = dir.join("layout");
    let tar = tar_of(&[Entry::Dir("etc/"), Entry::File("etc/hello", 0o644, b"hi")]);
    let config = serde_json::json!({"Env": ["A=1"], "WorkingDir": "/etc"});
    let want = write_layout(&layout, "v1", &[(tar, true)], config);
    push(&dir, &layout, "v1", &reg.reference("test/app:v1"));

    let reference = format!("127.0.0.1:{}/test/app:v1", reg.port);
    let pull = |r: &str| {
        d.c.pull_image(&PullImage {
            reference: r.into(),
            insecure: None,
        })
    };
    let img = pull(&reference).expect("pull through the daemon");
    assert_eq!(img.refs, vec![reference.clone()]);
    assert_eq!(img.layers.len(), 1);
    assert_eq!(img.layers[0].diff_id, want[0].1);
    assert_eq!(img.config.working_dir.as_deref(), Some("/etc"));
    assert_eq!(d.c.images().unwrap().images, vec![img.clone()]);

    let missing = format!("127.0.0.1:{}/test/none:v1", reg.port);
    let (st, _, m) = refused(pull(&missing).unwrap_err());
    assert_eq!(st, 404, "{m}");
    let (st, _, m) = refused(pull("Not A Ref!").unwrap_err());
    assert_eq!(st, 400, "{m}");
    let (st, _, m) = refused(pull(&"a".repeat(600)).unwrap_err());
    assert_eq!(st, 400, "{m}");
    // A body with an unknown field is a 400 too.
    let r =
        d.c.request(
            "POST",
            "/v1/images",
            shoal_client::Body::Json(br#"{"ref":"x","tag":"y"}"#.to_vec()),
        )
        .unwrap();
    assert_eq!(r.status, 400);
}

/// Stores an image of one layer of its own (`n` names it) in `d`'s store.
fn own_image(d: &TestDaemon, reference: &str, n: u32) -> String {
    own_image_of(d, reference, n, 1).id
}

/// Stores an image of `layers` layers of its own (`n` names it) in `d`'s
/// store.
fn own_image_of(
    d: &TestDaemon,
    reference: &str,
    n: u32,
    layers: u32,
) -> shoal_client::api::images::Image {
    use shoal_client::api::images::{Image, ImageLayer};
    let store = image_store::Store::new(&d.state_dir().join("images"));
    let root = d.scratch(&format!("own{n}"));
    std::fs::write(root.join("f"), "x").unwrap();
    let layers = (0..layers)
        .map(|l| {
            let diff_id = format!("sha256:{:064x}", 0xfeed_0000 + n * 1000 + l);
            let out = store.layer_path(&diff_id).unwrap();
            std::fs::create_dir_all(out.parent().unwrap()).unwrap();
            let raw = d.scratch("raw").join(format!("own{n}-{l}.raw"));
            shoal_images::image::pack_erofs(&root, &raw, &out).unwrap();
            ImageLayer {
                digest: diff_id.clone(),
                diff_id,
                erofs_bytes: std::fs::metadata(&out).unwrap().len(),
            }
        })
        .collect();
    let id = format!("sha256:{:064x}", 0xbeef_0000 + n);
    let img = Image {
        id: id.clone(),
        refs: vec![reference.into()],
        manifest_digest: id,
        layers,
        config: ImageConfig::default(),
        disk_bytes: 0,
        in_use: 0,
        created_at: "2026-01-01T00:00:00Z".into(),
    };
    store.put(&img).unwrap();
    img
}

#[test]
fn a_pull_over_the_store_cap_evicts_images_no_sandbox_or_template_uses() {
    let d = TestDaemon::with(Opts {
        images: shoald::images::ImageOptions {
            max_bytes: Some(1),
            ..Default::default()
        },
        ..Default::default()
    });
    let a_ref = "127.0.0.1:5000/test/a:1";
    let a = own_image(&d, a_ref, 1);
    // b has more layers than a guest takes: its lowest ones have a merged
    // layer (as a create of it made one), which goes with it.
    let b_img = own_image_of(&d, "127.0.0.1:5000/test/b:1", 2, 9);
    let b = b_img.id.clone();
    let merges = shoald::container_layers::merges_dir(&d.state_dir());
    let lowest: Vec<&str> = b_img.layers[..2]
        .iter()
        .map(|l| l.diff_id.as_str())
        .collect();
    let b_merged = merges.join(shoald::container_layers::merge_name(&lowest));
    std::fs::create_dir_all(&merges).unwrap();
    std::fs::write(&b_merged, vec![0u8; 4096]).unwrap();
    let s =
        d.c.create(&CreateSandbox {
            image: Some(a_ref.into()),
            ..Default::default()
        })
        .unwrap();
    let dir = d.scratch("registry");
    let reg = Registry::start(&dir);
    let layout = dir.join("layout");
    let tar = tar_of(&[Entry::File("hello", 0o644, b"hi")]);
    write_layout(&layout, "v1", &[(tar, true)], serde_json::json!({}));
    push(&dir, &layout, "v1", &reg.reference("test/c:v1"));
    let pull = || {
        d.c.pull_image(&PullImage {
            reference: reg.reference("test/c:v1"),
            insecure: None,
        })
        .unwrap()
    };
    let c = pull();
    // Over a 1-byte cap: b (unused) went; a (in use) and c (just pulled)
    // stay.
    let ids = |d: &TestDaemon| -> Vec<String> {
        d.c.images()
            .unwrap()
            .images
            .into_iter()
            .map(|i| i.id)
            .collect()
    };
    let mut want = vec![a.clone(), c.id.clone()];
    want.sort();
    assert_eq!(ids(&d), want, "b ({b}) was evicted");
    assert!(!b_merged.exists(), "b's merged layer went with it");
    assert_eq!(
        refused(d.c.image("127.0.0.1:5000/test/b:1").unwrap_err()).0,
        404
    );
    // Once nothing uses a, the next pull evicts it too.
    d.c.kill(&s.id).unwrap();
    d.c.delete_template(&s.template).unwrap();
    pull();
    assert_eq!(ids(&d), vec![c.id.clone()]);
    let layers = d.state_dir().join("images/layers");
    assert_eq!(std::fs::read_dir(layers).unwrap().count(), 1);
    assert_eq!(std::fs::read_dir(&merges).unwrap().count(), 0);
}

/// `shoal create --image REF` and `shoal run --image REF` pull an image
/// the store lacks first, as `docker run` does (`--pull missing`, the
/// default); `--pull never` leaves a missing image an error, and an image
/// the store has is not pulled again.
#[test]
fn the_cli_pulls_a_missing_image_before_a_create() {
    let d = TestDaemon::start();
    let dir = d.scratch("registry");
    let reg = Registry::start(&dir);
    let layout = dir.join("layout");
    let tar = tar_of(&[Entry::Dir("etc/"), Entry::File("etc/hello", 0o644, b"hi")]);
    write_layout(&layout, "v1", &[(tar, true)], serde_json::json!({}));
    push(&dir, &layout, "v1", &reg.reference("test/cli:v1"));
    let reference = format!("127.0.0.1:{}/test/cli:v1", reg.port);
    let cli = |args: &[&str]| {
        let o = std::process::Command::new(shoal_test_support::shoal_cli())
            .arg("--daemon")
            .arg(d.state_dir().join("shoald.sock"))
            .args(args)
            .output()
            .expect("run shoal");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        (
            o.status.success(),
            String::from_utf8(o.stdout).unwrap(),
            err,
        )
    };

    let (ok, _, err) = cli(&["create", "--pull", "never", "--image", &reference]);
    assert!(!ok, "{err}");
    assert!(
        err.contains(&format!("shoal image pull {reference}")),
        "{err}"
    );
    assert!(d.c.images().unwrap().images.is_empty());

    let (ok, out, err) = cli(&["create", "--image", &reference]);
    assert!(ok, "{err}");
    assert!(err.contains(&format!("pulling {reference}")), "{err}");
    let imgs = d.c.images().unwrap().images;
    assert_eq!(imgs.len(), 1, "{imgs:?}");
    assert_eq!(imgs[0].refs, vec![reference.clone()]);
    let sb = d.get(out.trim());
    let short = imgs[0]
        .id
        .strip_prefix("sha256:")
        .unwrap()
        .get(..12)
        .unwrap();
    assert!(sb.template.starts_with(&format!("oci-{short}-")), "{sb:?}");

    // In the store now: not pulled again.
    let (ok, _, err) = cli(&["create", "--image", &reference]);
    assert!(ok, "{err}");
    assert!(!err.contains("pulling"), "{err}");
    // A reference the registry lacks: the pull's 404, named.
    let missing = format!("127.0.0.1:{}/test/none:v1", reg.port);
    let (ok, _, err) = cli(&["create", "--image", &missing]);
    assert!(!ok);
    assert!(err.contains(&format!("pulling {missing}")), "{err}");
}
