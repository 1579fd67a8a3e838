//! The argument lists [`VmmProcess`] produces, checked against the flags
//! `shoal-vmm` declares (its `clap` struct in vmm/src/main.rs).

use super::*;
use std::collections::BTreeSet;

/// The long flags `shoal-vmm` declares: every field of its `Args` struct
/// under an `#[arg(long ...)]` attribute, in kebab case.
fn vmm_flags() -> BTreeSet<String> {
    let src = include_str!("../../vmm/src/main.rs");
    let body = src
        .split_once("struct Args {")
        .and_then(|(_, rest)| rest.split_once("\n}\n"))
        .map(|(body, _)| body)
        .expect("vmm/src/main.rs declares `struct Args { ... }`");
    let mut flags = BTreeSet::new();
    let mut long = false;
    for line in body.lines().map(str::trim) {
        if line.starts_with("#[arg(") {
            long = line.contains("long");
        } else if let Some((field, _)) = line.split_once(':').filter(|_| !line.starts_with("//")) {
            if long {
                flags.insert(format!("--{}", field.trim().replace('_', "-")));
            }
            long = false;
        }
    }
    flags
}

fn strs(p: &VmmProcess) -> Vec<String> {
    p.args()
        .unwrap()
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// Every `--flag` in `args` is one `shoal-vmm` declares, and each flag
/// that takes a value is followed by one.
fn assert_accepted(args: &[String]) {
    let known = vmm_flags();
    let switches = [
        "--prewarm",
        "--once",
        "--timings",
        "--check-host",
        "--json",
        "--no-seccomp",
    ];
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        assert!(known.contains(a), "{a} is not a shoal-vmm flag ({known:?})");
        if switches.contains(&a.as_str()) {
            i += 1;
        } else {
            assert!(
                args.get(i + 1).is_some_and(|v| !v.starts_with("--")),
                "{a} has no value in {args:?}"
            );
            i += 2;
        }
    }
}

#[test]
fn the_vmm_declares_the_flags_we_parse() {
    let f = vmm_flags();
    for want in [
        "--kernel",
        "--restore",
        "--restore-disk",
        "--ready-fd",
        "--prewarm",
        "--api-sock",
        "--vsock-uds",
        "--serial",
    ] {
        assert!(f.contains(want), "{want} missing from {f:?}");
    }
    assert!(!f.contains("--vcpu"), "{f:?}");
}

#[test]
fn boot_args() {
    let p = VmmProcess::boot(Path::new("/vmm"), Path::new("/k/vmlinux"))
        .cmdline("console=ttyS0 -- /bin/true")
        .initrd("/k/initrd")
        .pmem("/i/base.img")
        .pmem("/l/kit.img")
        .disk(Disk::rw("/t/scratch.ext4"))
        .disk(Disk::ro("/i/ro,odd.img"))
        .disk(Disk::rw("/i/rw,odd.img"))
        .memory_mib(256)
        .vcpus(2)
        .vsock_uds("/s/v.sock")
        .vsock_cid(7)
        .api_sock("/s/api.sock")
        .serial(Serial::File("/s/console.log".into()))
        .serial_limit(4096)
        .timeout(Duration::from_secs(900))
        .timings(true)
        .ready_pipe(true)
        .seccomp(false);
    let a = strs(&p);
    assert_eq!(
        a,
        [
            "--kernel",
            "/k/vmlinux",
            "--cmdline",
            "console=ttyS0 -- /bin/true",
            "--initrd",
            "/k/initrd",
            "--pmem",
            "/i/base.img",
            "--pmem",
            "/l/kit.img",
            "--disk",
            "/t/scratch.ext4",
            "--disk",
            "/i/ro,odd.img,ro",
            "--disk",
            "/i/rw,odd.img,rw",
            "--memory",
            "256",
            "--vcpus",
            "2",
            "--api-sock",
            "/s/api.sock",
            "--vsock-uds",
            "/s/v.sock",
            "--vsock-cid",
            "7",
            "--serial",
            "file:/s/console.log",
            "--serial-limit",
            "4096",
            "--timeout",
            "900",
            "--ready-fd",
            "3",
            "--timings",
            "--no-seccomp",
        ]
    );
    assert_accepted(&a);
}

