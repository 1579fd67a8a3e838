//! Aggregate limits: disk reserved by every sandbox, paused ones too, and
//! uploads past their cap (streamed, refused with 413, the sandbox fine).

use crate::harness::{refused, Opts, TestDaemon};
use shoal_client::api::{self, ErrorCode};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[test]
fn paused_sandboxes_hold_their_disk_in_admission() {
    // Each sandbox reserves its memory (128 MiB, written when paused), and
    // so does its template (its memory file).
    let d = TestDaemon::with(Opts {
        disk_budget_mib: 420,
        pools: false,
        ..Opts::default()
    });
    let a = d.create();
    d.c.pause(&a.id).unwrap();
    let b = d.create();
    // `a` holds no VM, but its memory is on disk: no room for a third.
    let (s, code, m) = refused(
        d.c.create(&api::CreateSandbox::from_image("tiny"))
            .unwrap_err(),
    );
    assert_eq!((s, code), (429, Some(ErrorCode::HostFull)), "{m}");
    assert!(m.contains("disk") && m.contains("420 MiB"), "{m}");
    let stats = d.c.stats().unwrap();
    assert_eq!(stats.usage.disk_mib, 3 * 128, "{stats:?}");
    // Resuming the paused one needs no more than it holds.
    assert_eq!(d.sh(&a.id, "echo back").unwrap().1, "back\n");
    d.c.kill(&b.id).unwrap();
    d.create();
    // A sandbox that could never fit is refused at once.
    let (s, _, m) = refused(
        d.c.create(&api::CreateSandbox {
            upper_disk_mib: Some(1024),
            ..api::CreateSandbox::from_image("tiny")
        })
        .unwrap_err(),
    );
    assert_eq!(s, 400, "{m}");
    assert!(m.contains("disk budget is 420 MiB"), "{m}");
    // Nor may a snapshot (its memory file) fill the disk past the budget.
    let (s, _, m) = refused(
        d.c.snapshot(
            &a.id,
            &api::SnapshotRequest {
                template: Some("snap".into()),
            },
        )
        .unwrap_err(),
    );
    assert_eq!(s, 429, "{m}");
    assert!(d.c.template("snap").is_err_and(|e| e.is_not_found()));
}

#[test]
fn an_upload_past_its_cap_is_refused_with_413_and_the_sandbox_goes_on() {
    let d = TestDaemon::with(Opts {
        http: shoald::listen::HttpLimits {
            max_upload: 1 << 20,
            ..Default::default()
        },
        pools: false,
        ..Opts::default()
    });
    let sb = d.create();
    let dir = d.scratch("up");
    let target = dir.join("big");
    // Chunked (no length to refuse it by): 4 MiB, streamed past the cap.
    let mut c = UnixStream::connect(d.state_dir().join("shoald.sock")).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        c,
        "PUT /v1/sandboxes/{}/files?path={} HTTP/1.1\r\nHost: x\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        sb.id,
        target.display()
    )
    .unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    for _ in 0..64 {
        let ok = write!(c, "{:x}\r\n", chunk.len()).is_ok()
            && c.write_all(&chunk).is_ok()
            && c.write_all(b"\r\n").is_ok();
        if !ok {
            break;
        }
    }
    let _ = c.write_all(b"0\r\n\r\n");
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    assert!(out.contains("payload_too_large"), "{out}");
    let written = std::fs::metadata(&target).map_or(0, |m| m.len());
    assert!(written <= 1 << 20, "{written} bytes written past the cap");
    // The typed client gets the 413 too (not its failed write).
    let q = api::UploadQuery {
        path: target.display().to_string(),
        mode: None,
        append: None,
        parents: None,
    };
    let e =
        d.c.put_file(&sb.id, &q, &mut std::io::repeat(b'y').take(4 << 20))
            .unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(413), Some(ErrorCode::PayloadTooLarge)),
        "{e}"
    );
    // The sandbox goes on: a small upload works.
    let small = dir.join("small");
    let q = api::UploadQuery {
        path: small.display().to_string(),
        mode: None,
        append: None,
        parents: None,
    };
    d.c.put_file(&sb.id, &q, &mut &b"ok"[..]).unwrap();
    assert_eq!(std::fs::read(&small).unwrap(), b"ok");
}

#[test]
fn a_token_file_others_may_read_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("token");
    std::fs::write(&tok, "0123456789abcdef-secret\n").unwrap();
    // Refused at once, or (before the check) still serving after 10 s.
    let start = || {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_shoald"))
            .arg("--state-dir")
            .arg(tmp.path().join("state"))
            .args(["--listen", "127.0.0.1:0", "--no-pools", "--token-file"])
            .arg(&tok)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while c.try_wait().unwrap().is_none() {
            if t0.elapsed() > Duration::from_secs(10) {
                let _ = c.kill();
                let _ = c.wait();
                panic!("shoald started with a token file others may read");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        c.wait_with_output().unwrap()
    };
    for mode in [0o644, 0o640] {
        std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = start();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started with a {mode:o} token file");
        assert!(
            err.contains("group and others must have no access") && err.contains("chmod 600"),
            "{err}"
        );
    }
}
