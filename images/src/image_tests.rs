use super::*;
use std::os::unix::fs::PermissionsExt;

const MIB: u64 = 1 << 20;

/// A small root tree: a multi-block file with a partial last block, a tiny
/// file, an empty file, a subdirectory, a relative and an absolute symlink
/// (`sbin -> /usr/sbin`, as on merged-/usr systems).
fn tree(root: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let files = vec![
        (
            "data/big.bin",
            (0..(3 * 4096 + 123u32))
                .map(|i| (i * 7 % 256).to_le_bytes()[0])
                .collect(),
        ),
        ("etc/hostname", b"shoal-test\n".to_vec()),
        ("etc/empty", Vec::new()),
    ];
    for (p, d) in &files {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, d).unwrap();
    }
    std::fs::create_dir_all(root.join("usr/sbin")).unwrap();
    std::os::unix::fs::symlink("/usr/sbin", root.join("sbin")).unwrap();
    std::os::unix::fs::symlink("hostname", root.join("etc/name")).unwrap();
    files
}

fn fake_agent(dir: &Path) -> PathBuf {
    let p = dir.join("fake-agent");
    // Not an ELF file: `strip` fails on it, which the build ignores.
    std::fs::write(&p, b"#!/bin/sh\necho agent\n").unwrap();
    p
}

fn opts(agent: &Path) -> BuildOptions {
    BuildOptions {
        agent: AgentSource::Path(agent.to_path_buf()),
    }
}

/// Extracts the image with fsck.erofs (which also checks it).
fn extract(img: &Path, to: &Path) {
    let st = Command::new("fsck.erofs")
        .arg(format!("--extract={}", to.display()))
        .arg(img)
        .stdout(Stdio::null())
        .status()
        .expect("fsck.erofs (erofs-utils) is installed");
    assert!(st.success(), "fsck.erofs rejected {}", img.display());
}

/// erofs inode layout of `path` in `img` (dump.erofs): 0 = flat plain,
/// the only one Linux 6.1 maps with DAX; 2 = flat inline (tail-packed).
fn layout(img: &Path, path: &str) -> u32 {
    let out = Command::new("dump.erofs")
        .arg(format!("--path={path}"))
        .arg(img)
        .output()
        .expect("dump.erofs");
    let s = String::from_utf8_lossy(&out.stdout);
    s.split("Layout:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no layout for {path}: {s}"))
}

fn check_built(info: &ImageInfo, out: &Path, files: &[(&str, Vec<u8>)], agent: &Path) {
    assert_eq!(info.path, out);
    assert!(info.dax && info.agent_installed);
    assert_eq!(info.len % (2 * MIB), 0, "padded to 2 MiB");
    assert_eq!(std::fs::metadata(out).unwrap().len(), info.len);
    assert!(info.fs_bytes <= info.len && info.fs_bytes > 0);
    // What the VMM checks before mapping it.
    let checked = pmem::check_image(out).unwrap();
    assert_eq!(checked.dax_capable(), Some(true));
    assert_eq!(checked.filesystem.unwrap().kind, pmem::FsKind::Erofs);

    let x = tempfile::tempdir().unwrap();
    let root = x.path().join("root");
    extract(out, &root);
    for (p, d) in files {
        assert_eq!(&std::fs::read(root.join(p)).unwrap(), d, "{p}");
        assert_eq!(layout(out, &format!("/{p}")), 0, "{p} is flat plain (DAX)");
    }
    assert_eq!(
        std::fs::read_link(root.join("etc/name")).unwrap(),
        Path::new("hostname")
    );
    // The agent went through the absolute `sbin` symlink into usr/sbin,
    // inside the image, not the build host's /usr/sbin.
    assert_eq!(
        std::fs::read_link(root.join("sbin")).unwrap(),
        Path::new("/usr/sbin")
    );
    let a = root.join("usr/sbin/shoal-agent");
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(agent).unwrap());
    assert_eq!(
        std::fs::metadata(&a).unwrap().permissions().mode() & 0o777,
        0o755
    );
    for d in ["dev", "proc", "sys", "tmp", "run"] {
        assert!(root.join(d).is_dir(), "mount point /{d}");
    }
    assert_eq!(
        std::fs::metadata(root.join("tmp"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o1777
    );
}

#[test]
fn builds_a_dax_ready_image_from_a_directory() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    let files = tree(&src);
    let agent = fake_agent(d.path());
    let out = d.path().join("out/dir.erofs");
    let info = build_image_with(ImageSource::Dir(src.clone()), &out, &opts(&agent)).unwrap();
    check_built(&info, &out, &files, &agent);
    // The source is untouched and no staging files are left behind.
    assert!(!src.join("usr/sbin/shoal-agent").exists());
    let left: Vec<_> = std::fs::read_dir(d.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("dir.erofs")]);

    // Rebuilding replaces the image atomically (a new inode).
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(&out).unwrap().ino();
    build_image_with(ImageSource::Dir(src), &out, &opts(&agent)).unwrap();
    assert_ne!(std::fs::metadata(&out).unwrap().ino(), ino);
}

