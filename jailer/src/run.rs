//! The jailing itself, in the order the crate documentation lists. Only
//! the `shoal-jailer` binary calls [`run`]: it forks, changes namespaces
//! and credentials, and must run as root in the host's namespaces.

use crate::cgroup::{self, Cgroup};
use crate::JailSpec;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why the jail could not be set up (in the supervisor; the child reports
/// its own failures on stderr and exits with [`SETUP_FAILED`]).
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// Not root.
    #[error("the jailer must run as root (euid {0})")]
    NotRoot(u32),
    /// A system call.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The cgroup.
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
}

/// The exit status of a jail child that failed before `execve`.
pub const SETUP_FAILED: i32 = 125;

/// How the VMM ended, for the supervisor to end the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Code(i32),
    /// It was killed by this signal (or by SIGKILL standing in for this
    /// one, which it had no handler for: see [`run`]).
    Signal(i32),
}

fn sys(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> JailError {
    let what = what.into();
    move |source| JailError::Sys { what, source }
}

/// `r` as a result: negative means errno.
fn ok(r: libc::c_long) -> std::io::Result<libc::c_long> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cstr(p: impl AsRef<OsStr>) -> std::io::Result<CString> {
    CString::new(p.as_ref().as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// One bind: the source opened while the host tree was visible.
struct Bind {
    path: PathBuf,
    fd: OwnedFd,
    dir: bool,
    ro: bool,
}

fn open_path(p: &Path) -> std::io::Result<(OwnedFd, bool)> {
    let c = cstr(p)?;
    // SAFETY: a NUL-terminated path; open returns a new descriptor or -1.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    let fd = ok(fd.into())?;
    // SAFETY: a new descriptor nothing else owns (it fits an i32: open
    // returned it as one).
    let fd = unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).unwrap_or(-1)) };
    let m = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    Ok((fd, m.is_dir()))
}

