//! The agent protocol end to end, against `shoal-agent --listen unix:...`
//! running as a host process.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use agent_client::{ClientError, ExecEvent, ExecRequest, UploadOptions};
use agent_proto::{
    self as proto, put_data, put_message, AgentMode, ErrorCode, ExitStatus, FileType, Kind,
};
use common::{expect_usable, process_dead, raw_connect, Agent, HashWriter, PseudoRandom};

fn sh(script: &str) -> ExecRequest {
    ExecRequest::shell(script)
}

#[test]
fn echo_and_stderr_kept_apart() {
    let agent = Agent::start();
    let c = agent.client();
    let out = c
        .exec_simple(&ExecRequest::argv(["echo", "hello", "world"]))
        .unwrap();
    assert_eq!(out.stdout, b"hello world\n");
    assert!(out.stderr.is_empty());
    assert!(out.result.success());

    let out = c
        .exec_simple(&sh("echo out1; echo err1 >&2; echo out2; echo err2 >&2"))
        .unwrap();
    assert_eq!(out.stdout, b"out1\nout2\n");
    assert_eq!(out.stderr, b"err1\nerr2\n");
}

#[test]
fn exit_codes_signals_and_spawn_errors() {
    let agent = Agent::start();
    let c = agent.client();
    let r = c.exec_simple(&sh("exit 42")).unwrap().result;
    assert_eq!(r.status, ExitStatus::Exited(42));
    assert_eq!(r.exit_code(), Some(42));
    let r = c.exec_simple(&sh("kill -TERM $$")).unwrap().result;
    assert_eq!(r.status, ExitStatus::Signaled(libc::SIGTERM));
    assert!(!r.timed_out);

    let err = c
        .exec(&ExecRequest::argv(["/no/such/program"]))
        .unwrap_err();
    match &err {
        ClientError::Remote { code, errno, .. } => {
            assert_eq!(*code, ErrorCode::SpawnFailed);
            assert_eq!(*errno, libc::ENOENT);
        }
        e => panic!("unexpected {e:?}"),
    }
    let err = c
        .exec(&ExecRequest::argv(["no-such-program-in-path"]))
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT));
    let err = c
        .exec(&ExecRequest::argv(["true"]).with_cwd("/no/such/dir"))
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT));
    let err = c.exec(&ExecRequest::argv(Vec::<&str>::new())).unwrap_err();
    assert!(matches!(
        err,
        ClientError::Remote {
            code: ErrorCode::InvalidArgument,
            ..
        }
    ));

    // A signal sent through the API.
    let h = c.exec(&ExecRequest::argv(["sleep", "100"])).unwrap();
    h.signal(libc::SIGTERM, false).unwrap();
    let r = h.wait().unwrap().result;
    assert_eq!(r.signal(), Some(libc::SIGTERM));
    // Signalling a finished exec is refused.
    let h = c.exec(&ExecRequest::argv(["true"])).unwrap();
    let id = h.exec_id();
    h.wait().unwrap();
    let err = c.signal(id, libc::SIGTERM, false).unwrap_err();
    assert!(matches!(
        err,
        ClientError::Remote {
            code: ErrorCode::NoSuchExec,
            ..
        }
    ));
}

#[test]
fn env_cwd_and_user() {
    let agent = Agent::start();
    let c = agent.client();
    let out = c
        .exec_simple(
            &sh("echo \"$SHOAL_X\"; pwd")
                .with_env("SHOAL_X", "value with spaces")
                .with_cwd("/tmp"),
        )
        .unwrap();
    assert_eq!(out.stdout, b"value with spaces\n/tmp\n");
    let mut req = sh("echo \"[$HOME]\"");
    req.clear_env = true;
    assert_eq!(c.exec_simple(&req).unwrap().stdout, b"[]\n");
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        let out = c
            .exec_simple(&ExecRequest::argv(["id", "-u"]).with_user(65534, 65534))
            .unwrap();
        assert_eq!(out.stdout, b"65534\n");
    }
}

