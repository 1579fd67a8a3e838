//! A `vm` sandbox (QEMU q35) through shoald: a vm template from our
//! kernel and the tiny image, a sandbox created from it as any other,
//! exec, a PNG of its screen, input, a fork into two clones that diverge,
//! pause and resume, and a kill that leaves nothing (one boot: ~20-45 s
//! on a PVM host); and a vm template without the agent, whose exec and
//! files go through a shell on its serial console (a second boot).
//! Needs /dev/kvm and QEMU.

#[allow(dead_code)] // shared with the daemon tests; this binary uses part
mod daemon_harness;

use daemon_harness::{wait_for, Daemon};
use shoal_client::api::{
    self, CreateTemplate, ExecRequest, ForkRequest, SandboxState, TemplateState,
};
use shoal_client::Body;
use std::path::PathBuf;

fn qemus(d: &Daemon) -> usize {
    shoal_runtime::vm::processes_under(&d.dir, "qemu-system-x86_64").len()
}

/// The QEMU cgroups (`shoal/qemu-<sandbox>-<pid>`, any controller) of the
/// sandboxes `ids`.
fn qemu_cgroups(ids: &[&str]) -> Vec<PathBuf> {
    let mut found = vec![];
    for ctrl in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten() {
        let shoal = ctrl.unwrap().path().join("shoal");
        for e in std::fs::read_dir(&shoal).into_iter().flatten() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if ids
                .iter()
                .any(|id| name.starts_with(&format!("qemu-{id}-")))
            {
                found.push(p);
            }
        }
    }
    found
}

/// Makes vm template `name` (`agent`: false for a console shell instead)
/// and waits until it is ready.
fn vm_template(d: &Daemon, name: &str, agent: Option<bool>) -> api::Template {
    let mut req = CreateTemplate::new(name, "tiny");
    req.kind = Some("vm".into());
    req.agent = agent;
    let t = d.must("vm template", d.c.create_template(&req));
    wait_for("the vm template", 300, || {
        let t = d.must("template", d.c.template(name));
        assert_ne!(t.state, TemplateState::Failed, "{t:?}\n{}", d.log());
        t.state == TemplateState::Ready
    });
    t
}

#[test]
fn a_vm_sandbox_through_the_daemon() {
    let d = Daemon::start(&[]);
    let t = vm_template(&d, "desk", None);
    assert_eq!(t.memory_mib, 256, "a vm template's default memory");
    // What the vm kind does not take is refused, clearly.
    let (status, _, m) = d.err(
        "POST",
        "/v1/templates",
        r#"{"name":"upper","image":"tiny","kind":"vm","upper_size_mib":64}"#,
    );
    assert_eq!((status, m.contains("upper layer")), (400, true), "{m}");
    let (status, _, m) = d.err("PUT", "/v1/pools/desk", r#"{"target":1}"#);
    assert_eq!((status, m.contains("warm pools")), (400, true), "{m}");

    let s = d.restore("desk");
    assert_eq!(qemus(&d), 1, "one QEMU for the sandbox");
    let out = d.sh(&s.id, "echo hello from q35");
    assert_eq!(out.stdout.trim(), "hello from q35", "{out:?}");

    let path = format!("/v1/sandboxes/{}/screen", s.id);
    let r = d.must(
        "screen",
        d.c.request("GET", &path, Body::Empty).and_then(|r| r.ok()),
    );
    assert_eq!(r.header("content-type"), Some("image/png"));
    let png = d.must("screen bytes", r.bytes());
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 100,
        "{} bytes",
        png.len()
    );

    let path = format!("/v1/sandboxes/{}/input", s.id);
    let ok = r#"{"events":[{"type":"key","key":"shift","down":true},{"type":"key","key":"shift","down":false},{"type":"move","x":100,"y":200}]}"#;
    let r = d.must(
        "input",
        d.c.request("POST", &path, Body::Json(ok.as_bytes().to_vec())),
    );
    assert_eq!(r.status, 204);
    let (status, _, m) = d.err(
        "POST",
        &path,
        r#"{"events":[{"type":"move","x":0,"y":40000}]}"#,
    );
    assert_eq!(status, 400, "{m}");

    // Fork: a file written in the sandbox, two clones restored from one
    // snapshot of it; each sees the file, and their writes diverge.
    let out = d.sh(&s.id, "echo from-parent > /tmp/file && echo wrote");
    assert_eq!(out.stdout, "wrote\n", "{out:?}");
    let f = d.must("fork", d.c.fork(&s.id, &ForkRequest::new(2)));
    assert!(f.failed.is_empty(), "{:?}", f.failed);
    assert_eq!(f.sandboxes.len(), 2);
    assert_eq!(qemus(&d), 3, "a QEMU per clone, the parent's goes on");
    let forks = std::fs::read_dir(d.dir.join("forks")).map_or(0, Iterator::count);
    assert_eq!(forks, 0, "the fork's snapshot is removed");
    let (a, b) = (f.sandboxes[0].id.clone(), f.sandboxes[1].id.clone());
    for c in [&a, &b] {
        assert_eq!(d.state(c), SandboxState::Running);
        let out = d.sh(c, "cat /tmp/file");
        assert_eq!(out.stdout, "from-parent\n", "clone {c}: {out:?}");
    }
    let out = d.sh(&a, "echo from-a > /tmp/file && cat /tmp/file");
    assert_eq!(out.stdout, "from-a\n", "{out:?}");
    let out = d.sh(&b, "cat /tmp/file; echo from-b > /tmp/b");
    assert_eq!(out.stdout, "from-parent\n", "b does not see a's write");
    let out = d.sh(&s.id, "cat /tmp/file; cat /tmp/b 2>&1");
    assert!(
        out.stdout.starts_with("from-parent\n") && out.stdout.contains("No such file"),
        "the parent sees neither clone's write: {out:?}"
    );
    // One clone paused to disk (its QEMU ends) and resumed (a new one).
    let p = d.must("pause", d.c.pause(&a));
    assert_eq!(p.state, SandboxState::Paused);
    wait_for("the paused clone's QEMU to end", 30, || qemus(&d) == 2);
    let r = d.must("resume", d.c.resume(&a));
    assert_eq!(r.state, SandboxState::Running);
    assert_eq!(d.sh(&a, "cat /tmp/file").stdout, "from-a\n");
    assert_eq!(d.sh(&b, "cat /tmp/b").stdout, "from-b\n");

    let ids = [s.id.as_str(), a.as_str(), b.as_str()];
    for id in ids {
        d.kill(id);
    }
    wait_for("every QEMU to end", 30, || qemus(&d) == 0);
    d.assert_no_sandbox_dirs();
    wait_for("their cgroups to go", 15, || qemu_cgroups(&ids).is_empty());
}

