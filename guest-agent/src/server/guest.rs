//! Guest-only duties of the agent: the user cgroup, its own OOM immunity,
//! reseeding and clock stepping after a snapshot restore, power-off.

use std::ffi::{c_int, CStr, CString};

use super::os::{self, Errno};
use crate::sys::report;
use agent_proto::{AgentMode, PostRestore, PostRestoreReply, PowerAction};

/// Parent cgroup of every user command (one child cgroup per exec).
const USER_CGROUP: &CStr = c"/sys/fs/cgroup/shoal-user";
/// Memory kept out of the user cgroup's reach for the kernel and the agent.
const RESERVED_MEMORY: u64 = 24 << 20;
/// pids.max of the user cgroup at most.
const USER_PIDS_MAX: u64 = 4096;
/// Tasks kept out of the user cgroup's reach below the kernel's
/// threads-max (which is small in a small guest: ~1,000 at 128 MiB), so a
/// fork bomb never takes the last task slots from the agent and the kernel.
const RESERVED_TASKS: u64 = 64;
/// cpu.weight of the user cgroup. The agent (and the kernel's threads) stay
/// in the root cgroup, where each task competes with the user cgroup as a
/// whole: with the default weight (100, a nice-0 task's) the agent gets
/// half the CPU however many processes a fork bomb starts.
const USER_CPU_WEIGHT: &[u8] = b"100";
/// The agent's nice value: ahead of user tasks that escaped to the root
/// cgroup. Children start at 0 again (SCHED_RESET_ON_FORK).
const AGENT_NICE: c_int = -10;

/// What guest set-up produced.
#[derive(Debug, Default)]
pub struct Guest {
    /// cgroup v2 is usable: each exec gets `shoal-user/e<id>`.
    pub cgroups: bool,
}

impl Guest {
    /// The cgroup directory and its cgroup.procs for exec `id`.
    pub fn exec_cgroup(&self, id: u64) -> Option<(CString, CString)> {
        if !self.cgroups {
            return None;
        }
        let dir = format!("{}/e{id}", USER_CGROUP.to_string_lossy());
        let procs = format!("{dir}/cgroup.procs");
        Some((CString::new(dir).ok()?, CString::new(procs).ok()?))
    }
}

/// Sets oom_score_adj to -1000 and creates the user cgroup with memory.max
/// below the guest's memory and a pids.max. Failures are reported on the
/// console and leave the feature off.
pub fn setup() -> Guest {
    if let Err(e) = os::write_file(c"/proc/self/oom_score_adj", b"-1000") {
        report("oom_score_adj", e.0);
    }
    prioritize_agent();
    // Not dumpable: ptrace and /proc/1/mem then need CAP_SYS_PTRACE, which
    // no command has (see launch.rs).
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        report("PR_SET_DUMPABLE", crate::sys::errno());
    }
    let mut g = Guest::default();
    // SAFETY: the path is a NUL-terminated static string.
    if unsafe { libc::access(c"/sys/fs/cgroup/cgroup.procs".as_ptr(), libc::F_OK) } != 0 {
        return g; // no cgroup2 mounted
    }
    // Enabling fails (ENOENT) for a controller the kernel lacks or that is
    // bound elsewhere: try both, then each alone, and go on without.
    let ctl = c"/sys/fs/cgroup/cgroup.subtree_control";
    if os::write_file(ctl, b"+memory +pids +cpu").is_err() {
        for c in [&b"+memory"[..], b"+pids", b"+cpu"] {
            if let Err(e) = os::write_file(ctl, c) {
                report(&format!("cgroup {}", String::from_utf8_lossy(c)), e.0);
            }
        }
    }
    match os::mkdir(USER_CGROUP, 0o755) {
        Ok(()) | Err(Errno(libc::EEXIST)) => {}
        Err(e) => {
            report("mkdir /sys/fs/cgroup/shoal-user", e.0);
            return g;
        }
    }
    g.cgroups = true;
    if let Some(total) = total_memory() {
        let limit = user_memory_max(total);
        let path = c"/sys/fs/cgroup/shoal-user/memory.max";
        if let Err(e) = os::write_file(path, limit.to_string().as_bytes()) {
            report("memory.max", e.0);
        }
    }
    let pids = user_pids_max(threads_max());
    let path = c"/sys/fs/cgroup/shoal-user/pids.max";
    if let Err(e) = os::write_file(path, pids.to_string().as_bytes()) {
        report("pids.max", e.0);
    }
    let path = c"/sys/fs/cgroup/shoal-user/cpu.weight";
    if let Err(e) = os::write_file(path, USER_CPU_WEIGHT) {
        // No cpu controller: only the agent's nice value helps.
        if e.0 != libc::ENOENT {
            report("cpu.weight", e.0);
        }
    }
    g
}

