//! Fork: validation, what clones inherit, admission (partial and whole
//! refusals), restore and snapshot failures, and clones across a daemon
//! restart and the removal of their source.

use crate::harness::*;
use shoal_client::api::{self, ErrorCode, ForkRequest, SandboxState};
use shoal_runtime::backend::fake::Op;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn no_pools() -> Opts {
    Opts {
        pools: false,
        ..Opts::default()
    }
}

/// Sandboxes the API lists, by id.
fn ids(d: &TestDaemon) -> Vec<String> {
    let mut v: Vec<String> =
        d.c.list(&api::ListFilter::default())
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
    v.sort();
    v
}

/// What is left in the daemon's `forks/` directory.
fn fork_dirs(d: &TestDaemon) -> Vec<String> {
    std::fs::read_dir(d.state_dir().join("forks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// A raw `POST /v1/sandboxes/{id}/fork` with `body`: (status line and
/// headers, body).
fn raw_fork(d: &TestDaemon, id: &str, body: &str) -> (String, String) {
    let mut c = UnixStream::connect(d.state_dir().join("shoald.sock")).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        c,
        "POST /v1/sandboxes/{id}/fork HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_string(), body.to_string())
}

#[test]
fn bad_fork_requests_are_refused_with_400_and_unknown_sources_with_404() {
    let d = TestDaemon::with(no_pools());
    let sb = d.create();
    for body in [
        r#"{"count":0}"#,
        r#"{"count":101}"#,
        r#"{"count":-1}"#,
        r#"{}"#,
        r#"{"count":2,"n":1}"#,
        r#"{"count":"2"}"#,
    ] {
        let (head, resp) = raw_fork(&d, &sb.id, body);
        assert!(head.starts_with("HTTP/1.1 400"), "{body}: {head}\n{resp}");
        assert!(resp.contains(r#""code":"bad_request""#), "{body}: {resp}");
    }
    let (s, code, m) = refused(d.c.fork(&sb.id, &ForkRequest::new(0)).unwrap_err());
    assert_eq!((s, code), (400, Some(ErrorCode::BadRequest)), "{m}");
    assert!(m.contains("1 to 100"), "{m}");
    let bad_labels = ForkRequest {
        count: 1,
        metadata: Some(BTreeMap::from([("".into(), "x".into())])),
    };
    let (s, _, m) = refused(d.c.fork(&sb.id, &bad_labels).unwrap_err());
    assert_eq!(s, 400, "{m}");
    let (s, code, m) = refused(d.c.fork("000000000000", &ForkRequest::new(1)).unwrap_err());
    assert_eq!((s, code), (404, Some(ErrorCode::NotFound)), "{m}");
    // Nothing was made, nothing was left.
    assert_eq!(ids(&d), std::slice::from_ref(&sb.id));
    assert!(fork_dirs(&d).is_empty());
}

#[test]
fn clones_inherit_the_source_and_get_new_ids() {
    let d = TestDaemon::with(no_pools());
    let src = d.create_with(|r| {
        r.env.insert("GREETING".into(), "hi".into());
        r.metadata.insert("run".into(), "7".into());
        r.ttl_s = 3600;
        r.idle_timeout_s = 600;
    });
    let f = d.c.fork(&src.id, &ForkRequest::new(3)).unwrap();
    assert_eq!(f.source, src.id);
    assert!(f.failed.is_empty(), "{:?}", f.failed);
    assert_eq!(f.sandboxes.len(), 3);
    let mut seen = vec![src.id.clone()];
    for c in &f.sandboxes {
        assert!(!seen.contains(&c.id), "ids are new: {}", c.id);
        seen.push(c.id.clone());
        assert_eq!(c.state, SandboxState::Running);
        assert_eq!(c.template, src.template);
        assert_eq!((c.vcpus, c.memory_mib), (src.vcpus, src.memory_mib));
        assert_eq!((c.ttl_s, c.idle_timeout_s), (3600, 600));
        assert_eq!(c.metadata, src.metadata);
        assert_eq!(c.env, src.env);
        assert_ne!(c.pid, src.pid);
        // Its own VM, with the source's environment.
        let (code, out) = d.sh(&c.id, "echo $GREETING").unwrap();
        assert_eq!((code, out.as_str()), (Some(0), "hi\n"));
        assert_eq!(d.get(&c.id).state, SandboxState::Running);
        assert!(d.event_kinds(&c.id).contains(&"created".to_string()));
    }
    seen.sort();
    assert_eq!(ids(&d), seen);
    // The source goes on; the fork's snapshot is gone once the clones run.
    assert_eq!(d.sh(&src.id, "echo still").unwrap().1, "still\n");
    assert!(d.event_kinds(&src.id).contains(&"forked".to_string()));
    assert!(fork_dirs(&d).is_empty(), "{:?}", fork_dirs(&d));
    // Labels may be replaced.
    let g =
        d.c.fork(
            &src.id,
            &ForkRequest {
                count: 1,
                metadata: Some(BTreeMap::from([("branch".into(), "b".into())])),
            },
        )
        .unwrap();
    assert_eq!(g.sandboxes[0].metadata["branch"], "b");
    assert!(!g.sandboxes[0].metadata.contains_key("run"));
    let q = api::ListFilter {
        metadata: BTreeMap::from([("branch".into(), "b".into())]),
        ..Default::default()
    };
    let found: Vec<String> = d.c.list(&q).unwrap().into_iter().map(|s| s.id).collect();
    assert_eq!(found, [g.sandboxes[0].id.clone()]);
}

#[test]
fn clones_are_admitted_like_creates_a_partial_fork_says_why() {
    let d = TestDaemon::with(Opts {
        max_vms: 3,
        ..no_pools()
    });
    let src = d.create();
    // Room for two more.
    let f = d.c.fork(&src.id, &ForkRequest::new(5)).unwrap();
    assert_eq!(f.sandboxes.len(), 2, "{f:?}");
    assert_eq!(f.failed.len(), 3, "{f:?}");
    for e in &f.failed {
        assert_eq!(e.code, ErrorCode::HostFull, "{e:?}");
        assert!(e.message.contains("host is full"), "{e:?}");
    }
    assert_eq!(ids(&d).len(), 3);
    // None fits: the first refusal is the answer, with Retry-After.
    let (head, body) = raw_fork(&d, &src.id, r#"{"count":2}"#);
    assert!(head.starts_with("HTTP/1.1 429"), "{head}\n{body}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    assert!(body.contains(r#""code":"host_full""#), "{body}");
    let (s, code, _) = refused(d.c.fork(&src.id, &ForkRequest::new(1)).unwrap_err());
    assert_eq!((s, code), (429, Some(ErrorCode::HostFull)));
    assert_eq!(ids(&d).len(), 3);
    // Removing a clone makes room for one.
    d.c.kill(&f.sandboxes[0].id).unwrap();
    let g = d.c.fork(&src.id, &ForkRequest::new(1)).unwrap();
    assert_eq!((g.sandboxes.len(), g.failed.len()), (1, 0));
    assert!(fork_dirs(&d).is_empty());
}

#[test]
fn failed_restores_are_reported_and_leave_nothing() {
    let d = TestDaemon::with(no_pools());
    let src = d.create();
    d.faults.fail_next(Op::Restore, 1);
    let f = d.c.fork(&src.id, &ForkRequest::new(3)).unwrap();
    assert_eq!(f.sandboxes.len(), 2, "{f:?}");
    assert_eq!(f.failed.len(), 1, "{f:?}");
    assert!(
        f.failed[0].message.contains("injected failure: restore"),
        "{:?}",
        f.failed
    );
    let mut want: Vec<String> = f.sandboxes.iter().map(|s| s.id.clone()).collect();
    want.push(src.id.clone());
    want.sort();
    assert_eq!(ids(&d), want, "the failed clone's row is gone");
    let dirs: usize = std::fs::read_dir(d.sandboxes_dir()).unwrap().count();
    assert_eq!(dirs, 3, "the failed clone's directory is gone");
    // Every clone failing: the first failure is the answer.
    d.faults.fail_next(Op::Restore, 2);
    let (s, code, m) = refused(d.c.fork(&src.id, &ForkRequest::new(2)).unwrap_err());
    assert_eq!((s, code), (502, Some(ErrorCode::SandboxError)), "{m}");
    assert!(m.contains("injected failure"), "{m}");
    assert_eq!(ids(&d), want);
    // A failed snapshot makes no clone, and the source goes on.
    d.faults.fail_next(Op::Snapshot, 1);
    let (s, _, m) = refused(d.c.fork(&src.id, &ForkRequest::new(2)).unwrap_err());
    assert_eq!(s, 502, "{m}");
    assert!(m.contains("fork snapshot"), "{m}");
    assert_eq!(ids(&d), want);
    assert!(fork_dirs(&d).is_empty());
    assert_eq!(d.sh(&src.id, "echo ok").unwrap().1, "ok\n");
}

#[test]
fn clones_outlive_their_source_and_a_daemon_restart() {
    let mut d = TestDaemon::with(no_pools());
    let src = d.create();
    // A paused source is resumed to be forked.
    d.c.pause(&src.id).unwrap();
    let f = d.c.fork(&src.id, &ForkRequest::new(2)).unwrap();
    assert_eq!(f.sandboxes.len(), 2);
    assert_eq!(d.get(&src.id).state, SandboxState::Running);
    d.c.kill(&src.id).unwrap();
    for c in &f.sandboxes {
        assert_eq!(d.sh(&c.id, "echo alive").unwrap().1, "alive\n");
    }
    // A fork's directory left by a daemon that stopped mid-fork.
    let stale = d.state_dir().join("forks/abc-000000000000");
    std::fs::create_dir_all(&stale).unwrap();
    d.restart();
    assert!(!stale.exists(), "stale fork snapshots are removed on start");
    for c in &f.sandboxes {
        let s = d.wait_state(&c.id, SandboxState::Running, T);
        assert_eq!(s.pid, c.pid, "reattached, not restarted");
        assert_eq!(d.sh(&c.id, "echo again").unwrap().1, "again\n");
    }
    // A clone can itself be forked, paused and resumed.
    let g = d.c.fork(&f.sandboxes[0].id, &ForkRequest::new(1)).unwrap();
    let gid = &g.sandboxes[0].id;
    d.c.pause(gid).unwrap();
    assert_eq!(d.sh(gid, "echo resumed").unwrap().1, "resumed\n");
}

#[test]
fn clones_reserve_disk_like_creates() {
    // The template's memory file and the source reserve 2 x 128 MiB: room
    // for one clone of 128 MiB in 420.
    let d = TestDaemon::with(Opts {
        disk_budget_mib: 420,
        ..no_pools()
    });
    let src = d.create();
    let f = d.c.fork(&src.id, &ForkRequest::new(3)).unwrap();
    assert_eq!((f.sandboxes.len(), f.failed.len()), (1, 2), "{f:?}");
    for e in &f.failed {
        assert_eq!(e.code, ErrorCode::HostFull, "{e:?}");
        assert!(e.message.contains("disk quota of 420 MiB"), "{e:?}");
    }
    assert_eq!(d.c.stats().unwrap().usage.disk_mib, 3 * 128);
    let refusals = d.metric("shoal_admission_refusals_total{reason=\"disk_quota\"}");
    assert!(refusals.is_some_and(|n| n >= 1.0), "{refusals:?}");
}
