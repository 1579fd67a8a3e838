//! A small static program the hostile-guest battery (tests/tests/hostile.rs)
//! builds for the guest (`rustc --target x86_64-unknown-linux-musl`, std
//! only: busybox has no vsock client and no ptrace tool) and runs there:
//!
//! - `vsock-flood PORT N SECS`: opens up to N vsock connections to the host
//!   (cid 2) on PORT, non-blocking, for at most SECS seconds (each costs
//!   the guest kernel milliseconds on PVM hosts), keeps them all open for a
//!   while, and prints `opened=A connected=B refused=C failed=D`;
//! - `ptrace-stop PID SECS`: attaches to PID (the agent is PID 1) with
//!   ptrace, which stops it, and holds it stopped for SECS seconds.

use std::ffi::{c_int, c_long, c_void};
use std::time::{Duration, Instant};

const AF_VSOCK: c_int = 40;
const SOCK_STREAM: c_int = 1;
const SOCK_NONBLOCK: c_int = 0o4000;
const SOCK_CLOEXEC: c_int = 0o2000000;
const EINPROGRESS: c_int = 115;
const RLIMIT_NOFILE: c_int = 7;
const PTRACE_ATTACH: c_long = 16;
const SOL_SOCKET: c_int = 1;
const SO_ERROR: c_int = 4;

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
    fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut u32) -> c_int;
    fn setrlimit(res: c_int, rl: *const Rlimit) -> c_int;
    fn ptrace(req: c_long, pid: c_int, addr: *mut c_void, data: *mut c_void) -> c_long;
    fn close(fd: c_int) -> c_int;
    fn __errno_location() -> *mut c_int;
}

fn errno() -> c_int {
    // SAFETY: musl's thread-local errno.
    unsafe { *__errno_location() }
}

fn vsock_flood(port: u32, n: usize, secs: u64) {
    let end = Instant::now() + Duration::from_secs(secs);
    let lim = Rlimit {
        cur: n as u64 + 64,
        max: n as u64 + 64,
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
    let (mut fds, mut failed, mut refused, mut immediate) = (Vec::new(), 0, 0, 0);
    for _ in 0..n {
        if Instant::now() >= end {
            break;
        }
        // SAFETY: plain syscall.
        let fd = unsafe { socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0) };
        if fd < 0 {
            failed += 1;
            continue;
        }
        // SAFETY: addr is a valid sockaddr_vm of the size given.
        let r = unsafe {
            connect(
                fd,
                (&addr as *const SockaddrVm).cast(),
                std::mem::size_of::<SockaddrVm>() as u32,
            )
        };
        if r == 0 {
            immediate += 1;
            fds.push(fd);
        } else if errno() == EINPROGRESS {
            fds.push(fd);
        } else {
            refused += 1;
            // SAFETY: our fd.
            unsafe { close(fd) };
        }
    }
    // Let the host answer, then count what connected.
    std::thread::sleep(Duration::from_secs(2));
    let mut connected = 0;
    for &fd in &fds {
        let mut err: c_int = 0;
        let mut len = 4u32;
        // SAFETY: valid out pointers.
        let r = unsafe { getsockopt(fd, SOL_SOCKET, SO_ERROR, (&mut err as *mut c_int).cast(), &mut len) };
        if r == 0 && err == 0 {
            connected += 1;
        } else {
            refused += 1;
        }
    }
    println!(
        "opened={} connected={} refused={refused} failed={failed} immediate={immediate}",
        fds.len(),
        connected
    );
    std::thread::sleep(Duration::from_secs(3));
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
        Some("vsock-flood") => vsock_flood(arg(2) as u32, arg(3) as usize, arg(4)),
        Some("ptrace-stop") => ptrace_stop(arg(2) as c_int, arg(3)),
        _ => {
            eprintln!("usage: hostile vsock-flood PORT N SECS | ptrace-stop PID SECS");
            std::process::exit(2);
        }
    }
}
