//! `shoal-agent`: the PID 1 init of Shoal guests.
//!
//! On the development hosts the guest runs under PVM, where every guest
//! syscall costs ~0.5 ms and every fork+exec close to a second, so this init
//! does all of its setup with direct syscalls and as few of them as it can:
//! a mount is tried first and its mount point created only when the mount
//! says it is missing; the console is only reopened when writing to it fails;
//! the command is started with `clone(CLONE_VM | CLONE_VFORK)` (no page-table
//! copy, no copy-on-write faults) rather than `fork`.
//!
//! The command is what follows ` -- ` on the kernel command line (see
//! cmdline.rs for how it is told apart from other words the kernel passes);
//! without ` -- ` all of argv[1..] is taken (e.g. when started by a test).
//! The kernel splits on whitespace and groups with double quotes only (no
//! single quotes), passes at most ~30 words to init, and stops at a second
//! `--`.
//!
//! With no command after ` -- ` (or no argv at all) the agent serves the
//! request protocol of `agent_proto` on vsock port 5000 instead
//! (see server/mod.rs and PROTOCOL.md), reaping orphans as PID 1 must; with
//! the command `--listen unix:PATH` it serves there instead (tests run the
//! PID 1 server in Linux namespaces that way).
//! Started as an ordinary process with `--listen unix:PATH` (or
//! `vsock:PORT`) it serves the same protocol there: no mounts, no cgroups.
//!
//! With `shoal.overlay=1` on the kernel command line (a read-only pmem
//! root), PID 1 first moves itself into a writable overlay of the root
//! (tmpfs upper layer; see overlay.rs), so commands and file operations
//! never write to the image. With `shoal.container=1` as well (a container
//! sandbox: the root is only the agent's layer), the overlay is the image's
//! layers alone, and a failure to build it ends the guest.
//!
//! Protocol on the console (the VMM and tests parse these lines):
//! - `SHOAL-INIT-READY` once the mounts are done (and, in server mode, the
//!   vsock listener is accepting);
//! - `SHOAL-EXIT <code>` after the command given on the kernel command line
//!   (after ` -- `) has exited; then the guest syncs and reboots, which the
//!   VMM (`reboot=k`) treats as a clean exit.
//!
//! The binary uses `#![no_main]`: the C `main` receives argv/envp straight
//! from the kernel and std's runtime setup (fd probing, SIGPIPE, stack guard
//! handlers: several syscalls) is skipped.

// Unit tests use the test harness's own main.
#![cfg_attr(not(test), no_main)]
#![cfg_attr(test, allow(dead_code, unused_imports))]
mod cmdline;
mod overlay;
mod server;
mod spawn;
mod sys;

use std::ffi::{c_char, c_int, CStr};
use std::io::Write;

use server::listen::ListenAddr;
use sys::{errno, write_all};

/// Marker printed once the init is ready; one write(2).
const READY: &[u8] = b"SHOAL-INIT-READY\n";
/// Command word that makes init report exit 0 and reboot without running
/// anything (boot benchmarks measure to VMM exit with it).
const REBOOT_BUILTIN: &std::ffi::CStr = c"@reboot";

const USAGE: &[u8] = b"usage: shoal-agent [COMMAND [ARG]...]   (as PID 1)\n\
       shoal-agent --listen unix:PATH|vsock:PORT\n\
       shoal-agent --guest   (a guest's service: as PID 1 serves, no mounts)\n\
shoal-agent is the PID 1 init of Shoal guests (kernel command line: ... -- COMMAND ARG...;\n\
with no command it serves the agent protocol on vsock port 5000). As an ordinary\n\
process it only serves the protocol, with --listen.\n";

/// One filesystem to mount at boot.
struct Mount {
    source: &'static CStr,
    target: &'static CStr,
    fstype: &'static CStr,
    flags: libc::c_ulong,
    data: Option<&'static CStr>,
    /// Mode for the mount point if it has to be created.
    dir_mode: libc::mode_t,
}

const NOSUID_NODEV: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV;
const NOSUID_NODEV_NOEXEC: libc::c_ulong = NOSUID_NODEV | libc::MS_NOEXEC;