#[test]
fn stdin_is_piped_and_closable() {
    let agent = Agent::start();
    let c = agent.client();
    let mut h = c.exec(&ExecRequest::argv(["cat"]).with_stdin()).unwrap();
    // 3 MB: more than the pipe and the agent's stdin buffer hold.
    let mut data = Vec::new();
    PseudoRandom::new(7, 3_000_000)
        .read_to_end(&mut data)
        .unwrap();
    let mut w = h.stdin();
    let feed = data.clone();
    let writer = std::thread::spawn(move || {
        for chunk in feed.chunks(100_000) {
            w.write_all(chunk).unwrap();
        }
        w.close().unwrap();
    });
    let mut got = Vec::new();
    let result = h.wait_with(&mut got, &mut std::io::sink()).unwrap();
    writer.join().unwrap();
    assert!(result.success());
    assert_eq!(got.len(), data.len());
    assert!(got == data);

    // Without a stdin pipe, stdin is /dev/null.
    let out = c.exec_simple(&ExecRequest::argv(["wc", "-c"])).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
}

#[test]
fn hundred_megabytes_of_output_intact() {
    let agent = Agent::start();
    let c = agent.client();
    let script = "seq 1 13000000";
    let mut remote = HashWriter::default();
    let mut h = c.exec(&sh(script)).unwrap();
    let r = h.wait_with(&mut remote, &mut std::io::sink()).unwrap();
    assert!(r.success());
    assert_eq!(r.dropped_bytes, 0);
    let local = std::process::Command::new("/bin/sh")
        .args(["-c", script])
        .output()
        .unwrap();
    let mut lh = HashWriter::default();
    lh.write_all(&local.stdout).unwrap();
    assert!(remote.bytes >= 100_000_000, "only {} bytes", remote.bytes);
    assert_eq!(remote.bytes, lh.bytes);
    assert_eq!(remote.hex(), lh.hex());
}

#[test]
fn thousand_sequential_execs() {
    let agent = Agent::start();
    let c = agent.client();
    let t0 = Instant::now();
    for i in 0..1000 {
        let out = c.exec_simple(&ExecRequest::argv(["true"])).unwrap();
        assert!(out.result.success(), "exec {i}");
    }
    eprintln!("1000 sequential execs of true: {:?}", t0.elapsed());
}

