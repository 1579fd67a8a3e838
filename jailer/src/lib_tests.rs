use super::*;

fn spec() -> JailSpec {
    JailSpec {
        id: "sb-1".into(),
        uid: 0x5300_0001,
        gid: 0x5300_0001,
        extra_gids: vec![0x5300_0000],
        exec: "/opt/shoal/shoal-vmm".into(),
        args: vec!["--restore".into(), "/s/templates/t".into()],
        ro: vec!["/opt/shoal/shoal-vmm".into(), "/s/templates/t".into()],
        rw: vec!["/s/sandboxes/sb-1".into()],
        kvm: true,
        keep_fds: vec![3],
        hold_fds: vec![12],
        env: vec![("RUST_LOG".into(), "info=x".into())],
        netns: Some("/run/netns/n1".into()),
        cgroup: Some(CgroupSpec {
            memory_bytes: Some(192 << 20),
            pids_max: Some(64),
            cpu_weight: Some(100),
        }),
        cgroup_dirs: vec![],
        rlimits: Rlimits {
            nofile: 2048,
            memlock: 0,
            nproc: Some(128),
        },
        pid_file: Some("/s/sandboxes/sb-1/vmm.pid".into()),
    }
}

fn args(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

#[test]
fn a_spec_round_trips_through_its_arguments() {
    let s = spec();
    let a = s.to_args();
    let dd = a.iter().position(|x| x == "--").unwrap();
    assert_eq!(a[dd + 1], "/opt/shoal/shoal-vmm");
    assert_eq!(
        &a[dd + 2..],
        &s.args[..],
        "the VMM's arguments follow unchanged"
    );
    assert_eq!(JailSpec::parse(a).unwrap(), s);
    // Without optional parts.
    let mut m = spec();
    m.netns = None;
    m.cgroup = None;
    m.pid_file = None;
    m.rlimits = Rlimits::default();
    m.kvm = false;
    m.env.clear();
    assert_eq!(JailSpec::parse(m.to_args()).unwrap(), m);
    // A cgroup with no limits is still a cgroup of its own.
    m.cgroup = Some(CgroupSpec::default());
    assert_eq!(JailSpec::parse(m.to_args()).unwrap(), m);
    // Or one the starter made.
    m.cgroup = None;
    m.cgroup_dirs = vec![
        "/sys/fs/cgroup/memory/shoal/sb-1".into(),
        "/sys/fs/cgroup/pids/shoal/sb-1".into(),
    ];
    assert_eq!(JailSpec::parse(m.to_args()).unwrap(), m);
}

#[test]
fn bad_specs_are_refused_with_what_is_wrong() {
    let base = |extra: &[&str]| {
        let mut v = args(&["--id", "a", "--uid", "7", "--gid", "7", "--ro", "/bin"]);
        v.extend(args(extra));
        v
    };
    let e = |extra: &[&str]| JailSpec::parse(base(extra)).unwrap_err().to_string();
    assert!(JailSpec::parse(base(&["--", "/bin/true"])).is_ok());
    assert!(e(&["--", "/usr/bin/true"]).contains("not inside any bind"));
    assert!(e(&["--bogus", "1", "--", "/bin/true"]).contains("unknown jailer option"));
    assert!(e(&["--ro", "/bin/sub", "--", "/bin/true"]).contains("overlap"));
    assert!(e(&["--rw", "relative", "--", "/bin/true"]).contains("absolute"));
    assert!(e(&["--rw", "/a/../etc", "--", "/bin/true"]).contains("normalized"));
    assert!(e(&["--rw", "/a/", "--", "/bin/true"]).contains("normalized"));
    assert!(e(&["--rw", "/", "--", "/bin/true"]).contains("whole root"));
    assert!(e(&["--keep-fd", "2", "--", "/bin/true"]).contains("0-2"));
    assert!(e(&["--keep-fd", "3", "--hold-fd", "3", "--", "/bin/true"]).contains("twice"));
    assert!(e(&["--env", "A", "--", "/bin/true"]).contains("KEY=VALUE"));
    assert!(e(&["--env", "1A=b", "--", "/bin/true"]).contains("KEY=VALUE"));
    assert!(e(&["--memory-bytes", "5", "--", "/bin/true"]).contains("before --cgroup"));
    assert!(e(&["--cgroup", "--cpu-weight", "0", "--", "/bin/true"]).contains("1..=10000"));
    assert!(e(&["--nofile", "x", "--", "/bin/true"]).contains("not a number"));
    assert!(e(&["--cgroup-dir", "/tmp/x/y/z", "--", "/bin/true"]).contains("below /sys/fs/cgroup"));
    assert!(
        e(&["--cgroup-dir", "/sys/fs/cgroup/memory", "--", "/bin/true"])
            .contains("below /sys/fs/cgroup")
    );
    assert!(e(&[
        "--cgroup",
        "--cgroup-dir",
        "/sys/fs/cgroup/memory/shoal/a",
        "--",
        "/bin/true"
    ])
    .contains("not with --cgroup"));
    assert!(e(&[]).contains("PROGRAM"));
    assert!(e(&["--uid"]).contains("needs a value"));
    let root = args(&[
        "--id",
        "a",
        "--uid",
        "0",
        "--gid",
        "7",
        "--ro",
        "/bin",
        "--",
        "/bin/true",
    ]);
    assert!(JailSpec::parse(root)
        .unwrap_err()
        .to_string()
        .contains("root"));
    let gid0 = args(&[
        "--id",
        "a",
        "--uid",
        "7",
        "--gid",
        "7",
        "--extra-gid",
        "0",
        "--ro",
        "/bin",
        "--",
        "/bin/true",
    ]);
    assert!(JailSpec::parse(gid0).is_err());
    for id in ["", ".x", "a/b", "a b", &"x".repeat(65)] {
        let v = args(&[
            "--id",
            id,
            "--uid",
            "7",
            "--gid",
            "7",
            "--ro",
            "/bin",
            "--",
            "/bin/true",
        ]);
        assert!(JailSpec::parse(v).is_err(), "id {id:?}");
    }
    let no_uid = args(&["--id", "a", "--gid", "7", "--ro", "/bin", "--", "/bin/true"]);
    assert_eq!(
        JailSpec::parse(no_uid).unwrap_err(),
        SpecError::Missing("--uid")
    );
}
