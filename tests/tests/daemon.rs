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

mod daemon_harness;

use daemon_harness::{alive, keys, labels, wait_for, Daemon};
use serde_json::{json, Value};
use shoal_client::api::{
    self, CreateSandbox, CreateTemplate, ErrorCode, ExecEvent, ExecResult, ListFilter,
    SandboxState, TemplateState,
};
use shoal_client::{Body, DaemonClient, Target};
use shoal_test_support::{debugfs, file_data, layer};
use std::time::{Duration, Instant};

#[test]
fn api_contract_end_to_end() {
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    std::fs::write(&token_file, "0123456789abcdef-secret\n").unwrap();
    // The daemon refuses a token file others may read.
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let port = 20000 + (std::process::id() % 20000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start(&[
        "--listen",
        &addr,
        "--token-file",
        token_file.to_str().unwrap(),
    ]);

    // The OpenAPI document lists what we use.
    let doc = d.must("openapi", d.c.openapi());
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
    assert_eq!((s, code), (400, ErrorCode::BadRequest));
    assert!(m.contains("invalid JSON"), "{m}");
    let (s, _, m) = d.err(
        "POST",
        "/v1/sandboxes",
        r#"{"image":"tiny","template":"x"}"#,
    );
    assert!(s == 400 && m.contains("not both"), "{m}");
    let (s, _, m) = d.err("POST", "/v1/sandboxes", r#"{"image":"tiny","cpus":2}"#);
    assert!(s == 400 && m.contains("unknown field"), "{m}");
    // Neither built in nor pulled (an OCI reference): 404, naming the pull.
    let (s, _, m) = d.err("POST", "/v1/sandboxes", r#"{"image":"windows"}"#);
    assert!(s == 404 && m.contains("unknown image"), "{m}");
    assert!(m.contains("shoal image pull windows"), "{m}");
    let (s, _, m) = d.err(
        "POST",
        "/v1/sandboxes",
        r#"{"image":"tiny","memory_mib":1}"#,
    );
    assert!(s == 400 && m.contains("memory_mib"), "{m}");
    let (s, code, m) = d.err("POST", "/v1/sandboxes", r#"{"template":"nope"}"#);
    assert!(
        s == 404 && code == ErrorCode::NotFound && m.contains("no template"),
        "{m}"
    );
    assert_eq!(d.err("GET", "/v1/sandboxes/abc", "").0, 404);
    assert_eq!(d.err("GET", "/v1/nothing", "").0, 404);
    let (s, _, m) = d.err("GET", "/v1/sandboxes?state=sleepy", "");
    assert!(s == 400 && m.contains("state=sleepy"), "{m}");
    let e = d.c.set_pool("nope", 1).unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(404), Some(ErrorCode::NotFound))
    );

    // Create, get, list with filters.
    let sb = d.create(CreateSandbox {
        metadata: labels(&[("run", "contract")]),
        env: labels(&[("FOO", "bar")]),
        ..Default::default()
    });
    let id = sb.id.clone();
    assert_eq!(sb.state, SandboxState::Running);
    assert_eq!(sb.from_pool, Some(false));
    let p = alive(&sb).expect("VMM running");
    assert_eq!(d.get(&id).unwrap().id, id);
    // The wire format: every field of a sandbox, absent ones as null;
    // from_pool only in a create's reply.
    let raw: Value = d.must(
        "raw GET",
        d.c.call("GET", &format!("/v1/sandboxes/{id}"), None::<&()>),
    );
    assert_eq!(
        keys(&raw),
        [
            "created_at",
            "env",
            "error",
            "guest_addr",
            "id",
            "idle_timeout_s",
            "keep_running",
            "kind",
            "last_active",
            "memory_mib",
            "metadata",
            "network",
            "pause_at_ttl",
            "pid",
            "priority",
            "state",
            "template",
            "ttl_s",
            "vcpus"
        ],
        "{raw}"
    );
    assert!(raw["error"].is_null() && raw["state"] == "running", "{raw}");
    assert_eq!(raw["kind"], "microvm", "{raw}");
    assert_eq!(sb.kind, "microvm");
    let mut f = ListFilter {
        state: Some(SandboxState::Running),
        metadata: labels(&[("run", "contract")]),
        ..Default::default()
    };
    assert_eq!(d.must("list", d.c.list(&f)).len(), 1);
    f.metadata = labels(&[("run", "other")]);
    assert!(d.must("list", d.c.list(&f)).is_empty());

    // Exec: one-shot with the sandbox environment, then streamed.
    let out = d.sh(&id, "echo $FOO; echo e >&2; exit 3");
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str(), out.exit_code),
        ("bar\n", "e\n", Some(3))
    );
    assert_eq!(out.encoding, api::Encoding::Utf8);
    let (s, _, m) = d.err("POST", &format!("/v1/sandboxes/{id}/exec"), r#"{"cmd":[]}"#);
    assert!(s == 400 && m.contains("empty"), "{m}");
    let events: Vec<ExecEvent> = d
        .must(
            "stream",
            d.c.exec_stream(&id, &api::ExecRequest::argv(["echo", "streamed"])),
        )
        .map(|e| e.unwrap())
        .collect();
    assert!(
        matches!(events[0], ExecEvent::Start { pid, .. } if pid > 0),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ExecEvent::Stdout { data, .. } if data == "streamed\n")),
        "{events:?}"
    );
    assert_eq!(
        events.last(),
        Some(&ExecEvent::Exit {
            exit_code: Some(0),
            signal: None,
            timed_out: false
        }),
        "{events:?}"
    );

    // Files: streamed upload and download, stat, list, remove.
    let data = file_data(1 << 20);
    let up = d.must(
        "upload",
        d.c.put_file(&id, &api::UploadQuery::new("/tmp/blob"), &mut &data[..]),
    );
    assert_eq!(up.bytes, data.len() as u64);
    let st = d.must("stat", d.c.stat(&id, "/tmp/blob"));
    assert_eq!(
        (st.r#type, st.size),
        (api::FileType::File, data.len() as u64)
    );
    let ls = d.must("list", d.c.list_dir(&id, "/tmp"));
    assert!(ls.iter().any(|e| e.name == "blob"), "{ls:?}");
    let mut dl = d.must("download", d.c.get_file(&id, "/tmp/blob"));
    assert_eq!(dl.size, Some(data.len() as u64));
    let mut down = Vec::new();
    std::io::Read::read_to_end(&mut dl, &mut down).unwrap();
    assert!(down == data, "download differs from upload");
    let (s, _, m) = d.err("GET", &format!("/v1/sandboxes/{id}/files"), "");
    assert!(s == 400 && m.contains("path"), "{m}");
    let (s, _, m) = d.err(
        "GET",
        &format!("/v1/sandboxes/{id}/files/stat?path=tmp"),
        "",
    );
    assert!(s == 400 && m.contains("absolute"), "{m}");
    let rm = api::RemoveQuery {
        path: "/tmp/blob".into(),
        recursive: None,
    };
    d.must("remove", d.c.remove_file(&id, &rm));
    let e = d.c.stat(&id, "/tmp/blob").unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");

    // TCP needs the bearer token.
    let mut tcp = DaemonClient {
        target: Target::Tcp(addr.clone(), None),
        timeout: Some(Duration::from_secs(30)),
    };
    let e = tcp.list(&ListFilter::default()).unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(401), Some(ErrorCode::Unauthorized))
    );
    tcp.target = Target::Tcp(addr.clone(), Some("wrong-token-wrong-token".into()));
    assert_eq!(
        tcp.request("GET", "/v1/sandboxes", Body::Empty)
            .unwrap()
            .status,
        401
    );
    tcp.target = Target::Tcp(addr, Some("0123456789abcdef-secret".into()));
    assert_eq!(tcp.list(&ListFilter::default()).unwrap().len(), 1);

    // Metrics.
    let m = d.metrics();
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
    wait_for("no VMM left", 10, || d.vmms().is_empty());
}

