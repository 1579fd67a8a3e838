//! The daemon's VMMs run jailed (shoald as root): checked from the host on
//! a real sandbox through its whole lifecycle — its uid and groups, no
//! capabilities, no_new_privs, its own namespaces, only the bound files,
//! only its own descriptors, a clean environment, its cgroup's limits
//! (removed with it), and the modes of the state it leaves on disk; and a
//! sandbox served by the VMM stock (a jailed VMM pre-warmed before it was
//! asked for) confined the same way.

#[allow(dead_code)]
mod daemon_harness;

use daemon_harness::{wait_for, Daemon};
use shoal_client::api::{CreateSandbox, SandboxState, SnapshotRequest};
use shoal_jailer::{cgroup, uids, CgroupSpec};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

fn status(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap()
}

fn field(pid: i32, key: &str) -> String {
    status(pid)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key}"))
        .trim()
        .to_string()
}

fn mode(p: &Path) -> (u32, u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

fn vmm_of(d: &Daemon, id: &str) -> (i32, i32) {
    let sb = d.get(id).unwrap();
    let jailer = sb.pid.expect("a running sandbox has a pid");
    let dir = d.dir.join("sandboxes").join(id);
    let vmm = shoal_runtime::jail::vmm_pid(jailer, &dir)
        .unwrap_or_else(|| panic!("no jailed VMM under jailer {jailer}: {}", d.log()));
    (jailer, vmm)
}

fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let spec = CgroupSpec {
        memory_bytes: Some(1),
        pids_max: Some(1),
        cpu_weight: None,
    };
    cgroup::plan_here(id, &spec).unwrap().dirs
}

/// Checks one running jailed VMM; returns its uid.
fn check_jailed(d: &Daemon, id: &str) -> u32 {
    let (jailer, pid) = vmm_of(d, id);
    assert_ne!(
        jailer, pid,
        "the daemon tracks the jailer, the VMM is its child"
    );
    let uid: u32 = field(pid, "Uid")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(uids::slot_of(uid).is_some(), "uid {uid} is a jail uid");
    assert_eq!(field(pid, "Uid"), format!("{uid}\t{uid}\t{uid}\t{uid}"));
    assert_eq!(field(pid, "Gid"), format!("{uid}\t{uid}\t{uid}\t{uid}"));
    assert_eq!(field(pid, "Groups"), uids::SHARED_GID.to_string());
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(pid, cap), "0000000000000000", "{cap}");
    }
    assert_eq!(field(pid, "NoNewPrivs"), "1");
    assert_eq!(field(pid, "Umask"), "0077");
    for ns in ["mnt", "pid", "net", "ipc", "uts"] {
        let mine = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        let its = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        assert_ne!(mine, its, "the VMM has its own {ns} namespace");
    }
    // What it sees: /dev holds kvm and null; every other mount is one of
    // its binds: its sandbox dir rw, the rest ro.
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let mut dev: Vec<String> = std::fs::read_dir(root.join("dev"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    dev.sort();
    assert_eq!(dev, ["kvm", "null"]);
    assert!(!root.join("etc").exists(), "no /etc in the jail");
    let sbdir = d.dir.join("sandboxes").join(id);
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let mut rw = vec![];
    for l in mounts.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        let (point, opts) = (f[4], f[5]);
        if point == "/" || point == "/proc" {
            continue;
        }
        if opts.split(',').any(|o| o == "rw") {
            rw.push(point.to_string());
        } else {
            let outside = Path::new(point).starts_with(&d.dir)
                && !Path::new(point).starts_with(d.dir.join("templates"));
            assert!(
                !outside,
                "only templates of the state dir are bound read-only: {l}"
            );
        }
    }
    assert_eq!(rw, [sbdir.display().to_string()], "{mounts}");
    // Its descriptors name no host file but its own and its template's.
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let t = std::fs::read_link(e.unwrap().path()).unwrap();
        let s = t.to_string_lossy();
        let ok = s.starts_with("anon_inode:")
            || s.starts_with("socket:")
            || s.starts_with("pipe:")
            || s == "/dev/null"
            || t.starts_with(&sbdir)
            || t.starts_with(d.dir.join("templates"));
        assert!(ok, "unexpected descriptor {s}");
    }
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    for kv in env.split(|b| *b == 0).filter(|kv| !kv.is_empty()) {
        let k = String::from_utf8_lossy(kv.split(|b| *b == b'=').next().unwrap()).into_owned();
        assert!(
            k == "RUST_LOG" || k == "RUST_BACKTRACE",
            "environment has {k}"
        );
    }
    // Its cgroup, with limits.
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cg.contains(&format!("/shoal/{id}")), "{cg}");
    let dirs = cgroup_dirs(id);
    let limit = |name: &str| {
        dirs.iter()
            .map(|d| d.join(name))
            .find(|f| f.exists())
            .and_then(|f| std::fs::read_to_string(f).ok())
            .map(|s| s.trim().to_string())
    };
    let mem: u64 = limit("memory.limit_in_bytes")
        .or_else(|| limit("memory.max"))
        .expect("a memory limit")
        .parse()
        .unwrap();
    assert!(
        (128 << 20..=(128 << 20) + (256 << 20)).contains(&mem),
        "memory limit {mem} = guest RAM + images + overhead"
    );
    assert_eq!(limit("pids.max").as_deref(), Some("256"));
    // Its files and sockets are its own.
    assert_eq!(mode(&sbdir), (uid, uid, 0o700));
    for s in ["api.sock", "vsock.sock"] {
        let (u, _, m) = mode(&sbdir.join(s));
        assert_eq!((u, m & 0o077), (uid, 0), "{s} is its owner's only");
    }
    uid
}

