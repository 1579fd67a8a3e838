//! Create, exec, files, pause to disk, resume, snapshot, kill; freezing;
//! failures of the backend.

use crate::harness::*;
use shoal_client::api::{self, ErrorCode, SandboxState, SnapshotRequest, TemplateState};
use shoal_runtime::backend::fake::{Op, PAUSED_STATE};
use std::io::Read;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

#[test]
fn create_exec_files_pause_resume_snapshot_kill() {
    let d = TestDaemon::start();
    let sb = d.create_with(|r| {
        r.env.insert("GREETING".into(), "hello".into());
        r.metadata.insert("run".into(), "1".into());
    });
    assert_eq!(sb.state, SandboxState::Running);
    assert_eq!(sb.from_pool, Some(false));
    assert_eq!(sb.template, "tiny-1c-128m");
    // Its kind, from its template's (this daemon's default backend).
    assert_eq!(sb.kind, "fake");
    assert_eq!(d.c.sandbox(&sb.id).unwrap().kind, "fake");
    let pid = sb.pid.expect("a VM process");
    assert!(!gone(pid));
    let tpl = d.c.template("tiny-1c-128m").unwrap();
    assert_eq!(tpl.state, TemplateState::Ready);

    // Exec really runs (on the host, in the sandbox's directory), with the
    // sandbox's environment.
    let (code, out) = d.sh(&sb.id, "echo $GREETING; pwd").unwrap();
    assert_eq!(code, Some(0));
    let sb_dir = d.sandboxes_dir().join(&sb.id);
    assert_eq!(out, format!("hello\n{}\n", sb_dir.display()));
    let (code, _) = d.sh(&sb.id, "exit 3").unwrap();
    assert_eq!(code, Some(3));

    // Files, through the agent.
    let f = d.scratch("files").join("a.txt");
    let path = f.to_string_lossy().into_owned();
    let up =
        d.c.put_file(&sb.id, &api::UploadQuery::new(&path), &mut &b"contents"[..])
            .unwrap();
    assert_eq!(up.bytes, 8);
    assert_eq!(read(&f), "contents");
    let mut got = String::new();
    d.c.get_file(&sb.id, &path)
        .unwrap()
        .read_to_string(&mut got)
        .unwrap();
    assert_eq!(got, "contents");
    assert_eq!(d.c.stat(&sb.id, &path).unwrap().size, 8);
    let names: Vec<String> =
        d.c.list_dir(&sb.id, &d.scratch("files").to_string_lossy())
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
    assert_eq!(names, ["a.txt"]);
    d.c.remove_file(
        &sb.id,
        &api::RemoveQuery {
            path: path.clone(),
            recursive: None,
        },
    )
    .unwrap();
    let (s, code, _) = refused(d.c.stat(&sb.id, &path).unwrap_err());
    assert_eq!((s, code), (404, Some(ErrorCode::NotFound)));

    // Paused to disk: the VM process ends, its state stays on disk.
    let p = d.c.pause(&sb.id).unwrap();
    assert_eq!((p.state, p.pid), (SandboxState::Paused, None));
    d.wait_for("the paused VM's process to end", T, || gone(pid));
    assert!(sb_dir.join(PAUSED_STATE).is_file());
    // The next request resumes it: a new process.
    let (_, out) = d.sh(&sb.id, "echo back").unwrap();
    assert_eq!(out, "back\n");
    let r = d.get(&sb.id);
    assert_eq!(r.state, SandboxState::Running);
    let pid2 = r.pid.unwrap();
    assert_ne!(pid2, pid);
    // Explicitly, too.
    d.c.pause(&sb.id).unwrap();
    let r = d.c.resume(&sb.id).unwrap();
    assert_eq!(r.state, SandboxState::Running);
    assert!(gone(pid2) && !gone(r.pid.unwrap()));
    // Pausing a paused one is a no-op; resuming a running one too.
    assert_eq!(d.c.resume(&sb.id).unwrap().pid, r.pid);

    // A snapshot becomes a template that sandboxes are created from; the
    // sandbox goes on.
    let t =
        d.c.snapshot(
            &sb.id,
            &SnapshotRequest {
                template: Some("snap1".into()),
            },
        )
        .unwrap();
    assert_eq!(
        (t.state, t.source.as_str()),
        (TemplateState::Ready, &*format!("sandbox:{}", sb.id))
    );
    assert!(t.owned);
    assert_eq!(d.sh(&sb.id, "echo still").unwrap().1, "still\n");
    let (s, _, m) = refused(
        d.c.snapshot(
            &sb.id,
            &SnapshotRequest {
                template: Some("snap1".into()),
            },
        )
        .unwrap_err(),
    );
    assert!(s == 409 && m.contains("exists"), "{m}");
    let clone =
        d.c.create(&api::CreateSandbox::from_template("snap1"))
            .unwrap();
    assert_eq!(d.sh(&clone.id, "echo clone").unwrap().1, "clone\n");

    // Killed: gone from the API, its process and its directory gone.
    let last = d.get(&sb.id).pid.unwrap();
    d.c.kill(&sb.id).unwrap();
    assert!(d.c.sandbox(&sb.id).unwrap_err().is_not_found());
    d.wait_for("the killed VM's process to end", T, || gone(last));
    assert!(!sb_dir.exists());
    let kinds = d.event_kinds(&sb.id);
    for k in ["created", "paused", "resumed", "snapshot", "killed"] {
        assert!(kinds.iter().any(|x| x == k), "{k} not in {kinds:?}");
    }
    // Deleting the template keeps its directory (the daemon owns it)
    // while a sandbox made from it is left; the last one lets it go.
    d.c.delete_template("snap1").unwrap();
    assert!(d.c.template("snap1").unwrap_err().is_not_found());
    assert!(t.dir.exists());
    d.c.kill(&clone.id).unwrap();
    assert!(!t.dir.exists());
}

