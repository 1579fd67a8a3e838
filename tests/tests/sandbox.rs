//! Sandboxes restored from a template on /dev/kvm, driven through the guest
//! agent over vsock: exec, files, re-attach, a fork bomb and a memory hog
//! that must not take the agent down, a guest flooding a connection that
//! must not grow VMM memory, a host CONNECT the guest cannot answer that
//! the VMM closes after its connect timeout, and snapshot clones that keep
//! a running process and a written file yet diverge independently.
//!
//! Slow on PVM hosts (each guest fork+exec takes ~0.5-1 s), so few and
//! coarse; one template is booted per test binary.

use agent_client::{ExecEvent, ExecRequest, ExitStatus, UploadOptions};
use shoal_test_support::{file_data, sh, tiny_template, RunningSandbox};
use std::time::{Duration, Instant};

fn vmm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn exec_files_and_reattach() {
    let (r, c) = RunningSandbox::start(&tiny_template());
    let (out, err, st) = sh(&c, "echo out; echo err >&2; exit 3");
    assert_eq!(
        (out.as_str(), err.as_str(), st),
        ("out\n", "err\n", ExitStatus::Exited(3))
    );

    // File round trip (1 MiB; guest-side copies are slow on PVM hosts).
    let data = file_data(1 << 20);
    c.upload(&mut &data[..], "/tmp/blob", UploadOptions::default())
        .unwrap();
    assert_eq!(c.stat("/tmp/blob").unwrap().size, data.len() as u64);
    assert_eq!(c.read_file("/tmp/blob").unwrap(), data);

    // Re-attach after the client goes away mid-command.
    let h = c
        .exec(&ExecRequest::argv([
            "/bin/sh",
            "-c",
            "sleep 2; echo finished",
        ]))
        .unwrap();
    let id = h.exec_id();
    drop(h);
    drop(c);
    let c2 = r.sb.connect(Duration::from_secs(30), false).unwrap();
    let out = c2.attach(id).unwrap().wait().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "finished\n");
    assert_eq!(out.result.status, ExitStatus::Exited(0));
}

