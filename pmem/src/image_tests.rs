use super::*;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

const MIB: u64 = 1 << 20;

fn file_with(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    f
}

fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// An image of `len` bytes whose first 4 KiB hold `sb` at offset 1024.
fn with_superblock(len: u64, sb: &[(usize, &[u8])]) -> tempfile::NamedTempFile {
    let mut b = vec![0u8; usize::try_from(len).unwrap()];
    for &(off, bytes) in sb {
        b[1024 + off..1024 + off + bytes.len()].copy_from_slice(bytes);
    }
    file_with(&b)
}

fn erofs_sb(blkszbits: u8, blocks: u32) -> Vec<(usize, Vec<u8>)> {
    vec![
        (0, 0xe0f5_e1e2u32.to_le_bytes().to_vec()),
        (12, vec![blkszbits]),
        (36, blocks.to_le_bytes().to_vec()),
    ]
}

fn sb_refs(v: &[(usize, Vec<u8>)]) -> Vec<(usize, &[u8])> {
    v.iter().map(|(o, b)| (*o, b.as_slice())).collect()
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("-V").output().is_ok()
}

#[test]
fn good_image_passes() {
    let f = file_with(&pattern(2 * MIB));
    let info = check_image(f.path()).unwrap();
    assert_eq!(info.len, 2 * MIB);
    assert_eq!(info.path, f.path());
    assert_eq!(info.filesystem, None);
    assert_eq!(info.dax_capable(), None);
}

#[test]
fn empty_misaligned_missing_and_non_files_refused_clearly() {
    let f = file_with(&[]);
    let e = check_image(f.path()).unwrap_err();
    assert!(matches!(e, ImageError::Empty(_)));
    let msg = e.to_string();
    assert!(msg.contains(&f.path().display().to_string()), "{msg}");
    assert!(msg.contains("empty"), "{msg}");

    let f = file_with(&pattern(3 * MIB));
    let e = check_image(f.path()).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, ImageError::Misaligned { len, align, padded, .. }
            if len == 3 * MIB && align == IMAGE_ALIGN && padded == 4 * MIB)
    );
    for want in [
        f.path().display().to_string(),
        (3 * MIB).to_string(),
        "2097152".into(),
        "2 MiB".into(),
        "shoal image build".into(),
    ] {
        assert!(msg.contains(&want), "{want:?} not in {msg}");
    }

    // A few bytes short of 2 MiB: "truncated" in the plain sense.
    let f = file_with(&pattern(2 * MIB - 512));
    assert!(matches!(
        check_image(f.path()),
        Err(ImageError::Misaligned { .. })
    ));

    let e = check_image(Path::new("/nonexistent/dir/root.erofs")).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("/nonexistent/dir/root.erofs"), "{msg}");
    assert!(msg.contains("cannot open"), "{msg}");

    let d = tempfile::tempdir().unwrap();
    let e = check_image(d.path()).unwrap_err();
    assert!(matches!(e, ImageError::NotAFile(_)), "{e}");
}

#[test]
fn erofs_superblock_detected_and_truncation_refused() {
    let sb = erofs_sb(12, 512); // 512 x 4 KiB = 2 MiB
    let f = with_superblock(2 * MIB, &sb_refs(&sb));
    let info = check_image(f.path()).unwrap();
    assert_eq!(
        info.filesystem,
        Some(FsInfo {
            kind: FsKind::Erofs,
            block_size: 4096,
            fs_bytes: 2 * MIB
        })
    );
    assert_eq!(info.dax_capable(), Some(true));

    let sb = erofs_sb(12, 513);
    let f = with_superblock(2 * MIB, &sb_refs(&sb));
    let e = check_image(f.path()).unwrap_err();
    assert!(
        matches!(e, ImageError::Truncated { fs: FsKind::Erofs, fs_bytes, len, .. }
            if fs_bytes == 513 * 4096 && len == 2 * MIB)
    );
    assert!(e.to_string().contains("truncated"), "{e}");

    // 512-byte blocks: recognised, not DAX-capable.
    let sb = erofs_sb(9, 8);
    let f = with_superblock(2 * MIB, &sb_refs(&sb));
    assert_eq!(check_image(f.path()).unwrap().dax_capable(), Some(false));

    // Nonsense block size: not recognised, not an error.
    let sb = erofs_sb(40, 8);
    let f = with_superblock(2 * MIB, &sb_refs(&sb));
    assert_eq!(check_image(f.path()).unwrap().filesystem, None);
}

#[test]
fn ext4_superblock_detected() {
    let magic = 0xef53u16.to_le_bytes();
    // 1 KiB blocks (log 0), 2048 blocks = 2 MiB.
    let blocks = 2048u32.to_le_bytes();
    let f = with_superblock(2 * MIB, &[(4, &blocks), (24, &[0, 0, 0, 0]), (56, &magic)]);
    let info = check_image(f.path()).unwrap();
    assert_eq!(
        info.filesystem,
        Some(FsInfo {
            kind: FsKind::Ext4,
            block_size: 1024,
            fs_bytes: 2 * MIB
        })
    );
    assert_eq!(info.dax_capable(), Some(false));
    // 64-bit block count with a high word: far beyond the file.
    let f = with_superblock(
        2 * MIB,
        &[
            (4, &1u32.to_le_bytes()),
            (24, &2u32.to_le_bytes()),
            (56, &magic),
            (96, &0x80u32.to_le_bytes()),
            (0x150, &1u32.to_le_bytes()),
        ],
    );
    assert!(matches!(
        check_image(f.path()),
        Err(ImageError::Truncated {
            fs: FsKind::Ext4,
            ..
        })
    ));
}

