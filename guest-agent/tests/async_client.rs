//! The tokio client (`agent_client::AsyncClient`) against the real agent
//! (`shoal-agent --listen unix:...` as a host process), and against small
//! in-test peers for what the real agent never does (malformed or
//! oversized frames, silence).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use agent_client::{
    AsyncClient, ClientError, Config, ExecEvent, ExecRequest, ExitStatus, FileType, Transport,
    UploadOptions,
};
use agent_proto::{
    put_data, put_message, AgentMode, ExecStarted, FrameDecoder, Header, HelloOk, Kind, HEADER_LEN,
    MAX_PAYLOAD, PROTOCOL_VERSION,
};
use common::Agent;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::time::Instant;

async fn connect(agent: &Agent, config: Config) -> AsyncClient {
    AsyncClient::connect(&Transport::Unix(agent.sock.clone()), config)
        .await
        .expect("connect to the agent")
}

/// Threads of this process named `name` (tests run in parallel in this
/// process, so only this runtime's own threads are counted).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

#[test]
fn fifty_concurrent_execs_on_one_connection_without_threads() {
    // The runtime's threads (workers and any blocking-pool thread) all
    // carry this name.
    const NAME: &str = "fifty-execs";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(NAME)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let agent = Agent::start();
        let c = connect(&agent, Config::default()).await;
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move {
                    let req =
                        ExecRequest::shell(format!("echo start {i}; sleep 0.5; echo end {i} >&2"));
                    c.exec_simple(&req).await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(250)).await;
        let health = c.health().await.unwrap();
        // While all 50 run: the runtime has its two workers, nothing more.
        let during = threads_named(NAME);
        assert_eq!(health.connections, 1, "all on one connection");
        assert!(
            health.running_execs >= 40,
            "{} running: not concurrent",
            health.running_execs
        );
        assert_eq!(
            during, 2,
            "{during} runtime threads with 50 execs in flight"
        );
        for (i, t) in tasks.into_iter().enumerate() {
            let out = t.await.unwrap().unwrap();
            assert!(out.result.success());
            assert_eq!(out.stdout, format!("start {i}\n").as_bytes());
            assert_eq!(out.stderr, format!("end {i}\n").as_bytes());
        }
        assert_eq!(c.in_flight(), 0, "every finished call freed its route");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_exec_with_stdin_and_signals() {
    let agent = Agent::start();
    let c = connect(&agent, Config::default()).await;
    // 5 MiB through `cat` while its output is read: both directions at once.
    let data: Vec<u8> = (0..5u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut h = c
        .exec(&ExecRequest::argv(["cat"]).with_stdin())
        .await
        .unwrap();
    assert!(h.pid() > 0);
    let stdin = h.stdin();
    let input = data.clone();
    let writer = tokio::spawn(async move {
        for chunk in input.chunks(300_000) {
            stdin.write(chunk).await.unwrap();
        }
        stdin.close().await.unwrap();
    });
    let mut got = Vec::new();
    let result = loop {
        match h.next_event().await.unwrap() {
            Some(ExecEvent::Stdout(d)) => got.extend_from_slice(&d),
            Some(ExecEvent::Stderr(d)) => panic!("stderr {d:?}"),
            Some(ExecEvent::Exit(r)) => break r,
            None => panic!("no result"),
        }
    };
    writer.await.unwrap();
    assert!(result.success());
    assert!(got == data, "stdin came back changed ({} bytes)", got.len());
    assert_eq!(h.next_event().await.unwrap(), None);

    // A signal to the process group ends it.
    let h = c
        .exec(&ExecRequest::shell("sleep 1000 & sleep 1000"))
        .await
        .unwrap();
    h.signal(libc::SIGKILL, true).await.unwrap();
    let out = h.wait().await.unwrap();
    assert_eq!(out.result.status, ExitStatus::Signaled(libc::SIGKILL));

    // The agent's own timeout, reported as such.
    let req = ExecRequest::shell("sleep 1000").with_timeout(Duration::from_millis(200));
    let out = c.exec_simple(&req).await.unwrap();
    assert!(out.result.timed_out);

    // Re-attach from another connection after this one is gone.
    let h = c
        .exec(&ExecRequest::shell("sleep 0.3; echo late"))
        .await
        .unwrap();
    let exec_id = h.exec_id();
    drop(h);
    drop(c);
    let c2 = connect(&agent, Config::default()).await;
    let out = c2.attach(exec_id).await.unwrap().wait().await.unwrap();
    assert_eq!(out.stdout, b"late\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_streamed_and_operations() {
    let agent = Agent::start();
    let c = connect(&agent, Config::default()).await;
    let dir = agent.dir.path().join("tree");
    c.mkdir(dir.join("a/b"), 0o755, true).await.unwrap();
    // 20 MiB and a bit: many frames each way.
    let data: Vec<u8> = (0..(20u32 << 20) + 12345)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let f = dir.join("a/b/big.bin");
    let n = c
        .upload(&mut &data[..], &f, UploadOptions::default())
        .await
        .unwrap();
    assert_eq!(n, u64::try_from(data.len()).unwrap());
    let mut back = Vec::new();
    assert_eq!(c.download(&f, &mut back).await.unwrap(), n);
    assert!(back == data);
    assert_eq!(c.read_file(&f).await.unwrap().len(), data.len());
    // A range.
    let mut d = c.open_download(&f, 10, Some(5)).await.unwrap();
    let mut part = Vec::new();
    while let Some(chunk) = d.next_chunk().await.unwrap() {
        part.extend_from_slice(&chunk);
    }
    assert_eq!(part, &data[10..15]);
    assert_eq!(d.total(), Some(5));
    drop(d);

    // Many small writes (as an HTTP body arrives) go out as whole frames.
    let mut up = c
        .open_upload(dir.join("pieces"), UploadOptions::default())
        .await
        .unwrap();
    for piece in data.chunks(1000).take(3000) {
        up.write(piece).await.unwrap();
    }
    assert_eq!(up.sent(), 2 << 20, "only whole frames sent before finish");
    assert_eq!(up.finish().await.unwrap(), 3_000_000);
    assert!(c.read_file(dir.join("pieces")).await.unwrap() == data[..3_000_000]);
    // Abandoned half-way: the whole frames sent are written (and the
    // upload is ended with FileEnd from Drop).
    let mut up = c
        .open_upload(dir.join("abandoned"), UploadOptions::default())
        .await
        .unwrap();
    up.write(&data[..MAX_PAYLOAD + 10]).await.unwrap();
    drop(up);
    let t0 = Instant::now();
    while c.stat(dir.join("abandoned")).await.unwrap().size != u64::try_from(MAX_PAYLOAD).unwrap() {
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let st = c.stat(&f).await.unwrap();
    assert_eq!((st.file_type, st.size, st.mode), (FileType::File, n, 0o644));
    c.chmod(&f, 0o600).await.unwrap();
    assert_eq!(c.stat(&f).await.unwrap().mode, 0o600);
    let g = dir.join("a/moved.bin");
    c.rename(&f, &g).await.unwrap();
    c.write_file(dir.join("small"), b"hi", 0o640).await.unwrap();
    let mut names: Vec<_> = c
        .list_dir(dir.join("a"))
        .await
        .unwrap()
        .into_iter()
        .map(|e| (String::from_utf8(e.name).unwrap(), e.file_type))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("b".into(), FileType::Dir),
            ("moved.bin".into(), FileType::File)
        ]
    );
    let err = c.stat(dir.join("nope")).await.unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT), "{err:?}");
    let err = c
        .upload(
            &mut &b"x"[..],
            dir.join("no/such/dir/f"),
            UploadOptions::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT), "{err:?}");
    c.remove(&dir, true).await.unwrap();
    assert!(!dir.exists());

    let v = c.version().await.unwrap();
    assert_eq!((v.protocol, v.mode), (PROTOCOL_VERSION, AgentMode::Host));
    let r = c.post_restore([7; 64], 0).await.unwrap();
    assert!(!r.clock_set);
    assert_eq!(c.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_free_what_the_call_held() {
    let agent = Agent::start();
    let c = connect(&agent, Config::default()).await;
    // An exec without a timeout waits only as long as its handle's deadline.
    let mut h = c.exec(&ExecRequest::shell("sleep 1000")).await.unwrap();
    assert_eq!(h.deadline(), None);
    h.set_deadline(Some(Instant::now() + Duration::from_millis(300)));
    let t0 = Instant::now();
    let err = h.next_event().await.unwrap_err();
    assert!(matches!(err, ClientError::Timeout), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(c.in_flight(), 1, "the handle still holds its route");
    h.signal(libc::SIGKILL, true).await.unwrap();
    drop(h);
    assert_eq!(c.in_flight(), 0, "dropping the handle freed it");

    // An exec with a timeout gets that timeout plus the slack.
    let slack = c.config().exec_slack;
    let req = ExecRequest::shell("true").with_timeout(Duration::from_secs(10));
    let h = c.exec(&req).await.unwrap();
    let left = h.deadline().unwrap() - Instant::now();
    assert!(
        left > slack && left <= Duration::from_secs(10) + slack,
        "{left:?}"
    );

    // A call cancelled by the caller's own deadline frees its route too.
    let r = tokio::time::timeout(
        Duration::from_millis(100),
        c.exec_simple(&ExecRequest::shell("sleep 1000")),
    )
    .await;
    assert!(r.is_err());
    assert_eq!(c.in_flight(), 1, "only the exec handle above");
    drop(h);
    assert_eq!(c.in_flight(), 0);
    assert!(c.health().await.is_ok(), "the connection is still usable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_is_dropped_not_the_connection() {
    let agent = Agent::start();
    let config = Config {
        stall_timeout: Duration::from_millis(300),
        channel_frames: 2,
        ..Config::default()
    };
    let c = connect(&agent, config).await;
    let mut h = c
        .exec(&ExecRequest::shell("head -c 50000000 /dev/zero"))
        .await
        .unwrap();
    // Not reading it: its channel fills, the reader waits 300 ms, then
    // drops that stream and goes on with the others.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let t0 = Instant::now();
    c.health().await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "the connection stalled"
    );
    let err = loop {
        match h.next_event().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stalled stream went on"),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, ClientError::Stalled(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_stream_does_not_hold_up_the_others() {
    let agent = Agent::start();
    let config = Config {
        stall_timeout: Duration::from_secs(30),
        channel_frames: 2,
        ..Config::default()
    };
    let c = connect(&agent, config).await;
    // A stream nobody reads, with far more output than its channel holds.
    let mut h = c
        .exec(&ExecRequest::shell("head -c 200000000 /dev/zero"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Other requests on the same connection answer at once, many times
    // over, not after the unread stream's 30 s stall timeout.
    for i in 0..17 {
        let t0 = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            c.exec_simple(&ExecRequest::shell("echo hi")),
        )
        .await
        .unwrap_or_else(|_| panic!("exec {i} was held up by the unread stream"))
        .unwrap();
        assert_eq!(r.stdout, b"hi\n");
        assert!(t0.elapsed() < Duration::from_secs(5), "exec {i}");
    }
    // The unread stream, once its backlog passed the cap, was dropped
    // (its consumer learns it on its next read); the connection is fine.
    let err = loop {
        match h.next_event().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the unread stream kept all its output"),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, ClientError::Stalled(_)), "{err:?}");
    assert!(c.health().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_client_closes_its_connection() {
    let agent = Agent::start();
    let watcher = connect(&agent, Config::default()).await;
    let c = connect(&agent, Config::default()).await;
    let h = c.exec(&ExecRequest::shell("sleep 1000")).await.unwrap();
    assert_eq!(watcher.health().await.unwrap().connections, 2);
    // A handle keeps the connection open; with the last clone gone, it
    // closes (and both of its tasks end).
    drop(c);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(watcher.health().await.unwrap().connections, 2);
    drop(h);
    let t0 = Instant::now();
    while watcher.health().await.unwrap().connections != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "connection not closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_mismatch_is_refused() {
    let agent = Agent::start();
    let s = UnixStream::connect(&agent.sock).await.unwrap();
    let mut hello = agent_proto::Hello::new("old");
    hello.version = PROTOCOL_VERSION + 1;
    let err = AsyncClient::from_stream_with_hello(s, hello, Config::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::VersionMismatch(_)), "{err:?}");
}

// ------------------------------------------------------------ transports

/// A stand-in for a VMM's hybrid vsock socket at `path`: answers
/// `CONNECT 5000\n` with `OK 1073741824\n` (or refuses) and relays to the
/// agent.
fn fake_hybrid_vsock(agent: &Agent, path: PathBuf, refuse: bool) {
    let listener = UnixListener::bind(&path).unwrap();
    let target = agent.sock.clone();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while s.read(&mut b).await.unwrap() == 1 && b[0] != b'\n' {
            line.push(b[0]);
        }
        if refuse || line != b"CONNECT 5000" {
            return;
        }
        s.write_all(b"OK 1073741824\n").await.unwrap();
        let mut a = UnixStream::connect(&target).await.unwrap();
        let _ = tokio::io::copy_bidirectional(&mut s, &mut a).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_vsock_handshake_and_retry() {
    let agent = Agent::start();
    let ok = agent.dir.path().join("v.sock");
    fake_hybrid_vsock(&agent, ok.clone(), false);
    let c = AsyncClient::connect(&Transport::hybrid_vsock(&ok), Config::default())
        .await
        .unwrap();
    let out = c
        .exec_simple(&ExecRequest::shell("echo via vsock"))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"via vsock\n");

    let refused = agent.dir.path().join("refuse.sock");
    fake_hybrid_vsock(&agent, refused.clone(), true);
    let err = AsyncClient::connect(&Transport::hybrid_vsock(&refused), Config::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::VsockHandshake(_)), "{err:?}");

    // Retried until the socket appears.
    let later = agent.dir.path().join("later.sock");
    let t = Transport::hybrid_vsock(&later);
    let retry = tokio::spawn(async move {
        AsyncClient::connect_retry(&t, Config::default(), Duration::from_secs(10)).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    fake_hybrid_vsock(&agent, later, false);
    let c = retry.await.unwrap().unwrap();
    assert!(c.health().await.is_ok());

    // Given up at the deadline while nothing appears.
    let t0 = Instant::now();
    let never = Transport::hybrid_vsock(agent.dir.path().join("never.sock"));
    let err = AsyncClient::connect_retry(&never, Config::default(), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Io(_)), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_hangs_is_retried() {
    // The first connection is accepted and never answered (a guest not
    // ready behind a VMM that accepted); the second reaches the agent.
    let agent = Agent::start();
    let path = agent.dir.path().join("hang.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let target = agent.sock.clone();
    tokio::spawn(async move {
        let (silent, _) = listener.accept().await.unwrap();
        let (mut s, _) = listener.accept().await.unwrap();
        let mut a = UnixStream::connect(&target).await.unwrap();
        let _ = tokio::io::copy_bidirectional(&mut s, &mut a).await;
        drop(silent);
    });
    let config = Config {
        connect_timeout: Duration::from_millis(300),
        ..Config::default()
    };
    let t = Transport::Unix(path);
    let c = AsyncClient::connect_retry(&t, config, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(c.health().await.is_ok());
    // A single attempt that nobody answers (the listener still queues
    // connections, nobody accepts them) ends at the connect timeout.
    let t0 = Instant::now();
    let err = AsyncClient::connect(&t, config).await.unwrap_err();
    assert!(matches!(err, ClientError::Timeout), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_vsock_without_a_listener_fails_within_the_deadline() {
    // This machine has no vsock loopback transport, so only the failure
    // path runs here: the socket is created, the address encoded, and a
    // peer that does not answer is given up on at the deadline.
    let config = Config {
        connect_timeout: Duration::from_millis(500),
        ..Config::default()
    };
    let t0 = Instant::now();
    let err = AsyncClient::connect(&Transport::Vsock { cid: 1, port: 5999 }, config)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Io(_) | ClientError::Timeout),
        "{err:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3));
    let err = agent_client::Client::connect(&Transport::Vsock {
        cid: u32::MAX - 5,
        port: 5999,
    })
    .unwrap_err();
    assert!(matches!(err, ClientError::Io(_)), "{err:?}");
}

// --------------------------------------------------------- hostile peers

/// A peer that does the handshake, then lets `script` play the agent.
async fn fake_agent<F, Fut>(tag: &str, script: F) -> (AsyncClient, common::TempDir)
where
    F: FnOnce(UnixStream, FrameDecoder) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    fake_agent_with(tag, Config::default(), script).await
}

async fn fake_agent_with<F, Fut>(
    tag: &str,
    config: Config,
    script: F,
) -> (AsyncClient, common::TempDir)
where
    F: FnOnce(UnixStream, FrameDecoder) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let dir = common::TempDir::new(tag);
    let path = dir.path().join("fake.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut dec = FrameDecoder::new();
        let hello = next_frame(&mut s, &mut dec).await.unwrap();
        assert_eq!(hello.header.kind, Kind::Hello as u8);
        let mut out = Vec::new();
        let ok = HelloOk {
            version: PROTOCOL_VERSION,
            agent: "fake".into(),
            mode: AgentMode::Host,
        };
        put_message(&mut out, 0, &ok);
        s.write_all(&out).await.unwrap();
        script(s, dec).await;
    });
    let c = AsyncClient::connect(&Transport::Unix(path), config)
        .await
        .unwrap();
    (c, dir)
}

async fn next_frame(s: &mut UnixStream, dec: &mut FrameDecoder) -> Option<agent_proto::RawFrame> {
    loop {
        if let Some(f) = dec.next_frame().unwrap() {
            return Some(f);
        }
        let n = s.read(dec.spare(64 << 10)).await.ok()?;
        if n == 0 {
            return None;
        }
        dec.commit(n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_reply_fails_its_call_only() {
    let (c, _dir) = fake_agent("malformed", |mut s, mut dec| async move {
        while let Some(f) = next_frame(&mut s, &mut dec).await {
            let mut out = Vec::new();
            match Kind::from_u8(f.header.kind) {
                // ExecStarted cut short; then a bogus pid.
                Some(Kind::Exec) if f.header.id % 2 == 1 => {
                    put_data(&mut out, Kind::ExecStarted, f.header.id, &[1, 2, 3]);
                }
                Some(Kind::Exec) => {
                    let bad = ExecStarted {
                        exec_id: 1,
                        pid: -4,
                    };
                    put_message(&mut out, f.header.id, &bad);
                }
                // An Ok for a stat, and a payload on an Ok.
                Some(Kind::Stat) => put_data(&mut out, Kind::Ok, f.header.id, b"x"),
                Some(Kind::Health) => {
                    put_message(
                        &mut out,
                        f.header.id,
                        &agent_proto::HealthReply {
                            running_execs: 0,
                            execs: 0,
                            connections: 1,
                            mode: AgentMode::Host,
                        },
                    );
                }
                _ => {}
            }
            s.write_all(&out).await.unwrap();
        }
    })
    .await;
    for _ in 0..2 {
        let err = c.exec(&ExecRequest::argv(["x"])).await.unwrap_err();
        assert!(matches!(err, ClientError::Protocol(_)), "{err:?}");
    }
    let err = c.stat("/x").await.unwrap_err();
    assert!(matches!(err, ClientError::Protocol(_)), "{err:?}");
    assert!(!c.is_closed());
    assert_eq!(c.health().await.unwrap().connections, 1, "still usable");
    assert_eq!(c.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_closes_the_connection() {
    let (c, _dir) = fake_agent("oversized", |mut s, mut dec| async move {
        let f = next_frame(&mut s, &mut dec).await.unwrap();
        let h = Header {
            len: u32::try_from(MAX_PAYLOAD + 1).unwrap(),
            kind: Kind::Stdout as u8,
            id: f.header.id,
        };
        s.write_all(&h.encode()).await.unwrap();
        // Then as much as the client will read: it must not buffer it.
        let junk = vec![0u8; HEADER_LEN + MAX_PAYLOAD];
        let _ = s.write_all(&junk).await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let t0 = Instant::now();
    let err = c.health().await.unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5));
    let ClientError::Protocol(why) = &err else {
        panic!("{err:?}");
    };
    assert!(why.contains("exceeds"), "{why}");
    assert!(c.is_closed());
    assert!(c.last_connection_error().unwrap().contains("exceeds"));
    let err = c.health().await.unwrap_err();
    assert!(matches!(err, ClientError::Protocol(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_answering_times_out() {
    let config = Config {
        call_timeout: Duration::from_millis(300),
        write_buffer: 1 << 20,
        ..Config::default()
    };
    // Reads everything, answers nothing.
    let (c, _dir) = fake_agent_with("silent", config, |mut s, _| async move {
        let mut sink = vec![0u8; 1 << 16];
        while s.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    })
    .await;
    let t0 = Instant::now();
    for err in [
        c.health().await.unwrap_err(),
        c.stat("/x").await.unwrap_err(),
        c.exec(&ExecRequest::argv(["true"])).await.unwrap_err(),
        c.list_dir("/").await.unwrap_err(),
    ] {
        assert!(matches!(err, ClientError::Timeout), "{err:?}");
    }
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    assert_eq!(c.in_flight(), 0, "timed-out calls freed their routes");

    // Reads nothing at all: the socket and then the write budget fill, and
    // an upload times out instead of queueing without bound.
    let (c, _dir) = fake_agent_with("deaf", config, |s, _| async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(s);
    })
    .await;
    let big = vec![1u8; 64 << 20];
    let t0 = Instant::now();
    let err = c
        .upload(&mut &big[..], "/f", UploadOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Timeout), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(c.in_flight(), 0);
}
