use super::*;
use crate::image::{build_image_with, AgentSource, BuildOptions, ImageSource};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;

/// A small layer image (erofs, DAX-ready) built like `shoal image build
/// DIR --no-agent`.
fn layer(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("opt/kit")).unwrap();
    std::fs::write(src.join("opt/kit/hello"), "hi\n").unwrap();
    let out = dir.join("kit.img");
    let opts = BuildOptions {
        agent: AgentSource::None,
    };
    build_image_with(ImageSource::Dir(src), &out, &opts).unwrap();
    out
}

#[test]
fn upper_choice_from_a_request() {
    assert_eq!(
        Upper::from_request(None, None, 128).unwrap(),
        Upper::Tmpfs { size_mib: None }
    );
    assert_eq!(
        Upper::from_request(Some(8), None, 128).unwrap(),
        Upper::Tmpfs { size_mib: Some(8) }
    );
    assert_eq!(
        Upper::from_request(Some(128), None, 128).unwrap(),
        Upper::Tmpfs {
            size_mib: Some(128)
        }
    );
    assert_eq!(
        Upper::from_request(None, Some(64), 128).unwrap(),
        Upper::Disk { size_mib: 64 }
    );
    let e = |s, d| {
        Upper::from_request(s, d, 128)
            .expect_err("refused")
            .to_string()
    };
    assert!(e(Some(8), Some(64)).contains("not both"));
    assert!(e(Some(0), None).contains("upper_size_mib 0: expected 1..=128"));
    assert!(e(Some(129), None).contains("at most the guest's memory"));
    assert!(e(None, Some(15)).contains("upper_disk_mib 15: expected 16..="));
    assert!(e(None, Some(MAX_UPPER_DISK_MIB + 1)).contains("upper_disk_mib"));
}

#[test]
fn tmpfs_size_is_always_explicit() {
    assert_eq!(Upper::default().tmpfs_mib(256), 128, "half of RAM");
    assert_eq!(Upper::Tmpfs { size_mib: Some(3) }.tmpfs_mib(256), 3);
    assert_eq!(Upper::Disk { size_mib: 64 }.tmpfs_mib(256), 128);
    assert_eq!(default_upper_size_mib(1), 1);
    assert_eq!(Upper::Disk { size_mib: 64 }.disk_mib(), Some(64));
    assert_eq!(Upper::default().disk_mib(), None);
    let keys = [
        Upper::default().key(),
        Upper::Tmpfs { size_mib: Some(64) }.key(),
        Upper::Disk { size_mib: 64 }.key(),
    ];
    assert_eq!(keys, ["tmpfs", "tmpfs:64", "disk:64"]);
}

#[test]
fn layers_must_be_aligned_dax_erofs_images() {
    let dir = tempfile::tempdir().unwrap();
    let good = layer(dir.path());
    let info = check_layer(&good).unwrap();
    assert_eq!(info.len % (2 << 20), 0);
    check_layers(
        &[good.display().to_string(), "tiny".into()],
        &["tiny", "base"],
    )
    .unwrap();

    // Missing.
    let e = check_layer(&dir.path().join("nope.img"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope.img") && e.contains("cannot open"), "{e}");
    // Misaligned: the pmem check says how to fix it.
    let short = dir.path().join("short.img");
    std::fs::copy(&good, &short).unwrap();
    let f = OpenOptions::new().write(true).open(&short).unwrap();
    f.set_len(info.len - 4096).unwrap();
    let e = check_layer(&short).unwrap_err().to_string();
    assert!(
        e.contains("not a multiple of") && e.contains("shoal image build"),
        "{e}"
    );
    // Aligned but not erofs.
    let zeros = dir.path().join("zeros.img");
    File::create(&zeros).unwrap().set_len(2 << 20).unwrap();
    let e = check_layer(&zeros).unwrap_err().to_string();
    assert!(e.contains("not an erofs image"), "{e}");
    // A directory.
    let e = check_layer(dir.path()).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");

    let imgs = ["tiny", "base"];
    let e = check_layers(&["kit.img".into()], &imgs)
        .unwrap_err()
        .to_string();
    assert!(e.contains("absolute path"), "{e}");
    let many: Vec<String> = (0..=MAX_LAYERS).map(|_| "tiny".into()).collect();
    let e = check_layers(&many, &imgs).unwrap_err().to_string();
    assert!(e.contains("at most 8"), "{e}");
    let e = check_layers(&[zeros.display().to_string()], &imgs)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not an erofs image"), "{e}");
}

#[test]
fn file_identity_changes_when_a_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a");
    std::fs::write(&p, "one").unwrap();
    let a = file_identity(&p);
    assert_eq!(a, file_identity(&p));
    let tmp = dir.path().join("b");
    std::fs::write(&tmp, "two").unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    assert_ne!(a, file_identity(&p));
}

#[test]
fn scratch_disks_are_sparse_ext4_and_clones_are_independent() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join(SCRATCH_DISK);
    format_scratch(&disk, 64).unwrap();
    let m = std::fs::metadata(&disk).unwrap();
    assert_eq!(m.len(), 64 << 20);
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    assert!(m.blocks() * 512 < 8 << 20, "sparse: {} blocks", m.blocks());
    let out = Command::new("dumpe2fs")
        .arg("-h")
        .arg(&disk)
        .output()
        .unwrap();
    let txt = String::from_utf8_lossy(&out.stdout);
    assert!(txt.contains("shoal-upper"), "{txt}");
    assert!(!txt.contains("has_journal"), "{txt}");
    assert_eq!(scratch_disk(dir.path()), Some(disk.clone()));
    // Not over an existing file, nor of a silly size.
    assert!(matches!(format_scratch(&disk, 64), Err(LayerError::Io(..))));
    let small = dir.path().join("small");
    assert!(matches!(
        format_scratch(&small, 1),
        Err(LayerError::UpperDisk(1))
    ));
    assert!(!small.exists());

    // Data written into the source shows in a clone, which keeps its holes
    // and then changes on its own.
    {
        let mut f = OpenOptions::new().write(true).open(&disk).unwrap();
        f.seek(SeekFrom::Start(40 << 20)).unwrap();
        f.write_all(&[0xab; 8192]).unwrap();
    }
    let clone = dir.path().join("clone.ext4");
    clone_file(&disk, &clone).unwrap();
    let (a, b) = (
        std::fs::read(&disk).unwrap(),
        std::fs::read(&clone).unwrap(),
    );
    assert!(a == b, "clone differs from its source");
    let cm = std::fs::metadata(&clone).unwrap();
    assert!(cm.blocks() * 512 < 8 << 20, "clone sparse: {}", cm.blocks());
    assert_eq!(cm.permissions().mode() & 0o777, 0o600);
    {
        let mut f = OpenOptions::new().write(true).open(&clone).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(b"clone only").unwrap();
    }
    assert!(std::fs::read(&disk).unwrap() == a, "source unchanged");
    // Never over an existing file; a failed clone leaves nothing.
    assert!(clone_file(&disk, &clone).is_err());
    let missing = dir.path().join("missing");
    assert!(clone_file(&missing, &dir.path().join("c2")).is_err());
    assert!(!dir.path().join("c2").exists());
}
