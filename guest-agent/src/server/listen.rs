//! Transports: where the agent listens. Everything above this file only
//! sees accepted stream sockets (fds), so the protocol is the same on a Unix
//! socket (host tests) and on vsock (the guest).

use std::ffi::c_int;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::os::{Errno, SysResult};

/// A listening address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A Unix stream socket at this path (replaced if it exists).
    Unix(PathBuf),
    /// AF_VSOCK, any CID, this port.
    Vsock(u32),
}

impl ListenAddr {
    /// Parses `unix:PATH` or `vsock:PORT`.
    pub fn parse(s: &[u8]) -> Option<ListenAddr> {
        if let Some(p) = s.strip_prefix(b"unix:") {
            if p.is_empty() {
                return None;
            }
            return Some(ListenAddr::Unix(PathBuf::from(
                std::ffi::OsStr::from_bytes(p),
            )));
        }
        let port = s.strip_prefix(b"vsock:")?;
        std::str::from_utf8(port)
            .ok()?
            .parse()
            .ok()
            .map(ListenAddr::Vsock)
    }

    /// Creates the listening socket.
    pub fn bind(&self) -> SysResult<OwnedFd> {
        match self {
            ListenAddr::Unix(path) => bind_unix(path),
            ListenAddr::Vsock(port) => bind_vsock(*port),
        }
    }

    /// Whether accepted sockets are AF_UNIX (their send buffer is raised
    /// per connection; vsock sockets inherit the listener's buffer size).
    pub fn is_unix(&self) -> bool {
        matches!(self, ListenAddr::Unix(_))
    }
}

fn socket(domain: c_int) -> SysResult<OwnedFd> {
    // SAFETY: no pointers.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

fn listen(fd: &OwnedFd) -> SysResult<()> {
    // SAFETY: plain syscall.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// `size_of::<T>()` as a `socklen_t`, for the fixed-size addresses and
/// option values handed to the kernel.
fn socklen<T>() -> libc::socklen_t {
    // At most a sockaddr_un (110 bytes): far below u32::MAX.
    #[allow(clippy::cast_possible_truncation)]
    let n = std::mem::size_of::<T>() as libc::socklen_t;
    n
}

/// An address family as `sa_family_t` (the AF_ constants are small
/// positive ints: AF_UNIX 1, AF_VSOCK 40).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
const fn family(af: c_int) -> libc::sa_family_t {
    af as libc::sa_family_t
}

fn bind_unix(path: &std::path::Path) -> SysResult<OwnedFd> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    addr.sun_family = family(libc::AF_UNIX);
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = libc::c_char::from_ne_bytes([*s]);
    }
    let fd = socket(libc::AF_UNIX)?;
    let _ = std::fs::remove_file(path);
    let len = socklen::<libc::sockaddr_un>();
    // SAFETY: addr is a valid sockaddr_un of `len` bytes.
    let r = unsafe { libc::bind(fd.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) };
    if r != 0 {
        return Err(Errno::last());
    }
    listen(&fd)?;
    Ok(fd)
}

/// SO_VM_SOCKETS_BUFFER_SIZE and _MAX_SIZE (linux/vm_sockets.h).
const SO_VM_SOCKETS_BUFFER_SIZE: c_int = 0;
const SO_VM_SOCKETS_BUFFER_MAX_SIZE: c_int = 2;
/// Receive buffer for vsock connections (the kernel default is 256 KiB):
/// lets the host push a whole 1 MiB frame before the agent reads.
const VSOCK_BUFFER: u64 = 4 << 20;

fn bind_vsock(port: u32) -> SysResult<OwnedFd> {
    let fd = socket(libc::AF_VSOCK)?;
    let size: u64 = VSOCK_BUFFER;
    for opt in [SO_VM_SOCKETS_BUFFER_MAX_SIZE, SO_VM_SOCKETS_BUFFER_SIZE] {
        // SAFETY: the option value is a u64 of the given size. Failure only
        // leaves the default buffer size.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::AF_VSOCK,
                opt,
                std::ptr::addr_of!(size).cast(),
                socklen::<u64>(),
            )
        };
    }
    // SAFETY: sockaddr_vm is plain data; zero is valid.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = family(libc::AF_VSOCK);
    addr.svm_port = port;
    addr.svm_cid = libc::VMADDR_CID_ANY;
    let len = socklen::<libc::sockaddr_vm>();
    // SAFETY: addr is a valid sockaddr_vm of `len` bytes.
    let r = unsafe { libc::bind(fd.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) };
    if r != 0 {
        return Err(Errno::last());
    }
    listen(&fd)?;
    Ok(fd)
}

/// Send buffer asked for on accepted Unix sockets: a 1 MiB frame and more
/// fits in one non-blocking send.
const UNIX_SNDBUF: c_int = 4 << 20;

/// Longest wait for the rest of a frame whose start has arrived (500 ms).
const RECV_TIMEOUT_US: i32 = 500_000;

/// accept4(SOCK_CLOEXEC); sets SO_RCVTIMEO; raises the send buffer of Unix sockets (one
/// setsockopt: SO_SNDBUFFORCE works for root, else nothing is changed).
pub fn accept(listener: &OwnedFd, unix: bool) -> SysResult<OwnedFd> {
    // SAFETY: NULL address pointers are allowed.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a new fd we own.
    let fd: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
    // SAFETY: timeval is plain data; zero is valid.
    let mut timeout: libc::timeval = unsafe { std::mem::zeroed() };
    timeout.tv_usec = RECV_TIMEOUT_US.into();
    // SAFETY: the value is a timeval of the given size. Bounds how long a
    // blocking MSG_WAITALL read for the rest of a frame can stall the loop.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            std::ptr::addr_of!(timeout).cast(),
            socklen::<libc::timeval>(),
        )
    };
    if unix {
        let size: c_int = UNIX_SNDBUF;
        // SAFETY: the value is an int of the given size; failure is fine.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUFFORCE,
                std::ptr::addr_of!(size).cast(),
                socklen::<c_int>(),
            )
        };
    }
    Ok(fd)
}