#[test]
fn idle_sandboxes_are_frozen_and_thawed_by_the_next_request() {
    let d = TestDaemon::with(Opts {
        freeze_after: Some(Duration::from_millis(150)),
        ..Opts::default()
    });
    let sb = d.create();
    let pid = sb.pid.unwrap();
    // Frozen at once after the restore (nothing runs until asked).
    assert_eq!(proc_state(pid), Some('T'));
    assert_eq!(d.metric("shoal_sandboxes_frozen"), Some(1.0));
    // A request continues it first.
    assert_eq!(d.sh(&sb.id, "echo awake").unwrap().1, "awake\n");
    // Idle again: frozen again, by the freezer.
    d.wait_for("the idle sandbox to be frozen", T, || {
        proc_state(pid) == Some('T')
    });
    // A keep_running sandbox is never frozen.
    let k = d.create_with(|r| r.keep_running = true);
    std::thread::sleep(Duration::from_millis(600));
    assert_ne!(proc_state(k.pid.unwrap()), Some('T'));
    assert_eq!(d.sh(&k.id, "echo up").unwrap().1, "up\n");
}

#[test]
fn a_pause_at_ttl_sandbox_is_paused_at_its_ttl_and_resumable() {
    let d = TestDaemon::start();
    let sb = d.create_with(|r| {
        r.ttl_s = 1;
        r.pause_at_ttl = true;
    });
    assert!(sb.pause_at_ttl);
    let killed = d.create_with(|r| r.ttl_s = 1);
    d.wait_for("the TTL pause", T, || {
        d.get(&sb.id).state == SandboxState::Paused
    });
    d.wait_for("the TTL kill", T, || {
        d.c.sandbox(&killed.id).is_err_and(|e| e.is_not_found())
    });
    // Its TTL is cleared: resumed, it stays up.
    let p = d.get(&sb.id);
    assert_eq!(p.ttl_s, 0, "{p:?}");
    assert!(d.event_kinds(&sb.id).iter().any(|k| k == "ttl"));
    d.c.resume(&sb.id).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(d.get(&sb.id).state, SandboxState::Running);
    assert_eq!(d.sh(&sb.id, "echo back").unwrap().1, "back\n");
}

#[test]
fn backend_failures_are_reported_and_cleaned_up() {
    let d = TestDaemon::start();
    // A restore that fails: 502, and nothing of the sandbox is left.
    d.create(); // the template exists from here on
    d.faults.fail_next(Op::Restore, 1);
    let (s, code, m) = refused(
        d.c.create(&api::CreateSandbox {
            image: Some("tiny".into()),
            ..Default::default()
        })
        .unwrap_err(),
    );
    assert_eq!((s, code), (502, Some(ErrorCode::SandboxError)), "{m}");
    assert!(
        m.contains("restore failed") && m.contains("injected"),
        "{m}"
    );
    assert_eq!(d.c.list(&Default::default()).unwrap().len(), 1);

    // A pause that fails leaves the sandbox running (thawed).
    let sb = d.create();
    d.faults.fail_next(Op::Pause, 1);
    let (s, _, m) = refused(d.c.pause(&sb.id).unwrap_err());
    assert_eq!(s, 502, "{m}");
    let r = d.get(&sb.id);
    assert_eq!(r.state, SandboxState::Running);
    assert!(
        r.error.as_deref().unwrap_or("").contains("pause failed"),
        "{r:?}"
    );
    assert_eq!(d.sh(&sb.id, "echo ok").unwrap().1, "ok\n");
    // A pause that fails and cannot be undone leaves it failed.
    d.faults.fail_next(Op::Pause, 1);
    d.faults.fail_next(Op::Thaw, 1);
    assert!(d.c.pause(&sb.id).is_err());
    assert_eq!(d.get(&sb.id).state, SandboxState::Failed);

    // A snapshot that fails leaves no template; the sandbox goes on.
    let sb = d.create();
    d.faults.fail_next(Op::Snapshot, 1);
    let req = SnapshotRequest {
        template: Some("nope".into()),
    };
    assert_eq!(refused(d.c.snapshot(&sb.id, &req).unwrap_err()).0, 502);
    assert!(d.c.template("nope").unwrap_err().is_not_found());
    assert_eq!(d.sh(&sb.id, "echo on").unwrap().1, "on\n");

    // A template build that fails is a failed template.
    d.faults.fail_next(Op::Template, 1);
    let t =
        d.c.create_template(&api::CreateTemplate {
            kind: None,
            vcpus: Some(2),
            ..api::CreateTemplate::new("broken", "tiny")
        })
        .unwrap();
    assert_eq!(t.state, TemplateState::Building);
    d.wait_for("the template build to fail", T, || {
        d.c.template("broken")
            .is_ok_and(|t| t.state == TemplateState::Failed)
    });
    let (s, _, m) = refused(
        d.c.create(&api::CreateSandbox::from_template("broken"))
            .unwrap_err(),
    );
    assert!(s == 409 && m.contains("injected"), "{m}");
}

#[test]
fn a_vm_that_cannot_start_on_this_host_is_a_500() {
    let d = TestDaemon::with(Opts {
        agent: Some("/nonexistent/shoal-agent".into()),
        ..Opts::default()
    });
    let (s, code, m) = refused(
        d.c.create(&api::CreateSandbox {
            image: Some("tiny".into()),
            ..Default::default()
        })
        .unwrap_err(),
    );
    assert_eq!((s, code), (500, Some(ErrorCode::Internal)), "{m}");
    assert!(m.contains("cannot start /nonexistent/shoal-agent"), "{m}");
    assert!(d.c.list(&Default::default()).unwrap().is_empty());
}
