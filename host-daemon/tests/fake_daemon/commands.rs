//! Background commands (started, listed, re-attached from new
//! connections, fed stdin, waited for, signalled), mkdir and rename, and
//! a sandbox's limits changed after its creation.

use crate::harness::*;
use shoal_client::api::{self, CommandState, ErrorCode, ExecEvent, ExecRequest, SandboxState};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

/// Stdout of a stream's events until `until` is in it (or the end); the
/// events' kinds in order.
fn read_until(
    s: &mut shoal_client::ExecStream,
    until: Option<&str>,
) -> (String, Vec<&'static str>) {
    let (mut out, mut kinds) = (String::new(), Vec::new());
    for ev in s.by_ref() {
        let ev = ev.expect("event");
        kinds.push(match &ev {
            ExecEvent::Start { .. } => "start",
            ExecEvent::Stdout { data, encoding } => {
                out.push_str(&String::from_utf8(encoding.decode(data).unwrap()).unwrap());
                "stdout"
            }
            ExecEvent::Stderr { .. } => "stderr",
            ExecEvent::Exit { .. } => "exit",
            ExecEvent::Error { message } => panic!("stream error: {message}"),
        });
        if until.is_some_and(|u| out.contains(u)) {
            break;
        }
    }
    (out, kinds)
}

#[test]
fn background_commands_reattach_take_stdin_and_end() {
    let d = TestDaemon::start();
    let sb = d.create();
    let req = ExecRequest {
        stdin_open: true,
        ..ExecRequest::shell("echo a; sleep 1; echo b; read x; echo got $x")
    };
    let t0 = Instant::now();
    let cmd = d.c.start_command(&sb.id, &req).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1), "start waited");
    assert_eq!(
        (cmd.state, cmd.sandbox_id.as_str(), cmd.exit_code),
        (CommandState::Running, sb.id.as_str(), None)
    );
    assert!(cmd.pid > 0 && cmd.id.parse::<u64>().is_ok(), "{cmd:?}");
    assert_eq!(d.c.command(&sb.id, &cmd.id).unwrap().id, cmd.id);
    let ids: Vec<String> =
        d.c.commands(&sb.id)
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
    assert_eq!(ids, std::slice::from_ref(&cmd.id));

    // A stream from a new connection: what came so far, then live; it
    // is dropped half-way and the command goes on.
    let mut s = d.c.command_stream(&sb.id, &cmd.id).unwrap();
    let (out, kinds) = read_until(&mut s, Some("b\n"));
    assert_eq!((out.as_str(), kinds[0]), ("a\nb\n", "start"));
    drop(s);
    // Another, at once: the same output replayed, then waiting on stdin.
    let w = d.c.wait_command(&sb.id, &cmd.id, Some(0.2)).unwrap_err();
    assert_eq!(refused(w).1, Some(ErrorCode::DeadlineExceeded));
    assert_eq!(
        d.c.command(&sb.id, &cmd.id).unwrap().state,
        CommandState::Running
    );
    d.c.command_stdin(&sb.id, &cmd.id, &mut &b"hel"[..], false)
        .unwrap();
    d.c.command_stdin(&sb.id, &cmd.id, &mut &b"lo\n"[..], true)
        .unwrap();
    let r = d.c.wait_command(&sb.id, &cmd.id, Some(10.0)).unwrap();
    assert_eq!((r.exit_code, r.signal, r.truncated), (Some(0), None, false));
    assert_eq!(r.stdout, "a\nb\ngot hello\n");
    let c = d.c.command(&sb.id, &cmd.id).unwrap();
    assert_eq!((c.state, c.exit_code), (CommandState::Exited, Some(0)));
    // A finished command's stream: everything, then its exit.
    let mut s = d.c.command_stream(&sb.id, &cmd.id).unwrap();
    let (out, kinds) = read_until(&mut s, None);
    assert_eq!(out, "a\nb\ngot hello\n");
    assert_eq!((kinds[0], *kinds.last().unwrap()), ("start", "exit"));
    // Its stdin is closed; it is not running.
    let e = d.c.command_stdin(&sb.id, &cmd.id, &mut &b"x"[..], false);
    assert_eq!(refused(e.unwrap_err()).0, 409);
    let e = d.c.signal_command(&sb.id, &cmd.id, 15, true).unwrap_err();
    assert_eq!(refused(e).1, Some(ErrorCode::Conflict));

    // Signalled: SIGTERM to the group ends `sleep 100`.
    let sleeper =
        d.c.start_command(&sb.id, &ExecRequest::shell("sleep 100"))
            .unwrap();
    let e =
        d.c.command_stdin(&sb.id, &sleeper.id, &mut &b"x"[..], false);
    let (s, _, m) = refused(e.unwrap_err());
    assert!(s == 409 && m.contains("stdin_open"), "{m}");
    d.c.signal_command(&sb.id, &sleeper.id, 15, true).unwrap();
    let r = d.c.wait_command(&sb.id, &sleeper.id, None).unwrap();
    assert_eq!((r.exit_code, r.signal), (None, Some(15)));
    let e =
        d.c.signal_command(&sb.id, &sleeper.id, 99, true)
            .unwrap_err();
    assert_eq!(refused(e).0, 400);

    // Output on both streams, initial stdin, its own timeout.
    let req = ExecRequest::shell("cat; echo err >&2; sleep 30")
        .with_stdin(b"in\n")
        .with_timeout(1.0);
    let c = d.c.start_command(&sb.id, &req).unwrap();
    let r = d.c.wait_command(&sb.id, &c.id, None).unwrap();
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("in\n", "err\n"));
    assert!(r.timed_out && r.signal == Some(9), "{r:?}");
    assert!(d.c.command(&sb.id, &c.id).unwrap().timed_out);

    // Unknown ids; stdin_open is for background commands only.
    for bad in ["999999", "x"] {
        let e = d.c.command(&sb.id, bad).unwrap_err();
        assert_eq!(refused(e).1, Some(ErrorCode::NotFound), "{bad}");
    }
    assert!(d
        .c
        .command("000000000000", &cmd.id)
        .unwrap_err()
        .is_not_found());
    let e = d.c.exec(&sb.id, &req_with_stdin_open()).unwrap_err();
    assert_eq!(refused(e).0, 400);

    // A paused sandbox is resumed to start one; one it no longer knows
    // (the fake's agent process was replaced) is lost.
    let running =
        d.c.start_command(&sb.id, &ExecRequest::shell("sleep 100"))
            .unwrap();
    d.c.pause(&sb.id).unwrap();
    let c =
        d.c.start_command(&sb.id, &ExecRequest::shell("echo again"))
            .unwrap();
    assert_eq!(d.get(&sb.id).state, SandboxState::Running);
    assert_eq!(
        d.c.wait_command(&sb.id, &c.id, None).unwrap().stdout,
        "again\n"
    );
    let e = d.c.wait_command(&sb.id, &running.id, None).unwrap_err();
    let (s, code, m) = refused(e);
    assert!(s == 502 && code == Some(ErrorCode::SandboxError), "{s} {m}");
    assert_eq!(
        d.c.command(&sb.id, &running.id).unwrap().state,
        CommandState::Lost
    );
}

