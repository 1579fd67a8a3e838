//! CPU classes of sandbox VMMs, applied to every thread of a running VM
//! process from outside it.
//!
//! - [`Class::BestEffort`]: every thread `SCHED_IDLE` (runs only when no
//!   normal thread on its CPU wants to; its cgroup's low CPU weight, which
//!   the daemon writes, does the same between cgroups).
//! - [`Class::Latency`]: every thread `SCHED_OTHER` and, where the kernel
//!   has core scheduling (`CONFIG_SCHED_CORE`), one core-scheduling cookie
//!   for the whole VMM process (`PR_SCHED_CORE_CREATE` on its thread
//!   group: its vCPU threads never share a core's SMT siblings with
//!   another sandbox's threads). [`core_sched`] probes that once.
//!
//! Why from outside rather than by the jailer before `execve`: a VMM of
//! the daemon's stock is started before the sandbox (and its class) it
//! will run is known, a warm pool's sandbox before its create claims it,
//! and a class can change while a sandbox runs. A policy and a cookie
//! are inherited by every thread a thread creates, so once every thread
//! has them (the task list is read again until a pass finds nothing to
//! change), threads the VMM starts later have them too; they survive
//! freeze/thaw and a daemon restart (the process goes on), and a new
//! process (resume from disk, fork, restore) is given them again by its
//! starter.

use std::sync::OnceLock;

/// How a sandbox's VMM threads are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Class {
    /// Normal policy, and a core-scheduling cookie where the kernel has it.
    #[default]
    Latency,
    /// `SCHED_IDLE` on every thread.
    BestEffort,
}

/// Why a class could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    /// The process's task list.
    #[error("threads of pid {pid}: {source}")]
    Tasks {
        /// The process.
        pid: i32,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A thread's policy.
    #[error("sched_setscheduler(tid {tid}, {policy}): {source}")]
    Policy {
        /// The thread.
        tid: i32,
        /// The policy asked for.
        policy: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A jailed VMM's own process was not found under its jailer.
    #[error("no VMM process under jailer {jailer}")]
    NoVmm {
        /// The jailer's pid.
        jailer: i32,
    },
    /// Threads kept appearing with the old policy.
    #[error("pid {pid}: threads still changing after {passes} passes")]
    Unsettled {
        /// The process.
        pid: i32,
        /// Passes made.
        passes: usize,
    },
}

/// What [`apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    /// Threads whose policy it changed.
    pub changed: usize,
    /// Threads the process has (at the last pass).
    pub threads: usize,
    /// A core-scheduling cookie was given to the process.
    pub core_cookie: bool,
}

/// Whether core scheduling isolates sandboxes on this host's SMT siblings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreSched {
    /// Available: latency sandboxes get a cookie each.
    On,
    /// The kernel has it but SMT is inactive: no sibling to share a core
    /// with, so sandboxes are isolated anyway.
    NoSmt,
    /// Not available: latency sandboxes' vCPUs may share a core's SMT
    /// siblings with other sandboxes' threads.
    Unavailable {
        /// Short, for a metric label: `no_sched_core` (the kernel lacks
        /// `CONFIG_SCHED_CORE`) or `prctl_error`.
        code: &'static str,
        /// Why, for people.
        reason: String,
    },
}

impl CoreSched {
    /// Whether sandboxes are kept off each other's SMT siblings.
    pub fn isolates(&self) -> bool {
        !matches!(self, CoreSched::Unavailable { .. })
    }

    /// Short, for a metric label: `on`, `no_smt`, or why it is off.
    pub fn code(&self) -> &'static str {
        match self {
            CoreSched::On => "on",
            CoreSched::NoSmt => "no_smt",
            CoreSched::Unavailable { code, .. } => code,
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            CoreSched::On => "on (core scheduling: one cookie per latency sandbox)".into(),
            CoreSched::NoSmt => "on (SMT inactive: no siblings to share)".into(),
            CoreSched::Unavailable { reason, .. } => format!("off: {reason}"),
        }
    }
}

/// `prctl` option and operations of core scheduling (linux/prctl.h).
const PR_SCHED_CORE: libc::c_int = 62;
const PR_SCHED_CORE_GET: libc::c_ulong = 0;
const PR_SCHED_CORE_CREATE: libc::c_ulong = 1;
/// `enum pid_type` values the operations take.
const PIDTYPE_PID: libc::c_ulong = 0;
const PIDTYPE_TGID: libc::c_ulong = 1;

/// Core scheduling on this host, probed once (`PR_SCHED_CORE_GET` on this
/// thread: `EINVAL` when the kernel lacks `CONFIG_SCHED_CORE`).
pub fn core_sched() -> &'static CoreSched {
    static PROBE: OnceLock<CoreSched> = OnceLock::new();
    PROBE.get_or_init(|| {
        let smt = std::fs::read_to_string("/sys/devices/system/cpu/smt/active").ok();
        probe(get_cookie_errno(), smt.as_deref())
    })
}

