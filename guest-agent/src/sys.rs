//! Thin helpers over raw libc calls: errno, console writes, error messages.

use std::ffi::{c_int, CStr};

/// The calling thread's errno.
pub fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// One write(2) call; retried only on EINTR. Returns the bytes written.
pub fn write_once(fd: c_int, buf: &[u8]) -> Result<usize, c_int> {
    loop {
        // SAFETY: buf is a valid readable slice of buf.len() bytes.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n.unsigned_abs());
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// Writes all of `buf` (normally a single write(2)); errors are dropped:
/// there is nowhere else to report them.
pub fn write_all(fd: c_int, mut buf: &[u8]) {
    while !buf.is_empty() {
        match write_once(fd, buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf = buf.get(n..).unwrap_or_default(),
        }
    }
}

/// `shoal-agent: <what>: <strerror>` on stderr, in one write.
pub fn report(what: &str, err: c_int) {
    let msg = format!(
        "shoal-agent: {what}: {}\n",
        std::io::Error::from_raw_os_error(err)
    );
    write_all(2, msg.as_bytes());
}

/// `shoal-agent: <what> <path>: <strerror>` on stderr, in one write.
pub fn report_path(what: &str, path: &CStr, err: c_int) {
    report(&format!("{what} {}", path.to_string_lossy()), err);
}

/// Opens /dev/console and makes it fds 0, 1 and 2.
pub fn open_console() {
    // No O_CLOEXEC: if this becomes fd 0 it must survive into the command.
    // SAFETY: the path is a NUL-terminated static string.
    let fd = unsafe { libc::open(c"/dev/console".as_ptr(), libc::O_RDWR) };
    if fd < 0 {
        return; // no console at all: nothing can be reported
    }
    for target in 0..3 {
        if fd != target {
            // SAFETY: dup2 on fds we own; it does not touch memory.
            unsafe { libc::dup2(fd, target) };
        }
    }
    if fd > 2 {
        // SAFETY: fd was opened above and is not one of 0-2.
        unsafe { libc::close(fd) };
    }
}