#[test]
fn a_vm_without_the_agent_through_its_serial_console() {
    let d = Daemon::start(&[]);
    // Only a vm template can go without the agent.
    let (status, _, m) = d.err(
        "POST",
        "/v1/templates",
        r#"{"name":"micro","image":"tiny","agent":false}"#,
    );
    assert_eq!((status, m.contains("vm")), (400, true), "{m}");
    vm_template(&d, "plain", Some(false));
    let s = d.restore("plain");
    let id = s.id.as_str();

    // Exec: output (stdout and stderr together, as a console has one
    // stream), exit codes, argv, environment.
    let out = d.sh(id, "echo hello; echo oops >&2; uname -s");
    assert_eq!(out.stdout, "hello\noops\nLinux\n", "{out:?}");
    assert_eq!(out.exit_code, Some(0));
    let out = d.sh(id, "exit 3");
    assert_eq!((out.exit_code, out.timed_out), (Some(3), false), "{out:?}");
    let mut req = ExecRequest::argv(["printf", "%s|", "a b", "it's"]);
    req.env.insert("GREETING".into(), "hi there".into());
    let out = d.must("argv", d.c.exec(id, &req));
    assert_eq!(out.stdout, "a b|it's|", "{out:?}");
    let out = d.sh(id, "echo \"$GREETING\"");
    assert_eq!(out.stdout, "\n", "env is per exec: {out:?}");

    // A command that prints end markers of its own (any nonce but the
    // call's, which it cannot know) does not end the call or set its code.
    let fake = "for n in 0123456789abcdef01234567 $(cat /proc/sys/kernel/random/uuid | tr -d -); \
                do printf '%s-e 0\\n' $n; done; echo after; exit 5";
    let out = d.sh(id, fake);
    assert_eq!(out.exit_code, Some(5), "{out:?}");
    assert!(out.stdout.ends_with("-e 0\nafter\n"), "{out:?}");

    // Files: a binary round trip, stat, a missing file.
    // Every byte value (small: each byte crosses an emulated UART, slow
    // on a loaded PVM host).
    let data: Vec<u8> = (0..=255u8).rev().chain(0..=255u8).collect();
    let up = d.must(
        "upload",
        d.c.put_file(id, &api::UploadQuery::new("/tmp/blob"), &mut &data[..]),
    );
    assert_eq!(up.bytes, 512);
    let st = d.must("stat", d.c.stat(id, "/tmp/blob"));
    assert_eq!((st.r#type, st.size), (api::FileType::File, 512));
    let mut dl = d.must("download", d.c.get_file(id, "/tmp/blob"));
    let mut down = Vec::new();
    std::io::Read::read_to_end(&mut dl, &mut down).unwrap();
    assert!(down == data, "download differs from upload");
    assert_eq!(d.sh(id, "md5sum < /tmp/blob").exit_code, Some(0));
    let e = d.c.stat(id, "/tmp/none").unwrap_err();
    assert!(e.to_string().contains("No such file"), "{e}");

    // A command over its time limit is ended in the guest and reported
    // as timed out; the console goes on.
    let req = ExecRequest::shell("sleep 60; echo never").with_timeout(2.0);
    let out = d.must("timed out", d.c.exec(id, &req));
    assert!(out.timed_out, "{out:?}");
    assert!(!out.stdout.contains("never"), "{out:?}");
    assert_eq!(d.sh(id, "echo still here").stdout, "still here\n");

    // Paused to disk and resumed: a new QEMU, a new console socket, the
    // same shell and files.
    d.must("pause", d.c.pause(id));
    wait_for("the paused sandbox's QEMU to end", 30, || qemus(&d) == 0);
    d.must("resume", d.c.resume(id));
    let out = d.sh(id, "wc -c < /tmp/blob");
    assert_eq!(out.stdout.trim(), "512", "{out:?}");

    d.kill(id);
    wait_for("the sandbox's QEMU to end", 30, || qemus(&d) == 0);
    d.assert_no_sandbox_dirs();
    wait_for("its cgroup to go", 15, || qemu_cgroups(&[id]).is_empty());
}
