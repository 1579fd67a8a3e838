//! Container sandboxes on real guests (/dev/kvm) through a real shoald:
//! an OCI image built here from local files (busybox-static, no shell: no
//! `/bin/sh`; a second layer that adds a file and whites one out; a
//! non-root `USER` by name), pushed to a real registry (Debian's
//! `docker-registry` on loopback, `skopeo copy`), pulled into the daemon's
//! image store, then `{"image": REF}` creates. What a command in it sees:
//! files of both layers and not the whited-out one, the image's env, cwd
//! and user as defaults, writes in the upper layer (kept over a pause,
//! never in the next sandbox), nothing of the agent's layer; an empty
//! `cmd` runs the image's Entrypoint + Cmd; the second create restores the
//! template the first booted; a snapshot of a sandbox keeps the image's
//! defaults; the CLI's `shoal run --image REF [-- CMD]`. Then a musl image
//! of 12 layers (more than a guest takes: the lowest 5 merged on the host)
//! with whiteouts and opaque directories on both sides of the merge: its
//! dynamically linked musl program runs, busybox is its `/bin/sh`.
//!
//! Two template boots (~20-60 s each on a PVM host), one daemon and one
//! registry. Needs root, /dev/kvm, `docker-registry`, `skopeo`,
//! `busybox-static` and `musl-tools`.

#[allow(dead_code)] // shared with the daemon tests; this binary uses part
mod daemon_harness;

use daemon_harness::Daemon;
use image_store::registry::{pull, PullOptions};
use image_store::Store;
use shoal_client::api::{
    CreateSandbox, ErrorCode, ExecRequest, ExecResult, Sandbox, SandboxState, SnapshotRequest,
};
use shoal_client::ClientError;
use shoal_test_support::registry::{push, tar_of, write_layout, Entry, Registry};
use std::path::Path;
use std::process::Command;

/// The two-layer test image at tag `1` in an OCI layout at `layout`.
fn build_image(layout: &Path) {
    let busybox =
        std::fs::read("/bin/busybox").expect("/bin/busybox (apt-get install busybox-static)");
    let base = tar_of(&[
        Entry::Dir("bin/"),
        Entry::File("bin/busybox", 0o755, &busybox),
        Entry::Dir("etc/"),
        Entry::File(
            "etc/passwd",
            0o644,
            b"root:x:0:0:root:/root:/bin/false\napp:x:1000:1001::/home/app:/bin/false\n",
        ),
        Entry::File("etc/group", 0o644, b"root:x:0:\napp:x:1001:\n"),
        Entry::File("etc/gone", 0o644, b"whited out above"),
        Entry::DirMode("data/", 0o777),
        Entry::File("data/base.txt", 0o644, b"base"),
    ]);
    let top = tar_of(&[
        Entry::Dir("etc/"),
        Entry::File("etc/.wh.gone", 0o644, b""),
        Entry::DirMode("data/", 0o777),
        Entry::File("data/top.txt", 0o644, b"top"),
    ]);
    let config = serde_json::json!({
        "Env": ["PATH=/bin", "FROM_IMAGE=yes", "A=image"],
        "WorkingDir": "/data",
        "User": "app",
        "Entrypoint": ["busybox", "cat"],
        "Cmd": ["/data/top.txt"],
    });
    write_layout(layout, "1", &[(base, true), (top, false)], config);
}

/// Runs `argv` in `id`: (exit code, stdout).
fn run(d: &Daemon, id: &str, argv: &[&str]) -> (Option<i32>, String) {
    let req = ExecRequest::argv(argv.iter().copied()).with_timeout(120.0);
    let r: ExecResult = d.must(&argv.join(" "), d.c.exec(id, &req));
    (r.exit_code, r.stdout)
}

/// A create of `image`, retried while its template is still being built
/// (504: the daemon waits 120 s for a build, and a loaded PVM host can
/// take longer).
fn create(d: &Daemon, image: &str) -> Sandbox {
    let req = CreateSandbox {
        image: Some(image.into()),
        env: [("A".to_string(), "request".to_string())].into(),
        ..Default::default()
    };
    for _ in 0..5 {
        match d.c.create(&req) {
            Ok(s) => return s,
            Err(ClientError::Api {
                code: Some(ErrorCode::DeadlineExceeded),
                ..
            }) => continue,
            Err(e) => panic!("create of {image}: {e}\n{}", d.log()),
        }
    }
    panic!(
        "the template of {image} was not built in 10 min\n{}",
        d.log()
    );
}

