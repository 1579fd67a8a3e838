use super::*;
use std::io::{BufRead, BufReader};

fn socket() -> (tempfile::TempDir, PathBuf, UnixListener) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let l = UnixListener::bind(&path).unwrap();
    (dir, path, l)
}

/// Serves `l`: stats answered, everything else refused ("nope").
fn serve_stats(l: UnixListener) {
    serve(l, |cmd| {
        match cmd {
            Command::Stats(r) => r.ok(crate::wire::tests::stats()),
            other => other.refuse("nope"),
        }
        true
    })
    .unwrap();
}

fn read_line(r: &mut impl BufRead) -> String {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    l
}

#[test]
fn bad_lines_are_answered_and_the_connection_stays() {
    let (_d, path, l) = socket();
    serve_stats(l);
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"garbage\n{\"op\":\"pause\"}\n{\"op\":\"stats\"}\n")
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let l1 = read_line(&mut r);
    assert!(
        l1.starts_with("{\"ok\":false,\"error\":\"bad request:"),
        "{l1}"
    );
    assert_eq!(read_line(&mut r), "{\"ok\":false,\"error\":\"nope\"}\n");
    assert!(read_line(&mut r).starts_with("{\"ok\":true,\"stats\":{"));
    // Unknown fields and ops are bad requests too.
    s.write_all(b"{\"op\":\"snapshot\",\"dir\":\"/s\",\"x\":1}\n{\"op\":\"explode\"}\n")
        .unwrap();
    assert!(read_line(&mut r).contains("bad request"));
    assert!(read_line(&mut r).contains("bad request"));
}

#[test]
fn an_endless_request_line_is_cut_off() {
    let (_d, path, l) = socket();
    serve(l, |cmd| {
        cmd.refuse("unreachable");
        true
    })
    .unwrap();
    let mut s = UnixStream::connect(&path).unwrap();
    // The server stops reading at the cap; the rest may not be taken.
    let _ = s.write_all(&vec![b'x'; MAX_LINE + 10]);
    let mut r = BufReader::new(s);
    let l = read_line(&mut r);
    assert!(
        l.contains(&format!("request longer than {MAX_LINE} bytes")),
        "{l}"
    );
    // And the connection is closed (reset, as the server left bytes unread).
    let mut rest = String::new();
    match r.read_line(&mut rest) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection still open: {other:?} {rest:?}"),
    }
}

/// Names of this process's threads called `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

fn stats_server(l: UnixListener, opts: ServeOptions) {
    serve_with(l, opts, |cmd| {
        match cmd {
            Command::Stats(r) => r.ok(crate::wire::tests::stats()),
            other => other.refuse("nope"),
        }
        true
    })
    .unwrap();
}

fn stats_answered(path: &std::path::Path) -> String {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    // A server that refuses before reading may have closed already: the
    // write can fail, and the refusal it wrote is still there to read.
    let _ = s.write_all(b"{\"op\":\"stats\"}\n");
    read_line(&mut BufReader::new(s))
}

#[test]
fn many_idle_connections_do_not_grow_threads_and_extra_ones_are_refused() {
    let (_d, path, l) = socket();
    let before = threads_named("api-conn");
    serve_stats(l);
    let idle: Vec<UnixStream> = (0..64)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let grown = threads_named("api-conn").saturating_sub(before);
    // Other tests of this binary start servers too; 64 idle connections
    // must not mean 64 threads.
    assert!(
        grown <= 2 * MAX_CONNECTIONS,
        "{grown} connection threads for 64 idle connections"
    );
    // Beyond the cap a connection hears why and is closed.
    let l = stats_answered(&path);
    assert!(l.contains("too many control connections"), "{l}");
    drop(idle);
    // Once they are gone the server answers again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let l = stats_answered(&path);
        if l.starts_with("{\"ok\":true,\"stats\"") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never answered: {l}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn an_idle_connection_is_closed_after_the_read_deadline() {
    let (_d, path, l) = socket();
    let opts = ServeOptions {
        idle_timeout: std::time::Duration::from_millis(200),
        ..ServeOptions::default()
    };
    stats_server(l, opts);
    let held: Vec<UnixStream> = (0..MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    // Each idle connection is told and closed once its deadline passes...
    for s in &held {
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let l = read_line(&mut BufReader::new(s.try_clone().unwrap()));
        assert!(l.contains("no request within 200 ms"), "{l}");
    }
    // ...which frees its place for a caller that does speak.
    assert!(stats_answered(&path).starts_with("{\"ok\":true,\"stats\""));
}

#[test]
fn every_server_thread_runs_init_and_a_failing_init_stops_serving() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (_d, path, l) = socket();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let init: ThreadInit = Arc::new(move |t| {
        s2.lock().unwrap().push(t);
        Ok(())
    });
    let opts = ServeOptions {
        init: Some(init),
        ..ServeOptions::default()
    };
    stats_server(l, opts);
    // The threads run it meanwhile; the server answers once they all have.
    assert!(stats_answered(&path).starts_with("{\"ok\":true,\"stats\""));
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by_key(|t| *t == ServerThread::Acceptor);
    let mut want = vec![ServerThread::Worker; MAX_CONNECTIONS];
    want.push(ServerThread::Acceptor);
    assert_eq!(seen, want);

    // One worker's init fails: nothing is served, the listener closes.
    let (_d, path, l) = socket();
    let failed = Arc::new(AtomicUsize::new(0));
    let f2 = failed.clone();
    let opts = ServeOptions {
        init: Some(Arc::new(move |t| {
            if t == ServerThread::Worker && f2.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err("no filter".into());
            }
            Ok(())
        })),
        ..ServeOptions::default()
    };
    stats_server(l, opts);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while UnixStream::connect(&path).is_ok() {
        assert!(std::time::Instant::now() < deadline, "still listening");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn a_client_retries_a_busy_refusal_until_a_connection_frees() {
    let (_d, path, l) = socket();
    serve_stats(l);
    let mut held: Vec<UnixStream> = (0..MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    // The refusal says the request was never read.
    let l = stats_answered(&path);
    assert!(l.contains("\"busy\":true"), "{l}");
    // With every connection held for longer than its deadline, the client
    // ends with that refusal.
    let c = crate::Client::new(&path, std::time::Duration::from_millis(300));
    match c.stats() {
        Err(crate::ApiError::Refused { message, .. }) => {
            assert!(
                message.contains("too many control connections"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    // One freed within its deadline: the client gets its answer.
    let c = crate::Client::new(&path, std::time::Duration::from_secs(10));
    let freed = held.pop();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(freed);
    });
    assert_eq!(c.stats().unwrap(), crate::wire::tests::stats());
    t.join().unwrap();
}