#[test]
fn restart_reattaches_running_and_reclaims_dead() {
    let mut d = Daemon::start(&["--no-pools"]);
    let a = d.create(CreateSandbox::default());
    let b = d.create(CreateSandbox::default());
    let (ida, idb) = (a.id.clone(), b.id.clone());
    assert_eq!(d.sh(&ida, "echo kept > /tmp/f").exit_code, Some(0));
    d.kill9();
    // While the daemon is down: B's VMM dies, and junk appears.
    let pb = alive(&b).unwrap();
    pb.kill();
    wait_for("B's VMM to exit", 10, || !pb.alive());
    let stray = d.dir.join("sandboxes/0000deadbeef");
    std::fs::create_dir_all(&stray).unwrap();
    d.spawn();
    let a2 = d.get(&ida).unwrap();
    assert_eq!(a2.state, SandboxState::Running, "{a2:?}");
    assert_eq!(a2.pid, a.pid, "the same VMM, reattached");
    let b2 = d.get(&idb).unwrap();
    assert_eq!(b2.state, SandboxState::Failed, "{b2:?}");
    assert!(
        b2.error.as_deref().unwrap().contains("daemon was down"),
        "{b2:?}"
    );
    assert!(
        !d.dir.join("sandboxes").join(&idb).exists(),
        "B's files reclaimed"
    );
    assert!(!stray.exists(), "stray directory removed");
    assert_eq!(d.sh(&ida, "cat /tmp/f").stdout, "kept\n");
    // The reattached VMM is supervised like any other.
    let pa = alive(&a2).unwrap();
    pa.kill();
    wait_for("A marked failed", 10, || {
        d.state(&ida) == SandboxState::Failed
    });
    // The pid is the jailer's: the VMM it supervised dies by its parent-
    // death signal, a moment after the jailer (its exit can take a while
    // on a loaded host).
    wait_for("no VMM leaked", 10, || d.vmms().is_empty());
    let q = api::EventQuery {
        sandbox: Some(ida.clone()),
        ..Default::default()
    };
    let ev = d.must("events", d.c.events(&q));
    let kinds: Vec<&str> = ev.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["created", "reattached", "failed"], "{ev:?}");
}

