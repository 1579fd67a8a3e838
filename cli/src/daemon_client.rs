//! Reaching shoald from the CLI: which daemon (`--daemon`/`SHOAL_DAEMON`:
//! a Unix socket path or `http://HOST:PORT` with `SHOAL_TOKEN`), starting
//! the local one on demand, a progress line for long operations, and
//! tables.

use anyhow::{bail, Context, Result};
use shoal_client::DaemonClient;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Whether the daemon is on this host (a Unix socket), so that what the
/// CLI installs here is what it reads.
pub fn is_local(daemon: Option<&str>) -> bool {
    let spec = daemon
        .map(String::from)
        .or_else(|| std::env::var("SHOAL_DAEMON").ok())
        .unwrap_or_default();
    !spec.starts_with("http://")
}

/// The daemon to talk to, started on demand when it is the local default.
pub fn connect(daemon: Option<&str>) -> Result<DaemonClient> {
    let spec = daemon
        .map(String::from)
        .or_else(|| std::env::var("SHOAL_DAEMON").ok())
        .filter(|s| !s.is_empty());
    if let Some(s) = spec.as_deref().filter(|s| s.starts_with("http://")) {
        return Ok(DaemonClient::from_spec(s));
    }
    let sock = spec
        .map(PathBuf::from)
        .unwrap_or_else(|| shoald::default_state_dir().join("shoald.sock"));
    let c = DaemonClient::unix(&sock);
    if !c.ping() {
        start_daemon(&sock)?;
    }
    Ok(c)
}

/// Starts `shoald` (next to this executable) detached, for the state
/// directory holding `sock`, and waits for it to answer.
pub(crate) fn start_daemon(sock: &std::path::Path) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let state = sock
        .parent()
        .context("the daemon socket has no directory")?
        .to_path_buf();
    std::fs::create_dir_all(&state)
        .with_context(|| format!("cannot create {}", state.display()))?;
    let exe = std::env::current_exe()?;
    let bin = exe.with_file_name("shoald");
    if !bin.is_file() {
        bail!(
            "shoald is not running at {} and {} is missing (cargo build --release -p shoald)",
            sock.display(),
            bin.display()
        );
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join("shoald.log"))?;
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("--state-dir")
        .arg(&state)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid between fork and exec touches no shared memory.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        })
    };
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let c = DaemonClient::unix(sock);
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        if c.ping() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            bail!(
                "shoald exited ({st}) while starting; see {}",
                state.join("shoald.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!(
        "shoald did not answer within 30 s; see {}",
        state.join("shoald.log").display()
    )
}

/// A spinner with elapsed time on stderr while a long call runs (a plain
/// line when stderr is not a terminal).
pub use crate::progress::Live as Progress;

/// Prints rows as an aligned table.
pub fn table(head: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(head.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// "3m 20s"-style age.
// `as` from f64 saturates (NaN gives 0): whole seconds are what is shown.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clients_default_socket_is_the_daemons() {
        assert_eq!(
            shoal_client::default_socket(),
            shoald::default_state_dir().join("shoald.sock")
        );
    }
}