/// The signals the supervisor handles (blocked, read from a signalfd);
/// all but SIGCHLD are forwarded to the VMM.
const FORWARDED: [i32; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

fn sigset(sigs: &[i32]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initializes it.
    let mut s: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid sigset_t; valid signal numbers.
    unsafe {
        libc::sigemptyset(&mut s);
        for &g in sigs {
            libc::sigaddset(&mut s, g);
        }
    }
    s
}

/// Sets the jail up and runs `spec.exec` in it; returns (in the
/// supervisor) how the VMM ended, once it has and its cgroup is removed.
///
/// Signals: the VMM is PID 1 of its namespace, and PID 1 gets no signal it
/// has no handler for (but SIGKILL from an ancestor namespace). So a
/// forwarded signal the VMM catches (per its `SigCgt`) is sent as is; one
/// it does not catch, whose default would have ended it, is sent as
/// SIGKILL, and the supervisor then ends by that signal, as the VMM would
/// have outside a jail.
pub fn run(spec: &JailSpec) -> Result<Ended, JailError> {
    // SAFETY: geteuid has no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(JailError::NotRoot(euid));
    }
    let kvm_rdev = if spec.kvm {
        use std::os::unix::fs::MetadataExt;
        Some(
            std::fs::metadata("/dev/kvm")
                .map_err(sys("/dev/kvm"))?
                .rdev(),
        )
    } else {
        None
    };
    let netns = match &spec.netns {
        Some(p) => Some(
            std::fs::File::open(p)
                .map(OwnedFd::from)
                .map_err(sys(format!("opening netns {}", p.display())))?,
        ),
        None => None,
    };
    let last_cap: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    let mountpoint = ["/mnt", "/tmp", "/run", "/var/tmp"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_dir())
        .ok_or_else(|| {
            sys("a directory for the jail root")(std::io::Error::from_raw_os_error(libc::ENOENT))
        })?;
    // 2. The cgroup.
    let cg = match &spec.cgroup {
        Some(c) => Some(Cgroup::create(cgroup::plan_here(&spec.id, c)?)?),
        None if !spec.cgroup_dirs.is_empty() => Some(Cgroup::adopt(spec.cgroup_dirs.clone())),
        None => None,
    };
    let procs = cg.as_ref().map(Cgroup::procs_files).unwrap_or_default();
    // 3. Fork into a new pid namespace, signals blocked until each side
    // has its own arrangement.
    let mut handled = FORWARDED.to_vec();
    handled.push(libc::SIGCHLD);
    let mask = sigset(&handled);
    let mut pipe = [0; 2];
    // SAFETY: sigprocmask with a valid set; pipe2 writes two descriptors.
    unsafe {
        libc::sigprocmask(libc::SIG_BLOCK, &mask, std::ptr::null_mut());
        ok(libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC).into()).map_err(sys("pipe2"))?;
    }
    // SAFETY: two new descriptors nothing else owns.
    let (alive_r, alive_w) =
        unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
    let fail = |e: JailError| {
        if let Some(c) = &cg {
            c.remove(Duration::ZERO);
        }
        e
    };
    // SAFETY: unshare with a flag; affects only children forked later.
    ok(unsafe { libc::unshare(libc::CLONE_NEWPID) }.into())
        .map_err(sys("unshare(CLONE_NEWPID)"))
        .map_err(fail)?;
    // SAFETY: this process is single-threaded (the jailer starts no
    // threads), so the child may go on running ordinary code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(fail(sys("fork")(std::io::Error::last_os_error())));
    }
    if pid == 0 {
        drop(alive_w);
        let e = child(spec, kvm_rdev, netns, &procs, alive_r, last_cap, mountpoint);
        eprintln!("shoal-jailer: {e}");
        // SAFETY: _exit ends the child without running the parent's
        // destructors (the cgroup is the supervisor's to remove).
        unsafe { libc::_exit(SETUP_FAILED) };
    }
    drop(alive_r);
    drop(netns);
    for &fd in &spec.keep_fds {
        // SAFETY: close on a descriptor number; the VMM has its copy, and
        // this process must not keep e.g. the readiness pipe open.
        unsafe { libc::close(fd) };
    }
    if let Some(p) = &spec.pid_file {
        let tmp = p.with_extension("pid.tmp");
        let w = std::fs::write(&tmp, format!("{pid}\n")).and_then(|()| std::fs::rename(&tmp, p));
        if let Err(e) = w {
            eprintln!("shoal-jailer: pid file {}: {e}", p.display());
        }
    }
    // Go: the child reads this byte before its first step.
    // SAFETY: a one-byte write from a live buffer to our pipe.
    unsafe { libc::write(alive_w.as_raw_fd(), b"g".as_ptr().cast(), 1) };
    let ended = supervise(pid, &mask);
    // The write end is held until here: the child checks it to know this
    // process is alive after its credentials change.
    drop(alive_w);
    if let Some(c) = &cg {
        if !c.remove(Duration::from_secs(2)) {
            eprintln!("shoal-jailer: cgroup {:?} not removed", c.plan().dirs);
        }
    }
    ended
}

/// Waits for the VMM, forwarding signals; returns how it ended.
fn supervise(pid: libc::pid_t, mask: &libc::sigset_t) -> Result<Ended, JailError> {
    // SAFETY: a valid, initialized signal set; a new descriptor.
    let sfd = unsafe { libc::signalfd(-1, mask, libc::SFD_CLOEXEC) };
    let sfd = ok(sfd.into()).map_err(sys("signalfd"))?;
    // SAFETY: a new descriptor nothing else owns.
    let sfd = unsafe { OwnedFd::from_raw_fd(i32::try_from(sfd).unwrap_or(-1)) };
    let mut standin: Option<i32> = None;
    loop {
        let mut st = 0;
        // SAFETY: waitpid on our child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
        if r == pid {
            return Ok(if libc::WIFEXITED(st) {
                Ended::Code(libc::WEXITSTATUS(st))
            } else {
                let sig = libc::WTERMSIG(st);
                match standin {
                    Some(s) if sig == libc::SIGKILL => Ended::Signal(s),
                    _ => Ended::Signal(sig),
                }
            });
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(sys("waitpid")(std::io::Error::last_os_error()));
        }
        // SAFETY: signalfd_siginfo is plain data.
        let mut si: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let n = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: reads at most `n` bytes into `si`, which has that size.
        let got = unsafe {
            libc::read(
                sfd.as_raw_fd(),
                (&mut si as *mut libc::signalfd_siginfo).cast(),
                n,
            )
        };
        if got <= 0 {
            continue;
        }
        let sig = i32::try_from(si.ssi_signo).unwrap_or(0);
        if sig == libc::SIGCHLD || sig == 0 {
            continue;
        }
        let send = if catches(pid, sig) {
            sig
        } else {
            standin = Some(sig);
            libc::SIGKILL
        };
        // SAFETY: kill on our own child's pid (not yet reaped).
        unsafe { libc::kill(pid, send) };
    }
}

