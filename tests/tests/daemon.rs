//! shoald end to end: a real daemon process on a temporary state
//! directory, real VMs restored from the `tiny` template on /dev/kvm.
//! The API contract (and clear 4xx answers to bad requests), a daemon
//! restart with sandboxes running (reattached or reclaimed, nothing
//! leaked), kill -9 of VMMs (noticed and reclaimed), pause and resume on
//! the next exec with files and processes intact, TTL, idle timeout,
//! snapshot to a template, warm pools and admission; templates with a
//! toolkit layer and each kind of upper layer (tmpfs of a size, a scratch
//! disk per sandbox).
//!
//! Each guest exec costs ~1 s on PVM hosts, so execs are few.

use serde_json::{json, Value};
use shoal_client::{enc, Body, ClientError, DaemonClient, Target};
use shoal_runtime::vm;
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
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().unwrap().parent().unwrap();
        let bin = dir.join("shoald");
        let debug = dir.file_name().is_some_and(|n| n == "debug");
        // Always build: cargo is a no-op when it is up to date, and a stale
        // daemon would test old code.
        let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        c.args(["build", "-q", "-p", "shoald", "--bin", "shoald"]);
        if !debug {
            c.arg("--release");
        }
        let st = c.status().expect("cargo build shoald");
        assert!(st.success(), "building shoald failed");
        assert!(bin.is_file(), "{} missing", bin.display());
        bin
    })
    .clone()
}

/// A shoald process; on drop it is stopped and every VMM it left is killed.
struct Daemon {
    child: Option<Child>,
    dir: PathBuf,
    args: Vec<String>,
    c: DaemonClient,
    /// Environment of the daemon process.
    env: Vec<(String, PathBuf)>,
    _tmp: Option<tempfile::TempDir>,
}

impl Daemon {
    fn start(args: &[&str]) -> Daemon {
        Self::start_env(args, &[])
    }

    /// Templates the daemon builds go under its state directory (`dir`),
    /// removed with it.
    fn start_env(args: &[&str], env: &[(&str, &std::path::Path)]) -> Daemon {
        let artifacts = artifacts();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        args.extend(["--artifacts".into(), artifacts.display().to_string()]);
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

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("shoald.log"))
            .unwrap();
        let mut cmd = Command::new(shoald_bin());
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

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("shoald.log")).unwrap_or_default()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, ClientError> {
        self.c.call(method, path, body.as_ref())
    }

    fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.log()))
    }

    /// Status and error code of a request expected to fail.
    fn err(&self, method: &str, path: &str, body: &str) -> (u16, String, String) {
        let b = if body.is_empty() {
            Body::Empty
        } else {
            Body::Json(body.as_bytes().to_vec())
        };
        match self.c.request(method, path, b).unwrap().ok() {
            Err(ClientError::Http {
                status,
                code,
                message,
            }) => (status, code, message),
            other => panic!(
                "{method} {path} {body}: expected an error, got {:?}",
                other.map(|r| r.status)
            ),
        }
    }

    fn create(&self, extra: Value) -> Value {
        let mut b = json!({"image": "tiny"});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        self.ok("POST", "/v1/sandboxes", Some(b))
    }

    fn sh(&self, id: &str, script: &str) -> Value {
        self.ok(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"shell": script, "timeout_s": 120})),
        )
    }

    fn get(&self, id: &str) -> Option<Value> {
        match self.call("GET", &format!("/v1/sandboxes/{id}"), None) {
            Ok(v) => Some(v),
            Err(ClientError::Http { status: 404, .. }) => None,
            Err(e) => panic!("GET {id}: {e}"),
        }
    }

    fn vmms(&self) -> Vec<vm::Proc> {
        vm::vmms_under(&self.dir)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // SAFETY: SIGTERM to our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        for p in vm::vmms_under(&self.dir) {
            p.kill();
            p.wait_gone(Duration::from_secs(2));
        }
    }
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn alive(v: &Value) -> Option<vm::Proc> {
    let pid = v["pid"].as_i64()? as i32;
    vm::pid_start(pid).map(|start| vm::Proc { pid, start })
}

