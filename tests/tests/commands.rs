//! What the Python SDK's users do beyond one-shot exec, on real guests
//! (/dev/kvm) through a real shoald: a background command re-attached
//! from a new connection, fed stdin, waited for; a signalled one; mkdir
//! and rename; a TTL set after creation that then kills the sandbox.
//! And the CLI's `shoal exec --background`, `shoal attach` and `shoal
//! daemon start|status|stop`.

#[allow(dead_code)] // shared with the daemon tests; this binary uses part
mod daemon_harness;

use daemon_harness::{wait_for, Daemon};
use shoal_client::api::{self, CommandState, CreateSandbox, ErrorCode, ExecEvent, ExecRequest};
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn background_commands_files_and_a_later_ttl_on_a_real_guest() {
    let d = Daemon::start(&["--no-pools"]);
    let sb = d.create(CreateSandbox::default());
    let id = sb.id.as_str();

    // Started in the background with stdin kept open; the call returns
    // at once.
    let req = ExecRequest {
        stdin_open: true,
        ..ExecRequest::shell("echo a; sleep 1; echo b; read x; echo got $x")
    };
    let cmd = d.must("start", d.c.start_command(id, &req));
    assert_eq!(cmd.state, CommandState::Running, "{cmd:?}");
    // Re-attached from a new connection (the start's is gone): what it
    // wrote so far, then live output.
    let mut out = String::new();
    let mut first = None;
    for ev in d.must("stream", d.c.command_stream(id, &cmd.id)) {
        match d.must("event", ev) {
            ExecEvent::Stdout { data, encoding } => {
                out.push_str(std::str::from_utf8(&encoding.decode(&data).unwrap()).unwrap())
            }
            e => {
                first.get_or_insert(e);
            }
        }
        if out.contains("b\n") {
            break;
        }
    }
    assert!(matches!(first, Some(ExecEvent::Start { .. })), "{first:?}");
    assert_eq!(out, "a\nb\n");
    // Still waiting for its stdin.
    let e = d.c.wait_command(id, &cmd.id, Some(0.5)).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::DeadlineExceeded), "{e}");
    d.must(
        "stdin",
        d.c.command_stdin(id, &cmd.id, &mut &b"hello\n"[..], true),
    );
    let r = d.must("wait", d.c.wait_command(id, &cmd.id, Some(60.0)));
    assert_eq!((r.exit_code, r.signal), (Some(0), None), "{r:?}");
    assert_eq!(r.stdout, "a\nb\ngot hello\n");
    let listed = d.must("list", d.c.commands(id));
    assert!(listed
        .iter()
        .any(|c| c.id == cmd.id && c.state == CommandState::Exited));

    // SIGTERM to `sleep 100`.
    let sleeper = d.must(
        "start sleep",
        d.c.start_command(id, &ExecRequest::argv(["sleep", "100"])),
    );
    d.must("signal", d.c.signal_command(id, &sleeper.id, 15, true));
    let r = d.must("wait sleep", d.c.wait_command(id, &sleeper.id, Some(60.0)));
    assert_eq!((r.exit_code, r.signal), (None, Some(15)), "{r:?}");

    // mkdir -p, a file in it, renamed.
    let deep = api::MkdirQuery {
        parents: Some(true),
        ..api::MkdirQuery::new("/tmp/d/e")
    };
    d.must("mkdir", d.c.mkdir(id, &deep));
    let e =
        d.c.mkdir(id, &api::MkdirQuery::new("/tmp/d/e"))
            .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    assert_eq!(d.sh(id, "echo x > /tmp/d/e/f").exit_code, Some(0));
    d.must("rename", d.c.rename(id, "/tmp/d/e/f", "/tmp/d/g"));
    let r = d.sh(id, "cat /tmp/d/g; ls -A /tmp/d/e; stat -c %a /tmp/d/e");
    assert_eq!(r.stdout, "x\n755\n", "{r:?}");
    let e = d.c.rename(id, "/tmp/d/e/f", "/tmp/d/h").unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");

    // The CLI: `shoal exec --background` prints the command's id,
    // `shoal attach` follows it and exits with its exit code.
    let shoal = |args: &[&str]| {
        let o = Command::new(shoal_test_support::shoal_cli())
            .arg("--daemon")
            .arg(d.dir.join("shoald.sock"))
            .args(args)
            .output()
            .expect("run shoal");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        (o.status.code(), String::from_utf8(o.stdout).unwrap(), err)
    };
    let (code, out, err) = shoal(&["exec", "-d", id, "--", "sh", "-c", "echo bg; exit 4"]);
    assert_eq!(code, Some(0), "{err}");
    let cid = out.trim();
    assert!(cid.parse::<u64>().is_ok(), "{out:?}");
    let (code, out, err) = shoal(&["attach", id, cid]);
    assert_eq!((code, out.as_str()), (Some(4), "bg\n"), "{err}");

    // A TTL from now: the sandbox is gone a few seconds later.
    let u = api::UpdateSandbox {
        ttl_s: Some(3),
        ..Default::default()
    };
    let t0 = Instant::now();
    let v = d.must("patch", d.c.update_sandbox(id, &u));
    assert!(v.ttl_s >= 3, "{v:?}");
    wait_for("the TTL kill", 30, || d.get(id).is_none());
    assert!(
        t0.elapsed() >= Duration::from_secs(2),
        "killed before its TTL"
    );
    wait_for("every VMM to end", 10, || d.vmms().is_empty());
    d.assert_no_sandbox_dirs();
}

