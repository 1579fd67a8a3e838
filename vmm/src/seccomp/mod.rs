//! Seccomp filters, one per thread role, declared in Rust (see
//! [`roles`]) and compiled to BPF with `seccompiler`. Each thread installs
//! its own role's filter on itself before it touches guest input (no
//! TSYNC): vCPU threads before their first `KVM_RUN`, the event thread
//! before its first poll, the control-socket threads before their first
//! accept or read, the main thread once the VM is set up. A call outside
//! the filter kills the whole process with SIGSYS; launchers report that
//! as "shoal-vmm killed by seccomp (SIGSYS)".
//!
//! Threads started by an already filtered thread inherit its filter: the
//! control-socket workers are started before theirs, and vCPU threads the
//! main thread starts for a restore into a pre-warmed VM run under both
//! filters (the main role includes the vCPU role, so the vCPU filter is
//! what binds them).

mod kvm;
mod roles;
mod table;

use seccompiler::{BpfProgram, SeccompAction};
use std::fmt;

/// Errors building or installing a filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A rule does not compile (a bug in [`roles`]).
    #[error("cannot build the seccomp filters: {0}")]
    Build(seccompiler::BackendError),
    /// The kernel refused the filter.
    #[error("cannot install the {role} seccomp filter: {source}")]
    Install {
        /// The thread's role.
        role: Role,
        /// Why.
        source: seccompiler::Error,
    },
}

/// What a thread does, which decides what it may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// The main thread: set-up, then the controller (pause, snapshot,
    /// restore, stop).
    Main,
    /// A vCPU thread, running the guest and the device exits it takes.
    Vcpu,
    /// The event thread: device I/O on host file descriptors.
    Events,
    /// The control-socket threads.
    Api,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 4] = [Role::Main, Role::Vcpu, Role::Events, Role::Api];

    /// The role's name (as `--seccomp-selftest` takes it).
    pub fn name(self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::Vcpu => "vcpu",
            Role::Events => "events",
            Role::Api => "api",
        }
    }

    /// The role's allow-list.
    fn table(self) -> Result<table::Table, SeccompError> {
        match self {
            Role::Main => roles::main(),
            Role::Vcpu => roles::vcpu(),
            Role::Events => roles::events(),
            Role::Api => roles::api(),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("unknown thread role {s:?} (main, vcpu, events or api)"))
    }
}

/// What a call outside the filter gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// The process is killed with SIGSYS (the default).
    Kill,
    /// The call is allowed and the kernel logs it (audit type 1326 in the
    /// kernel log): for finding what a filter lacks, never for production.
    Log,
}

/// The compiled filters of every role.
pub struct Filters {
    progs: Vec<(Role, BpfProgram)>,
    selftest: Option<Role>,
}

impl fmt::Debug for Filters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Filters")
            .field("selftest", &self.selftest)
            .finish_non_exhaustive()
    }
}

impl Filters {
    /// Compiles every role's filter.
    pub fn new(on_violation: Violation) -> Result<Filters, SeccompError> {
        let action = match on_violation {
            Violation::Kill => SeccompAction::KillProcess,
            Violation::Log => SeccompAction::Log,
        };
        let progs = Role::ALL
            .into_iter()
            .map(|r| Ok((r, r.table()?.compile(action.clone())?)))
            .collect::<Result<_, SeccompError>>()?;
        Ok(Filters {
            progs,
            selftest: None,
        })
    }

    /// Test hook: the first thread of `role` makes a forbidden call (a
    /// packet socket) right after installing its filter, so tests can
    /// see the VMM die of it.
    pub fn with_selftest(mut self, role: Option<Role>) -> Filters {
        self.selftest = role;
        self
    }

    /// Installs `role`'s filter on the calling thread.
    pub fn install(&self, role: Role) -> Result<(), SeccompError> {
        let prog = self
            .progs
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, p)| p.as_slice())
            .unwrap_or_default();
        seccompiler::apply_filter(prog).map_err(|source| SeccompError::Install { role, source })?;
        if self.selftest == Some(role) {
            forbidden_call();
        }
        Ok(())
    }
}

/// For a server or event thread that cannot install its filter: ends the
/// VMM (the thread must not serve unfiltered, and has nobody to report
/// to).
pub(crate) fn fatal(e: SeccompError) -> String {
    eprintln!("shoal-vmm: error: {e}");
    std::process::exit(1)
}

