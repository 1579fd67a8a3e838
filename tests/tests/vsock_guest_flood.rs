//! A real guest (the `base` image, for python3) opening vsock connections
//! to a host listener, three times the VMM's guest share of its connection
//! table: the VMM keeps at most that share and refuses the rest with RST,
//! its descriptors stay bounded, and the host (a new agent connection)
//! still connects while the guest holds its share. (Each guest connect
//! costs ~40 ms on a PVM host: 10,000 would take minutes; the cap is
//! reached at 512 either way.)

use agent_client::{ExecEvent, ExecRequest};
use shoal_test_support::{sh, RunningSandbox};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn base_template() -> PathBuf {
    shoal_test_support::require_kvm();
    let spec = shoal_runtime::sandbox::TemplateSpec::new("base", 1, 256);
    shoal_runtime::sandbox::template(&spec, &mut |l| eprintln!("{l}"))
        .unwrap_or_else(|e| panic!("the base template: {e}"))
}

fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the VMM's fds")
        .count()
}

/// Guest connections attempted.
const N: usize = 3 * devices::virtio::vsock::MAX_GUEST_CONNECTIONS;

const FLOOD: &str = r#"
import socket, sys, time
N = int(sys.argv[1])
ok = fail = 0
held = []
for i in range(N):
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    try:
        s.connect((2, 7000))
        held.append(s)
        ok += 1
    except OSError:
        s.close()
        fail += 1
print(ok, fail, flush=True)
time.sleep(120)
"#;

#[test]
fn a_guest_opening_thousands_of_vsock_connections_is_capped_and_the_host_still_connects() {
    let max = devices::virtio::vsock::MAX_GUEST_CONNECTIONS;
    let (r, c) = RunningSandbox::start(&base_template());
    let vmm = r.vmm_pid();
    let fds0 = fds_of(vmm);
    // The host listener the guest connects to; its side holds every
    // connection it gets.
    let l = UnixListener::bind(format!("{}_7000", r.sb.vsock.display())).unwrap();
    l.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicUsize::new(0));
    let acceptor = {
        let (stop, accepted) = (stop.clone(), accepted.clone());
        std::thread::spawn(move || {
            let mut held = vec![];
            while !stop.load(Ordering::Acquire) {
                match l.accept() {
                    Ok((s, _)) => {
                        held.push(s);
                        accepted.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        })
    };
    let n = N.to_string();
    let req = ExecRequest::argv(["python3", "-c", FLOOD, n.as_str()])
        .with_timeout(Duration::from_secs(280));
    let mut h = c.exec(&req).expect("exec");
    let mut out = Vec::new();
    while !out.contains(&b'\n') {
        match h.next_event().expect("the flood's output") {
            Some(ExecEvent::Stdout(d)) => out.extend(d),
            Some(ExecEvent::Stderr(d)) => eprint!("{}", String::from_utf8_lossy(&d)),
            Some(ExecEvent::Exit(r)) => panic!("the flood ended early: {r:?}"),
            None => panic!("the flood's stream ended"),
        }
    }
    let line = String::from_utf8_lossy(&out).into_owned();
    let n: Vec<usize> = line
        .split_whitespace()
        .map(|w| w.parse().expect("counts"))
        .collect();
    let (ok, fail) = (n[0], n[1]);
    eprintln!("guest connections: {ok} kept, {fail} refused");
    assert_eq!(ok + fail, N, "{line}");
    assert!(ok <= max, "the guest kept {ok} connections (cap {max})");
    assert!(
        ok >= max / 2,
        "only {ok} guest connections got through: {line}"
    );
    // The VMM holds one socket per kept connection, no more.
    let fds = fds_of(vmm);
    eprintln!("VMM descriptors: {fds0} before, {fds} with the guest's connections");
    assert!(
        fds <= fds0 + max + 16,
        "the VMM has {fds} descriptors ({fds0} before)"
    );
    // While the guest holds its share, the host still connects.
    let c2 =
        r.sb.connect(Duration::from_secs(60), false)
            .expect("a host connection");
    let (out, _, _) = sh(&c2, "echo host-ok");
    assert_eq!(out, "host-ok\n");
    let id = h.exec_id();
    drop(h);
    c2.signal(id, 9, true).expect("kill the flood");
    stop.store(true, Ordering::Release);
    acceptor.join().unwrap();
    assert!(accepted.load(Ordering::Acquire) >= ok);
}
