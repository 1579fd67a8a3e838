//! `shoald`: the host daemon. One per host; it restores sandboxes from warm
//! templates, runs commands and moves files in them, enforces limits,
//! survives its own restart and reports what it is doing.
//!
//! - [`api`]: HTTP/JSON routes (axum), served on a Unix socket and
//!   optionally on TCP with a bearer token, and the OpenAPI document
//!   generated from the same route table and the [`shoal_api`] types;
//!   [`listen`]: the listeners' connection cap, header and idle timeouts;
//!   [`auth`]: who calls ([`auth::Principal`]: Unix peer uid, TCP token);
//!   [`inputs`]: bounds on what a request may ask for.
//! - [`lifecycle`]: create, pause, resume, snapshot; built on [`ops`], the
//!   operations on one sandbox (row, admission, its VM, its agent);
//!   [`fork`]: a running sandbox into N live clones;
//!   [`templates`] and [`template_dirs`]: templates and their directories;
//!   [`template_names`]: the daemon's derived names and templates' owners.
//! - [`exec`]: exec and files through a sandbox's agent; [`commands`]:
//!   background commands, their output kept by [`command_output`].
//! - [`db`]: state in SQLite (WAL).
//! - [`watch`]: VM exits (pidfd) noticed and reclaimed; [`supervisor`]:
//!   TTL and idle sweeps, recovery on start (reattach or reclaim).
//! - [`pool`]: warm pools of restored sandboxes per template.
//! - [`fncall`]: stateless calls of code, each in a fresh clone of a
//!   per-language (warm) template.
//! - [`admission`], [`metrics`].
//!
//! The VMs themselves are the [`SandboxBackend`]'s: the daemon restores,
//! freezes, pauses, snapshots, watches and kills them only through it (the
//! microVM backend in production, the fake one in tests without KVM).

pub mod admission;
pub mod agent_limits;
pub mod api;
pub mod auth;
pub mod balloon;
pub mod command_output;
pub mod commands;
pub mod container_layers;
pub mod containers;
pub mod cpu_class;
pub mod cpu_share;
pub mod db;
pub mod display;
pub mod e2b;
pub mod evict;
pub mod exec;
pub mod exec_defaults;
pub mod fncall;
pub mod fork;
pub mod freeze;
pub mod fusion;
pub mod images;
pub mod inputs;
pub mod layer_files;
pub mod lifecycle;
pub mod listen;
pub mod metrics;
pub mod net;
pub mod net_dns;
pub mod net_guest;
pub mod ops;
pub mod pool;
pub mod state_perms;
pub mod stock;
pub mod supervisor;
pub mod template_dirs;
pub mod template_names;
pub mod templates;
pub mod vm_disk;
pub mod vm_templates;
pub mod watch;

use admission::{Limits, Refusal};
use agent_client::AsyncClient;
use db::Db;
use shoal_api::{ErrorBody, ErrorCode};
use shoal_images::layers::LayerError;
use shoal_runtime::backend::{BackendError, SandboxBackend, SandboxVm};
use shoal_runtime::fresh::random_id;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Daemon settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// State directory (database, sockets, sandboxes).
    pub state_dir: PathBuf,
    /// Admission limits.
    pub limits: Limits,
    /// Deadline for connecting to a sandbox's agent.
    pub agent_timeout: Duration,
    /// How often TTLs and idle timeouts are checked.
    pub sweep_interval: Duration,
    /// Refill pools (off in some tests).
    pub pools: bool,
    /// Pause the vCPUs of sandboxes idle this long (see [`freeze`]).
    pub freeze_after: Option<Duration>,
    /// VMM restores in flight at most.
    pub max_restores: usize,
    /// Deadlines and bounds of calls into sandboxes' agents.
    pub agent: agent_limits::AgentLimits,
    /// Connection and body limits of the API's listeners.
    pub http: listen::HttpLimits,
    /// The only directory layer files may come from (`None`: `layers` in
    /// the state directory); see [`Config::layers_dir`].
    pub layers_dir: Option<PathBuf>,
    /// VMMs started ahead per template for creates the warm pool does not
    /// serve ([`stock`]; 0: none).
    pub vmm_stock: usize,
    /// How pulls go and the image store's cap.
    pub images: images::ImageOptions,
    /// How sandboxes get networks.
    pub net: net::NetOptions,
    /// When idle sandboxes' memory is evicted ([`evict`]).
    pub evict: evict::EvictPolicy,
    /// The virtio-balloon new templates get (`None`: none; see [`balloon`]).
    pub balloon: Option<shoal_runtime::vmm_balloon::BalloonOptions>,
}

