//! The LRU cap on a real on-disk store (layer files of known sizes, last
//! uses set by mtime).

use crate::Store;
use shoal_api::images::{Image, ImageConfig, ImageLayer};
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

fn digest(n: u8) -> String {
    format!("sha256:{}", format!("{n:02x}").repeat(32))
}

/// Stores image `n` with layers `layers` (each `KiB` bytes).
fn put(store: &Store, n: u8, layers: &[(u8, usize)]) -> Image {
    let mut ls = Vec::new();
    for (l, kib) in layers {
        let p = store.layer_path(&digest(*l)).unwrap();
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, vec![0u8; kib << 10]).unwrap();
        ls.push(ImageLayer {
            digest: digest(*l),
            diff_id: digest(*l),
            erofs_bytes: (kib << 10) as u64,
        });
    }
    let image = Image {
        id: digest(100 + n),
        refs: vec![format!("127.0.0.1:5000/lru/i{n}:v1")],
        manifest_digest: digest(200 + n),
        disk_bytes: ls.iter().map(|l| l.erofs_bytes).sum(),
        layers: ls,
        config: ImageConfig::default(),
        in_use: 0,
        created_at: "2026-12-01T00:00:00Z".into(),
    };
    store.put(&image).unwrap().image
}

/// Sets image `id`'s last use `ago` seconds back.
fn used(store: &Store, id: &str, ago: u64) {
    store.touch(id).unwrap();
    let p = store.dir().join("used").join(&id[7..]);
    let f = std::fs::File::options().write(true).open(p).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(ago))
        .unwrap();
}

#[test]
fn lru_layers_no_image_in_use_needs_are_evicted_with_their_images() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    // Layer 1 (base, 40 KiB) is shared by images 1 and 2; 3 stands alone.
    let i1 = put(&store, 1, &[(1, 40), (2, 10)]);
    let i2 = put(&store, 2, &[(1, 40), (3, 20)]);
    let i3 = put(&store, 3, &[(4, 30)]);
    // An orphan layer (its image was removed by hand).
    std::fs::write(store.layer_path(&digest(9)).unwrap(), vec![0u8; 5 << 10]).unwrap();
    used(&store, &i1.id, 300);
    used(&store, &i2.id, 100);
    used(&store, &i3.id, 200);
    let u = store.usage().unwrap();
    assert_eq!((u.layers, u.layer_bytes, u.images), (5, 105 << 10, 3));

    // Under the cap: nothing goes.
    let e = store.evict(105 << 10, &BTreeSet::new()).unwrap();
    assert!(e.layers.is_empty() && e.images.is_empty(), "{e:?}");

    // The orphan goes first, then the oldest image's own layer (2): image
    // 1 goes with it; the shared base stays for image 2.
    let e = store.evict(90 << 10, &BTreeSet::new()).unwrap();
    assert_eq!(e.layers, vec![digest(9), digest(2)]);
    assert_eq!(e.images, vec![i1.id.clone()]);
    assert_eq!(e.usage.layer_bytes, 90 << 10);
    assert!(store.resolve(&i1.id).is_err());
    assert!(store.resolve("127.0.0.1:5000/lru/i1:v1").is_err());
    assert!(
        store.resolve(&i2.id).is_ok(),
        "the shared base is still there"
    );

    // Image 3 (used 200 s ago) is in use: image 2's layers (used 100 s
    // ago, but not in use) go first, never 3's.
    let keep: BTreeSet<String> = [i3.id.clone()].into();
    let e = store.evict(10 << 10, &keep).unwrap();
    assert_eq!(e.images, vec![i2.id.clone()]);
    assert_eq!(e.layers.len(), 2, "base and layer 3: {e:?}");
    assert_eq!(
        e.usage,
        crate::Usage {
            layers: 1,
            layer_bytes: 30 << 10,
            images: 1
        },
        "over the cap, but image 3 is in use"
    );
    assert!(store.resolve(&i3.id).is_ok());
    assert!(store.layer_path(&digest(4)).unwrap().is_file());
    // Once unused, it may go too.
    let e = store.evict(10 << 10, &BTreeSet::new()).unwrap();
    assert_eq!(e.images, vec![i3.id.clone()]);
    assert_eq!(store.usage().unwrap(), crate::Usage::default());
}

#[test]
fn a_more_recent_use_keeps_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    let a = put(&store, 1, &[(1, 10)]);
    let b = put(&store, 2, &[(2, 10)]);
    used(&store, &a.id, 50);
    used(&store, &b.id, 10);
    // a is used now: b is the least recently used.
    store.touch(&a.id).unwrap();
    assert!(store.last_used(&a.id).unwrap() > store.last_used(&b.id).unwrap());
    let e = store.evict(10 << 10, &BTreeSet::new()).unwrap();
    assert_eq!(e.images, vec![b.id.clone()]);
    assert!(store.resolve(&a.id).is_ok());
    assert!(!store.dir().join("used").join(&b.id[7..]).exists());
}