/// A call no role allows: `socket(AF_PACKET, SOCK_RAW, 0)`.
fn forbidden_call() {
    // SAFETY: socket(2) with constant arguments; a descriptor it might
    // return (without a filter) is closed at once.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    if fd >= 0 {
        // SAFETY: `fd` was just returned and is owned by nothing else.
        unsafe { libc::close(fd) };
    }
}

/// Each role with the names of the syscalls it allows (sorted).
pub fn allowed() -> Result<Vec<(Role, Vec<&'static str>)>, SeccompError> {
    Role::ALL
        .into_iter()
        .map(|r| Ok((r, r.table()?.names())))
        .collect()
}

/// `role: count: names...`, one line per role (`shoal-vmm --print-seccomp`).
pub fn summary() -> Result<String, SeccompError> {
    let mut out = String::new();
    for (r, names) in allowed()? {
        out.push_str(&format!("{r}: {}: {}\n", names.len(), names.join(" ")));
    }
    Ok(out)
}

/// glibc gives threads malloc arenas of their own, and shrinking one reads
/// `/proc/sys/vm/overcommit_memory`: an `openat` that no filtered thread
/// may make (a vCPU thread that freed a burst of vsock buffers was killed
/// for it). One arena, the main one, trimmed with `brk`, serves every
/// thread instead; the VMM's few threads barely contend for it. Call
/// before any thread starts.
pub fn single_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets one of malloc's tunables; no thread has
    // started yet, so nothing allocates concurrently.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_compiles_to_bpf_for_both_actions() {
        for v in [Violation::Kill, Violation::Log] {
            let f = Filters::new(v).unwrap();
            assert_eq!(f.progs.len(), Role::ALL.len());
            for (r, p) in &f.progs {
                assert!(!p.is_empty(), "{r}");
                // The kernel takes at most BPF_MAXINSNS (4096) instructions.
                assert!(p.len() < 4096, "{r}: {} instructions", p.len());
            }
        }
    }

    #[test]
    fn roles_allow_what_they_need_and_not_more() {
        let t = |r: Role| r.table().unwrap();
        let (main, vcpu, events, api) =
            (t(Role::Main), t(Role::Vcpu), t(Role::Events), t(Role::Api));
        // Never: starting programs, tracing, mounting, namespaces, raw
        // memory of other processes.
        for nr in [
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_ptrace,
            libc::SYS_mount,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_process_vm_writev,
            libc::SYS_kexec_load,
            libc::SYS_bpf,
            libc::SYS_perf_event_open,
        ] {
            for (r, tab) in [
                ("main", &main),
                ("vcpu", &vcpu),
                ("events", &events),
                ("api", &api),
            ] {
                assert!(!tab.allows(nr), "{r} allows syscall {nr}");
            }
        }
        // Only the main thread opens files or starts threads.
        for nr in [libc::SYS_openat, libc::SYS_clone, libc::SYS_clone3] {
            assert!(main.allows(nr));
            for tab in [&vcpu, &events, &api] {
                assert!(!tab.allows(nr), "syscall {nr}");
            }
        }
        assert!(vcpu.allows(libc::SYS_ioctl) && api.allows(libc::SYS_accept4));
        assert!(!api.allows(libc::SYS_socket) && !api.allows(libc::SYS_connect));
        // The main role includes the vCPU role (threads it starts run
        // under both filters).
        for n in vcpu.names() {
            assert!(main.names().contains(&n), "main lacks {n}");
        }
    }

    #[test]
    fn summary_names_every_role_with_its_count() {
        let s = summary().unwrap();
        for r in Role::ALL {
            let line = s
                .lines()
                .find(|l| l.starts_with(&format!("{r}: ")))
                .unwrap();
            let count: usize = line.split(": ").nth(1).unwrap().parse().unwrap();
            let names = line.split(": ").nth(2).unwrap().split(' ').count();
            assert_eq!(count, names, "{line}");
        }
        assert!("vcpu".parse::<Role>().is_ok() && "nope".parse::<Role>().is_err());
    }

    /// Forks a child that installs `role`'s filter, then runs `then`;
    /// returns the child's wait status.
    fn in_child(f: &Filters, role: Role, then: fn()) -> i32 {
        // SAFETY: the child only makes system calls (no allocation, no
        // locks) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = i32::from(f.install(role).is_err());
            then();
            // SAFETY: ends the forked child without running destructors.
            unsafe { libc::_exit(code) };
        }
        let mut st = 0;
        // SAFETY: waits for the child just forked; `st` is a valid local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        st
    }

    /// Where the balloon test's two mappings are (set before forking).
    static ANON: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    static PRIVATE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn map(flags: libc::c_int, fd: libc::c_int) -> usize {
        // SAFETY: a new 2-page mapping at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as usize
    }

    /// What the balloon does on a vCPU thread when the guest gives pages
    /// back: `MADV_DONTNEED` on anonymous RAM, fresh anonymous memory
    /// mapped over a private file mapping. The VMM never maps guest RAM
    /// shared, so `MADV_REMOVE` (which punches holes in files) stays
    /// forbidden.
    #[test]
    fn the_vcpu_role_lets_the_balloon_give_pages_back_and_no_more() {
        use std::sync::atomic::Ordering::SeqCst;
        // SAFETY: a memfd with a constant name; checked below.
        let fd = unsafe { libc::memfd_create(c"seccomp-balloon".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: sizes the memfd just made.
        assert_eq!(unsafe { libc::ftruncate(fd, 8192) }, 0);
        ANON.store(map(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1), SeqCst);
        PRIVATE.store(map(libc::MAP_PRIVATE, fd), SeqCst);
        let f = Filters::new(Violation::Kill).unwrap();
        let st = in_child(&f, Role::Vcpu, || {
            // SAFETY: the child's copies of the mappings made above; only
            // their pages change.
            unsafe {
                let a = ANON.load(SeqCst) as *mut libc::c_void;
                if libc::madvise(a, 8192, libc::MADV_DONTNEED) != 0 {
                    libc::_exit(2);
                }
                let p = PRIVATE.load(SeqCst) as *mut libc::c_void;
                let flags =
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
                let prot = libc::PROT_READ | libc::PROT_WRITE;
                if libc::mmap(p, 8192, prot, flags, -1, 0) != p {
                    libc::_exit(3);
                }
            }
        });
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "{st:#x}");
        let st = in_child(&f, Role::Vcpu, || {
            // SAFETY: as above; the filter kills the child first.
            unsafe {
                let p = PRIVATE.load(SeqCst) as *mut libc::c_void;
                libc::madvise(p, 8192, libc::MADV_REMOVE);
            }
        });
        assert!(
            libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGSYS,
            "{st:#x}"
        );
        // SAFETY: closes the memfd made above (the mappings stay valid).
        unsafe { libc::close(fd) };
    }

    #[test]
    fn a_forbidden_call_kills_the_process_with_sigsys_and_allowed_ones_pass() {
        let f = Filters::new(Violation::Kill).unwrap();
        for role in Role::ALL {
            let st = in_child(&f, role, forbidden_call);
            assert!(
                libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGSYS,
                "{role}: wait status {st:#x}"
            );
            let st = in_child(&f, role, || {
                // SAFETY: getpid has no arguments.
                unsafe { libc::getpid() };
            });
            assert!(
                libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
                "{role}: {st:#x}"
            );
        }
        // What the main thread does for a restore into a pre-warmed VM:
        // duplicate a descriptor, start a thread that installs its filter.
        let st = in_child(&f, Role::Main, || {
            // SAFETY: duplicates stdin (or fails); no memory is passed.
            let fd = unsafe { libc::fcntl(0, libc::F_DUPFD_CLOEXEC, 3) };
            // SAFETY: `fd` (if any) was just returned and is ours.
            unsafe { libc::close(fd) };
        });
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "main: {st:#x}"
        );
        // The selftest hook makes the call itself.
        let f = Filters::new(Violation::Kill)
            .unwrap()
            .with_selftest(Some(Role::Api));
        let st = in_child(&f, Role::Api, || {});
        assert!(
            libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGSYS,
            "{st:#x}"
        );
        let st = in_child(&f, Role::Vcpu, || {});
        assert!(libc::WIFEXITED(st), "{st:#x}");
    }
}