#[test]
fn hundred_concurrent_execs_one_connection() {
    let agent = Agent::start();
    let c = agent.client();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..100)
            .map(|i| {
                let c = c.clone();
                s.spawn(move || {
                    let out = c
                        .exec_simple(&sh(&format!("echo start {i}; sleep 0.2; echo end {i} >&2")))
                        .unwrap();
                    assert_eq!(out.stdout, format!("start {i}\n").as_bytes());
                    assert_eq!(out.stderr, format!("end {i}\n").as_bytes());
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
    // And 100 started at once from one thread, then collected.
    let handles: Vec<_> = (0..100)
        .map(|i| {
            c.exec(&ExecRequest::argv(["echo", &i.to_string()]))
                .unwrap()
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.wait().unwrap().stdout, format!("{i}\n").as_bytes());
    }
}

#[test]
fn hundred_concurrent_execs_many_connections() {
    let agent = Agent::start();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..10)
            .map(|conn| {
                let c = agent.client();
                s.spawn(move || {
                    let hs: Vec<_> = (0..10)
                        .map(|i| c.exec(&sh(&format!("sleep 0.1; echo {conn}-{i}"))).unwrap())
                        .collect();
                    for (i, h) in hs.into_iter().enumerate() {
                        let out = h.wait().unwrap();
                        assert_eq!(out.stdout, format!("{conn}-{i}\n").as_bytes());
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
    let health = agent.client().health().unwrap();
    assert_eq!(health.running_execs, 0);
}

#[test]
fn timeout_kills_the_whole_tree() {
    let agent = Agent::start();
    let c = agent.client();
    let req = sh("sleep 1000 & echo $!; (sleep 1000; echo never) & echo $!; \
                  sh -c 'sleep 1000 & echo $!; wait' & echo $!; wait")
    .with_timeout(Duration::from_millis(700));
    let t0 = Instant::now();
    let out = c.exec_simple(&req).unwrap();
    assert!(out.result.timed_out);
    assert_eq!(out.result.status, ExitStatus::Signaled(libc::SIGKILL));
    assert!(t0.elapsed() < Duration::from_secs(10));
    let pids: Vec<i32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 4, "{:?}", String::from_utf8_lossy(&out.stdout));
    let t0 = Instant::now();
    for pid in pids {
        while !process_dead(pid) {
            assert!(t0.elapsed() < Duration::from_secs(5), "pid {pid} survived");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn reattach_after_disconnect() {
    let agent = Agent::start();
    let exec_id;
    let mut first = Vec::new();
    {
        let c = agent.client();
        let mut h = c
            .exec(&sh(
                "for i in 1 2 3 4 5 6 7 8; do echo line$i; sleep 0.15; done; exit 3",
            ))
            .unwrap();
        exec_id = h.exec_id();
        if let Some(ExecEvent::Stdout(d)) = h.next_event().unwrap() {
            first.extend_from_slice(&d);
        }
        // Dropping the handle and the client closes the connection.
    }
    std::thread::sleep(Duration::from_millis(400));
    let c = agent.client();
    let out = c.attach(exec_id).unwrap().wait().unwrap();
    assert_eq!(out.result.status, ExitStatus::Exited(3));
    let all = b"line1\nline2\nline3\nline4\nline5\nline6\nline7\nline8\n";
    assert!(
        all.ends_with(&out.stdout),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.stdout.ends_with(b"line8\n"));
    assert!(out.stdout.len() + first.len() <= all.len());
    // The exec is gone once its result was delivered.
    assert!(c.attach(exec_id).is_err());

    // Finished while detached: output and result are kept for attach.
    let id2 = {
        let c2 = agent.client();
        let h = c2.exec(&sh("sleep 0.3; echo kept; exit 5")).unwrap();
        h.exec_id()
    };
    std::thread::sleep(Duration::from_millis(1000));
    let out = c.attach(id2).unwrap().wait().unwrap();
    assert_eq!(out.stdout, b"kept\n");
    assert_eq!(out.result.exit_code(), Some(5));

    // Detached output beyond the limit is dropped (oldest first), counted.
    let id3 = {
        let c3 = agent.client();
        let h = c3
            .exec(&sh("sleep 0.3; head -c 3000000 /dev/zero"))
            .unwrap();
        h.exec_id()
    };
    std::thread::sleep(Duration::from_millis(1500));
    let out = c.attach(id3).unwrap().wait().unwrap();
    assert!(out.result.success());
    assert!(out.result.dropped_bytes > 0);
    assert!(out.stdout.len() <= proto::DETACHED_OUTPUT_LIMIT);
    assert_eq!(
        out.stdout.len() as u64 + out.result.dropped_bytes,
        3_000_000
    );

    // Attaching from a second connection takes the exec over.
    let c4 = agent.client();
    let mut h = c.exec(&sh("sleep 0.5; echo moved")).unwrap();
    let h2 = c4.attach(h.exec_id()).unwrap();
    assert!(matches!(
        h.next_event(),
        Err(ClientError::Remote {
            code: ErrorCode::Detached,
            ..
        })
    ));
    assert_eq!(h2.wait().unwrap().stdout, b"moved\n");
}

#[test]
fn hundred_megabyte_upload_download_roundtrip() {
    let agent = Agent::start();
    let c = agent.client();
    const LEN: u64 = 100 * 1024 * 1024 + 12345;
    let path = agent.dir.path().join("big.bin");
    let mut src_hash = HashWriter::default();
    std::io::copy(&mut PseudoRandom::new(42, LEN), &mut src_hash).unwrap();
    let src_hash = src_hash.hex();

    let t0 = Instant::now();
    let n = c
        .upload(
            &mut PseudoRandom::new(42, LEN),
            &path,
            UploadOptions::default(),
        )
        .unwrap();
    let up = t0.elapsed();
    assert_eq!(n, LEN);
    assert_eq!(c.stat(&path).unwrap().size, LEN);
    let mut on_disk = HashWriter::default();
    std::io::copy(&mut std::fs::File::open(&path).unwrap(), &mut on_disk).unwrap();
    assert_eq!(on_disk.hex(), src_hash);

    let t0 = Instant::now();
    let mut back = HashWriter::default();
    assert_eq!(c.download(&path, &mut back).unwrap(), LEN);
    let down = t0.elapsed();
    assert_eq!(back.bytes, LEN);
    assert_eq!(back.hex(), src_hash);
    eprintln!("100 MiB upload {up:?}, download {down:?}");

    // Ranges.
    let mut part = Vec::new();
    c.download_range(&path, 10, Some(100), &mut part).unwrap();
    let mut expect = vec![0u8; 110];
    PseudoRandom::new(42, LEN).read_exact(&mut expect).unwrap();
    assert_eq!(part, &expect[10..]);
}

#[test]
fn file_operations() {
    let agent = Agent::start();
    let c = agent.client();
    let root = agent.dir.path().join("files");
    let deep = root.join("a/b/c");
    c.mkdir(&deep, 0o750, true).unwrap();
    c.mkdir(&deep, 0o750, true).unwrap(); // -p: exists is fine
    let err = c.mkdir(&deep, 0o750, false).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EEXIST));
    let st = c.stat(&deep).unwrap();
    assert_eq!(st.file_type, FileType::Dir);

    let f = deep.join("hello.txt");
    assert_eq!(c.write_file(&f, b"hello file", 0o600).unwrap(), 10);
    let st = c.stat(&f).unwrap();
    assert_eq!(
        (st.file_type, st.size, st.mode),
        (FileType::File, 10, 0o600)
    );
    assert_eq!(c.read_file(&f).unwrap(), b"hello file");
    // Truncate on rewrite; append.
    c.write_file(&f, b"x", 0o644).unwrap();
    let opts = UploadOptions {
        append: true,
        ..UploadOptions::default()
    };
    c.upload(&mut &b"yz"[..], &f, opts).unwrap();
    assert_eq!(c.read_file(&f).unwrap(), b"xyz");
    // Parents created on demand.
    let nested = root.join("new/dir/file");
    let opts = UploadOptions {
        create_parents: true,
        ..UploadOptions::default()
    };
    c.upload(&mut &b"n"[..], &nested, opts).unwrap();
    assert_eq!(std::fs::read(&nested).unwrap(), b"n");
    // Empty file.
    c.write_file(root.join("empty"), b"", 0o644).unwrap();
    assert_eq!(c.read_file(root.join("empty")).unwrap(), b"");

    c.chmod(&f, 0o755).unwrap();
    assert_eq!(c.stat(&f).unwrap().mode, 0o755);

    std::os::unix::fs::symlink("a", root.join("link")).unwrap();
    assert_eq!(
        c.lstat(root.join("link")).unwrap().file_type,
        FileType::Symlink
    );
    assert_eq!(c.stat(root.join("link")).unwrap().file_type, FileType::Dir);

    let mut names: Vec<(Vec<u8>, FileType)> = c
        .list_dir(&root)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.file_type))
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            (b"a".to_vec(), FileType::Dir),
            (b"empty".to_vec(), FileType::File),
            (b"link".to_vec(), FileType::Symlink),
            (b"new".to_vec(), FileType::Dir),
        ]
    );
    // A big directory comes in several parts.
    let big = root.join("big");
    std::fs::create_dir(&big).unwrap();
    for i in 0..3000 {
        std::fs::write(big.join(format!("{i:0>200}")), b"").unwrap();
    }
    assert_eq!(c.list_dir(&big).unwrap().len(), 3000);

    let g = root.join("renamed.txt");
    c.rename(&f, &g).unwrap();
    assert_eq!(c.stat(&f).unwrap_err().errno(), Some(libc::ENOENT));
    assert_eq!(c.read_file(&g).unwrap(), b"xyz");

    let err = c.remove(root.join("a"), false).unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOTEMPTY));
    c.remove(&g, false).unwrap();
    c.remove(root.join("link"), false).unwrap(); // the link, not the target
    assert!(root.join("a").is_dir());
    c.remove(&root, true).unwrap();
    assert!(!root.exists());
    assert_eq!(c.stat(&root).unwrap_err().errno(), Some(libc::ENOENT));
    assert_eq!(c.list_dir(&root).unwrap_err().errno(), Some(libc::ENOENT));
    assert_eq!(c.read_file(&root).unwrap_err().errno(), Some(libc::ENOENT));
    let err = c
        .write_file(agent.dir.path().join("no/such/dir/f"), b"x", 0o644)
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT));
}

