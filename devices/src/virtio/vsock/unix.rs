//! The few Unix-socket calls std does not offer: a connect that never
//! blocks, and sends that never raise SIGPIPE.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use vm_memory::VolatileSlice;

/// Connects a non-blocking, close-on-exec stream socket to `path`. A Unix
/// connect either completes at once or fails (`EAGAIN` when the listener's
/// backlog is full), so this never waits.
pub fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    // SAFETY: `sockaddr_un` is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let bytes = path.as_os_str().as_bytes();
    // Keep a terminating NUL: the path must be strictly shorter than sun_path.
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    addr.sun_family = libc::sa_family_t::try_from(libc::AF_UNIX)
        .map_err(|_| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))?;
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = libc::c_char::from_ne_bytes([src]);
    }
    // SAFETY: plain syscall with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket() and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_un>())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `addr` is a fully initialised sockaddr_un that outlives the
    // call, and `len` is its size; `fd` is a valid socket.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
            len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}

/// One non-blocking `send` of `buf`; a closed peer yields `EPIPE`, never a
/// signal.
pub fn send(stream: &UnixStream, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a live slice of `buf.len()` bytes the kernel only reads.
    let n = unsafe {
        libc::send(
            stream.as_raw_fd(),
            buf.as_ptr().cast::<libc::c_void>(),
            buf.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// [`send`] straight from guest memory.
pub fn send_volatile(stream: &UnixStream, buf: &VolatileSlice<'_, ()>) -> io::Result<usize> {
    let guard = buf.ptr_guard();
    // SAFETY: the guard keeps `buf.len()` bytes of mapped guest memory valid
    // for the call; the kernel only reads them. The guest may change them
    // concurrently, which only affects the bytes it sends itself.
    let n = unsafe {
        libc::send(
            stream.as_raw_fd(),
            guard.as_ptr().cast::<libc::c_void>(),
            buf.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    #[test]
    fn connect_and_send() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        let l = UnixListener::bind(&p).unwrap();
        let s = connect_nonblocking(&p).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        assert_eq!(send(&s, b"hi").unwrap(), 2);
        let mut b = [0u8; 2];
        peer.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hi");
        drop(peer);
        // A closed peer is an error, not a signal.
        assert!(send(&s, b"x").is_err() || send(&s, b"x").is_err());
    }

    #[test]
    fn connect_failures() {
        let dir = tempfile::tempdir().unwrap();
        assert!(connect_nonblocking(&dir.path().join("none")).is_err());
        let long = dir.path().join("x".repeat(200));
        assert!(connect_nonblocking(&long).is_err());
        assert!(connect_nonblocking(Path::new("")).is_err());
    }
}
