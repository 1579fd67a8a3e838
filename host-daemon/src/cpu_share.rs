//! CPU shares between sandboxes: fresh requests first.
//!
//! Every VMM runs in a cgroup of its own (the jailer makes it, under
//! `shoal/`, at [`shoal_runtime::jail::CPU_WEIGHT`]). With equal weights a
//! guest that burns its vCPU (a hostile `yes`, a spin, a connection flood)
//! takes as much of a contended host as a neighbour answering an exec: on
//! a host whose sandboxes together get one core, the neighbour's exec then
//! takes twice its time or more. So a sandbox serving a request that came
//! less than [`FRESH`] ago gets [`REQUEST_WEIGHT`], four times the normal
//! weight; otherwise (a long-running exec, background work with no
//! request, idleness) it has the normal one. Weights only split what the
//! `shoal/` cgroup gets: the host's own processes and the daemon lose
//! nothing; a long-running command is never below the normal weight (it
//! shares with other sandboxes as before), and only for [`FRESH`] after
//! each request is a sandbox ahead of them. A guest cannot raise its own
//! weight; only requests to it (an API caller's) do.
//!
//! A best-effort sandbox ([`shoal_api::Priority::BestEffort`]) has
//! [`BEST_EFFORT_WEIGHT`] whatever its requests: with its VMM's threads
//! `SCHED_IDLE` ([`crate::cpu_class`]) it runs on what the others leave.
//!
//! The weight is written on transitions only: when a request arrives
//! ([`CpuShare::on_request`], from [`crate::freeze::busy`]) and from
//! [`run`]'s tick once the sandbox is no longer fresh. A sandbox whose VMM
//! has no cgroup (unjailed, the fake backend) is left alone.

use super::Daemon;
use shoal_runtime::jail::{CgroupSpec, CPU_WEIGHT};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long after a request arrives its sandbox keeps the normal weight.
pub const FRESH: Duration = Duration::from_secs(1);
/// The weight of a sandbox serving a fresh request (cgroup v2 scale; the
/// normal one is [`CPU_WEIGHT`]).
pub const REQUEST_WEIGHT: u64 = 4 * CPU_WEIGHT;
/// The weight of a best-effort sandbox, requests or not (v1: `cpu.shares`
/// 10, against 1024 for a normal one).
pub const BEST_EFFORT_WEIGHT: u64 = 1;
/// How often [`run`] looks for sandboxes to demote.
pub const TICK: Duration = Duration::from_millis(250);

/// The weight a sandbox should have: [`REQUEST_WEIGHT`] while it has
/// operations in flight (`busy`) and `now_ms` is before `fresh_until_ms`
/// (the last request's arrival plus [`FRESH`]), else the normal one.
pub fn wanted(busy: usize, now_ms: u64, fresh_until_ms: u64, best_effort: bool) -> u64 {
    if best_effort {
        BEST_EFFORT_WEIGHT
    } else if busy > 0 && now_ms < fresh_until_ms {
        REQUEST_WEIGHT
    } else {
        CPU_WEIGHT
    }
}

fn weight_only() -> CgroupSpec {
    CgroupSpec {
        cpu_weight: Some(CPU_WEIGHT),
        ..CgroupSpec::default()
    }
}

/// Where a cgroup's CPU weight is written, and in which form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightFile {
    /// `cpu.weight` (v2) or `cpu.shares` (v1).
    pub path: PathBuf,
    /// v1: `cpu.shares`, written as [`shoal_jailer::cgroup::shares_of_weight`].
    pub v1: bool,
}

impl WeightFile {
    /// The file of jail `id`'s cgroup (the jailer's naming), if this host
    /// has a CPU controller.
    pub fn of_jail(id: &str) -> Option<WeightFile> {
        Self::from_plan(shoal_jailer::cgroup::plan_here(id, &weight_only()).ok()?)
    }

    /// The CPU file of a jailer's cgroup plan (made with a CPU weight).
    pub fn from_plan(plan: shoal_jailer::cgroup::Plan) -> Option<WeightFile> {
        let v1 = plan.version == shoal_jailer::cgroup::Version::V1;
        plan.limits
            .into_iter()
            .map(|(p, _)| p)
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n == "cpu.weight" || n == "cpu.shares")
            })
            .map(|path| WeightFile { path, v1 })
    }

    fn write(&self, weight: u64) -> std::io::Result<()> {
        let v = if self.v1 {
            shoal_jailer::cgroup::shares_of_weight(weight)
        } else {
            weight
        };
        std::fs::write(&self.path, v.to_string())
    }
}