#[test]
fn builds_a_dax_ready_image_from_a_tar() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    let files = tree(&src);
    let tar = d.path().join("root.tar.gz");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&src)
        .arg("-czf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let agent = fake_agent(d.path());
    let out = d.path().join("tar.erofs");
    let info = build_image_with(ImageSource::Tar(tar), &out, &opts(&agent)).unwrap();
    check_built(&info, &out, &files, &agent);
}

#[test]
fn no_agent_and_bad_sources() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    let out = d.path().join("noagent.erofs");
    let o = BuildOptions {
        agent: AgentSource::None,
    };
    let info = build_image_with(ImageSource::Dir(src), &out, &o).unwrap();
    assert!(!info.agent_installed);
    let x = tempfile::tempdir().unwrap();
    extract(&out, &x.path().join("r"));
    assert!(!x.path().join("r/usr/sbin/shoal-agent").exists());

    let e = build_image_with(ImageSource::Dir(d.path().join("nope")), &out, &o).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
    let e = build_image_with(ImageSource::Tar(d.path().join("nope.tar")), &out, &o).unwrap_err();
    assert!(e.to_string().contains("not a file"), "{e}");
    let junk = d.path().join("junk.tar");
    std::fs::write(&junk, b"not a tar archive at all").unwrap();
    let e = build_image_with(ImageSource::Tar(junk), &out, &o).unwrap_err();
    assert!(matches!(e, ImageError::Tool { .. }), "{e}");
    assert!(e.to_string().starts_with("tar failed"), "{e}");
    // The earlier image is still there, intact.
    pmem::check_image(&out).unwrap();
}

#[test]
fn resolve_stays_inside_the_root() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    std::fs::create_dir_all(r.join("usr/sbin")).unwrap();
    std::os::unix::fs::symlink("/usr/sbin", r.join("sbin")).unwrap();
    std::os::unix::fs::symlink("../../../../..", r.join("up")).unwrap();
    std::os::unix::fs::symlink("loop", r.join("loop")).unwrap();
    assert_eq!(resolve_in_root(r, Path::new("sbin")), r.join("usr/sbin"));
    assert_eq!(resolve_in_root(r, Path::new("up/etc")), r.join("etc"));
    assert_eq!(resolve_in_root(r, Path::new("../x")), r.join("x"));
    assert!(resolve_in_root(r, Path::new("loop")).starts_with(r));
}

/// A tar archive at `path` crafted entry by entry: (name, kind, mode,
/// data or link target), kind one of "file", "dir", "link", "chr".
fn crafted_tar(path: &Path, entries: &[(&str, &str, u32, &str)]) {
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    for &(name, kind, mode, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        match kind {
            "file" => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                h.set_cksum();
                b.append_data(&mut h, name, data.as_bytes()).unwrap();
            }
            "dir" => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                h.set_cksum();
                b.append_data(&mut h, name, &[][..]).unwrap();
            }
            "link" => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, name, data).unwrap();
            }
            "chr" => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_size(0);
                h.set_device_major(8).unwrap();
                h.set_device_minor(0).unwrap();
                h.set_cksum();
                b.append_data(&mut h, name, &[][..]).unwrap();
            }
            k => panic!("kind {k}"),
        }
    }
    b.finish().unwrap();
}