/// The errno of `PR_SCHED_CORE_GET` on this thread (0: it worked).
fn get_cookie_errno() -> i32 {
    let mut cookie: u64 = 0;
    // SAFETY: prctl with integer arguments and a pointer to a live u64,
    // which PR_SCHED_CORE_GET writes the cookie to.
    let r = unsafe {
        libc::prctl(
            PR_SCHED_CORE,
            PR_SCHED_CORE_GET,
            0 as libc::c_ulong,
            PIDTYPE_PID,
            &mut cookie as *mut u64 as libc::c_ulong,
        )
    };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// [`core_sched`] from the probe's errno and `smt/active`'s text.
fn probe(errno: i32, smt_active: Option<&str>) -> CoreSched {
    match errno {
        0 if smt_active.is_some_and(|s| s.trim() == "0") => CoreSched::NoSmt,
        0 => CoreSched::On,
        libc::EINVAL => CoreSched::Unavailable {
            code: "no_sched_core",
            reason: "the host kernel lacks core scheduling (CONFIG_SCHED_CORE: prctl \
                     PR_SCHED_CORE fails with EINVAL), so a latency sandbox's vCPUs may share \
                     a core's SMT siblings with other sandboxes"
                .into(),
        },
        e => CoreSched::Unavailable {
            code: "prctl_error",
            reason: format!(
                "prctl PR_SCHED_CORE failed ({}), so a latency sandbox's vCPUs may share a \
                 core's SMT siblings with other sandboxes",
                std::io::Error::from_raw_os_error(e)
            ),
        },
    }
}

/// The thread ids of process `pid`.
pub fn threads(pid: i32) -> std::io::Result<Vec<i32>> {
    let mut v: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// Thread `tid`'s policy (`libc::SCHED_*`), `None` if it is gone.
pub fn policy(tid: i32) -> Option<i32> {
    // SAFETY: sched_getscheduler takes a thread id and returns a policy or -1.
    let p = unsafe { libc::sched_getscheduler(tid) };
    (p >= 0).then_some(p)
}

/// The policy a class gives every thread.
pub fn policy_of(class: Class) -> i32 {
    match class {
        Class::Latency => libc::SCHED_OTHER,
        Class::BestEffort => libc::SCHED_IDLE,
    }
}

fn set_policy(tid: i32, policy: i32) -> std::io::Result<()> {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: a thread id, a policy and a valid sched_param.
    if unsafe { libc::sched_setscheduler(tid, policy, &p) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Passes over the task list at most, before giving up on a process that
/// keeps starting threads from threads not yet changed.
const PASSES: usize = 8;

/// Gives every thread of process `pid` `class`'s policy (and, for
/// [`Class::Latency`] where [`core_sched`] is on, a new core-scheduling
/// cookie for the whole process). Threads that end meanwhile are skipped;
/// a process that is gone is an error.
pub fn apply(pid: i32, class: Class) -> Result<Applied, SchedError> {
    let want = policy_of(class);
    let name = match class {
        Class::Latency => "SCHED_OTHER",
        Class::BestEffort => "SCHED_IDLE",
    };
    let mut out = Applied::default();
    let mut settled = false;
    for _ in 0..PASSES {
        let tids = threads(pid).map_err(|source| SchedError::Tasks { pid, source })?;
        out.threads = tids.len();
        let mut changed = 0;
        for tid in tids {
            match policy(tid) {
                None => continue,
                Some(p) if p == want => continue,
                Some(_) => {}
            }
            match set_policy(tid, want) {
                Ok(()) => changed += 1,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => {
                    return Err(SchedError::Policy {
                        tid,
                        policy: name,
                        source,
                    })
                }
            }
        }
        out.changed += changed;
        if changed == 0 {
            settled = true;
            break;
        }
    }
    if !settled {
        return Err(SchedError::Unsettled {
            pid,
            passes: PASSES,
        });
    }
    if class == Class::Latency && *core_sched() == CoreSched::On {
        let pid_arg = libc::c_ulong::try_from(pid).unwrap_or(0);
        // SAFETY: prctl with integer arguments: a new cookie for every
        // thread of process `pid` (which threads it starts inherit).
        let r = unsafe {
            libc::prctl(
                PR_SCHED_CORE,
                PR_SCHED_CORE_CREATE,
                pid_arg,
                PIDTYPE_TGID,
                0 as libc::c_ulong,
            )
        };
        out.core_cookie = r == 0;
    }
    Ok(out)
}

#[cfg(test)]
#[path = "sched_tests.rs"]
mod tests;
