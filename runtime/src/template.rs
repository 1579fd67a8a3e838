//! Templates: boot a guest once, snapshot it when it is ready, and restore
//! copies from the snapshot.

use crate::console_lines::ConsoleLines;
#[cfg(test)]
use crate::console_lines::MAX_CONSOLE_LINE;
use crate::jail::JailConfig;
use crate::launch::BootSpec;
use crate::vmm_process::{Io, VmmProcess, VmmProcessError};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};
use vmm_api::{Client, SnapshotInfo};

/// Errors making or restoring templates.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The VMM could not be started.
    #[error(transparent)]
    Spawn(#[from] VmmProcessError),
    /// Waiting for the VMM failed.
    #[error("waiting for shoal-vmm: {0}")]
    Wait(std::io::Error),
    /// The guest never printed the ready line.
    #[error("the template guest did not print {0:?} before it stopped or timed out")]
    NotReady(String),
    /// A control request failed.
    #[error(transparent)]
    Api(#[from] vmm_api::ApiError),
    /// The control socket never came up.
    #[error("VMM control socket {0} did not come up")]
    NoSocket(PathBuf),
    /// File system.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// The restored VMM exited before its control socket answered.
    #[error("{} before its control socket answered", crate::vm::exit_cause(*.0))]
    Exited(std::process::ExitStatus),
    /// The guest agent did not answer the warm-up before the snapshot.
    #[error("guest agent warm-up before the snapshot: {0}")]
    AgentWarmup(#[from] agent_client::ClientError),
}

/// Boots `spec` with our VMM, waits for a console line containing `ready`,
/// waits until the guest is idle, snapshots into `dir` and shuts the VM down.
pub fn make(
    spec: &BootSpec,
    vmm: &Path,
    dir: &Path,
    ready: &str,
    timeout: Duration,
) -> Result<SnapshotInfo, TemplateError> {
    make_with(spec, vmm, dir, ready, timeout, true)
}

/// [`make`], choosing whether to wait for an idle guest after the ready
/// line (`false`: snapshot at the ready line, for guests that never idle,
/// such as the restore benchmark's continuous printer).
pub fn make_with(
    spec: &BootSpec,
    vmm: &Path,
    dir: &Path,
    ready: &str,
    timeout: Duration,
    wait_idle: bool,
) -> Result<SnapshotInfo, TemplateError> {
    make_in(
        spec,
        vmm,
        dir,
        ready,
        timeout,
        wait_idle,
        None,
        BootDevices::default(),
    )
}

/// [`make`] with the VMM in `jail` (None: unjailed): it sees `dir`
/// read-write and the kernel and images outside `dir` read-only.
pub fn make_jailed(
    spec: &BootSpec,
    vmm: &Path,
    dir: &Path,
    ready: &str,
    timeout: Duration,
    jail: Option<&JailConfig>,
) -> Result<SnapshotInfo, TemplateError> {
    make_in(
        spec,
        vmm,
        dir,
        ready,
        timeout,
        true,
        jail,
        BootDevices::default(),
    )
}

/// [`make_jailed`] with a virtio-net device on `net`'s TAP with its MAC:
/// a networked template (the TAP is passed as a descriptor, so the jail's
/// own netns does not matter). The guest's interface stays unconfigured (down) in
/// the snapshot, so the boot sends nothing; each restore gives the device
/// its own TAP and MAC (`--restore-net`) and the agent its address
/// (`NetConfigure`).
pub fn make_with_net(
    spec: &BootSpec,
    vmm: &Path,
    dir: &Path,
    ready: &str,
    timeout: Duration,
    jail: Option<&JailConfig>,
    net: (std::sync::Arc<std::fs::File>, [u8; 6]),
) -> Result<SnapshotInfo, TemplateError> {
    let devices = BootDevices {
        net: Some(net),
        balloon: None,
    };
    make_in(spec, vmm, dir, ready, timeout, true, jail, devices)
}

/// Devices a template boot adds to its [`BootSpec`].
#[derive(Debug, Default)]
pub struct BootDevices {
    /// A virtio-net device on this TAP with this MAC (see [`make_with_net`]).
    pub net: Option<(std::sync::Arc<std::fs::File>, [u8; 6])>,
    /// A virtio-balloon device (its clones keep it).
    pub balloon: Option<crate::vmm_balloon::BalloonOptions>,
}

/// [`make_jailed`] with `devices` added to the boot.
pub fn make_with_devices(
    spec: &BootSpec,
    vmm: &Path,
    dir: &Path,
    ready: &str,
    timeout: Duration,
    jail: Option<&JailConfig>,
    devices: BootDevices,
) -> Result<SnapshotInfo, TemplateError> {
    make_in(spec, vmm, dir, ready, timeout, true, jail, devices)
}

/// The jail of a template boot of `spec` into `dir`.
fn boot_jail(
    spec: &BootSpec,
    dir: &Path,
    j: &JailConfig,
) -> Result<crate::jail::Jail, TemplateError> {
    let mut ro = vec![spec.kernel.clone()];
    let writable_root = spec.root_kind == crate::launch::RootKind::BlkExt4Rw;
    if writable_root && !spec.root.starts_with(dir) {
        return Err(TemplateError::NotReady(format!(
            "jail: a writable root outside {} cannot be bound",
            dir.display()
        )));
    }
    ro.push(spec.root.clone());
    ro.extend(spec.extra_pmem.iter().cloned());
    ro.extend(spec.upper_disk.iter().cloned());
    let ro: Vec<_> = ro.into_iter().filter(|p| !p.starts_with(dir)).collect();
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let images: u64 = spec
        .extra_pmem
        .iter()
        .chain([&spec.root])
        .map(|p| size(p))
        .sum();
    let mem = u64::from(spec.memory_mib) * (1 << 20) + images;
    j.jail_for(dir, &ro, mem)
        .map_err(|e| TemplateError::NotReady(format!("jail: {e}")))
}

// One private helper behind the public variants (plain, jailed, networked).
#[allow(clippy::too_many_arguments)]
fn make_in(
    spec: &BootSpec,
    vmm: &Path,
    dir: &Path,
    ready: &str,
    timeout: Duration,
    wait_idle: bool,
    jail: Option<&JailConfig>,
    devices: BootDevices,
) -> Result<SnapshotInfo, TemplateError> {
    std::fs::create_dir_all(dir).map_err(|e| TemplateError::Io(dir.into(), e))?;
    let sock = dir.join("template-boot.sock");
    let mut p = spec.vmm_process(vmm);
    if let Some((tap, mac)) = devices.net {
        p = p.net_tap(tap, mac, crate::vmm_net::NetLimits::default());
    }
    if let Some(b) = devices.balloon {
        p = p.balloon(b);
    }
    if let Some(j) = jail {
        p = p.jail(boot_jail(spec, dir, j)?);
    }
    let mut child = p
        .api_sock(&sock)
        .timeout(Duration::from_secs(timeout.as_secs()))
        .stdin(Io::Null)
        .stdout(Io::Piped)
        .stderr(Io::Null)
        .spawn()?
        .child;
    let mut seen = false;
    if let Some(out) = child.stdout.take() {
        let (found, rest) = find_ready(out, ready);
        seen = found;
        // Keep draining the console until the VMM exits: a closed pipe
        // would fail the guest's console writes while it settles, and that
        // state would be in the snapshot.
        std::thread::spawn(move || rest.drain());
    }
    if !seen {
        let _ = child.kill();
        let _ = child.wait();
        return Err(TemplateError::NotReady(ready.into()));
    }
    // An agent that serves requests is put through the requests every
    // clone makes first, so that the code and data they touch (agent pages,
    // kernel vsock and exec paths, the command's binary) are already in the
    // snapshot's page tables and caches; a clone would otherwise fault each
    // one in on its first request (~3 ms per page fault on PVM hosts).
    if let (Some(uds), true) = (&spec.vsock_uds, spec.init_args.is_empty()) {
        if let Err(e) = warm_agent(uds) {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&sock);
            return Err(e);
        }
    }
    // The guest goes on working for a while after its ready line (the
    // agent's set-up, kernel deferred work); every clone would redo that
    // work after its restore, so snapshot once the guest is idle.
    if wait_idle {
        // A jailed VMM is the jailer's child.
        let pid = match jail {
            Some(_) => crate::vm::pid_of(&child),
            None => 0,
        };
        let pid = crate::jail::vmm_pid(pid, dir)
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(child.id());
        wait_until_idle(pid, QUIET_WINDOW, QUIET_MAX);
    }
    let t = Duration::from_secs(60);
    let vmm = Client::new(&sock, t);
    let info = vmm.snapshot(dir, false);
    let _ = vmm.shutdown();
    let _ = child.wait();
    let _ = std::fs::remove_file(&sock);
    Ok(info?)
}

/// Most console bytes a template boot reads looking for its ready line (a
/// quiet boot prints a few KiB).
pub const MAX_READY_SCAN: u64 = 16 << 20;

/// Reads console lines from `out` until one contains `ready`: whether one
/// did, and the rest of the console. Lines are cut to
/// [`crate::console_lines::MAX_CONSOLE_LINE`] bytes, and the search ends
/// after [`MAX_READY_SCAN`] bytes.
fn find_ready<R: std::io::Read>(out: R, ready: &str) -> (bool, ConsoleLines<R>) {
    let mut lines = ConsoleLines::with_limit(out, MAX_READY_SCAN);
    while let Some(line) = lines.next_line() {
        if String::from_utf8_lossy(&line).contains(ready) {
            return (true, lines);
        }
    }
    (false, lines)
}

/// One connection doing what a fresh clone's first client does: hello,
/// post-restore (entropy, clock), an exec with output, a small file
/// written, read back and removed; then the connection closes.
fn warm_agent(uds: &Path) -> Result<(), TemplateError> {
    use agent_client::{Client, ExecRequest};
    let c = Client::connect_vsock_retry(uds, agent_proto::VSOCK_PORT, Duration::from_secs(120))?;
    c.set_timeout(Some(Duration::from_secs(120)));
    c.post_restore(crate::fresh::entropy(), crate::fresh::unix_nanos())?;
    // A container image may have no `true` (or nothing at all in PATH):
    // the spawn up to its execve is warmed either way.
    match c.exec_simple(&ExecRequest::argv(["true"])) {
        Err(e) if e.errno() == Some(libc::ENOENT) => {}
        r => drop(r?),
    }
    let path = "/tmp/.shoal-template-warmup";
    c.write_file(path, b"warm", 0o600)?;
    c.read_file(path)?;
    c.stat(path)?;
    c.remove(path, false)?;
    Ok(())
}

/// Idle means under 2% of a CPU over this window.
const QUIET_WINDOW: Duration = Duration::from_millis(250);
/// Give up waiting for an idle guest after this long (a guest that never
/// idles, e.g. one printing continuously, is snapshotted as it is).
const QUIET_MAX: Duration = Duration::from_secs(10);

/// CPU time (ns) all threads of `pid` have run, from schedstat.
fn cpu_ns(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
        total += s.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Waits (at most `max`) until process `pid` used under 2% of a CPU over
/// `window`; returns whether it did.
pub fn wait_until_idle(pid: u32, window: Duration, max: Duration) -> bool {
    let end = Instant::now() + max;
    let Some(mut last) = cpu_ns(pid) else {
        return false;
    };
    while Instant::now() < end {
        std::thread::sleep(window);
        let Some(now) = cpu_ns(pid) else {
            return false;
        };
        if now.saturating_sub(last) < u64::try_from(window.as_nanos()).unwrap_or(u64::MAX) / 50 {
            return true;
        }
        last = now;
    }
    false
}

/// A VMM process restored from a template, with a control socket.
pub struct Restored {
    /// The process.
    pub child: Child,
    /// Its control socket.
    pub sock: PathBuf,
    /// When it was spawned.
    pub spawned: Instant,
    /// Read side of the VMM's `--ready-fd` pipe.
    ready: Option<crate::ready::ReadyPipe>,
}

/// Starts `vmm` (a [`VmmProcess::restore`] with a control socket; its
/// stdout, e.g. the guest console, as the caller set it) with a readiness
/// pipe, its stderr piped back here and no stdin.
pub fn spawn_restore(vmm: VmmProcess) -> Result<Restored, TemplateError> {
    let spawned = Instant::now();
    let sock = vmm
        .control_socket()
        .ok_or(TemplateError::Spawn(VmmProcessError::Invalid(
            "a restored template VM needs a control socket",
        )))?
        .to_path_buf();
    let s = vmm
        .stdin(Io::Null)
        .stderr(Io::Piped)
        .ready_pipe(true)
        .spawn()?;
    Ok(Restored {
        child: s.child,
        sock,
        spawned,
        ready: s.ready,
    })
}

impl Restored {
    /// Waits until the VMM reports its vCPUs running on the ready pipe (no
    /// polling); fails at once if the VMM exits first.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(), TemplateError> {
        // Reported once: a second call has nothing more to wait for.
        let Some(mut r) = self.ready.take() else {
            return Ok(());
        };
        match r.wait(timeout) {
            crate::ready::Readiness::Ready => Ok(()),
            // The VMM ended (or closed the pipe) without running.
            crate::ready::Readiness::Ended => {
                let status = self.child.wait().map_err(TemplateError::Wait)?;
                Err(TemplateError::Exited(status))
            }
            crate::ready::Readiness::TimedOut => Err(TemplateError::NoSocket(self.sock.clone())),
        }
    }

    /// Shuts the VM down and reaps the process; returns its stderr.
    pub fn shutdown(mut self) -> String {
        let _ = Client::new(&self.sock, Duration::from_secs(10)).shutdown();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.sock);
        err
    }
}