#[cfg(test)]
impl Config {
    /// A test daemon in `state_dir` on a host of `host_memory_mib` and
    /// `host_cpus` holding at most `max_vms`: no overcommit, no memory or
    /// disk reserve, 1 s deadlines, no pools, no freezing, one restore at
    /// a time, default agent and listener limits.
    pub(crate) fn for_tests(
        state_dir: &std::path::Path,
        host_memory_mib: u64,
        host_cpus: u64,
        max_vms: u64,
    ) -> Config {
        Config {
            state_dir: state_dir.into(),
            limits: Limits {
                host_memory_mib,
                host_cpus,
                memory_overcommit: 1.0,
                cpu_overcommit: 1.0,
                min_available_mib: 0,
                max_vms,
                disk_budget_mib: 0,
                min_free_disk_mib: 0,
                disk_overcommit: 1.0,
            },
            agent_timeout: Duration::from_secs(1),
            sweep_interval: Duration::from_secs(1),
            pools: false,
            freeze_after: None,
            max_restores: 1,
            agent: Default::default(),
            http: Default::default(),
            layers_dir: None,
            vmm_stock: 0,
            images: Default::default(),
            net: Default::default(),
            evict: Default::default(),
            balloon: None,
        }
    }
}

impl Config {
    /// The API's Unix socket.
    pub fn socket(&self) -> PathBuf {
        self.state_dir.join("shoald.sock")
    }

    /// Where sandbox directories live.
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.state_dir.join("sandboxes")
    }

    /// Where forks' snapshots live while their clones are restored
    /// ([`fork`]).
    pub fn forks_dir(&self) -> PathBuf {
        self.state_dir.join("forks")
    }

    /// The only directory callers' layer files may come from (the daemon
    /// opens files in it as root, beneath it, following no symbolic link;
    /// see [`layer_files`]).
    pub fn layers_dir(&self) -> PathBuf {
        self.layers_dir
            .clone()
            .unwrap_or_else(|| layer_files::default_layers_dir(&self.state_dir))
    }

    /// Where templates live: every template the daemon builds or
    /// snapshots, removed only by the daemon ([`template_dirs::sweep_dirs`]).
    pub fn templates_dir(&self) -> PathBuf {
        self.state_dir.join("templates")
    }

    /// A new directory for template `name`: `templates/NAME.ID`, never
    /// reused, so that a deleted template's files stay where the sandboxes
    /// restored from it recorded them until the last of those is gone.
    pub fn new_template_dir(&self, name: &str) -> PathBuf {
        self.templates_dir().join(format!(
            "{name}{}{}",
            template_dirs::DIR_ID_SEP,
            random_id()
        ))
    }
}

/// The default state directory: `$SHOAL_STATE/daemon` or
/// `~/.cache/shoal/daemon`.
pub fn default_state_dir() -> PathBuf {
    shoal_runtime::sandbox::state_dir().join("daemon")
}

