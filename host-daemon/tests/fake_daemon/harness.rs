//! A shoald in this test process on a temporary state directory, whose
//! sandboxes are fake-backend ones (real `shoal-agent` processes on the
//! host), driven through the typed HTTP client over its Unix socket. It
//! can be stopped and started again over the same state directory, as a
//! daemon restart.

use shoal_client::api::{self, CreateSandbox, ExecRequest, Sandbox, SandboxState};
use shoal_client::{ClientError, DaemonClient};
use shoal_runtime::backend::fake::{AgentRedirect, Fake, Faults};
use shoal_runtime::backend::SandboxBackend;
use shoald::admission::Limits;
use shoald::agent_limits::AgentLimits;
use shoald::{Config, Daemon};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a test daemon is set up.
#[derive(Clone)]
pub struct Opts {
    /// Most sandboxes holding a VM.
    pub max_vms: u64,
    /// Refuse below this much host MemAvailable (MiB).
    pub min_available_mib: u64,
    /// Freeze sandboxes idle this long.
    pub freeze_after: Option<Duration>,
    /// Refill pools.
    pub pools: bool,
    /// The agent binary (default: the workspace's).
    pub agent: Option<PathBuf>,
    /// Sandboxes whose agent is reached elsewhere (a hostile stand-in).
    pub redirect: Option<AgentRedirect>,
    /// Deadline for connecting to an agent.
    pub agent_timeout: Duration,
    /// Deadlines and bounds of agent calls.
    pub agent_limits: AgentLimits,
    /// Disk sandboxes may reserve (MiB; 0: no budget).
    pub disk_budget_mib: u64,
    /// Listener limits.
    pub http: shoald::listen::HttpLimits,
    /// VMMs (agent processes) started ahead per template.
    pub vmm_stock: usize,
    /// Pull options and the image store's cap.
    pub images: shoald::images::ImageOptions,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            max_vms: 64,
            min_available_mib: 0,
            freeze_after: None,
            pools: true,
            agent: None,
            redirect: None,
            agent_timeout: Duration::from_secs(10),
            agent_limits: AgentLimits::default(),
            disk_budget_mib: 0,
            http: Default::default(),
            vmm_stock: 0,
            images: Default::default(),
        }
    }
}

struct Running {
    rt: tokio::runtime::Runtime,
    stop: tokio::sync::oneshot::Sender<()>,
    done: std::sync::mpsc::Receiver<Result<(), String>>,
}

/// A test daemon.
pub struct TestDaemon {
    tmp: tempfile::TempDir,
    opts: Opts,
    /// The backend's failure switches.
    pub faults: Arc<Faults>,
    fake: Fake,
    /// The client.
    pub c: DaemonClient,
    run: Option<Running>,
}

impl TestDaemon {
    /// A daemon with default options, started.
    pub fn start() -> TestDaemon {
        Self::with(Opts::default())
    }

    /// A daemon with `opts`, started.
    pub fn with(opts: Opts) -> TestDaemon {
        let tmp = tempfile::tempdir().unwrap();
        let agent = opts
            .agent
            .clone()
            .unwrap_or_else(shoal_test_support::host_agent);
        let mut fake = Fake::new(agent);
        if let Some(r) = opts.redirect.clone() {
            fake = fake.with_agent_redirect(r);
        }
        let mut d = TestDaemon {
            c: DaemonClient::unix(tmp.path().join("state/shoald.sock")),
            faults: fake.faults(),
            fake,
            tmp,
            opts,
            run: None,
        };
        d.up();
        d
    }