#[test]
fn shoal_daemon_start_status_stop() {
    let bin = shoal_test_support::shoal_cli();
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("daemon/shoald.sock");
    let shoal = |args: &[&str]| {
        let o = Command::new(&bin)
            .args(args)
            .env("SHOAL_DAEMON", &sock)
            .output()
            .expect("run shoal");
        let text =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        (o.status.code(), text)
    };
    let (code, text) = shoal(&["daemon", "status"]);
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains("not running"), "{text}");
    let (code, text) = shoal(&["daemon", "stop"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("no shoald is running"), "{text}");

    let (code, text) = shoal(&["daemon", "start"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("started") && text.contains(&sock.display().to_string()),
        "{text}"
    );
    let (code, text) = shoal(&["--json", "daemon", "status"]);
    assert_eq!(code, Some(0), "{text}");
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON status");
    assert_eq!(v["running"], true, "{v}");
    let pid = v["pid"].as_i64().expect("a pid");
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["sandboxes"].is_object(), "{v}");
    let (code, text) = shoal(&["daemon", "start"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("already running"), "{text}");

    let (code, text) = shoal(&["daemon", "stop"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("pid {pid}")), "{text}");
    let gone = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'))
    });
    assert!(gone, "shoald (pid {pid}) still runs after stop");
    let (code, text) = shoal(&["daemon", "status"]);
    assert_eq!(code, Some(3), "{text}");
}

#[test]
fn a_background_command_survives_pause_and_resume() {
    let d = Daemon::start(&["--no-pools"]);
    let sb = d.create(CreateSandbox::default());
    let id = sb.id.as_str();
    let req = ExecRequest::shell("echo before; sleep 4; echo after");
    let cmd = d.must("start", d.c.start_command(id, &req));
    let mut s = d.must("stream", d.c.command_stream(id, &cmd.id));
    assert!(matches!(s.next(), Some(Ok(ExecEvent::Start { .. }))));
    assert!(matches!(s.next(), Some(Ok(ExecEvent::Stdout { .. }))));
    // Paused to disk mid-way (the daemon's link to it goes with the VMM):
    // the stream that was following it says so.
    d.must("pause", d.c.pause(id));
    let last = s.last().map(|e| d.must("event", e));
    assert!(
        matches!(&last, Some(ExecEvent::Error { message }) if message.contains("stream it again")),
        "{last:?}"
    );
    // The wait resumes the sandbox and re-attaches: the command went on
    // from where it was and its output is whole.
    let r = d.must("wait", d.c.wait_command(id, &cmd.id, Some(120.0)));
    assert_eq!(
        (r.exit_code, r.stdout.as_str()),
        (Some(0), "before\nafter\n"),
        "{r:?}"
    );
    assert_eq!(d.state(id), api::SandboxState::Running);
    d.kill(id);
}