/// Puts the agent ahead of user tasks in the scheduler: nice
/// [`AGENT_NICE`], with SCHED_RESET_ON_FORK so that every command it starts
/// runs at nice 0 again.
pub fn prioritize_agent() {
    // SAFETY: sched_param is plain data; zero priority is what SCHED_OTHER
    // requires.
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    // A raw system call: musl's sched_setscheduler() only returns ENOSYS.
    // SAFETY: plain syscall with a valid sched_param.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0,
            libc::SCHED_OTHER | SCHED_RESET_ON_FORK,
            &param,
        )
    };
    if r != 0 {
        report("sched_setscheduler", crate::sys::errno());
        return; // without the reset, children would inherit the nice value
    }
    // SAFETY: plain syscall. PRIO_PROCESS's type differs between libcs.
    #[allow(clippy::useless_conversion)]
    if unsafe { libc::setpriority(libc::PRIO_PROCESS.try_into().unwrap_or(0), 0, AGENT_NICE) } != 0
    {
        report("setpriority", crate::sys::errno());
    }
}

/// `SCHED_RESET_ON_FORK` (not in every libc crate target).
const SCHED_RESET_ON_FORK: c_int = 0x4000_0000;

/// The kernel's task limit, from /proc/sys/kernel/threads-max.
fn threads_max() -> Option<u64> {
    let fd = os::open(c"/proc/sys/kernel/threads-max", libc::O_RDONLY, 0).ok()?;
    let mut buf = [0u8; 32];
    let n = os::read(os::fd_ref(&fd), &mut buf).ok()?;
    std::str::from_utf8(buf.get(..n)?).ok()?.trim().parse().ok()
}

/// pids.max of the user cgroup: [`USER_PIDS_MAX`], or less where the
/// kernel's threads-max would be reached first (a fork bomb must hit
/// pids.max, not the global limit the agent's own clone needs).
pub fn user_pids_max(threads_max: Option<u64>) -> u64 {
    match threads_max {
        Some(t) => t
            .saturating_sub(RESERVED_TASKS)
            .clamp(RESERVED_TASKS, USER_PIDS_MAX),
        None => USER_PIDS_MAX,
    }
}

/// memory.max of the user cgroup in a guest of `total` bytes of RAM.
pub fn user_memory_max(total: u64) -> u64 {
    total.saturating_sub(RESERVED_MEMORY).max(total / 2)
}

/// Room left in the user cgroup for processes when the tmpfs upper layer
/// is full.
const PROCESS_RESERVE: u64 = 24 << 20;

/// The most a tmpfs the user can fill (the upper layer, and /tmp with a
/// scratch-disk upper) may hold in a guest of `total` bytes: what is
/// written there cannot be reclaimed (no swap) and counts against the user
/// cgroup, so it is capped below the cgroup's memory.max with room for
/// processes. A write past it fails with ENOSPC instead of OOM-killing the
/// user's processes.
pub fn tmpfs_budget(total: u64) -> u64 {
    let limit = user_memory_max(total);
    limit.saturating_sub(PROCESS_RESERVE).max(limit / 2)
}

/// Total RAM from sysinfo(2).
pub fn total_memory() -> Option<u64> {
    // SAFETY: sysinfo is plain data; all-zero is valid.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: si is a valid out pointer.
    if unsafe { libc::sysinfo(&mut si) } != 0 {
        return None;
    }
    si.totalram.checked_mul(u64::from(si.mem_unit.max(1)))
}