    /// The state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.tmp.path().join("state")
    }

    /// Where sandbox directories are.
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.state_dir().join("sandboxes")
    }

    /// A scratch directory for the test's own files (sandboxes of the fake
    /// kind run on the host: their files are host files).
    pub fn scratch(&self, name: &str) -> PathBuf {
        let p = self.tmp.path().join("scratch").join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn config(&self) -> Config {
        Config {
            state_dir: self.state_dir(),
            limits: Limits {
                host_memory_mib: 1 << 20,
                host_cpus: 64,
                memory_overcommit: 1.0,
                cpu_overcommit: 1.0,
                min_available_mib: self.opts.min_available_mib,
                max_vms: self.opts.max_vms,
                disk_budget_mib: self.opts.disk_budget_mib,
                min_free_disk_mib: 0,
                disk_overcommit: 1.0,
            },
            agent_timeout: self.opts.agent_timeout,
            sweep_interval: Duration::from_millis(100),
            pools: self.opts.pools,
            freeze_after: self.opts.freeze_after,
            max_restores: 4,
            agent: self.opts.agent_limits,
            http: self.opts.http.clone(),
            layers_dir: None,
            vmm_stock: self.opts.vmm_stock,
            images: self.opts.images.clone(),
            // No DNS forwarder: a networked create is refused before
            // anything of the host's network is touched.
            net: shoald::net::NetOptions {
                dns: shoald::net_dns::DnsListen::Off,
                ..Default::default()
            },
            evict: Default::default(),
            balloon: None,
        }
    }

    /// Starts the daemon (recovering whatever the state directory holds).
    pub fn up(&mut self) {
        assert!(self.run.is_none(), "already running");
        let d = Daemon::open(self.config(), Arc::new(self.fake.clone())).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (tx, done) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let r = shoald::serve_until(d, None, async {
                let _ = stopped.await;
            })
            .await;
            let _ = tx.send(r);
        });
        self.run = Some(Running { rt, stop, done });
        let t0 = Instant::now();
        while !self.c.ping() {
            if let Ok(Err(e)) = self.run.as_ref().unwrap().done.try_recv() {
                panic!("the daemon did not start: {e}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the daemon as SIGTERM would (its sandboxes' processes keep
    /// running), and ends every task it had.
    pub fn down(&mut self) {
        let Some(r) = self.run.take() else { return };
        let _ = r.stop.send(());
        let res = r.done.recv_timeout(Duration::from_secs(20));
        r.rt.shutdown_timeout(Duration::from_secs(5));
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("the daemon failed: {e}"),
            Err(e) => panic!("the daemon did not stop: {e}"),
        }
    }

    /// Tasks alive on the daemon's runtime (its own, the API's connections,
    /// every agent connection's reader and writer).
    #[allow(dead_code)] // used by the hostile_agent tests
    pub fn alive_tasks(&self) -> usize {
        let r = self.run.as_ref().expect("running");
        r.rt.metrics().num_alive_tasks()
    }

    /// A restart over the same state directory.
    pub fn restart(&mut self) {
        self.down();
        self.up();
    }

    /// Creates a sandbox from the image `tiny` with `f` applied.
    pub fn create_with(&self, f: impl FnOnce(&mut CreateSandbox)) -> Sandbox {
        let mut req = CreateSandbox {
            image: Some("tiny".into()),
            ..Default::default()
        };
        f(&mut req);
        self.c.create(&req).expect("create")
    }

    /// Creates a plain sandbox.
    pub fn create(&self) -> Sandbox {
        self.create_with(|_| {})
    }

    /// Runs `sh -c script` in sandbox `id`: (exit code, stdout).
    pub fn sh(&self, id: &str, script: &str) -> Result<(Option<i32>, String), ClientError> {
        let r = self.c.exec(id, &ExecRequest::shell(script))?;
        Ok((r.exit_code, r.stdout))
    }

    /// Sandbox `id` as the API shows it.
    pub fn get(&self, id: &str) -> Sandbox {
        self.c.sandbox(id).expect("get sandbox")
    }

    /// Waits (at most `within`) until `f` holds.
    pub fn wait_for(&self, what: &str, within: Duration, mut f: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < within, "{what}: not within {within:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until sandbox `id` is in `state`.
    pub fn wait_state(&self, id: &str, state: SandboxState, within: Duration) -> Sandbox {
        let mut last = None;
        self.wait_for(&format!("sandbox {id} {state}"), within, || {
            let s = self.c.sandbox(id).ok();
            let ok = s.as_ref().is_some_and(|s| s.state == state);
            last = s;
            ok
        });
        last.unwrap()
    }

    /// A metric's value from `GET /metrics`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let m = self.c.metrics().expect("metrics");
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Events of `subject`, by kind.
    pub fn event_kinds(&self, subject: &str) -> Vec<String> {
        let q = api::EventQuery {
            sandbox: Some(subject.into()),
            ..Default::default()
        };
        let ev = self.c.events(&q).expect("events");
        ev.into_iter().map(|e| e.kind).collect()
    }

    /// The agent processes under the sandboxes' directory (pid).
    pub fn agent_pids(&self) -> Vec<i32> {
        let mut v: Vec<i32> =
            shoal_runtime::vm::processes_under(&self.sandboxes_dir(), "shoal-agent")
                .into_iter()
                .map(|p| p.pid)
                .collect();
        v.sort();
        v
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(r) = self.run.take() {
            let _ = r.stop.send(());
            let _ = r.done.recv_timeout(Duration::from_secs(10));
            r.rt.shutdown_timeout(Duration::from_secs(2));
        }
        // Every agent process it left behind.
        self.fake.reclaim_strays(&self.sandboxes_dir(), &|_| false);
    }
}

/// The state letter of a process (`R`, `S`, `T` stopped, `Z`), or None
/// when it is gone.
pub fn proc_state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.get(s.rfind(')')? + 1..)?.trim_start().chars().next()
}

/// Whether process `pid` is gone (or a zombie).
pub fn gone(pid: i32) -> bool {
    proc_state(pid).is_none_or(|s| s == 'Z')
}

/// SIGKILL, as a crash.
pub fn crash(pid: i32) {
    // SAFETY: kill(2) with a pid the test just read from the API.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
}

/// The status and code of an API error.
pub fn refused(e: ClientError) -> (u16, Option<api::ErrorCode>, String) {
    (e.status().unwrap_or(0), e.code(), e.to_string())
}

/// Reads a file that must exist.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
