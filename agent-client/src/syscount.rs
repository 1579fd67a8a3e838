//! Counting the agent's own system calls in an `strace -f -qq -o FILE`
//! trace, between markers the client leaves ([`mark`]). Used by the
//! syscall test and `shoal bench exec` (`agent_syscalls_per_exec`).

use crate::Client;
use std::collections::BTreeMap;

/// Syscalls of one traced phase.
#[derive(Default, Debug)]
pub struct Phase {
    /// The agent's own syscalls, by name.
    pub agent: BTreeMap<String, usize>,
    /// `fcntl(fd, F_GETFD)` before each close: std's debug-build check in
    /// `OwnedFd::drop`, absent from release builds (not counted above).
    pub debug_checks: usize,
    /// Syscalls of children before (and including) their successful execve.
    pub pre_exec: BTreeMap<String, usize>,
    /// Syscalls of the commands after their exec.
    pub command: usize,
}

impl Phase {
    /// All of the agent's own syscalls.
    pub fn agent_total(&self) -> usize {
        self.agent.values().sum()
    }
    /// All syscalls of children before their exec.
    pub fn pre_exec_total(&self) -> usize {
        self.pre_exec.values().sum()
    }
}

/// Leaves a marker `/shoal-mark-NAME` in the agent's trace (a failing stat).
pub fn mark(c: &Client, name: &str) {
    // A stat of a path that does not exist shows up in the trace.
    let _ = c.stat(format!("/shoal-mark-{name}"));
}

/// Splits `PID rest` lines; returns None for non-syscall lines.
fn split(line: &str) -> Option<(u32, &str)> {
    let (pid, rest) = line.split_once(' ')?;
    let pid = pid.parse().ok()?;
    let rest = rest.trim_start();
    if rest.starts_with("---") || rest.starts_with("+++") {
        return None;
    }
    Some((pid, rest))
}

/// Counts the syscalls between the `PHASE-start` and `PHASE-end` markers
/// of an `strace -f -qq` trace of the agent. `None` if a marker or the
/// agent's execve is missing.
pub fn analyse(trace: &str, phase: &str) -> Option<Phase> {
    let lines: Vec<&str> = trace.lines().collect();
    // The process that exec'd the agent (under unshare it is not the first).
    let agent_pid = lines
        .iter()
        .filter_map(|l| split(l))
        .find(|(_, rest)| rest.starts_with("execve(") && rest.contains("shoal-agent"))
        .map(|(p, _)| p)?;
    let start = lines
        .iter()
        .position(|l| l.contains(&format!("/shoal-mark-{phase}-start")))?;
    let end = lines
        .iter()
        .position(|l| l.contains(&format!("/shoal-mark-{phase}-end")))?;
    let mut p = Phase::default();
    let mut execd = std::collections::HashSet::new();
    for line in lines.get(start + 1..end)? {
        let Some((pid, rest)) = split(line) else {
            continue;
        };
        let resumed = rest.starts_with("<...");
        let name = if resumed {
            rest.trim_start_matches("<... ")
                .split(' ')
                .next()
                .unwrap_or("?")
        } else {
            rest.split('(').next().unwrap_or("?")
        }
        .to_string();
        if pid == agent_pid {
            if rest.starts_with("fcntl(") && rest.contains("F_GETFD") {
                p.debug_checks += 1;
                continue;
            }
            if !resumed {
                *p.agent.entry(name).or_default() += 1;
            }
            continue;
        }
        if execd.contains(&pid) {
            if !resumed {
                p.command += 1;
            }
            continue;
        }
        if !resumed {
            *p.pre_exec.entry(name.clone()).or_default() += 1;
        }
        if name == "execve" && rest.trim_end().ends_with("= 0") {
            execd.insert(pid);
        }
    }
    Some(p)
}
