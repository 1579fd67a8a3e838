//! Starting an exec's command: `clone(CLONE_VM | CLONE_VFORK)` like
//! posix_spawn, so no page tables are copied and the agent is only suspended
//! until the child has called execve. Everything the child needs is prepared
//! here beforehand; the child itself only makes raw system calls on that
//! data (no allocation, no locks) and reports a failure through shared
//! memory.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use super::os::Errno;

/// What the child does before exec (all borrowed: nothing is copied per
/// exec, which matters because musl's malloc maps and unmaps larger blocks).
pub struct SpawnSpec<'a> {
    /// Paths to try for the program, in order.
    pub paths: &'a [CString],
    /// argv (argv\[0\] as given).
    pub argv: &'a [CString],
    /// NULL-terminated `NAME=value` pointers.
    pub envp: &'a [*const c_char],
    /// Directory to chdir into.
    pub cwd: Option<&'a CStr>,
    /// (uid, gid) to switch to.
    pub user: Option<(u32, u32)>,
    /// fds to install as 0, 1 and 2.
    pub stdio: [RawFd; 3],
    /// cgroup directory to create and join, and its cgroup.procs.
    pub cgroup: Option<&'a (CString, CString)>,
    /// Write 0 to /proc/self/oom_score_adj (the agent runs at -1000).
    pub reset_oom: bool,
    /// Drop CAP_SYS_PTRACE from the bounding set (guest): the command and
    /// everything it starts can then neither ptrace the agent nor write its
    /// memory through /proc/1/mem (the agent is not dumpable), while
    /// tracing its own processes still works.
    pub drop_ptrace: bool,
    /// Make stdin (a terminal) the controlling terminal of the new session.
    pub ctty: bool,
}

/// Where the child failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// clone itself.
    Clone,
    /// chdir to the cwd.
    Chdir,
    /// setgroups/setgid/setuid.
    User,
    /// dup2 of the stdio fds.
    Stdio,
    /// execve of every candidate path.
    Exec,
}

impl Stage {
    /// For error messages.
    pub fn what(self) -> &'static str {
        match self {
            Stage::Clone => "clone",
            Stage::Chdir => "chdir",
            Stage::User => "set user",
            Stage::Stdio => "set up stdio",
            Stage::Exec => "exec",
        }
    }

    fn from_i32(n: i32) -> Stage {
        match n {
            1 => Stage::Chdir,
            2 => Stage::User,
            3 => Stage::Stdio,
            _ => Stage::Exec,
        }
    }
}

/// Data shared with the child (it runs on our memory until exec).
struct ChildArgs {
    paths: Vec<*const c_char>,
    argv: Vec<*const c_char>,
    envp: *const *const c_char,
    cwd: *const c_char,
    user: Option<(u32, u32)>,
    stdio: [RawFd; 3],
    cg_dir: *const c_char,
    cg_procs: *const c_char,
    reset_oom: bool,
    drop_ptrace: bool,
    ctty: bool,
    empty_mask: libc::sigset_t,
    /// errno of the failure; 0 if exec succeeded.
    err: AtomicI32,
    /// Stage of the failure.
    stage: AtomicI32,
    /// 1 if the child joined the cgroup.
    joined: AtomicI32,
}

/// CAP_SYS_PTRACE (linux/capability.h).
const CAP_SYS_PTRACE: u32 = 19;

/// Stack for the child until it execs (only `child_main` runs on it).
const CHILD_STACK: usize = 16 * 1024;

/// A started child.
pub struct Spawned {
    /// Its pid (also its session and process group id).
    pub pid: libc::pid_t,
    /// It joined the requested cgroup.
    pub in_cgroup: bool,
}

/// Starts the command; returns when it has exec'd (or failed to).
pub fn spawn(spec: &SpawnSpec<'_>) -> Result<Spawned, (Stage, Errno)> {
    if spec.envp.last().is_some_and(|p| !p.is_null()) || spec.envp.is_empty() {
        return Err((Stage::Exec, Errno(libc::EINVAL)));
    }
    let nul_terminated = pointers;
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut empty_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: empty_mask is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut empty_mask) };
    let args = ChildArgs {
        paths: spec.paths.iter().map(|p| p.as_ptr()).collect(),
        argv: nul_terminated(spec.argv),
        envp: spec.envp.as_ptr(),
        cwd: spec.cwd.map_or(std::ptr::null(), CStr::as_ptr),
        user: spec.user,
        stdio: spec.stdio,
        cg_dir: spec.cgroup.map_or(std::ptr::null(), |c| c.0.as_ptr()),
        cg_procs: spec.cgroup.map_or(std::ptr::null(), |c| c.1.as_ptr()),
        reset_oom: spec.reset_oom,
        drop_ptrace: spec.drop_ptrace,
        ctty: spec.ctty,
        empty_mask,
        err: AtomicI32::new(0),
        stage: AtomicI32::new(0),
        joined: AtomicI32::new(0),
    };
    let mut stack = MaybeUninit::<[u8; CHILD_STACK]>::uninit();
    let top = stack.as_mut_ptr().cast::<u8>().wrapping_add(CHILD_STACK);
    let top = top.wrapping_sub(top as usize % 16);
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    // SAFETY: `top` is the 16-byte aligned end of `stack`, which lives until
    // we return; CLONE_VFORK suspends us until the child has exec'd or
    // exited, so `args` (and everything its pointers borrow from `spec`)
    // outlives the child's use of it; child_main only reads `args`, stores
    // to its atomics and makes raw system calls.
    let pid = unsafe {
        libc::clone(
            child_main,
            top.cast(),
            flags,
            std::ptr::addr_of!(args).cast_mut().cast(),
        )
    };
    if pid < 0 {
        return Err((Stage::Clone, Errno::last()));
    }
    let err = args.err.load(Ordering::Acquire);
    if err != 0 {
        // The child has exited with 127; the SIGCHLD reaper collects it.
        return Err((
            Stage::from_i32(args.stage.load(Ordering::Acquire)),
            Errno(err),
        ));
    }
    Ok(Spawned {
        pid,
        in_cgroup: args.joined.load(Ordering::Acquire) == 1,
    })
}

