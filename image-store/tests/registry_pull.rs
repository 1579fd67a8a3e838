//! A pull from a real registry: Debian's `docker-registry` (the CNCF
//! distribution registry) on a loopback port with its storage in a
//! temporary directory, and a 2-layer image (a whiteout, an opaque
//! directory) built here and pushed with `skopeo copy`.
//!
//! Needs `apt-get install docker-registry skopeo`; fails (never skips)
//! without them.

use image_store::layer::sha256_digest;
use image_store::registry::{pull, PullError, PullOptions};
use image_store::Store;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REGISTRY: &str = "/usr/bin/docker-registry";

struct Registry {
    child: Child,
    port: u16,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_registry(dir: &Path) -> Registry {
    assert!(
        Path::new(REGISTRY).is_file(),
        "{REGISTRY} is missing: this test needs Debian's registry (apt-get install -y \
         docker-registry skopeo)"
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = dir.join("registry.yml");
    std::fs::write(
        &cfg,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
             delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("storage").display()
        ),
    )
    .unwrap();
    let child = Command::new(REGISTRY)
        .arg("serve")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start docker-registry");
    let reg = Registry { child, port };
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "docker-registry did not listen on {port} in 15 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    reg
}

fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_path(name).unwrap();
        if name.ends_with('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
        }
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn put_blob(layout: &Path, bytes: &[u8]) -> String {
    let d = sha256_digest(bytes);
    let p = layout
        .join("blobs/sha256")
        .join(d.strip_prefix("sha256:").unwrap());
    std::fs::write(p, bytes).unwrap();
    d
}

/// Writes an OCI layout with the image at tag `v1`; returns the two
/// layers' (digest, diff_id).
fn build_layout(layout: &Path) -> Vec<(String, String)> {
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let base = tar_of(&[
        ("etc/", b""),
        ("etc/a.conf", b"a"),
        ("etc/b.conf", b"b"),
        ("opt/", b""),
        ("opt/d/", b""),
        ("opt/d/old", b"old"),
    ]);
    let top = tar_of(&[
        ("etc/.wh.a.conf", b""),
        ("opt/d/", b""),
        ("opt/d/.wh..wh..opq", b""),
        ("opt/d/new", b"new"),
    ]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&base).unwrap();
    let base_gz = gz.finish().unwrap();
    let layers = vec![
        (
            put_blob(layout, &base_gz),
            sha256_digest(&base),
            base_gz.len(),
            "+gzip",
        ),
        (put_blob(layout, &top), sha256_digest(&top), top.len(), ""),
    ];
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/bin", "A=1"], "WorkingDir": "/opt", "User": "1000:1000",
                   "Cmd": ["/bin/sh"], "Labels": {"k": "v"}},
        "rootfs": {"type": "layers", "diff_ids": [layers[0].1, layers[1].1]},
    });
    let config = serde_json::to_vec(&config).unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put_blob(layout, &config), "size": config.len()},
        "layers": layers.iter().map(|(d, _, n, c)| serde_json::json!({
            "mediaType": format!("application/vnd.oci.image.layer.v1.tar{c}"),
            "digest": d, "size": n})).collect::<Vec<_>>(),
    });
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": put_blob(layout, &manifest), "size": manifest.len(),
                       "annotations": {"org.opencontainers.image.ref.name": "v1"}}],
    });
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    layers.into_iter().map(|(d, i, _, _)| (d, i)).collect()
}

fn push(dir: &Path, layout: &Path, port: u16) {
    let policy = dir.join("policy.json");
    std::fs::write(
        &policy,
        br#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    )
    .unwrap();
    let out = Command::new("skopeo")
        .arg("--policy")
        .arg(&policy)
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:v1", layout.display()))
        .arg(format!("docker://127.0.0.1:{port}/test/app:v1"))
        .output()
        .expect("skopeo is installed (apt-get install -y skopeo)");
    assert!(
        out.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn pull_a_two_layer_image_with_whiteouts_from_a_real_registry() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let reg = start_registry(dir.path());
    let layout = dir.path().join("layout");
    let want = build_layout(&layout);
    push(dir.path(), &layout, reg.port);

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
