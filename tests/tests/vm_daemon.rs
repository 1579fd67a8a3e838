//! A `vm` sandbox (QEMU q35) through shoald: a vm template from our
//! kernel and the tiny image, a sandbox created from it as any other,
//! exec, a PNG of its screen, input, and a kill that leaves nothing
//! (one boot: ~20-45 s on a PVM host). Needs /dev/kvm and QEMU.

#[allow(dead_code)] // shared with the daemon tests; this binary uses part
mod daemon_harness;

use daemon_harness::{wait_for, Daemon};
use shoal_client::api::{CreateTemplate, TemplateState};
use shoal_client::Body;

fn qemus(d: &Daemon) -> usize {
    shoal_runtime::vm::processes_under(&d.dir, "qemu-system-x86_64").len()
}

#[test]
fn a_vm_sandbox_through_the_daemon() {
    let d = Daemon::start(&[]);
    let mut req = CreateTemplate::new("desk", "tiny");
    req.kind = Some("vm".into());
    let t = d.must("vm template", d.c.create_template(&req));
    assert_eq!(t.memory_mib, 256, "a vm template's default memory");
    wait_for("the vm template", 300, || {
        let t = d.must("template", d.c.template("desk"));
        assert_ne!(t.state, TemplateState::Failed, "{t:?}\n{}", d.log());
        t.state == TemplateState::Ready
    });
    // What the vm kind does not take is refused, clearly.
    let (status, _, m) = d.err(
        "POST",
        "/v1/templates",
        r#"{"name":"net","image":"tiny","kind":"vm","network":true}"#,
    );
    assert_eq!((status, m.contains("network")), (400, true), "{m}");
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

    d.kill(&s.id);
    wait_for("the sandbox's QEMU to end", 30, || qemus(&d) == 0);
    d.assert_no_sandbox_dirs();
}