#[test]
fn real_erofs_image_checked_padded_and_truncation_caught() {
    if !have("mkfs.erofs") {
        eprintln!("mkfs.erofs not installed; skipping");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("hello"), b"hello from pmem\n").unwrap();
    std::fs::write(root.join("big"), pattern(3 * MIB)).unwrap();
    let img = d.path().join("root.erofs");
    let ok = Command::new("mkfs.erofs")
        .arg("--quiet")
        .arg(&img)
        .arg(&root)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let raw = std::fs::metadata(&img).unwrap().len();
    assert!(matches!(
        check_image(&img),
        Err(ImageError::Misaligned { .. })
    ));
    let info = pad_image(&img, IMAGE_ALIGN).unwrap();
    assert_eq!(info.len, raw.next_multiple_of(IMAGE_ALIGN));
    let fs = info.filesystem.unwrap();
    assert_eq!(fs.kind, FsKind::Erofs);
    assert_eq!(fs.block_size, 4096);
    assert!(
        fs.fs_bytes <= raw && fs.fs_bytes > 3 * MIB,
        "{fs:?} raw {raw}"
    );
    assert_eq!(info.dax_capable(), Some(true));
    // Cut it to 2 MiB: aligned, but the file system no longer fits.
    let f = OpenOptions::new().write(true).open(&img).unwrap();
    f.set_len(2 * MIB).unwrap();
    assert!(matches!(
        check_image(&img),
        Err(ImageError::Truncated {
            fs: FsKind::Erofs,
            ..
        })
    ));
}

#[test]
fn real_ext4_image_block_size() {
    if !have("mkfs.ext4") {
        eprintln!("mkfs.ext4 not installed; skipping");
        return;
    }
    for (bs, dax) in [(4096u32, true), (1024, false)] {
        let f = file_with(&vec![0u8; usize::try_from(8 * MIB).unwrap()]);
        let ok = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", &bs.to_string()])
            .arg(f.path())
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let info = check_image(f.path()).unwrap();
        let fs = info.filesystem.unwrap();
        assert_eq!((fs.kind, fs.block_size), (FsKind::Ext4, bs));
        assert_eq!(fs.fs_bytes, 8 * MIB);
        assert_eq!(info.dax_capable(), Some(dax));
    }
}

#[test]
fn pad_in_place() {
    let content = pattern(3 * MIB + 17);
    let f = file_with(&content);
    let ino = std::fs::metadata(f.path()).unwrap().ino();
    let info = pad_image(f.path(), IMAGE_ALIGN).unwrap();
    assert_eq!(info.len, 4 * MIB);
    let got = std::fs::read(f.path()).unwrap();
    assert_eq!(&got[..content.len()], &content[..]);
    assert!(got[content.len()..].iter().all(|&b| b == 0));
    assert_eq!(std::fs::metadata(f.path()).unwrap().ino(), ino);
    // Already aligned: untouched.
    let before = std::fs::metadata(f.path()).unwrap().modified().unwrap();
    pad_image(f.path(), IMAGE_ALIGN).unwrap();
    assert_eq!(
        std::fs::metadata(f.path()).unwrap().modified().unwrap(),
        before
    );
    // Bad alignments and empty files.
    for a in [0, 3, 1000, 4097] {
        assert!(matches!(
            pad_image(f.path(), a),
            Err(ImageError::BadAlignment(_))
        ));
    }
    let e = file_with(&[]);
    assert!(matches!(
        pad_image(e.path(), IMAGE_ALIGN),
        Err(ImageError::Empty(_))
    ));
}

#[test]
fn pad_to_new_file_and_over_itself_atomically() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src.img");
    let content = pattern(MIB + 3);
    std::fs::write(&src, &content).unwrap();
    let dst = d.path().join("dst.img");
    let info = pad_image_to(&src, &dst, IMAGE_ALIGN).unwrap();
    assert_eq!(info.len, 2 * MIB);
    assert_eq!(info.path, dst);
    assert_eq!(std::fs::read(&src).unwrap(), content, "source untouched");
    let got = std::fs::read(&dst).unwrap();
    assert_eq!(&got[..content.len()], &content[..]);
    assert!(got[content.len()..].iter().all(|&b| b == 0));

    // Over itself: a new inode replaces the old one; an open handle (a
    // running VM) still sees the old file.
    let old = File::open(&src).unwrap();
    let old_ino = old.metadata().unwrap().ino();
    pad_image_to(&src, &src, IMAGE_ALIGN).unwrap();
    let new_meta = std::fs::metadata(&src).unwrap();
    assert_ne!(new_meta.ino(), old_ino);
    assert_eq!(new_meta.len(), 2 * MIB);
    assert_eq!(old.metadata().unwrap().len(), content.len() as u64);

    // No temporary files left behind.
    let names: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    // A missing source fails without creating anything.
    let e = pad_image_to(&d.path().join("nope"), &dst, IMAGE_ALIGN).unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
}

#[test]
fn superblock_parser_never_panics_on_short_input() {
    for n in [0, 1, 1024, 1030, 1060, 1100, 1500, 4096] {
        let mut b = vec![0xffu8; n];
        if n >= 1028 {
            b[1024..1028].copy_from_slice(&0xe0f5_e1e2u32.to_le_bytes());
        }
        let _ = parse_superblock(&b);
        if n >= 1082 {
            b[1080..1082].copy_from_slice(&0xef53u16.to_le_bytes());
            b[1024..1028].fill(0);
            let _ = parse_superblock(&b);
        }
    }
}
