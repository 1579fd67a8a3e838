//! The VMM's readiness pipe: `shoal-vmm --ready-fd N` writes "ready\n" on
//! an inherited pipe once its vCPUs run, so whoever starts it waits on one
//! descriptor instead of polling the control socket; EOF without "ready"
//! means the VMM ended first.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::{Child, Command};
use std::time::Duration;

/// The descriptor number the pipe's write end gets in the VMM.
pub const READY_FD: i32 = 3;

/// How waiting on the pipe ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// The VMM reported its vCPUs running.
    Ready,
    /// The pipe closed without the report: the VMM ended (or gave it up).
    Ended,
    /// Nothing within the time allowed.
    TimedOut,
}

/// The read end, kept by the starter.
#[derive(Debug)]
pub struct ReadyPipe {
    read: File,
}

impl ReadyPipe {
    /// Spawns `cmd` (the VMM) with the write end of a new pipe as
    /// descriptor [`READY_FD`]; the command must already tell the VMM to
    /// use it (`--ready-fd 3`: [`crate::vmm_process::VmmProcess::ready_pipe`]).
    /// `also` runs in the child before exec too (it must be
    /// async-signal-safe, e.g. `setsid`). This process keeps only the read
    /// side, so EOF comes when the child closes its end.
    pub fn spawn(
        cmd: &mut Command,
        also: Option<fn() -> std::io::Result<()>>,
    ) -> std::io::Result<(Child, Self)> {
        use std::os::unix::process::CommandExt;
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: two new descriptors that nothing else owns.
        let (read, write) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let w = write.as_raw_fd();
        // SAFETY: between fork and exec the closure only calls dup2/fcntl
        // (async-signal-safe) on a descriptor this process owns, then
        // `also`, which callers keep to async-signal-safe calls; the child
        // then holds the pipe's write end as READY_FD without close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                let r = if w == READY_FD {
                    libc::fcntl(w, libc::F_SETFD, 0)
                } else {
                    libc::dup2(w, READY_FD)
                };
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                also.map_or(Ok(()), |f| f())
            })
        };
        let child = cmd.spawn()?;
        drop(write);
        Ok((child, Self { read }))
    }

    /// The read end of a pipe whose write end the starter hands the VMM
    /// itself (as [`READY_FD`]).
    pub(crate) fn from_read(read: File) -> Self {
        Self { read }
    }

    /// Waits up to `timeout` for the report.
    pub fn wait(&mut self, timeout: Duration) -> Readiness {
        let mut pfd = libc::pollfd {
            fd: self.read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        loop {
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                return Readiness::TimedOut;
            }
            let mut b = [0u8; 6];
            let got = std::io::Read::read(&mut self.read, &mut b).unwrap_or(0);
            return if got > 0 && b.starts_with(b"ready") {
                Readiness::Ready
            } else {
                Readiness::Ended
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    /// A shell stands in for the VMM: it writes to fd 3 or not.
    fn run(script: &str, timeout: Duration) -> Readiness {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).stdout(Stdio::null());
        let (mut child, mut pipe) = ReadyPipe::spawn(&mut cmd, None).unwrap();
        let r = pipe.wait(timeout);
        let _ = child.kill();
        let _ = child.wait();
        r
    }

    #[test]
    fn reports_ready_ended_and_timeout() {
        let t = Duration::from_secs(5);
        assert_eq!(run("echo ready >&3; sleep 2", t), Readiness::Ready);
        assert_eq!(run("exit 1", t), Readiness::Ended);
        assert_eq!(
            run("sleep 5", Duration::from_millis(100)),
            Readiness::TimedOut
        );
    }
}
