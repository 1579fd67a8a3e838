//! CPU classes (`priority`): a best-effort sandbox's VM process has every
//! thread SCHED_IDLE after each path that gives it a process or a class
//! (create cold, from a warm pool, from the VMM stock; resume from disk;
//! freeze and thaw; fork; a daemon restart; a PATCH), a latency one's are
//! normal; the create's reply says whether SMT isolation is on and why
//! not; `/metrics` counts and says the same.

use crate::harness::*;
use shoal_client::api::{self, CreateSandbox, ForkRequest, Priority, UpdateSandbox};
use shoal_runtime::sched;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// The policies of every thread of `pid` (none when it is gone).
fn policies(pid: i32) -> Vec<i32> {
    sched::threads(pid)
        .unwrap_or_default()
        .into_iter()
        .filter_map(sched::policy)
        .collect()
}

/// Asserts every thread of sandbox `sb`'s VM process has `p`'s policy.
fn assert_class(sb: &api::Sandbox, p: Priority, when: &str) {
    let pid = sb.pid.unwrap_or_else(|| panic!("{when}: no pid: {sb:?}"));
    let want = match p {
        Priority::Latency => libc::SCHED_OTHER,
        Priority::BestEffort => libc::SCHED_IDLE,
    };
    let got = policies(pid);
    assert!(!got.is_empty(), "{when}: pid {pid} has no threads");
    assert!(
        got.iter().all(|g| *g == want),
        "{when}: pid {pid}'s threads' policies {got:?}, want {want} ({p})"
    );
    assert_eq!(sb.priority, p, "{when}");
}

fn best_effort() -> CreateSandbox {
    CreateSandbox {
        image: Some("tiny".into()),
        priority: Priority::BestEffort,
        ..Default::default()
    }
}

/// A raw request with a JSON body: (status line, body).
fn raw(d: &TestDaemon, method: &str, path: &str, body: &str) -> (String, String) {
    let mut c = UnixStream::connect(d.state_dir().join("shoald.sock")).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    (head.lines().next().unwrap_or("").to_string(), body.into())
}

