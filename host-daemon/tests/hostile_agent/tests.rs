//! One test per hostile behaviour (see the binary's doc).

use crate::harness::{refused, Opts, TestDaemon};
use crate::stand_in::{Behaviour, StandIn};
use agent_client::Transport;
use shoal_client::api::{ErrorCode, ExecEvent, ExecRequest};
use shoal_client::ClientError;
use shoald::agent_limits::AgentLimits;
use std::io::Read;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The tests measure the whole process: one at a time.
static SOLO: Mutex<()> = Mutex::new(());

fn solo() -> MutexGuard<'static, ()> {
    SOLO.lock().unwrap_or_else(|e| e.into_inner())
}

const MIB: u64 = 1 << 20;
/// What one hostile call may make the daemon (this process) grow by.
const RSS_BOUND_KIB: u64 = 256 * 1024;
/// Threads and descriptors one hostile call may add (the runtime's
/// blocking pool, sockets of the calls in progress).
const THREADS_BOUND: u64 = 48;
const FDS_BOUND: u64 = 96;

/// This process's resident memory (KiB) and threads, from
/// /proc/self/status, and its open descriptors.
#[derive(Debug, Clone, Copy)]
struct Usage {
    rss_kib: u64,
    threads: u64,
    fds: u64,
}

fn status_field(s: &str, name: &str) -> u64 {
    s.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /proc/self/status"))
}

fn usage() -> Usage {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let fds = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count() as u64;
    Usage {
        rss_kib: status_field(&s, "VmRSS:"),
        threads: status_field(&s, "Threads:"),
        fds,
    }
}

impl Usage {
    /// Panics if `now` is beyond the bounds over `self`.
    fn check(&self, now: Usage, what: &str) {
        let grew = now.rss_kib.saturating_sub(self.rss_kib);
        assert!(
            grew <= RSS_BOUND_KIB,
            "{what}: the daemon grew by {} MiB (bound {} MiB)",
            grew / 1024,
            RSS_BOUND_KIB / 1024
        );
        assert!(
            now.threads <= self.threads + THREADS_BOUND,
            "{what}: {} threads, {} before",
            now.threads,
            self.threads
        );
        assert!(
            now.fds <= self.fds + FDS_BOUND,
            "{what}: {} descriptors, {} before",
            now.fds,
            self.fds
        );
    }
}

/// Runs `f` on a thread; waits at most `within` for it, checking the
/// process's usage against `base` all along (so a daemon that does not
/// bound what it holds fails at once, not after its own deadline).
fn watched<T: Send + 'static>(
    what: &str,
    base: Usage,
    within: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let t0 = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    loop {
        base.check(usage(), what);
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(v) => return (v, t0.elapsed()),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                assert!(t0.elapsed() < within, "{what}: no answer within {within:?}");
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// A daemon with one sandbox whose agent is a hostile stand-in and one
/// healthy neighbour (a real agent).
struct Setup {
    d: TestDaemon,
    si: StandIn,
    hostile: String,
    neighbour: String,
    _tmp: tempfile::TempDir,
}

/// Bounds short enough for tests: calls within 3 s, an exec's result
/// within 1 s of its timeout, file operations within 5 s.
fn test_limits() -> AgentLimits {
    AgentLimits {
        call_timeout: Duration::from_secs(3),
        exec_slack: Duration::from_secs(1),
        file_op_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_secs(3),
        ..AgentLimits::default()
    }
}

fn setup_with(b: Behaviour, hybrid: bool, budget: u64, limits: AgentLimits) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    // Honest until the daemon is connected (but for the connection's own
    // attacks: an ignored CONNECT or PostRestore).
    let on_connect = matches!(b, Behaviour::IgnoreConnect | Behaviour::IgnorePostRestore);
    let first = if on_connect { b } else { Behaviour::Honest };
    let si = StandIn::start(&tmp.path().join("hostile.sock"), hybrid, first, budget);
    let slot: Arc<Mutex<Option<Transport>>> = Arc::new(Mutex::new(Some(si.transport())));
    let redirect = {
        let slot = slot.clone();
        Arc::new(move |_: &std::path::Path| slot.lock().unwrap().take())
    };
    let d = TestDaemon::with(Opts {
        pools: false,
        redirect: Some(redirect),
        agent_timeout: Duration::from_secs(3),
        agent_limits: limits,
        ..Opts::default()
    });
    let hostile = d.create().id;
    assert!(slot.lock().unwrap().is_none(), "the stand-in was not used");
    let neighbour = d.create().id;
    // The neighbour's connection, and the hostile one's, are up before
    // the attack.
    let (code, out) = d.sh(&neighbour, "echo ok").unwrap();
    assert_eq!((code, out.as_str()), (Some(0), "ok\n"));
    if !on_connect {
        assert_eq!(d.c.stat(&hostile, "/").expect("honest stat").size, MIB);
        si.set(b);
    }
    Setup {
        d,
        si,
        hostile,
        neighbour,
        _tmp: tmp,
    }
}