#[test]
fn agent_survives_fork_bomb_and_memory_hog() {
    let (_r, c) = RunningSandbox::start(&tiny_template());
    // A fork bomb, limited to 20 s: the agent must keep answering, and the
    // timeout must kill every process of it.
    let bomb = c
        .exec(
            &ExecRequest::argv(["/bin/sh", "-c", "b() { b | b & }; b; sleep 600"])
                .with_timeout(Duration::from_secs(20)),
        )
        .unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let t = Instant::now();
    c.health().expect("agent answers during a fork bomb");
    eprintln!("health during fork bomb: {:?}", t.elapsed());
    let res = bomb.wait().unwrap().result;
    assert!(res.timed_out, "the bomb was stopped by its timeout");
    let (out, _, _) = sh(&c, "echo alive");
    assert_eq!(out, "alive\n", "the guest recovers after the bomb");
    // Killed processes take a while to exit on a slow guest: poll.
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let (out, _, _) = sh(&c, "ps | grep -c '[s]h -c b()'");
        if out.trim() == "0" {
            break;
        }
        assert!(
            Instant::now() < end,
            "bomb processes survived their timeout: {out}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }

    // A memory hog: a 160 MB buffer in a 128 MiB guest. The user cgroup's
    // limit (or the OOM killer) kills it, not the agent.
    let hog = c
        .exec_simple(
            &ExecRequest::argv([
                "/bin/dd",
                "if=/dev/zero",
                "of=/dev/null",
                "bs=160M",
                "count=1",
            ])
            .with_timeout(Duration::from_secs(240)),
        )
        .unwrap();
    assert_ne!(
        hog.result.status,
        ExitStatus::Exited(0),
        "the hog did not get its memory"
    );
    c.health().expect("agent answers after the memory hog");
    let (out, _, _) = sh(&c, "echo still-alive");
    assert_eq!(out, "still-alive\n");
}

#[test]
fn guest_flood_does_not_grow_vmm_memory() {
    let (r, c) = RunningSandbox::start(&tiny_template());
    let pid = r.vmm_pid();
    let before = vmm_rss_kib(pid);
    // The guest writes as fast as it can; this client never reads, so the
    // agent, the guest's vsock credit and the VMM's per-connection buffer
    // must all hold the flood back.
    let h = c
        .exec(&ExecRequest::argv(["/bin/cat", "/dev/zero"]).with_timeout(Duration::from_secs(60)))
        .unwrap();
    std::thread::sleep(Duration::from_secs(10));
    let during = vmm_rss_kib(pid);
    assert!(
        during < before + 8 * 1024,
        "VMM RSS grew from {before} KiB to {during} KiB under a flood"
    );
    // Reading resumes the stream; stop it.
    let mut h = h;
    let mut got = 0usize;
    while got < 1 << 20 {
        match h.next_event().unwrap() {
            Some(ExecEvent::Stdout(d)) => got += d.len(),
            Some(_) => {}
            None => break,
        }
    }
    assert!(got >= 1 << 20, "data flows once the client reads");
    // Stop it. The handle goes first: a stream nobody reads stalls the
    // connection (the client's documented contract), and the signal's
    // reply comes on that connection.
    let id = h.exec_id();
    drop(h);
    c.signal(id, 9, true).unwrap();
}

#[test]
fn snapshot_clones_keep_state_and_diverge() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    {
        let (r, c) = RunningSandbox::start(&tiny_template());
        // A background process holding a value in memory (it dumps it on
        // SIGUSR1) and a file in the writable layer.
        let (out, _, st) = sh(
            &c,
            "echo written-before-snapshot > /tmp/f; \
             (v=held-in-memory; trap 'echo $v > /tmp/dump' USR1; \
              while :; do sleep 1; done) >/dev/null 2>&1 & echo $! > /tmp/pid; echo ok",
        );
        assert_eq!((out.as_str(), st), ("ok\n", ExitStatus::Exited(0)));
        let info = vmm_api::Client::new(&r.sb.api_sock, Duration::from_secs(120))
            .snapshot(&snap, false)
            .unwrap();
        assert_eq!(info.dir, snap);
    }
    let mut randoms = Vec::new();
    for i in 0..3 {
        let (_r, c) = RunningSandbox::start(&snap);
        let (out, _, _) = sh(&c, "cat /tmp/f");
        assert_eq!(out, "written-before-snapshot\n", "clone {i} sees the file");
        let (out, _, _) = sh(
            &c,
            "kill -USR1 $(cat /tmp/pid); sleep 2; cat /tmp/dump; \
             ls /tmp/mine-* 2>/dev/null; echo clone-$0 > /tmp/mine-x",
        );
        assert!(out.starts_with("held-in-memory\n"), "clone {i}: {out:?}");
        assert!(
            !out.contains("/tmp/mine-"),
            "clone {i} saw another clone's file"
        );
        let (r16, _, _) = sh(&c, "head -c 16 /dev/urandom | od -An -tx1");
        randoms.push(r16);
        let (secs, _, _) = sh(&c, "date +%s");
        let guest: i64 = secs.trim().parse().unwrap();
        let host = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            .cast_signed();
        assert!(
            (guest - host).abs() < 30,
            "clone {i} clock {guest} vs host {host}"
        );
    }
    randoms.sort();
    randoms.dedup();
    assert_eq!(randoms.len(), 3, "clones must not share randomness");
}

#[test]
fn a_connect_the_guest_cannot_answer_is_closed_and_the_agent_still_answers() {
    use std::io::{Read, Write};
    let (r, c) = RunningSandbox::start(&tiny_template());
    // Paused vCPUs: the guest cannot answer the REQUEST.
    let ctl = vmm_api::Client::new(&r.sb.api_sock, Duration::from_secs(30));
    ctl.pause().expect("pause");
    let mut s = std::os::unix::net::UnixStream::connect(&r.sb.vsock).unwrap();
    s.write_all(b"CONNECT 5000\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let t0 = Instant::now();
    let mut b = [0u8; 64];
    let n = s.read(&mut b).expect("closed, not timed out");
    let took = t0.elapsed();
    assert_eq!(n, 0, "an answer from a paused guest: {:?}", &b[..n]);
    let timeout = devices::virtio::vsock::CONNECT_TIMEOUT;
    assert!(
        took >= timeout - Duration::from_millis(100) && took < timeout + Duration::from_secs(3),
        "closed after {took:?} (connect timeout {timeout:?})"
    );
    ctl.resume().expect("resume");
    // The guest saw the REQUEST and then the RST; its agent still answers,
    // on the old connection and on a new one.
    let (out, _, _) = sh(&c, "echo alive");
    assert_eq!(out, "alive\n");
    let c2 =
        r.sb.connect(Duration::from_secs(60), false)
            .expect("a new connection");
    let (out, _, _) = sh(&c2, "echo again");
    assert_eq!(out, "again\n");
}
