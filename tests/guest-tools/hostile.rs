//! A small static program the hostile-guest battery (tests/tests/hostile.rs)
//! builds for the guest (`rustc --target x86_64-unknown-linux-musl`, std
//! only: busybox has no vsock client and no ptrace tool) and runs there:
//!
//! - `vsock-flood PORT N SECS THREADS HOLD`: makes N vsock connection
//!   attempts to the host (cid 2) on PORT from THREADS threads, for at most
//!   SECS seconds, holds up to HOLD of the connections that succeed (closes
//!   the others at once), prints `attempts=A connected=B held=H closed=C
//!   refused=R failed=F secs=S` and keeps what it holds open for 2 s more.
//!   Each attempt is a blocking connect that the VMM answers (RESPONSE or
//!   RST); a refused socket is connected again rather than replaced, since
//!   a new socket and its close cost a PVM guest's emulated kernel more
//!   than the attempt (~5 ms);
//! - `ptrace-stop PID SECS`: attaches to PID (the agent is PID 1) with
//!   ptrace, which stops it, and holds it stopped for SECS seconds.

use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const AF_VSOCK: c_int = 40;
const SOCK_STREAM: c_int = 1;
const SOCK_CLOEXEC: c_int = 0o2000000;
const ECONNRESET: c_int = 104;
const RLIMIT_NOFILE: c_int = 7;
const PTRACE_ATTACH: c_long = 16;

#[repr(C)]
struct SockaddrVm {
    family: u16,
    reserved1: u16,
    port: u32,
    cid: u32,
    flags: u8,
    zero: [u8; 3],
}

#[repr(C)]
struct Rlimit {
    cur: u64,
    max: u64,
}

extern "C" {
    fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    fn connect(fd: c_int, addr: *const c_void, len: u32) -> c_int;
    fn setrlimit(res: c_int, rl: *const Rlimit) -> c_int;
    fn ptrace(req: c_long, pid: c_int, addr: *mut c_void, data: *mut c_void) -> c_long;
    fn close(fd: c_int) -> c_int;
    fn __errno_location() -> *mut c_int;
}

fn errno() -> c_int {
    // SAFETY: musl's thread-local errno.
    unsafe { *__errno_location() }
}

/// What the flood's threads count.
#[derive(Default)]
struct Tally {
    attempts: AtomicUsize,
    connected: AtomicUsize,
    refused: AtomicUsize,
    failed: AtomicUsize,
    closed: AtomicUsize,
}

/// One flooding thread: connect attempts (blocking, so each is answered
/// before the next) until `n` were made in all or `end`. A refused socket
/// (`ECONNRESET`, the VMM's RST) is connected again: a new socket and its
/// close cost the guest kernel more than the attempt itself on PVM hosts.
/// Connected sockets are held while fewer than `hold` are, else closed at
/// once (churn).
fn flood_thread(
    addr: &SockaddrVm,
    n: usize,
    end: Instant,
    hold: usize,
    t: &Tally,
    held: &Mutex<Vec<c_int>>,
) {
    let mut fd: c_int = -1;
    while Instant::now() < end && t.attempts.fetch_add(1, Ordering::Relaxed) < n {
        if fd < 0 {
            // SAFETY: plain syscall.
            fd = unsafe { socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0) };
            if fd < 0 {
                t.failed.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        }
        // SAFETY: addr is a valid sockaddr_vm of the size given.
        let r = unsafe {
            connect(
                fd,
                (addr as *const SockaddrVm).cast(),
                std::mem::size_of::<SockaddrVm>() as u32,
            )
        };
        if r == 0 {
            t.connected.fetch_add(1, Ordering::Relaxed);
            let mut h = held.lock().unwrap();
            if h.len() < hold {
                h.push(fd);
            } else {
                drop(h);
                // SAFETY: our fd.
                unsafe { close(fd) };
                t.closed.fetch_add(1, Ordering::Relaxed);
            }
            fd = -1;
        } else if errno() == ECONNRESET {
            t.refused.fetch_add(1, Ordering::Relaxed);
        } else {
            t.failed.fetch_add(1, Ordering::Relaxed);
            // SAFETY: our fd.
            unsafe { close(fd) };
            fd = -1;
        }
    }
    if fd >= 0 {
        // SAFETY: our fd.
        unsafe { close(fd) };
    }
}

fn vsock_flood(port: u32, n: usize, secs: u64, threads: usize, hold: usize) {
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(secs);
    let lim = Rlimit {
        cur: hold as u64 + threads as u64 + 64,
        max: hold as u64 + threads as u64 + 64,
    };
    // SAFETY: a valid rlimit.
    unsafe { setrlimit(RLIMIT_NOFILE, &lim) };
    let addr = SockaddrVm {
        family: AF_VSOCK as u16,
        reserved1: 0,
        port,
        cid: 2,
        flags: 0,
        zero: [0; 3],
    };
    let tally = Tally::default();
    let held = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| flood_thread(&addr, n, end, hold, &tally, &held));
        }
    });
    let took = t0.elapsed();
    let held = held.into_inner().unwrap();
    // Every attempt was answered (blocking connects): what the VMM let
    // through is held now.
    println!(
        "attempts={} connected={} held={} closed={} refused={} failed={} secs={:.1}",
        tally.attempts.load(Ordering::Relaxed).min(n),
        tally.connected.load(Ordering::Relaxed),
        held.len(),
        tally.closed.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
        took.as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(2));
}

fn ptrace_stop(pid: c_int, secs: u64) {
    // SAFETY: plain syscall.
    let r = unsafe { ptrace(PTRACE_ATTACH, pid, std::ptr::null_mut(), std::ptr::null_mut()) };
    println!("attach={r} errno={}", if r < 0 { errno() } else { 0 });
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).and_then(|a| a.parse::<u64>().ok()).unwrap_or(0);
    match args.get(1).map(String::as_str) {
        Some("vsock-flood") => vsock_flood(
            arg(2) as u32,
            arg(3) as usize,
            arg(4),
            arg(5) as usize,
            arg(6) as usize,
        ),
        Some("ptrace-stop") => ptrace_stop(arg(2) as c_int, arg(3)),
        _ => {
            eprintln!(
                "usage: hostile vsock-flood PORT N SECS THREADS HOLD | ptrace-stop PID SECS"
            );
            std::process::exit(2);
        }
    }
}
