//! Host capability detection: what this host offers a microVM monitor, and
//! what Shoal does about each item (`shoal-vmm --check-host`, `shoal doctor`).

use serde::Serialize;
use std::path::Path;

/// How /dev/kvm is implemented on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvmKind {
    /// Hardware virtualization (VT-x or AMD-V).
    Hardware,
    /// PVM: pagetable-based software virtualization (`kvm_pvm` module).
    Pvm,
    /// /dev/kvm is missing or unusable.
    None,
}

impl KvmKind {
    /// Short name used in benchmark JSON (`host_kvm`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hardware => "hardware",
            Self::Pvm => "pvm",
            Self::None => "none",
        }
    }
}

/// One line of the host report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Whether the host has it.
    pub available: bool,
    /// What was found.
    pub detail: String,
    /// What Shoal does about it.
    pub action: String,
}

/// The full host report.
#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    /// KVM implementation.
    pub kvm: KvmKind,
    /// Whether this host itself runs under a hypervisor.
    pub nested: bool,
    /// Individual checks.
    pub checks: Vec<Check>,
}

fn cpu_flags() -> Vec<String> {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("flags"))
                .map(|l| l.split_whitespace().skip(2).map(String::from).collect())
        })
        .unwrap_or_default()
}

/// Whether /dev/kvm is served by the PVM module.
pub fn is_pvm() -> bool {
    Path::new("/sys/module/kvm_pvm").exists()
}

/// Detects the KVM implementation.
pub fn kvm_kind() -> KvmKind {
    let usable = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    if !usable {
        return KvmKind::None;
    }
    if is_pvm() {
        return KvmKind::Pvm;
    }
    let flags = cpu_flags();
    if flags.iter().any(|f| f == "vmx" || f == "svm") {
        KvmKind::Hardware
    } else {
        // /dev/kvm works without vmx/svm and without kvm_pvm: some other
        // software implementation; treat it like PVM (conservative CPUID).
        KvmKind::Pvm
    }
}

fn core_scheduling() -> (bool, String) {
    const PR_SCHED_CORE: libc::c_int = 62;
    const PR_SCHED_CORE_GET: libc::c_ulong = 0;
    let mut cookie: u64 = 0;
    // SAFETY: PR_SCHED_CORE_GET writes one u64 to the pointer we pass, which
    // points at a live local; other arguments are plain integers.
    let r = unsafe {
        libc::prctl(
            PR_SCHED_CORE,
            PR_SCHED_CORE_GET,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            &mut cookie as *mut u64 as libc::c_ulong,
        )
    };
    if r == 0 {
        (true, "prctl(PR_SCHED_CORE) works".into())
    } else {
        let e = std::io::Error::last_os_error();
        (false, format!("prctl(PR_SCHED_CORE) failed: {e}"))
    }
}

fn damon() -> (bool, String) {
    let admin = Path::new("/sys/kernel/mm/damon/admin");
    if !admin.exists() {
        return (
            false,
            "no /sys/kernel/mm/damon/admin (DAMON sysfs absent)".into(),
        );
    }
    // avail_operations is readable on any existing context.
    let ops = std::fs::read_dir(admin.join("kdamonds"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|k| std::fs::read_to_string(k.path().join("contexts/0/avail_operations")).ok())
        .next();
    match ops {
        Some(o) => {
            let o = o.split_whitespace().collect::<Vec<_>>().join(",");
            (o.contains("vaddr"), format!("DAMON sysfs; operations: {o}"))
        }
        None => (
            false,
            "DAMON sysfs present; no context to list operations (this host: paddr only)".into(),
        ),
    }
}

fn cgroup_v2() -> (bool, String) {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        return (true, "unified hierarchy at /sys/fs/cgroup".into());
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let v2 = mounts
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("cgroup2"))
        .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
        .collect::<Vec<_>>();
    if v2.is_empty() {
        (false, "cgroup v1 only".into())
    } else {
        (
            false,
            format!("v1 controllers; cgroup2 mounted at {}", v2.join(",")),
        )
    }
}

