//! Layers a caller names by path: only from the daemon's layers directory,
//! opened once without blocking, errors that say nothing about files
//! elsewhere.

use super::harness::TestDaemon;
use shoal_client::api::CreateTemplate;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path alive for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Sends a template create with `layer` on its own thread; the answer
/// (the error message, or "created") comes on `tx`.
fn create_in_background(d: &TestDaemon, name: &str, layer: &Path, tx: &mpsc::Sender<String>) {
    let (c, tx) = (d.c.clone(), tx.clone());
    let req = CreateTemplate {
        kind: None,
        layers: vec![layer.display().to_string()],
        ..CreateTemplate::new(name, "tiny")
    };
    std::thread::spawn(move || {
        let r = c.create_template(&req);
        let _ = tx.send(r.map_or_else(|e| e.to_string(), |_| "created".into()));
    });
}

/// The daemon's default layers directory (under its state directory).
fn layers_dir(d: &TestDaemon) -> PathBuf {
    let dir = d.state_dir().join("layers");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_fifo_layer_is_refused_at_once_and_the_daemon_keeps_answering() {
    let d = TestDaemon::start();
    let inside = layers_dir(&d).join("pipe.img");
    let outside = d.scratch("elsewhere").join("pipe.img");
    mkfifo(&inside);
    mkfifo(&outside);
    // More FIFO layers at once than the daemon has runtime threads: an open
    // that blocked would hold every one of them.
    let (tx, rx) = mpsc::channel();
    for i in 0..6 {
        let l = if i % 2 == 0 { &inside } else { &outside };
        create_in_background(&d, &format!("fifo{i}"), l, &tx);
    }
    std::thread::sleep(Duration::from_millis(300));
    // Meanwhile the daemon answers others.
    let (ltx, lrx) = mpsc::channel();
    let c = d.c.clone();
    std::thread::spawn(move || {
        let _ = ltx.send(c.templates().map(|t| t.len()));
    });
    let listed = lrx
        .recv_timeout(Duration::from_secs(10))
        .expect("the daemon stopped answering while FIFO layers were being opened");
    assert_eq!(listed.expect("list templates"), 0);
    for _ in 0..6 {
        let m = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a FIFO layer got no answer within 10 s");
        assert!(
            m.contains("not a regular file") || m.contains("not an allowed layer"),
            "{m}"
        );
    }
    assert!(d.c.templates().unwrap().is_empty(), "nothing registered");
}

#[test]
fn paths_outside_the_layers_directory_are_refused_alike_whether_they_exist_or_not() {
    let d = TestDaemon::start();
    let (tx, rx) = mpsc::channel();
    let out = d.scratch("secret");
    // A file only root may read, of a telling size; and one that is not.
    let secret = out.join("shadow");
    std::fs::write(&secret, vec![b'x'; 631]).unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let missing = out.join("missing");
    let mut msgs = vec![];
    for (i, p) in [&secret, &missing].into_iter().enumerate() {
        create_in_background(&d, &format!("s{i}"), p, &tx);
        let m = rx.recv_timeout(Duration::from_secs(10)).expect("answered");
        msgs.push(m.replace(&p.display().to_string(), "PATH"));
    }
    assert_eq!(msgs[0], msgs[1], "the same words for both");
    assert!(msgs[0].contains("not an allowed layer"), "{}", msgs[0]);
    assert!(!msgs[0].contains("631"), "{}", msgs[0]);
    // /etc/shadow itself.
    create_in_background(&d, "s3", Path::new("/etc/shadow"), &tx);
    let m = rx.recv_timeout(Duration::from_secs(10)).expect("answered");
    assert!(
        m.contains("not an allowed layer") && !m.contains("bytes"),
        "{m}"
    );
}
