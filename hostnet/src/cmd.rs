//! Runs `ip` and `nft`: a program and its arguments (never a shell
//! string), optional input on stdin, a deadline after which the child is
//! killed, stdout capped and stderr kept for the error.

use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The most stdout kept from one command (`nft -j list ruleset` of a busy
/// slot is far below it).
pub const MAX_STDOUT: usize = 8 << 20;
/// The most stderr kept for an error message.
const MAX_STDERR: usize = 16 << 10;

/// A command that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// The program could not be started (not installed, not executable).
    #[error("cannot run `{cmd}`: {source}")]
    Spawn {
        /// The command line, for the message.
        cmd: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Waiting on the child failed.
    #[error("waiting for `{cmd}`: {source}")]
    Wait {
        /// The command line.
        cmd: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It ran past its deadline and was killed.
    #[error("`{cmd}` ran past its {after:?} deadline and was killed")]
    Timeout {
        /// The command line.
        cmd: String,
        /// The deadline.
        after: Duration,
    },
    /// It exited unsuccessfully.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        cmd: String,
        /// How it exited.
        status: ExitStatus,
        /// What it wrote on stderr (capped, trimmed).
        stderr: String,
    },
    /// It wrote more than [`MAX_STDOUT`] bytes.
    #[error("`{cmd}` wrote more than {MAX_STDOUT} bytes")]
    TooMuchOutput {
        /// The command line.
        cmd: String,
    },
}

/// Runs `program args..`, feeding `stdin` if given, and returns its stdout
/// (lossily decoded) when it exits 0 within `timeout`.
pub fn run(
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<String, CmdError> {
    let cmd_line = || {
        let mut s = program.to_string();
        for a in args {
            s.push(' ');
            s.push_str(a);
        }
        s
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| CmdError::Spawn {
            cmd: cmd_line(),
            source,
        })?;
    let writer = match (stdin, child.stdin.take()) {
        (Some(text), Some(mut pipe)) => {
            let text = text.to_string();
            // A write error (the child exited early) shows as its status.
            Some(thread::spawn(move || {
                let _ = pipe.write_all(text.as_bytes());
            }))
        }
        _ => None,
    };
    let out = child.stdout.take().map(|p| reader(p, MAX_STDOUT));
    let err = child.stderr.take().map(|p| reader(p, MAX_STDERR));
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(100);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CmdError::Timeout {
                    cmd: cmd_line(),
                    after: timeout,
                });
            }
            Ok(None) => {
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
            Err(source) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CmdError::Wait {
                    cmd: cmd_line(),
                    source,
                });
            }
        }
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    let (stdout, overflow) = out.map(join).unwrap_or_default();
    let (stderr, _) = err.map(join).unwrap_or_default();
    if !status.success() {
        return Err(CmdError::Failed {
            cmd: cmd_line(),
            status,
            stderr: String::from_utf8_lossy(&stderr).trim().to_string(),
        });
    }
    if overflow {
        return Err(CmdError::TooMuchOutput { cmd: cmd_line() });
    }
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}

type Reader = thread::JoinHandle<(Vec<u8>, bool)>;

/// Reads a pipe to its end on a thread, keeping at most `cap` bytes (and
/// whether there were more).
fn reader(mut pipe: impl Read + Send + 'static, cap: usize) -> Reader {
    thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        let mut overflow = false;
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = cap - kept.len();
                    if n > room {
                        overflow = true;
                    }
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        (kept, overflow)
    })
}

fn join(h: Reader) -> (Vec<u8>, bool) {
    h.join().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_stdin_and_failure_are_reported() {
        let t = Duration::from_secs(30);
        assert_eq!(run("cat", &[], Some("hello"), t).unwrap(), "hello");
        match run("sh", &["-c", "echo oops >&2; exit 3"], None, t) {
            Err(CmdError::Failed { stderr, cmd, .. }) => {
                assert_eq!(stderr, "oops");
                assert!(cmd.starts_with("sh -c"), "{cmd}");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        assert!(matches!(
            run("/nonexistent/prog", &[], None, t),
            Err(CmdError::Spawn { .. })
        ));
    }

    #[test]
    fn a_command_past_its_deadline_is_killed() {
        let e = run("sleep", &["30"], None, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, CmdError::Timeout { .. }), "{e}");
    }
}
