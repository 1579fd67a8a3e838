//! Starting the command and reaping children.
//!
//! The command is started with `clone(CLONE_VM | CLONE_VFORK)`: the child
//! shares our memory until it execs, so nothing is copied and no
//! copy-on-write fault is taken (fork costs ~0.3 s under PVM). The child only
//! calls execve/_exit, which is what makes sharing the memory sound; an exec
//! failure is handed back through shared memory, not a pipe.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::sys::{errno, report};

/// Directories searched for a command name without a `/`.
const PATH_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Environment given to the command before the kernel's envp. These win over
/// kernel entries of the same name (the kernel always passes HOME=/).
pub(crate) const DEFAULT_ENV: &[&CStr] = &[
    c"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    c"HOME=/root",
    c"TERM=linux",
];

/// Stack of the cloned child until it execs; it only runs `child_main`
/// (no signal handlers are installed, so nothing else runs on it). It lives
/// in `run_command`'s frame: no mmap/munmap, only the pages used get touched.
const CHILD_STACK: usize = 8 * 1024;

/// Everything the child needs, prepared by the parent before the clone.
struct ChildArgs {
    /// NUL-terminated candidate paths, tried in order.
    paths: Vec<*const c_char>,
    argv: *const *const c_char,
    envp: *const *const c_char,
    /// errno of the failed exec; stays 0 if the exec succeeded.
    err: AtomicI32,
}

/// Runs the command `argv` (NULL-terminated, `argv[0]` non-NULL) on the
/// console, waits for it while reaping any other child, and returns its exit
/// code (128+signal if killed, 127 if it could not be started).
///
/// # Safety
/// `argv` and `envp` must be valid NULL-terminated arrays of NUL-terminated
/// strings (envp may be NULL), alive for the whole call.
pub unsafe fn run_command(argv: *const *const c_char, envp: *const *const c_char) -> i32 {
    // SAFETY: the caller guarantees argv[0] is a valid C string.
    let name = unsafe { CStr::from_ptr(*argv) };
    let candidates = candidate_paths(name);
    // SAFETY: the caller guarantees envp is NULL or a valid array.
    let env = unsafe { merge_env(envp) };
    let args = ChildArgs {
        paths: candidates.iter().map(|c| c.as_ptr()).collect(),
        argv,
        envp: env.as_ptr(),
        err: AtomicI32::new(0),
    };
    let mut stack = MaybeUninit::<[u8; CHILD_STACK]>::uninit();
    // Top of the stack, 16-byte aligned (x86_64 stacks grow down). The
    // memory is never read as Rust data, so it may stay uninitialised.
    let top = stack.as_mut_ptr().cast::<u8>().wrapping_add(CHILD_STACK);
    let top = top.wrapping_sub(top as usize % 16);

    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    // SAFETY: `top` is the aligned end of `stack`, live until we return;
    // `args` outlives the child's use of it because CLONE_VFORK suspends us
    // until the child has exec'd or exited; child_main only reads `args`,
    // stores to the atomic, and calls execve/_exit.
    let pid = unsafe {
        libc::clone(
            child_main,
            top.cast(),
            flags,
            std::ptr::addr_of!(args).cast_mut().cast(),
        )
    };
    if pid < 0 {
        report("clone", errno());
        return 127;
    }
    let exec_err = args.err.load(Ordering::Acquire);
    if exec_err != 0 {
        report(&format!("exec {}", name.to_string_lossy()), exec_err);
    }
    wait_for(pid)
}

