//! The microVM kind: each sandbox is a `shoal-vmm` process restored from
//! a snapshot (a template's, or its own pause snapshot) in its own session,
//! so it outlives a daemon restart; it is controlled through its control
//! socket and its agent is reached through its hybrid-vsock socket.

use super::microvm_template::build_from_layout;
use super::{
    BackendError, BackendState, Kind, NetAttach, Proc, Reattached, SandboxBackend, SandboxVm,
    Source, Transport, VmStats,
};
use crate::jail::{self, JailConfig};
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
/// Empty VMM cgroups older than this are leftovers (a VMM start joins
/// the one made for it within its restore's readiness deadline).
pub const CGROUP_AGE: Duration = Duration::from_secs(60);

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
        /// The files outside its directory its snapshots need (those
        /// of the snapshot it was restored from: [`jail::template_files`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        files: Vec<PathBuf>,
        /// Its cgroup's directories (jailed): removed by a restarted
        /// daemon that finds the VMM gone, wherever they were made.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        cgroups: Vec<PathBuf>,
    },
    /// Paused to disk: no VMM; the snapshot is in the sandbox's directory.
    Paused {
        /// The snapshot (absent: the newest `snap-*` in the directory).
        #[serde(default)]
        snapshot: Option<PathBuf>,
        /// The files outside the directory the snapshot needs.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        files: Vec<PathBuf>,
    },
}

#[path = "microvm_stock.rs"]
mod stock;

/// `shoal-vmm` microVMs.
#[derive(Debug, Clone)]
pub struct MicroVm {
    vmm: PathBuf,
    artifacts: Layout,
    jail: Option<JailConfig>,
}

impl MicroVm {
    /// Sandboxes run by the VMM binary `vmm`; image templates booted from
    /// the guest kernel and images installed in `artifacts`.
    pub fn new(vmm: impl Into<PathBuf>, artifacts: Layout) -> MicroVm {
        MicroVm {
            vmm: vmm.into(),
            artifacts,
            jail: None,
        }
    }

    /// Starts every sandbox VMM through the jailer (`None`: unjailed).
    pub fn with_jail(mut self, jail: Option<JailConfig>) -> MicroVm {
        self.jail = jail;
        self
    }

    /// Whether sandbox VMMs run jailed.
    pub fn jailed(&self) -> bool {
        self.jail.is_some()
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
            (true, _, _) => Saved::Paused {
                snapshot: None,
                files: vec![],
            },
            (false, Some(pid), Some(start)) => Saved::Running {
                pid,
                start,
                api_sock: paths.api_sock,
                vsock: paths.vsock,
                files: vec![],
                cgroups: vec![],
            },
            _ => return None,
        };
        Some(BackendState::encode(&saved))
    }

    /// What restoring the sandbox in `dir` from `from` maps: the snapshot,
    /// the files the jail binds read-only meanwhile, and the files its
    /// state and later snapshots record (a one-off snapshot's own directory
    /// is needed only until the VM runs: [`Source::Snapshot`]).
    fn restore_source(
        &self,
        dir: &Path,
        from: &Source,
    ) -> Result<(PathBuf, Vec<PathBuf>, Vec<PathBuf>), BackendError> {
        Ok(match from {
            Source::Template(t) | Source::Snapshot(t) if t.join("state").is_file() => {
                let files = jail::template_files(t);
                let keep = match from {
                    Source::Snapshot(_) => files.iter().filter(|f| *f != t).cloned().collect(),
                    _ => files.clone(),
                };
                (t.clone(), files, keep)
            }
            Source::Template(t) | Source::Snapshot(t) => {
                return Err(BackendError::NoSource(t.clone()))
            }
            Source::Paused(s) => match s.decode::<Saved>()? {
                Saved::Paused { snapshot, files } => (
                    self.snapshot_of(dir, snapshot.as_deref())
                        .ok_or_else(|| BackendError::NoSource(dir.into()))?,
                    files.clone(),
                    files,
                ),
                Saved::Running { .. } => return Err(BackendError::NoSource(dir.into())),
            },
        })
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
/// Jailed (`jail`), it sees `files` read-only besides its directory.
/// With `net`, its net device is on that TAP and its jail joins that
/// netns (the slot's) instead of a fresh one.
fn spawn_restore(
    vmm: &Path,
    snapshot: &Path,
    paths: &Paths,
    at: &Restore<'_>,
) -> Result<(Proc, ReadyPipe, Vec<PathBuf>), BackendError> {
    let Restore { jail, files, net } = *at;
    let mut cgroups = vec![];
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
    if let Some(n) = net {
        p = p.net_tap(n.tap.clone(), n.mac, n.limits);
    }
    if let Some(j) = jail {
        let _ = std::fs::remove_file(paths.dir.join(jail::PID_FILE));
        let mut j = j
            .jail_for(&paths.dir, files, guest_bytes(snapshot, files))
            .map_err(|e| BackendError::Jail(e.to_string()))?;
        if let Some(n) = net {
            let ns = std::fs::File::open(&n.netns).map_err(|source| BackendError::Io {
                path: n.netns.clone(),
                source,
            })?;
            j.netns = Some(Arc::new(ns));
        }
        cgroups = j.cgroup_dirs();
        p = p.jail(j);
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
    Ok((Proc { pid, start }, ready, cgroups))
}

/// How [`spawn_restore`] confines and connects the VMM.
#[derive(Clone, Copy)]
struct Restore<'a> {
    jail: Option<&'a JailConfig>,
    files: &'a [PathBuf],
    net: Option<&'a NetAttach>,
}

/// Ends a VMM or its jailer: SIGTERM, then SIGKILL if it is still there
/// after `timeout`. The VMM has no SIGTERM handler, so it ends at once
/// either way; a jailer ends its VMM on SIGTERM (SIGKILL in its place, as
/// PID 1 of its namespace ignores signals it has no handler for), then
/// removes the VMM's cgroup, which a SIGKILLed jailer would leave behind.
fn stop(p: &Proc, timeout: Duration) -> Option<std::process::ExitStatus> {
    p.signal(libc::SIGTERM);
    p.wait_gone(timeout)
}

/// Guest RAM (the snapshot's memory file) and images (the `.erofs`
/// files among `files` and in the directories there): what a jailed
/// VMM's cgroup allows beyond its overhead.
fn guest_bytes(snapshot: &Path, files: &[PathBuf]) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut n = size(&snapshot.join("memory"));
    for f in files {
        if f.is_dir() {
            for e in std::fs::read_dir(f).into_iter().flatten().flatten() {
                if e.path().extension().is_some_and(|x| x == "erofs") {
                    n += size(&e.path());
                }
            }
        } else {
            n += size(f);
        }
    }
    n
}

