//! `vm` templates from a caller's own disk through shoald (issue 19): a
//! small ext4 disk made here from the tiny image's files (busybox and the
//! agent), as raw and as qcow2, each a template booted with our kernel
//! (`root=/dev/vda rw`, `init=` the agent inside the disk); sandboxes of
//! them exec and write, a second sandbox does not see the first's writes,
//! the base files are never written, the template's disk survives a
//! daemon restart, and bad disks get clear 400s. Two boots (~20-45 s each
//! on a PVM host). Needs /dev/kvm, QEMU, mkfs.ext4 and fsck.erofs.

#[allow(dead_code)] // shared with the daemon tests; this binary uses part
mod daemon_harness;

use daemon_harness::{wait_for, Daemon};
use shoal_client::api::{CreateTemplate, Template, TemplateState};
use std::path::{Path, PathBuf};
use std::process::Command;

fn run(what: &str, cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {:?}: {e}", cmd.get_program()));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn sha256(p: &Path) -> String {
    let out = Command::new("sha256sum").arg(p).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// A 64 MiB ext4 disk of the tiny image's files, with the agent also at
/// the default init path, in `dir`: (`disk.raw`, `disk.qcow2`).
fn make_disks(dir: &Path) -> (PathBuf, PathBuf) {
    let tiny = shoal_test_support::artifacts()
        .image("tiny")
        .expect("the tiny image");
    let root = dir.join("root");
    run(
        "fsck.erofs --extract (erofs-utils)",
        Command::new("fsck.erofs")
            .arg(format!("--extract={}", root.display()))
            .arg(&tiny),
    );
    std::fs::create_dir_all(root.join("usr/local/sbin")).unwrap();
    std::fs::copy(
        root.join("sbin/shoal-agent"),
        root.join("usr/local/sbin/shoal-agent"),
    )
    .unwrap();
    let raw = dir.join("disk.raw");
    run(
        "mkfs.ext4 -d (e2fsprogs)",
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "shoal", "-E", "root_owner=0:0", "-d"])
            .arg(&root)
            .arg(&raw)
            .arg("64M"),
    );
    let qcow2 = dir.join("disk.qcow2");
    run(
        "qemu-img convert",
        Command::new("qemu-img")
            .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
            .arg(&raw)
            .arg(&qcow2),
    );
    std::fs::remove_dir_all(&root).unwrap();
    (raw, qcow2)
}

fn disk_req(name: &str, disk: &Path) -> CreateTemplate {
    let mut req = CreateTemplate::new(name, "");
    req.kind = Some("vm".into());
    req.disk = Some(disk.display().to_string());
    req
}

fn qemus(d: &Daemon) -> usize {
    shoal_runtime::vm::processes_under(&d.dir, "qemu-system-x86_64").len()
}

fn wait_ready(d: &Daemon, name: &str) -> Template {
    wait_for(name, 600, || {
        let t = d.must("template", d.c.template(name));
        assert_ne!(t.state, TemplateState::Failed, "{t:?}\n{}", d.log());
        t.state == TemplateState::Ready
    });
    d.must("template", d.c.template(name))
}

/// A `POST /v1/templates` body for a vm disk, and the 400 it must get
/// with `words` in its message.
fn refused(d: &Daemon, body: &str, words: &str) {
    let (status, _, m) = d.err("POST", "/v1/templates", body);
    assert_eq!(
        (status, m.contains(words)),
        (400, true),
        "{body}: {status} {m}"
    );
}

