//! The microVM kind: each sandbox is a `shoal-vmm` process restored from
//! a snapshot (a template's, or its own pause snapshot) in its own session,
//! so it outlives a daemon restart; it is controlled through its control
//! socket and its agent is reached through its hybrid-vsock socket.

use super::microvm_template::build_from_layout;
use super::{
    end, BackendError, BackendState, Kind, Proc, Reattached, SandboxBackend, SandboxVm, Source,
    Transport, VmStats,
};
use crate::ready::{Readiness, ReadyPipe};
use crate::sandbox::TemplateSpec;
use crate::vm::{self, Paths};
use crate::vmm_process::{Disk, Io, Serial, VmmProcess, VmmProcessError};
use serde::{Deserialize, Serialize};
use shoal_images::artifacts::Layout;
use shoal_images::layers;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use vmm_api::{Client, VmState};

/// How long a restored VMM has to report its vCPUs running.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Control requests that only flip vCPU state.
const QUICK: Duration = Duration::from_secs(5);
/// Control requests that write a snapshot.
const SNAPSHOT: Duration = Duration::from_secs(120);

/// What the microVM backend stores per sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Saved {
    /// A VMM runs.
    Running {
        /// Its pid.
        pid: i32,
        /// Its start time (clock ticks since boot).
        start: u64,
        /// Its control socket.
        api_sock: PathBuf,
        /// Its vsock host socket.
        vsock: PathBuf,
    },
    /// Paused to disk: no VMM; the snapshot is in the sandbox's directory.
    Paused {
        /// The snapshot (absent: the newest `snap-*` in the directory).
        #[serde(default)]
        snapshot: Option<PathBuf>,
    },
}

/// `shoal-vmm` microVMs.
#[derive(Debug, Clone)]
pub struct MicroVm {
    vmm: PathBuf,
    artifacts: Layout,
}

impl MicroVm {
    /// Sandboxes run by the VMM binary `vmm`; image templates booted from
    /// the guest kernel and images installed in `artifacts`.
    pub fn new(vmm: impl Into<PathBuf>, artifacts: Layout) -> MicroVm {
        MicroVm {
            vmm: vmm.into(),
            artifacts,
        }
    }

    /// The state of a sandbox recorded by a daemon from before backend
    /// states (schema v2: a pid and start time for a running VMM, the
    /// newest `snap-*` in its directory for a paused one), so that VMMs
    /// running across the upgrade are reattached.
    pub fn state_before_v3(
        dir: &Path,
        paused: bool,
        pid: Option<i32>,
        start: Option<u64>,
    ) -> Option<BackendState> {
        let paths = Paths::new(dir);
        let saved = match (paused, pid, start) {
            (true, _, _) => Saved::Paused { snapshot: None },
            (false, Some(pid), Some(start)) => Saved::Running {
                pid,
                start,
                api_sock: paths.api_sock,
                vsock: paths.vsock,
            },
            _ => return None,
        };
        Some(BackendState::encode(&saved))
    }

    fn snapshot_of(&self, dir: &Path, snapshot: Option<&Path>) -> Option<PathBuf> {
        snapshot
            .filter(|s| s.join("state").is_file())
            .map(Path::to_path_buf)
            .or_else(|| Paths::new(dir).latest_snapshot())
    }
}

/// Starts `vmm --restore snapshot` for the sandbox in `paths` (its own
/// session; console and VMM messages go to files there). A template with a
/// scratch disk (`snapshot/scratch.ext4`) gives the sandbox its own copy of
/// it in its directory, which the VMM then uses; resuming from a sandbox's
/// own pause snapshot passes that copy again (the VMM refuses to open a
/// saved writable disk path it was not given).
fn spawn_restore(
    vmm: &Path,
    snapshot: &Path,
    paths: &Paths,
) -> Result<(Proc, ReadyPipe), BackendError> {
    std::fs::create_dir_all(&paths.dir).map_err(|source| BackendError::Io {
        path: paths.dir.clone(),
        source,
    })?;
    let _ = std::fs::remove_file(&paths.api_sock);
    let _ = std::fs::remove_file(&paths.vsock);
    let mut p = VmmProcess::restore(vmm, snapshot);
    let own = paths.dir.join(layers::SCRATCH_DISK);
    if let Some(src) = layers::scratch_disk(snapshot) {
        // A leftover of an earlier attempt is stale.
        let _ = std::fs::remove_file(&own);
        layers::clone_file(&src, &own)?;
        p = p.disk(Disk::rw(own));
    } else if own.is_file() {
        // The sandbox's own pause snapshot names this copy; the VMM opens
        // a saved writable disk only when it is given explicitly.
        p = p.disk(Disk::rw(own));
    }
    let s = p
        .api_sock(&paths.api_sock)
        .vsock_uds(&paths.vsock)
        .serial(Serial::File(paths.dir.join("console.log")))
        .stdin(Io::Null)
        .stdout(Io::Null)
        .stderr(Io::Append(paths.dir.join("vmm.log")))
        .ready_pipe(true)
        .own_session(true)
        .spawn()?;
    let pid = vm::pid_of(&s.child);
    // The Child handle is dropped without waiting: whoever watches the
    // process reaps it when its pidfd reports the exit.
    drop(s.child);
    let start = vm::pid_start(pid).unwrap_or(0);
    let ready = s.ready.ok_or(BackendError::Spawn(VmmProcessError::Invalid(
        "no readiness pipe",
    )))?;
    Ok((Proc { pid, start }, ready))
}