/// Whether process `pid` has a handler for `sig` (its `SigCgt` mask).
fn catches(pid: libc::pid_t, sig: i32) -> bool {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .is_some_and(|m| sig >= 1 && m & (1u64 << (sig - 1)) != 0)
}

/// The child's steps, up to `execve`; returns only on failure.
#[allow(clippy::too_many_arguments)]
fn child(
    spec: &JailSpec,
    kvm_rdev: Option<u64>,
    netns: Option<OwnedFd>,
    procs: &[CString],
    alive: OwnedFd,
    last_cap: u32,
    mountpoint: &Path,
) -> JailError {
    match child_steps(spec, kvm_rdev, netns, procs, &alive, last_cap, mountpoint) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

enum Never {}

/// The supervisor is alive (its end of the pipe is open) and said go.
fn wait_go(alive: &OwnedFd) -> std::io::Result<()> {
    let mut b = [0u8; 1];
    // SAFETY: reads one byte into a live buffer.
    let n = unsafe { libc::read(alive.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
    if n == 1 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(libc::ESRCH))
    }
}

fn still_supervised(alive: &OwnedFd) -> std::io::Result<()> {
    let mut p = libc::pollfd {
        fd: alive.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    unsafe { libc::poll(&mut p, 1, 0) };
    if p.revents & libc::POLLHUP != 0 {
        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

fn mount(
    src: Option<&CString>,
    dst: &CString,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> std::io::Result<()> {
    let fstype = fstype.map(cstr).transpose()?;
    let data = data.map(cstr).transpose()?;
    let p = |c: Option<&CString>| c.map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: NUL-terminated strings or NULL, as mount(2) takes them.
    let r = unsafe {
        libc::mount(
            p(src),
            dst.as_ptr(),
            p(fstype.as_ref()),
            flags,
            p(data.as_ref()).cast(),
        )
    };
    ok(r.into()).map(drop)
}

fn mkdir_p(p: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(p)
}

#[allow(clippy::too_many_arguments)]
fn child_steps(
    spec: &JailSpec,
    kvm_rdev: Option<u64>,
    netns: Option<OwnedFd>,
    procs: &[CString],
    alive: &OwnedFd,
    last_cap: u32,
    mountpoint: &Path,
) -> Result<Never, JailError> {
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    // The supervisor may have ended before the death signal was set; its
    // go (written once the VMM's pid is recorded) is read just before the
    // exec, so that these steps overlap its own.
    still_supervised(alive).map_err(sys("the supervisor ended"))?;
    // The jail's directories must be traversable by its user whatever
    // umask the jailer was started with (the VMM's own is set below).
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0o022) };
    // The cgroup is joined last, just before the credentials change (its
    // files opened now, while they are visible): the set-up runs at the
    // starter's CPU share, not the VMM's, which a loaded host gives little.
    let mut joins = vec![];
    for p in procs {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(OsStr::from_bytes(p.as_bytes()))
            .map_err(sys(format!(
                "joining {}",
                String::from_utf8_lossy(p.as_bytes())
            )))?;
        joins.push((f, p));
    }
    // 4. Namespaces: the network one joined or new, the others new (one
    // call when all are).
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    match netns {
        Some(fd) => {
            // SAFETY: setns on a namespace file we opened.
            ok(unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) }.into())
                .map_err(sys("setns(netns)"))?;
        }
        None => flags |= libc::CLONE_NEWNET,
    }
    // SAFETY: unshare with flags.
    ok(unsafe { libc::unshare(flags) }.into()).map_err(sys("unshare(net, mount, ipc, uts)"))?;
    // Every file the VMM will see, opened in this namespace (a bind's
    // source must be a mount of the caller's namespace) before the jail
    // root hides the host's tree.
    let mut binds = vec![];
    for (p, ro) in spec
        .ro
        .iter()
        .map(|p| (p, true))
        .chain(spec.rw.iter().map(|p| (p, false)))
    {
        let (fd, dir) = open_path(p).map_err(sys(format!("opening {}", p.display())))?;
        binds.push(Bind {
            path: p.clone(),
            fd,
            dir,
            ro,
        });
    }
    binds.sort_by(|a, b| a.path.cmp(&b.path));
    let host = spec.id.as_bytes();
    // SAFETY: a live buffer and its length.
    unsafe { libc::sethostname(host.as_ptr().cast(), host.len()) };
    let root = cstr("/").map_err(sys("/"))?;
    mount(None, &root, None, libc::MS_SLAVE | libc::MS_REC, None)
        .map_err(sys("making / a slave"))?;
    let mp = cstr(mountpoint).map_err(sys("jail root"))?;
    mount(
        Some(&cstr("tmpfs").map_err(sys("tmpfs"))?),
        &mp,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=0755,size=1m,nr_inodes=4096"),
    )
    .map_err(sys("mounting the jail's tmpfs"))?;
    for b in &binds {
        let rel = b.path.strip_prefix("/").unwrap_or(&b.path);
        let target = mountpoint.join(rel);
        if let Some(parent) = target.parent() {
            mkdir_p(parent).map_err(sys(format!("jail dir for {}", b.path.display())))?;
        }
        let made = if b.dir {
            mkdir_p(&target)
        } else {
            std::fs::File::create(&target).map(drop)
        };
        made.map_err(sys(format!("jail node for {}", b.path.display())))?;
        let t = cstr(&target).map_err(sys("bind target"))?;
        let src =
            cstr(format!("/proc/self/fd/{}", b.fd.as_raw_fd())).map_err(sys("bind source"))?;
        mount(Some(&src), &t, None, libc::MS_BIND, None)
            .map_err(sys(format!("binding {}", b.path.display())))?;
        let ro = if b.ro { libc::MS_RDONLY } else { 0 };
        mount(
            None,
            &t,
            None,
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV | ro,
            None,
        )
        .map_err(sys(format!("remounting {}", b.path.display())))?;
    }
    let dev = mountpoint.join("dev");
    mkdir_p(&dev).map_err(sys("jail /dev"))?;
    let node = |name: &str, mode: libc::mode_t, rdev: u64| -> std::io::Result<CString> {
        let p = cstr(dev.join(name))?;
        // SAFETY: a NUL-terminated path, a mode and a device number.
        ok(unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | mode, rdev) }.into())?;
        // SAFETY: as above; mknod is subject to the umask, chmod is not.
        ok(unsafe { libc::chmod(p.as_ptr(), mode) }.into())?;
        Ok(p)
    };
    node("null", 0o666, libc::makedev(1, 3)).map_err(sys("jail /dev/null"))?;
    if let Some(rdev) = kvm_rdev {
        let p = node("kvm", 0o600, rdev).map_err(sys("jail /dev/kvm"))?;
        // SAFETY: a NUL-terminated path and ids.
        ok(unsafe { libc::chown(p.as_ptr(), spec.uid, spec.gid) }.into())
            .map_err(sys("chown /dev/kvm"))?;
    }
    mkdir_p(&mountpoint.join("proc")).map_err(sys("jail /proc"))?;
    std::env::set_current_dir(mountpoint).map_err(sys("chdir jail root"))?;
    let dot = cstr(".").map_err(sys("."))?;
    // SAFETY: pivot_root(".", ".") stacks the old root under the new one,
    // then the detach below drops it.
    ok(unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) })
        .map_err(sys("pivot_root"))?;
    // SAFETY: a NUL-terminated path and a flag.
    ok(unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) }.into())
        .map_err(sys("detaching the old root"))?;
    std::env::set_current_dir("/").map_err(sys("chdir /"))?;
    mount(
        Some(&cstr("proc").map_err(sys("proc"))?),
        &cstr("/proc").map_err(sys("/proc"))?,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(sys("mounting /proc"))?;
    mount(
        None,
        &root,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC,
        None,
    )
    .map_err(sys("remounting the jail root read-only"))?;
    for (mut f, p) in joins {
        use std::io::Write;
        // "0": the writing process.
        f.write_all(b"0").map_err(sys(format!(
            "joining {}",
            String::from_utf8_lossy(p.as_bytes())
        )))?;
    }
    // 5. Limits and credentials.
    let lim = |res, v: u64| {
        let mut cur = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit with a valid struct.
        unsafe {
            libc::getrlimit(res, &mut cur);
            let v = v.min(cur.rlim_max);
            let r = libc::rlimit {
                rlim_cur: v,
                rlim_max: v,
            };
            ok(libc::setrlimit(res, &r).into())
        }
    };
    lim(libc::RLIMIT_NOFILE, spec.rlimits.nofile).map_err(sys("RLIMIT_NOFILE"))?;
    lim(libc::RLIMIT_MEMLOCK, spec.rlimits.memlock).map_err(sys("RLIMIT_MEMLOCK"))?;
    lim(libc::RLIMIT_CORE, 0).map_err(sys("RLIMIT_CORE"))?;
    if let Some(n) = spec.rlimits.nproc {
        lim(libc::RLIMIT_NPROC, n).map_err(sys("RLIMIT_NPROC"))?;
    }
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0o077) };
    for cap in 0..=last_cap {
        // SAFETY: prctl with integer arguments; needs CAP_SETPCAP, which
        // this root process has until the uid changes below.
        ok(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) }.into())
            .map_err(sys(format!(
                "dropping capability {cap} from the bounding set"
            )))?;
    }
    // SAFETY: prctl with integer arguments.
    ok(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    }
    .into())
    .map_err(sys("clearing ambient capabilities"))?;
    // SAFETY: a live slice and its length; then plain ids.
    unsafe {
        ok(libc::setgroups(spec.extra_gids.len(), spec.extra_gids.as_ptr()).into())
            .map_err(sys("setgroups"))?;
        ok(libc::setresgid(spec.gid, spec.gid, spec.gid).into()).map_err(sys("setresgid"))?;
        ok(libc::setresuid(spec.uid, spec.uid, spec.uid).into()).map_err(sys("setresuid"))?;
    }
    // Permitted and effective are empty after leaving uid 0; the
    // inheritable set is cleared here.
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let d = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset with a version-3 header and two data words, as the
    // kernel expects for that version.
    ok(unsafe { libc::syscall(libc::SYS_capset, &mut h as *mut CapHeader, d.as_ptr()) })
        .map_err(sys("capset"))?;
    // A credential change cleared the parent-death signal: set it again,
    // then make sure the supervisor did not end in between.
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    wait_go(alive).map_err(sys("the supervisor ended"))?;
    // SAFETY: prctl with integer arguments.
    ok(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }.into())
        .map_err(sys("no_new_privs"))?;
    // Everything the exec needs, built before the descriptors go.
    let prog = cstr(&spec.exec).map_err(sys("program"))?;
    let mut argv: Vec<CString> = vec![prog.clone()];
    for a in &spec.args {
        argv.push(cstr(a).map_err(sys("argument"))?);
    }
    let envs: Vec<CString> = spec
        .env
        .iter()
        .map(|(k, v)| cstr(format!("{k}={v}")))
        .collect::<Result<_, _>>()
        .map_err(sys("environment"))?;
    let mut argp: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    argp.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = envs.iter().map(|c| c.as_ptr()).collect();
    envp.push(std::ptr::null());
    close_all_but(&spec.keep_fds).map_err(sys("closing descriptors"))?;
    // Default dispositions and an empty mask, as a freshly spawned
    // process has them (Rust ignores SIGPIPE in this one).
    for s in 1..32 {
        if s != libc::SIGKILL && s != libc::SIGSTOP {
            // SAFETY: resetting a signal to its default action.
            unsafe { libc::signal(s, libc::SIG_DFL) };
        }
    }
    let empty = sigset(&[]);
    // SAFETY: a valid, empty set; then execve with NUL-terminated arrays
    // of NUL-terminated strings that live until the call.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(prog.as_ptr(), argp.as_ptr(), envp.as_ptr());
    }
    Err(sys(format!("execve {}", spec.exec.display()))(
        std::io::Error::last_os_error(),
    ))
}

/// Closes every descriptor above 2 except `keep`, which lose close-on-exec.
fn close_all_but(keep: &[RawFd]) -> std::io::Result<()> {
    let mut k: Vec<u32> = keep.iter().filter_map(|f| u32::try_from(*f).ok()).collect();
    k.sort_unstable();
    let mut from = 3u32;
    for &f in &k {
        if f > from {
            // SAFETY: close_range on a range of descriptor numbers.
            ok(unsafe { libc::syscall(libc::SYS_close_range, from, f - 1, 0) })?;
        }
        // SAFETY: fcntl on a descriptor number (EBADF if not open).
        ok(unsafe { libc::fcntl(i32::try_from(f).unwrap_or(-1), libc::F_SETFD, 0) }.into())?;
        from = f + 1;
    }
    // SAFETY: as above, up to the highest number.
    ok(unsafe { libc::syscall(libc::SYS_close_range, from, u32::MAX, 0) })?;
    Ok(())
}
