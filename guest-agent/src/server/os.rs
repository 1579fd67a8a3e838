//! Thin, safe wrappers over the raw system calls the server uses. Each
//! wrapper is exactly one system call (the server counts them).

use std::ffi::{c_int, CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A Linux errno value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's errno.
    pub fn last() -> Errno {
        Errno(crate::sys::errno())
    }

    /// strerror text.
    pub fn text(self) -> String {
        std::io::Error::from_raw_os_error(self.0).to_string()
    }
}

/// Result of a system call.
pub type SysResult<T> = Result<T, Errno>;

fn cvt(r: c_int) -> SysResult<c_int> {
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: isize) -> SysResult<usize> {
    usize::try_from(r).map_err(|_| Errno::last())
}

/// Takes ownership of a new fd returned by a system call.
fn owned(r: c_int) -> SysResult<OwnedFd> {
    let fd = cvt(r)?;
    // SAFETY: the kernel just returned this fd to us and nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A path or argument as a C string; NUL bytes inside are EINVAL.
pub fn cstring(bytes: &[u8]) -> SysResult<CString> {
    CString::new(bytes).map_err(|_| Errno(libc::EINVAL))
}

/// epoll instance.
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// epoll_create1(EPOLL_CLOEXEC).
    pub fn new() -> SysResult<Epoll> {
        // SAFETY: no pointers involved.
        let fd = owned(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Epoll { fd })
    }

    fn ctl(&self, op: c_int, fd: RawFd, events: u32, token: u64) -> SysResult<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: ev is a valid epoll_event; the fds are plain integers.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) }).map(drop)
    }

    /// EPOLL_CTL_ADD.
    pub fn add(&self, fd: RawFd, events: u32, token: u64) -> SysResult<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token)
    }

    /// EPOLL_CTL_MOD.
    pub fn modify(&self, fd: RawFd, events: u32, token: u64) -> SysResult<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, token)
    }

    /// EPOLL_CTL_DEL.
    pub fn delete(&self, fd: RawFd) -> SysResult<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// epoll_wait; EINTR counts as zero events.
    pub fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: c_int) -> usize {
        let max = c_int::try_from(events.len()).unwrap_or(c_int::MAX);
        // SAFETY: events is a writable array of `max` epoll_events.
        let n =
            unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), max, timeout_ms) };
        usize::try_from(n).unwrap_or(0)
    }
}

/// pipe2(O_CLOEXEC): (read end, write end).
pub fn pipe() -> SysResult<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: fds is a writable array of two ints.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both fds are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// openpty(3) of `cols` x `rows`: (master, slave), both close-on-exec.
pub fn openpty(cols: u16, rows: u16) -> SysResult<(OwnedFd, OwnedFd)> {
    let (mut m, mut s): (c_int, c_int) = (-1, -1);
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: m and s are writable ints, no name buffer or termios is
    // passed, and ws is a valid winsize.
    cvt(unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) })?;
    // SAFETY: openpty succeeded, so both fds are new and ours.
    let (m, s) = unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
    for fd in [&m, &s] {
        // SAFETY: plain fcntl on an open fd.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) })?;
    }
    Ok((m, s))
}

/// ioctl(TIOCSWINSZ): a terminal's size.
pub fn set_winsize(fd: BorrowedFd<'_>, cols: u16, rows: u16) -> SysResult<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: ioctl on an open fd with a valid winsize.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) }).map(drop)
}

/// fcntl(F_SETFL, O_NONBLOCK) (replaces the other status flags, which are
/// none on our pipes).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> SysResult<()> {
    // SAFETY: plain fcntl on an open fd.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) }).map(drop)
}

/// fcntl(F_SETPIPE_SZ).
pub fn set_pipe_size(fd: BorrowedFd<'_>, size: c_int) -> SysResult<()> {
    // SAFETY: plain fcntl on an open fd.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, size) }).map(drop)
}

/// One read(2) into `buf`.
/// The `poll(2)` events `fd` has now (`POLLIN`, `POLLHUP`, ...), without
/// waiting; none on error.
pub fn ready_now(fd: BorrowedFd<'_>) -> i16 {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n == 1 {
        p.revents
    } else {
        0
    }
}

pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: buf is writable for buf.len() bytes.
    cvt_size(unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// One read(2) (or recv(MSG_DONTWAIT) if `socket`) appending at most `max`
/// bytes to `buf` without initialising its spare capacity first (so only
/// the pages the kernel writes get touched).
pub fn read_append(
    fd: BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    max: usize,
    socket: bool,
) -> SysResult<usize> {
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let n = spare.len().min(max);
    let ptr = spare.as_mut_ptr().cast::<libc::c_void>();
    let r = if socket {
        // SAFETY: ptr is writable for n bytes (spare capacity of buf).
        unsafe { libc::recv(fd.as_raw_fd(), ptr, n, libc::MSG_DONTWAIT) }
    } else {
        // SAFETY: as above.
        unsafe { libc::read(fd.as_raw_fd(), ptr, n) }
    };
    let got = cvt_size(r)?;
    let new_len = buf.len() + got.min(n);
    // SAFETY: the kernel initialised `got` (<= n) bytes after the old
    // length, all within the capacity.
    unsafe { buf.set_len(new_len) };
    Ok(got)
}

/// One blocking recv(MSG_WAITALL) appending exactly `n` bytes to `buf`
/// (fewer if SO_RCVTIMEO expires or the peer closes).
pub fn recv_waitall(fd: BorrowedFd<'_>, buf: &mut Vec<u8>, n: usize) -> SysResult<usize> {
    buf.reserve(n);
    let spare = buf.spare_capacity_mut();
    let n = spare.len().min(n);
    // SAFETY: the pointer is writable for n bytes (spare capacity of buf).
    let r = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            spare.as_mut_ptr().cast(),
            n,
            libc::MSG_WAITALL,
        )
    };
    let got = cvt_size(r)?;
    let new_len = buf.len() + got.min(n);
    // SAFETY: the kernel initialised `got` (<= n) bytes after the old
    // length, within the capacity.
    unsafe { buf.set_len(new_len) };
    Ok(got)
}