/// Waits until the VMM reports its vCPUs running (its control socket is up
/// by then) on its ready pipe; kills it if it does not, and says why.
fn wait_ready(p: &Proc, ready: &mut ReadyPipe, paths: &Paths) -> Result<(), BackendError> {
    let r = ready.wait(READY_TIMEOUT);
    if r == Readiness::Ready {
        return Ok(());
    }
    end(p, Duration::from_secs(2));
    let detail = log_tail(paths);
    Err(match r {
        Readiness::TimedOut => BackendError::NotReady {
            timeout: READY_TIMEOUT,
            detail,
        },
        _ => BackendError::Exited { detail },
    })
}

/// The VMM's last messages (for error reports).
fn log_tail(paths: &Paths) -> String {
    crate::vm::log_tail(&paths.dir.join("vmm.log"), 3, " | ")
}

impl SandboxBackend for MicroVm {
    fn kind(&self) -> Kind {
        Kind::MicroVm
    }

    fn build_template(
        &self,
        spec: TemplateSpec,
        layers: &[shoal_images::layer_files::Layer],
        dir: &Path,
    ) -> Result<(), BackendError> {
        build_from_layout(&self.artifacts, &self.vmm, dir, spec, layers)
            .map_err(|e| BackendError::Build(Box::new(e)))
    }

    fn restore(&self, dir: &Path, from: &Source) -> Result<Arc<dyn SandboxVm>, BackendError> {
        let snapshot = match from {
            Source::Template(t) if t.join("state").is_file() => t.clone(),
            Source::Template(t) => return Err(BackendError::NoSource(t.clone())),
            Source::Paused(s) => match s.decode::<Saved>()? {
                Saved::Paused { snapshot } => self
                    .snapshot_of(dir, snapshot.as_deref())
                    .ok_or_else(|| BackendError::NoSource(dir.into()))?,
                Saved::Running { .. } => return Err(BackendError::NoSource(dir.into())),
            },
        };
        let paths = Paths::new(dir);
        let (p, mut ready) = spawn_restore(&self.vmm, &snapshot, &paths)?;
        wait_ready(&p, &mut ready, &paths)?;
        Ok(Arc::new(MicroVmSandbox { proc: p, paths }))
    }

    fn reattach(&self, dir: &Path, state: &BackendState) -> Result<Reattached, BackendError> {
        let Saved::Running {
            pid,
            start,
            api_sock,
            vsock,
        } = state.decode::<Saved>()?
        else {
            return Err(BackendError::NoSource(dir.into()));
        };
        let proc = Proc { pid, start };
        if !proc.alive() {
            return Err(BackendError::Gone(pid));
        }
        let vm = MicroVmSandbox {
            proc,
            paths: Paths {
                dir: dir.into(),
                api_sock,
                vsock,
            },
        };
        // Running, or frozen (vCPUs paused by the freezer).
        match vm.stats() {
            Ok(s) => Ok(Reattached {
                frozen: s.frozen,
                vm: Arc::new(vm),
            }),
            Err(e) => {
                end(&proc, Duration::from_secs(2));
                Err(BackendError::Unusable {
                    pid,
                    detail: e.to_string(),
                })
            }
        }
    }

    fn discard(&self, _dir: &Path, state: &BackendState) {
        if let Ok(Saved::Running { pid, start, .. }) = state.decode::<Saved>() {
            let p = Proc { pid, start };
            if p.alive() {
                end(&p, Duration::from_secs(2));
            }
        }
    }

    fn can_resume(&self, dir: &Path, state: &BackendState) -> bool {
        matches!(
            state.decode::<Saved>(),
            Ok(Saved::Paused { snapshot }) if self.snapshot_of(dir, snapshot.as_deref()).is_some()
        )
    }

    fn reclaim_strays(&self, root: &Path, keep: &dyn Fn(i32) -> bool) -> usize {
        let mut n = 0;
        for p in vm::processes_under(root, "shoal-vmm") {
            if !keep(p.pid) {
                end(&p, Duration::from_secs(2));
                n += 1;
            }
        }
        n
    }
}

/// One restored `shoal-vmm`.
#[derive(Debug)]
struct MicroVmSandbox {
    proc: Proc,
    paths: Paths,
}

impl MicroVmSandbox {
    /// Its control socket, with deadline `t` per call.
    fn control(&self, t: Duration) -> Client {
        Client::new(&self.paths.api_sock, t)
    }
}

