//! Pulls that fail part-way leave nothing behind, and a later pull
//! succeeds: the registry dying mid-blob (a proxy in this test cuts the
//! answer halfway), the disk filling mid-conversion (the store on a small
//! tmpfs this test mounts: needs root), a layer over the size cap; and a
//! multi-arch index resolved to linux/amd64.
//!
//! Needs `apt-get install docker-registry skopeo`; fails (never skips)
//! without them or without root.

mod common;

use common::{Mode, Proxy};
use image_store::layer::{LayerError, LayerLimits};
use image_store::registry::{pull, PullError, PullOptions};
use image_store::Store;
use shoal_test_support::registry::{
    push, push_all, tar_of, write_index_layout, write_layout, Entry, Registry,
};
use std::path::Path;
use std::process::Command;

/// Bytes no compressor shrinks (xorshift).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

/// Pushes `test/big:v1`: a small layer and one with `mib` MiB of noise;
/// returns the big layer's blob digest.
fn push_big(dir: &Path, reg: &Registry, mib: usize) -> String {
    let layout = dir.join("layout-big");
    let data = noise(mib << 20, 7);
    let layers = vec![
        (tar_of(&[Entry::File("small", 0o644, b"small")]), true),
        (tar_of(&[Entry::File("big", 0o644, &data)]), true),
    ];
    let got = write_layout(&layout, "v1", &layers, serde_json::json!({}));
    push(dir, &layout, "v1", &reg.reference("test/big:v1"));
    got[1].0.clone()
}

/// No layer file and no staging directory is left, and no image.
fn assert_clean(store: &Store) {
    let left: Vec<String> = std::fs::read_dir(store.dir().join("layers"))
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    // Only whole layers another image has may stay (the small one, when
    // it came first); never a staging directory.
    assert!(
        left.iter().all(|n| n.ends_with(".erofs")),
        "partial state left: {left:?}"
    );
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn the_registry_dying_mid_blob_leaves_no_partial_layer_and_a_later_pull_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::start(dir.path());
    let big = push_big(dir.path(), &reg, 1);
    let proxy = Proxy::start(reg.port, Mode::Open);
    *proxy.state.cut.lock().unwrap() = Some(big.clone());
    let store = Store::new(&dir.path().join("store"));
    let r = proxy.reference("test/big:v1");
    let e = pull(&store, &r, &PullOptions::default()).unwrap_err();
    assert!(matches!(e, PullError::Layer(_)), "{e}");
    eprintln!("cut mid-blob: {e}");
    assert!(e.to_string().contains(&big), "names the layer: {e}");
    assert_clean(&store);
    assert!(proxy.state.cut.lock().unwrap().is_none(), "it was cut");
    let img = pull(&store, &r, &PullOptions::default()).unwrap();
    assert_eq!(img.layer_files.len(), 2);
    for f in &img.layer_files {
        pmem::check_image(f).unwrap();
    }
}

#[test]
fn a_layer_over_the_size_cap_fails_its_pull_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::start(dir.path());
    let big = push_big(dir.path(), &reg, 1);
    let proxy = Proxy::start(reg.port, Mode::Open);
    let store = Store::new(&dir.path().join("store"));
    let r = proxy.reference("test/big:v1");
    let capped = PullOptions {
        limits: LayerLimits::both(512 << 10),
        ..Default::default()
    };
    let e = pull(&store, &r, &capped).unwrap_err();
    assert!(
        matches!(e, PullError::Layer(LayerError::TooLarge { cap, .. }) if cap == 512 << 10),
        "{e}"
    );
    assert!(
        e.to_string().contains("over the cap of 524288 bytes"),
        "{e}"
    );
    assert_clean(&store);
    // The manifest names the blob's size: it was not fetched at all.
    let log = proxy.state.log.lock().unwrap().clone();
    assert!(!log.iter().any(|l| l.contains(&big)), "{log:#?}");
    // Under the blob cap but over the tar cap, it fails as it streams.
    let tar_capped = PullOptions {
        limits: LayerLimits {
            max_blob_bytes: 4 << 20,
            max_tar_bytes: 512 << 10,
        },
        ..Default::default()
    };
    let e = pull(&store, &r, &tar_capped).unwrap_err();
    assert!(
        matches!(
            e,
            PullError::Layer(LayerError::TooLarge {
                what: "uncompressed tar",
                ..
            })
        ),
        "{e}"
    );
    assert!(log.len() < proxy.state.log.lock().unwrap().len());
    assert_clean(&store);
    pull(&store, &r, &PullOptions::default()).unwrap();
}

/// A tmpfs of `size` on `dir`, unmounted on drop.
struct Tmpfs<'a>(&'a Path);

impl<'a> Tmpfs<'a> {
    fn mount(dir: &'a Path, size: &str) -> Tmpfs<'a> {
        assert!(is_root(), "this test mounts a tmpfs: run it as root");
        std::fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "shoal-test"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs on {}", dir.display());
        Tmpfs(dir)
    }
    fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.0)
            .status()
            .unwrap();
        assert!(st.success());
    }
}

impl Drop for Tmpfs<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn the_disk_filling_mid_conversion_is_a_clear_error_and_a_later_pull_with_room_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::start(dir.path());
    push_big(dir.path(), &reg, 3);
    let mnt = dir.path().join("mnt");
    let fs = Tmpfs::mount(&mnt, "2m");
    let store = Store::new(&mnt.join("store"));
    let r = reg.reference("test/big:v1");
    let e = pull(&store, &r, &PullOptions::default()).unwrap_err();
    let msg = e.to_string();
    eprintln!("disk full: {msg}");
    assert!(
        msg.contains("No space left on device"),
        "says the disk is full: {msg}"
    );
    assert_clean(&store);
    fs.resize("64m");
    let img = pull(&store, &r, &PullOptions::default()).unwrap();
    for f in &img.layer_files {
        pmem::check_image(f).unwrap();
    }
}

#[test]
fn a_multi_arch_index_resolves_to_linux_amd64() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::start(dir.path());
    let layout = dir.path().join("layout-multi");
    let arm = (
        "arm64",
        vec![(tar_of(&[Entry::File("arch", 0o644, b"arm64")]), true)],
        serde_json::json!({"Env": ["ARCH=arm64"]}),
    );
    let amd = (
        "amd64",
        vec![(tar_of(&[Entry::File("arch", 0o644, b"amd64")]), true)],
        serde_json::json!({"Env": ["ARCH=amd64"]}),
    );
    let digests = write_index_layout(&layout, "v1", &[arm, amd]);
    push_all(dir.path(), &layout, "v1", &reg.reference("test/multi:v1"));
    let store = Store::new(&dir.path().join("store"));
    let img = pull(
        &store,
        &reg.reference("test/multi:v1"),
        &PullOptions::default(),
    )
    .unwrap();
    assert_eq!(img.image.config.env, vec!["ARCH=amd64"]);
    assert_eq!(img.image.manifest_digest, digests[1], "the amd64 manifest");
    // An index with no linux/amd64 image is refused, and says so.
    let only_arm = dir.path().join("layout-arm");
    write_index_layout(
        &only_arm,
        "v1",
        &[(
            "arm64",
            vec![(tar_of(&[Entry::File("arch", 0o644, b"arm64")]), true)],
            serde_json::json!({}),
        )],
    );
    push_all(dir.path(), &only_arm, "v1", &reg.reference("test/arm:v1"));
    let e = pull(
        &store,
        &reg.reference("test/arm:v1"),
        &PullOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no linux/amd64 manifest"), "{e}");
}