/// One write(2).
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> SysResult<usize> {
    // SAFETY: buf is readable for buf.len() bytes.
    cvt_size(unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) })
}

/// write(2) until all of `buf` is written (a regular file takes it in one).
pub fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> SysResult<()> {
    while !buf.is_empty() {
        match write(fd, buf) {
            Ok(0) => return Err(Errno(libc::EIO)),
            Ok(n) => buf = buf.get(n..).unwrap_or_default(),
            Err(Errno(libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One send(MSG_DONTWAIT | MSG_NOSIGNAL).
pub fn send(fd: BorrowedFd<'_>, buf: &[u8]) -> SysResult<usize> {
    // SAFETY: buf is readable for buf.len() bytes.
    cvt_size(unsafe {
        libc::send(
            fd.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    })
}

/// openat(AT_FDCWD) with O_CLOEXEC added, as a raw system call: musl's
/// open() follows O_CLOEXEC with a redundant fcntl (for kernels before
/// 2.6.23), one more system call per file.
pub fn open(path: &CStr, flags: c_int, mode: libc::mode_t) -> SysResult<OwnedFd> {
    // SAFETY: path is NUL-terminated; the kernel reads it and returns an fd.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode,
        )
    };
    owned(c_int::try_from(r).unwrap_or(-1))
}

/// Writes a small string to a file (open, write, close): for /proc, /sys.
pub fn write_file(path: &CStr, data: &[u8]) -> SysResult<()> {
    let fd = open(path, libc::O_WRONLY, 0)?;
    write(fd_ref(&fd), data).map(drop)
}

/// Borrows an owned fd.
pub fn fd_ref(fd: &OwnedFd) -> BorrowedFd<'_> {
    use std::os::fd::AsFd;
    fd.as_fd()
}

/// mkdir(2).
pub fn mkdir(path: &CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: path is NUL-terminated.
    cvt(unsafe { libc::mkdir(path.as_ptr(), mode) }).map(drop)
}

/// rmdir(2).
pub fn rmdir(path: &CStr) -> SysResult<()> {
    // SAFETY: path is NUL-terminated.
    cvt(unsafe { libc::rmdir(path.as_ptr()) }).map(drop)
}

/// unlinkat(2).
pub fn unlinkat(dir: RawFd, name: &CStr, flags: c_int) -> SysResult<()> {
    // SAFETY: name is NUL-terminated; dir is an fd or AT_FDCWD.
    cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) }).map(drop)
}

/// rename(2).
pub fn rename(from: &CStr, to: &CStr) -> SysResult<()> {
    // SAFETY: both paths are NUL-terminated.
    cvt(unsafe { libc::rename(from.as_ptr(), to.as_ptr()) }).map(drop)
}

/// chmod(2).
pub fn chmod(path: &CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: path is NUL-terminated.
    cvt(unsafe { libc::chmod(path.as_ptr(), mode) }).map(drop)
}

/// fchmod(2).
pub fn fchmod(fd: BorrowedFd<'_>, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: plain syscall on an open fd.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }).map(drop)
}

/// fstatat(2) relative to the cwd.
pub fn stat(path: &CStr, nofollow: bool) -> SysResult<libc::stat> {
    // SAFETY: stat is plain data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = if nofollow {
        libc::AT_SYMLINK_NOFOLLOW
    } else {
        0
    };
    // SAFETY: path is NUL-terminated; st is a valid out pointer.
    cvt(unsafe { libc::fstatat(libc::AT_FDCWD, path.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// fstat(2).
pub fn fstat(fd: BorrowedFd<'_>) -> SysResult<libc::stat> {
    // SAFETY: stat is plain data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out pointer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// lseek(SEEK_SET).
pub fn seek(fd: BorrowedFd<'_>, offset: u64) -> SysResult<()> {
    let off = libc::off_t::try_from(offset).map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: plain syscall.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), off, libc::SEEK_SET) };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// One getdents64 into `buf`; returns the bytes filled (0 at the end).
pub fn getdents(fd: BorrowedFd<'_>, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: buf is writable for buf.len() bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    usize::try_from(r).map_err(|_| Errno::last())
}

/// kill(2).
pub fn kill(pid: libc::pid_t, sig: c_int) -> SysResult<()> {
    // SAFETY: plain syscall.
    cvt(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// waitpid(-1, WNOHANG): Some((pid, status)) for a reaped child.
pub fn reap_one() -> Option<(libc::pid_t, c_int)> {
    let mut status: c_int = 0;
    // SAFETY: status is a valid out pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    (pid > 0).then_some((pid, status))
}

/// Blocks SIGCHLD and SIGPIPE and returns a signalfd for SIGCHLD. Blocked
/// SIGPIPE makes writes to a closed pipe or socket fail with EPIPE; children
/// get an empty mask back before exec.
pub fn block_signals_signalfd() -> SysResult<OwnedFd> {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid sigset_t for all calls.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::sigdelset(&mut set, libc::SIGPIPE);
    }
    // SAFETY: set is initialised; -1 asks for a new fd.
    owned(unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) })
}

/// Makes sure fds 0-2 are open (on /dev/null if not), so no pipe or socket
/// we create lands there and gets clobbered by a child's dup2.
pub fn ensure_std_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD on any integer is harmless.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            // SAFETY: static NUL-terminated path; lands on the lowest free
            // fd, which is `fd` since lower ones are open.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}