/// One sandbox's CPU weight.
#[derive(Debug)]
pub struct CpuShare {
    file: Option<WeightFile>,
    /// Monotonic ms until which the last request keeps it fresh.
    fresh_until_ms: AtomicU64,
    /// The weight last written (0: unknown, a new VMM's cgroup); the lock
    /// also orders writes.
    written: Mutex<u64>,
    /// Best effort: [`BEST_EFFORT_WEIGHT`] always.
    best_effort: AtomicBool,
    /// Why its class could not be applied to its VMM's threads, last time.
    class_error: Mutex<Option<String>>,
}

impl CpuShare {
    /// The share of the sandbox whose VMM is jailed as `id`.
    pub fn for_jail(id: &str) -> CpuShare {
        Self::with_file(WeightFile::of_jail(id))
    }

    /// A share written to `file` (none: nothing is written).
    pub fn with_file(file: Option<WeightFile>) -> CpuShare {
        CpuShare {
            file,
            fresh_until_ms: AtomicU64::new(0),
            written: Mutex::new(0),
            best_effort: AtomicBool::new(false),
            class_error: Mutex::new(None),
        }
    }

    /// A new VMM (a fresh cgroup at the jailer's weight) runs the sandbox.
    pub fn new_vmm(&self) {
        *self.written.lock().unwrap_or_else(|e| e.into_inner()) = 0;
    }

    /// Its class: best effort or not; the weight it gives (with `busy`
    /// operations in flight at `now_ms`) is written at once.
    pub fn set_best_effort(&self, best_effort: bool, busy: usize, now_ms: u64) {
        self.best_effort.store(best_effort, Ordering::Release);
        self.tick(busy, now_ms);
    }

    /// Records why its class could not be applied (`None`: it was).
    pub fn set_class_error(&self, e: Option<String>) {
        *self.class_error.lock().unwrap_or_else(|e| e.into_inner()) = e;
    }