/// Runs every check.
pub fn detect() -> HostReport {
    let kvm = kvm_kind();
    let nested = cpu_flags().iter().any(|f| f == "hypervisor");
    let mut checks = Vec::new();
    checks.push(Check {
        name: "kvm",
        available: kvm != KvmKind::None,
        detail: match kvm {
            KvmKind::Hardware => "hardware virtualization (vmx/svm)".into(),
            KvmKind::Pvm => "PVM: software virtualization by shadow paging (kvm_pvm)".into(),
            KvmKind::None => "/dev/kvm missing or not accessible".into(),
        },
        action: match kvm {
            KvmKind::Hardware => "CPU profile 'host'".into(),
            KvmKind::Pvm => format!(
                "CPU profile 'pvm' (hides {}); adds shoal.pvm to the guest command line; \
                 guest kernel code runs ~1000x slower: use snapshots, not boots",
                crate::cpu::cpuid::pvm_hidden_names().join(",")
            ),
            KvmKind::None => {
                "cannot run VMs: load kvm_intel/kvm_amd or grant access to /dev/kvm".into()
            }
        },
    });
    checks.push(Check {
        name: "nested",
        available: nested,
        detail: if nested {
            "this host runs under a hypervisor".into()
        } else {
            "bare metal".into()
        },
        action: "informational".into(),
    });
    let uffd = Path::new("/dev/userfaultfd").exists();
    checks.push(Check {
        name: "userfaultfd",
        available: uffd,
        detail: if uffd {
            "/dev/userfaultfd present".into()
        } else {
            "absent".into()
        },
        action: if uffd {
            "available for lazy snapshot memory loading".into()
        } else {
            "snapshot memory is mapped copy-on-write from the file instead".into()
        },
    });
    let (sc, d) = core_scheduling();
    checks.push(Check {
        name: "core_scheduling",
        available: sc,
        detail: d,
        action: if sc {
            "each sandbox gets its own core-scheduling cookie".into()
        } else {
            "NOT isolating hyper-threads between sandboxes (kernel lacks CONFIG_SCHED_CORE); \
             disable SMT on multi-tenant hosts"
                .into()
        },
    });
    let vv = Path::new("/dev/vhost-vsock").exists();
    checks.push(Check {
        name: "vhost_vsock",
        available: vv,
        detail: if vv {
            "/dev/vhost-vsock present".into()
        } else {
            "absent".into()
        },
        action: "vsock is served in the VMM process (userspace virtio-vsock) either way".into(),
    });
    let (dm, d) = damon();
    checks.push(Check {
        name: "damon_vaddr",
        available: dm,
        detail: d,
        action: "not used: idle sandboxes' memory is evicted by the VMM (see cold_memory)".into(),
    });
    let swap = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let areas = swap
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count();
    checks.push(cold_memory_check(crate::evict_mode::host_mode(), areas));
    checks.push(Check {
        name: "balloon",
        available: true,
        detail: "in this VMM: stats, deflate-on-OOM, free page reporting".into(),
        action: "pages a guest frees are given back to the host at once in sandboxes whose \
                 template has a balloon (shoald: new templates, unless --no-balloon)"
            .into(),
    });
    let (cg, d) = cgroup_v2();
    checks.push(Check {
        name: "cgroup_v2",
        available: cg,
        detail: d,
        action: if cg {
            "VMM limits via cgroup v2".into()
        } else {
            "VMM limits via cgroup v1 controllers".into()
        },
    });
    HostReport {
        kvm,
        nested,
        checks,
    }
}

/// The `cold_memory` line: how this host's VMMs evict an idle sandbox's
/// private guest memory (`vm::evict`), `areas` swap areas listed.
fn cold_memory_check(mode: crate::evict_mode::Mode, areas: usize) -> Check {
    use crate::evict_mode::Mode;
    Check {
        name: "cold_memory",
        available: true,
        detail: match areas {
            0 => "no swap (/proc/swaps lists none)".into(),
            n => format!("{n} swap area(s) in /proc/swaps"),
        },
        action: match mode {
            Mode::PageOut => "idle sandboxes' private guest memory is paged out to swap \
                              (MADV_PAGEOUT) by shoald's eviction policy (--evict-idle-s)"
                .into(),
            Mode::File => "idle sandboxes' private guest memory is written to a sparse file in \
                           the sandbox's directory and mapped back from it (no swap: \
                           MADV_PAGEOUT could not move it) by shoald's eviction policy \
                           (--evict-idle-s)"
                .into(),
        },
    }
}

impl HostReport {
    /// A human-readable table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<16} {:<5} {:<60} {}\n",
            "CHECK", "OK", "FOUND", "SHOAL WILL"
        );
        for c in &self.checks {
            s.push_str(&format!(
                "{:<16} {:<5} {:<60} {}\n",
                c.name,
                if c.available { "yes" } else { "no" },
                c.detail,
                c.action
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_covers_every_item() {
        let r = detect();
        let names: Vec<_> = r.checks.iter().map(|c| c.name).collect();
        for n in [
            "kvm",
            "nested",
            "userfaultfd",
            "core_scheduling",
            "vhost_vsock",
            "damon_vaddr",
            "cold_memory",
            "balloon",
            "cgroup_v2",
        ] {
            assert!(names.contains(&n), "{n} missing");
        }
        assert!(r.table().lines().count() == r.checks.len() + 1);
        assert!(serde_json::to_string(&r).unwrap().contains("\"kvm\""));
        // Nothing claims the balloon is the only reclaim, or DAMON is used.
        assert!(!r.table().contains("balloon free-page reporting only"));
        assert!(!r.table().contains("with DAMON vaddr"));
    }

    #[test]
    fn the_cold_memory_line_names_the_path_this_host_gets() {
        use crate::evict_mode::{host_mode, Mode};
        let r = detect();
        let line = r.checks.iter().find(|c| c.name == "cold_memory").unwrap();
        let swap = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        let has_swap = crate::evict_mode::swaps_listed(&swap);
        assert_eq!(host_mode() == Mode::PageOut, has_swap);
        assert_eq!(
            line.action.contains("MADV_PAGEOUT) by"),
            has_swap,
            "{}",
            line.action
        );
        assert_eq!(
            line.action.contains("sparse file"),
            !has_swap,
            "{}",
            line.action
        );
        assert_eq!(
            line.detail.starts_with("no swap"),
            !has_swap,
            "{}",
            line.detail
        );
        let f = cold_memory_check(Mode::File, 0);
        assert!(f.action.contains("sparse file") && f.detail.contains("no swap"));
        let p = cold_memory_check(Mode::PageOut, 2);
        assert!(p.action.contains("swap (MADV_PAGEOUT)") && p.detail.contains("2 swap"));
    }
}
