//! CPU classes: a sandbox's [`Priority`] made into how its VMM is
//! scheduled.
//!
//! - `latency` (the default): its VMM's threads `SCHED_OTHER`, its cgroup
//!   at the normal weight ([`crate::cpu_share`]: more while it serves a
//!   fresh request) and, where the host kernel has core scheduling, one
//!   core-scheduling cookie for its VMM (its vCPUs never share a core's
//!   SMT siblings with another sandbox's threads).
//! - `best_effort`: every thread of its VMM `SCHED_IDLE` and its cgroup at
//!   [`crate::cpu_share::BEST_EFFORT_WEIGHT`], requests or not.
//!
//! The threads are set from outside, by the backend
//! ([`shoal_runtime::backend::SandboxVm::set_class`]), on every path that
//! gives a sandbox a VMM or a class: each start through
//! [`crate::ops::start_vmm_with`] (create, a restore into a stocked VMM,
//! resume from disk, fork, a pool refill), a create served from a warm
//! pool (its sandbox was restored before its class was known), a
//! reattach after a daemon restart, and a change (`PATCH`). Threads the
//! VMM starts later inherit their creator's policy and cookie; freeze and
//! thaw keep the same threads.
//!
//! Nothing fails silently: a class that could not be applied is logged,
//! recorded as an event, counted (`shoal_cpu_class_failures_total`) and
//! named in the create's (or change's) `warnings`; and where the kernel
//! lacks core scheduling (probed once: [`shoal_runtime::sched::core_sched`])
//! a latency sandbox's create says `smt_isolation: false` and why, as do
//! `/metrics` (`shoal_smt_isolation`) and `shoal doctor`.

use super::{ApiError, ApiResult, Daemon, Live};
use shoal_api::{Priority, Sandbox as SandboxView};
use shoal_runtime::backend::SandboxVm;
use shoal_runtime::sched::{self, Class};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The runtime's class of a priority.
pub fn class_of(p: Priority) -> Class {
    match p {
        Priority::Latency => Class::Latency,
        Priority::BestEffort => Class::BestEffort,
    }
}

/// Schedules `vm`'s threads by `p` (blocking: a few system calls per
/// thread); the error as the create's warning says it.
pub fn apply_vm(vm: &dyn SandboxVm, p: Priority) -> Result<(), String> {
    vm.set_class(class_of(p))
        .map(drop)
        .map_err(|e| format!("CPU class {p} not applied to the VMM's threads: {e}"))
}

/// After [`apply_vm`] on the VM `live` now runs: its cgroup's weight for
/// `p`, written at once, and the outcome recorded (a failure logged,
/// counted and kept for the reply's warnings).
pub fn settle(d: &Daemon, live: &Live, p: Priority, applied: Result<(), String>) {
    let busy = live.busy.load(Ordering::Acquire);
    live.cpu
        .set_best_effort(p == Priority::BestEffort, busy, super::freeze::now_ms());
    if let Err(e) = &applied {
        d.metrics.class_failures.fetch_add(1, Ordering::Relaxed);
        d.event(&live.id, "cpu_class_failed", e);
    }
    live.cpu.set_class_error(applied.err());
}

/// Applies `p` to the VM `live` runs now, if one runs (on a blocking
/// thread), and settles it.
pub async fn reapply(d: &Arc<Daemon>, live: &Arc<Live>, p: Priority) {
    let Some(vm) = live.vm() else {
        return;
    };
    let applied = tokio::task::spawn_blocking(move || apply_vm(vm.as_ref(), p))
        .await
        .unwrap_or_else(|e| Err(format!("CPU class {p}: {e}")));
    settle(d, live, p, applied);
}

/// Whether a sandbox of priority `p` is kept off other sandboxes' SMT
/// siblings, and if not (for a latency one), why.
pub fn smt_isolation(p: Priority) -> (bool, Option<String>) {
    let core = sched::core_sched();
    match p {
        Priority::Latency if core.isolates() => (true, None),
        Priority::Latency => (
            false,
            Some(format!("no SMT isolation: {}", core.describe())),
        ),
        // Not asked for: a best-effort sandbox gets no cookie.
        Priority::BestEffort => (false, None),
    }
}

/// Fills a create's (or a change's) reply: `smt_isolation` and the
/// warnings (no SMT isolation where the kernel lacks it; a class that
/// could not be applied).
pub fn annotate(d: &Daemon, v: &mut SandboxView) {
    let (isolated, why) = smt_isolation(v.priority);
    v.smt_isolation = Some(isolated);
    v.warnings.extend(why);
    if let Some(e) = d.live(&v.id).and_then(|l| l.cpu.class_error()) {
        v.warnings.push(e);
    }
}

/// `PATCH`'s `priority`: stored, and applied at once to a running
/// sandbox's VMM (a paused one gets it when it resumes), serialized with
/// its lifecycle operations.
pub async fn set_priority(d: &Arc<Daemon>, id: &str, p: Priority) -> ApiResult<()> {
    let r = match d.db(|db| db.sandbox(id))? {
        Some(r) if r.state != super::db::State::Pooled => r,
        _ => return Err(ApiError::NotFound(format!("no sandbox '{id}'"))),
    };
    if r.priority == p {
        return Ok(());
    }
    let live = d.live(id);
    let _g = match &live {
        Some(l) => Some(l.op.lock().await),
        None => None,
    };
    d.db(|db| db.set_priority(id, p))?;
    if let Some(l) = &live {
        reapply(d, l, p).await;
    }
    d.event(id, "priority", &format!("{} -> {p}", r.priority));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_smt_answers() {
        assert_eq!(class_of(Priority::Latency), Class::Latency);
        assert_eq!(class_of(Priority::BestEffort), Class::BestEffort);
        let (iso, why) = smt_isolation(Priority::Latency);
        assert_eq!(iso, sched::core_sched().isolates());
        assert_eq!(why.is_some(), !iso);
        if let Some(w) = why {
            assert!(w.starts_with("no SMT isolation: off: "), "{w}");
        }
        assert_eq!(smt_isolation(Priority::BestEffort), (false, None));
    }
}
