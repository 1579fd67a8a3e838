//! The seam between the daemon and the VMs its sandboxes run in: a
//! [`SandboxBackend`] is one kind of sandbox (how one is restored from a
//! template, reattached after a daemon restart, found dead), and a
//! [`SandboxVm`] is one running sandbox of that kind (frozen and thawed,
//! paused to disk, snapshotted into a template, killed, watched, and where
//! its agent is reached, a [`Transport`]). One sandbox is one VM process, whatever its
//! kind, so every kind is watched the same way (a pidfd).
//!
//! What a backend needs to find its VM again (after a daemon restart, or
//! to resume a paused one) is its [`BackendState`]: text the backend
//! writes and reads back, which the daemon stores without looking inside.
//!
//! Kinds: [`microvm::MicroVm`] (our `shoal-vmm`, restored from snapshots,
//! controlled through its control socket) and [`fake::Fake`] (for tests
//! without KVM: a real `shoal-agent` process serving on a Unix socket), and
//! [`qemu::Qemu`] (a full VM on QEMU, driven through QMP).

pub mod fake;
pub mod microvm;
pub mod microvm_template;
pub mod qemu;
pub mod qemu_bridge;
pub mod qemu_console;
pub mod qemu_console_agent;
pub mod qemu_disk;
pub mod qemu_input;
pub mod qemu_launch;
pub mod qemu_net;
pub mod qemu_probe;

pub use qemu_input::InputEvent;

use crate::sandbox::TemplateSpec;
pub use crate::vmm_net::{NetAttach, NetLimits};
pub use agent_client::Transport;
use serde::{Deserialize, Serialize};
use shoal_images::layer_files::Layer;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A kind of sandbox (and of template: a template is restored by the
/// backend of its kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kind {
    /// A `shoal-vmm` microVM restored from a snapshot.
    #[serde(rename = "microvm")]
    MicroVm,
    /// A host process serving the agent protocol (tests without KVM).
    #[serde(rename = "fake")]
    Fake,
    /// A full VM on QEMU (q35, a display, a disk overlay over a base image).
    #[serde(rename = "vm")]
    Vm,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::MicroVm, Kind::Fake, Kind::Vm];

    /// Name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::MicroVm => "microvm",
            Kind::Fake => "fake",
            Kind::Vm => "vm",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a backend keeps about one sandbox's VM (JSON it writes and reads
/// back; opaque to everyone else).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BackendState(String);

impl BackendState {
    /// State as stored.
    pub fn from_stored(s: impl Into<String>) -> BackendState {
        BackendState(s.into())
    }

    /// The text to store.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn encode<T: Serialize>(v: &T) -> BackendState {
        // Plain structs of paths and integers always serialize.
        BackendState(serde_json::to_string(v).unwrap_or_default())
    }

    fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, BackendError> {
        serde_json::from_str(&self.0).map_err(|source| BackendError::State {
            state: self.0.clone(),
            source,
        })
    }
}

/// A VM's counters, as far as its kind knows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmStats {
    /// Its vCPUs are paused (frozen); it holds its memory but runs nothing.
    pub frozen: bool,
    /// Milliseconds since it started (or was restored).
    pub uptime_ms: u64,
}

/// What a sandbox's VM starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A template of the backend's kind (its directory).
    Template(PathBuf),
    /// The sandbox's own state from [`SandboxVm::pause_to_disk`].
    Paused(BackendState),
    /// A snapshot of a running sandbox ([`SandboxVm::snapshot`]) that is
    /// needed only while the VM starts (a fork's): the VM keeps nothing of
    /// that directory by its path (its memory stays mapped, a scratch disk
    /// is copied), so the directory may be removed once `restore` returns,
    /// and neither the VM's state nor its later snapshots name it.
    Snapshot(PathBuf),
}