/// Errors the API answers with. Each has an [`ErrorCode`] (and so an HTTP
/// status) and keeps its cause as a typed [`source`](std::error::Error::source)
/// where there is one; the body is always `{"error":{"code","message"}}`
/// with this error's `Display` as the message.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed or invalid.
    #[error("{0}")]
    BadRequest(String),
    /// 400: the body is not the JSON the route takes.
    #[error("invalid JSON body: {0}")]
    InvalidBody(#[source] serde_json::Error),
    /// 400: the layers or upper layer asked for are unusable.
    #[error("{0}")]
    Layers(#[source] LayerError),
    /// 401: missing or wrong bearer token.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: the caller may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// 413: the request body is larger than the route takes.
    #[error("{0}")]
    TooLarge(String),
    /// 404: no such sandbox, template, file.
    #[error("{0}")]
    NotFound(String),
    /// 409: not possible in the current state.
    #[error("{0}")]
    Conflict(String),
    /// 429: the sandbox has as much going on as it may.
    #[error("{0}")]
    Busy(String),
    /// 429 or 503: admission refused.
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// The sandbox's agent answered with an error or failed: 404 (ENOENT),
    /// 409 (EEXIST), 507 (ENOSPC, EDQUOT: the sandbox's file system is
    /// full), 400 (another errno: the request was wrong), 504 (its
    /// deadline), 502 (anything else).
    #[error("{}", agent_message(.0))]
    Agent(#[from] agent_client::ClientError),
    /// 502: the sandbox's agent could not be reached.
    #[error("sandbox '{id}' agent unreachable: {source}")]
    AgentUnreachable {
        /// The sandbox.
        id: String,
        /// Why.
        #[source]
        source: agent_client::ClientError,
    },
    /// The sandbox's VM failed (502), or could not even be started on
    /// this host (500), as its backend says.
    #[error("{context}: {source}")]
    Backend {
        /// What the daemon was doing.
        context: &'static str,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// 502: the sandbox failed otherwise.
    #[error("{0}")]
    Sandbox(String),
    /// 504: the deadline passed.
    #[error("{0}")]
    Timeout(String),
    /// 500: the state database failed.
    #[error("{0}")]
    Db(#[from] db::DbError),
    /// 500: a blocking task of the daemon panicked or was cancelled.
    #[error("{what}: {source}")]
    Task {
        /// The task.
        what: String,
        /// How it ended.
        #[source]
        source: tokio::task::JoinError,
    },
    /// 500: a thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
    /// 500: the queue of VMM restores was closed.
    #[error("{0}")]
    RestoreQueue(#[from] tokio::sync::AcquireError),
    /// 503: a network was asked for and this host cannot give one now.
    #[error("{0}")]
    NetworkUnavailable(String),
    /// 500: the daemon failed otherwise.
    #[error("{0}")]
    Internal(String),
}

/// The message of an agent error as the API has always given it.
fn agent_message(e: &agent_client::ClientError) -> String {
    match e {
        agent_client::ClientError::Remote { .. } => e.to_string(),
        _ => format!("sandbox agent: {e}"),
    }
}

impl ApiError {
    /// The machine-readable code (and so the HTTP status).
    pub fn code(&self) -> ErrorCode {
        use agent_client::ClientError as C;
        match self {
            ApiError::BadRequest(_) | ApiError::InvalidBody(_) | ApiError::Layers(_) => {
                ErrorCode::BadRequest
            }
            ApiError::Unauthorized(_) => ErrorCode::Unauthorized,
            ApiError::Forbidden(_) => ErrorCode::Forbidden,
            ApiError::TooLarge(_) => ErrorCode::PayloadTooLarge,
            ApiError::NotFound(_) => ErrorCode::NotFound,
            ApiError::Conflict(_) => ErrorCode::Conflict,
            ApiError::NetworkUnavailable(_) => ErrorCode::NetworkUnavailable,
            ApiError::Refused(Refusal::Quota(_)) => ErrorCode::HostFull,
            ApiError::Refused(Refusal::HostPressure(_)) => ErrorCode::HostMemoryLow,
            ApiError::Agent(C::Remote { errno, .. }) if *errno == libc::ENOENT => {
                ErrorCode::NotFound
            }
            ApiError::Agent(C::Remote { errno, .. }) if *errno == libc::EEXIST => {
                ErrorCode::Conflict
            }
            ApiError::Agent(C::Remote { errno, .. })
                if *errno == libc::ENOSPC || *errno == libc::EDQUOT =>
            {
                ErrorCode::InsufficientStorage
            }
            ApiError::Agent(C::Remote { .. }) => ErrorCode::BadRequest,
            ApiError::Agent(C::Timeout) | ApiError::Timeout(_) => ErrorCode::DeadlineExceeded,
            ApiError::Agent(C::Busy(_)) | ApiError::Busy(_) => ErrorCode::SandboxBusy,
            ApiError::Backend { source, .. } if source.is_host_fault() => ErrorCode::Internal,
            ApiError::Agent(_)
            | ApiError::AgentUnreachable { .. }
            | ApiError::Backend { .. }
            | ApiError::Sandbox(_) => ErrorCode::SandboxError,
            ApiError::Db(_)
            | ApiError::Task { .. }
            | ApiError::Thread(_)
            | ApiError::RestoreQueue(_)
            | ApiError::Internal(_) => ErrorCode::Internal,
        }
    }

    /// HTTP status code.
    pub fn status(&self) -> u16 {
        self.code().status()
    }

    /// The response body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody::new(self.code(), self.to_string())
    }
}

/// Result of API operations.
pub type ApiResult<T> = Result<T, ApiError>;

/// A sandbox's live (in-memory) side: its VM and agent connection.
pub struct Live {
    /// Sandbox id.
    pub id: String,
    /// Its directory.
    pub dir: PathBuf,
    /// Its running VM, if one runs.
    vm: Mutex<Option<Arc<dyn SandboxVm>>>,
    /// An exit now is the daemon's doing (kill, pause).
    pub expect_exit: AtomicBool,
    /// The next agent connection must send fresh entropy and time.
    pub needs_post_restore: AtomicBool,
    /// The cached agent connection.
    pub client: tokio::sync::Mutex<Option<AsyncClient>>,
    /// The last failed attempt to connect to the agent: when it ended and
    /// why (calls that waited for it fail with it; see [`ops::agent`]).
    pub connect_failed: Mutex<Option<(std::time::Instant, String)>>,
    /// Serializes lifecycle operations (pause, resume, snapshot, kill).
    pub op: tokio::sync::Mutex<()>,
    /// Operations in flight (a busy sandbox is never frozen).
    pub busy: AtomicUsize,
    /// The vCPUs are paused by the freezer.
    pub frozen: tokio::sync::Mutex<bool>,
    /// Last activity (monotonic ms).
    pub last_active_ms: AtomicU64,
    /// When its memory was last evicted (monotonic ms; 0: never).
    pub evicted_at_ms: AtomicU64,
    /// Its balloon's state when last asked ([`balloon`]).
    pub balloon: Mutex<Option<vmm_api::BalloonInfo>>,
    /// It has no balloon (not asked again).
    pub no_balloon: AtomicBool,
    /// Never frozen.
    pub keep_running: AtomicBool,
    /// Its VMM cgroup's CPU weight (fresh requests first).
    pub cpu: cpu_share::CpuShare,
    /// Its background commands.
    pub commands: commands::Registry,
}

impl Live {
    /// A live record for the sandbox `id` in `dir`.
    pub fn new(
        id: &str,
        dir: &std::path::Path,
        vm: Option<Arc<dyn SandboxVm>>,
        post_restore: bool,
    ) -> Live {
        Live {
            id: id.into(),
            dir: dir.into(),
            vm: Mutex::new(vm),
            expect_exit: AtomicBool::new(false),
            needs_post_restore: AtomicBool::new(post_restore),
            client: tokio::sync::Mutex::new(None),
            connect_failed: Mutex::new(None),
            op: tokio::sync::Mutex::new(()),
            busy: AtomicUsize::new(0),
            frozen: tokio::sync::Mutex::new(false),
            last_active_ms: AtomicU64::new(freeze::now_ms()),
            evicted_at_ms: AtomicU64::new(0),
            balloon: Mutex::new(None),
            no_balloon: AtomicBool::new(false),
            keep_running: AtomicBool::new(false),
            cpu: cpu_share::CpuShare::for_jail(
                &dir.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default(),
            ),
            commands: commands::Registry::default(),
        }
    }

    /// Its VM, if one runs.
    pub fn vm(&self) -> Option<Arc<dyn SandboxVm>> {
        self.vm.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records a new VM (or none).
    pub fn set_vm(&self, vm: Option<Arc<dyn SandboxVm>>) {
        *self.vm.lock().unwrap_or_else(|e| e.into_inner()) = vm;
        self.cpu.new_vmm();
    }

    /// Whether `vm` is this sandbox's current VM.
    pub fn is_current(&self, vm: &Arc<dyn SandboxVm>) -> bool {
        self.vm().is_some_and(|v| Arc::ptr_eq(&v, vm))
    }
}

/// The daemon's shared state.
pub struct Daemon {
    /// Settings.
    pub cfg: Config,
    /// The daemon's default kind of sandbox (what a template that names
    /// no kind is made of; the image, pool and VMM-stock paths use it).
    pub backend: Arc<dyn SandboxBackend>,
    /// Every kind this daemon runs, by kind ([`Self::backend`]'s included):
    /// a sandbox or template is always served by the backend of its row's
    /// kind ([`Self::backend_for`]).
    pub backends: HashMap<shoal_runtime::backend::Kind, Arc<dyn SandboxBackend>>,
    /// The database (short critical sections only).
    pub db: Mutex<Db>,
    /// Live sandboxes by id.
    pub live: Mutex<HashMap<String, Arc<Live>>>,
    /// Metrics.
    pub metrics: metrics::Metrics,
    /// Wakes the pool filler.
    pub pool_wake: tokio::sync::Notify,
    /// When a create last took a pooled sandbox ([`freeze::now_ms`]; 0:
    /// never): refills wait for a burst of such creates to pass.
    pub pool_hit_ms: std::sync::atomic::AtomicU64,
    /// Serializes template builds.
    pub building: tokio::sync::Mutex<()>,
    /// Bounds concurrent VMM restores: past a few per CPU they only slow
    /// each other down (KVM VM set-up and the guests' first instructions
    /// compete for the same cores), so excess creates queue here.
    pub restores: tokio::sync::Semaphore,
    /// E2B compatibility's state (the access tokens' key).
    pub e2b: e2b::E2bState,
    /// VMMs started ahead of their sandboxes.
    pub stock: stock::Stock,
    /// Sandbox networks.
    pub net: net::Networks,
}

impl Daemon {
    /// Opens the state and prepares the daemon, whose sandboxes `backend`
    /// runs (no tasks started yet).
    pub fn open(cfg: Config, backend: Arc<dyn SandboxBackend>) -> Result<Arc<Daemon>, String> {
        Daemon::open_with(cfg, backend, Vec::new())
    }

    /// [`Self::open`] with further kinds (`extra`, e.g. the `vm` kind when
    /// QEMU is present) beside the default `backend`; a kind given twice
    /// keeps the first.
    pub fn open_with(
        cfg: Config,
        backend: Arc<dyn SandboxBackend>,
        extra: Vec<Arc<dyn SandboxBackend>>,
    ) -> Result<Arc<Daemon>, String> {
        let mut backends = HashMap::new();
        for b in std::iter::once(backend.clone()).chain(extra) {
            backends.entry(b.kind()).or_insert(b);
        }
        state_perms::secure(&cfg)?;
        let db = Db::open(&cfg.state_dir.join("state.db")).map_err(|e| e.to_string())?;
        let permits = cfg.max_restores.max(1);
        let e2b = e2b::E2bState::open(&cfg.state_dir)?;
        let cfg_stock = cfg.vmm_stock;
        let net = net::Networks::new(cfg.net.clone());
        Ok(Arc::new(Daemon {
            cfg,
            backend,
            backends,
            db: Mutex::new(db),
            live: Mutex::new(HashMap::new()),
            metrics: metrics::Metrics::default(),
            pool_wake: tokio::sync::Notify::new(),
            pool_hit_ms: std::sync::atomic::AtomicU64::new(0),
            building: tokio::sync::Mutex::new(()),
            restores: tokio::sync::Semaphore::new(permits),
            e2b,
            stock: stock::Stock::new(cfg_stock),
            net,
        }))
    }

    /// The backend that serves sandboxes and templates of `kind`; `None`
    /// where this daemon does not run that kind.
    pub fn backend_for(
        &self,
        kind: shoal_runtime::backend::Kind,
    ) -> Option<Arc<dyn SandboxBackend>> {
        self.backends.get(&kind).cloned()
    }

    /// [`Self::backend_for`], or the API's error for a kind this daemon
    /// does not run (400: the host lacks it, e.g. QEMU for `vm`).
    pub fn backend_of(
        &self,
        kind: shoal_runtime::backend::Kind,
    ) -> ApiResult<Arc<dyn SandboxBackend>> {
        self.backend_for(kind).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "this daemon does not run {kind} sandboxes (kinds it runs: {})",
                self.kinds().join(", ")
            ))
        })
    }

    /// The kinds this daemon runs, by name, sorted.
    pub fn kinds(&self) -> Vec<&'static str> {
        let mut k: Vec<_> = self.backends.keys().map(|k| k.as_str()).collect();
        k.sort_unstable();
        k
    }

    /// Runs `f` with the database locked.
    pub fn db<T>(&self, f: impl FnOnce(&mut Db) -> Result<T, db::DbError>) -> ApiResult<T> {
        let mut g = self.db.lock().unwrap_or_else(|e| e.into_inner());
        Ok(f(&mut g)?)
    }

    /// Logs an event (errors are logged, not returned).
    pub fn event(&self, subject: &str, kind: &str, detail: &str) {
        tracing::info!(sandbox = subject, event = kind, "{detail}");
        if let Err(e) = self.db(|d| d.event(subject, kind, detail)) {
            tracing::warn!("event log: {e}");
        }
    }

    /// A live sandbox by id.
    pub fn live(&self, id: &str) -> Option<Arc<Live>> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// Registers a live sandbox.
    pub fn insert_live(&self, l: Arc<Live>) {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(l.id.clone(), l);
    }

    /// Forgets a live sandbox.
    pub fn remove_live(&self, id: &str) -> Option<Arc<Live>> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
    }
}

