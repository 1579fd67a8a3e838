use super::*;
use crate::vmm_process::VmmProcess;
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
fn a_jailed_command_is_the_jailer_with_the_vmm_arguments_unchanged() {
    need_root();
    let tmp = tempfile::tempdir().unwrap();
    let vmm = Path::new("/bin/ls");
    let cfg = JailConfig::new(
        Path::new("/opt/shoal-jailer"),
        vmm,
        &tmp.path().join("uids"),
    )
    .unwrap();
    assert!(cfg
        .base_ro
        .iter()
        .any(|p| p.to_string_lossy().contains("ld-linux")));
    let sb = tmp.path().join("sandboxes/abc");
    std::fs::create_dir_all(&sb).unwrap();
    let tpl = tmp.path().join("templates/t");
    let j = cfg
        .jail_for(&sb, std::slice::from_ref(&tpl), 128 << 20)
        .unwrap();
    let uid = j.spec.uid;
    assert!(uids::slot_of(uid).is_some());
    assert_eq!(mode(&sb).0, uid, "the sandbox dir is the jail user's");
    let canon = std::fs::canonicalize(vmm).unwrap();
    let plain = VmmProcess::restore(&canon, &tpl)
        .ready_pipe(true)
        .keep_fd(7);
    let jailed = plain.clone().jail(j.clone());
    assert_eq!(jailed.kept_fds(), vec![3, 7]);
    let pc = plain.command().unwrap();
    let jc = jailed.command().unwrap();
    assert_eq!(jc.get_program(), "/opt/shoal-jailer");
    let ja: Vec<_> = jc.get_args().collect();
    let dd = ja.iter().position(|a| *a == "--").unwrap();
    assert_eq!(ja[dd + 1], canon.as_os_str());
    let pa: Vec<_> = pc.get_args().collect();
    assert_eq!(
        &ja[dd + 2..],
        &pa[..],
        "the VMM's arguments are the same jailed"
    );
    let spec = JailSpec::parse(ja.iter().map(|a| a.to_os_string())).unwrap();
    assert_eq!(spec.keep_fds, vec![3, 7]);
    assert_eq!(spec.rw, vec![sb.clone()]);
    assert!(spec.ro.contains(&tpl) && spec.ro.contains(&canon));
    assert_eq!(spec.hold_fds, vec![j.lease.as_ref().unwrap().fd()]);
    assert_eq!(
        spec.cgroup.unwrap().memory_bytes,
        Some((128 << 20) + OVERHEAD_BYTES)
    );
    assert_eq!(spec.pid_file, Some(sb.join(PID_FILE)));
    assert!(spec
        .env
        .iter()
        .all(|(k, _)| k == "RUST_LOG" || k == "RUST_BACKTRACE"));
    // Two jails at once never share a uid.
    let j2 = cfg.jail_for(&sb, &[], 0).unwrap();
    assert_ne!(j2.spec.uid, uid);
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
