//! Sandbox VM processes as the daemon runs them: identified by pid and
//! start time (so a recycled pid is never taken for them), watched through
//! a pidfd, killed by pid only while the start time matches, and found by
//! the paths on their command lines; and the files of a sandbox directory.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// A sandbox directory's files.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The directory.
    pub dir: PathBuf,
    /// VMM control socket.
    pub api_sock: PathBuf,
    /// vsock host socket.
    pub vsock: PathBuf,
}

impl Paths {
    /// The files of the sandbox in `dir`.
    pub fn new(dir: &Path) -> Paths {
        Paths {
            dir: dir.into(),
            api_sock: dir.join("api.sock"),
            vsock: dir.join("vsock.sock"),
        }
    }

    /// The newest pause snapshot in the directory, if any.
    pub fn latest_snapshot(&self) -> Option<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("snap-"))
                    && p.join("state").is_file()
            })
            .collect();
        v.sort();
        v.pop()
    }

    /// A new pause snapshot directory name (sorts after older ones).
    pub fn new_snapshot(&self) -> PathBuf {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        self.dir.join(format!("snap-{ms:016}"))
    }
}

/// A VMM process: pid and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    /// Process id.
    pub pid: i32,
    /// Start time (clock ticks since boot).
    pub start: u64,
}

/// The pid of a process this one started.
pub fn pid_of(child: &std::process::Child) -> i32 {
    // Linux pids are at most PID_MAX_LIMIT (2^22): they fit an i32.
    #[allow(clippy::cast_possible_wrap)]
    let pid = child.id() as i32;
    pid
}

/// Field 22 (starttime) of /proc/PID/stat.
pub fn pid_start(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields resume
    // after the last ')'; field 3 is the first there, so 22 is the 20th.
    s.get(s.rfind(')')? + 1..)?
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

impl Proc {
    /// Whether this very process still exists (not a zombie).
    pub fn alive(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        let zombie = stat
            .rfind(')')
            .and_then(|i| stat.get(i + 1..))
            .and_then(|r| r.split_whitespace().next())
            == Some("Z");
        !zombie && pid_start(self.pid) == Some(self.start)
    }

    /// SIGKILL, only if the pid is still this process.
    pub fn kill(&self) {
        self.signal(libc::SIGKILL);
    }

    /// Sends `sig`, only if the pid is still this process.
    pub fn signal(&self, sig: i32) {
        if pid_start(self.pid) == Some(self.start) {
            // SAFETY: kill(2) on a pid whose start time we just checked.
            unsafe { libc::kill(self.pid, sig) };
        }
    }

    /// Reaps it if it is our child and has exited (no-op otherwise);
    /// returns how it ended when this call reaped it.
    pub fn reap(&self) -> Option<ExitStatus> {
        let mut st = 0;
        // SAFETY: waitpid with WNOHANG on one pid; `st` is a valid local.
        let r = unsafe { libc::waitpid(self.pid, &mut st, libc::WNOHANG) };
        (r == self.pid).then(|| ExitStatus::from_raw(st))
    }

    /// A pidfd for it (readable once it exits), checked against the start
    /// time after opening so it cannot refer to a recycled pid.
    pub fn pidfd(&self) -> std::io::Result<OwnedFd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the syscall returned a new fd that nothing else owns.
        let fd = unsafe {
            OwnedFd::from_raw_fd(
                i32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?,
            )
        };
        if pid_start(self.pid) != Some(self.start) {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(fd)
    }

    /// Waits up to `timeout` for it to end (then SIGKILLs it); returns
    /// how it ended if this process reaped it.
    pub fn wait_gone(&self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        let mut status = None;
        while self.alive() && Instant::now() < end {
            status = status.or(self.reap());
            std::thread::sleep(Duration::from_millis(2));
        }
        if self.alive() {
            self.kill();
        }
        status.or(self.reap())
    }
}

/// How a VMM process ended, for error messages: a death by SIGSYS is
/// its seccomp filter killing it.
pub fn exit_cause(status: ExitStatus) -> String {
    match status.signal() {
        Some(libc::SIGSYS) => "shoal-vmm killed by seccomp (SIGSYS): a VMM thread made a system \
             call its filter does not allow (the kernel log's audit type=1326 line names the \
             thread and the call; `shoal-vmm --no-seccomp` runs without filters)"
            .into(),
        Some(sig) => format!("shoal-vmm killed by signal {sig}"),
        None => format!(
            "shoal-vmm exited with status {}",
            status.code().unwrap_or(-1)
        ),
    }
}

/// `last_words`, led by how the process ended when that is known.
pub fn with_exit_cause(status: Option<ExitStatus>, last_words: &str) -> String {
    match (status.map(exit_cause), last_words.is_empty()) {
        (Some(c), true) => c,
        (Some(c), false) => format!("{c}; {last_words}"),
        (None, _) => last_words.into(),
    }
}

/// The parent pid of process `pid`.
pub fn parent_of(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.get(s.rfind(')')? + 1..)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `shoal-vmm` processes whose command line names a path under `root`.
pub fn vmms_under(root: &Path) -> Vec<Proc> {
    processes_under(root, "shoal-vmm")
}

/// Processes whose program name (argv\[0\]) ends in `program` and one of
/// whose arguments is a path under `root` (or `KIND:PATH` with one), compared by components (so
/// `/x/state` does not claim the VMMs of `/x/state2`, another daemon's
/// state directory): (pid, start time).
pub fn processes_under(root: &Path, program: &str) -> Vec<Proc> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let mut args = cmd.split(|b| *b == 0);
        let is_it = args.next().is_some_and(|a| a.ends_with(program.as_bytes()));
        // A path, or a `KIND:PATH` value (`unix:/…`, `file:/…`).
        let under = |a: &[u8]| {
            let after = a.iter().position(|b| *b == b':').map(|i| &a[i + 1..]);
            [Some(a), after]
                .into_iter()
                .flatten()
                .any(|p| Path::new(std::ffi::OsStr::from_bytes(p)).starts_with(root))
        };
        if is_it && args.any(under) {
            if let Some(start) = pid_start(pid) {
                out.push(Proc { pid, start });
            }
        }
    }
    out
}