#[test]
fn oci_images_from_a_registry_run_as_container_sandboxes() {
    let d = Daemon::start(&["--no-pools"]);
    let tmp = tempfile::tempdir().unwrap();
    let reg = Registry::start(tmp.path());
    an_image_with_no_shell_and_a_user(&d, &reg, tmp.path());
    a_musl_image_of_twelve_layers(&d, &reg, tmp.path());
}

/// The image of [`build_image`]: layers, whiteout, no shell, the config's
/// defaults (kept by a snapshot), pause, Entrypoint + Cmd, the second
/// create's restore, the CLI.
fn an_image_with_no_shell_and_a_user(d: &Daemon, reg: &Registry, tmp: &Path) {
    let layout = tmp.join("layout");
    build_image(&layout);
    let reference = reg.reference("test/app:1");
    push(tmp, &layout, "1", &reference);
    let store = Store::new(&d.dir.join("images"));
    let img = pull(&store, &reference, &PullOptions::default()).expect("pull");

    let t0 = std::time::Instant::now();
    let a = create(d, &reference);
    eprintln!(
        "first create (template boot): {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(a.template.starts_with("oci-"), "{}", a.template);
    let id = a.id.as_str();
    // Both layers, the whiteout, no shell, no agent layer.
    assert_eq!(
        run(
            d,
            id,
            &["busybox", "cat", "/data/base.txt", "/data/top.txt"]
        ),
        (Some(0), "basetop".into())
    );
    // The rest in one exec (each costs ~1 s of emulated guest kernel on
    // PVM hosts): busybox's own sh, the image has none at /bin/sh.
    let script = "for p in /etc/gone /bin/sh /sbin/shoal-agent /run/shoal/image; do \
                  test -e $p && echo visible $p; done; \
                  echo pwd=$(pwd) uid=$(id -u) gid=$(id -g); env; \
                  cp /data/base.txt /data/mine && echo mine=$(cat mine); cat /proc/mounts";
    let (code, out) = run(d, id, &["busybox", "sh", "-c", script]);
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    // Whited out, no shell, nothing of the agent layer.
    assert!(!out.contains("visible"), "{out}");
    assert!(!out.contains("pmem0"), "the agent layer is mounted: {out}");
    assert!(out.contains("overlay / overlay"), "{out}");
    // The config's defaults: cwd, user by name with its group, env (the
    // request's A wins) with the user's HOME.
    assert!(lines.contains(&"pwd=/data uid=1000 gid=1001"), "{out}");
    for want in ["FROM_IMAGE=yes", "A=request", "PATH=/bin", "HOME=/home/app"] {
        assert!(lines.contains(&want), "{want} not in {out}");
    }
    // Writes go to the upper layer (the image's /data is world-writable).
    assert!(lines.contains(&"mine=base"), "{out}");
    // Paused to disk and resumed by the next exec: the same root, its
    // write kept.
    let v = d.must("pause", d.c.pause(id));
    assert_eq!(v.state, SandboxState::Paused);
    assert_eq!(
        run(d, id, &["busybox", "cat", "mine"]),
        (Some(0), "base".into())
    );
    // No command: Entrypoint + Cmd.
    assert_eq!(run(d, id, &[]), (Some(0), "top".into()));
    // A snapshot of it, and a sandbox of that: the image's cwd, user and
    // env are still its defaults, and its write is there.
    let snap = d.must(
        "snapshot",
        d.c.snapshot(
            id,
            &SnapshotRequest {
                template: Some("app-snap".into()),
            },
        ),
    );
    assert!(
        snap.image
            .as_deref()
            .is_some_and(|i| i.starts_with("sha256:")),
        "the snapshot names its image: {snap:?}"
    );
    let req = CreateSandbox {
        template: Some(snap.name.clone()),
        ..Default::default()
    };
    let s = d.must("a create from the snapshot", d.c.create(&req));
    let script = "echo pwd=$(pwd) uid=$(id -u) gid=$(id -g); cat mine; echo; env";
    let (code, out) = run(d, &s.id, &["busybox", "sh", "-c", script]);
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"pwd=/data uid=1000 gid=1001"), "{out}");
    assert!(lines.contains(&"base"), "the snapshot's write: {out}");
    for want in ["FROM_IMAGE=yes", "A=image", "HOME=/home/app"] {
        assert!(lines.contains(&want), "{want} not in {out}");
    }
    d.kill(&s.id);
    d.must("delete the snapshot", d.c.delete_template(&snap.name));

    // The second create restores the first one's template.
    let templates = d.must("templates", d.c.templates());
    let before: Vec<_> = templates
        .iter()
        .filter(|t| t.source.starts_with("oci:"))
        .collect();
    assert_eq!(before.len(), 1, "{templates:?}");
    assert_eq!(before[0].source, format!("oci:{}", img.image.id));
    let t1 = std::time::Instant::now();
    let b = create(d, &img.image.id);
    eprintln!(
        "second create (restore): {:.2} s",
        t1.elapsed().as_secs_f64()
    );
    assert_eq!(b.template, a.template, "the same template, by id");
    let after = d.must("templates", d.c.templates());
    assert_eq!(
        after.len(),
        templates.len(),
        "no second template: {after:?}"
    );
    let t = after.iter().find(|t| t.name == a.template).unwrap();
    assert_eq!(
        (t.dir.clone(), t.created_at),
        (before[0].dir.clone(), before[0].created_at)
    );
    let script = "test -e /data/mine && echo leaked; cat top.txt";
    assert_eq!(
        run(d, &b.id, &["busybox", "sh", "-c", script]),
        (Some(0), "top".into()),
        "the first sandbox's write is its own"
    );
    d.kill(&a.id);
    d.kill(&b.id);

    // The CLI: `shoal run --image REF` with no command runs Entrypoint +
    // Cmd; with one, that command (as the image's user).
    let shoal = |args: &[&str]| {
        let o = Command::new(shoal_test_support::shoal_cli())
            .arg("--daemon")
            .arg(d.dir.join("shoald.sock"))
            .args(["run", "--memory", "128", "--image", &reference])
            .args(args)
            .output()
            .expect("run shoal");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        (o.status.code(), String::from_utf8(o.stdout).unwrap(), err)
    };
    let (code, out, err) = shoal(&[]);
    assert_eq!((code, out.as_str()), (Some(0), "top"), "{err}");
    let (code, out, err) = shoal(&["--", "busybox", "id", "-un"]);
    assert_eq!((code, out.as_str()), (Some(0), "app\n"), "{err}");
}