#[test]
fn killed_vmms_are_noticed_and_reclaimed_and_pools_refill() {
    let d = Daemon::start(&[]);
    let tpl = "tiny-1c-128m";
    let s1 = d.create(CreateSandbox::default());
    assert_eq!(s1.from_pool, Some(false));
    d.must("pool", d.c.set_pool(tpl, 3));
    let ready = || d.must("pools", d.c.pools())[0].ready;
    wait_for("the pool to fill", 120, || ready() == 3);
    let s2 = d.create(CreateSandbox {
        metadata: labels(&[("n", "2")]),
        ..Default::default()
    });
    assert_eq!(s2.from_pool, Some(true), "{s2:?}");
    assert_eq!(s2.metadata["n"], "2");
    wait_for("the pool to refill", 120, || ready() == 3);
    // kill -9 a created sandbox's VMM and a pooled one.
    let pooled = d.must(
        "list",
        d.c.list(&ListFilter {
            state: Some(SandboxState::Pooled),
            ..Default::default()
        }),
    );
    let victim = alive(&pooled[0]).unwrap();
    let p1 = alive(&s1).unwrap();
    let t0 = Instant::now();
    p1.kill();
    victim.kill();
    let id1 = s1.id.as_str();
    wait_for("the death to be noticed", 5, || {
        d.state(id1) == SandboxState::Failed
    });
    eprintln!("VMM death noticed in {:?}", t0.elapsed());
    let f = d.get(id1).unwrap();
    assert!(
        f.error.as_deref().unwrap().contains("exited unexpectedly"),
        "{f:?}"
    );
    assert!(!d.dir.join("sandboxes").join(id1).exists());
    wait_for("the pool to replace its dead member", 120, || {
        ready() == 3 && d.get(&pooled[0].id).is_none()
    });
    // Idle sandboxes get their vCPUs paused (no CPU while idle) and are
    // continued by their next request.
    wait_for("idle sandboxes to be frozen", 20, || {
        d.metrics().contains("shoal_sandboxes_frozen 4")
    });
    // The pooled sandbox handed out works.
    let id2 = s2.id.as_str();
    assert_eq!(d.sh(id2, "echo pooled").stdout, "pooled\n");
    let m = d.metrics();
    assert!(m.contains("shoal_vmm_deaths_total 2"), "{m}");
    assert!(
        m.contains(&format!("shoal_pool_size{{template=\"{tpl}\"}} 3")),
        "{m}"
    );
    // Removing the pool ends its VMMs.
    d.must("delete pool", d.c.delete_pool(tpl));
    d.kill(id2);
    wait_for("every VMM to end", 10, || d.vmms().is_empty());
}