/// Records a failure and exits the child.
fn fail(args: &ChildArgs, stage: i32, err: c_int) -> ! {
    args.stage.store(stage, Ordering::Release);
    args.err
        .store(if err == 0 { libc::EIO } else { err }, Ordering::Release);
    // SAFETY: _exit never returns and touches no shared state.
    unsafe { libc::_exit(127) }
}

/// openat(AT_FDCWD, path, O_WRONLY | O_CLOEXEC) as a raw system call
/// (musl's open adds an fcntl for O_CLOEXEC).
///
/// # Safety
/// `path` must be a NUL-terminated string.
unsafe fn open_raw(path: *const c_char) -> c_int {
    // SAFETY: the caller passes a NUL-terminated path.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path,
            libc::O_WRONLY | libc::O_CLOEXEC,
        )
    };
    c_int::try_from(r).unwrap_or(-1)
}

/// The cloned child.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` points at the parent's ChildArgs, alive and unmodified
    // while we run (the parent is suspended by CLONE_VFORK).
    let a = unsafe { &*arg.cast::<ChildArgs>() };
    let errno = crate::sys::errno;
    // SAFETY: every call below is a raw system call on data prepared by the
    // parent (NUL-terminated strings, NULL-terminated arrays, a valid
    // sigset); none allocates or takes a lock.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, &a.empty_mask, std::ptr::null_mut());
        libc::setsid();
        if !a.cg_dir.is_null() {
            libc::mkdir(a.cg_dir, 0o755);
            let fd = open_raw(a.cg_procs);
            if fd >= 0 && libc::write(fd, c"0".as_ptr().cast(), 1) == 1 {
                a.joined.store(1, Ordering::Release);
            }
        }
        if a.drop_ptrace {
            // Before anything else can fail: a command never runs with it.
            let cap = libc::c_ulong::from(CAP_SYS_PTRACE);
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno() != libc::EINVAL {
                fail(a, 2, errno());
            }
        }
        if a.reset_oom {
            let fd = open_raw(c"/proc/self/oom_score_adj".as_ptr());
            if fd >= 0 {
                libc::write(fd, c"0".as_ptr().cast(), 1);
            }
        }
        for (target, &fd) in a.stdio.iter().enumerate() {
            // The index of a 3-element array: 0, 1 or 2.
            #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
            let target = target as c_int;
            let r = if fd == target {
                // dup2(fd, fd) would keep O_CLOEXEC: clear it instead.
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, target)
            };
            if r < 0 {
                fail(a, 3, errno());
            }
        }
        if a.ctty && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
            fail(a, 3, errno());
        }
        if !a.cwd.is_null() && libc::chdir(a.cwd) != 0 {
            fail(a, 1, errno());
        }
        if let Some((uid, gid)) = a.user {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                fail(a, 2, errno());
            }
        }
        let mut last = libc::ENOENT;
        let mut saw_eacces = false;
        for &path in &a.paths {
            libc::execve(path, a.argv.as_ptr(), a.envp);
            last = errno();
            match last {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => saw_eacces = true,
                _ => break,
            }
        }
        if saw_eacces && matches!(last, libc::ENOENT | libc::ENOTDIR) {
            last = libc::EACCES;
        }
        fail(a, 4, last)
    }
}

/// NULL-terminated pointer array over `v` (valid while `v` is).
pub fn pointers(v: &[CString]) -> Vec<*const c_char> {
    v.iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Paths to try for `name`: itself if it contains a `/`, else one per
/// directory of `path_var` (a PATH value; empty entries mean the cwd).
pub fn candidate_paths(name: &[u8], path_var: &[u8]) -> Vec<CString> {
    if name.is_empty() {
        return Vec::new();
    }
    if name.contains(&b'/') {
        return CString::new(name).into_iter().collect();
    }
    path_var
        .split(|&b| b == b':')
        .filter_map(|dir| {
            let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
            let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
            p.extend_from_slice(dir);
            p.push(b'/');
            p.extend_from_slice(name);
            CString::new(p).ok()
        })
        .collect()
}