#[test]
fn restore_args() {
    let p = VmmProcess::restore(Path::new("/vmm"), Path::new("/t/tpl"))
        .disk(Disk::rw("/sb/scratch.ext4"))
        // Boot-only options are dropped for a restore.
        .pmem("/ignored.img")
        .cmdline("ignored")
        .api_sock("/sb/api.sock")
        .vsock_uds("/sb/vsock.sock")
        .serial(Serial::Null)
        .timeout(Duration::from_millis(1500));
    let a = strs(&p);
    assert_eq!(
        a,
        [
            "--restore",
            "/t/tpl",
            "--restore-disk",
            "/sb/scratch.ext4",
            "--api-sock",
            "/sb/api.sock",
            "--vsock-uds",
            "/sb/vsock.sock",
            "--serial",
            "null",
            "--timeout",
            "1.5",
        ]
    );
    assert_accepted(&a);
}

#[test]
fn a_prewarmed_vmm_for_one_guest_says_once() {
    let p = VmmProcess::prewarm_once(Path::new("/vmm"))
        .memory_mib(256)
        .vcpus(2)
        .api_sock("/s/api.sock");
    let a = strs(&p);
    assert_eq!(
        a,
        [
            "--memory",
            "256",
            "--vcpus",
            "2",
            "--api-sock",
            "/s/api.sock",
            "--prewarm",
            "--once"
        ]
    );
    assert_accepted(&a);
}

#[test]
fn prewarm_needs_a_control_socket() {
    let p = VmmProcess::prewarm(Path::new("/vmm")).memory_mib(128);
    assert!(matches!(p.args(), Err(VmmProcessError::Invalid(_))));
    let p = p.api_sock("/w/0.sock").serial(Serial::Stdout);
    let a = strs(&p);
    assert_eq!(
        a,
        [
            "--memory",
            "128",
            "--api-sock",
            "/w/0.sock",
            "--serial",
            "stdout",
            "--prewarm"
        ]
    );
    assert_accepted(&a);
}

#[test]
fn non_utf8_paths_pass_through_unchanged() {
    use std::os::unix::ffi::OsStringExt;
    let odd = PathBuf::from(OsString::from_vec(b"/t/\xffdisk".to_vec()));
    let p = VmmProcess::boot(Path::new("/vmm"), Path::new("/k"))
        .disk(Disk::ro(&odd))
        .serial(Serial::File(odd.clone()));
    let a = p.args().unwrap();
    assert_eq!(a[3].as_bytes(), b"/t/\xffdisk,ro");
    assert_eq!(a[5].as_bytes(), b"file:/t/\xffdisk");
}

#[test]
fn command_opens_log_files_and_spawn_reports_readiness() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("vmm.log");
    std::fs::write(&log, "earlier\n").unwrap();
    // A shell stands in for the VMM: it ignores the VMM's flags, reports
    // ready on fd 3, and writes to stderr.
    let script = dir.path().join("fake-vmm");
    std::fs::write(
        &script,
        "#!/bin/sh\necho started >&2\necho ready >&3\nexec sleep 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let p = VmmProcess::restore(&script, dir.path())
        .stdin(Io::Null)
        .stdout(Io::Null)
        .stderr(Io::Append(log.clone()))
        .ready_pipe(true)
        .own_session(true);
    let mut s = p.spawn().unwrap();
    let r = s
        .ready
        .as_mut()
        .expect("a ready pipe")
        .wait(Duration::from_secs(10));
    assert_eq!(r, crate::ready::Readiness::Ready);
    // Its own session: the session id (field 6 of /proc/PID/stat) is its pid.
    let pid = s.child.id();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let sid = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(3);
    assert_eq!(sid, Some(pid.to_string().as_str()), "{stat}");
    assert!(s.child.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "earlier\nstarted\n");
    // A log that cannot be opened is an error, not a silent /dev/null.
    let bad = VmmProcess::restore(&script, dir.path())
        .stderr(Io::Append(dir.path().join("no/such/dir/vmm.log")));
    assert!(matches!(bad.command(), Err(VmmProcessError::Stdio { .. })));
    let missing = VmmProcess::restore(&dir.path().join("nope"), dir.path());
    assert!(matches!(
        missing.spawn(),
        Err(VmmProcessError::Spawn { .. })
    ));
}

/// `f` moved to a descriptor number of 200 or more (close-on-exec).
fn high_fd(f: std::fs::File) -> std::fs::File {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor `f` owns returns a new one
    // or -1; nothing else is touched.
    let fd = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 200) };
    assert!(
        fd >= 200,
        "F_DUPFD_CLOEXEC: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fd` was just made by fcntl and is owned by nothing else.
    unsafe { std::fs::File::from_raw_fd(fd) }
}