/// A musl image of 12 layers (more than a guest takes: its lowest 5 are
/// merged into one on the host), with whiteouts and opaque directories
/// below, within and above the merge: busybox-static as `/bin/sh`, musl's
/// loader, and a program `musl-gcc` links against it here (no glibc in the
/// image at all).
fn build_layered_musl_image(layout: &Path, tmp: &Path) {
    let busybox =
        std::fs::read("/bin/busybox").expect("/bin/busybox (apt-get install busybox-static)");
    let ld = std::fs::read("/lib/ld-musl-x86_64.so.1")
        .expect("/lib/ld-musl-x86_64.so.1 (apt-get install musl musl-tools)");
    let src = tmp.join("hello.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(int c, char **v) { printf(\"hello from musl %s\\n\", \
         c > 1 ? v[1] : \"\"); return 0; }\n",
    )
    .unwrap();
    let hello = tmp.join("hello");
    let st = Command::new("musl-gcc")
        .arg("-O2")
        .arg("-o")
        .arg(&hello)
        .arg(&src)
        .status()
        .expect("musl-gcc (apt-get install musl-tools)");
    assert!(st.success(), "musl-gcc failed");
    let hello = std::fs::read(&hello).unwrap();
    let interp = b"/lib/ld-musl-x86_64.so.1";
    assert!(
        hello.windows(interp.len()).any(|w| w == interp),
        "musl-gcc's program is not linked against musl's loader"
    );
    let mut layers: Vec<Vec<u8>> = vec![
        // 0: the shell and what the whiteouts and opaque directories act on.
        tar_of(&[
            Entry::Dir("bin/"),
            Entry::File("bin/sh", 0o755, &busybox),
            Entry::Dir("data/"),
            f("data/l0", b"0"),
            f("data/gone-in-merge", b"x"),
            f("data/gone-above", b"x"),
            Entry::Dir("opq-in/"),
            f("opq-in/old", b"x"),
            Entry::Dir("opq-above/"),
            f("opq-above/old", b"x"),
        ]),
        // 1: musl's loader (which is its libc too).
        tar_of(&[
            Entry::Dir("lib/"),
            Entry::File("lib/ld-musl-x86_64.so.1", 0o755, &ld),
        ]),
        // 2: the program.
        tar_of(&[
            Entry::Dir("usr/"),
            Entry::Dir("usr/bin/"),
            Entry::File("usr/bin/hello", 0o755, &hello),
        ]),
        // 3: within the merge: a whiteout and an opaque directory.
        tar_of(&[
            Entry::Dir("data/"),
            f("data/.wh.gone-in-merge", b""),
            Entry::Dir("opq-in/"),
            f("opq-in/.wh..wh..opq", b""),
            f("opq-in/new", b"3"),
        ]),
        // 4: the merge's top layer.
        tar_of(&[Entry::Dir("data/"), f("data/l4", b"4")]),
    ];
    // 5..=10: above the merge, one file each, and (8, 9, 10) a whiteout of
    // a file from the merge's bottom, an opaque directory over one of its
    // directories, a whiteout of a file of its top layer.
    let names: Vec<(String, String)> = (5..=10)
        .map(|i| (format!("data/l{i}"), i.to_string()))
        .collect();
    for (i, (name, data)) in (5..=10).zip(&names) {
        let mut e = vec![Entry::Dir("data/"), f(name, data.as_bytes())];
        match i {
            8 => e.push(f("data/.wh.gone-above", b"")),
            9 => e.extend([
                Entry::Dir("opq-above/"),
                f("opq-above/.wh..wh..opq", b""),
                f("opq-above/new", b"9"),
            ]),
            10 => e.push(f("data/.wh.l4", b"")),
            _ => {}
        }
        layers.push(tar_of(&e));
    }
    // 11: the top.
    layers.push(tar_of(&[Entry::Dir("data/"), f("data/l11", b"11")]));
    assert_eq!(layers.len(), 12);
    let config = serde_json::json!({
        "Env": ["PATH=/usr/bin:/bin"],
        "WorkingDir": "/data",
        "Cmd": ["/usr/bin/hello", "cmd"],
    });
    let layers: Vec<(Vec<u8>, bool)> = layers.into_iter().map(|l| (l, true)).collect();
    write_layout(layout, "1", &layers, config);
}

