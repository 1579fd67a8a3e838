use super::*;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use tempfile::TempDir;

const T: Duration = Duration::from_secs(5);

/// A server that reads one request line and answers `reply` (raw bytes),
/// then closes.
fn fake(reply: &'static [u8]) -> (TempDir, Client) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut line = String::new();
            let _ = BufReader::new(&conn).read_line(&mut line);
            let _ = conn.write_all(reply);
        }
    });
    (dir, Client::new(path, T))
}

fn bad_reply(reply: &'static [u8], call: impl Fn(&Client) -> ApiError) -> (ReplyError, String) {
    let (_d, c) = fake(reply);
    let e = call(&c);
    let msg = e.to_string();
    match e {
        ApiError::BadReply { cause, .. } => (cause, msg),
        e => panic!("expected a bad reply, got {e:?}"),
    }
}

#[test]
fn malformed_replies_are_clear_errors() {
    let stats = |c: &Client| c.stats().unwrap_err();
    let (e, msg) = bad_reply(b"garbage\n", stats);
    assert!(matches!(e, ReplyError::Json(_)), "{msg}");
    assert!(msg.contains("bad reply to stats: not JSON"), "{msg}");
    let (e, _) = bad_reply(b"[1,2]\n", stats);
    assert!(matches!(e, ReplyError::NoOk));
    let (e, msg) = bad_reply(b"{\"ok\":\"yes\"}\n", stats);
    assert!(matches!(e, ReplyError::NoOk), "{msg}");
    let (e, msg) = bad_reply(b"{\"stats\":{}}\n", stats);
    assert!(matches!(e, ReplyError::NoOk), "{msg}");
    let (e, msg) = bad_reply(b"", stats);
    assert!(matches!(e, ReplyError::Closed), "{msg}");
    let (e, msg) = bad_reply(b"{\"ok\":true", stats);
    assert!(matches!(e, ReplyError::Closed), "{msg}");
}

#[test]
fn replies_of_the_wrong_type_are_clear_errors() {
    // Success, but not what a stats request gets.
    let (e, msg) = bad_reply(b"{\"ok\":true}\n", |c| c.stats().unwrap_err());
    assert!(matches!(e, ReplyError::Shape(_)), "{msg}");
    assert!(msg.contains("missing field `stats`"), "{msg}");
    let (e, msg) = bad_reply(
        b"{\"ok\":true,\"stats\":{\"state\":\"running\",\"vcpus\":\"two\"}}\n",
        |c| c.stats().unwrap_err(),
    );
    assert!(matches!(e, ReplyError::Shape(_)), "{msg}");
    assert!(msg.contains("invalid type"), "{msg}");
    let (_, msg) = bad_reply(b"{\"ok\":true,\"rips\":[-1]}\n", |c| {
        c.sample().unwrap_err()
    });
    assert!(msg.contains("bad reply to sample"), "{msg}");
    let (_, msg) = bad_reply(b"{\"ok\":true,\"snapshot\":5}\n", |c| {
        c.snapshot(Path::new("/s"), false).unwrap_err()
    });
    assert!(msg.contains("bad reply to snapshot"), "{msg}");
    let (_, msg) = bad_reply(b"{\"ok\":true,\"stats\":{}}\n", |c| {
        c.restore(Path::new("/s"), &[]).unwrap_err()
    });
    assert!(msg.contains("missing field `restore_ms`"), "{msg}");
    let (_, msg) = bad_reply(b"{\"ok\":true}\n", |c| {
        c.call(&Request::Sample).unwrap_err()
    });
    assert!(msg.contains("missing field `rips`"), "{msg}");
}

#[test]
fn refusals_carry_the_vmms_reason() {
    let (_d, c) = fake(b"{\"ok\":false,\"error\":\"no guest is running\"}\n");
    let e = c.pause().unwrap_err();
    assert_eq!(e.to_string(), "no guest is running");
    assert!(matches!(
        e,
        ApiError::Refused {
            request: "pause",
            ..
        }
    ));
    let (_d, c) = fake(b"{\"ok\":false}\n");
    assert_eq!(c.pause().unwrap_err().to_string(), "request failed");
}

#[test]
fn oversized_replies_are_cut_off() {
    static BIG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let big = BIG.get_or_init(|| vec![b' '; MAX_LINE * 2]);
    let (e, msg) = bad_reply(big, |c| c.stats().unwrap_err());
    assert!(matches!(e, ReplyError::TooLong), "{msg}");
    // A line of exactly MAX_LINE bytes, newline included, is accepted.
    static FIT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let fit = FIT.get_or_init(|| {
        let mut v = b"{\"ok\":true}".to_vec();
        v.resize(MAX_LINE - 1, b' ');
        v.push(b'\n');
        v
    });
    let (_d, c) = fake(fit);
    c.pause().unwrap();
}

#[test]
fn a_socket_that_never_answers_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    // Bound and listening, never accepting: connect and send succeed (the
    // backlog and the socket buffer take them), no reply ever comes.
    let _l = UnixListener::bind(&path).unwrap();
    let c = Client::new(&path, Duration::from_millis(300));
    let t0 = Instant::now();
    let e = c.stats().unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(
            e,
            ApiError::Timeout {
                request: "stats",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("no reply to stats within 300 ms"),
        "{e}"
    );
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn the_deadline_covers_the_whole_call() {
    // A server that trickles a byte every 50 ms, never a newline: each
    // read succeeds, the call as a whole must still end at its deadline.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        for _ in 0..200 {
            if s.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let c = Client::new(&path, Duration::from_millis(400));
    let t0 = Instant::now();
    let e = c.pause().unwrap_err();
    assert!(matches!(e, ApiError::Timeout { .. }), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[test]
fn connect_failures_are_io_errors() {
    let dir = tempfile::tempdir().unwrap();
    let c = Client::new(dir.path().join("missing.sock"), T);
    let e = c.stats().unwrap_err();
    match &e {
        ApiError::Io { source, .. } => assert_eq!(source.kind(), ErrorKind::NotFound),
        e => panic!("{e:?}"),
    }
    assert!(e.to_string().contains("missing.sock"), "{e}");
    let long = Client::new(PathBuf::from("/".repeat(200)), T);
    assert!(matches!(long.stats().unwrap_err(), ApiError::Io { .. }));
}

#[test]
fn connecting_to_a_full_backlog_times_out() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let l = UnixListener::bind(&path).unwrap();
    // SAFETY: listen(2) on a socket we own, only changing its backlog.
    assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 0) }, 0);
    // Fill the backlog (the listener never accepts); then a connect waits
    // for room, and only the deadline ends it.
    let mut held = Vec::new();
    let c = Client::new(&path, Duration::from_millis(200));
    for _ in 0..8 {
        let t0 = Instant::now();
        match connect(&path, Instant::now() + Duration::from_millis(200)) {
            Ok(s) => held.push(s),
            Err(Failure::Timeout) => {
                assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
                let e = c.stats().unwrap_err();
                assert!(matches!(e, ApiError::Timeout { .. }), "{e:?}");
                return;
            }
            Err(Failure::Io(e)) => panic!("{e}"),
            Err(Failure::Reply(e)) => panic!("{e}"),
        }
    }
    panic!("{} connections went into a backlog of 0", held.len());
}