fn metric(d: &Daemon, name: &str) -> f64 {
    let m = d.c.metrics().unwrap();
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}"))
}

/// The template's first create made it join the VMM stock (`--vmm-stock
/// 1`, the default): the next create is served by the stocked VMM, started
/// jailed and pre-warmed before it was asked for, which then runs as
/// confined as a cold-restored one, under seccomp, and answers.
fn from_the_stock(d: &Daemon) {
    wait_for("a stocked VMM", 60, || metric(d, "shoal_vmm_stock") >= 1.0);
    let listed: Vec<String> =
        d.c.list(&Default::default())
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
    let stocked: Vec<String> = std::fs::read_dir(d.dir.join("sandboxes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !listed.contains(n))
        .collect();
    assert_eq!(stocked.len(), 1, "one stocked VMM's directory: {stocked:?}");
    let hits = metric(d, "shoal_vmm_stock_hits_total");
    let sb = d.create(CreateSandbox::default());
    assert_eq!(sb.id, stocked[0], "the create took the stocked VMM");
    assert_eq!(metric(d, "shoal_vmm_stock_hits_total"), hits + 1.0);
    let uid = check_jailed(d, &sb.id);
    assert_ne!(uid, 0);
    let (_, vmm) = vmm_of(d, &sb.id);
    let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{vmm}/task"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(tasks.len() >= 3, "main, vCPU, event and control threads");
    for t in tasks {
        let st = std::fs::read_to_string(t.join("status")).unwrap();
        assert!(
            st.lines().any(|l| l == "Seccomp:\t2"),
            "thread {} runs without its filter",
            t.display()
        );
    }
    assert_eq!(d.sh(&sb.id, "echo stocked").stdout, "stocked\n");
    d.kill(&sb.id);
}

#[test]
fn daemon_vmms_run_jailed_through_the_whole_lifecycle() {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "jailing needs a root daemon: run the tests as root"
    );
    let mut d = Daemon::start(&["--no-pools", "--vmm-stock", "1"]);
    assert!(d.log().contains("VMMs run jailed"), "{}", d.log());
    // State: the daemon's alone.
    assert_eq!(mode(&d.dir).2, 0o700);
    assert_eq!(mode(&d.dir.join("state.db")).2, 0o600);
    let sb = d.create(CreateSandbox::default());
    let id = sb.id.clone();
    let uid = check_jailed(&d, &id);
    assert_eq!(d.sh(&id, "echo kept > /root/f; echo hi").stdout, "hi\n");
    from_the_stock(&d);
    // The template its VMM restored from: readable by the jail group only.
    let tpl = std::fs::read_dir(d.dir.join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .unwrap();
    assert_eq!(mode(&tpl), (0, uids::SHARED_GID, 0o750));
    assert_eq!(mode(&tpl.join("memory")), (0, uids::SHARED_GID, 0o640));
    assert_eq!(mode(&tpl.join("state")), (0, uids::SHARED_GID, 0o640));

    // Pause to disk: the snapshot is the sandbox's own (0600); resume.
    let v = d.must("pause", d.c.pause(&id));
    assert_eq!(v.state, SandboxState::Paused);
    let snap = std::fs::read_dir(d.dir.join("sandboxes").join(&id))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("snap-")
        })
        .expect("a pause snapshot");
    assert_eq!(mode(&snap.join("memory")).2, 0o600);
    assert_eq!(mode(&snap.join("memory")).0, uid);
    let v = d.must("resume", d.c.resume(&id));
    assert_eq!(v.state, SandboxState::Running);
    check_jailed(&d, &id);
    assert_eq!(d.sh(&id, "cat /root/f").stdout, "kept\n");

    // Snapshot into a template (written in the sandbox dir, moved by the
    // daemon) and a sandbox from it.
    let req = SnapshotRequest {
        template: Some("jailsnap".into()),
    };
    let t = d.must("snapshot", d.c.snapshot(&id, &req));
    assert_eq!(mode(&t.dir), (0, uids::SHARED_GID, 0o750));
    assert_eq!(mode(&t.dir.join("memory")), (0, uids::SHARED_GID, 0o640));
    let s2 = d.restore("jailsnap");
    let uid2 = check_jailed(&d, &s2.id);
    assert_ne!(uid2, check_jailed(&d, &id), "two live sandboxes, two uids");
    let netns =
        |sb: &str| std::fs::read_link(format!("/proc/{}/ns/net", vmm_of(&d, sb).1)).unwrap();
    assert_ne!(
        netns(&id),
        netns(&s2.id),
        "two live sandboxes, two network namespaces"
    );
    assert_eq!(d.sh(&s2.id, "cat /root/f").stdout, "kept\n");

    // A daemon restart reattaches the jailed VMMs (found by their jailer).
    d.kill9();
    d.spawn();
    assert_eq!(d.state(&id), SandboxState::Running);
    assert_eq!(d.sh(&s2.id, "echo again").stdout, "again\n");
    check_jailed(&d, &s2.id);

    // Removal ends the jailer and the VMM, and removes the cgroup.
    let (jailer, vmm) = vmm_of(&d, &s2.id);
    d.kill(&s2.id);
    wait_for("the jailed VMM to end", 10, || {
        !Path::new(&format!("/proc/{vmm}")).exists()
            && !Path::new(&format!("/proc/{jailer}")).exists()
    });
    wait_for("its cgroup to be removed", 10, || {
        cgroup_dirs(&s2.id).iter().all(|d| !d.exists())
    });
    d.kill(&id);
}