/// The last `n` lines of the log file `path`, joined with `sep` (empty if
/// it cannot be read): a process's last words for error messages.
pub fn log_tail(path: &Path, n: usize, sep: &str) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().rev().take(n).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(sep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sigsys_death_is_reported_as_a_seccomp_kill() {
        let sys = ExitStatus::from_raw(libc::SIGSYS);
        assert!(exit_cause(sys).starts_with("shoal-vmm killed by seccomp (SIGSYS)"));
        assert_eq!(
            exit_cause(ExitStatus::from_raw(libc::SIGKILL)),
            "shoal-vmm killed by signal 9"
        );
        assert_eq!(
            exit_cause(ExitStatus::from_raw(1 << 8)),
            "shoal-vmm exited with status 1"
        );
        assert_eq!(with_exit_cause(None, "last"), "last");
        assert!(with_exit_cause(Some(sys), "last").ends_with("; last"));
        // A real child killed by SIGSYS, reaped through its Proc.
        #[allow(clippy::zombie_processes)] // reaped by wait_gone below
        let child = Command::new("sh")
            .args(["-c", "kill -SYS $$"])
            .spawn()
            .unwrap();
        let p = Proc {
            pid: pid_of(&child),
            start: pid_start(pid_of(&child)).unwrap_or(0),
        };
        let st = p.wait_gone(Duration::from_secs(10)).expect("reaped");
        assert_eq!(st.signal(), Some(libc::SIGSYS));
    }

    #[test]
    fn log_tail_keeps_the_last_lines_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.log");
        assert_eq!(log_tail(&f, 3, " | "), "", "a missing log is empty");
        std::fs::write(&f, "a\nb\nc\nd\n").unwrap();
        assert_eq!(log_tail(&f, 3, " | "), "b | c | d");
        assert_eq!(log_tail(&f, 9, "\n"), "a\nb\nc\nd");
    }
    use std::process::Command;

    #[test]
    fn own_start_time_and_liveness() {
        let me = i32::try_from(std::process::id()).unwrap();
        let start = pid_start(me).expect("own start time");
        let p = Proc { pid: me, start };
        assert!(p.alive());
        assert!(
            !Proc {
                pid: me,
                start: start + 1
            }
            .alive(),
            "start time mismatch means another process"
        );
        assert!(p.pidfd().is_ok());
    }

    /// A daemon whose state directory is a prefix of another's
    /// (`/x/state` and `/x/state2`) must not take the other's VMMs for its
    /// own (argument paths are matched by components, not by substring).
    #[test]
    fn a_prefix_state_dir_does_not_claim_another_daemons_vmm() {
        let dir = tempfile::tempdir().unwrap();
        let (mine, other) = (dir.path().join("state"), dir.path().join("state2"));
        let fake = dir.path().join("bin/shoal-vmm");
        let mut c = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "exec -a {} /bin/sh -c 'sleep 30; :' x --api-sock {}/sandboxes/x/api.sock",
                fake.display(),
                other.display()
            ))
            .spawn()
            .unwrap();
        let pid = pid_of(&c);
        // Found under its own state directory ...
        let end = Instant::now() + Duration::from_secs(5);
        while !processes_under(&other, "shoal-vmm")
            .iter()
            .any(|p| p.pid == pid)
        {
            assert!(
                Instant::now() < end,
                "the VMM is found under its own state dir"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // ... and not under the prefix.
        let claimed = processes_under(&mine, "shoal-vmm")
            .iter()
            .any(|p| p.pid == pid);
        let _ = c.kill();
        let _ = c.wait();
        assert!(
            !claimed,
            "{} claimed a VMM of {}",
            mine.display(),
            other.display()
        );
    }

    #[test]
    fn finds_and_kills_a_fake_vmm_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("bin/shoal-vmm");
        // argv[0] ends in shoal-vmm and an argument names a path under dir.
        let mut c = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "exec -a {} /bin/sh -c 'sleep 30; :' {}/sandboxes/x/api.sock",
                fake.display(),
                dir.path().display()
            ))
            .spawn()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        let found = loop {
            let v = processes_under(dir.path(), "shoal-vmm");
            if let Some(p) = v.into_iter().find(|p| p.pid == pid_of(&c)) {
                break Some(p);
            }
            if Instant::now() > end {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let p = found.expect("the fake VMM is found by its path");
        p.kill();
        let st = c.wait().unwrap();
        assert!(!st.success());
    }
}