/// The `first_run_ns` value from a `SHOAL-TIMING` line.
pub fn first_run_ns(stderr: &str) -> Option<u128> {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("SHOAL-TIMING "))?
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("first_run_ns="))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A fake console: `before` bytes of `fill` (newlines among them every
    /// `every` bytes, or none), then a ready line; it counts what was read.
    struct Console {
        before: u64,
        fill: u8,
        every: Option<u64>,
        pos: u64,
        tail: &'static [u8],
        read: Arc<AtomicU64>,
    }

    impl Read for Console {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let mut n = 0;
            while n < buf.len() {
                if self.pos < self.before {
                    let nl = self.every.is_some_and(|e| self.pos % e == e - 1);
                    buf[n] = if nl { b'\n' } else { self.fill };
                } else {
                    let i = usize::try_from(self.pos - self.before).unwrap();
                    let Some(&b) = self.tail.get(i) else { break };
                    buf[n] = b;
                }
                self.pos += 1;
                n += 1;
            }
            self.read.fetch_add(n as u64, Ordering::Relaxed);
            Ok(n)
        }
    }

    fn console(before: u64, every: Option<u64>) -> (Console, Arc<AtomicU64>) {
        let read = Arc::new(AtomicU64::new(0));
        let c = Console {
            before,
            fill: b'x',
            every,
            pos: 0,
            tail: b"\nshoal-ready\nafter\n",
            read: read.clone(),
        };
        (c, read)
    }

    #[test]
    fn a_console_that_floods_before_its_ready_line_is_read_only_so_far() {
        // 80 MiB without a newline: neither held in memory as one line nor
        // read to its end; the template boot gives up instead.
        let (c, read) = console(80 << 20, None);
        let (seen, _) = find_ready(c, "shoal-ready");
        let n = read.load(Ordering::Relaxed);
        assert!(!seen, "gave up on a flood");
        assert!(
            n <= MAX_READY_SCAN + (64 << 10),
            "read {n} bytes of console looking for the ready line"
        );
        // Many short lines: the same total bound.
        let (c, read) = console(80 << 20, Some(100));
        assert!(!find_ready(c, "shoal-ready").0);
        assert!(read.load(Ordering::Relaxed) <= MAX_READY_SCAN + (64 << 10));
    }

    #[test]
    fn a_long_line_is_cut_and_the_ready_line_after_it_is_still_seen() {
        // One 1 MiB line, then the ready line: found, within the bound.
        let (c, _) = console(1 << 20, None);
        assert!(find_ready(c, "shoal-ready").0);
        let mut lines = ConsoleLines::new(console(1 << 20, None).0);
        let first = lines.next_line().unwrap();
        assert_eq!(first.len(), MAX_CONSOLE_LINE, "cut to the line cap");
        assert_eq!(lines.next_line().unwrap(), b"shoal-ready");
        assert_eq!(lines.next_line().unwrap(), b"after");
        assert!(lines.next_line().is_none());
    }
}