#[test]
fn health_version_post_restore() {
    let agent = Agent::start();
    let c = agent.client();
    assert_eq!(c.agent_info().mode, AgentMode::Host);
    let h = c.health().unwrap();
    assert_eq!((h.running_execs, h.connections), (0, 1));
    // Host mode: entropy mixed in without credit, clock never touched.
    let r = c.post_restore([0x5a; 64], 1).unwrap();
    assert!(!r.entropy_credited);
    assert!(!r.clock_set);
}

#[test]
fn poweroff_ends_a_host_agent() {
    let mut agent = Agent::start();
    let c = agent.client();
    c.poweroff().unwrap();
    let t0 = Instant::now();
    loop {
        if let Some(st) = agent.child.try_wait().unwrap() {
            assert!(st.success());
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn no_fd_leaks() {
    let agent = Agent::start();
    // Warm up: allocations and the first connection.
    {
        let c = agent.client();
        c.exec_simple(&ExecRequest::argv(["true"])).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let before = agent.fd_count();
    let path = agent.dir.path().join("fd-test");
    for round in 0..20 {
        let c = agent.client();
        let c2 = agent.client();
        c.exec_simple(&sh("echo x; echo y >&2")).unwrap();
        let mut h = c.exec(&ExecRequest::argv(["cat"]).with_stdin()).unwrap();
        h.write_stdin(b"abc").unwrap();
        h.close_stdin().unwrap();
        assert_eq!(
            h.wait_with(&mut std::io::sink(), &mut std::io::sink())
                .unwrap()
                .exit_code(),
            Some(0)
        );
        let _ = c.exec(&ExecRequest::argv(["/nonexistent"]));
        c.exec_simple(&sh("sleep 5").with_timeout(Duration::from_millis(10)))
            .unwrap();
        c.write_file(&path, &[round; 5000], 0o644).unwrap();
        assert_eq!(c2.read_file(&path).unwrap().len(), 5000);
        let _ = c.read_file("/nonexistent");
        c.list_dir(agent.dir.path()).unwrap();
        c.mkdir(agent.dir.path().join("d/e"), 0o755, true).unwrap();
        c.remove(agent.dir.path().join("d"), true).unwrap();
        // An upload and an exec abandoned mid-way by a dropped connection.
        let h = c2
            .exec(&ExecRequest::argv(["sleep", "0.05"]).with_stdin())
            .unwrap();
        drop(h);
        let mut raw = raw_connect(&agent);
        let mut b = Vec::new();
        put_message(
            &mut b,
            1,
            &proto::FileWrite {
                path: path.as_os_str().as_encoded_bytes().to_vec(),
                mode: 0o644,
                append: false,
                create_parents: false,
            },
        );
        put_data(&mut b, Kind::FileData, 1, b"partial");
        raw.write_all(&b).unwrap();
        expect_usable(&mut raw);
    }
    // Let detached execs finish and be collected.
    std::thread::sleep(Duration::from_millis(500));
    let c = agent.client();
    c.exec_simple(&ExecRequest::argv(["true"])).unwrap();
    drop(c);
    std::thread::sleep(Duration::from_millis(200));
    let after = agent.fd_count();
    assert_eq!(before, after, "agent fds: {before} before, {after} after");
}

#[test]
fn slow_reader_loses_nothing() {
    // The command finishes while its output waits for a slow client (pipes
    // paused by backpressure): everything still arrives.
    let agent = Agent::start();
    let c = agent.client();
    let mut h = c
        .exec(&sh("head -c 20000000 /dev/zero; echo end >&2"))
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut out = HashWriter::default();
    let mut err = Vec::new();
    let r = h.wait_with(&mut out, &mut err).unwrap();
    assert!(r.success());
    assert_eq!(out.bytes, 20_000_000);
    assert_eq!(err, b"end\n");
}

/// A stand-in for a VMM's hybrid vsock socket: answers `CONNECT 5000\n`
/// with `OK 1073741824\n` and then relays bytes to the agent.
fn fake_hybrid_vsock(agent: &Agent, refuse: bool) -> std::path::PathBuf {
    use std::io::BufRead;
    let path = agent
        .dir
        .path()
        .join(if refuse { "refuse.sock" } else { "v.sock" });
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let target = agent.sock.clone();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(&mut s)
            .read_line(&mut line)
            .unwrap();
        if refuse || line != "CONNECT 5000\n" {
            return; // closes the connection
        }
        s.write_all(b"OK 1073741824\n").unwrap();
        let a = UnixStream::connect(&target).unwrap();
        let (mut s2, mut a2) = (s.try_clone().unwrap(), a.try_clone().unwrap());
        let up = std::thread::spawn(move || {
            let _ = std::io::copy(&mut s2, &mut a2);
            let _ = a2.shutdown(std::net::Shutdown::Write);
        });
        let (mut a, mut s) = (a, s);
        let _ = std::io::copy(&mut a, &mut s);
        let _ = s.shutdown(std::net::Shutdown::Both);
        let _ = up.join();
    });
    path
}

#[test]
fn connect_through_hybrid_vsock_socket() {
    let agent = Agent::start();
    let path = fake_hybrid_vsock(&agent, false);
    let c = agent_client::Client::connect_vsock(&path, proto::VSOCK_PORT).unwrap();
    assert_eq!(
        c.exec_simple(&sh("echo via vsock")).unwrap().stdout,
        b"via vsock\n"
    );
    let path = fake_hybrid_vsock(&agent, true);
    let err = agent_client::Client::connect_vsock(&path, proto::VSOCK_PORT).unwrap_err();
    assert!(matches!(err, ClientError::VsockHandshake(_)), "{err:?}");
    // Retried until the socket appears.
    let later = agent.dir.path().join("v.sock");
    let _ = std::fs::remove_file(&later);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            fake_hybrid_vsock(&agent, false);
        });
        let c = agent_client::Client::connect_vsock_retry(
            &later,
            proto::VSOCK_PORT,
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(c.health().is_ok());
    });
}

#[test]
fn orphans_are_reaped() {
    // The host-mode agent is a child subreaper, like PID 1 in the guest:
    // a command's orphaned background process is reaped, not left a zombie.
    let agent = Agent::start();
    let c = agent.client();
    let out = c
        .exec_simple(&sh("sleep 0.2 >/dev/null 2>&1 & echo $!"))
        .unwrap();
    let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let t0 = Instant::now();
    // SAFETY: kill with signal 0 only checks for existence.
    while unsafe { libc::kill(pid, 0) } == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "orphan {pid} not reaped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // And the agent still tracks its own commands' statuses correctly.
    assert_eq!(
        c.exec_simple(&sh("exit 7")).unwrap().result.exit_code(),
        Some(7)
    );
}
