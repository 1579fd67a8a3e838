//! `shoal daemon start|stop|status`: the local shoald, started in the
//! background, stopped gracefully (SIGTERM: its sandboxes keep running and
//! are reattached by the next daemon), or looked at. The daemon is found
//! as every other command finds it (`--daemon`, `SHOAL_DAEMON`, the
//! default socket); its pid is the socket peer's (`SO_PEERCRED`).

use crate::daemon_cmds::Global;
use anyhow::{bail, Context, Result};
use clap::Subcommand;
use shoal_client::DaemonClient;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Exit code of `shoal daemon status` when no daemon answers.
pub const NOT_RUNNING: i32 = 3;

/// `shoal daemon ...`.
#[derive(Subcommand)]
pub enum DaemonCmd {
    /// Start shoald in the background (if it is not running) and wait
    /// until it answers; prints where it listens.
    Start,
    /// Stop shoald gracefully (SIGTERM) and wait for it to exit; its
    /// sandboxes keep running and the next daemon reattaches them.
    Stop {
        /// Seconds to wait for it to exit.
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
    },
    /// Whether shoald runs: pid, socket, version, sandboxes per state
    /// (exit code 0 when it runs, 3 when not).
    Status,
}

/// Runs `cmd`; the process's exit code.
pub fn run(g: &Global, cmd: &DaemonCmd) -> Result<i32> {
    let spec = g
        .daemon
        .clone()
        .or_else(|| std::env::var("SHOAL_DAEMON").ok())
        .filter(|s| !s.is_empty());
    let remote = spec.as_deref().filter(|s| s.starts_with("http://"));
    let sock = spec
        .as_deref()
        .filter(|s| !s.starts_with("http://"))
        .map(PathBuf::from)
        .unwrap_or_else(|| shoald::default_state_dir().join("shoald.sock"));
    match (cmd, remote) {
        (DaemonCmd::Status, Some(r)) => status(g, &DaemonClient::from_spec(r), None, r),
        (_, Some(r)) => bail!(
            "{r} is a remote daemon: only a local one (a Unix socket) is started or stopped here"
        ),
        (DaemonCmd::Start, None) => start(g, &sock),
        (DaemonCmd::Stop { timeout }, None) => stop(g, &sock, *timeout),
        (DaemonCmd::Status, None) => {
            let pid = peer_pid(&sock);
            status(
                g,
                &DaemonClient::unix(&sock),
                pid,
                &sock.display().to_string(),
            )
        }
    }
}

/// The pid of the process serving `sock`, from the peer credentials of a
/// connection to it.
pub fn peer_pid(sock: &Path) -> Option<i32> {
    let s = std::os::unix::net::UnixStream::connect(sock).ok()?;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()).ok()?;
    // SAFETY: getsockopt(SO_PEERCRED) writes at most `len` bytes into
    // `cred`, a ucred owned here, on a socket this function holds open.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid)
}

fn start(g: &Global, sock: &Path) -> Result<i32> {
    let c = DaemonClient::unix(sock);
    let already = c.ping();
    if !already {
        crate::daemon_client::start_daemon(sock)?;
    }
    let pid = peer_pid(sock);
    let log = sock.with_file_name("shoald.log");
    if g.json {
        let v = serde_json::json!({
            "running": true, "started": !already, "pid": pid,
            "socket": sock, "log": log,
        });
        println!("{v}");
    } else {
        let pid = pid.map_or_else(|| "?".into(), |p| p.to_string());
        let what = if already {
            "already running"
        } else {
            "started"
        };
        println!(
            "shoald {what} (pid {pid}) on {}; log {}",
            sock.display(),
            log.display()
        );
    }
    Ok(0)
}

fn stop(g: &Global, sock: &Path, timeout: f64) -> Result<i32> {
    let c = DaemonClient::unix(sock);
    let Some(pid) = peer_pid(sock).filter(|_| c.ping()) else {
        if g.json {
            println!("{}", serde_json::json!({"running": false, "socket": sock}));
        } else {
            println!("no shoald is running on {}", sock.display());
        }
        return Ok(0);
    };
    // SAFETY: kill(2) of the pid serving the daemon's socket.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(e).with_context(|| format!("cannot signal shoald (pid {pid})"));
    }
    let wait = Duration::try_from_secs_f64(timeout.max(0.0)).unwrap_or(Duration::MAX);
    let t0 = Instant::now();
    // Gone once its pid is (kill(pid, 0) fails) or no longer serves the
    // socket (a reused pid).
    while alive(pid) {
        if t0.elapsed() >= wait {
            bail!(
                "shoald (pid {pid}) did not exit within {timeout} s of SIGTERM; see {}",
                sock.with_file_name("shoald.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if g.json {
        println!(
            "{}",
            serde_json::json!({"running": false, "stopped": pid, "socket": sock})
        );
    } else {
        println!(
            "shoald (pid {pid}) stopped in {:.1} s; its sandboxes keep running",
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(0)
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that `pid` exists.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    // A zombie has exited.
    exists
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
            .unwrap_or(false)
}

fn status(g: &Global, c: &DaemonClient, pid: Option<i32>, at: &str) -> Result<i32> {
    let stats = match c.stats() {
        Ok(s) => s,
        Err(e) => {
            if g.json {
                println!("{}", serde_json::json!({"running": false, "socket": at}));
            } else {
                println!("shoald is not running on {at} ({e})");
            }
            return Ok(NOT_RUNNING);
        }
    };
    let by_state = &stats.usage.by_state;
    if g.json {
        let v = serde_json::json!({
            "running": true, "pid": pid, "socket": at, "version": stats.version,
            "sandboxes": by_state, "vms": stats.usage.vms,
        });
        println!("{v}");
        return Ok(0);
    }
    let pid = pid.map_or_else(|| "-".into(), |p| p.to_string());
    println!("shoald {} running (pid {pid}) on {at}", stats.version);
    let counts: Vec<String> = by_state
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    let total: u64 = by_state.values().sum();
    if counts.is_empty() {
        println!("sandboxes: none");
    } else {
        println!("sandboxes: {total} ({})", counts.join(", "));
    }
    println!(
        "reserved: {} MiB, {} vCPUs of {} MiB, {} vCPUs",
        stats.usage.memory_mib, stats.usage.vcpus, stats.memory_budget_mib, stats.vcpu_budget
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_nobody_serves_has_no_pid_and_this_process_is_alive() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(peer_pid(&dir.path().join("none.sock")), None);
        let sock = dir.path().join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(
            peer_pid(&sock),
            Some(i32::try_from(std::process::id()).unwrap())
        );
        assert!(alive(i32::try_from(std::process::id()).unwrap()));
    }
}