#[test]
fn pause_resume_on_exec_snapshot_ttl_idle() {
    let d = Daemon::start(&["--no-pools"]);
    let sb = d.create(CreateSandbox::default());
    let id = sb.id.clone();
    let out = d.sh(
        &id,
        "echo persisted > /tmp/p; setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!",
    );
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let p = alive(&sb).unwrap();
    let v = d.must("pause", d.c.pause(&id));
    assert_eq!(v.state, SandboxState::Paused);
    wait_for("the VMM to end", 10, || !p.alive());
    wait_for("a paused sandbox to have no VMM", 10, || {
        d.vmms().is_empty()
    });
    // The next exec resumes it, with its files and processes.
    let out = d.sh(&id, "cat /tmp/p; pidof sleep");
    let mut lines = out.stdout.lines();
    assert_eq!(lines.next(), Some("persisted"), "{out:?}");
    assert!(
        lines
            .next()
            .is_some_and(|l| l.trim().parse::<u32>().is_ok()),
        "the background process survived pause and resume: {out:?}"
    );
    assert_eq!(d.state(&id), SandboxState::Running);

    // Snapshot into a template; a clone of it has the file too.
    let req = api::SnapshotRequest {
        template: Some("snap1".into()),
    };
    let t = d.must("snapshot", d.c.snapshot(&id, &req));
    assert_eq!(t.state, TemplateState::Ready);
    let clone = d.restore("snap1");
    let cid = clone.id.as_str();
    assert_eq!(d.sh(cid, "cat /tmp/p").stdout, "persisted\n");

    // TTL and idle timeout.
    let ttl = d.create(CreateSandbox {
        ttl_s: 2,
        ..Default::default()
    });
    let idle = d.create(CreateSandbox {
        idle_timeout_s: 2,
        ..Default::default()
    });
    let (tid, iid) = (ttl.id.as_str(), idle.id.as_str());
    wait_for("the TTL kill", 20, || d.get(tid).is_none());
    wait_for("the idle pause", 20, || {
        d.state(iid) == SandboxState::Paused
    });
    assert!(alive(&ttl).is_none_or(|p| !p.alive()));
    for x in [id.as_str(), cid, iid] {
        d.kill(x);
    }
    wait_for("every VMM to end", 10, || d.vmms().is_empty());
    d.assert_no_sandbox_dirs();
}

#[test]
fn admission_refuses_with_429_and_503() {
    let d = Daemon::start(&["--no-pools", "--max-sandboxes", "2"]);
    d.create(CreateSandbox::default());
    d.create(CreateSandbox::default());
    let (s, code, m) = d.err("POST", "/v1/sandboxes", r#"{"image":"tiny"}"#);
    assert_eq!((s, code), (429, ErrorCode::HostFull));
    assert!(m.contains("host is full") && m.contains("limit 2"), "{m}");
    let m = d.metrics();
    assert!(
        m.contains("shoal_admission_refusals_total{reason=\"max_sandboxes\"} 1"),
        "{m}"
    );
    drop(d);
    let d = Daemon::start(&["--no-pools", "--min-available-mib", "100000000"]);
    let e = d.c.create(&CreateSandbox::from_image("tiny")).unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(503), Some(ErrorCode::HostMemoryLow))
    );
    assert!(e.to_string().contains("MiB available"), "{e}");
    let l = d.must("list", d.c.list(&ListFilter::default()));
    assert!(l.is_empty(), "a refused create leaves nothing");
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
fn output(v: &ExecResult) -> String {
    format!("{}{}", v.stdout, v.stderr)
}

