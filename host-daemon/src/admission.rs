//! Admission: a new VMM is admitted only while the reserved guest memory
//! and vCPUs stay within the host's size times an overcommit ratio, the
//! host still has real memory available, and the sandbox count is under
//! its cap. A full host answers 429 (quota: retry after removing
//! sandboxes) or 503 (the host itself is short of memory) instead of
//! degrading every sandbox on it.

use super::db::Usage;

/// Limits, from the daemon's command line (the type `GET /v1/stats`
/// shows).
pub use shoal_api::Limits;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The reservation quota is full (HTTP 429).
    #[error("{0}")]
    Quota(String),
    /// The host is short of real memory (HTTP 503).
    #[error("{0}")]
    HostPressure(String),
}

impl Refusal {
    /// Label for the refusals metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Quota(m) if m.contains("memory") => "memory_quota",
            Refusal::Quota(m) if m.contains("vCPU") => "cpu_quota",
            Refusal::Quota(_) => "max_sandboxes",
            Refusal::HostPressure(_) => "host_memory",
        }
    }
}

/// Whether one more VMM of `vcpus` and `memory_mib` fits, given `usage`
/// and the host's MemAvailable (`available_mib`).
pub fn admit(
    l: &Limits,
    usage: &Usage,
    vcpus: u64,
    memory_mib: u64,
    available_mib: u64,
) -> Result<(), Refusal> {
    if usage.vms + 1 > l.max_vms {
        return Err(Refusal::Quota(format!(
            "host is full: {} sandboxes hold a VMM (limit {}); remove some or retry later",
            usage.vms, l.max_vms
        )));
    }
    if usage.memory_mib + memory_mib > l.memory_budget_mib() {
        return Err(Refusal::Quota(format!(
            "host is full: guest memory reserved {} MiB + {} MiB requested exceeds {} MiB \
             ({} MiB host x {} overcommit); remove sandboxes or retry later",
            usage.memory_mib,
            memory_mib,
            l.memory_budget_mib(),
            l.host_memory_mib,
            l.memory_overcommit
        )));
    }
    if usage.vcpus + vcpus > l.vcpu_budget() {
        return Err(Refusal::Quota(format!(
            "host is full: {} vCPUs reserved + {} requested exceeds {} ({} CPUs x {} overcommit); \
             remove sandboxes or retry later",
            usage.vcpus,
            vcpus,
            l.vcpu_budget(),
            l.host_cpus,
            l.cpu_overcommit
        )));
    }
    if available_mib < l.min_available_mib {
        return Err(Refusal::HostPressure(format!(
            "host memory is low: {available_mib} MiB available, below the {} MiB floor; \
             not starting more sandboxes",
            l.min_available_mib
        )));
    }
    Ok(())
}

/// A /proc/meminfo field in KiB.
pub fn meminfo_kib(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Host MemAvailable in MiB.
pub fn available_mib() -> u64 {
    meminfo_kib("MemAvailable").unwrap_or(0) / 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            host_memory_mib: 1024,
            host_cpus: 2,
            memory_overcommit: 2.0,
            cpu_overcommit: 4.0,
            min_available_mib: 100,
            max_vms: 10,
        }
    }

    fn usage(vms: u64, vcpus: u64, mem: u64) -> Usage {
        Usage {
            vms,
            vcpus,
            memory_mib: mem,
            ..Default::default()
        }
    }

    #[test]
    fn admits_within_budget() {
        assert_eq!(admit(&limits(), &usage(0, 0, 0), 1, 128, 5000), Ok(()));
        assert_eq!(admit(&limits(), &usage(7, 7, 1920), 1, 128, 5000), Ok(()));
    }

    #[test]
    fn refuses_with_clear_reasons() {
        let l = limits();
        let e = admit(&l, &usage(1, 1, 2000), 1, 128, 5000).unwrap_err();
        assert!(
            matches!(&e, Refusal::Quota(m) if m.contains("2048 MiB")),
            "{e}"
        );
        assert_eq!(e.reason(), "memory_quota");
        let e = admit(&l, &usage(1, 8, 0), 1, 128, 5000).unwrap_err();
        assert_eq!(e.reason(), "cpu_quota");
        let e = admit(&l, &usage(10, 0, 0), 1, 128, 5000).unwrap_err();
        assert_eq!(e.reason(), "max_sandboxes");
        let e = admit(&l, &usage(0, 0, 0), 1, 128, 50).unwrap_err();
        assert!(matches!(e, Refusal::HostPressure(_)));
        assert_eq!(e.reason(), "host_memory");
    }

    #[test]
    fn reads_meminfo() {
        assert!(meminfo_kib("MemTotal").unwrap() > 0);
        assert!(meminfo_kib("Nope").is_none());
    }
}