/// Waits until the VMM reports its vCPUs running (its control socket is up
/// by then) on its ready pipe; kills it if it does not, and says why.
fn wait_ready(p: &Proc, ready: &mut ReadyPipe, paths: &Paths) -> Result<(), BackendError> {
    let r = ready.wait(READY_TIMEOUT);
    if r == Readiness::Ready {
        return Ok(());
    }
    let status = stop(p, Duration::from_secs(2));
    let detail = vm::with_exit_cause(status, &log_tail(paths));
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
        if spec.vm_disk.is_some() {
            return Err(BackendError::Reply(
                "a microvm template takes no vm disk".into(),
            ));
        }
        build_from_layout(
            &self.artifacts,
            &self.vmm,
            dir,
            spec,
            layers,
            self.jail.as_ref(),
        )
        .map_err(|e| BackendError::Build(Box::new(e)))?;
        if self.jailed() {
            jail::share_template(dir).map_err(|e| BackendError::Jail(e.to_string()))?;
        }
        Ok(())
    }

    fn restore(
        &self,
        dir: &Path,
        from: &Source,
        net: Option<&NetAttach>,
    ) -> Result<Arc<dyn SandboxVm>, BackendError> {
        let (snapshot, files, keep) = self.restore_source(dir, from)?;
        let paths = Paths::new(dir);
        let at = Restore {
            jail: self.jail.as_ref(),
            files: &files,
            net,
        };
        let (p, mut ready, cgroups) = spawn_restore(&self.vmm, &snapshot, &paths, &at)?;
        wait_ready(&p, &mut ready, &paths)?;
        Ok(Arc::new(MicroVmSandbox {
            proc: p,
            paths,
            files: keep,
            jailed: self.jailed(),
            cgroups,
        }))
    }

    fn stock(
        &self,
        dir: &Path,
        template: &Path,
        vcpus: u8,
        memory_mib: u32,
        net: Option<&NetAttach>,
    ) -> Result<Option<Box<dyn super::StockedVm>>, BackendError> {
        stock::stock(self, dir, template, (vcpus, memory_mib), net).map(Some)
    }

    fn reattach(&self, dir: &Path, state: &BackendState) -> Result<Reattached, BackendError> {
        let Saved::Running {
            pid,
            start,
            api_sock,
            vsock,
            files,
            cgroups,
        } = state.decode::<Saved>()?
        else {
            return Err(BackendError::NoSource(dir.into()));
        };
        let proc = Proc { pid, start };
        if !proc.alive() {
            // Its jailer did not remove its cgroup (it was killed too).
            jail::remove_cgroups(&cgroups);
            return Err(BackendError::Gone(pid));
        }
        let vm = MicroVmSandbox {
            proc,
            paths: Paths {
                dir: dir.into(),
                api_sock,
                vsock,
            },
            files,
            jailed: self.jailed(),
            cgroups: cgroups.clone(),
        };
        // Running, or frozen (vCPUs paused by the freezer).
        match vm.stats() {
            Ok(s) => Ok(Reattached {
                frozen: s.frozen,
                vm: Arc::new(vm),
            }),
            Err(e) => {
                stop(&proc, Duration::from_secs(2));
                jail::remove_cgroups(&cgroups);
                Err(BackendError::Unusable {
                    pid,
                    detail: e.to_string(),
                })
            }
        }
    }

    fn discard(&self, _dir: &Path, state: &BackendState) {
        if let Ok(Saved::Running {
            pid,
            start,
            cgroups,
            ..
        }) = state.decode::<Saved>()
        {
            let p = Proc { pid, start };
            if p.alive() {
                stop(&p, Duration::from_secs(2));
            }
            jail::remove_cgroups(&cgroups);
        }
    }

    fn can_resume(&self, dir: &Path, state: &BackendState) -> bool {
        matches!(
            state.decode::<Saved>(),
            Ok(Saved::Paused { snapshot, .. }) if self.snapshot_of(dir, snapshot.as_deref()).is_some()
        )
    }

    fn reclaim_strays(&self, root: &Path, keep: &dyn Fn(i32) -> bool) -> usize {
        let mut n = 0;
        for p in vm::processes_under(root, "shoal-vmm") {
            // A jailed VMM's tracked process is its jailer, its parent.
            if !keep(p.pid) && !vm::parent_of(p.pid).is_some_and(keep) {
                stop(&p, Duration::from_secs(2));
                n += 1;
            }
        }
        // Cgroups of jailers that were SIGKILLed (a live VMM's cgroup
        // cannot be removed: rmdir refuses a cgroup with tasks).
        self.sweep_cgroups(CGROUP_AGE);
        n
    }

    fn sweep_cgroups(&self, age: Duration) -> usize {
        match self.jailed() {
            true => shoal_jailer::cgroup::sweep(age),
            false => 0,
        }
    }
}