/// A file entry of mode 0644.
fn f<'a>(name: &'a str, data: &'a [u8]) -> Entry<'a> {
    Entry::File(name, 0o644, data)
}

/// The 12-layer musl image: the merged layer made once on the host, the
/// guest's 8 layers showing the right files across the merge, musl's
/// dynamically linked program run (argv form, and as the image's Cmd),
/// busybox as `/bin/sh`, the agent working in a root with no glibc.
fn a_musl_image_of_twelve_layers(d: &Daemon, reg: &Registry, tmp: &Path) {
    let dir = tmp.join("musl");
    std::fs::create_dir_all(&dir).unwrap();
    let layout = dir.join("layout");
    build_layered_musl_image(&layout, &dir);
    let reference = reg.reference("test/musl:1");
    push(tmp, &layout, "1", &reference);
    let store = Store::new(&d.dir.join("images"));
    let img = pull(&store, &reference, &PullOptions::default()).expect("pull");
    assert_eq!(img.layer_files.len(), 12);

    let t0 = std::time::Instant::now();
    let a = create(d, &reference);
    eprintln!(
        "12-layer musl image, first create (merge + template boot): {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let merges: Vec<_> = std::fs::read_dir(d.dir.join("image-merges"))
        .expect("a merged layer")
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(merges.len(), 1, "{merges:?}");
    let t = d.must("templates", d.c.templates());
    let t = t.iter().find(|t| t.name == a.template).unwrap();
    for i in 1..=8 {
        assert!(t.dir.join(format!("layer{i}.erofs")).is_file(), "layer {i}");
    }
    assert!(
        !t.dir.join("layer9.erofs").exists(),
        "8 layers for the guest"
    );

    // musl's program, argv form; then its Cmd; both through the loader.
    assert_eq!(
        run(d, &a.id, &["/usr/bin/hello", "argv"]),
        (Some(0), "hello from musl argv\n".into())
    );
    assert_eq!(
        run(d, &a.id, &[]),
        (Some(0), "hello from musl cmd\n".into())
    );
    // What the 12 layers show, through /bin/sh (busybox): every file of a
    // layer not whited out, opaque directories' own files only.
    let script = "cd /data && echo data: $(ls); echo in: $(ls /opq-in); \
                  echo above: $(ls /opq-above); cat l0 l5 l11; echo; \
                  test -e /lib64/ld-linux-x86-64.so.2 || echo no-glibc; \
                  /usr/bin/hello via-sh";
    let (code, out) = run(d, &a.id, &["/bin/sh", "-c", script]);
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "data: l0 l10 l11 l5 l6 l7 l8 l9",
            "in: new",
            "above: new",
            "0511",
            "no-glibc",
            "hello from musl via-sh",
        ],
        "{out}"
    );
    // The next create restores the same template.
    let b = create(d, &reference);
    assert_eq!(b.template, a.template);
    assert_eq!(
        run(d, &b.id, &["/usr/bin/hello", "again"]),
        (Some(0), "hello from musl again\n".into())
    );
    d.kill(&a.id);
    d.kill(&b.id);
}