/// Errors of a backend; each says what failed, with its cause.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The VM process could not be started.
    #[error(transparent)]
    Spawn(#[from] crate::vmm_process::VmmProcessError),
    /// The VMM's jail could not be set up.
    #[error("jail: {0}")]
    Jail(String),
    /// File system.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The VM process ended while starting.
    #[error("the VM process exited while starting: {detail}")]
    Exited {
        /// Its last messages.
        detail: String,
    },
    /// The VM did not come up in time (it was killed).
    #[error("the VM did not report ready within {timeout:?}: {detail}")]
    NotReady {
        /// The time allowed.
        timeout: Duration,
        /// Its last messages.
        detail: String,
    },
    /// A request on the VMM's control socket failed.
    #[error("VMM: {0}")]
    Control(#[from] vmm_api::ApiError),
    /// The VMM answered, but not with what was asked for.
    #[error("VMM: unexpected reply: {0}")]
    Reply(String),
    /// The template or paused state to start from is missing or not of
    /// this kind.
    #[error("nothing to restore from in {0}")]
    NoSource(PathBuf),
    /// The stored state is not this backend's.
    #[error("backend state {state:?} is unreadable: {source}")]
    State {
        /// The text.
        state: String,
        /// Why.
        source: serde_json::Error,
    },
    /// The VM process is gone (or is not the one the state names).
    #[error("the VM process (pid {0}) is gone")]
    Gone(i32),
    /// The VM process runs but does not answer as it should (it was ended).
    #[error("the VM process (pid {pid}) does not answer: {detail}")]
    Unusable {
        /// Its pid.
        pid: i32,
        /// What went wrong.
        detail: String,
    },
    /// Building a template failed.
    #[error(transparent)]
    Build(#[from] Box<microvm_template::BuildError>),
    /// Copying the scratch disk failed.
    #[error(transparent)]
    Layer(#[from] shoal_images::layers::LayerError),
    /// This kind of VM cannot do what was asked (e.g. a screenshot of a
    /// microVM, which has no display).
    #[error("a {0} sandbox cannot do this: {1}")]
    Unsupported(Kind, &'static str),
    /// A failure a test asked the fake backend for.
    #[error("injected failure: {0}")]
    Injected(&'static str),
}

impl BackendError {
    /// Whether the fault is this host's (the VM could not even be started),
    /// not the sandbox's.
    pub fn is_host_fault(&self) -> bool {
        matches!(
            self,
            BackendError::Spawn(_) | BackendError::Io { .. } | BackendError::Jail(_)
        )
    }
}

/// Deadline of a VMM's `evict` request (it writes at most guest RAM).
pub const EVICT_DEADLINE: Duration = Duration::from_secs(50);

/// One running sandbox VM.
pub trait SandboxVm: Send + Sync + std::fmt::Debug {
    /// Its kind.
    fn kind(&self) -> Kind;
    /// The VM process's id (a jailed VMM's: its jailer's, the process
    /// that is started, watched and killed).
    fn pid(&self) -> i32;
    /// The VMM's own host pid (for what reads its /proc entry: memory,
    /// threads); [`Self::pid`] where it is not jailed.
    fn vmm_pid(&self) -> i32 {
        self.pid()
    }
    /// What the backend needs to find this VM again after a restart.
    fn state(&self) -> BackendState;
    /// Where its agent listens: a hybrid-vsock socket and port for a
    /// microVM, a plain Unix socket for the fake kind.
    fn agent(&self) -> Transport;
    /// Pauses its vCPUs (the process and memory stay; nothing is written).
    fn freeze(&self) -> Result<(), BackendError>;
    /// Continues its vCPUs.
    fn thaw(&self) -> Result<(), BackendError>;
    /// Its counters.
    fn stats(&self) -> Result<VmStats, BackendError>;
    /// Saves its state into the sandbox's directory and ends the process;
    /// the returned state resumes it ([`Source::Paused`]). On failure the
    /// VM may still run, paused: [`Self::thaw`] continues it.
    fn pause_to_disk(&self) -> Result<BackendState, BackendError>;
    /// Writes a template of its kind into `dir` (created); the VM goes on
    /// running. On failure `dir` is removed and the VM is continued.
    fn snapshot(&self, dir: &Path) -> Result<(), BackendError>;
    /// Ends it now, with no grace for the guest (it has nothing to save);
    /// its exit is reported through [`Self::exit_fd`] as any other.
    fn kill(&self);
    /// Kills it and waits (at most `timeout`) until it is gone.
    fn destroy(&self, timeout: Duration);
    /// A descriptor that becomes readable when the process ends (a pidfd).
    fn exit_fd(&self) -> std::io::Result<OwnedFd>;
    /// Whether the process still exists.
    fn alive(&self) -> bool;
    /// Collects the ended process's exit status if this process started
    /// it; returns it when this call collected it.
    fn reap(&self) -> Option<std::process::ExitStatus>;
    /// Its last messages (why it ended, for error reports).
    fn last_words(&self) -> String;
    /// A PNG of its display.
    fn screen(&self) -> Result<Vec<u8>, BackendError> {
        Err(BackendError::Unsupported(self.kind(), "it has no display"))
    }
    /// Sends keyboard and pointer events to its display.
    fn input(&self, _events: &[InputEvent]) -> Result<(), BackendError> {
        Err(BackendError::Unsupported(self.kind(), "it has no display"))
    }
    /// Pushes the guest memory private to this VM out of host RAM
    /// (`vmm_api::Request::Evict`; the eviction file, where one is
    /// needed, goes into the sandbox's directory). `None`: this kind
    /// cannot.
    fn evict(&self) -> Option<Result<vmm_api::EvictInfo, BackendError>> {
        None
    }
    /// Its balloon: sets the target (MiB) if given and reports
    /// (`vmm_api::Request::Balloon`). `None`: this kind has none.
    fn balloon(
        &self,
        _target_mib: Option<u64>,
    ) -> Option<Result<vmm_api::BalloonInfo, BackendError>> {
        None
    }
    /// Schedules every thread of its process by `class`
    /// ([`crate::sched::apply`] on [`Self::vmm_pid`]): after each start
    /// (the policy and cookie are inherited by threads started later, and
    /// kept across freeze/thaw and a daemon restart) and when the class
    /// changes.
    fn set_class(
        &self,
        class: crate::sched::Class,
    ) -> Result<crate::sched::Applied, crate::sched::SchedError> {
        crate::sched::apply(self.vmm_pid(), class)
    }
}

/// A VM process started ahead for one sandbox of one template, before
/// that sandbox is asked for ([`SandboxBackend::stock`]): for a microVM, a
/// jailed `shoal-vmm --prewarm` (uid, namespaces, root, cgroup, KVM VM,
/// memory slots and vCPUs made) waiting on its control socket, so that a
/// create pays only the restore itself. Its sandbox directory was chosen
/// when it was started. Dropping one without [`Self::discard`] leaves its
/// process running.
pub trait StockedVm: Send + Sync + std::fmt::Debug {
    /// Its process (a jailed VMM's: its jailer).
    fn pid(&self) -> i32;
    /// Whether its process still runs (one that died is never handed out).
    fn alive(&self) -> bool;
    /// Loads `template` (the directory it was made for) into it and waits
    /// until the guest runs; on failure the process is ended.
    fn restore(self: Box<Self>, template: &Path) -> Result<Arc<dyn SandboxVm>, BackendError>;
    /// Ends its process (its jail's cgroup and uid go with it); the
    /// caller removes its directory.
    fn discard(self: Box<Self>);
}

/// A VM found again after a daemon restart.
#[derive(Debug)]
pub struct Reattached {
    /// The VM.
    pub vm: Arc<dyn SandboxVm>,
    /// Its vCPUs were paused (frozen) when found.
    pub frozen: bool,
}

/// One kind of sandbox.
pub trait SandboxBackend: Send + Sync {
    /// The kind.
    fn kind(&self) -> Kind;
    /// Makes the image template of `spec` in `dir` (booted once and
    /// snapshotted): `layers` (image names, or erofs files already open and
    /// checked) become `spec`'s layers. On failure nothing is left in `dir`.
    fn build_template(
        &self,
        spec: TemplateSpec,
        layers: &[Layer],
        dir: &Path,
    ) -> Result<(), BackendError>;
    /// Starts the VM of the sandbox whose directory is `dir` from `from`,
    /// and waits until it runs. With `net` (a networked sandbox, restored
    /// from a networked template or its own pause snapshot), the VM's net
    /// device is on that TAP and the VM in that network namespace.
    fn restore(
        &self,
        dir: &Path,
        from: &Source,
        net: Option<&NetAttach>,
    ) -> Result<Arc<dyn SandboxVm>, BackendError>;
    /// Starts, ahead of its sandbox, the VM process of a sandbox in `dir`
    /// that will be restored from `template` (of `vcpus` and `memory_mib`),
    /// and waits until it is ready for that; `Ok(None)` where this kind
    /// makes nothing ahead. With `net` (a networked template's stock, made
    /// with a network slot of its own), the VM's net device will be on
    /// that TAP and the VM is in that network namespace, as
    /// [`SandboxBackend::restore`] with `net` would make it.
    fn stock(
        &self,
        _dir: &Path,
        _template: &Path,
        _vcpus: u8,
        _memory_mib: u32,
        _net: Option<&NetAttach>,
    ) -> Result<Option<Box<dyn StockedVm>>, BackendError> {
        Ok(None)
    }
    /// The VM `state` names, if its process is still there and answers
    /// (one that runs but does not answer is ended).
    fn reattach(&self, dir: &Path, state: &BackendState) -> Result<Reattached, BackendError>;
    /// Ends the VM `state` names, if it is still there (a sandbox that was
    /// half started or half paused when the daemon stopped).
    fn discard(&self, dir: &Path, state: &BackendState);
    /// Whether a paused sandbox's saved state is still on disk.
    fn can_resume(&self, dir: &Path, state: &BackendState) -> bool;
    /// Ends the VM processes of this kind that belong under `root` (the
    /// sandboxes' directories) but not to `keep`; returns how many.
    fn reclaim_strays(&self, root: &Path, keep: &dyn Fn(i32) -> bool) -> usize;
    /// Removes the cgroups VMMs of this kind left behind (their jailer was
    /// killed before it could remove them) that are older than `age` (a
    /// younger one may be one a VMM start made and has not joined yet);
    /// one with tasks is never removed. Returns how many went.
    fn sweep_cgroups(&self, _age: Duration) -> usize {
        0
    }
}

/// A process identified by pid and start time, so a recycled pid is never
/// taken for it (shared by the kinds: each is one process).
pub(crate) use crate::vm::Proc;

/// Waits until `p` is gone, killing it if it outlives `timeout`.
pub(crate) fn end(p: &Proc, timeout: Duration) -> Option<std::process::ExitStatus> {
    p.kill();
    p.wait_gone(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.as_str())
            );
        }
        assert_eq!(Kind::parse("micro_vm"), None);
    }
}
