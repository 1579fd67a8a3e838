use super::*;

/// This development host: cgroup2 mounted with no controllers, v1
/// controllers mounted one per hierarchy; the daemon in a memory cgroup.
const V1_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
const V1_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
";

/// A systemd host on the unified hierarchy.
const V2_MOUNTINFO: &str = "\
25 1 0:22 / / rw - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate
";
const V2_CGROUP: &str = "0::/system.slice/shoald.service\n";

fn limits() -> CgroupSpec {
    CgroupSpec {
        memory_bytes: Some(200 << 20),
        pids_max: Some(64),
        cpu_weight: Some(50),
    }
}

#[test]
fn v1_controllers_each_get_a_cgroup_under_the_daemons_own() {
    let p = plan(V1_MOUNTINFO, V1_CGROUP, "", "sb1", &limits()).unwrap();
    assert_eq!(p.version, Version::V1);
    assert!(p.enable.is_empty());
    let d = |s: &str| PathBuf::from(s);
    assert_eq!(
        p.dirs,
        vec![
            d("/sys/fs/cgroup/memory/process_api/abc/shoal/sb1"),
            d("/sys/fs/cgroup/pids/shoal/sb1"),
            d("/sys/fs/cgroup/cpu/shoal/sb1"),
        ]
    );
    assert_eq!(
        p.limits,
        vec![
            (
                d("/sys/fs/cgroup/memory/process_api/abc/shoal/sb1/memory.limit_in_bytes"),
                (200u64 << 20).to_string()
            ),
            (d("/sys/fs/cgroup/pids/shoal/sb1/pids.max"), "64".into()),
            (d("/sys/fs/cgroup/cpu/shoal/sb1/cpu.shares"), "512".into()),
        ]
    );
    // The empty unified hierarchy is not used even when it is listed.
    let p2 = plan(V1_MOUNTINFO, V1_CGROUP, "hugetlb", "sb1", &limits()).unwrap();
    assert_eq!(p2, p);
}

#[test]
fn v2_puts_the_cgroup_beside_the_daemons_and_enables_controllers() {
    let p = plan(
        V2_MOUNTINFO,
        V2_CGROUP,
        "cpuset cpu io memory pids",
        "sb1",
        &limits(),
    )
    .unwrap();
    assert_eq!(p.version, Version::V2);
    let d = |s: &str| PathBuf::from(s);
    assert_eq!(p.dirs, vec![d("/sys/fs/cgroup/system.slice/shoal/sb1")]);
    assert_eq!(
        p.enable,
        vec![
            (
                d("/sys/fs/cgroup/system.slice/cgroup.subtree_control"),
                "+memory +pids +cpu".into()
            ),
            (
                d("/sys/fs/cgroup/system.slice/shoal/cgroup.subtree_control"),
                "+memory +pids +cpu".into()
            ),
        ]
    );
    let dir = d("/sys/fs/cgroup/system.slice/shoal/sb1");
    assert_eq!(
        p.limits,
        vec![
            (dir.join("memory.max"), (200u64 << 20).to_string()),
            (dir.join("pids.max"), "64".into()),
            (dir.join("cpu.weight"), "50".into()),
        ]
    );
    // A daemon in the root cgroup.
    let p = plan(V2_MOUNTINFO, "0::/\n", "memory pids cpu", "x", &limits()).unwrap();
    assert_eq!(p.dirs, vec![d("/sys/fs/cgroup/shoal/x")]);
    // A limit whose controller is missing is an error, not ignored.
    let e = plan(V2_MOUNTINFO, V2_CGROUP, "memory pids", "x", &limits()).unwrap_err();
    assert!(e.to_string().contains("cpu controller"), "{e}");
}

#[test]
fn a_container_mount_root_is_stripped_and_escapes_are_undone() {
    let mi = "40 31 0:32 /process_api /sys/fs/cgroup/mem\\040ory rw - cgroup cgroup rw,memory\n";
    let spec = CgroupSpec {
        memory_bytes: Some(1),
        ..Default::default()
    };
    let p = plan(mi, "4:memory:/process_api/abc\n", "", "j", &spec).unwrap();
    assert_eq!(
        p.dirs,
        vec![PathBuf::from("/sys/fs/cgroup/mem ory/abc/shoal/j")]
    );
    let e = plan("", "", "", "j", &spec).unwrap_err();
    assert!(e.to_string().contains("memory controller"), "{e}");
}

#[test]
fn weights_map_to_shares() {
    assert_eq!(shares_of_weight(100), 1024);
    assert_eq!(shares_of_weight(1), 10);
    assert_eq!(shares_of_weight(10000), 102400);
    assert_eq!(shares_of_weight(0), 2);
}

/// On this host (root, v1 or v2 controllers): the limits land in the
/// files and the directories go again.
#[test]
fn a_real_cgroup_gets_its_limits_and_is_removed() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test needs root (cgroup directories): run the tests as root");
    }
    let id = format!("test-{}", std::process::id());
    let spec = limits();
    let cg = Cgroup::create(plan_here(&id, &spec).unwrap()).unwrap();
    for (f, v) in &cg.plan().limits {
        let got = std::fs::read_to_string(f).unwrap();
        // v1 rounds memory limits to pages; ours are page multiples.
        assert_eq!(got.trim(), v, "{}", f.display());
    }
    assert!(cg.remove(Duration::from_secs(1)));
    for d in &cg.plan().dirs {
        assert!(!d.exists(), "{} removed", d.display());
    }
}