    /// Why its class could not be applied, last time.
    pub fn class_error(&self) -> Option<String> {
        self.class_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether it is best effort.
    pub fn best_effort(&self) -> bool {
        self.best_effort.load(Ordering::Acquire)
    }

    /// A request arrived at `now_ms` (its operation is counted busy
    /// already): [`REQUEST_WEIGHT`] for [`FRESH`].
    pub fn on_request(&self, now_ms: u64) {
        let fresh = u64::try_from(FRESH.as_millis()).unwrap_or(u64::MAX);
        self.fresh_until_ms
            .fetch_max(now_ms.saturating_add(fresh), Ordering::AcqRel);
        self.set(wanted(1, now_ms, u64::MAX, self.best_effort()));
    }

    /// Re-evaluates the weight with `busy` operations in flight at `now_ms`.
    pub fn tick(&self, busy: usize, now_ms: u64) {
        self.set(wanted(
            busy,
            now_ms,
            self.fresh_until_ms.load(Ordering::Acquire),
            self.best_effort(),
        ));
    }

    /// The weight last written (0: none yet).
    pub fn written(&self) -> u64 {
        *self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, weight: u64) {
        let Some(f) = &self.file else {
            return;
        };
        let mut w = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if *w == weight {
            return;
        }
        // A cgroup file write (kernfs, never blocks). It fails while the
        // VMM's cgroup does not exist (starting, stopped, unjailed): then
        // the next transition tries again.
        match f.write(weight) {
            Ok(()) => *w = weight,
            Err(e) => tracing::trace!(file = %f.path.display(), "cpu weight: {e}"),
        }
    }
}

/// Returns sandboxes whose requests are no longer fresh to the normal
/// weight, forever.
pub async fn run(d: Arc<Daemon>) {
    loop {
        tokio::time::sleep(TICK).await;
        let lives: Vec<_> = d
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let now = super::freeze::now_ms();
        for l in lives {
            if l.vm().is_some() {
                l.cpu.tick(l.busy.load(Ordering::Acquire), now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn above_normal_only_while_a_fresh_request_is_in_flight() {
        assert_eq!(wanted(1, 100, 200, false), REQUEST_WEIGHT);
        assert_eq!(wanted(0, 100, 200, false), CPU_WEIGHT, "idle");
        assert_eq!(wanted(1, 200, 200, false), CPU_WEIGHT, "no longer fresh");
        assert_eq!(wanted(3, 5_000, 200, false), CPU_WEIGHT);
    }

    #[test]
    fn best_effort_stays_low_whatever_its_requests() {
        assert_eq!(wanted(1, 100, 200, true), BEST_EFFORT_WEIGHT);
        assert_eq!(wanted(0, 100, 200, true), BEST_EFFORT_WEIGHT);
        let dir = tempfile::tempdir().unwrap();
        for v1 in [false, true] {
            let path = dir
                .path()
                .join(if v1 { "cpu.shares" } else { "cpu.weight" });
            std::fs::write(&path, "100").unwrap();
            let s = CpuShare::with_file(Some(WeightFile {
                path: path.clone(),
                v1,
            }));
            let read = || std::fs::read_to_string(&path).unwrap();
            let (low, normal, fresh) = if v1 {
                ("10", "1024", "4096")
            } else {
                ("1", "100", "400")
            };
            // Written at once when the class is set.
            s.set_best_effort(true, 0, 1_000);
            assert!(s.best_effort());
            assert_eq!(read(), low);
            // A request does not raise it.
            s.on_request(1_000);
            assert_eq!(read(), low);
            s.tick(1, 1_001);
            assert_eq!(read(), low);
            // Back to latency: normal, boosted by the fresh request.
            s.set_best_effort(false, 1, 1_002);
            assert_eq!(read(), fresh);
            s.set_best_effort(false, 0, 1_003);
            assert_eq!(read(), normal);
        }
    }

    #[test]
    fn writes_on_transitions_in_the_cgroup_form() {
        let dir = tempfile::tempdir().unwrap();
        for v1 in [false, true] {
            let path = dir
                .path()
                .join(if v1 { "cpu.shares" } else { "cpu.weight" });
            std::fs::write(&path, "100").unwrap();
            let s = CpuShare::with_file(Some(WeightFile {
                path: path.clone(),
                v1,
            }));
            let read = || std::fs::read_to_string(&path).unwrap();
            let (fresh, normal) = if v1 { ("4096", "1024") } else { ("400", "100") };
            let f = u64::try_from(FRESH.as_millis()).unwrap();
            s.on_request(1_000);
            assert_eq!(s.written(), REQUEST_WEIGHT);
            assert_eq!(read(), fresh);
            // Still fresh with the request in flight: unchanged.
            s.tick(1, 1_000 + f - 1);
            assert_eq!(s.written(), REQUEST_WEIGHT);
            // Past FRESH: normal.
            s.tick(1, 1_000 + f);
            assert_eq!(read(), normal);
            // Written once per transition: a change behind its back stays.
            std::fs::write(&path, "7").unwrap();
            s.tick(0, 1_000 + 2 * f);
            assert_eq!(read(), "7");
            // A new VMM: the next decision is written again.
            s.new_vmm();
            s.tick(0, 1_000 + 2 * f);
            assert_eq!(read(), normal);
            let t = 1_000 + 3 * f;
            s.on_request(t);
            assert_eq!(read(), fresh);
            // The request ends: normal at the next tick.
            s.tick(0, t + 1);
            assert_eq!(s.written(), CPU_WEIGHT);
        }
    }

    #[test]
    fn a_missing_cgroup_is_retried_at_the_next_transition() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone").join("cpu.weight");
        let s = CpuShare::with_file(Some(WeightFile {
            path: path.clone(),
            v1: false,
        }));
        s.on_request(0);
        assert_eq!(s.written(), 0, "nothing written");
        std::fs::create_dir(path.parent().unwrap()).unwrap();
        s.tick(1, 10);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "400");
        // No file at all: nothing happens.
        let none = CpuShare::with_file(None);
        none.on_request(0);
        none.tick(0, 10);
        assert_eq!(none.written(), 0);
    }

    #[test]
    fn a_jail_maps_to_its_cgroups_cpu_file() {
        use shoal_jailer::cgroup::plan;
        // cgroup v1 (this development host): cpu.shares under cpu/shoal/<id>.
        let mi = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                  32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
                  35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let p = plan(mi, "4:memory:/x\n1:cpu:/\n", "", "sb1", &weight_only()).unwrap();
        assert_eq!(
            WeightFile::from_plan(p),
            Some(WeightFile {
                path: "/sys/fs/cgroup/cpu/shoal/sb1/cpu.shares".into(),
                v1: true
            })
        );
        // cgroup v2: cpu.weight beside the daemon's cgroup.
        let mi = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let p = plan(
            mi,
            "0::/system.slice/shoald.service\n",
            "cpu memory pids",
            "sb1",
            &weight_only(),
        )
        .unwrap();
        assert_eq!(
            WeightFile::from_plan(p),
            Some(WeightFile {
                path: "/sys/fs/cgroup/system.slice/shoal/sb1/cpu.weight".into(),
                v1: false
            })
        );
        // No CPU controller: no file.
        let mi = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert!(plan(mi, "4:memory:/\n", "", "sb1", &weight_only()).is_err());
    }
}
