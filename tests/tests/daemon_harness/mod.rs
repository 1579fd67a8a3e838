//! The harness of the shoald tests: a daemon process on a temporary
//! state directory, driven through the typed client.

pub mod net;

use serde_json::Value;
use shoal_client::api::{self, CreateSandbox, ErrorCode, ExecResult, Sandbox, SandboxState};
use shoal_client::{Body, ClientError, DaemonClient};
use shoal_runtime::vm;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The installed guest kernel and `tiny` image the daemons read (built
/// from this checkout and installed once per test binary).
fn artifacts() -> PathBuf {
    shoal_test_support::require_kvm();
    shoal_test_support::artifacts().dir
}

fn shoald_bin() -> PathBuf {
    static B: OnceLock<PathBuf> = OnceLock::new();
    B.get_or_init(|| {
        // The jailer too: a root daemon starts every VMM through it.
        shoal_test_support::build_bins(&[("shoald", "shoald"), ("shoal-jailer", "shoal-jailer")])
            .join("shoald")
    })
    .clone()
}

/// A shoald process; on drop it is stopped and every VMM it left is killed.
pub struct Daemon {
    child: Option<Child>,
    pub dir: PathBuf,
    args: Vec<String>,
    pub c: DaemonClient,
    /// Environment of the daemon process.
    env: Vec<(String, PathBuf)>,
    _tmp: Option<tempfile::TempDir>,
}

impl Daemon {
    pub fn start(args: &[&str]) -> Daemon {
        Self::start_env(args, &[])
    }

    /// A daemon with `env` set. Templates it builds go under its state
    /// directory (`dir`), removed with it.
    pub fn start_env(args: &[&str], env: &[(&str, &std::path::Path)]) -> Daemon {
        let artifacts = artifacts();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        args.extend(["--artifacts".into(), artifacts.display().to_string()]);
        // No VMMs started ahead unless a test asks (`--vmm-stock N`): the
        // tests count the VMMs and directories under the state directory.
        if !args.iter().any(|a| a == "--vmm-stock") {
            args.extend(["--vmm-stock".into(), "0".into()]);
        }
        let mut d = Daemon {
            child: None,
            c: DaemonClient::unix(dir.join("shoald.sock")),
            dir,
            args,
            env: env.iter().map(|(k, v)| (k.to_string(), v.into())).collect(),
            _tmp: Some(tmp),
        };
        d.spawn();
        d
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("shoald.log"))
            .unwrap();
        let bin = shoald_bin();
        let mut cmd = Command::new(&bin);
        // The jailer scripts/test.sh names (the static build), else the
        // one just built beside this daemon.
        if std::env::var_os("SHOAL_JAILER").is_none() {
            cmd.env("SHOAL_JAILER", bin.with_file_name("shoal-jailer"));
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = cmd
            .arg("--state-dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start shoald");
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(30);
        while !self.c.ping() {
            assert!(
                Instant::now() < end,
                "shoald did not come up: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon process's id, while it runs.
    #[allow(dead_code)] // the hostile battery's; other test binaries have no use
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("shoald.log")).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The result of a client call, or a panic with the daemon's log.
    pub fn must<T>(&self, what: &str, r: Result<T, ClientError>) -> T {
        r.unwrap_or_else(|e| panic!("{what}: {e}\n{}", self.log()))
    }

    /// Status, error code and message of a request expected to fail (the
    /// body is sent as is, so malformed ones can be).
    pub fn err(&self, method: &str, path: &str, body: &str) -> (u16, ErrorCode, String) {
        let b = if body.is_empty() {
            Body::Empty
        } else {
            Body::Json(body.as_bytes().to_vec())
        };
        match self.c.request(method, path, b).unwrap().ok() {
            Err(ClientError::Api {
                status,
                code: Some(code),
                message,
            }) => (status, code, message),
            other => panic!(
                "{method} {path} {body}: expected an API error, got {:?}",
                other.map(|r| r.status)
            ),
        }
    }

    /// A sandbox of the tiny image with `req`'s other fields.
    pub fn create(&self, req: CreateSandbox) -> Sandbox {
        let req = CreateSandbox {
            image: Some("tiny".into()),
            ..req
        };
        self.must("create", self.c.create(&req))
    }

    pub fn restore(&self, t: &str) -> Sandbox {
        self.must(t, self.c.create(&CreateSandbox::from_template(t)))
    }

    pub fn sh(&self, id: &str, script: &str) -> ExecResult {
        let req = api::ExecRequest::shell(script).with_timeout(120.0);
        self.must(script, self.c.exec(id, &req))
    }

    pub fn get(&self, id: &str) -> Option<Sandbox> {
        match self.c.sandbox(id) {
            Ok(v) => Some(v),
            Err(e) if e.is_not_found() => None,
            Err(e) => panic!("GET {id}: {e}"),
        }
    }

    pub fn state(&self, id: &str) -> SandboxState {
        self.get(id).unwrap_or_else(|| panic!("{id} is gone")).state
    }

    pub fn metrics(&self) -> String {
        self.must("metrics", self.c.metrics())
    }

    pub fn kill(&self, id: &str) {
        self.must(id, self.c.kill(id))
    }

    pub fn vmms(&self) -> Vec<vm::Proc> {
        vm::vmms_under(&self.dir)
    }

    /// Panics if any sandbox directory is left in the state directory
    /// after 15 s: a kill forgets the sandbox first and then removes its
    /// directory (trying again while its VMM's last writes land), which on
    /// a loaded host can take seconds.
    pub fn assert_no_sandbox_dirs(&self) {
        let left = || -> Vec<_> {
            std::fs::read_dir(self.dir.join("sandboxes"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect()
        };
        let end = Instant::now() + Duration::from_secs(15);
        while !left().is_empty() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
        }
        let left = left();
        assert!(left.is_empty(), "sandbox directories left: {left:?}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // SAFETY: SIGTERM to our own child.
            unsafe { libc::kill(c.id().cast_signed(), libc::SIGTERM) };
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        // And the `vm` kind's QEMUs (a failed vm test left them running).
        let qemus = vm::processes_under(&self.dir, "qemu-system-x86_64");
        for p in vm::vmms_under(&self.dir).into_iter().chain(qemus) {
            p.kill();
            p.wait_gone(Duration::from_secs(2));
        }
    }
}

pub fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn alive(v: &Sandbox) -> Option<vm::Proc> {
    let pid = v.pid?;
    vm::pid_start(pid).map(|start| vm::Proc { pid, start })
}

pub fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The keys of a JSON object.
pub fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    k.sort();
    k
}