/// In order: /dev first (the console may live there), cgroup2 after sysfs.
const MOUNTS: &[Mount] = &[
    Mount {
        source: c"devtmpfs",
        target: c"/dev",
        fstype: c"devtmpfs",
        flags: libc::MS_NOSUID,
        data: Some(c"mode=0755"),
        dir_mode: 0o755,
    },
    // Pseudo-terminals (PTY execs): /dev/ptmx of devtmpfs opens this
    // (initial) instance.
    Mount {
        source: c"devpts",
        target: c"/dev/pts",
        fstype: c"devpts",
        flags: libc::MS_NOSUID | libc::MS_NOEXEC,
        data: Some(c"mode=0620,ptmxmode=0666"),
        dir_mode: 0o755,
    },
    Mount {
        source: c"proc",
        target: c"/proc",
        fstype: c"proc",
        flags: NOSUID_NODEV_NOEXEC,
        data: None,
        dir_mode: 0o555,
    },
    Mount {
        source: c"sysfs",
        target: c"/sys",
        fstype: c"sysfs",
        flags: NOSUID_NODEV_NOEXEC,
        data: None,
        dir_mode: 0o555,
    },
    Mount {
        source: c"cgroup2",
        target: c"/sys/fs/cgroup",
        fstype: c"cgroup2",
        flags: NOSUID_NODEV_NOEXEC,
        data: None,
        dir_mode: 0o755,
    },
    Mount {
        source: c"tmpfs",
        target: c"/tmp",
        fstype: c"tmpfs",
        flags: NOSUID_NODEV,
        data: Some(c"mode=1777"),
        dir_mode: 0o1777,
    },
    Mount {
        source: c"tmpfs",
        target: c"/run",
        fstype: c"tmpfs",
        flags: NOSUID_NODEV,
        data: Some(c"mode=755"),
        dir_mode: 0o755,
    },
];

/// C entry point (see the module comment for why not Rust's `fn main`).
#[cfg(not(test))]
#[no_mangle]
unsafe extern "C" fn main(
    argc: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let argc = usize::try_from(argc).unwrap_or(0);
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != 1 {
        // SAFETY: argv/envp are the C runtime's arrays (argc entries).
        return unsafe { host_main(argc, argv, envp) };
    }
    mount_all();
    let kernel_cmdline = cmdline::read_cmdline();
    // A read-only (pmem) root: run everything in a writable overlay of it.
    let overlay = kernel_cmdline
        .as_deref()
        .map(overlay::parse)
        .unwrap_or_default();
    if overlay.enabled {
        if let Err(e) = overlay::setup(&overlay) {
            write_all(2, format!("shoal-agent: {e}\n").as_bytes());
            if overlay.container {
                // A container left on the agent's own root would run
                // nothing of its image: end the guest, so that its boot
                // fails with the reason above on the console.
                // SAFETY: reboot has no memory-safety preconditions.
                unsafe { libc::reboot(libc::RB_AUTOBOOT) };
            }
        }
    }
    // The kernel has IPv4 (a sandbox may get a network): 127.0.0.1 needs lo up.
    if let Err(e) = server::net::loopback_up() {
        sys::report("lo up", e.0);
    }
    // SAFETY: the pointer and length describe a valid static byte string.
    if unsafe { libc::sethostname(c"shoal".as_ptr(), 5) } != 0 {
        sys::report("sethostname", errno());
    }
    set_fpr_order(
        kernel_cmdline
            .as_deref()
            .map_or(cmdline::FPR_ORDER_DEFAULT, cmdline::fpr_order),
    );

    // Only the words after ` -- ` on the kernel command line are the command.
    let first = if argc > 1 && !argv.is_null() {
        cmdline::command_start(argc, kernel_cmdline.as_deref())
    } else {
        argc
    };
    // SAFETY: argv holds argc valid C strings (the kernel's array).
    let words = unsafe { c_strings(argv) };
    let listen = match words.get(first..) {
        // No command: serve the agent protocol on vsock.
        None | Some([]) => Some(ListenAddr::Vsock(agent_proto::VSOCK_PORT)),
        // `--listen ADDR` as the command: serve there instead (tests run
        // the PID 1 server in namespaces on a Unix socket).
        Some([flag, addr]) if flag == b"--listen" => ListenAddr::parse(addr),
        Some(_) => None,
    };
    if let Some(addr) = listen {
        // SAFETY: envp is the kernel's NULL-terminated array.
        let env = unsafe { guest_env(envp) };
        serve_guest(env, &addr)
    }
    announce_ready();
    {
        // SAFETY: first < argc, and the kernel passes argc valid entries in
        // a NULL-terminated argv array that lives for the whole process.
        let cmd = unsafe { argv.add(first) };
        // SAFETY: argv[1] is a valid NUL-terminated string (argc > 1).
        let first = unsafe { std::ffi::CStr::from_ptr(*cmd) };
        let code = if first == REBOOT_BUILTIN {
            // Boot benchmarks: ready, then reboot at once (no fork/exec).
            0
        } else {
            // SAFETY: as above; envp is the kernel's NULL-terminated array.
            unsafe { spawn::run_command(cmd, envp) }
        };
        // Formatted on the stack: no allocation (an mmap under musl).
        let mut buf = [0u8; 32];
        let mut w = &mut buf[..];
        let _ = writeln!(w, "SHOAL-EXIT {code}"); // fits: 11 + at most 11 digits
        let len = 32 - w.len();
        write_all(1, buf.get(..len).unwrap_or_default());
        // SAFETY: sync and reboot have no memory-safety preconditions.
        unsafe {
            libc::sync();
            libc::reboot(libc::RB_AUTOBOOT);
        }
        // Only reached if the reboot was refused: keep PID 1 alive.
        sys::report("reboot", errno());
    }
    spawn::reap_forever()
}

