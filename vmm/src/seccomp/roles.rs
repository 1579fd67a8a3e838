//! The allow-list of each thread role, from what the threads were seen
//! calling (`strace -f` over boot, restore, pre-warm and restore, pause,
//! resume, full and diff snapshots, stats, samples, vsock traffic both
//! ways, disks and pmem), kept to what each role needs after its filter
//! is installed: what a thread does while it starts (glibc's `rseq`,
//! `set_robust_list`, its stack, its name) happens before.

use super::kvm;
use super::table::{arg_in, arg_masked_in, args_eq, int, sys, Table};
use super::SeccompError;

type R = Result<Table, SeccompError>;

/// Futex commands (the low 7 bits of the op) std and glibc use; the
/// priority-inheritance ones are not among them.
const FUTEX_CMDS: [libc::c_int; 7] = [
    libc::FUTEX_WAIT,
    libc::FUTEX_WAKE,
    libc::FUTEX_REQUEUE,
    libc::FUTEX_CMP_REQUEUE,
    libc::FUTEX_WAKE_OP,
    libc::FUTEX_WAIT_BITSET,
    libc::FUTEX_WAKE_BITSET,
];
const FUTEX_CMD_MASK: u64 = 0x7f;

/// Every thread: memory (never executable), locks, time, signals' return,
/// ending itself, and what a panic's abort needs.
fn every_thread() -> R {
    let mut t = Table::default();
    t.allow_all(&[
        sys!(SYS_brk),
        sys!(SYS_munmap),
        sys!(SYS_mremap),
        sys!(SYS_close),
        sys!(SYS_read),
        sys!(SYS_write),
        sys!(SYS_sigaltstack),
        sys!(SYS_rt_sigprocmask),
        sys!(SYS_rt_sigreturn),
        sys!(SYS_restart_syscall),
        sys!(SYS_sched_yield),
        sys!(SYS_clock_gettime),
        sys!(SYS_clock_nanosleep),
        sys!(SYS_nanosleep),
        sys!(SYS_getrandom),
        sys!(SYS_getpid),
        sys!(SYS_gettid),
        sys!(SYS_exit),
        sys!(SYS_exit_group),
    ]);
    let futex: Vec<u64> = FUTEX_CMDS.iter().map(|c| int(*c)).collect();
    t.allow_when(sys!(SYS_futex), arg_masked_in(1, FUTEX_CMD_MASK, &futex)?);
    // No executable mappings: PROT_EXEC clear.
    let no_exec = arg_masked_in(2, int(libc::PROT_EXEC), &[0])?;
    t.allow_when(sys!(SYS_mmap), no_exec.clone());
    t.allow_when(sys!(SYS_mprotect), no_exec);
    // Freeing memory (malloc, thread stacks; the balloon's pages of
    // anonymous guest RAM: a private file mapping's are replaced by a new
    // anonymous mapping instead, through the mmap rule above), and keeping
    // guest memory out of core dumps. Never MADV_REMOVE: guest RAM is never
    // shared, so nothing needs a hole punched in a file.
    t.allow_when(
        sys!(SYS_madvise),
        arg_in(
            2,
            &[
                int(libc::MADV_DONTNEED),
                int(libc::MADV_FREE),
                int(libc::MADV_DONTDUMP),
            ],
        )?,
    );
    // abort() on a panic signals its own thread.
    t.allow_when(sys!(SYS_tgkill), arg_in(2, &[int(libc::SIGABRT)])?);
    // Debug builds of std check that a descriptor is open before closing
    // it (`fcntl(F_GETFD)`); release builds, the ones Shoal runs, do not.
    #[cfg(debug_assertions)]
    t.allow_when(sys!(SYS_fcntl), arg_in(1, &[int(libc::F_GETFD)])?);
    Ok(t)
}

/// What the devices do on the thread that drives them (vCPU threads on a
/// queue notify, the event thread on host readiness): disk I/O, console
/// output, vsock Unix sockets (hybrid vsock connects to `PATH_PORT` for
/// guest-initiated connections), eventfds and irqfds.
fn devices() -> R {
    let mut t = Table::default();
    t.allow_all(&[
        // Disks (pread/pwrite at the guest's sector, flush), console
        // output.
        sys!(SYS_pread64),
        sys!(SYS_pwrite64),
        sys!(SYS_fdatasync),
        sys!(SYS_writev),
        // vsock connections.
        sys!(SYS_connect),
        sys!(SYS_sendto),
        sys!(SYS_recvfrom),
        sys!(SYS_shutdown),
        // The vsock connect-timeout timer, armed while a host CONNECT is
        // pending.
        sys!(SYS_timerfd_settime),
    ]);
    t.allow_when(sys!(SYS_socket), arg_in(0, &[int(libc::AF_UNIX)])?);
    // Making a socket non-blocking; the net device's TAP offloads, set
    // when its driver starts or resets (from a vCPU's MMIO write).
    use devices::virtio::net::offload::TUNSETOFFLOAD;
    t.allow_when(sys!(SYS_ioctl), arg_in(1, &[libc::FIONBIO, TUNSETOFFLOAD])?);
    Ok(t)
}

/// A vCPU thread: `KVM_RUN` and reading its own vCPU's state, plus the
/// devices its exits drive.
pub fn vcpu() -> R {
    let mut t = every_thread()?;
    t.merge(&devices()?);
    // Added to the devices' socket ioctls; no other ioctl passes.
    t.allow_when(sys!(SYS_ioctl), arg_in(1, &kvm::vcpu_thread())?);
    Ok(t)
}