#[test]
fn template_layers_and_upper_layers_end_to_end() {
    let work = tempfile::Builder::new()
        .prefix("layers")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    // A toolkit layer, built from a small directory like `shoal image
    // build DIR -o OUT --no-agent`.
    let kit = work.path().join("toolkit.img");
    let info = layer(&kit, &[("opt/toolkit/hello.txt", "from-the-toolkit\n")]);
    let misaligned = work.path().join("misaligned.img");
    std::fs::copy(&kit, &misaligned).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&misaligned)
        .unwrap()
        .set_len(info.len - 4096)
        .unwrap();
    let (kit_s, bad_s) = (kit.to_str().unwrap(), misaligned.to_str().unwrap());
    // A link in the layers directory to the kit: refused like a path
    // outside it (only plain files beneath the directory are layers).
    let link = work.path().join("link.img");
    std::os::unix::fs::symlink(&kit, &link).unwrap();
    let link_s = link.to_str().unwrap();

    let d = Daemon::start(&["--no-pools", "--layers-dir", work.path().to_str().unwrap()]);
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
            "not an allowed layer",
        ),
        (
            t(json!({"layers": ["/etc/shadow"]})),
            "not an allowed layer",
        ),
        (t(json!({"layers": [link_s]})), "not an allowed layer"),
        (t(json!({"layers": [bad_s]})), "not a multiple of"),
        (t(json!({"layers": ["kit.img"]})), "absolute path"),
        (t(json!({"layers": ["/dev/null"]})), "not an allowed layer"),
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
            (status, code),
            (400, ErrorCode::BadRequest),
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
    assert!(d.must("templates", d.c.templates()).is_empty());
    let raw: Value = d.must("raw", d.c.call("GET", "/v1/templates", None::<&()>));
    assert_eq!(raw, json!([]));

    // One template per configuration, built one after the other (one boot
    // each): the toolkit layer with a 2 MiB tmpfs upper layer, and with a
    // 32 MiB scratch disk.
    let kit_tmpfs = CreateTemplate {
        kind: None,
        layers: vec![kit_s.into()],
        upper_size_mib: Some(2),
        ..CreateTemplate::new("kit-tmpfs", "tiny")
    };
    // Sent as JSON by hand: the wire format of a template, every field
    // present (absent ones null).
    let small: Value = d.must(
        "kit-tmpfs",
        d.c.call("POST", "/v1/templates", Some(&kit_tmpfs)),
    );
    assert_eq!(
        (
            &small["layers"],
            &small["upper_size_mib"],
            &small["upper_disk_mib"]
        ),
        (&json!([kit_s]), &json!(2), &Value::Null)
    );
    assert_eq!(small["image"], Value::Null, "a built-in image's template");
    assert_eq!(small["kind"], "microvm", "the default kind");
    assert_eq!(
        keys(&small),
        [
            "created_at",
            "dir",
            "error",
            "image",
            "kind",
            "layers",
            "memory_mib",
            "name",
            "network",
            "owned",
            "owner",
            "source",
            "state",
            "upper_disk_mib",
            "upper_size_mib",
            "vcpus"
        ]
    );
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    assert_eq!(
        small["owner"],
        format!("uid:{me}"),
        "made over the Unix socket"
    );
    let disk = d.must(
        "kit-disk",
        d.c.create_template(&CreateTemplate {
            kind: None,
            layers: vec![kit_s.into()],
            upper_disk_mib: Some(32),
            ..CreateTemplate::new("kit-disk", "tiny")
        }),
    );
    assert_eq!(disk.upper_disk_mib, Some(32));
    assert_eq!(disk.state, TemplateState::Building);
    for name in ["kit-tmpfs", "kit-disk"] {
        wait_for(&format!("template {name}"), 600, || {
            let v = d.must(name, d.c.template(name));
            assert_ne!(v.state, TemplateState::Failed, "{v:?}\n{}", d.log());
            v.state == TemplateState::Ready
        });
    }
    // The templates pinned the kit they checked into their own
    // directories: another image renamed over the caller's path changes
    // nothing for them (their clones below still see the toolkit).
    let swapped = work.path().join("swapped.img");
    layer(&swapped, &[("opt/toolkit/hello.txt", "swapped\n")]);
    std::fs::rename(&swapped, &kit).unwrap();
    let tpl_disk = d.must("kit-disk", d.c.template("kit-disk")).dir;
    assert!(tpl_disk.join("layer1.erofs").is_file(), "the kit pinned");
    let tpl_scratch = tpl_disk.join("scratch.ext4");
    assert!(tpl_scratch.is_file(), "the template keeps its scratch disk");
    let sandbox_dir = |id: &str| d.dir.join("sandboxes").join(id);

    // tmpfs upper: the toolkit is there; the upper layer holds 2 MiB.
    let aid = d.restore("kit-tmpfs").id;
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
    let b1 = d.restore("kit-disk").id;
    let b2 = d.restore("kit-disk").id;
    let out = d.sh(
        &b1,
        "cat /opt/toolkit/hello.txt; df -k /; dd if=/dev/zero of=/big bs=64k count=48 \
         && echo b1 > /who && sync && echo wrote",
    );
    let text = output(&out);
    assert!(text.starts_with("from-the-toolkit\n"), "{text}");
    let total = df_total_kib(&text);
    assert!((28_000..=32_768).contains(&total), "a 32 MiB disk: {text}");
    assert!(out.stdout.ends_with("wrote\n"), "{text}");
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
    let v = d.must("pause", d.c.pause(&b1));
    assert_eq!(v.state, SandboxState::Paused);
    assert!(b1_disk.is_file(), "a paused sandbox keeps its scratch disk");
    assert_eq!(d.sh(&b1, "cat /who").stdout, "b1\n");

    // A snapshot into a template takes the disk along; its clone sees b1's
    // files.
    let req = api::SnapshotRequest {
        template: Some("b1-snap".into()),
    };
    let t = d.must("snapshot", d.c.snapshot(&b1, &req));
    assert_eq!(t.upper_disk_mib, Some(32));
    assert!(t.dir.join("scratch.ext4").is_file());
    let cid = d.restore("b1-snap").id;
    assert_eq!(d.sh(&cid, "cat /who").stdout, "b1\n");

    // Removing sandboxes and the owned template removes their disks.
    for id in [&aid, &b1, &b2, &cid] {
        d.kill(id);
    }
    d.must("delete template", d.c.delete_template("b1-snap"));
    assert!(!t.dir.exists());
    wait_for("every VMM to end", 10, || d.vmms().is_empty());
    assert!(!b2_disk.exists());
    d.assert_no_sandbox_dirs();
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
    let sb = d.create(CreateSandbox::default());
    let t = d.must("template", d.c.template("tiny-1c-128m"));
    assert_eq!((t.state, t.owned), (TemplateState::Ready, true));
    let dir = t.dir.clone();
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
    d.kill(&sb.id);
    wait_for("the VMM to end", 10, || d.vmms().is_empty());

    // A day-old template no process maps (by the times the pruning looks
    // at; its image must keep its own, which a restore checks), pruned by
    // the daemon-less side as it does after making a template of its own.
    for p in ["state", "memory", ""] {
        age(&dir.join(p), Duration::from_secs(2 * 24 * 3600));
    }
    let pruned = shoal_runtime::sandbox::prune_templates(
        &cache.path().join("templates"),
        std::path::Path::new("/nonexistent"),
        Duration::from_secs(3600),
    );
    assert!(pruned.is_empty(), "pruned {pruned:?}");
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
    let sb = d.create(CreateSandbox::default());
    assert_eq!(d.sh(&sb.id, "echo ok").stdout, "ok\n");
    d.kill(&sb.id);
    d.must("delete the template", d.c.delete_template("tiny-1c-128m"));
    assert!(!dir.exists(), "a deleted template's directory stayed");
}