#[test]
fn best_effort_threads_are_idle_on_every_path_latency_ones_normal() {
    let mut d = TestDaemon::with(Opts {
        pools: false,
        ..Default::default()
    });
    let be = d.c.create(&best_effort()).unwrap();
    let lat = d.create();
    assert_class(&be, Priority::BestEffort, "after create");
    assert_class(&lat, Priority::Latency, "after create");
    // The reply says what the host gives; nothing failed.
    assert_eq!(be.smt_isolation, Some(false), "not asked for: {be:?}");
    assert!(be.warnings.is_empty(), "{be:?}");
    let isolates = sched::core_sched().isolates();
    assert_eq!(lat.smt_isolation, Some(isolates));
    assert_eq!(
        lat.warnings.iter().any(|w| w.contains("no SMT isolation")),
        !isolates,
        "{lat:?}"
    );
    // Shown by the other routes too (without the create-only fields).
    let got = d.get(&be.id);
    assert_eq!(got.priority, Priority::BestEffort);
    assert_eq!(got.smt_isolation, None);
    // Work runs in it as in any other.
    assert_eq!(d.sh(&be.id, "echo idle").unwrap().1, "idle\n");

    // Pause to disk and resume: a new process, idle again.
    d.c.pause(&be.id).unwrap();
    let r = d.c.resume(&be.id).unwrap();
    assert_ne!(r.pid, be.pid, "a new process");
    assert_class(&r, Priority::BestEffort, "after pause+resume");
    let lr = {
        d.c.pause(&lat.id).unwrap();
        d.c.resume(&lat.id).unwrap()
    };
    assert_class(&lr, Priority::Latency, "after pause+resume");

    // Fork: clones inherit the class.
    let f = d.c.fork(&be.id, &ForkRequest::new(2)).unwrap();
    assert_eq!(f.sandboxes.len(), 2, "{f:?}");
    for c in &f.sandboxes {
        assert_class(c, Priority::BestEffort, "a fork's clone");
    }

    // A daemon restart: reattached processes keep it.
    d.restart();
    assert_class(&d.get(&be.id), Priority::BestEffort, "after a restart");
    assert_class(&d.get(&lat.id), Priority::Latency, "after a restart");

    // Metrics: per class, and SMT isolation with its reason.
    let m = d.c.metrics().unwrap();
    assert!(
        m.contains("shoal_sandboxes_by_priority{priority=\"best_effort\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("shoal_sandboxes_by_priority{priority=\"latency\"} 1"),
        "{m}"
    );
    let code = sched::core_sched().code();
    assert!(
        m.contains(&format!(
            "shoal_smt_isolation{{reason=\"{code}\"}} {}",
            u8::from(isolates)
        )),
        "{m}"
    );
    assert_eq!(d.metric("shoal_cpu_class_failures_total"), Some(0.0));
}

#[test]
fn freeze_and_thaw_keep_the_class() {
    let d = TestDaemon::with(Opts {
        pools: false,
        freeze_after: Some(Duration::from_millis(200)),
        ..Default::default()
    });
    let be = d.c.create(&best_effort()).unwrap();
    d.wait_for("frozen", T, || {
        d.metric("shoal_sandboxes_frozen").unwrap_or(0.0) >= 1.0
    });
    assert_class(&be, Priority::BestEffort, "frozen");
    // The exec thaws it.
    assert_eq!(d.sh(&be.id, "echo thawed").unwrap().1, "thawed\n");
    assert_class(&d.get(&be.id), Priority::BestEffort, "thawed");
}

#[test]
fn pooled_and_stocked_processes_get_the_class_of_the_create_that_takes_them() {
    let d = TestDaemon::start();
    d.c.create_template(&api::CreateTemplate::new("t", "tiny"))
        .unwrap();
    d.c.set_pool("t", 2).unwrap();
    d.wait_for("the pool to fill", T, || {
        d.c.pools()
            .unwrap()
            .iter()
            .any(|p| p.template == "t" && p.ready == 2)
    });
    // Pooled ones run at the default class until taken.
    for pid in d.agent_pids() {
        assert!(policies(pid).iter().all(|p| *p == libc::SCHED_OTHER));
    }
    let be =
        d.c.create(&CreateSandbox {
            priority: Priority::BestEffort,
            ..CreateSandbox::from_template("t")
        })
        .unwrap();
    assert_eq!(be.from_pool, Some(true));
    assert_class(&be, Priority::BestEffort, "taken from the pool");
    let lat = d.c.create(&CreateSandbox::from_template("t")).unwrap();
    assert_eq!(lat.from_pool, Some(true));
    assert_class(&lat, Priority::Latency, "taken from the pool");
    drop(d);

    let d = TestDaemon::with(Opts {
        vmm_stock: 2,
        pools: false,
        ..Default::default()
    });
    d.create();
    d.wait_for("the stock filled", T, || {
        d.metric("shoal_vmm_stock").unwrap_or(0.0) == 2.0
    });
    let be = d.c.create(&best_effort()).unwrap();
    assert_eq!(d.metric("shoal_vmm_stock_hits_total"), Some(1.0));
    assert_class(&be, Priority::BestEffort, "restored into a stocked process");
}

#[test]
fn a_running_sandboxs_priority_changes_at_once_and_bad_ones_are_400() {
    let d = TestDaemon::with(Opts {
        pools: false,
        ..Default::default()
    });
    let sb = d.create();
    assert_class(&sb, Priority::Latency, "created");
    let v =
        d.c.update_sandbox(
            &sb.id,
            &UpdateSandbox {
                priority: Some(Priority::BestEffort),
                ..Default::default()
            },
        )
        .unwrap();
    assert_class(&v, Priority::BestEffort, "after PATCH");
    assert_eq!(v.smt_isolation, Some(false));
    assert!(d.event_kinds(&sb.id).iter().any(|k| k == "priority"));
    // Paused, it changes in the row; the resume applies it.
    d.c.pause(&sb.id).unwrap();
    let v =
        d.c.update_sandbox(
            &sb.id,
            &UpdateSandbox {
                priority: Some(Priority::Latency),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(v.priority, Priority::Latency);
    let r = d.c.resume(&sb.id).unwrap();
    assert_class(&r, Priority::Latency, "resumed after a PATCH while paused");
    // A TTL-only PATCH leaves the class.
    let v =
        d.c.update_sandbox(
            &sb.id,
            &UpdateSandbox {
                ttl_s: Some(600),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(v.priority, Priority::Latency);
    assert_eq!(v.smt_isolation, None);

    // Bad input: a clear 400 naming the choices.
    for (method, path, body) in [
        (
            "POST",
            "/v1/sandboxes".to_string(),
            r#"{"image":"tiny","priority":"high"}"#,
        ),
        (
            "PATCH",
            format!("/v1/sandboxes/{}", sb.id),
            r#"{"priority":"urgent"}"#,
        ),
        (
            "PATCH",
            format!("/v1/sandboxes/{}", sb.id),
            r#"{"priority":3}"#,
        ),
    ] {
        let (status, body) = raw(&d, method, &path, body);
        assert!(status.contains(" 400 "), "{method} {path}: {status} {body}");
        assert!(
            body.contains("latency") && body.contains("best_effort"),
            "{method} {path}: {body}"
        );
    }
}
