//! The jailer binary confining a real program (static busybox stands in
//! for the VMM), checked from the host through /proc: identity,
//! capabilities, namespaces, files, descriptors, environment, limits,
//! cgroup, signals and exit status.

use shoal_jailer::{uids, CgroupSpec, JailSpec, Rlimits};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const BUSYBOX: &str = "/usr/bin/busybox";

fn prereqs() {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the jailer tests need root (namespaces, mounts, setuid): run them as root"
    );
    assert!(
        Path::new(BUSYBOX).is_file(),
        "the jailer tests need a static {BUSYBOX} (apt-get install busybox-static)"
    );
}

fn spec(id: &str, dir: &Path, script: &str) -> JailSpec {
    JailSpec {
        id: id.into(),
        uid: uids::UID_BASE + 4000,
        gid: uids::UID_BASE + 4000,
        extra_gids: vec![uids::SHARED_GID],
        exec: BUSYBOX.into(),
        args: vec!["sh".into(), "-c".into(), script.into()],
        ro: vec![BUSYBOX.into()],
        rw: vec![dir.into()],
        kvm: Path::new("/dev/kvm").exists(),
        keep_fds: vec![],
        hold_fds: vec![],
        env: vec![("RUST_LOG".into(), "debug".into())],
        netns: None,
        cgroup_dirs: vec![],
        cgroup: Some(CgroupSpec {
            memory_bytes: Some(64 << 20),
            pids_max: Some(16),
            cpu_weight: Some(50),
        }),
        rlimits: Rlimits {
            nofile: 256,
            memlock: 0,
            nproc: None,
        },
        pid_file: Some(dir.join("vmm.pid")),
    }
}