/// Runs blocking `f` on the blocking pool with a deadline.
pub async fn blocking<T: Send + 'static>(
    what: &str,
    deadline: Duration,
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    match tokio::time::timeout(deadline, tokio::task::spawn_blocking(f)).await {
        Ok(Ok(r)) => r,
        Ok(Err(source)) => Err(ApiError::Task {
            what: what.into(),
            source,
        }),
        Err(_) => Err(ApiError::Timeout(format!(
            "{what} did not finish within {deadline:?}"
        ))),
    }
}

/// Removes a sandbox's (or a discarded VM's) directory, trying again for a
/// few seconds while that fails: a VMM killed a moment ago can still be
/// writing its console or making its sockets there (a jailed VMM ends
/// after its jailer), and a directory left behind would leak. Logs what
/// it could not remove.
pub async fn remove_vm_dir(dir: std::path::PathBuf) {
    let mut pause = Duration::from_millis(50);
    for attempt in 1..=8 {
        let d = dir.clone();
        let err = match tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&d)).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => return,
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        if attempt == 8 {
            tracing::warn!(dir = %dir.display(), "could not remove a VM's directory: {err}");
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Runs `f` with a deadline: the async counterpart of [`blocking`], with
/// the same timeout error.
pub async fn within<T>(
    what: &str,
    deadline: Duration,
    f: impl std::future::Future<Output = ApiResult<T>>,
) -> ApiResult<T> {
    match tokio::time::timeout(deadline, f).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::Timeout(format!(
            "{what} did not finish within {deadline:?}"
        ))),
    }
}