#[test]
fn vm_templates_from_raw_and_qcow2_disks() {
    let mut d = Daemon::start(&[]);
    // Disks come from under the daemon's layers directory.
    let layers = d.dir.join("layers");
    std::fs::create_dir_all(&layers).unwrap();
    let (raw, qcow2) = make_disks(&layers);
    let (raw_hash, qcow2_hash) = (sha256(&raw), sha256(&qcow2));

    // Bad disks, each a clear 400 before anything boots.
    let body = |p: &Path| {
        format!(
            r#"{{"name":"bad","kind":"vm","disk":{}}}"#,
            serde_json::json!(p.display().to_string())
        )
    };
    let junk = layers.join("junk.img");
    std::fs::write(&junk, vec![b'x'; 4 << 20]).unwrap();
    refused(&d, &body(&junk), "not a disk image");
    let backed = layers.join("backed.qcow2");
    run(
        "qemu-img create -b",
        Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&raw)
            .arg(&backed),
    );
    refused(&d, &body(&backed), "backing file");
    refused(&d, &body(&layers.join("missing.qcow2")), "no such file");
    std::fs::create_dir_all(layers.join("adir")).unwrap();
    refused(&d, &body(&layers.join("adir")), "directory");
    refused(&d, &body(Path::new("/etc/passwd")), "not allowed");
    refused(
        &d,
        r#"{"name":"bad","kind":"vm","disk":"rel.raw"}"#,
        "absolute",
    );
    let fmt = format!(
        r#"{{"name":"bad","kind":"vm","disk":{},"disk_format":"raw"}}"#,
        serde_json::json!(qcow2.display().to_string())
    );
    refused(&d, &fmt, "it is qcow2");
    let init = format!(
        r#"{{"name":"bad","kind":"vm","disk":{},"disk_init":"/sbin/a b"}}"#,
        serde_json::json!(raw.display().to_string())
    );
    refused(&d, &init, "init");
    let microvm = format!(
        r#"{{"name":"bad","image":"tiny","disk":{}}}"#,
        serde_json::json!(raw.display().to_string())
    );
    refused(&d, &microvm, "\"kind\": \"vm\"");
    assert!(d.must("templates", d.c.templates()).is_empty());

    // A template from each: the raw one with the default init path, the
    // qcow2 one with the agent where the tiny image has it.
    let t = d.must("raw template", d.c.create_template(&disk_req("raw", &raw)));
    assert_eq!(t.source, format!("disk:{}", raw.display()));
    let mut q = disk_req("q", &qcow2);
    q.disk_init = Some("/sbin/shoal-agent".into());
    d.must("qcow2 template", d.c.create_template(&q));
    let t = wait_ready(&d, "raw");
    let disk = t.disk.expect("the raw template's disk");
    assert_eq!(
        (disk.format.as_str(), disk.kernel.as_str()),
        ("raw", "shoal")
    );
    assert_eq!(disk.root.as_deref(), Some("/dev/vda"));
    assert_eq!(disk.init.as_deref(), Some("/usr/local/sbin/shoal-agent"));
    let t = wait_ready(&d, "q");
    assert_eq!(t.disk.expect("the qcow2 template's disk").format, "qcow2");

    // Sandboxes run on the disk's own ext4, each on its own overlay.
    let s1 = d.restore("raw");
    let out = d.sh(
        &s1.id,
        "awk '$2 == \"/\" {print $3}' /proc/mounts; echo one > /root/mark; cat /root/mark",
    );
    assert_eq!(out.stdout, "ext4\none\n", "{out:?}");
    let s2 = d.restore("raw");
    let out = d.sh(&s2.id, "cat /root/mark 2>&1 || echo absent");
    assert!(out.stdout.ends_with("absent\n"), "{out:?}");
    let s3 = d.restore("q");
    let out = d.sh(
        &s3.id,
        "test -e /root/mark || echo absent; echo x > /root/x",
    );
    assert_eq!(out.stdout, "absent\n", "{out:?}");

    // The disk is the template's after a restart (kept in SQLite), and a
    // sandbox still restores from it.
    for s in [&s1, &s2, &s3] {
        d.kill(&s.id);
    }
    wait_for("the sandboxes' QEMUs to end", 60, || qemus(&d) == 0);
    d.kill9();
    d.spawn();
    let t = d.must("template after restart", d.c.template("q"));
    let disk = t.disk.expect("the disk after a restart");
    assert_eq!(
        (disk.path, disk.init.as_deref()),
        (qcow2.display().to_string(), Some("/sbin/shoal-agent"))
    );
    let s4 = d.restore("q");
    let out = d.sh(&s4.id, "test -e /root/x || echo absent");
    assert_eq!(out.stdout, "absent\n", "{out:?}");
    d.kill(&s4.id);
    wait_for("the last QEMU to end", 60, || qemus(&d) == 0);

    // Never written.
    assert_eq!(sha256(&raw), raw_hash, "the raw base changed");
    assert_eq!(sha256(&qcow2), qcow2_hash, "the qcow2 base changed");
    d.assert_no_sandbox_dirs();
}