fn setup(b: Behaviour) -> Setup {
    setup_with(b, false, 1 << 30, test_limits())
}

impl Setup {
    /// The healthy neighbour's stat and exec, and a new create, answer
    /// promptly.
    fn neighbours_answer(&self) {
        let t0 = Instant::now();
        self.d.c.stat(&self.neighbour, "/").expect("neighbour stat");
        let (code, out) = self
            .d
            .sh(&self.neighbour, "echo ok")
            .expect("neighbour exec");
        assert_eq!((code, out.as_str()), (Some(0), "ok\n"));
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "the neighbour took {:?}",
            t0.elapsed()
        );
        let t0 = Instant::now();
        let sb = self.d.create();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "a create took {:?}",
            t0.elapsed()
        );
        self.d.c.kill(&sb.id).expect("kill the new sandbox");
    }

    /// The daemon's tasks once their number has not changed for 300 ms
    /// (the API connections of earlier calls are gone).
    fn settled_tasks(&self) -> usize {
        let t0 = Instant::now();
        let mut n = self.d.alive_tasks();
        let mut since = Instant::now();
        while since.elapsed() < Duration::from_millis(300) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the daemon's tasks never settle"
            );
            std::thread::sleep(Duration::from_millis(10));
            let m = self.d.alive_tasks();
            if m != n {
                (n, since) = (m, Instant::now());
            }
        }
        n
    }

    /// Waits until the daemon's tasks are back to `base` (nothing the
    /// hostile calls held is left).
    fn tasks_back_to(&self, base: usize, what: &str) {
        let t0 = Instant::now();
        while self.d.alive_tasks() > base {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{what}: {} tasks alive, {base} before",
                self.d.alive_tasks()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn client(&self) -> shoal_client::DaemonClient {
        self.d.c.clone()
    }
}

fn code_of(e: ClientError) -> (u16, Option<ErrorCode>, String) {
    refused(e)
}

#[test]
fn a_listing_that_never_ends_is_capped() {
    let _g = solo();
    let s = setup(Behaviour::ListNoLast);
    let base = usage();
    let tasks = s.settled_tasks();
    let (c, id) = (s.client(), s.hostile.clone());
    let (r, took) = watched("listing", base, Duration::from_secs(10), move || {
        c.list_dir(&id, "/")
    });
    let (status, _, msg) = code_of(r.expect_err("an endless listing must fail"));
    assert_eq!(status, 502, "{msg}");
    assert!(msg.contains("listing"), "{msg}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    base.check(usage(), "after the listing");
    s.tasks_back_to(tasks, "after the listing");
    s.neighbours_answer();
}

#[test]
fn a_one_shot_exec_silent_after_started_ends_at_its_deadline() {
    let _g = solo();
    let limits = AgentLimits {
        max_in_flight: 4,
        ..test_limits()
    };
    let s = setup_with(Behaviour::SilentAfterStarted, false, 0, limits);
    let base = usage();
    let tasks = s.settled_tasks();
    // More calls than the in-flight cap, one after the other: each one's
    // route is freed when it ends.
    for i in 0..5 {
        let (c, id) = (s.client(), s.hostile.clone());
        let (r, took) = watched("silent exec", base, Duration::from_secs(10), move || {
            c.exec(&id, &ExecRequest::shell("true").with_timeout(0.2))
        });
        let (status, code, msg) = code_of(r.expect_err("a silent exec must fail"));
        assert_eq!(
            (status, code),
            (504, Some(ErrorCode::DeadlineExceeded)),
            "call {i}: {msg}"
        );
        assert!(took < Duration::from_secs(6), "call {i} took {took:?}");
    }
    s.tasks_back_to(tasks, "after the silent execs");
    s.neighbours_answer();
}

#[test]
fn a_streamed_exec_silent_after_started_is_freed_when_its_client_leaves() {
    let _g = solo();
    let s = setup(Behaviour::SilentAfterStarted);
    let tasks = s.settled_tasks();
    // The client reads `start`, then leaves.
    let req = ExecRequest::shell("sleep 1000").with_timeout(600.0);
    let mut st = s.d.c.exec_stream(&s.hostile, &req).expect("stream");
    let first = st.next().expect("a first event").expect("an event");
    assert!(matches!(first, ExecEvent::Start { .. }), "{first:?}");
    drop(st);
    s.tasks_back_to(tasks, "after the client left a silent streamed exec");
    s.neighbours_answer();
}

#[test]
fn a_streamed_exec_silent_after_started_ends_with_an_error_at_its_deadline() {
    let _g = solo();
    let s = setup(Behaviour::SilentAfterStarted);
    let tasks = s.settled_tasks();
    let (c, id) = (s.client(), s.hostile.clone());
    let base = usage();
    let (events, took) = watched("silent stream", base, Duration::from_secs(10), move || {
        let req = ExecRequest::shell("true").with_timeout(1.0);
        let st = c.exec_stream(&id, &req).expect("stream");
        st.collect::<Vec<_>>()
    });
    assert!(took < Duration::from_secs(6), "took {took:?}");
    match events.last() {
        Some(Ok(ExecEvent::Error { message })) => {
            assert!(message.contains("deadline"), "{message}")
        }
        other => panic!("expected an error event last, got {other:?}"),
    }
    s.tasks_back_to(tasks, "after a silent streamed exec's deadline");
}

#[test]
fn calls_over_the_per_sandbox_cap_are_refused_not_queued() {
    let _g = solo();
    let limits = AgentLimits {
        max_in_flight: 8,
        ..test_limits()
    };
    let s = setup_with(Behaviour::SilentAfterStarted, false, 0, limits);
    let base = usage();
    // 8 silent execs hold the cap.
    let mut held = Vec::new();
    for _ in 0..8 {
        let (c, id) = (s.client(), s.hostile.clone());
        held.push(std::thread::spawn(move || {
            c.exec(&id, &ExecRequest::shell("true").with_timeout(8.0))
        }));
    }
    let t0 = Instant::now();
    while s
        .si
        .stats()
        .execs
        .load(std::sync::atomic::Ordering::Acquire)
        < 8
    {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the 8 execs did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let e =
        s.d.c
            .exec(&s.hostile, &ExecRequest::shell("true").with_timeout(8.0))
            .expect_err("over the cap");
    let (status, code, msg) = code_of(e);
    assert_eq!((status, code), (429, Some(ErrorCode::SandboxBusy)), "{msg}");
    assert!(msg.contains("in flight"), "{msg}");
    // Refused at once, while the neighbour and creates go on.
    for _ in 0..20 {
        let t0 = Instant::now();
        let e = s.d.c.stat(&s.hostile, "/").expect_err("over the cap");
        assert_eq!(code_of(e).0, 429);
        assert!(t0.elapsed() < Duration::from_millis(500));
    }
    s.neighbours_answer();
    base.check(usage(), "with the cap held");
    for h in held {
        let (status, ..) = code_of(h.join().unwrap().expect_err("silent"));
        assert_eq!(status, 504);
    }
}

#[test]
fn a_one_shot_exec_flooding_stdout_is_capped_and_ends_at_its_deadline() {
    let _g = solo();
    let s = setup(Behaviour::StdoutFlood);
    let base = usage();
    let tasks = s.settled_tasks();
    let (c, id) = (s.client(), s.hostile.clone());
    let (r, took) = watched("stdout flood", base, Duration::from_secs(12), move || {
        c.exec(&id, &ExecRequest::shell("yes").with_timeout(2.0))
    });
    let (status, _, msg) = code_of(r.expect_err("an endless exec must fail"));
    assert_eq!(status, 504, "{msg}");
    assert!(took < Duration::from_secs(8), "took {took:?}");
    s.tasks_back_to(tasks, "after the flood");
    s.neighbours_answer();
}

#[test]
fn a_download_without_end_stops_at_the_files_size() {
    let _g = solo();
    let s = setup(Behaviour::DownloadNoEnd);
    let base = usage();
    let (c, id) = (s.client(), s.hostile.clone());
    let (got, took) = watched("download", base, Duration::from_secs(12), move || {
        let mut dl = c.get_file(&id, "/f").expect("download starts");
        let mut n = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match dl.read(&mut buf) {
                Ok(0) | Err(_) => return n,
                Ok(k) => n += k as u64,
            }
        }
    });
    assert!(got <= MIB, "the daemon sent {got} bytes of a 1 MiB file");
    assert!(took < Duration::from_secs(8), "took {took:?}");
    s.neighbours_answer();
}

#[test]
fn frames_for_other_request_ids_are_dropped_and_the_call_times_out() {
    let _g = solo();
    let s = setup_with(Behaviour::FloodOtherIds, false, 2 << 30, test_limits());
    let base = usage();
    let (c, id) = (s.client(), s.hostile.clone());
    let (r, took) = watched("flood", base, Duration::from_secs(12), move || {
        c.stat(&id, "/")
    });
    let (status, ..) = code_of(r.expect_err("no answer"));
    assert_eq!(status, 504);
    assert!(took < Duration::from_secs(8), "took {took:?}");
    s.neighbours_answer();
}

#[test]
fn answers_under_wrong_request_ids_time_out() {
    let _g = solo();
    let s = setup(Behaviour::WrongIds);
    let base = usage();
    let (c, id) = (s.client(), s.hostile.clone());
    let (r, took) = watched("wrong ids", base, Duration::from_secs(10), move || {
        c.stat(&id, "/")
    });
    let (status, ..) = code_of(r.expect_err("no answer under the right id"));
    assert_eq!(status, 504);
    assert!(took < Duration::from_secs(6), "took {took:?}");
    s.neighbours_answer();
}

#[test]
fn an_oversized_frame_closes_the_connection_and_the_next_call_reconnects() {
    let _g = solo();
    let s = setup(Behaviour::HugeFrame);
    let (c, id) = (s.client(), s.hostile.clone());
    let (r, took) = watched("huge frame", usage(), Duration::from_secs(5), move || {
        c.stat(&id, "/")
    });
    let (status, _, msg) = code_of(r.expect_err("a bad stream"));
    assert_eq!(status, 502, "{msg}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let t0 = Instant::now();
    while s.si.open() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "the daemon kept the bad connection"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    s.si.set(Behaviour::Honest);
    assert_eq!(s.d.c.stat(&s.hostile, "/").expect("reconnected").size, MIB);
    s.neighbours_answer();
}

#[test]
fn an_undecodable_reply_is_a_clear_error() {
    let _g = solo();
    let s = setup(Behaviour::BadPayload);
    let t0 = Instant::now();
    let (status, _, msg) = code_of(s.d.c.stat(&s.hostile, "/").expect_err("bad payload"));
    assert_eq!(status, 502, "{msg}");
    assert!(msg.contains("bad"), "{msg}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    s.neighbours_answer();
}

#[test]
fn a_guest_that_ignores_connect_fails_the_call_and_its_sockets_are_closed() {
    let _g = solo();
    let s = setup_with(Behaviour::IgnoreConnect, true, 0, test_limits());
    let base = usage();
    let (c, id) = (s.client(), s.hostile.clone());
    let (r, took) = watched(
        "ignored CONNECT",
        base,
        Duration::from_secs(15),
        move || c.stat(&id, "/"),
    );
    let (status, _, msg) = code_of(r.expect_err("unreachable"));
    assert_eq!(status, 502, "{msg}");
    assert!(msg.contains("unreachable"), "{msg}");
    assert!(
        s.si.stats()
            .accepted
            .load(std::sync::atomic::Ordering::Acquire)
            > 0
    );
    // The agent timeout (3 s) and 5 s more at most.
    assert!(took < Duration::from_secs(9), "took {took:?}");
    let t0 = Instant::now();
    while s.si.open() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "{} sockets left open",
            s.si.open()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Calls that queued behind a failed connect fail with it, instead of
    // each waiting out its own connect in turn.
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let (c, id) = (s.client(), s.hostile.clone());
            std::thread::spawn(move || (c.stat(&id, "/"), Instant::now()))
        })
        .collect();
    let t0 = Instant::now();
    for h in calls {
        let (r, at) = h.join().unwrap();
        assert_eq!(code_of(r.expect_err("unreachable")).0, 502);
        let took = at - t0;
        assert!(took < Duration::from_secs(9), "a queued call took {took:?}");
    }
    s.neighbours_answer();
}

#[test]
fn a_one_shot_exec_of_yes_is_truncated_per_stream() {
    let _g = solo();
    let d = TestDaemon::with(Opts {
        pools: false,
        ..Opts::default()
    });
    let sb = d.create();
    let base = usage();
    let (c, id) = (d.c.clone(), sb.id.clone());
    let (r, _) = watched("yes", base, Duration::from_secs(60), move || {
        // 24 MiB to stdout: over one stream's 16 MiB, under both's.
        let req = ExecRequest::shell("yes | head -c 25165824; echo done >&2");
        c.exec(&id, &req)
    });
    let r = r.expect("exec");
    assert_eq!(r.exit_code, Some(0));
    assert!(r.truncated, "24 MiB of stdout came back untruncated");
    assert!(r.stdout_truncated && !r.stderr_truncated);
    let out = r.stdout_bytes().unwrap();
    assert_eq!(out.len(), 16 << 20);
    assert!(out.iter().all(|b| b"y\n".contains(b)));
    assert_eq!(r.stderr_bytes().unwrap(), b"done\n");
    let grew = usage().rss_kib.saturating_sub(base.rss_kib) / 1024;
    eprintln!("the daemon and its client (this process) grew by {grew} MiB");
}

#[test]
fn a_streamed_exec_nobody_reads_is_killed_and_does_not_hold_up_the_sandbox() {
    let _g = solo();
    let stall = Duration::from_secs(4);
    let d = TestDaemon::with(Opts {
        pools: false,
        agent_limits: AgentLimits {
            stall_timeout: stall,
            ..AgentLimits::default()
        },
        ..Opts::default()
    });
    let sb = d.create();
    // A client that reads the start event, then nothing more, while the
    // command floods stdout.
    let mut st =
        d.c.exec_stream(&sb.id, &ExecRequest::shell("exec yes"))
            .expect("stream");
    let pid = match st.next().expect("a first event").expect("an event") {
        ExecEvent::Start { pid, .. } => pid,
        e => panic!("expected start, got {e:?}"),
    };
    // Other execs in the same sandbox all succeed, within the stall
    // timeout of the unread stream (twice: the daemon's task, then the
    // agent connection's reader) and some slack for a loaded host.
    let t0 = Instant::now();
    for i in 0..17 {
        let (code, out) = d.sh(&sb.id, &format!("echo {i}")).expect("exec");
        assert_eq!((code, out), (Some(0), format!("{i}\n")));
    }
    let took = t0.elapsed();
    assert!(
        took < 2 * stall + Duration::from_secs(30),
        "17 execs took {took:?}"
    );
    // The unread command was killed.
    let t0 = Instant::now();
    while !crate::harness::gone(pid) {
        assert!(
            t0.elapsed() < 2 * stall + Duration::from_secs(30),
            "the unread command (pid {pid}) still runs"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(st);
}

#[test]
fn a_download_the_guest_never_sends_ends_within_the_call_deadline() {
    let _g = solo();
    let s = setup(Behaviour::DownloadSilent);
    let tasks = s.settled_tasks();
    let (c, id) = (s.client(), s.hostile.clone());
    let (got, took) = watched(
        "silent download",
        usage(),
        Duration::from_secs(10),
        move || {
            let mut dl = c.get_file(&id, "/f").expect("download starts");
            let mut buf = vec![0u8; 1 << 16];
            dl.read(&mut buf)
        },
    );
    assert!(
        !matches!(got, Ok(n) if n > 0),
        "bytes from a silent guest: {got:?}"
    );
    assert!(took < Duration::from_secs(6), "took {took:?}");
    s.tasks_back_to(tasks, "after the silent download");
    s.neighbours_answer();
}

#[test]
fn a_post_restore_never_answered_fails_the_call_within_the_agent_timeout() {
    let _g = solo();
    let s = setup(Behaviour::IgnorePostRestore);
    let (c, id) = (s.client(), s.hostile.clone());
    let (r, took) = watched(
        "ignored PostRestore",
        usage(),
        Duration::from_secs(12),
        move || c.stat(&id, "/"),
    );
    let (status, _, msg) = code_of(r.expect_err("unreachable"));
    assert_eq!(status, 502, "{msg}");
    assert!(msg.contains("unreachable"), "{msg}");
    assert!(took < Duration::from_secs(9), "took {took:?}");
    // The half-made connection is not kept.
    let t0 = Instant::now();
    while s.si.open() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "the connection was kept"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    s.neighbours_answer();
}

#[test]
fn a_background_command_flooding_output_nobody_reads_keeps_the_daemon_bounded() {
    let _g = solo();
    let s = setup(Behaviour::StdoutFlood);
    let base = usage();
    let tasks = s.settled_tasks();
    let (c, id) = (s.client(), s.hostile.clone());
    let req = ExecRequest::shell("yes").with_timeout(2.0);
    let cmd = c.start_command(&id, &req).expect("started");
    let cid = cmd.id.clone();
    // 1 GiB of output comes while nobody attaches, then a reader takes a
    // little and leaves; the command is given up on at its deadline (its
    // timeout and the slack: the stand-in never ends it).
    let (lost, took) = watched(
        "background flood",
        base,
        Duration::from_secs(15),
        move || {
            std::thread::sleep(Duration::from_millis(500));
            let mut st = c.command_stream(&id, &cid).expect("stream");
            assert!(matches!(st.next(), Some(Ok(ExecEvent::Start { .. }))));
            assert!(matches!(st.next(), Some(Ok(ExecEvent::Stdout { .. }))));
            drop(st);
            let early = c
                .wait_command(&id, &cid, Some(0.2))
                .expect_err("still running");
            assert_eq!(code_of(early).1, Some(ErrorCode::DeadlineExceeded));
            c.wait_command(&id, &cid, None).expect_err("lost")
        },
    );
    let (status, code, msg) = code_of(lost);
    assert_eq!(
        (status, code),
        (502, Some(ErrorCode::SandboxError)),
        "{msg}"
    );
    assert!(msg.contains("deadline"), "{msg}");
    assert!(took < Duration::from_secs(8), "took {took:?}");
    let seen = s.client().command(&s.hostile, &cmd.id).expect("command");
    assert_eq!(seen.state, shoal_client::api::CommandState::Lost);
    s.tasks_back_to(tasks, "after the flood");
    s.neighbours_answer();
}

#[test]
fn a_background_yes_keeps_the_head_and_the_latest_output_only() {
    let _g = solo();
    let d = TestDaemon::with(Opts {
        pools: false,
        ..Opts::default()
    });
    let sb = d.create();
    let base = usage();
    let (c, id) = (d.c.clone(), sb.id.clone());
    let cmd = c
        .start_command(&id, &ExecRequest::shell("exec yes"))
        .expect("started");
    let (r, _) = watched("background yes", base, Duration::from_secs(60), move || {
        // Seconds of `yes` (hundreds of MiB) with nobody attached.
        std::thread::sleep(Duration::from_secs(3));
        c.signal_command(&id, &cmd.id, libc::SIGKILL, true)
            .expect("signal");
        let r = c.wait_command(&id, &cmd.id, Some(30.0)).expect("wait");
        let mut replay = 0usize;
        for ev in c.command_stream(&id, &cmd.id).expect("stream") {
            if let ExecEvent::Stdout { data, encoding } = ev.expect("event") {
                replay += encoding.decode(&data).unwrap().len();
            }
        }
        (r, replay)
    });
    let (r, replay) = r;
    assert_eq!(r.signal, Some(libc::SIGKILL));
    assert!(r.stdout_truncated && r.truncated && !r.stderr_truncated);
    let out = r.stdout_bytes().unwrap();
    assert!(
        out.len() > 512 << 10 && out.len() <= 1 << 20,
        "{} bytes kept",
        out.len()
    );
    assert!(out.starts_with(b"y\ny\n") && out.iter().all(|b| b"y\n".contains(b)));
    // The replay: that head and at most the latest MiB.
    assert!(replay > out.len() && replay <= 2 << 20, "replayed {replay}");
}