#[test]
fn a_dev_link_in_a_tar_cannot_steer_the_console_node_out_of_the_root() {
    let d = tempfile::tempdir().unwrap();
    let outside = d.path().join("host-etc");
    std::fs::create_dir_all(&outside).unwrap();
    let agent = fake_agent(d.path());
    let targets = [
        outside.display().to_string(),
        // Relative: up and out of the staging directory.
        format!("../../../..{}", outside.display()),
    ];
    for (i, target) in targets.iter().enumerate() {
        let tar = d.path().join(format!("evil{i}.tar"));
        crafted_tar(
            &tar,
            &[
                ("etc/hostname", "file", 0o644, "x\n"),
                ("dev", "link", 0o777, target),
            ],
        );
        let out = d.path().join(format!("evil{i}.erofs"));
        let r = build_image_with(ImageSource::Tar(tar), &out, &opts(&agent));
        assert!(
            std::fs::read_dir(&outside).unwrap().next().is_none(),
            "{target}: something was created outside the root: {:?}",
            std::fs::read_dir(&outside).unwrap().collect::<Vec<_>>()
        );
        let e = r.expect_err("a /dev that is a link is refused").to_string();
        assert!(e.contains("/dev") && e.contains("symbolic link"), "{e}");
    }
    // A link where the agent goes (sbin -> a directory outside, by a
    // chain of links): the agent is not written outside either.
    let tar = d.path().join("sbin.tar");
    let hop = outside.display().to_string();
    crafted_tar(
        &tar,
        &[
            ("a", "link", 0o777, "b"),
            ("b", "link", 0o777, &hop),
            ("sbin", "link", 0o777, "/a"),
        ],
    );
    let out = d.path().join("sbin.erofs");
    let _ = build_image_with(ImageSource::Tar(tar), &out, &opts(&agent));
    assert!(
        std::fs::read_dir(&outside).unwrap().next().is_none(),
        "the agent was written outside the root"
    );
}

#[test]
fn setuid_files_and_device_nodes_keep_their_modes_but_stage_unreadable_to_others() {
    let d = tempfile::tempdir().unwrap();
    // The staging directory (where the tar is unpacked) is ours alone.
    let stage = Stage::new(d.path(), &d.path().join("x.erofs")).unwrap();
    let mode = std::fs::metadata(&stage.dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "staging directory mode {mode:o}");
    drop(stage);
    let tar = d.path().join("suid.tar");
    crafted_tar(
        &tar,
        &[
            ("bin", "dir", 0o755, ""),
            ("bin/su", "file", 0o4755, "#!/bin/sh\n"),
            ("bin/wall", "file", 0o2755, "#!/bin/sh\n"),
            ("dev", "dir", 0o755, ""),
            ("dev/sda", "chr", 0o666, ""),
        ],
    );
    let out = d.path().join("suid.erofs");
    let agent = fake_agent(d.path());
    build_image_with(ImageSource::Tar(tar), &out, &opts(&agent)).unwrap();
    // Extracted with the modes as they are in the image (a chown after
    // the chmod, fsck.erofs's default as root, would clear the set-id
    // bits).
    let x = d.path().join("x");
    let st = Command::new("fsck.erofs")
        .arg(format!("--extract={}", x.display()))
        .args(["--preserve-perms", "--no-preserve-owner"])
        .arg(&out)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let meta = |p: &str| std::fs::symlink_metadata(x.join(p)).unwrap();
    let m = |p: &str| meta(p).permissions().mode();
    assert_eq!(m("bin/su") & 0o7777, 0o4755);
    assert_eq!(m("bin/wall") & 0o7777, 0o2755);
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    assert!(meta("dev/sda").file_type().is_char_device());
    assert_eq!(
        (m("dev/sda") & 0o7777, meta("dev/sda").rdev()),
        (0o666, libc::makedev(8, 0))
    );
    assert!(meta("dev/console").file_type().is_char_device());
    assert_eq!(m("dev/console") & 0o7777, 0o600);
}