fn req_with_stdin_open() -> ExecRequest {
    ExecRequest {
        stdin_open: true,
        ..ExecRequest::shell("true")
    }
}

#[test]
fn a_sandbox_remembers_a_bounded_number_of_commands() {
    let d = TestDaemon::start();
    let sb = d.create();
    let mut ids = Vec::new();
    for i in 0..32 {
        let c =
            d.c.start_command(&sb.id, &ExecRequest::shell(format!("echo {i}")))
                .unwrap();
        ids.push(c.id);
    }
    d.wait_for("all to end", T, || {
        d.c.commands(&sb.id)
            .unwrap()
            .iter()
            .all(|c| c.state == CommandState::Exited)
    });
    // A 33rd: the oldest finished one is forgotten.
    let last =
        d.c.start_command(&sb.id, &ExecRequest::shell("sleep 100"))
            .unwrap();
    let now: Vec<String> =
        d.c.commands(&sb.id)
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
    assert_eq!(now.len(), 32);
    assert!(!now.contains(&ids[0]) && now.contains(&ids[1]) && now.contains(&last.id));
    assert!(d.c.command(&sb.id, &ids[0]).unwrap_err().is_not_found());
    assert_eq!(
        d.c.wait_command(&sb.id, &ids[5], None).unwrap().stdout,
        "5\n"
    );
    // With all of them running, a new one is refused.
    for _ in 0..31 {
        d.c.start_command(&sb.id, &ExecRequest::shell("sleep 100"))
            .unwrap();
    }
    let e =
        d.c.start_command(&sb.id, &ExecRequest::shell("true"))
            .unwrap_err();
    let (s, code, m) = refused(e);
    assert!(s == 429 && code == Some(ErrorCode::SandboxBusy), "{s} {m}");
    // Killing the sandbox ends them all.
    d.c.kill(&sb.id).unwrap();
    assert!(d.c.commands(&sb.id).unwrap_err().is_not_found());
}