/// The event thread: epoll, and the devices' host side (vsock accepts,
/// reads and writes; removing the vsock socket when the device goes).
pub fn events() -> R {
    let mut t = every_thread()?;
    t.merge(&devices()?);
    t.allow_all(&[
        sys!(SYS_epoll_wait),
        sys!(SYS_epoll_pwait),
        sys!(SYS_epoll_ctl),
        sys!(SYS_accept4),
        // The vsock socket's path, when the device goes.
        sys!(SYS_unlink),
    ]);
    Ok(t)
}

/// Control-socket threads (the acceptor and its connection workers):
/// accept, read a line with a deadline, write the reply.
pub fn api() -> R {
    let mut t = every_thread()?;
    t.allow_all(&[
        sys!(SYS_accept4),
        sys!(SYS_recvfrom),
        sys!(SYS_sendto),
        sys!(SYS_shutdown),
    ]);
    t.allow_when(sys!(SYS_ioctl), arg_in(1, &[libc::FIONBIO])?);
    t.allow_when(sys!(SYS_fcntl), arg_in(1, &[int(libc::F_DUPFD_CLOEXEC)])?);
    let timeouts = [int(libc::SO_RCVTIMEO), int(libc::SO_SNDTIMEO)];
    let mut rules = Vec::new();
    for o in timeouts {
        rules.extend(args_eq(1, int(libc::SOL_SOCKET), 2, o)?);
    }
    t.allow_when(sys!(SYS_setsockopt), rules);
    Ok(t)
}

/// The main thread once the VM is set up: the controller, which restores
/// snapshots into the VM (a pre-warmed one gets its whole guest here:
/// memory file, disks, pmem images, vsock socket, new vCPU threads),
/// saves snapshots, and stops the VM. vCPU threads it starts inherit
/// this filter under their own, so it includes the vCPU role's.
pub fn main() -> R {
    let mut t = every_thread()?;
    t.merge(&vcpu()?);
    t.merge(&events()?);
    t.allow_all(&[
        // Snapshot files, disk and image files, /proc/self/pagemap.
        sys!(SYS_openat),
        sys!(SYS_newfstatat),
        sys!(SYS_fstat),
        sys!(SYS_statx),
        sys!(SYS_ftruncate),
        sys!(SYS_fsync),
        sys!(SYS_lseek),
        sys!(SYS_mkdir),
        sys!(SYS_mkdirat),
        sys!(SYS_rename),
        sys!(SYS_renameat),
        sys!(SYS_renameat2),
        sys!(SYS_getdents64),
        // Canonical paths (realpath: a diff snapshot names its base).
        sys!(SYS_readlink),
        sys!(SYS_readlinkat),
        sys!(SYS_access),
        sys!(SYS_faccessat2),
        // The vsock host socket of a restored guest.
        sys!(SYS_bind),
        sys!(SYS_listen),
        // Interrupt lines of a restored guest, and its vsock device's
        // connect-timeout timer.
        sys!(SYS_eventfd2),
        sys!(SYS_timerfd_create),
        // vCPU threads of a restored guest: creating one, what glibc and
        // std do as it starts, and its installing its own filter.
        sys!(SYS_clone),
        sys!(SYS_clone3),
        sys!(SYS_rseq),
        sys!(SYS_set_robust_list),
        sys!(SYS_sched_getaffinity),
        // Cold-memory eviction: the file's filesystem (never tmpfs), and
        // dropping its page cache once written.
        sys!(SYS_fstatfs),
        sys!(SYS_fadvise64),
    ]);
    // Eviction to swap, where the host has it (added to every thread's
    // madvise advice).
    t.allow_when(sys!(SYS_madvise), arg_in(2, &[int(libc::MADV_PAGEOUT)])?);
    t.allow_when(
        sys!(SYS_prctl),
        arg_in(0, &[int(libc::PR_SET_NAME), int(libc::PR_SET_NO_NEW_PRIVS)])?,
    );
    // Duplicating descriptors (eventfds for new vCPU threads, the VM fd
    // for pmem slots).
    t.allow_when(sys!(SYS_fcntl), arg_in(1, &[int(libc::F_DUPFD_CLOEXEC)])?);
    t.allow_when(
        sys!(SYS_seccomp),
        args_eq(0, u64::from(libc::SECCOMP_SET_MODE_FILTER), 1, 0)?,
    );
    // Kicking vCPUs out of KVM_RUN (added to abort()'s SIGABRT).
    t.allow_when(sys!(SYS_tgkill), arg_in(2, &[int(libc::SIGRTMIN())])?);
    // Added to the vCPU role's.
    t.allow_when(sys!(SYS_ioctl), arg_in(1, &kvm::main_thread())?);
    // The net device of a guest restored into a pre-warmed VM: the
    // duplicate of its inherited TAP descriptor is checked (TUNGETIFF),
    // given the virtio header length and made non-blocking. Opening a TAP
    // by name (TUNSETIFF) is never allowed here.
    use devices::virtio::net::tap::{TUNGETIFF, TUNSETVNETHDRSZ};
    t.allow_when(sys!(SYS_ioctl), arg_in(1, &[TUNGETIFF, TUNSETVNETHDRSZ])?);
    t.allow_when(
        sys!(SYS_fcntl),
        arg_in(1, &[int(libc::F_GETFL), int(libc::F_SETFL)])?,
    );
    Ok(t)
}