/// Collects a NULL-terminated C string array.
///
/// # Safety
/// `p` must be NULL or a valid NULL-terminated array of C strings.
unsafe fn c_strings(mut p: *const *const c_char) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !p.is_null() {
        // SAFETY: p points into the caller's NULL-terminated array.
        let entry = unsafe { *p };
        if entry.is_null() {
            break;
        }
        // SAFETY: each entry is a valid C string.
        out.push(unsafe { CStr::from_ptr(entry) }.to_bytes().to_vec());
        // SAFETY: the entry was non-NULL, so the array continues.
        p = unsafe { p.add(1) };
    }
    out
}

/// The environment of guest commands: our defaults (PATH, HOME, TERM) over
/// the kernel's entries.
///
/// # Safety
/// `envp` must be NULL or a valid NULL-terminated array of C strings.
unsafe fn guest_env(envp: *const *const c_char) -> Vec<(Vec<u8>, Vec<u8>)> {
    let defaults = spawn::DEFAULT_ENV.iter().map(|e| e.to_bytes().to_vec());
    // SAFETY: forwarded from the caller.
    let kernel = unsafe { c_strings(envp) };
    server::split_env(defaults.chain(kernel))
}

/// PID 1 without a command: user cgroup, vsock listener, ready marker, then
/// the request server forever.
fn serve_guest(env: Vec<(Vec<u8>, Vec<u8>)>, addr: &ListenAddr) -> ! {
    let guest = server::guest::setup();
    // A VM without vsock (QEMU on hosts without vhost-vsock) reaches the
    // agent over a virtio-serial port instead: serve a local socket and
    // bridge the port's streams to it.
    let vport = match addr {
        ListenAddr::Vsock(_) => server::vport::find(),
        ListenAddr::Unix(_) => None,
    };
    let local = ListenAddr::Unix(server::vport::LOCAL_SOCK.into());
    let addr = if vport.is_some() { &local } else { addr };
    let listener = match addr.bind() {
        Ok(l) => l,
        Err(e) => {
            sys::report(&format!("listen on {addr:?}"), e.0);
            announce_ready();
            spawn::reap_forever()
        }
    };
    if let Some(dev) = &vport {
        match server::vport::start(dev, std::path::Path::new(server::vport::LOCAL_SOCK)) {
            Ok(()) => write_all(1, b"shoal-agent: serving over the virtio port\n"),
            Err(e) => sys::report(
                &format!("virtio port {}", dev.display()),
                e.raw_os_error().unwrap_or(0),
            ),
        }
    }
    announce_ready();
    let mode = agent_proto::AgentMode::Guest;
    match server::Server::new(listener, addr.is_unix(), mode, env, guest) {
        Ok(s) => s.run(),
        Err((what, e)) => {
            sys::report(what, e.0);
            spawn::reap_forever()
        }
    }
}