/// The cloned child: tries each candidate path like execvp(3) would.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` points at the parent's ChildArgs, which stays alive and
    // unmodified while we run (the parent is suspended by CLONE_VFORK).
    let args = unsafe { &*arg.cast::<ChildArgs>() };
    let mut last = libc::ENOENT;
    let mut saw_eacces = false;
    for &path in &args.paths {
        // SAFETY: path, argv and envp are valid NULL-terminated C data.
        unsafe { libc::execve(path, args.argv, args.envp) };
        last = errno();
        match last {
            libc::ENOENT | libc::ENOTDIR => {}
            libc::EACCES => saw_eacces = true,
            _ => break, // e.g. ENOEXEC, ENOMEM: the file exists, stop here
        }
    }
    if saw_eacces && matches!(last, libc::ENOENT | libc::ENOTDIR) {
        last = libc::EACCES;
    }
    args.err.store(last, Ordering::Release);
    // SAFETY: _exit never returns and touches no shared state.
    unsafe { libc::_exit(127) }
}

/// Paths to try for `name`: itself if it contains a `/`, else one per PATH
/// directory.
fn candidate_paths(name: &CStr) -> Vec<CString> {
    let bytes = name.to_bytes();
    if bytes.is_empty() {
        return Vec::new(); // execvp("") fails with ENOENT
    }
    if bytes.contains(&b'/') {
        return vec![name.to_owned()];
    }
    PATH_DIRS
        .iter()
        .filter_map(|dir| {
            let mut p = Vec::with_capacity(dir.len() + 1 + bytes.len());
            p.extend_from_slice(dir.as_bytes());
            p.push(b'/');
            p.extend_from_slice(bytes);
            CString::new(p).ok() // cannot fail: no NUL in either part
        })
        .collect()
}

/// DEFAULT_ENV followed by the kernel's entries whose names it doesn't set;
/// NULL-terminated. The pointers borrow statics and the kernel's envp.
///
/// # Safety
/// `envp` must be NULL or a valid NULL-terminated array of C strings.
unsafe fn merge_env(envp: *const *const c_char) -> Vec<*const c_char> {
    let mut env: Vec<*const c_char> = DEFAULT_ENV.iter().map(|e| e.as_ptr()).collect();
    let mut p = envp;
    while !p.is_null() {
        // SAFETY: p points into the caller's NULL-terminated array.
        let entry = unsafe { *p };
        if entry.is_null() {
            break;
        }
        // SAFETY: each entry is a valid C string.
        let bytes = unsafe { CStr::from_ptr(entry) }.to_bytes();
        let key = bytes.split(|&b| b == b'=').next().unwrap_or_default();
        let overridden = DEFAULT_ENV.iter().any(|d| {
            let d = d.to_bytes();
            d.len() > key.len() && d.starts_with(key) && d.get(key.len()) == Some(&b'=')
        });
        if !overridden {
            env.push(entry);
        }
        // SAFETY: the entry was non-NULL, so the array continues.
        p = unsafe { p.add(1) };
    }
    env.push(std::ptr::null());
    env
}

/// Blocks in waitpid(-1) until `pid` exits, reaping any other child (orphans
/// reparented to PID 1) on the way. Returns the exit code or 128+signal.
fn wait_for(pid: libc::pid_t) -> i32 {
    loop {
        let mut status: c_int = 0;
        // SAFETY: status is a valid out pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r == pid {
            if libc::WIFSIGNALED(status) {
                return 128 + libc::WTERMSIG(status);
            }
            return libc::WEXITSTATUS(status);
        }
        if r < 0 {
            let e = errno();
            if e != libc::EINTR {
                report("waitpid", e);
                return 127;
            }
        }
    }
}

/// Reaps children forever without polling: blocking waitpid(-1) while there
/// are children; with none, sleeps in sigwaitinfo until SIGCHLD says an
/// orphan has exited. SIGCHLD is blocked so that it is queued for PID 1 (the
/// kernel drops unhandled, unblocked signals to init).
pub fn reap_forever() -> ! {
    // SAFETY: sigset_t is plain data, valid when zeroed; sigemptyset then
    // initialises it properly.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid sigset_t; sigprocmask gets valid pointers.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    loop {
        // SAFETY: a NULL status pointer is allowed.
        let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), 0) };
        if r < 0 && errno() == libc::ECHILD {
            // SAFETY: set is initialised; a NULL info pointer is allowed.
            unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        }
    }
}