/// Serves the API until SIGTERM or SIGINT: recovers state, starts the
/// supervisor, sweeps and pool filler, listens on the Unix socket (and on
/// `tcp` for callers with one of its bearer tokens). VMMs keep running
/// when it stops.
pub async fn serve(
    d: Arc<Daemon>,
    tcp: Option<(std::net::SocketAddr, auth::Tokens)>,
) -> Result<(), String> {
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    serve_until(d, tcp, stop).await
}

/// [`serve`], until `stop` completes instead of a signal (tests stop a
/// daemon this way and start another over the same state directory).
/// Each listener is served by [`listen::serve`] with the limits of
/// [`Config::http`] (its own connection cap each).
pub async fn serve_until(
    d: Arc<Daemon>,
    tcp: Option<(std::net::SocketAddr, auth::Tokens)>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let sock = d.cfg.socket();
    // Refuse to start twice on one state directory.
    if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
        return Err(format!("a daemon already listens on {}", sock.display()));
    }
    let _ = std::fs::remove_file(&sock);
    supervisor::recover(&d).await;
    template_dirs::recover(&d);
    fork::recover(&d);
    net::recover(&d).await;
    let unix =
        tokio::net::UnixListener::bind(&sock).map_err(|e| format!("{}: {e}", sock.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600));
    }
    let tcp = match tcp {
        None => None,
        Some((addr, tokens)) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("{addr}: {e}"))?;
            Some((l, tokens))
        }
    };
    tokio::spawn(supervisor::sweep_loop(d.clone()));
    if d.cfg.pools {
        tokio::spawn(pool::run(d.clone()));
    }
    if let Some(after) = d.cfg.freeze_after {
        tokio::spawn(freeze::run(d.clone(), after));
    }
    tokio::spawn(cpu_share::run(d.clone()));
    tokio::spawn(evict::run(d.clone(), d.cfg.evict));
    tokio::spawn(balloon::run(d.clone()));
    tokio::spawn(stock::run(d.clone()));
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(listen::serve(
        listen::Listener::Unix(unix),
        api::router(d.clone(), None),
        d.cfg.http.clone(),
        d.metrics.unix_conns.clone(),
        rx.clone(),
    ));
    if let Some((l, tokens)) = tcp {
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(%addr, ?tokens, "listening on TCP (bearer token required)");
        tasks.spawn(listen::serve(
            listen::Listener::Tcp(l),
            api::router(d.clone(), Some(tokens)),
            d.cfg.http.clone(),
            d.metrics.tcp_conns.clone(),
            rx.clone(),
        ));
    }
    tracing::info!(socket = %sock.display(), "shoald ready");
    stop.await;
    tracing::info!("stopping; sandboxes keep running and are reattached on the next start");
    let _ = tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    let _ = std::fs::remove_file(&sock);
    // Stocked VMMs belong to no sandbox: they end with the daemon.
    let stocked = d.stock.remove_all();
    let _ = tokio::task::spawn_blocking(move || stock::discard_now(stocked)).await;
    d.net.shutdown().await;
    Ok(())
}