/// One restored `shoal-vmm`.
#[derive(Debug)]
struct MicroVmSandbox {
    /// The VMM, or its jailer.
    proc: Proc,
    paths: Paths,
    /// What its snapshots need outside its directory.
    files: Vec<PathBuf>,
    /// Whether `proc` is a jailer.
    jailed: bool,
    /// Its cgroup's directories (jailed).
    cgroups: Vec<PathBuf>,
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

    fn vmm_pid(&self) -> i32 {
        match self.jailed {
            true => jail::vmm_pid(self.proc.pid, &self.paths.dir).unwrap_or(self.proc.pid),
            false => self.proc.pid,
        }
    }

    fn set_class(
        &self,
        class: crate::sched::Class,
    ) -> Result<crate::sched::Applied, crate::sched::SchedError> {
        // Never the jailer's threads in the VMM's place.
        let pid = match self.jailed {
            true => jail::vmm_pid(self.proc.pid, &self.paths.dir).ok_or(
                crate::sched::SchedError::NoVmm {
                    jailer: self.proc.pid,
                },
            )?,
            false => self.proc.pid,
        };
        crate::sched::apply(pid, class)
    }

    fn state(&self) -> BackendState {
        BackendState::encode(&Saved::Running {
            pid: self.proc.pid,
            start: self.proc.start,
            api_sock: self.paths.api_sock.clone(),
            vsock: self.paths.vsock.clone(),
            files: self.files.clone(),
            cgroups: self.cgroups.clone(),
        })
    }

    fn agent(&self) -> Transport {
        Transport::hybrid_vsock(&self.paths.vsock)
    }

    fn evict(&self) -> Option<Result<vmm_api::EvictInfo, BackendError>> {
        let c = self.control(crate::backend::EVICT_DEADLINE);
        Some(c.evict(&self.paths.dir).map_err(Into::into))
    }

