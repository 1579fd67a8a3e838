//! Fork on real guests: a sandbox holding a process with state only in
//! its memory and a file is forked into three live clones; each sees both,
//! then they diverge (each its own files, the source untouched), each has
//! fresh entropy and a current clock, and they outlive their source and a
//! daemon restart. With a scratch-disk upper layer each clone gets its own
//! copy of the disk as it was at the fork.
//!
//! Each guest exec costs ~1 s on PVM hosts, so execs are few.

// Shared with tests/daemon.rs, which uses all of it.
#[allow(dead_code)]
mod daemon_harness;

use daemon_harness::{wait_for, Daemon};
use shoal_client::api::{CreateSandbox, ForkRequest, SandboxState};
use shoal_test_support::debugfs;

/// Seconds since the epoch on the host.
fn host_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Shell: waits (up to 60 s) until the background writer has put a
/// non-empty id in /tmp/state, then prints it. (A fixed `sleep 1` was too
/// short on a loaded PVM host, where the writer's fork+exec alone can
/// take seconds; the loop also steps over the moment the file is
/// truncated for a rewrite.)
const READ_STATE: &str = "i=0; s=; while [ -z \"$s\" ] && [ $i -lt 300 ]; do \
    sleep 0.2; s=$(cat /tmp/state 2>/dev/null); i=$((i+1)); done; echo \"$s\"";

/// The fork snapshots left in the daemon's state directory.
fn fork_dirs(d: &Daemon) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(d.dir.join("forks"))
        .map(|r| r.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

#[test]
fn forked_clones_carry_memory_and_files_then_diverge() {
    let mut d = Daemon::start(&["--no-pools"]);
    let src = d.create(CreateSandbox::default());
    // A process whose state (a random id) lives only in its memory; it
    // writes it out every 0.2 s.
    let out = d.sh(
        &src.id,
        &format!(
            "echo from-source > /tmp/file; \
         setsid sh -c 'x=$(cat /proc/sys/kernel/random/uuid); \
           while :; do echo $x > /tmp/state; sleep 0.2; done' </dev/null >/dev/null 2>&1 & \
         {READ_STATE}"
        ),
    );
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let state = out.stdout.trim().to_string();
    assert_eq!(state.len(), 36, "a uuid: {out:?}");

    let f = d.must("fork", d.c.fork(&src.id, &ForkRequest::new(3)));
    assert_eq!(f.source, src.id);
    assert!(f.failed.is_empty(), "{:?}", f.failed);
    assert_eq!(f.sandboxes.len(), 3);
    assert!(fork_dirs(&d).is_empty(), "the fork's snapshot is removed");
    assert_eq!(d.state(&src.id), SandboxState::Running);

    // Each clone: the file, and the process with its in-memory state (the
    // state file removed first: only the process can write it again);
    // then a random id, the time, and a file of its own.
    let mut uuids = vec![];
    for (i, c) in f.sandboxes.iter().enumerate() {
        assert_eq!(c.state, SandboxState::Running);
        assert_eq!(c.template, src.template);
        let before = host_now();
        let out = d.sh(
            &c.id,
            &format!(
                "cat /tmp/file; rm -f /tmp/state; {READ_STATE}; \
                 cat /proc/sys/kernel/random/uuid; date +%s; echo clone-{i} > /tmp/mine"
            ),
        );
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(lines.len(), 4, "{out:?}");
        assert_eq!(lines[0], "from-source", "clone {i} sees the file: {out:?}");
        assert_eq!(
            lines[1], state,
            "clone {i}'s copy of the process goes on with its memory: {out:?}"
        );
        uuids.push(lines[2].to_string());
        let t: f64 = lines[3].parse().unwrap();
        assert!(
            t >= before.floor() - 2.0 && t <= host_now() + 2.0,
            "clone {i}'s clock is current: {t} vs {before}"
        );
    }
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 3, "each clone has its own entropy: {uuids:?}");

    // They diverged: each has its own file; the source has none of them
    // and its process goes on.
    for (i, c) in f.sandboxes.iter().enumerate() {
        let out = d.sh(&c.id, "cat /tmp/mine");
        assert_eq!(out.stdout, format!("clone-{i}\n"), "{out:?}");
    }
    let out = d.sh(
        &src.id,
        &format!("cat /tmp/mine 2>&1; rm -f /tmp/state; {READ_STATE}"),
    );
    assert!(out.stdout.contains("No such file"), "{out:?}");
    assert!(out.stdout.ends_with(&format!("{state}\n")), "{out:?}");

    // The clones outlive their source, and a daemon killed with them
    // running finds them again (the same VMMs, recorded).
    d.kill(&src.id);
    d.kill9();
    d.spawn();
    for c in &f.sandboxes {
        let v = d.get(&c.id).expect("the clone is recorded");
        assert_eq!(v.state, SandboxState::Running, "{v:?}");
        assert_eq!(v.pid, c.pid, "the same VMM, reattached");
    }
    let c = &f.sandboxes[0];
    assert_eq!(d.sh(&c.id, "cat /tmp/mine").stdout, "clone-0\n");
    for c in &f.sandboxes {
        d.kill(&c.id);
    }
    wait_for("every VMM to end", 10, || d.vmms().is_empty());
    d.assert_no_sandbox_dirs();
}

#[test]
fn forked_clones_get_their_own_copy_of_a_scratch_disk() {
    let d = Daemon::start(&["--no-pools"]);
    let src = d.create(CreateSandbox {
        upper_disk_mib: Some(32),
        ..Default::default()
    });
    let out = d.sh(&src.id, "echo src > /who && sync && echo wrote");
    assert_eq!(out.stdout, "wrote\n", "{out:?}");
    let f = d.must("fork", d.c.fork(&src.id, &ForkRequest::new(2)));
    assert_eq!(f.sandboxes.len(), 2, "{:?}", f.failed);
    assert!(fork_dirs(&d).is_empty(), "the fork's snapshot is removed");
    let (a, b) = (&f.sandboxes[0].id, &f.sandboxes[1].id);
    let out = d.sh(a, "cat /who; echo a > /who && sync && cat /who");
    assert_eq!(out.stdout, "src\na\n", "{out:?}");
    let out = d.sh(b, "cat /who");
    assert_eq!(out.stdout, "src\n", "b does not see a's write: {out:?}");
    let disk = |id: &str| d.dir.join("sandboxes").join(id).join("scratch.ext4");
    assert_eq!(debugfs(&disk(a), "cat /upper/who"), "a\n");
    assert_eq!(debugfs(&disk(&src.id), "cat /upper/who"), "src\n");
    // Paused and resumed, a clone keeps its own disk.
    d.must("pause", d.c.pause(a));
    assert_eq!(d.sh(a, "cat /who").stdout, "a\n");
    for id in [&src.id, a, b] {
        d.kill(id);
    }
    wait_for("every VMM to end", 10, || d.vmms().is_empty());
    d.assert_no_sandbox_dirs();
}
