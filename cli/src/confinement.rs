//! `shoal doctor`'s confinement section: what each VMM a daemon started
//! by this user on this host gets (jailer, namespaces, uid, cgroup,
//! seccomp, limits), and what this host lacks, said plainly.

use serde::Serialize;
use shoal_jailer::cgroup::{self, Version};
use shoal_jailer::{uids, CgroupSpec, Rlimits};
use shoal_runtime::jail::{JailConfig, CPU_WEIGHT, OVERHEAD_BYTES};
use std::path::Path;

/// One line of the section.
#[derive(Debug, Serialize)]
pub struct Item {
    /// What.
    pub name: &'static str,
    /// Whether VMMs get it here.
    pub applied: bool,
    /// What it is on this host.
    pub detail: String,
}

fn item(name: &'static str, applied: bool, detail: impl Into<String>) -> Item {
    Item {
        name,
        applied,
        detail: detail.into(),
    }
}

/// Whether the kernel can kill a process from a seccomp filter.
fn seccomp_kill_process() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail")
        .is_ok_and(|s| s.split_whitespace().any(|a| a == "kill_process"))
}

/// The confinement of a VMM started by a daemon with `vmm` as its VMM.
pub fn report(vmm: &Path) -> Vec<Item> {
    // SAFETY: geteuid takes no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let off = std::env::var_os("SHOAL_JAIL").is_some_and(|v| v == "0");
    let jailer = JailConfig::find_jailer(vmm);
    let jailed = root && !off && jailer.is_some();
    let why_not = if !root {
        "not root: VMMs run as this user, unjailed".to_string()
    } else if off {
        "SHOAL_JAIL=0: VMMs run unjailed".to_string()
    } else if jailer.is_none() {
        "no shoal-jailer found (a root daemon refuses to start without it)".to_string()
    } else {
        String::new()
    };
    let mut v = vec![item(
        "jailer",
        jailed,
        match &jailer {
            Some(j) if jailed => format!("{} before every VMM", j.display()),
            _ => why_not.clone(),
        },
    )];
    let ns: Vec<&str> = ["mnt", "pid", "net", "ipc", "uts"]
        .into_iter()
        .filter(|n| Path::new("/proc/self/ns").join(n).exists())
        .collect();
    v.push(item(
        "namespaces",
        jailed && ns.len() == 5,
        format!("own {} (network: empty, no interfaces)", ns.join(", ")),
    ));
    v.push(item(
        "root",
        jailed,
        "pivot_root into a tmpfs with only bind mounts of the VMM's files at their own \
         paths (images read-only, same inode), /dev/kvm and /dev/null",
    ));
    v.push(item(
        "uid",
        jailed,
        format!(
            "one unprivileged uid per sandbox from {:#x} ({} slots), gid {:#x} shared \
             for reading templates; no capabilities, no_new_privs",
            uids::UID_BASE,
            uids::SLOTS,
            uids::SHARED_GID
        ),
    ));
    let r = Rlimits::default();
    v.push(item(
        "rlimits",
        jailed,
        format!(
            "NOFILE {}, MEMLOCK {}, CORE 0; descriptors above 2 closed but those passed; \
             environment cleared",
            r.nofile, r.memlock
        ),
    ));
    let spec = CgroupSpec {
        memory_bytes: Some(OVERHEAD_BYTES),
        pids_max: Some(256),
        cpu_weight: Some(CPU_WEIGHT),
    };
    v.push(match cgroup::plan_here("doctor", &spec) {
        Ok(p) => item(
            "cgroup",
            jailed,
            format!(
                "{} per VMM (memory = guest RAM + images + {} MiB, pids 256, cpu weight {}){}",
                match p.version {
                    Version::V2 => "cgroup v2",
                    Version::V1 => "cgroup v1 memory, pids and cpu controllers",
                },
                OVERHEAD_BYTES >> 20,
                CPU_WEIGHT,
                if p.version == Version::V1 {
                    "; the unified hierarchy has no controllers on this host"
                } else {
                    ""
                }
            ),
        ),
        Err(e) => item("cgroup", false, format!("none: {e}")),
    });
    let kill = seccomp_kill_process();
    let counts = vmm::seccomp::allowed()
        .map(|roles| {
            roles
                .iter()
                .map(|(r, calls)| format!("{} {}", r.name(), calls.len()))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_else(|e| format!("filters do not build: {e}"));
    v.push(item(
        "seccomp",
        kill,
        if kill {
            format!("a filter per VMM thread, kills the process; syscalls allowed: {counts}")
        } else {
            "this kernel cannot kill a process from a filter (no kill_process in \
             /proc/sys/kernel/seccomp/actions_avail)"
                .to_string()
        },
    ));
    v.push(item(
        "stock",
        jailed,
        if jailed {
            "shoald --vmm-stock N (default 1): per template, N VMMs started ahead in \
             their jails (uid, namespaces, root, cgroup) and pre-warmed; a create \
             then only restores, under the same confinement"
                .to_string()
        } else {
            "stocked VMMs (shoald --vmm-stock) run as unconfined as the others".to_string()
        },
    ));
    v.push(item(
        "cpu class",
        true,
        format!(
            "create --priority latency (default: normal policy, cpu weight {CPU_WEIGHT}) or \
             best_effort (every VMM thread SCHED_IDLE, cpu weight {}), set by the daemon \
             after every start, pool or stock take, reattach and change",
            shoald::cpu_share::BEST_EFFORT_WEIGHT
        ),
    ));
    let core = shoal_runtime::sched::core_sched();
    v.push(item("smt", core.isolates(), core.describe()));
    v
}

/// The section as text.
pub fn text(items: &[Item]) -> String {
    let mut s = String::from("Confinement of each VMM:\n");
    for i in items {
        s.push_str(&format!(
            "  {:<11} {:<4} {}\n",
            i.name,
            if i.applied { "yes" } else { "no" },
            i.detail
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_of_the_confinement_is_reported() {
        let items = report(Path::new("/nonexistent/shoal-vmm"));
        let names: Vec<_> = items.iter().map(|i| i.name).collect();
        assert_eq!(
            names,
            [
                "jailer",
                "namespaces",
                "root",
                "uid",
                "rlimits",
                "cgroup",
                "seccomp",
                "stock",
                "cpu class",
                "smt"
            ]
        );
        let seccomp = items.iter().find(|i| i.name == "seccomp").unwrap();
        if seccomp.applied {
            assert!(seccomp.detail.contains("vcpu "), "{}", seccomp.detail);
        }
        let smt = items.iter().find(|i| i.name == "smt").unwrap();
        assert_eq!(smt.applied, shoal_runtime::sched::core_sched().isolates());
        if !smt.applied {
            assert!(smt.detail.starts_with("off: "), "{}", smt.detail);
        }
        let t = text(&items);
        assert!(t.starts_with("Confinement of each VMM:\n"), "{t}");
        assert_eq!(t.lines().count(), 1 + items.len());
    }
}