    fn balloon(&self, mib: Option<u64>) -> Option<Result<vmm_api::BalloonInfo, BackendError>> {
        Some(self.control(QUICK).balloon(mib).map_err(Into::into))
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
        if let Err(e) = self.control(SNAPSHOT).snapshot(&snap, false) {
            // A pause cut short (a full disk, a deadline) leaves no partial
            // snapshot behind: the VM runs on and a later pause starts clean.
            let _ = std::fs::remove_dir_all(&snap);
            return Err(e.into());
        }
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
            files: self.files.clone(),
        }))
    }

    fn snapshot(&self, dir: &Path) -> Result<(), BackendError> {
        let c = self.control(SNAPSHOT);
        // A jailed VMM writes only inside its own directory: the snapshot
        // is made there, then moved into place on the host side.
        let out = match self.jailed {
            true => self.paths.dir.join(".snapshot-new"),
            false => dir.to_path_buf(),
        };
        if self.jailed {
            let _ = std::fs::remove_dir_all(&out);
        }
        let res = c
            .snapshot(&out, false)
            .map_err(BackendError::from)
            .and_then(|_| match self.jailed {
                true => move_dir(&out, dir),
                false => Ok(()),
            })
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
        // Restoring it needs what this VM's snapshot needed, and itself.
        let res = res.and_then(|()| {
            jail::write_files(dir, &self.files)
                .and_then(|()| match self.jailed {
                    true => jail::share_template(dir),
                    false => Ok(()),
                })
                .map_err(|e| BackendError::Jail(e.to_string()))
        });
        if res.is_err() {
            let _ = std::fs::remove_dir_all(dir);
            let _ = std::fs::remove_dir_all(self.paths.dir.join(".snapshot-new"));
        }
        res.and(resumed).map(drop)
    }

    fn kill(&self) {
        self.proc.signal(libc::SIGTERM);
    }

    fn destroy(&self, timeout: Duration) {
        stop(&self.proc, timeout);
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
        log_tail(&self.paths)
    }
}

/// Moves directory `from` to `to` (renamed; copied file by file across
/// file systems).
fn move_dir(from: &Path, to: &Path) -> Result<(), BackendError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BackendError::Io { path, source }
    };
    if std::fs::rename(from, to).is_ok() {
        return Ok(());
    }
    std::fs::create_dir_all(to).map_err(io(to))?;
    for e in std::fs::read_dir(from).map_err(io(from))? {
        let e = e.map_err(io(from))?;
        layers::clone_file(&e.path(), &to.join(e.file_name()))?;
    }
    std::fs::remove_dir_all(from).map_err(io(from))
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
            files: vec![],
            cgroups: vec![],
        });
        assert_eq!(
            s.as_str(),
            r#"{"state":"running","pid":42,"start":7,"api_sock":"/d/api.sock","vsock":"/d/vsock.sock"}"#
        );
        // What the v2 -> v3 migration writes for a paused sandbox.
        let p = BackendState::from_stored(r#"{"state":"paused"}"#);
        assert_eq!(
            p.decode::<Saved>().unwrap(),
            Saved::Paused {
                snapshot: None,
                files: vec![]
            }
        );
        assert!(BackendState::from_stored("{}").decode::<Saved>().is_err());
    }

    #[test]
    fn a_fork_snapshot_is_bound_while_restoring_and_never_recorded() {
        let root = tempfile::tempdir().unwrap();
        let b = MicroVm::new("/nonexistent/shoal-vmm", Layout::at(root.path()));
        // A snapshot of a sandbox restored from a template with a layer.
        let tpl = root.path().join("templates/t.000000000001");
        let layer = root.path().join("layers/kit.img");
        let snap = root.path().join("forks/src-000000000002");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(snap.join("state"), b"s").unwrap();
        jail::write_files(&snap, &[tpl.clone(), layer.clone()]).unwrap();
        let dir = root.path().join("sandboxes/c");
        let (s, files, keep) = b
            .restore_source(&dir, &Source::Snapshot(snap.clone()))
            .unwrap();
        assert_eq!(s, snap);
        assert_eq!(files, [snap.clone(), tpl.clone(), layer.clone()]);
        assert_eq!(
            keep,
            [tpl.clone(), layer.clone()],
            "the fork's directory is not kept"
        );
        // The same directory as a template is kept: it outlives its sandboxes.
        let (_, files, keep) = b
            .restore_source(&dir, &Source::Template(snap.clone()))
            .unwrap();
        assert_eq!(files, keep);
        assert_eq!(keep[0], snap);
        assert!(matches!(
            b.restore_source(&dir, &Source::Snapshot(root.path().join("gone"))),
            Err(BackendError::NoSource(_))
        ));
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
            files: vec![],
            cgroups: vec![],
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
            b.restore(
                dir.path(),
                &Source::Template(dir.path().join("no-tpl")),
                None
            ),
            Err(BackendError::NoSource(_))
        ));
    }
}

#[cfg(test)]
#[path = "microvm_cgroup_tests.rs"]
mod cgroup_tests;
