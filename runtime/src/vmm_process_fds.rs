//! Descriptors a VMM inherits on purpose, at fixed numbers: pmem images
//! opened by its starter (`--pmem fd:N=NAME`), and the readiness pipe when
//! any are passed. Everything else the starter holds is close-on-exec; a
//! jailer that closes every descriptor not listed keeps
//! [`super::VmmProcess::kept_fds`].

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::process::Command;
use std::sync::Arc;

/// The number the first passed descriptor gets in the VMM (3 is the
/// readiness pipe's; a few are left free between).
pub const FIRST_PASSED_FD: RawFd = 10;

/// One descriptor for the VMM, at `target`.
#[derive(Debug, Clone)]
pub struct PassedFd {
    /// Its number in the VMM.
    pub target: RawFd,
    /// The open file (this process's descriptor, close-on-exec).
    pub file: Arc<File>,
}

impl PartialEq for PassedFd {
    fn eq(&self, o: &Self) -> bool {
        self.target == o.target && Arc::ptr_eq(&self.file, &o.file)
    }
}

/// Makes `cmd`'s child hold each of `fds` at its target, without
/// close-on-exec, then run `also` (async-signal-safe, e.g. `setsid`).
/// Every source is first copied above the highest target, so no target can
/// overwrite a source still to be placed, whatever the numbers. The command
/// holds the files until it is dropped.
pub(super) fn install(
    cmd: &mut Command,
    fds: Vec<PassedFd>,
    also: Option<fn() -> std::io::Result<()>>,
) {
    use std::os::unix::process::CommandExt;
    let pairs: Vec<(RawFd, RawFd)> = fds.iter().map(|p| (p.file.as_raw_fd(), p.target)).collect();
    let floor = pairs.iter().map(|&(_, t)| t).max().unwrap_or(2) + 1;
    // SAFETY: between fork and exec the closure only calls fcntl and dup2
    // (async-signal-safe) on descriptors this process holds, and `also`,
    // which callers keep async-signal-safe; it allocates nothing (`pairs`
    // was built before the fork, and is only read here).
    unsafe {
        cmd.pre_exec(move || {
            // The files stay open as long as the command (this closure).
            let _held = &fds;
            let mut tmp = [0 as RawFd; 64];
            if pairs.len() > tmp.len() {
                return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
            }
            for (i, &(src, _)) in pairs.iter().enumerate() {
                let t = libc::fcntl(src, libc::F_DUPFD_CLOEXEC, floor);
                if t < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                tmp[i] = t;
            }
            for (i, &(_, target)) in pairs.iter().enumerate() {
                // dup2 leaves close-on-exec off on `target`; the copies
                // above the floor close at exec.
                if libc::dup2(tmp[i], target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            also.map_or(Ok(()), |f| f())
        })
    };
}

/// A pipe for the readiness report: (read end, write end), both
/// close-on-exec here.
pub(super) fn ready_pipe() -> std::io::Result<(File, File)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: two new descriptors that nothing else owns.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// Opens a file to pass as a pmem image: read-only, no final symbolic
/// link, without blocking on a FIFO; `None` unless it is a regular file
/// (the VMM then opens the path and reports what is wrong with it).
pub fn open_image(path: &std::path::Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    f.metadata().ok().filter(|m| m.is_file())?;
    Some(f)
}
