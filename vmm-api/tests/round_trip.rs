//! The client against the real server, over a real socket: every request
//! and its typed reply, refusals, and a controller that goes away.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tempfile::TempDir;
use vmm_api::{
    serve, ApiError, BalloonInfo, Client, Command, EvictInfo, Reply, Request, RestoreInfo, Sample,
    SnapshotInfo, Stats, VmState,
};

const T: Duration = Duration::from_secs(5);

fn socket() -> (TempDir, PathBuf, UnixListener) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let l = UnixListener::bind(&path).unwrap();
    (dir, path, l)
}

fn stats() -> Stats {
    Stats {
        state: VmState::Running,
        vcpus: 1,
        memory_mib: 128,
        uptime_ms: 5,
        serial_bytes: 6,
        serial_dropped: 0,
        pid: 7,
        pmem_guest_writes: 0,
        net: None,
    }
}

fn balloon() -> BalloonInfo {
    BalloonInfo {
        target_mib: 16,
        actual_mib: 8,
        inflated_pages: 2048,
        ..Default::default()
    }
}

fn evicted() -> EvictInfo {
    EvictInfo {
        mode: "file".into(),
        pages: 300,
        mappings: 2,
        held_ms: 4.5,
        ..Default::default()
    }
}

fn snap(dir: &Path) -> SnapshotInfo {
    SnapshotInfo {
        dir: dir.to_path_buf(),
        state_bytes: 100,
        memory_bytes: 4096,
        pause_ms: 0.25,
        save_ms: 1.5,
    }
}

/// The real server with a VMM that answers each command with a fixed
/// value, recording the requests it saw.
fn vmm() -> (TempDir, Client, Arc<Mutex<Vec<String>>>) {
    let (dir, path, l) = socket();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    serve(l, move |cmd| {
        let mut log = log.lock().unwrap();
        match cmd {
            Command::Pause(r) => {
                log.push("pause".into());
                r.ok(())
            }
            Command::Resume(r) => {
                log.push("resume".into());
                r.refuse("not paused")
            }
            Command::Shutdown(r) => {
                log.push("shutdown".into());
                r.ok(())
            }
            Command::Stats(r) => {
                log.push("stats".into());
                r.ok(stats())
            }
            Command::Sample(r) => {
                log.push("sample".into());
                r.ok(Sample {
                    rips: vec![0x1000, 0x2000],
                })
            }
            Command::Snapshot { dir, diff, reply } => {
                log.push(format!("snapshot {} {diff}", dir.display()));
                reply.ok(snap(&dir))
            }
            Command::Restore { dir, disks, reply } => {
                log.push(format!("restore {} {disks:?}", dir.display()));
                reply.send(Ok::<_, String>(RestoreInfo { restore_ms: 2.5 }))
            }
            Command::Balloon { target_mib, reply } => {
                log.push(format!("balloon {target_mib:?}"));
                reply.ok(balloon())
            }
            Command::Evict { dir, reply } => {
                log.push(format!("evict {}", dir.display()));
                reply.ok(evicted())
            }
        }
        true
    })
    .unwrap();
    (dir, Client::new(path, T), seen)
}

#[test]
fn every_request_round_trips_through_the_server() {
    let (_d, c, seen) = vmm();
    c.pause().unwrap();
    c.shutdown().unwrap();
    assert_eq!(c.stats().unwrap(), stats());
    assert_eq!(c.sample().unwrap(), vec![0x1000, 0x2000]);
    let s = Path::new("/snap/x");
    assert_eq!(c.snapshot(s, true).unwrap(), snap(s));
    assert_eq!(
        c.restore(s, &["/d0".into()]).unwrap(),
        RestoreInfo { restore_ms: 2.5 }
    );
    assert_eq!(c.balloon(Some(16)).unwrap(), balloon());
    assert_eq!(c.evict(Path::new("/sb/1")).unwrap(), evicted());
    match c.resume().unwrap_err() {
        ApiError::Refused { request, message } => {
            assert_eq!((request, message.as_str()), ("resume", "not paused"))
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "pause",
            "shutdown",
            "stats",
            "sample",
            "snapshot /snap/x true",
            "restore /snap/x [\"/d0\"]",
            "balloon Some(16)",
            "evict /sb/1",
            "resume"
        ]
    );
    // The generic call gets each request's own reply.
    assert_eq!(c.call(&Request::Stats).unwrap(), Reply::Stats(stats()));
    assert_eq!(c.call(&Request::Pause).unwrap(), Reply::Done);
    assert_eq!(
        c.call(&Request::Sample).unwrap(),
        Reply::Sample(Sample {
            rips: vec![0x1000, 0x2000]
        })
    );
    assert_eq!(
        c.call(&Request::Snapshot {
            dir: s.into(),
            diff: false
        })
        .unwrap(),
        Reply::Snapshot(snap(s))
    );
    assert_eq!(
        c.call(&Request::Restore {
            dir: s.into(),
            disks: vec![]
        })
        .unwrap(),
        Reply::Restore(RestoreInfo { restore_ms: 2.5 })
    );
}

#[test]
fn a_vm_going_away_refuses_requests() {
    let (_d, path, l) = socket();
    // The controller is gone: forwarding fails.
    serve(l, |_| false).unwrap();
    let e = Client::new(&path, T).pause().unwrap_err();
    assert!(matches!(e, ApiError::Refused { .. }), "{e:?}");
    assert_eq!(e.to_string(), "VM is shutting down");

    // The controller took the request and dropped it unanswered.
    let (_d, path, l) = socket();
    serve(l, |cmd| {
        drop(cmd);
        true
    })
    .unwrap();
    let e = Client::new(&path, T).stats().unwrap_err();
    assert_eq!(e.to_string(), "VM is shutting down");
}

#[test]
fn requests_are_answered_from_another_thread() {
    // As in the VMM: forward hands the command to a controller thread.
    let (_d, path, l) = socket();
    let (tx, rx) = mpsc::channel::<Command>();
    let tx = std::sync::Mutex::new(tx);
    serve(l, move |cmd| tx.lock().unwrap().send(cmd).is_ok()).unwrap();
    std::thread::spawn(move || {
        for cmd in rx {
            match cmd {
                Command::Restore { dir, disks, reply } => reply.send(if disks.is_empty() {
                    Err(format!("no disks for {}", dir.display()))
                } else {
                    Ok(RestoreInfo { restore_ms: 1.0 })
                }),
                other => other.refuse("busy"),
            }
        }
    });
    let c = Client::new(&path, T);
    let e = c.restore(std::path::Path::new("/s"), &[]).unwrap_err();
    assert_eq!(e.to_string(), "no disks for /s");
    assert_eq!(
        c.restore(std::path::Path::new("/s"), &["/d".into()])
            .unwrap()
            .restore_ms,
        1.0
    );
    assert_eq!(c.shutdown().unwrap_err().to_string(), "busy");
}