#[test]
fn pmem_files_are_passed_at_fixed_numbers() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    std::fs::write(&a, "image-a").unwrap();
    std::fs::write(&b, "image-b").unwrap();
    // Held at high numbers: the stand-in VMM's shell (dash) moves its own
    // script's descriptor to 10 or above (12 here, with 10 and 11 taken),
    // which a low number of ours could be by chance.
    let fa = Arc::new(high_fd(open_image(&a).expect("a regular file")));
    let fb = Arc::new(high_fd(open_image(&b).expect("a regular file")));
    // Not a regular file: not opened here (the VMM reports it).
    assert!(open_image(Path::new("/dev/null")).is_none());
    assert!(open_image(&dir.path().join("missing")).is_none());
    // Stand-in VMM: lists its descriptors, reads the images from theirs.
    let script = dir.path().join("fake-vmm");
    let out = dir.path().join("out");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nls /proc/$$/fd > {o}.fds\n\
             cat /proc/$$/fd/10 > {o}\necho >> {o}\ncat /proc/$$/fd/11 >> {o}\n\
             echo ready >&3\n",
            o = out.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let p = VmmProcess::boot(&script, Path::new("/k"))
        .pmem("/plain.img")
        .pmem_file(&a, fa.clone())
        .pmem_file(&b, fb.clone())
        .stdin(Io::Null)
        .stdout(Io::Null)
        .stderr(Io::Null)
        .ready_pipe(true);
    let args = strs(&p);
    assert_accepted(&args);
    let pmem: Vec<&String> = args
        .windows(2)
        .filter(|w| w[0] == "--pmem")
        .map(|w| &w[1])
        .collect();
    assert_eq!(
        pmem,
        [
            "/plain.img".to_string(),
            format!("fd:10={}", a.display()),
            format!("fd:11={}", b.display())
        ]
        .iter()
        .collect::<Vec<_>>()
    );
    assert_eq!(p.kept_fds(), [3, 10, 11]);
    // Whatever numbers the files have here, the child gets them at 10
    // and 11, and our own numbers for them are not open there (the
    // copies made on the way are close-on-exec).
    let ours = [fa.as_raw_fd(), fb.as_raw_fd()];
    let mut s = p.spawn().unwrap();
    let r = s.ready.as_mut().unwrap().wait(Duration::from_secs(10));
    let status = s.child.wait().unwrap();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(r, crate::ready::Readiness::Ready, "{status}: {text}");
    assert!(status.success());
    let mut lines = text.lines();
    // (What the test process itself inherited without close-on-exec, e.g.
    // cargo's jobserver pipe, is the jailer's to close: kept_fds.) The
    // list is taken by a simple command, not a pipeline, so the shell
    // holds no pipe of its own while `ls` reads its descriptors.
    let fds = std::fs::read_to_string(out.with_extension("fds")).unwrap_or_default();
    let open: Vec<i32> = fds.split_whitespace().map(|n| n.parse().unwrap()).collect();
    for fd in [0, 1, 2, 3, 10, 11] {
        assert!(open.contains(&fd), "{fd} not open in {open:?}");
    }
    for fd in ours.iter().filter(|fd| ![3, 10, 11].contains(*fd)) {
        assert!(!open.contains(fd), "our descriptor {fd} leaked: {open:?}");
    }
    assert_eq!(lines.next(), Some("image-a"));
    assert_eq!(lines.next(), Some("image-b"));
}