#[test]
fn mkdir_and_rename() {
    let d = TestDaemon::start();
    let sb = d.create();
    let root = d.scratch("fs");
    let p = |s: &str| root.join(s).to_string_lossy().into_owned();
    d.c.mkdir(&sb.id, &api::MkdirQuery::new(p("a"))).unwrap();
    assert!(root.join("a").is_dir());
    let e =
        d.c.mkdir(&sb.id, &api::MkdirQuery::new(p("a")))
            .unwrap_err();
    assert_eq!(refused(e).1, Some(ErrorCode::Conflict));
    let e =
        d.c.mkdir(&sb.id, &api::MkdirQuery::new(p("x/y")))
            .unwrap_err();
    assert_eq!(refused(e).1, Some(ErrorCode::NotFound));
    let deep = api::MkdirQuery {
        parents: Some(true),
        mode: Some(0o700),
        ..api::MkdirQuery::new(p("x/y/z"))
    };
    d.c.mkdir(&sb.id, &deep).unwrap();
    d.c.mkdir(&sb.id, &deep).unwrap(); // -p: exists is fine
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(root.join("x/y/z"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let e = d.c.mkdir(&sb.id, &api::MkdirQuery::new("rel")).unwrap_err();
    assert_eq!(refused(e).0, 400);

    std::fs::write(root.join("a/f"), "data").unwrap();
    d.c.rename(&sb.id, &p("a/f"), &p("x/g")).unwrap();
    assert_eq!(read(&root.join("x/g")), "data");
    assert!(!root.join("a/f").exists());
    let e = d.c.rename(&sb.id, &p("a/f"), &p("x/h")).unwrap_err();
    assert_eq!(refused(e).1, Some(ErrorCode::NotFound));
    let e = d.c.rename(&sb.id, "a", &p("x/h")).unwrap_err();
    assert_eq!(refused(e).0, 400);
}

#[test]
fn limits_changed_after_creation_are_kept_and_enforced() {
    let mut d = TestDaemon::start();
    let sb = d.create();
    let long = d.create();
    assert_eq!(sb.ttl_s, 0);
    // A TTL from now; kept across a restart.
    let u = api::UpdateSandbox {
        ttl_s: Some(3),
        idle_timeout_s: Some(100),
        priority: None,
    };
    let v = d.c.update_sandbox(&sb.id, &u).unwrap();
    assert!(v.ttl_s >= 3 && v.ttl_s <= 5, "{v:?}");
    assert_eq!(v.idle_timeout_s, 100);
    let v =
        d.c.update_sandbox(
            &long.id,
            &api::UpdateSandbox {
                ttl_s: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(v.ttl_s >= 2);
    // ... and taken back (0: never), leaving the idle timeout.
    let v =
        d.c.update_sandbox(
            &long.id,
            &api::UpdateSandbox {
                ttl_s: Some(0),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((v.ttl_s, v.idle_timeout_s), (0, 0));
    d.restart();
    assert_eq!(d.get(&sb.id).idle_timeout_s, 100);
    d.wait_for("the TTL kill", T, || {
        d.c.sandbox(&sb.id).is_err_and(|e| e.is_not_found())
    });
    assert!(d.event_kinds(&sb.id).iter().any(|k| k == "limits"));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(d.get(&long.id).state, SandboxState::Running);
    // Bad bodies and ids.
    let e = d.c.call::<api::Sandbox>(
        "PATCH",
        &format!("/v1/sandboxes/{}", long.id),
        Some(&serde_json::json!({"ttl": 1})),
    );
    assert_eq!(refused(e.unwrap_err()).0, 400);
    let e =
        d.c.update_sandbox("000000000000", &api::UpdateSandbox::default());
    assert!(e.unwrap_err().is_not_found());
}

#[test]
fn many_streams_of_one_command_each_get_all_of_it() {
    let d = TestDaemon::start();
    let sb = d.create();
    let script = "for i in $(seq 1 200); do echo line $i; done; sleep 1; echo end";
    let cmd =
        d.c.start_command(&sb.id, &ExecRequest::shell(script))
            .unwrap();
    let want: String = (1..=200).map(|i| format!("line {i}\n")).collect::<String>() + "end\n";
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let (c, id, cid) = (d.c.clone(), sb.id.clone(), cmd.id.clone());
            std::thread::spawn(move || {
                let mut s = c.command_stream(&id, &cid).unwrap();
                read_until(&mut s, None)
            })
        })
        .collect();
    for r in readers {
        let (out, kinds) = r.join().unwrap();
        assert_eq!(out, want);
        assert_eq!((kinds[0], *kinds.last().unwrap()), ("start", "exit"));
    }
}
