//! `GET /v1/stats` ([`Stats`]: usage, admission limits, host, pools) and
//! `GET /v1/events` ([`Event`]s, filtered by [`EventQuery`]).

use crate::templates::Pool;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

/// Resources held by sandboxes with a VMM.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    /// Sandboxes per state (every sandbox, pooled ones too).
    pub by_state: BTreeMap<String, u64>,
    /// Sandboxes holding a VMM.
    pub vms: u64,
    /// Their vCPUs.
    pub vcpus: u64,
    /// Their guest memory (MiB).
    pub memory_mib: u64,
    /// Disk reserved on the state filesystem by every sandbox but failed
    /// ones, paused and pooled ones too (MiB): each may fill its scratch
    /// disk and write its memory when paused; and by every template (its
    /// memory file and scratch disk).
    #[serde(default)]
    pub disk_mib: u64,
}

/// Admission limits (from the daemon's command line): a new VMM is
/// admitted only while the reserved guest memory and vCPUs stay within
/// the host's size times an overcommit ratio, the host still has real
/// memory available, and the sandbox count is under its cap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Limits {
    /// Host memory (MiB).
    pub host_memory_mib: u64,
    /// Host CPUs.
    pub host_cpus: u64,
    /// Guest memory reservable per MiB of host memory. Restored guests
    /// share their template's clean pages, so an idle 128 MiB guest costs
    /// ~1-2 MiB of host memory: 8 is conservative.
    pub memory_overcommit: f64,
    /// vCPUs reservable per host CPU. Idle sandboxes use a small fraction
    /// of a CPU (most under 5%), so this is large by default.
    pub cpu_overcommit: f64,
    /// Refuse (503) when the host's MemAvailable drops below this (MiB).
    pub min_available_mib: u64,
    /// Most sandboxes holding a VMM (each holds a process and a few fds).
    pub max_vms: u64,
    /// Disk sandboxes and templates may reserve on the state filesystem
    /// (MiB; each reserves its guest memory, for a pause or its snapshot,
    /// and its scratch disk's size; 0: no budget). By default what was
    /// free at start, and what sandboxes and templates held then, less
    /// `min_free_disk_mib`.
    #[serde(default)]
    pub disk_budget_mib: u64,
    /// Refuse (503) a sandbox whose reservation would leave less than
    /// this free on the state filesystem (MiB).
    #[serde(default)]
    pub min_free_disk_mib: u64,
    /// Disk reservable per MiB of `disk_budget_mib`. A reservation is what
    /// a sandbox could write at most (all its memory in a pause, a full
    /// scratch disk), but a pause writes only the pages the guest changed
    /// since its template (an idle restored guest: a few MiB of 128) and a
    /// scratch disk is sparse; real free space is checked again before
    /// every create, pause and fork, so an overcommitted disk refuses
    /// (503) rather than fills.
    #[serde(default = "one")]
    pub disk_overcommit: f64,
}

fn one() -> f64 {
    1.0
}

impl Limits {
    /// Reservable guest memory (MiB).
    // `as` from f64 saturates (negative and NaN give 0): what a budget wants.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    pub fn memory_budget_mib(&self) -> u64 {
        (self.host_memory_mib as f64 * self.memory_overcommit) as u64
    }

    /// Reservable vCPUs.
    // `as` from f64 saturates (negative and NaN give 0): what a budget wants.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    pub fn vcpu_budget(&self) -> u64 {
        (self.host_cpus as f64 * self.cpu_overcommit) as u64
    }

    /// Reservable disk (MiB; 0: no budget): `disk_budget_mib` times
    /// `disk_overcommit` (at least the budget itself).
    // `as` from f64 saturates (negative and NaN give 0): what a budget wants.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    pub fn disk_quota_mib(&self) -> u64 {
        let q = (self.disk_budget_mib as f64 * self.disk_overcommit) as u64;
        q.max(self.disk_budget_mib)
    }
}

/// The host as the daemon sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HostStats {
    /// MemTotal (MiB).
    pub memory_total_mib: u64,
    /// MemAvailable (MiB).
    pub memory_available_mib: u64,
    /// CPUs.
    pub cpus: u64,
    /// Load average over 1 minute (null if unreadable).
    pub load1: Option<f64>,
}

/// `GET /v1/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Stats {
    /// The daemon's version.
    pub version: String,
    /// What sandboxes hold.
    pub usage: Usage,
    /// Admission limits.
    pub limits: Limits,
    /// Reservable guest memory (MiB): host memory times overcommit.
    pub memory_budget_mib: u64,
    /// Reservable vCPUs: host CPUs times overcommit.
    pub vcpu_budget: u64,
    /// The host.
    pub host: HostStats,
    /// Warm pools.
    pub pools: Vec<Pool>,
}

/// One entry of the event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// Sequence number (increasing).
    pub seq: i64,
    /// Seconds since the epoch.
    pub ts: f64,
    /// Sandbox id or template name concerned.
    pub subject: String,
    /// What happened (`created`, `killed`, `failed`, `paused`, ...).
    pub kind: String,
    /// Detail.
    pub detail: String,
}

/// `GET /v1/events` filters.
#[derive(Debug, Clone, Default, PartialEq, Eq, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventQuery {
    /// Only events after this sequence number.
    pub since: Option<i64>,
    /// Only events of this sandbox or template.
    pub sandbox: Option<String>,
    /// At most this many (default 1000, at most 10000).
    pub limit: Option<i64>,
}

impl EventQuery {
    /// The query string.
    pub fn to_query(&self) -> String {
        crate::query_string([
            ("since", self.since.map(|v| v.to_string())),
            ("sandbox", self.sandbox.clone()),
            ("limit", self.limit.map(|v| v.to_string())),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets() {
        let l = Limits {
            host_memory_mib: 1024,
            host_cpus: 2,
            memory_overcommit: 2.5,
            cpu_overcommit: 4.0,
            min_available_mib: 0,
            max_vms: 1,
            disk_budget_mib: 0,
            min_free_disk_mib: 0,
            disk_overcommit: 4.0,
        };
        assert_eq!((l.memory_budget_mib(), l.vcpu_budget()), (2560, 8));
        assert_eq!(l.disk_quota_mib(), 0, "no budget stays no budget");
        let l = Limits {
            disk_budget_mib: 1000,
            ..l
        };
        assert_eq!(l.disk_quota_mib(), 4000);
        let l = Limits {
            disk_overcommit: 0.5,
            ..l
        };
        assert_eq!(l.disk_quota_mib(), 1000, "never below the budget");
        let old: Limits = serde_json::from_str(
            r#"{"host_memory_mib":1,"host_cpus":1,"memory_overcommit":1,
                "cpu_overcommit":1,"min_available_mib":0,"max_vms":1}"#,
        )
        .unwrap();
        assert_eq!(
            old.disk_overcommit, 1.0,
            "an older daemon's stats read as no overcommit"
        );
        let q = EventQuery {
            since: Some(5),
            sandbox: Some("ab".into()),
            limit: None,
        };
        assert_eq!(q.to_query(), "?since=5&sandbox=ab");
    }
}