/// Not PID 1: `--listen ADDR` serves the protocol as an ordinary process.
///
/// # Safety
/// `argv` must hold `argc` valid C strings; `envp` must be NULL or a valid
/// NULL-terminated array of C strings.
unsafe fn host_main(argc: usize, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let args = if argv.is_null() || argc == 0 {
        Vec::new()
    } else {
        // SAFETY: argv is the C runtime's NULL-terminated array.
        unsafe { c_strings(argv) }
    };
    let addr = match args.get(1..) {
        // A service of a guest that booted its own init (systemd): serve
        // as PID 1 would (vsock, else the virtio-serial port), without
        // the mounts.
        Some([flag]) if flag == b"--guest" => {
            // SAFETY: prctl with integer arguments only.
            unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
            // SAFETY: forwarded from the caller.
            let env = unsafe { guest_env(envp) };
            serve_guest(env, &ListenAddr::Vsock(agent_proto::VSOCK_PORT))
        }
        Some([flag, addr]) if flag == b"--listen" => ListenAddr::parse(addr),
        _ => None,
    };
    let Some(addr) = addr else {
        write_all(2, USAGE);
        return 2;
    };
    let listener = match addr.bind() {
        Ok(l) => l,
        Err(e) => {
            sys::report("listen", e.0);
            return 1;
        }
    };
    // Become the reaper of orphaned descendants, as PID 1 is in the guest:
    // the same reaping code runs, and a killed command's grandchildren do
    // not linger as someone else's zombies.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    // SAFETY: forwarded from the caller.
    let env = server::split_env(unsafe { c_strings(envp) });
    let mode = agent_proto::AgentMode::Host;
    let guest = server::guest::Guest::default();
    match server::Server::new(listener, addr.is_unix(), mode, env, guest) {
        Ok(s) => s.run(),
        Err((what, e)) => {
            sys::report(what, e.0);
            1
        }
    }
}

/// Mounts everything in `MOUNTS`; never fails, only reports.
/// Sets free page reporting's order (the balloon driver set its own when
/// it registered, before init ran; the parameter is writable after). A
/// kernel without page reporting has no such file: nothing to do.
fn set_fpr_order(order: u8) {
    const PARAM: &CStr = c"/sys/module/page_reporting/parameters/page_reporting_order";
    // SAFETY: the path is a NUL-terminated static string.
    let fd = unsafe { libc::open(PARAM.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = errno();
        if e != libc::ENOENT {
            sys::report("page_reporting_order", e);
        }
        return;
    }
    let text = format!("{order}\n");
    // SAFETY: text is a valid buffer of text.len() bytes; fd is open.
    let n = unsafe { libc::write(fd, text.as_ptr().cast(), text.len()) };
    if n < 0 {
        sys::report("page_reporting_order", errno());
    }
    // SAFETY: fd was opened above and is closed once.
    unsafe { libc::close(fd) };
}

fn mount_all() {
    let mut sysfs_ok = true;
    for m in MOUNTS {
        if m.fstype == c"cgroup2" && !sysfs_ok {
            continue; // no /sys, so no /sys/fs/cgroup either
        }
        let ok = mount_one(m);
        if m.fstype == c"sysfs" {
            sysfs_ok = ok;
        }
        if m.fstype == c"devtmpfs" && ok {
            cap_dev();
        }
    }
}

/// devtmpfs is a tmpfs of half the RAM that root may write files into;
/// what is written there cannot be reclaimed and counts against the user
/// cgroup, so a full /dev would OOM-kill the user's processes. Device nodes
/// take no space: a small size makes such writes fail with ENOSPC instead.
fn cap_dev() {
    // SAFETY: NUL-terminated static strings; remount takes no other memory.
    let rc = unsafe {
        libc::mount(
            c"devtmpfs".as_ptr(),
            c"/dev".as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_NOSUID,
            c"size=1m".as_ptr().cast(),
        )
    };
    if rc != 0 {
        sys::report("remount /dev", errno());
    }
}

/// Mounts one filesystem, creating the mount point only if the mount reports
/// it missing. Already mounted (EBUSY) counts as success.
fn mount_one(m: &Mount) -> bool {
    let data = m.data.map_or(std::ptr::null(), |d| d.as_ptr().cast());
    let try_mount = || {
        // SAFETY: all strings are NUL-terminated statics; data is either
        // NULL or a NUL-terminated option string.
        let rc = unsafe {
            libc::mount(
                m.source.as_ptr(),
                m.target.as_ptr(),
                m.fstype.as_ptr(),
                m.flags,
                data,
            )
        };
        if rc == 0 {
            0
        } else {
            errno()
        }
    };
    let mut err = try_mount();
    if err == libc::ENOENT {
        // SAFETY: target is a NUL-terminated static path.
        if unsafe { libc::mkdir(m.target.as_ptr(), m.dir_mode) } != 0 {
            let e = errno();
            // EROFS etc.: the root cannot take a new directory; skip.
            sys::report_path("mkdir", m.target, e);
            return false;
        }
        err = try_mount();
    }
    match err {
        0 | libc::EBUSY => true,
        e => {
            sys::report_path("mount", m.target, e);
            false
        }
    }
}

/// Writes the ready marker; if stdout is not open (no /dev/console in the
/// initramfs when the kernel started us), opens the console as fds 0-2 and
/// tries once more.
fn announce_ready() {
    if sys::write_once(1, READY) == Err(libc::EBADF) {
        sys::open_console();
        write_all(1, READY);
    }
}
