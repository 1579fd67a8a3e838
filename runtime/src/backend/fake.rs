//! The fake kind, for testing the daemon without KVM: a sandbox's "VM" is
//! a real `shoal-agent` process in host mode (`--listen unix:DIR/agent.sock`,
//! in its own session, working directory the sandbox's), so exec and file
//! requests through the daemon really run, on the host, as the daemon's
//! user: a test keeps its paths inside its own temporary directories.
//!
//! It behaves like a VM process where the daemon can tell: freezing stops
//! it (SIGSTOP) and thawing continues it (SIGCONT); pausing to disk writes
//! a state file into the sandbox's directory and ends the process; a
//! resume starts a new one; a kill is a real SIGKILL and a real exit,
//! reported through its pidfd. Tests make it die by killing its pid (the
//! API shows it), make it hang by stopping it (SIGSTOP: the agent stops
//! answering), and make operations fail with [`Faults`].
//!
//! Templates are directories holding a `fake-template.json` marker.

use super::{
    end, BackendError, BackendState, Kind, NetAttach, Proc, Reattached, SandboxBackend, SandboxVm,
    Source, StockedVm, Transport, VmStats,
};
use crate::sandbox::TemplateSpec;
use crate::vm;
use serde::{Deserialize, Serialize};
use shoal_images::layer_files::Layer;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The marker file of a fake template.
pub const TEMPLATE_MARKER: &str = "fake-template.json";
/// The state file of a sandbox paused to disk.
pub const PAUSED_STATE: &str = "fake-paused.json";
/// The agent's socket in the sandbox's directory.
pub const AGENT_SOCKET: &str = "agent.sock";
/// How long a new agent process has to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Operations [`Faults`] can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`SandboxBackend::build_template`].
    Template,
    /// [`SandboxBackend::restore`].
    Restore,
    /// [`SandboxVm::freeze`].
    Freeze,
    /// [`SandboxVm::thaw`].
    Thaw,
    /// [`SandboxVm::pause_to_disk`] (the process is left stopped, as a VMM
    /// is left paused by a failed snapshot).
    Pause,
    /// [`SandboxVm::snapshot`].
    Snapshot,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Template => "template build",
            Op::Restore => "restore",
            Op::Freeze => "freeze",
            Op::Thaw => "thaw",
            Op::Pause => "pause to disk",
            Op::Snapshot => "snapshot",
        }
    }
}

/// Failures tests ask for: the next `n` calls of an operation fail.
#[derive(Debug, Default)]
pub struct Faults {
    left: Mutex<HashMap<Op, u32>>,
}

impl Faults {
    /// Makes the next `n` calls of `op` fail.
    pub fn fail_next(&self, op: Op, n: u32) {
        *self
            .left
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(op)
            .or_default() = n;
    }

    /// Fails this call of `op` if one is due.
    fn check(&self, op: Op) -> Result<(), BackendError> {
        let mut m = self.left.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(&op) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(BackendError::Injected(op.name()))
            }
            _ => Ok(()),
        }
    }
}

/// What the fake backend stores per sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Saved {
    /// An agent process runs.
    Running {
        /// Its pid.
        pid: i32,
        /// Its start time.
        start: u64,
        /// Its socket.
        socket: PathBuf,
    },
    /// Paused to disk: the state file, no process.
    Paused {
        /// The state file.
        state_file: PathBuf,
    },
}

/// Where the daemon reaches a sandbox's agent instead of the socket of the
/// sandbox's own `shoal-agent` process, asked with the sandbox's directory
/// each time one starts (or is re-attached); `None`: its own socket. Tests
/// put a hostile agent stand-in there, the process still standing in for
/// the VM (pid, freeze, kill, exit).
pub type AgentRedirect = Arc<dyn Fn(&Path) -> Option<Transport> + Send + Sync>;

/// Host `shoal-agent` processes standing in for VMs.
#[derive(Clone)]
pub struct Fake {
    agent: PathBuf,
    faults: Arc<Faults>,
    redirect: Option<AgentRedirect>,
}

impl std::fmt::Debug for Fake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fake")
            .field("agent", &self.agent)
            .field("redirect", &self.redirect.is_some())
            .finish_non_exhaustive()
    }
}