#[test]
fn api_contract_end_to_end() {
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    std::fs::write(&token_file, "0123456789abcdef-secret\n").unwrap();
    let port = 20000 + (std::process::id() % 20000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start(&[
        "--listen",
        &addr,
        "--token-file",
        token_file.to_str().unwrap(),
    ]);

    // The OpenAPI document lists what we use.
    let doc = d.ok("GET", "/openapi.json", None);
    for p in [
        "/v1/sandboxes",
        "/v1/sandboxes/{id}/exec/stream",
        "/v1/sandboxes/{id}/files",
        "/v1/pools/{template}",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} undocumented");
    }

    // Bad requests: 4xx with a clear message.
    let (s, code, m) = d.err("POST", "/v1/sandboxes", "{not json");
    assert_eq!((s, code.as_str()), (400, "bad_request"));
    assert!(m.contains("invalid JSON"), "{m}");
    let (s, _, m) = d.err(
        "POST",
        "/v1/sandboxes",
        r#"{"image":"tiny","template":"x"}"#,
    );
    assert!(s == 400 && m.contains("not both"), "{m}");
    let (s, _, m) = d.err("POST", "/v1/sandboxes", r#"{"image":"tiny","cpus":2}"#);
    assert!(s == 400 && m.contains("unknown field"), "{m}");
    let (s, _, m) = d.err("POST", "/v1/sandboxes", r#"{"image":"windows"}"#);
    assert!(s == 400 && m.contains("unknown image"), "{m}");
    let (s, _, m) = d.err(
        "POST",
        "/v1/sandboxes",
        r#"{"image":"tiny","memory_mib":1}"#,
    );
    assert!(s == 400 && m.contains("memory_mib"), "{m}");
    let (s, _, m) = d.err("POST", "/v1/sandboxes", r#"{"template":"nope"}"#);
    assert!(s == 404 && m.contains("no template"), "{m}");
    assert_eq!(d.err("GET", "/v1/sandboxes/abc", "").0, 404);
    assert_eq!(d.err("GET", "/v1/nothing", "").0, 404);
    let (s, _, m) = d.err("GET", "/v1/sandboxes?state=sleepy", "");
    assert!(s == 400 && m.contains("state=sleepy"), "{m}");
    let (s, _, _) = d.err("PUT", "/v1/pools/nope", r#"{"target":1}"#);
    assert_eq!(s, 404);

    // Create, get, list with filters.
    let sb = d.create(json!({"metadata": {"run": "contract"}, "env": {"FOO": "bar"}}));
    let id = sb["id"].as_str().unwrap().to_string();
    assert_eq!(sb["state"], "running");
    let p = alive(&sb).expect("VMM running");
    assert_eq!(
        d.ok("GET", &format!("/v1/sandboxes/{id}"), None)["id"],
        id.as_str()
    );
    let l = d.ok(
        "GET",
        "/v1/sandboxes?metadata=run:contract&state=running",
        None,
    );
    assert_eq!(l.as_array().unwrap().len(), 1);
    let l = d.ok("GET", "/v1/sandboxes?metadata=run:other", None);
    assert!(l.as_array().unwrap().is_empty());

    // Exec: one-shot with the sandbox environment, then streamed.
    let out = d.sh(&id, "echo $FOO; echo e >&2; exit 3");
    assert_eq!(
        (
            out["stdout"].as_str(),
            out["stderr"].as_str(),
            out["exit_code"].as_i64()
        ),
        (Some("bar\n"), Some("e\n"), Some(3))
    );
    let (s, _, m) = d.err("POST", &format!("/v1/sandboxes/{id}/exec"), r#"{"cmd":[]}"#);
    assert!(s == 400 && m.contains("empty"), "{m}");
    let mut r =
        d.c.request(
            "POST",
            &format!("/v1/sandboxes/{id}/exec/stream"),
            Body::Json(br#"{"cmd":["echo","streamed"]}"#.to_vec()),
        )
        .unwrap()
        .ok()
        .unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(r.reader(), &mut text).unwrap();
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "start", "{text}");
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "stdout" && e["data"] == "streamed\n"),
        "{text}"
    );
    assert_eq!(events.last().unwrap()["type"], "exit", "{text}");
    assert_eq!(events.last().unwrap()["exit_code"], 0);

    // Files: streamed upload and download, stat, list, remove.
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let f = format!("/v1/sandboxes/{id}/files?path={}", enc("/tmp/blob"));
    let up =
        d.c.request("PUT", &f, Body::Stream(&mut &data[..]))
            .unwrap()
            .ok()
            .unwrap();
    assert_eq!(up.status, 201);
    let st = d.ok(
        "GET",
        &format!("/v1/sandboxes/{id}/files/stat?path=/tmp/blob"),
        None,
    );
    assert_eq!(
        (st["type"].as_str(), st["size"].as_u64()),
        (Some("file"), Some(data.len() as u64))
    );
    let ls = d.ok(
        "GET",
        &format!("/v1/sandboxes/{id}/files/list?path=/tmp"),
        None,
    );
    assert!(
        ls.as_array().unwrap().iter().any(|e| e["name"] == "blob"),
        "{ls}"
    );
    let down =
        d.c.request("GET", &f, Body::Empty)
            .unwrap()
            .ok()
            .unwrap()
            .bytes()
            .unwrap();
    assert!(down == data, "download differs from upload");
    let (s, _, m) = d.err("GET", &format!("/v1/sandboxes/{id}/files"), "");
    assert!(s == 400 && m.contains("path"), "{m}");
    let (s, _, m) = d.err(
        "GET",
        &format!("/v1/sandboxes/{id}/files/stat?path=tmp"),
        "",
    );
    assert!(s == 400 && m.contains("absolute"), "{m}");
    d.c.request("DELETE", &f, Body::Empty)
        .unwrap()
        .ok()
        .unwrap();
    assert_eq!(
        d.err(
            "GET",
            &format!("/v1/sandboxes/{id}/files/stat?path=/tmp/blob"),
            ""
        )
        .0,
        404
    );

    // TCP needs the bearer token.
    let mut tcp = DaemonClient {
        target: Target::Tcp(addr.clone(), None),
        timeout: Some(Duration::from_secs(30)),
    };
    let r = tcp.request("GET", "/v1/sandboxes", Body::Empty).unwrap();
    assert_eq!(r.status, 401);
    tcp.target = Target::Tcp(addr.clone(), Some("wrong-token-wrong-token".into()));
    assert_eq!(
        tcp.request("GET", "/v1/sandboxes", Body::Empty)
            .unwrap()
            .status,
        401
    );
    tcp.target = Target::Tcp(addr, Some("0123456789abcdef-secret".into()));
    let l: Value = tcp.call("GET", "/v1/sandboxes", None::<&()>).unwrap();
    assert_eq!(l.as_array().unwrap().len(), 1);

    // Metrics.
    let m = String::from_utf8(
        d.c.request("GET", "/metrics", Body::Empty)
            .unwrap()
            .bytes()
            .unwrap(),
    )
    .unwrap();
    for want in [
        "shoal_sandboxes{state=\"running\"} 1",
        "shoal_create_seconds_count 1",
        "shoal_exec_seconds_count 2",
        "shoal_host_memory_available_bytes",
        "shoal_restore_seconds_bucket",
    ] {
        assert!(m.contains(want), "metrics lack {want}:\n{m}");
    }

    // Kill: gone, process and files too.
    let r =
        d.c.request("DELETE", &format!("/v1/sandboxes/{id}"), Body::Empty)
            .unwrap();
    assert_eq!(r.status, 204);
    assert!(d.get(&id).is_none());
    wait_for("the VMM to exit", 10, || !p.alive());
    assert!(!d.dir.join("sandboxes").join(&id).exists());
    assert!(d.vmms().is_empty());
}

#[test]
fn restart_reattaches_running_and_reclaims_dead() {
    let mut d = Daemon::start(&["--no-pools"]);
    let a = d.create(json!({}));
    let b = d.create(json!({}));
    let (ida, idb) = (
        a["id"].as_str().unwrap().to_string(),
        b["id"].as_str().unwrap().to_string(),
    );
    assert_eq!(d.sh(&ida, "echo kept > /tmp/f")["exit_code"], 0);
    d.kill9();
    // While the daemon is down: B's VMM dies, and junk appears.
    let pb = alive(&b).unwrap();
    pb.kill();
    wait_for("B's VMM to exit", 10, || !pb.alive());
    let stray = d.dir.join("sandboxes/0000deadbeef");
    std::fs::create_dir_all(&stray).unwrap();
    d.spawn();
    let a2 = d.get(&ida).unwrap();
    assert_eq!(a2["state"], "running", "{a2}");
    assert_eq!(a2["pid"], a["pid"], "the same VMM, reattached");
    let b2 = d.get(&idb).unwrap();
    assert_eq!(b2["state"], "failed", "{b2}");
    assert!(
        b2["error"].as_str().unwrap().contains("daemon was down"),
        "{b2}"
    );
    assert!(
        !d.dir.join("sandboxes").join(&idb).exists(),
        "B's files reclaimed"
    );
    assert!(!stray.exists(), "stray directory removed");
    assert_eq!(d.sh(&ida, "cat /tmp/f")["stdout"], "kept\n");
    // The reattached VMM is supervised like any other.
    let pa = alive(&a2).unwrap();
    pa.kill();
    wait_for("A marked failed", 10, || {
        d.get(&ida).unwrap()["state"] == "failed"
    });
    assert!(d.vmms().is_empty(), "no VMM leaked");
    let ev = d.ok("GET", &format!("/v1/events?sandbox={ida}"), None);
    let kinds: Vec<&str> = ev
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["created", "reattached", "failed"], "{ev}");
}

#[test]
fn killed_vmms_are_noticed_and_reclaimed_and_pools_refill() {
    let d = Daemon::start(&[]);
    let tpl = "tiny-1c-128m";
    let s1 = d.create(json!({}));
    assert_eq!(s1["from_pool"], false);
    d.ok(
        "PUT",
        &format!("/v1/pools/{tpl}"),
        Some(json!({"target": 3})),
    );
    let ready = || d.ok("GET", "/v1/pools", None)[0]["ready"].as_u64().unwrap();
    wait_for("the pool to fill", 120, || ready() == 3);
    let s2 = d.create(json!({"metadata": {"n": "2"}}));
    assert_eq!(s2["from_pool"], true, "{s2}");
    assert_eq!(s2["metadata"]["n"], "2");
    wait_for("the pool to refill", 120, || ready() == 3);
    // kill -9 a created sandbox's VMM and a pooled one.
    let pooled = d.ok("GET", "/v1/sandboxes?state=pooled", None);
    let victim = alive(&pooled[0]).unwrap();
    let p1 = alive(&s1).unwrap();
    let t0 = Instant::now();
    p1.kill();
    victim.kill();
    let id1 = s1["id"].as_str().unwrap();
    wait_for("the death to be noticed", 5, || {
        d.get(id1).unwrap()["state"] == "failed"
    });
    eprintln!("VMM death noticed in {:?}", t0.elapsed());
    let f = d.get(id1).unwrap();
    assert!(
        f["error"].as_str().unwrap().contains("exited unexpectedly"),
        "{f}"
    );
    assert!(!d.dir.join("sandboxes").join(id1).exists());
    wait_for("the pool to replace its dead member", 120, || {
        ready() == 3 && d.get(pooled[0]["id"].as_str().unwrap()).is_none()
    });
    // Idle sandboxes get their vCPUs paused (no CPU while idle) and are
    // continued by their next request.
    let metrics = || {
        String::from_utf8(
            d.c.request("GET", "/metrics", Body::Empty)
                .unwrap()
                .bytes()
                .unwrap(),
        )
        .unwrap()
    };
    wait_for("idle sandboxes to be frozen", 20, || {
        metrics().contains("shoal_sandboxes_frozen 4")
    });
    // The pooled sandbox handed out works.
    let id2 = s2["id"].as_str().unwrap();
    assert_eq!(d.sh(id2, "echo pooled")["stdout"], "pooled\n");
    let m = String::from_utf8(
        d.c.request("GET", "/metrics", Body::Empty)
            .unwrap()
            .bytes()
            .unwrap(),
    )
    .unwrap();
    assert!(m.contains("shoal_vmm_deaths_total 2"), "{m}");
    assert!(
        m.contains(&format!("shoal_pool_size{{template=\"{tpl}\"}} 3")),
        "{m}"
    );
    // Removing the pool ends its VMMs.
    d.c.request("DELETE", &format!("/v1/pools/{tpl}"), Body::Empty)
        .unwrap()
        .ok()
        .unwrap();
    d.c.request("DELETE", &format!("/v1/sandboxes/{id2}"), Body::Empty)
        .unwrap()
        .ok()
        .unwrap();
    wait_for("every VMM to end", 10, || d.vmms().is_empty());
}

#[test]
fn pause_resume_on_exec_snapshot_ttl_idle() {
    let d = Daemon::start(&["--no-pools"]);
    let sb = d.create(json!({}));
    let id = sb["id"].as_str().unwrap().to_string();
    let out = d.sh(
        &id,
        "echo persisted > /tmp/p; setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!",
    );
    assert_eq!(out["exit_code"], 0, "{out}");
    let p = alive(&sb).unwrap();
    let v = d.ok("POST", &format!("/v1/sandboxes/{id}/pause"), None);
    assert_eq!(v["state"], "paused");
    wait_for("the VMM to end", 10, || !p.alive());
    assert!(d.vmms().is_empty(), "a paused sandbox has no VMM");
    // The next exec resumes it, with its files and processes.
    let out = d.sh(&id, "cat /tmp/p; pidof sleep");
    let text = out["stdout"].as_str().unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("persisted"), "{out}");
    assert!(
        lines
            .next()
            .is_some_and(|l| l.trim().parse::<u32>().is_ok()),
        "the background process survived pause and resume: {out}"
    );
    assert_eq!(d.get(&id).unwrap()["state"], "running");

    // Snapshot into a template; a clone of it has the file too.
    let t = d.ok(
        "POST",
        &format!("/v1/sandboxes/{id}/snapshot"),
        Some(json!({"template": "snap1"})),
    );
    assert_eq!(t["state"], "ready");
    let clone = d.ok("POST", "/v1/sandboxes", Some(json!({"template": "snap1"})));
    let cid = clone["id"].as_str().unwrap();
    assert_eq!(d.sh(cid, "cat /tmp/p")["stdout"], "persisted\n");

    // TTL and idle timeout.
    let ttl = d.create(json!({"ttl_s": 2}));
    let idle = d.create(json!({"idle_timeout_s": 2}));
    let (tid, iid) = (ttl["id"].as_str().unwrap(), idle["id"].as_str().unwrap());
    wait_for("the TTL kill", 20, || d.get(tid).is_none());
    wait_for("the idle pause", 20, || {
        d.get(iid).unwrap()["state"] == "paused"
    });
    assert!(alive(&ttl).is_none_or(|p| !p.alive()));
    for x in [&id, cid, iid] {
        d.c.request("DELETE", &format!("/v1/sandboxes/{x}"), Body::Empty)
            .unwrap()
            .ok()
            .unwrap();
    }
    wait_for("every VMM to end", 10, || d.vmms().is_empty());
    let left: Vec<_> = std::fs::read_dir(d.dir.join("sandboxes"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "sandbox directories left: {left:?}");
}

#[test]
fn admission_refuses_with_429_and_503() {
    let d = Daemon::start(&["--no-pools", "--max-sandboxes", "2"]);
    d.create(json!({}));
    d.create(json!({}));
    let (s, code, m) = d.err("POST", "/v1/sandboxes", r#"{"image":"tiny"}"#);
    assert_eq!((s, code.as_str()), (429, "host_full"));
    assert!(m.contains("host is full") && m.contains("limit 2"), "{m}");
    let m = String::from_utf8(
        d.c.request("GET", "/metrics", Body::Empty)
            .unwrap()
            .bytes()
            .unwrap(),
    )
    .unwrap();
    assert!(
        m.contains("shoal_admission_refusals_total{reason=\"max_sandboxes\"} 1"),
        "{m}"
    );
    drop(d);
    let d = Daemon::start(&["--no-pools", "--min-available-mib", "100000000"]);
    let (s, code, m) = d.err("POST", "/v1/sandboxes", r#"{"image":"tiny"}"#);
    assert_eq!((s, code.as_str()), (503, "host_memory_low"));
    assert!(m.contains("MiB available"), "{m}");
    let l = d.ok("GET", "/v1/sandboxes", None);
    assert!(
        l.as_array().unwrap().is_empty(),
        "a refused create leaves nothing"
    );
}

/// `debugfs -R CMD` on an ext4 image (read on the host without mounting).
fn debugfs(img: &std::path::Path, cmd: &str) -> String {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(cmd)
        .arg(img)
        .output()
        .expect("debugfs (e2fsprogs)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Total 1K blocks of `/` from `df -k /` output (its last line).
fn df_total_kib(out: &str) -> u64 {
    out.lines()
        .rfind(|l| l.contains('%'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no df line in {out:?}"))
}

/// Stdout and stderr of an exec result, together.
fn output(v: &Value) -> String {
    format!(
        "{}{}",
        v["stdout"].as_str().unwrap_or(""),
        v["stderr"].as_str().unwrap_or("")
    )
}

#[test]
fn template_layers_and_upper_layers_end_to_end() {
    use shoal_images::image::{build_image_with, AgentSource, BuildOptions, ImageSource};
    let work = tempfile::Builder::new()
        .prefix("layers")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    // A toolkit layer, built from a small directory like `shoal image
    // build DIR -o OUT --no-agent`.
    let src = work.path().join("toolkit");
    std::fs::create_dir_all(src.join("opt/toolkit")).unwrap();
    std::fs::write(src.join("opt/toolkit/hello.txt"), "from-the-toolkit\n").unwrap();
    let kit = work.path().join("toolkit.img");
    let opts = BuildOptions {
        agent: AgentSource::None,
    };
    let info = build_image_with(ImageSource::Dir(src), &kit, &opts).unwrap();
    let misaligned = work.path().join("misaligned.img");
    std::fs::copy(&kit, &misaligned).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&misaligned)
        .unwrap()
        .set_len(info.len - 4096)
        .unwrap();
    let (kit_s, bad_s) = (kit.to_str().unwrap(), misaligned.to_str().unwrap());

    let d = Daemon::start(&["--no-pools"]);
    // Bad inputs: clear 400s, nothing registered, nothing booted.
    let t = |extra: Value| {
        let mut b = json!({"name": "x", "image": "tiny"});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let bad = [
        (
            t(json!({"upper_size_mib": 8, "upper_disk_mib": 64})),
            "not both",
        ),
        (
            t(json!({"layers": ["/nonexistent/kit.img"]})),
            "cannot open",
        ),
        (t(json!({"layers": [bad_s]})), "not a multiple of"),
        (t(json!({"layers": ["kit.img"]})), "absolute path"),
        (t(json!({"layers": ["/dev/null"]})), "not a regular file"),
        (t(json!({"upper_size_mib": 0})), "upper_size_mib 0"),
        (
            t(json!({"upper_size_mib": 4096})),
            "at most the guest's memory",
        ),
        (t(json!({"upper_disk_mib": 2})), "upper_disk_mib 2"),
        (t(json!({"upper_disk_mib": "big"})), "invalid JSON"),
    ];
    for (body, want) in &bad {
        let (status, code, msg) = d.err("POST", "/v1/templates", body);
        assert_eq!(
            (status, code.as_str()),
            (400, "bad_request"),
            "{body}: {msg}"
        );
        assert!(msg.contains(want), "{body}: {want:?} not in {msg:?}");
    }
    let (status, _, msg) = d.err(
        "POST",
        "/v1/sandboxes",
        &json!({"template": "x", "layers": [kit_s]}).to_string(),
    );
    assert!(
        status == 400 && msg.contains("come from the template"),
        "{msg}"
    );
    let (status, _, msg) = d.err(
        "POST",
        "/v1/sandboxes",
        &json!({"image": "tiny", "upper_size_mib": 8, "upper_disk_mib": 64}).to_string(),
    );
    assert!(status == 400 && msg.contains("not both"), "{msg}");
    assert_eq!(d.ok("GET", "/v1/templates", None), json!([]));

    // One template per configuration, built one after the other (one boot
    // each): the toolkit layer with a 2 MiB tmpfs upper layer, and with a
    // 32 MiB scratch disk.
    let small = d.ok(
        "POST",
        "/v1/templates",
        Some(json!({"name": "kit-tmpfs", "image": "tiny", "layers": [kit_s], "upper_size_mib": 2})),
    );
    assert_eq!(
        (
            &small["layers"],
            &small["upper_size_mib"],
            &small["upper_disk_mib"]
        ),
        (&json!([kit_s]), &json!(2), &Value::Null)
    );
    let disk = d.ok(
        "POST",
        "/v1/templates",
        Some(json!({"name": "kit-disk", "image": "tiny", "layers": [kit_s], "upper_disk_mib": 32})),
    );
    assert_eq!(disk["upper_disk_mib"], 32);
    for name in ["kit-tmpfs", "kit-disk"] {
        wait_for(&format!("template {name}"), 600, || {
            let v = d.ok("GET", &format!("/v1/templates/{name}"), None);
            assert_ne!(v["state"], "failed", "{v}\n{}", d.log());
            v["state"] == "ready"
        });
    }
    let tpl_disk = PathBuf::from(
        d.ok("GET", "/v1/templates/kit-disk", None)["dir"]
            .as_str()
            .unwrap(),
    );
    let tpl_scratch = tpl_disk.join("scratch.ext4");
    assert!(tpl_scratch.is_file(), "the template keeps its scratch disk");
    let sandbox_dir = |id: &str| d.dir.join("sandboxes").join(id);

    // tmpfs upper: the toolkit is there; the upper layer holds 2 MiB.
    let a = d.ok(
        "POST",
        "/v1/sandboxes",
        Some(json!({"template": "kit-tmpfs"})),
    );
    let aid = a["id"].as_str().unwrap().to_string();
    let out = d.sh(
        &aid,
        "cat /opt/toolkit/hello.txt; df -k /; dd if=/dev/zero of=/fill bs=64k count=48; echo rc=$?",
    );
    let text = output(&out);
    assert!(text.starts_with("from-the-toolkit\n"), "{text}");
    assert_eq!(df_total_kib(&text), 2048, "{text}");
    assert!(
        text.contains("No space left on device") && text.contains("rc=1"),
        "writing 3 MiB into a 2 MiB upper layer: {text}"
    );
    assert!(!sandbox_dir(&aid).join("scratch.ext4").exists());

    // Scratch-disk upper: 3 MiB fit; two clones do not see each other's
    // writes, and each writes only its own copy of the disk.
    let b1 = d.ok(
        "POST",
        "/v1/sandboxes",
        Some(json!({"template": "kit-disk"})),
    );
    let b2 = d.ok(
        "POST",
        "/v1/sandboxes",
        Some(json!({"template": "kit-disk"})),
    );
    let (b1, b2) = (
        b1["id"].as_str().unwrap().to_string(),
        b2["id"].as_str().unwrap().to_string(),
    );
    let out = d.sh(
        &b1,
        "cat /opt/toolkit/hello.txt; df -k /; dd if=/dev/zero of=/big bs=64k count=48 \
         && echo b1 > /who && sync && echo wrote",
    );
    let text = output(&out);
    assert!(text.starts_with("from-the-toolkit\n"), "{text}");
    let total = df_total_kib(&text);
    assert!((28_000..=32_768).contains(&total), "a 32 MiB disk: {text}");
    assert!(
        out["stdout"].as_str().unwrap().ends_with("wrote\n"),
        "{text}"
    );
    let out = d.sh(&b2, "cat /who /big 2>&1; echo b2 > /who; cat /who");
    let text = output(&out);
    assert!(
        text.contains("'/who': No such file") && text.contains("'/big': No such file"),
        "{text}"
    );
    assert!(text.ends_with("b2\n"), "{text}");
    let b1_disk = sandbox_dir(&b1).join("scratch.ext4");
    let b2_disk = sandbox_dir(&b2).join("scratch.ext4");
    assert_eq!(debugfs(&b1_disk, "cat /upper/who"), "b1\n");
    assert!(debugfs(&b1_disk, "stat /upper/big").contains("Size: 3145728"));
    assert!(
        !debugfs(&tpl_scratch, "ls /upper").contains("who"),
        "template disk unchanged"
    );

    // Paused, b1 keeps its disk; the next exec resumes it, writes intact.
    let v = d.ok("POST", &format!("/v1/sandboxes/{b1}/pause"), None);
    assert_eq!(v["state"], "paused");
    assert!(b1_disk.is_file(), "a paused sandbox keeps its scratch disk");
    assert_eq!(d.sh(&b1, "cat /who")["stdout"], "b1\n");

    // A snapshot into a template takes the disk along; its clone sees b1's
    // files.
    let t = d.ok(
        "POST",
        &format!("/v1/sandboxes/{b1}/snapshot"),
        Some(json!({"template": "b1-snap"})),
    );
    assert_eq!(t["upper_disk_mib"], 32);
    assert!(PathBuf::from(t["dir"].as_str().unwrap())
        .join("scratch.ext4")
        .is_file());
    let c = d.ok(
        "POST",
        "/v1/sandboxes",
        Some(json!({"template": "b1-snap"})),
    );
    let cid = c["id"].as_str().unwrap().to_string();
    assert_eq!(d.sh(&cid, "cat /who")["stdout"], "b1\n");

    // Removing sandboxes and the owned template removes their disks.
    for id in [&aid, &b1, &b2, &cid] {
        d.c.request("DELETE", &format!("/v1/sandboxes/{id}"), Body::Empty)
            .unwrap()
            .ok()
            .unwrap();
    }
    d.c.request("DELETE", "/v1/templates/b1-snap", Body::Empty)
        .unwrap()
        .ok()
        .unwrap();
    assert!(!PathBuf::from(t["dir"].as_str().unwrap()).exists());
    wait_for("every VMM to end", 10, || d.vmms().is_empty());
    assert!(!b2_disk.exists());
    let left: Vec<_> = std::fs::read_dir(d.dir.join("sandboxes"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "sandbox directories left: {left:?}");
}

/// Sets the modification time of `p` (a file or a directory).
fn age(p: &std::path::Path, by: Duration) {
    let t = std::time::SystemTime::now() - by;
    std::fs::File::open(p)
        .and_then(|f| f.set_modified(t))
        .unwrap_or_else(|e| panic!("ageing {}: {e}", p.display()));
}

/// Regression: the daemon's templates lived in the daemon-less cache,
/// whose pruning of day-old unmapped templates (run whenever a daemon-less
/// template is made) deleted templates the daemon still listed as ready (a
/// restore never refreshes a template's time). They now live under the
/// state directory: a day-old, unmapped daemon template survives the
/// prune, a sandbox still restores from it, and the daemon wrote nothing
/// into the daemon-less cache. Deleting the template removes its
/// directory (the daemon is the one that removes it).
#[test]
fn daemon_templates_live_in_the_state_dir_and_survive_cache_pruning() {
    let cache = tempfile::tempdir().unwrap();
    let env: [(&str, &std::path::Path); 2] =
        [("SHOAL_CACHE", cache.path()), ("SHOAL_STATE", cache.path())];
    let d = Daemon::start_env(&["--no-pools"], &env);
    let sb = d.create(json!({}));
    let id = sb["id"].as_str().unwrap().to_string();
    let t = d.ok("GET", "/v1/templates/tiny-1c-128m", None);
    assert_eq!((&t["state"], &t["owned"]), (&json!("ready"), &json!(true)));
    let dir = PathBuf::from(t["dir"].as_str().unwrap());
    assert!(
        dir.starts_with(d.dir.join("templates")),
        "template {} is not under the state directory {}",
        dir.display(),
        d.dir.display()
    );
    // Its image is its own: a reinstall of the artifacts cannot change it.
    assert!(
        dir.join("root.erofs").is_file(),
        "no pinned image in {}",
        dir.display()
    );
    d.c.request("DELETE", &format!("/v1/sandboxes/{id}"), Body::Empty)
        .unwrap()
        .ok()
        .unwrap();
    wait_for("the VMM to end", 10, || d.vmms().is_empty());

    // A day-old template no process maps (by the times the pruning looks
    // at; its image must keep its own, which a restore checks), pruned by
    // the daemon-less side as it does after making a template of its own.
    for p in ["state", "memory", ""] {
        age(&dir.join(p), Duration::from_secs(2 * 24 * 3600));
    }
    let cache_templates = shoal_runtime::sandbox::prune_templates(
        &cache.path().join("templates"),
        std::path::Path::new("/nonexistent"),
        Duration::from_secs(3600),
    );
    assert!(cache_templates.is_empty(), "pruned {cache_templates:?}");
    let in_cache: Vec<_> = std::fs::read_dir(cache.path())
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        in_cache.is_empty(),
        "the daemon wrote into the daemon-less cache: {in_cache:?}"
    );
    assert!(
        dir.join("memory").is_file(),
        "the daemon's template was removed"
    );

    // Still restores, and runs a command.
    let sb = d.create(json!({}));
    let id = sb["id"].as_str().unwrap().to_string();
    assert_eq!(d.sh(&id, "echo ok")["stdout"], "ok\n");
    d.c.request("DELETE", &format!("/v1/sandboxes/{id}"), Body::Empty)
        .unwrap()
        .ok()
        .unwrap();
    d.c.request("DELETE", "/v1/templates/tiny-1c-128m", Body::Empty)
        .unwrap()
        .ok()
        .unwrap();
    assert!(!dir.exists(), "a deleted template's directory stayed");
}