#[test]
fn a_jailed_command_is_the_jailer_with_the_vmm_arguments_unchanged() {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test changes file owners: run the tests as root"
    );
    let tmp = tempfile::tempdir().unwrap();
    let vmm = Path::new("/bin/ls");
    let cfg = crate::jail::JailConfig::new(
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
    assert!(crate::jail::uids::slot_of(uid).is_some());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&sb).unwrap().uid(),
        uid,
        "the sandbox dir is the jail user's"
    );
    let canon = std::fs::canonicalize(vmm).unwrap();
    let mut plain = VmmProcess::restore(&canon, &tpl).ready_pipe(true);
    let null = std::sync::Arc::new(std::fs::File::open("/dev/null").unwrap());
    assert_eq!(plain.pass_fd(null), FIRST_PASSED_FD);
    let jailed = plain.clone().jail(j.clone());
    assert_eq!(jailed.kept_fds(), vec![3, FIRST_PASSED_FD]);
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
    let spec = crate::jail::JailSpec::parse(ja.iter().map(|a| a.to_os_string())).unwrap();
    assert_eq!(spec.keep_fds, vec![3, FIRST_PASSED_FD]);
    assert_eq!(spec.rw, vec![sb.clone()]);
    assert!(spec.ro.contains(&tpl) && spec.ro.contains(&canon));
    // The uid lease is passed after the VMM's descriptors, for the
    // jailer's supervisor alone; then the network namespace made ahead,
    // if one was ready, which the jailer joins by that descriptor.
    assert_eq!(spec.hold_fds[0], FIRST_PASSED_FD + 1);
    match &j.netns {
        Some(_) => {
            assert_eq!(
                spec.hold_fds,
                vec![FIRST_PASSED_FD + 1, FIRST_PASSED_FD + 2]
            );
            let p = format!("/proc/self/fd/{}", FIRST_PASSED_FD + 2);
            assert_eq!(spec.netns, Some(p.into()));
        }
        None => assert_eq!(spec.hold_fds.len(), 1),
    }
    // The cgroup is made here, limits written, for the jailer to adopt.
    assert_eq!(spec.cgroup, None);
    assert_eq!(spec.cgroup_dirs, j.spec.cgroup_dirs);
    let mem = spec
        .cgroup_dirs
        .iter()
        .find_map(|d| {
            std::fs::read_to_string(d.join("memory.limit_in_bytes"))
                .or_else(|_| std::fs::read_to_string(d.join("memory.max")))
                .ok()
        })
        .expect("a memory cgroup among the jail's");
    assert_eq!(
        mem.trim(),
        ((128u64 << 20) + crate::jail::OVERHEAD_BYTES).to_string()
    );
    assert_eq!(spec.pid_file, Some(sb.join(crate::jail::PID_FILE)));
    assert!(spec
        .env
        .iter()
        .all(|(k, _)| k == "RUST_LOG" || k == "RUST_BACKTRACE"));
    // Two jails at once never share a uid.
    let j2 = cfg.jail_for(&sb, &[], 0).unwrap();
    assert_ne!(j2.spec.uid, uid);
    // Both are sandbox "abc": the second replaced the first's (empty)
    // cgroup, as the jailer does with a leftover of the same id.
    assert_eq!(j2.spec.cgroup_dirs, j.spec.cgroup_dirs);
    for d in &j2.spec.cgroup_dirs {
        std::fs::remove_dir(d).unwrap();
    }
}

fn net_procs() -> (VmmProcess, VmmProcess) {
    let tap = Arc::new(File::open("/dev/null").unwrap());
    let mac = [0x02, 0x5a, 0x0a, 0xd5, 0x00, 0x02];
    let limits = NetLimits {
        tx_bps: Some(1 << 20),
        ..Default::default()
    };
    let boot = VmmProcess::boot(Path::new("/vmm"), Path::new("/k/vmlinux")).net_tap(
        tap.clone(),
        mac,
        limits,
    );
    let restore = VmmProcess::restore(Path::new("/vmm"), Path::new("/t/tpl")).net_tap(
        tap,
        mac,
        NetLimits::default(),
    );
    (boot, restore)
}

#[test]
fn net_args() {
    let (boot, restore) = net_procs();
    assert_eq!(
        strs(&boot),
        [
            "--kernel",
            "/k/vmlinux",
            "--net",
            "fd:10,mac=02:5a:0a:d5:00:02,tx_bps=1048576"
        ]
    );
    assert_eq!(
        strs(&restore),
        [
            "--restore",
            "/t/tpl",
            "--restore-net",
            "fd:10,mac=02:5a:0a:d5:00:02"
        ]
    );
    // The TAP's descriptor survives a jailer's closing of the others.
    assert_eq!(restore.kept_fds(), [10]);
}

/// The net flags this builder emits are the ones `vmm/src/main.rs`
/// declares.
#[test]
fn net_flags_are_the_vmms() {
    let (boot, restore) = net_procs();
    assert_accepted(&strs(&boot));
    assert_accepted(&strs(&restore));
}

/// `--balloon` when booting (a flag the VMM declares); nothing when
/// restoring (the snapshot's device is restored).
#[test]
fn balloon_args() {
    let b = crate::vmm_balloon::BalloonOptions {
        stats_interval_s: 1,
        ..Default::default()
    };
    let boot = VmmProcess::boot(Path::new("/vmm"), Path::new("/k/vmlinux")).balloon(b);
    let args = strs(&boot);
    assert_eq!(
        args,
        ["--kernel", "/k/vmlinux", "--balloon", "on,stats_s=1"]
    );
    assert_accepted(&args);
    let restore = VmmProcess::restore(Path::new("/vmm"), Path::new("/t/tpl")).balloon(b);
    assert_eq!(strs(&restore), ["--restore", "/t/tpl"]);
}