impl Fake {
    /// Sandboxes run by the `shoal-agent` binary `agent`.
    pub fn new(agent: impl Into<PathBuf>) -> Fake {
        Fake {
            agent: agent.into(),
            faults: Arc::default(),
            redirect: None,
        }
    }

    /// Sandboxes whose agent `redirect` names are reached there instead.
    pub fn with_agent_redirect(mut self, redirect: AgentRedirect) -> Fake {
        self.redirect = Some(redirect);
        self
    }

    /// The transport of the agent of the sandbox in `dir`, its own socket
    /// being `socket`.
    fn transport(&self, dir: &Path, socket: &Path) -> Transport {
        self.redirect
            .as_ref()
            .and_then(|r| r(dir))
            .unwrap_or_else(|| Transport::Unix(socket.into()))
    }

    /// The failures to inject.
    pub fn faults(&self) -> Arc<Faults> {
        self.faults.clone()
    }

    /// Starts an agent for the sandbox in `dir` and waits until it listens.
    fn start(&self, dir: &Path) -> Result<FakeSandbox, BackendError> {
        let io = |path: &Path, source| BackendError::Io {
            path: path.into(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let socket = dir.join(AGENT_SOCKET);
        let _ = std::fs::remove_file(&socket);
        let log_path = dir.join("agent.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| io(&log_path, e))?;
        let mut listen = std::ffi::OsString::from("unix:");
        listen.push(&socket);
        let mut cmd = Command::new(&self.agent);
        cmd.arg("--listen")
            .arg(listen)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| io(&log_path, e))?)
            .stderr(log);
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: setsid in the child between fork and exec touches no
            // memory shared with the parent (its own session, as a VMM).
            unsafe {
                cmd.pre_exec(|| {
                    libc::setsid();
                    Ok(())
                })
            };
        }
        let child = cmd.spawn().map_err(|source| {
            BackendError::Spawn(crate::vmm_process::VmmProcessError::Spawn {
                program: self.agent.clone(),
                source,
            })
        })?;
        let pid = vm::pid_of(&child);
        // Reaped by whoever watches its pidfd, as a VMM is.
        drop(child);
        let proc = Proc {
            pid,
            start: vm::pid_start(pid).unwrap_or(0),
        };
        let sb = FakeSandbox {
            proc,
            dir: dir.into(),
            transport: self.transport(dir, &socket),
            socket,
            faults: self.faults.clone(),
        };
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(&sb.socket).is_err() {
            if !proc.alive() {
                proc.reap();
                return Err(BackendError::Exited {
                    detail: sb.last_words(),
                });
            }
            if t0.elapsed() > READY_TIMEOUT {
                end(&proc, Duration::from_secs(2));
                return Err(BackendError::NotReady {
                    timeout: READY_TIMEOUT,
                    detail: sb.last_words(),
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(sb)
    }
}

impl SandboxBackend for Fake {
    fn kind(&self) -> Kind {
        Kind::Fake
    }

    fn build_template(
        &self,
        spec: TemplateSpec,
        layers: &[Layer],
        dir: &Path,
    ) -> Result<(), BackendError> {
        self.faults.check(Op::Template)?;
        let names: Vec<String> = layers.iter().map(Layer::name).collect();
        let what = format!("{spec:?} layers {names:?}");
        write_marker(dir, &serde_json::json!({ "spec": what }))
    }

    fn restore(
        &self,
        dir: &Path,
        from: &Source,
        net: Option<&NetAttach>,
    ) -> Result<Arc<dyn SandboxVm>, BackendError> {
        self.faults.check(Op::Restore)?;
        // A fake VM has no device to put on the TAP; the slot's netns must
        // be there all the same (the daemon passed a real slot).
        if let Some(n) = net {
            std::fs::metadata(&n.netns).map_err(|source| BackendError::Io {
                path: n.netns.clone(),
                source,
            })?;
        }
        match from {
            Source::Template(t) | Source::Snapshot(t) if t.join(TEMPLATE_MARKER).is_file() => {}
            Source::Template(t) | Source::Snapshot(t) => {
                return Err(BackendError::NoSource(t.clone()))
            }
            Source::Paused(s) => match s.decode::<Saved>()? {
                Saved::Paused { state_file } if state_file.is_file() => {}
                _ => return Err(BackendError::NoSource(dir.into())),
            },
        }
        Ok(Arc::new(self.start(dir)?))
    }

    /// The agent process is started ahead (the "VM process" of the fake
    /// kind), as a microVM's pre-warmed VMM is.
    fn stock(
        &self,
        dir: &Path,
        template: &Path,
        _vcpus: u8,
        _memory_mib: u32,
        net: Option<&NetAttach>,
    ) -> Result<Option<Box<dyn StockedVm>>, BackendError> {
        if !template.join(TEMPLATE_MARKER).is_file() {
            return Err(BackendError::NoSource(template.into()));
        }
        // As for a restore: no device, but the slot's netns must exist.
        if let Some(n) = net {
            std::fs::metadata(&n.netns).map_err(|source| BackendError::Io {
                path: n.netns.clone(),
                source,
            })?;
        }
        Ok(Some(Box::new(FakeStocked {
            sb: self.start(dir)?,
            template: template.into(),
            faults: self.faults.clone(),
        })))
    }

    fn reattach(&self, dir: &Path, state: &BackendState) -> Result<Reattached, BackendError> {
        let Saved::Running { pid, start, socket } = state.decode::<Saved>()? else {
            return Err(BackendError::NoSource(dir.into()));
        };
        let proc = Proc { pid, start };
        if !proc.alive() {
            return Err(BackendError::Gone(pid));
        }
        let vm = FakeSandbox {
            proc,
            dir: dir.into(),
            transport: self.transport(dir, &socket),
            socket,
            faults: self.faults.clone(),
        };
        let frozen = vm.stats()?.frozen;
        Ok(Reattached {
            vm: Arc::new(vm),
            frozen,
        })
    }

    fn discard(&self, _dir: &Path, state: &BackendState) {
        if let Ok(Saved::Running { pid, start, .. }) = state.decode::<Saved>() {
            end(&Proc { pid, start }, Duration::from_secs(2));
        }
    }

    fn can_resume(&self, _dir: &Path, state: &BackendState) -> bool {
        matches!(state.decode::<Saved>(), Ok(Saved::Paused { state_file }) if state_file.is_file())
    }

    fn reclaim_strays(&self, root: &Path, keep: &dyn Fn(i32) -> bool) -> usize {
        let mut n = 0;
        for p in vm::processes_under(root, "shoal-agent") {
            if !keep(p.pid) {
                end(&p, Duration::from_secs(2));
                n += 1;
            }
        }
        n
    }
}

fn write_marker(dir: &Path, v: &serde_json::Value) -> Result<(), BackendError> {
    let io = |path: &Path, source| BackendError::Io {
        path: path.into(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let p = dir.join(TEMPLATE_MARKER);
    std::fs::write(&p, v.to_string()).map_err(|e| io(&p, e))
}

/// An agent process started ahead for one sandbox.
#[derive(Debug)]
struct FakeStocked {
    sb: FakeSandbox,
    template: PathBuf,
    faults: Arc<Faults>,
}

impl StockedVm for FakeStocked {
    fn pid(&self) -> i32 {
        self.sb.proc.pid
    }

    fn alive(&self) -> bool {
        self.sb.proc.alive()
    }

    fn restore(self: Box<Self>, template: &Path) -> Result<Arc<dyn SandboxVm>, BackendError> {
        let ok = self
            .faults
            .check(Op::Restore)
            .and_then(|()| match template == self.template {
                true => Ok(()),
                false => Err(BackendError::NoSource(template.into())),
            });
        if let Err(e) = ok {
            end(&self.sb.proc, Duration::from_secs(2));
            return Err(e);
        }
        Ok(Arc::new(self.sb))
    }

    fn discard(self: Box<Self>) {
        end(&self.sb.proc, Duration::from_secs(2));
        self.sb.proc.reap();
    }
}

/// One fake sandbox VM: an agent process.
#[derive(Debug)]
struct FakeSandbox {
    proc: Proc,
    dir: PathBuf,
    socket: PathBuf,
    /// Where its agent is reached (its socket unless redirected).
    transport: Transport,
    faults: Arc<Faults>,
}

impl FakeSandbox {
    /// Sends `sig` and waits (briefly) until the process is in the state
    /// the signal leads to (`stopped`: 'T').
    fn signal(&self, sig: i32, stopped: bool) -> Result<(), BackendError> {
        if vm::pid_start(self.proc.pid) != Some(self.proc.start) {
            return Err(BackendError::Gone(self.proc.pid));
        }
        // SAFETY: kill(2) on a pid whose start time was just checked.
        unsafe { libc::kill(self.proc.pid, sig) };
        let t0 = Instant::now();
        while proc_state(self.proc.pid).is_some_and(|s| (s == 'T') != stopped) {
            if t0.elapsed() > Duration::from_secs(2) {
                return Err(BackendError::Unusable {
                    pid: self.proc.pid,
                    detail: format!("signal {sig} had no effect"),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

/// The state letter of /proc/PID/stat (R, S, T, Z, ...).
fn proc_state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.get(s.rfind(')')? + 1..)?.trim_start().chars().next()
}

impl SandboxVm for FakeSandbox {
    fn kind(&self) -> Kind {
        Kind::Fake
    }

    fn pid(&self) -> i32 {
        self.proc.pid
    }

    fn state(&self) -> BackendState {
        BackendState::encode(&Saved::Running {
            pid: self.proc.pid,
            start: self.proc.start,
            socket: self.socket.clone(),
        })
    }

    fn agent(&self) -> Transport {
        self.transport.clone()
    }

    fn freeze(&self) -> Result<(), BackendError> {
        self.faults.check(Op::Freeze)?;
        self.signal(libc::SIGSTOP, true)
    }

    fn thaw(&self) -> Result<(), BackendError> {
        self.faults.check(Op::Thaw)?;
        self.signal(libc::SIGCONT, false)
    }

    fn stats(&self) -> Result<VmStats, BackendError> {
        let state = proc_state(self.proc.pid).filter(|s| *s != 'Z' && self.proc.alive());
        let Some(state) = state else {
            return Err(BackendError::Gone(self.proc.pid));
        };
        // SAFETY: sysconf with a valid name.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
            .unwrap_or(100)
            .max(1);
        let up_s: f64 = std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let started_ms = self.proc.start.saturating_mul(1000) / hz;
        Ok(VmStats {
            frozen: state == 'T',
            uptime_ms: Duration::try_from_secs_f64(up_s)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .saturating_sub(started_ms),
        })
    }

    fn pause_to_disk(&self) -> Result<BackendState, BackendError> {
        // As a VMM's snapshot pauses the vCPUs first.
        self.signal(libc::SIGSTOP, true)?;
        self.faults.check(Op::Pause)?;
        let state_file = self.dir.join(PAUSED_STATE);
        let v =
            serde_json::json!({ "pid": self.proc.pid, "paused_at_ns": crate::fresh::unix_nanos() });
        std::fs::write(&state_file, v.to_string()).map_err(|source| BackendError::Io {
            path: state_file.clone(),
            source,
        })?;
        end(&self.proc, Duration::from_secs(5));
        let _ = std::fs::remove_file(&self.socket);
        Ok(BackendState::encode(&Saved::Paused { state_file }))
    }

    fn snapshot(&self, dir: &Path) -> Result<(), BackendError> {
        self.signal(libc::SIGSTOP, true)?;
        let res = self.faults.check(Op::Snapshot).and_then(|()| {
            write_marker(
                dir,
                &serde_json::json!({ "from_sandbox": self.dir.to_string_lossy() }),
            )
        });
        if res.is_err() {
            let _ = std::fs::remove_dir_all(dir);
        }
        let resumed = self.signal(libc::SIGCONT, false);
        res.and(resumed)
    }

    fn kill(&self) {
        self.proc.kill();
    }

    fn destroy(&self, timeout: Duration) {
        end(&self.proc, timeout);
    }

    fn exit_fd(&self) -> std::io::Result<OwnedFd> {
        self.proc.pidfd()
    }

    fn alive(&self) -> bool {
        self.proc.alive()
    }

    fn reap(&self) -> Option<std::process::ExitStatus> {
        self.proc.reap()
    }

    fn last_words(&self) -> String {
        crate::vm::log_tail(&self.dir.join("agent.log"), 3, " | ")
    }
}

#[cfg(test)]
#[path = "fake_tests.rs"]
mod tests;