/// Kills everything in an exec's cgroup (cgroup.kill, Linux 5.14+).
pub fn kill_cgroup(dir: &CStr) {
    let mut p = dir.to_bytes().to_vec();
    p.extend_from_slice(b"/cgroup.kill");
    if let Ok(path) = CString::new(p) {
        let _ = os::write_file(&path, b"1");
    }
}

/// The type of ioctl(2)'s request argument: `c_int` in musl, `c_ulong` in
/// glibc (the request numbers below fit both).
#[cfg(target_env = "musl")]
type IoctlRequest = libc::c_int;
#[cfg(not(target_env = "musl"))]
type IoctlRequest = libc::c_ulong;

/// RNDADDENTROPY = `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: IoctlRequest = 0x4008_5203;

/// `struct rand_pool_info` with room for 64 bytes.
#[repr(C)]
struct RandPoolInfo {
    entropy_count: c_int,
    buf_size: c_int,
    buf: [u8; 64],
}

/// `_IO('R', 0x07)`: reseed the kernel CRNG from the input pool.
const RNDRESEEDCRNG: IoctlRequest = 0x5207;

/// Reseeds the RNG and (in the guest) steps the clock.
pub fn post_restore(mode: AgentMode, req: &PostRestore) -> Result<PostRestoreReply, Errno> {
    let fd = os::open(c"/dev/urandom", libc::O_WRONLY, 0)?;
    let mut credited = false;
    if mode == AgentMode::Guest {
        let info = RandPoolInfo {
            entropy_count: 512,
            buf_size: 64,
            buf: req.entropy,
        };
        // SAFETY: info is a valid rand_pool_info of the size announced in
        // buf_size; the ioctl only reads it.
        let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&fd), RNDADDENTROPY, &info) };
        credited = r == 0;
        if credited {
            // Rekey the CRNG from the pool now: otherwise every clone of a
            // snapshot keeps producing the same /dev/urandom stream until
            // the kernel's next periodic reseed.
            // SAFETY: RNDRESEEDCRNG takes no argument.
            unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&fd), RNDRESEEDCRNG) };
        }
    }
    if !credited {
        // Mixed in without credit (host mode: never claim entropy there).
        os::write_all(os::fd_ref(&fd), &req.entropy)?;
    }
    let mut clock_set = false;
    if mode == AgentMode::Guest && req.unix_time_ns != 0 {
        // SAFETY: timespec is plain data; zero is valid.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        ts.tv_sec = (req.unix_time_ns / 1_000_000_000)
            .try_into()
            .map_err(|_| Errno(libc::EINVAL))?;
        ts.tv_nsec = (req.unix_time_ns % 1_000_000_000).try_into().unwrap_or(0);
        // SAFETY: ts is a valid timespec.
        if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
            return Err(Errno::last());
        }
        clock_set = true;
    }
    Ok(PostRestoreReply {
        entropy_credited: credited,
        clock_set,
    })
}

/// Powers off or reboots (guest), or exits (host). Never returns.
pub fn power(mode: AgentMode, action: PowerAction) -> ! {
    if mode == AgentMode::Guest {
        let cmd = match action {
            PowerAction::Poweroff => libc::RB_POWER_OFF,
            PowerAction::Reboot => libc::RB_AUTOBOOT,
        };
        // SAFETY: sync and reboot have no memory-safety preconditions.
        unsafe {
            libc::sync();
            libc::reboot(cmd);
        }
        report("reboot", crate::sys::errno());
        // PID 1 must not exit; stay alive reaping.
        crate::spawn::reap_forever()
    }
    // SAFETY: _exit ends the process without running anything else.
    unsafe { libc::_exit(0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_pids_stay_below_the_kernels_task_limit() {
        assert_eq!(user_pids_max(None), USER_PIDS_MAX);
        assert_eq!(user_pids_max(Some(1_000_000)), USER_PIDS_MAX);
        // A 128 MiB guest's threads-max.
        assert_eq!(user_pids_max(Some(925)), 925 - RESERVED_TASKS);
        assert_eq!(user_pids_max(Some(20)), RESERVED_TASKS);
    }
}