impl SandboxVm for MicroVmSandbox {
    fn kind(&self) -> Kind {
        Kind::MicroVm
    }

    fn pid(&self) -> i32 {
        self.proc.pid
    }

    fn state(&self) -> BackendState {
        BackendState::encode(&Saved::Running {
            pid: self.proc.pid,
            start: self.proc.start,
            api_sock: self.paths.api_sock.clone(),
            vsock: self.paths.vsock.clone(),
        })
    }

    fn agent(&self) -> Transport {
        Transport::hybrid_vsock(&self.paths.vsock)
    }

    fn freeze(&self) -> Result<(), BackendError> {
        Ok(self.control(QUICK).pause()?)
    }

    fn thaw(&self) -> Result<(), BackendError> {
        Ok(self.control(QUICK).resume()?)
    }

    fn stats(&self) -> Result<VmStats, BackendError> {
        let s = self.control(Duration::from_secs(3)).stats()?;
        let frozen = match s.state {
            VmState::Running => false,
            VmState::Paused => true,
            other => {
                return Err(BackendError::Reply(format!(
                    "VM state {:?}: no guest",
                    other.as_str()
                )))
            }
        };
        Ok(VmStats {
            frozen,
            uptime_ms: s.uptime_ms,
        })
    }

    fn pause_to_disk(&self) -> Result<BackendState, BackendError> {
        let paths = &self.paths;
        let snap = paths.new_snapshot();
        self.control(SNAPSHOT).snapshot(&snap, false)?;
        let _ = self.control(QUICK).shutdown();
        self.proc.wait_gone(Duration::from_secs(5));
        for e in std::fs::read_dir(&paths.dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = e.file_name();
            if n.to_string_lossy().starts_with("snap-") && e.path() != snap {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let _ = std::fs::remove_file(&paths.api_sock);
        let _ = std::fs::remove_file(&paths.vsock);
        Ok(BackendState::encode(&Saved::Paused {
            snapshot: Some(snap),
        }))
    }

    fn snapshot(&self, dir: &Path) -> Result<(), BackendError> {
        let c = self.control(SNAPSHOT);
        let res = c
            .snapshot(dir, false)
            .map_err(BackendError::from)
            .and_then(|_| {
                // The scratch disk as it is at the snapshot (the VM stays
                // paused until the copy is made): the template's own, which
                // each sandbox restored from it copies in turn.
                match layers::scratch_disk(&self.paths.dir) {
                    Some(disk) => layers::clone_file(&disk, &dir.join(layers::SCRATCH_DISK))
                        .map(drop)
                        .map_err(BackendError::from),
                    None => Ok(()),
                }
            });
        let resumed = c.resume().map_err(BackendError::from);
        if res.is_err() {
            let _ = std::fs::remove_dir_all(dir);
        }
        res.and(resumed).map(drop)
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

    fn reap(&self) {
        self.proc.reap();
    }

    fn last_words(&self) -> String {
        log_tail(&self.paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_state_is_tagged_json() {
        let s = BackendState::encode(&Saved::Running {
            pid: 42,
            start: 7,
            api_sock: "/d/api.sock".into(),
            vsock: "/d/vsock.sock".into(),
        });
        assert_eq!(
            s.as_str(),
            r#"{"state":"running","pid":42,"start":7,"api_sock":"/d/api.sock","vsock":"/d/vsock.sock"}"#
        );
        // What the v2 -> v3 migration writes for a paused sandbox.
        let p = BackendState::from_stored(r#"{"state":"paused"}"#);
        assert_eq!(
            p.decode::<Saved>().unwrap(),
            Saved::Paused { snapshot: None }
        );
        assert!(BackendState::from_stored("{}").decode::<Saved>().is_err());
    }

    #[test]
    fn a_dead_vmm_is_not_reattached_and_paused_state_needs_its_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let b = MicroVm::new("/nonexistent/shoal-vmm", Layout::at(dir.path()));
        // A process that has ended.
        let mut c = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = vm::pid_of(&c);
        c.wait().unwrap();
        let s = BackendState::encode(&Saved::Running {
            pid,
            start: 1,
            api_sock: dir.path().join("api.sock"),
            vsock: dir.path().join("vsock.sock"),
        });
        assert!(matches!(
            b.reattach(dir.path(), &s),
            Err(BackendError::Gone(p)) if p == pid
        ));
        let paused = BackendState::from_stored(r#"{"state":"paused"}"#);
        assert!(!b.can_resume(dir.path(), &paused));
        let snap = dir.path().join("snap-0000000000000001");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(snap.join("state"), b"s").unwrap();
        assert!(b.can_resume(dir.path(), &paused));
        assert!(
            !b.can_resume(dir.path(), &s),
            "a running state resumes nothing"
        );
        assert!(matches!(
            b.restore(dir.path(), &Source::Template(dir.path().join("no-tpl"))),
            Err(BackendError::NoSource(_))
        ));
    }
}