fn start(s: &JailSpec, pre: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shoal-jailer"));
    c.args(s.to_args()).env("SECRET", "daemon-only");
    let mut pre = pre;
    // SAFETY: the closures only call async-signal-safe umask/fcntl/dup2.
    // A starter's umask 077 (the runtime's) must not make the jail's
    // directories untraversable for its user.
    unsafe {
        c.pre_exec(move || {
            libc::umask(0o077);
            pre()
        })
    };
    c.spawn().unwrap()
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn inner_pid(dir: &Path) -> i32 {
    wait_for("the pid file", || {
        std::fs::read_to_string(dir.join("vmm.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    })
}

fn status_field(pid: i32, key: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in status"))
        .trim()
        .to_string()
}

fn exited(c: &mut Child) -> std::process::ExitStatus {
    wait_for("the jailer to exit", || c.try_wait().unwrap())
}

#[test]
fn a_jailed_program_has_only_what_the_spec_gives_it() {
    prereqs();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sandbox");
    std::fs::create_dir(&dir).unwrap();
    // As the runtime does: the sandbox directory is the jail user's.
    std::os::unix::fs::chown(
        &dir,
        Some(uids::UID_BASE + 4000),
        Some(uids::UID_BASE + 4000),
    )
    .unwrap();
    std::fs::write(tmp.path().join("secret"), "host file").unwrap();
    let id = format!("jt-{}", std::process::id());
    // It waits to be looked at, then says what it saw.
    let script = format!(
        "while [ ! -e {d}/go ]; do {B} usleep 10000; done; {B} ls / > {d}/root; echo hi > {d}/written; exit 7",
        d = dir.display(),
        B = BUSYBOX
    );
    let mut s = spec(&id, &dir, &script);
    // A descriptor passed on purpose (5), one held by the supervisor only
    // (a uid lease), and a stray one (inherited, not named).
    let keep = std::fs::File::open("/dev/null").unwrap();
    let stray = std::fs::File::open("/dev/null").unwrap();
    let lease = uids::lease(&tmp.path().join("uids")).unwrap();
    let (k, st, l) = (keep.as_raw_fd(), stray.as_raw_fd(), lease.fd());
    s.keep_fds = vec![5];
    s.hold_fds = vec![l];
    let mut c = start(&s, move || {
        // SAFETY: dup2/fcntl are async-signal-safe.
        unsafe {
            libc::dup2(k, 5);
            libc::fcntl(st, libc::F_SETFD, 0);
            libc::fcntl(l, libc::F_SETFD, 0);
        }
        Ok(())
    });
    let jpid = i32::try_from(c.id()).unwrap();
    let pid = inner_pid(&dir);
    assert_ne!(pid, jpid, "the program runs in a child of the supervisor");
    // The kernel points /proc/PID/exe at the new program before it has
    // laid out the program's environment (CI read an empty `environ` once,
    // on a loaded host): both, then.
    wait_for("the program to be executed", || {
        (std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e == Path::new(BUSYBOX))
            && std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|e| !e.is_empty()))
        .then_some(())
    });
    let ids = format!("{0}\t{0}\t{0}\t{0}", uids::UID_BASE + 4000);
    assert_eq!(status_field(pid, "Uid"), ids);
    assert_eq!(status_field(pid, "Gid"), ids);
    assert_eq!(status_field(pid, "Groups"), uids::SHARED_GID.to_string());
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(pid, cap), "0000000000000000", "{cap}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Umask"), "0077");
    assert_eq!(
        status_field(pid, "NSpid").split_whitespace().last(),
        Some("1"),
        "PID 1 of its own pid namespace"
    );
    for ns in ["mnt", "pid", "net", "ipc", "uts"] {
        let mine = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        let its = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        assert_ne!(mine, its, "{ns} namespace");
        let sup = std::fs::read_link(format!("/proc/{jpid}/ns/{ns}")).unwrap();
        assert_eq!(
            mine, sup,
            "the supervisor stays in the host's {ns} namespace"
        );
    }
    // Descriptors: 0-2 and the one passed; not the stray nor the lease.
    let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
        .collect();
    fds.sort_unstable();
    assert_eq!(fds, [0, 1, 2, 5]);
    // The supervisor holds the lease while the program runs.
    let held = std::fs::read_dir(format!("/proc/{jpid}/fd"))
        .unwrap()
        .any(|e| e.unwrap().file_name().to_string_lossy() == l.to_string());
    assert!(held, "the supervisor keeps the uid lease");
    // Environment: only what the spec gives.
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert_eq!(env, b"RUST_LOG=debug\0");
    // Limits.
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let lim = |name: &str| {
        limits
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap()
            .split_whitespace()
            .skip(name.split_whitespace().count())
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(lim("Max open files"), "256 256");
    assert_eq!(lim("Max core file size"), "0 0");
    assert_eq!(lim("Max locked memory"), "0 0");
    // Files: the root holds only the binds, /dev only kvm and null.
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let mut top: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    let first = dir
        .components()
        .nth(1)
        .unwrap()
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    let mut want = vec!["dev".to_string(), "proc".into(), "usr".into(), first];
    want.sort();
    want.dedup();
    assert_eq!(top, want);
    let mut dev: Vec<String> = std::fs::read_dir(root.join("dev"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    dev.sort();
    let want_dev: Vec<&str> = if s.kvm {
        vec!["kvm", "null"]
    } else {
        vec!["null"]
    };
    assert_eq!(dev, want_dev);
    assert!(
        !root
            .join(tmp.path().join("secret").strip_prefix("/").unwrap())
            .exists(),
        "a sibling of the bind is not there"
    );
    if s.kvm {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(root.join("dev/kvm")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (s.uid, s.gid, 0o600));
    }
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let ro_line = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(BUSYBOX))
        .unwrap();
    assert!(
        ro_line
            .split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "{ro_line}"
    );
    // The cgroup, with its limits.
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cg.contains(&format!("/shoal/{id}")), "{cg}");
    let plan = shoal_jailer::cgroup::plan_here(&id, &s.cgroup.unwrap()).unwrap();
    for (f, v) in &plan.limits {
        assert_eq!(
            std::fs::read_to_string(f).unwrap().trim(),
            v,
            "{}",
            f.display()
        );
    }
    // Let it finish: it writes through its rw bind, and its exit status
    // is the jailer's.
    std::fs::write(dir.join("go"), "").unwrap();
    let st = exited(&mut c);
    assert_eq!(st.code(), Some(7), "{st:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("written")).unwrap(),
        "hi\n"
    );
    let seen = std::fs::read_to_string(dir.join("root")).unwrap();
    assert!(!seen.contains("etc"), "no /etc inside: {seen}");
    for d in &plan.dirs {
        assert!(!d.exists(), "cgroup {} removed after exit", d.display());
    }
    drop((keep, stray, lease));
}

#[test]
fn signals_reach_the_program_and_the_jailer_ends_as_it_did() {
    prereqs();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    // No TERM handler: PID 1 would ignore SIGTERM; the supervisor stands
    // SIGKILL in for it and ends by SIGTERM itself.
    let s = spec(
        &format!("js-{}", std::process::id()),
        &dir,
        "while :; do /usr/bin/busybox usleep 20000; done",
    );
    let mut c = start(&s, || Ok(()));
    let pid = inner_pid(&dir);
    // SAFETY: kill on our child.
    unsafe { libc::kill(i32::try_from(c.id()).unwrap(), libc::SIGTERM) };
    let st = exited(&mut c);
    assert_eq!(st.signal(), Some(libc::SIGTERM), "{st:?}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the program is gone"
    );
    // With a handler, the signal itself is delivered.
    let _ = std::fs::remove_file(dir.join("vmm.pid"));
    let s = spec(
        &format!("jh-{}", std::process::id()),
        &dir,
        "trap 'exit 3' TERM; while :; do /usr/bin/busybox usleep 20000; done",
    );
    let mut c = start(&s, || Ok(()));
    let pid = inner_pid(&dir);
    wait_for("the trap", || {
        let m = u64::from_str_radix(&status_field(pid, "SigCgt"), 16).unwrap();
        (m & (1 << (libc::SIGTERM - 1)) != 0).then_some(())
    });
    // SAFETY: kill on our child.
    unsafe { libc::kill(i32::try_from(c.id()).unwrap(), libc::SIGTERM) };
    assert_eq!(exited(&mut c).code(), Some(3));
    // SIGKILL of the supervisor takes the program with it.
    let _ = std::fs::remove_file(dir.join("vmm.pid"));
    let s = spec(
        &format!("jk-{}", std::process::id()),
        &dir,
        "while :; do /usr/bin/busybox usleep 20000; done",
    );
    let mut c = start(&s, || Ok(()));
    let pid = inner_pid(&dir);
    c.kill().unwrap();
    c.wait().unwrap();
    wait_for("the program to die with its supervisor", || {
        (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    });
    // A SIGKILLed supervisor leaves its (now empty) cgroup: the daemon
    // sweeps such leftovers; this test removes its own.
    let plan = shoal_jailer::cgroup::plan_here(&s.id, &s.cgroup.unwrap()).unwrap();
    for d in &plan.dirs {
        let _ = std::fs::remove_dir(d);
    }
}

#[test]
fn a_setup_failure_is_reported_and_leaves_no_cgroup() {
    prereqs();
    let tmp = tempfile::tempdir().unwrap();
    let id = format!("jf-{}", std::process::id());
    let mut s = spec(&id, tmp.path(), "exit 0");
    s.ro.push(tmp.path().with_extension("missing"));
    let out = Command::new(env!("CARGO_BIN_EXE_shoal-jailer"))
        .args(s.to_args())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(shoal_jailer::run::SETUP_FAILED));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("opening") && err.contains(".missing"), "{err}");
    let plan = shoal_jailer::cgroup::plan_here(&id, &s.cgroup.unwrap()).unwrap();
    for d in &plan.dirs {
        assert!(!d.exists(), "{} removed", d.display());
    }
    // A bad spec is refused before anything is done.
    let out = Command::new(env!("CARGO_BIN_EXE_shoal-jailer"))
        .args(["--id", "x", "--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--uid"));
}

#[test]
fn a_named_network_namespace_is_joined_instead_of_a_new_one() {
    prereqs();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    // A process in a network namespace of its own stands in for a pooled
    // netns; its /proc entry names the namespace.
    let mut holder = Command::new("unshare")
        .args(["--net", BUSYBOX, "sleep", "30"])
        .spawn()
        .unwrap();
    let hp = i32::try_from(holder.id()).unwrap();
    let ns = format!("/proc/{hp}/ns/net");
    let want = wait_for("the holder's namespace", || {
        let n = std::fs::read_link(&ns).ok()?;
        (n != std::fs::read_link("/proc/self/ns/net").unwrap()).then_some(n)
    });
    let mut s = spec(
        &format!("jn-{}", std::process::id()),
        &dir,
        "while :; do /usr/bin/busybox usleep 20000; done",
    );
    s.netns = Some(ns.into());
    let mut c = start(&s, || Ok(()));
    let pid = inner_pid(&dir);
    let got = wait_for("the program to run", || {
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .is_ok_and(|e| e == Path::new(BUSYBOX))
            .then(|| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap())
    });
    // SAFETY: kill on our child (SIGTERM: the jailer removes its cgroup).
    unsafe { libc::kill(i32::try_from(c.id()).unwrap(), libc::SIGTERM) };
    c.wait().unwrap();
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(got, want, "the jail joined the named namespace");
}
