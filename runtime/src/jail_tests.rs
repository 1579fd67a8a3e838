use super::*;
use std::os::unix::fs::MetadataExt;

fn mode(p: &Path) -> (u32, u32, u32) {
    let m = std::fs::metadata(p).unwrap();
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

fn need_root() {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test changes file owners: run the tests as root"
    );
}

#[test]
fn template_files_list_what_is_outside_and_share_makes_them_group_readable() {
    need_root();
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path().join("templates/t.0123456789ab");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(t.join("memory"), "m").unwrap();
    std::fs::set_permissions(t.join("memory"), PermissionsExt::from_mode(0o600)).unwrap();
    // An image pinned from elsewhere: a hard link, its inode shared.
    let installed = tmp.path().join("installed.erofs");
    std::fs::write(&installed, "img").unwrap();
    std::fs::set_permissions(&installed, PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::hard_link(&installed, t.join("root.erofs")).unwrap();
    std::fs::write(t.join("scratch.ext4"), "disk").unwrap();
    let outside = tmp.path().join("other/layer.erofs");
    std::fs::create_dir_all(outside.parent().unwrap()).unwrap();
    std::fs::write(&outside, "l").unwrap();
    // Without a list: the directory alone.
    assert_eq!(template_files(&t), vec![t.clone()]);
    write_files(
        &t,
        &[t.join("root.erofs"), outside.clone(), outside.clone()],
    )
    .unwrap();
    assert_eq!(template_files(&t), vec![t.clone(), outside.clone()]);
    share_template(&t).unwrap();
    assert_eq!(mode(&t), (0, uids::SHARED_GID, 0o750));
    assert_eq!(mode(&t.join("memory")), (0, uids::SHARED_GID, 0o640));
    let img = mode(&t.join("root.erofs"));
    assert_eq!(
        img.2, 0o644,
        "a world-readable image (shared inode) is left alone"
    );
}

#[test]
fn a_sandbox_dir_becomes_its_vmms() {
    need_root();
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("sb");
    std::fs::create_dir_all(d.join("snap-1")).unwrap();
    std::fs::write(d.join("snap-1/memory"), "m").unwrap();
    std::fs::write(tmp.path().join("image"), "i").unwrap();
    std::fs::hard_link(tmp.path().join("image"), d.join("root.erofs")).unwrap();
    let uid = uids::UID_BASE + 77;
    own_dir(&d, uid).unwrap();
    assert_eq!(mode(&d), (uid, uid, 0o700));
    assert_eq!(mode(&d.join("snap-1/memory")).0, uid);
    assert_eq!(
        mode(&d.join("root.erofs")).0,
        0,
        "a shared inode keeps its owner"
    );
}

#[test]
fn the_vmm_pid_is_believed_only_for_a_child_of_the_jailer() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let child = crate::vm::pid_of(&c);
    let me = i32::try_from(std::process::id()).unwrap();
    std::fs::write(tmp.path().join(PID_FILE), format!("{child}\n")).unwrap();
    assert_eq!(vmm_pid(me, tmp.path()), Some(child));
    assert_eq!(
        vmm_pid(child, tmp.path()),
        None,
        "not the named jailer's child"
    );
    std::fs::write(tmp.path().join(PID_FILE), format!("{me}\n")).unwrap();
    assert_eq!(vmm_pid(me, tmp.path()), None);
    c.kill().unwrap();
    c.wait().unwrap();
}
