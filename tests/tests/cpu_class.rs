//! CPU classes on real, jailed VMMs: a best-effort sandbox's VMM has every
//! thread SCHED_IDLE and its cgroup a low CPU weight (v2 `cpu.weight`, v1
//! `cpu.shares`), a latency one's threads are normal and its weight the
//! normal one, after create, after pause+resume (a new VMM), after a
//! fork (new VMMs from the source's snapshot), after a daemon restart and
//! after a change of class; its create says whether SMT isolation is on.
//! And a daemon crash during which a VMM and its jailer die: the
//! restarted daemon removes that VMM's cgroup and keeps the survivors'.
//!
//! Each guest exec costs ~1 s on PVM hosts, so execs are few.

// Shared with tests/daemon.rs, which uses all of it.
#[allow(dead_code)]
mod daemon_harness;

use daemon_harness::Daemon;
use shoal_client::api::{CreateSandbox, ForkRequest, Priority, Sandbox, UpdateSandbox};
use shoal_runtime::sched;

/// The VMM's own pid (the API's is its jailer's).
fn vmm_pid(d: &Daemon, sb: &Sandbox) -> i32 {
    let jailer = sb.pid.unwrap_or_else(|| panic!("no pid: {sb:?}"));
    let dir = d.dir.join("sandboxes").join(&sb.id);
    shoal_runtime::jail::vmm_pid(jailer, &dir)
        .unwrap_or_else(|| panic!("no VMM under jailer {jailer}: is the daemon jailing?"))
}

/// The VMM cgroup's CPU weight file's value, in the v2 scale's terms:
/// (what it holds, what `weight` would be there).
fn cgroup_weight(id: &str, weight: u64) -> (u64, u64) {
    let spec = shoal_jailer::CgroupSpec {
        cpu_weight: Some(100),
        ..Default::default()
    };
    let plan = shoal_jailer::cgroup::plan_here(id, &spec).expect("a CPU controller");
    let (file, _) = plan
        .limits
        .iter()
        .find(|(p, _)| p.ends_with("cpu.weight") || p.ends_with("cpu.shares"))
        .expect("a cpu weight file");
    let v: u64 = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        .trim()
        .parse()
        .unwrap();
    match file.ends_with("cpu.shares") {
        true => (v, shoal_jailer::cgroup::shares_of_weight(weight)),
        false => (v, weight),
    }
}

/// The directories of jail `id`'s cgroup (memory, pids, cpu).
fn cgroup_dirs(id: &str) -> Vec<std::path::PathBuf> {
    let spec = shoal_jailer::CgroupSpec {
        memory_bytes: Some(1 << 30),
        pids_max: Some(1),
        cpu_weight: Some(100),
    };
    shoal_jailer::cgroup::plan_here(id, &spec)
        .expect("a cgroup hierarchy")
        .dirs
}

/// Asserts `sb`'s VMM is scheduled as `p` says: every thread's policy and
/// its cgroup's weight. Returns how many threads it has.
fn assert_class(d: &Daemon, sb: &Sandbox, p: Priority, when: &str) -> usize {
    let pid = vmm_pid(d, sb);
    let tids = sched::threads(pid).unwrap();
    let policies: Vec<i32> = tids.iter().filter_map(|t| sched::policy(*t)).collect();
    let want = sched::policy_of(shoald::cpu_class::class_of(p));
    assert!(
        policies.len() >= 2 && policies.iter().all(|x| *x == want),
        "{when}: VMM {pid} ({p}) threads' policies {policies:?}, want all {want}"
    );
    let w = match p {
        Priority::BestEffort => {
            let (w, want) = cgroup_weight(&sb.id, shoald::cpu_share::BEST_EFFORT_WEIGHT);
            assert_eq!(w, want, "{when}: {p} cgroup weight");
            w
        }
        // The normal weight, or more while a request is fresh.
        Priority::Latency => {
            let (w, normal) = cgroup_weight(&sb.id, shoal_runtime::jail::CPU_WEIGHT);
            assert!(w >= normal, "{when}: {p} cgroup weight {w} < {normal}");
            w
        }
    };
    eprintln!(
        "{when}: {} VMM {pid}: {} threads, policy {want}, cgroup weight {w}",
        sb.id,
        policies.len()
    );
    policies.len()
}

#[test]
fn best_effort_vmms_run_sched_idle_at_a_low_weight_on_every_path() {
    shoal_test_support::require_root(
        "the daemon jails its VMMs (cgroups, scheduling of their threads)",
    );
    let mut d = Daemon::start(&[]);
    let be = d.create(CreateSandbox {
        priority: Priority::BestEffort,
        ..Default::default()
    });
    let lat = d.create(CreateSandbox::default());
    assert_eq!(be.priority, Priority::BestEffort);
    assert_class(&d, &be, Priority::BestEffort, "after create");
    assert_class(&d, &lat, Priority::Latency, "after create");
    // The create says whether SMT isolation is on, and why not.
    let core = sched::core_sched();
    assert_eq!(lat.smt_isolation, Some(core.isolates()), "{lat:?}");
    if !core.isolates() {
        assert!(
            lat.warnings.iter().any(|w| w.contains("SMT")),
            "{:?}",
            lat.warnings
        );
        assert!(
            d.metrics().contains("\nshoal_smt_isolation{reason=\""),
            "metrics"
        );
    }
    // Both work; the exec's threads (vsock) are the VMM's, idle too.
    assert_eq!(d.sh(&be.id, "echo be").stdout, "be\n");
    assert_eq!(d.sh(&lat.id, "echo lat").stdout, "lat\n");
    assert_class(&d, &be, Priority::BestEffort, "after an exec");

    // Pause to disk and resume: a new VMM, its class given again.
    for (sb, p) in [(&be, Priority::BestEffort), (&lat, Priority::Latency)] {
        d.must("pause", d.c.pause(&sb.id));
        let r = d.must("resume", d.c.resume(&sb.id));
        assert_ne!(r.pid, sb.pid, "a new VMM");
        assert_class(&d, &r, p, "after pause+resume");
    }

    // A fork: new VMMs from the source's snapshot, the source's class.
    let f = d.must("fork", d.c.fork(&be.id, &ForkRequest::new(1)));
    assert_eq!(f.sandboxes.len(), 1, "{f:?}");
    assert_class(&d, &f.sandboxes[0], Priority::BestEffort, "a fork's clone");
    assert_class(
        &d,
        &d.get(&be.id).unwrap(),
        Priority::BestEffort,
        "fork source",
    );

    // A daemon crash (SIGKILL) during which the clone's jailer is killed
    // too (its VMM dies with it): nothing removes the clone's cgroup then.
    d.kill9();
    let clone = &f.sandboxes[0];
    let clone_vmm = vmm_pid(&d, clone);
    let clone_cg = cgroup_dirs(&clone.id);
    assert!(clone_cg.iter().all(|p| p.is_dir()), "{clone_cg:?}");
    // SAFETY: kill(2) on the jailer's pid the API reported.
    assert_eq!(unsafe { libc::kill(clone.pid.unwrap(), libc::SIGKILL) }, 0);
    daemon_harness::wait_for("the clone's VMM to die with its jailer", 30, || {
        sched::threads(clone_vmm).is_err()
    });
    // The restarted daemon removes the gone VMM's cgroup and keeps those of
    // the VMMs that survived.
    d.spawn();
    daemon_harness::wait_for("the dead clone's cgroup removed", 30, || {
        clone_cg.iter().all(|p| !p.exists())
    });
    for sb in [&be, &lat] {
        let dirs = cgroup_dirs(&sb.id);
        assert!(dirs.iter().all(|p| p.is_dir()), "a survivor's {dirs:?}");
    }
    // And the survivors keep their class.
    assert_class(
        &d,
        &d.get(&be.id).unwrap(),
        Priority::BestEffort,
        "after a restart",
    );
    assert_class(
        &d,
        &d.get(&lat.id).unwrap(),
        Priority::Latency,
        "after a restart",
    );

    // A change of class applies at once, both ways.
    let up = UpdateSandbox {
        priority: Some(Priority::Latency),
        ..Default::default()
    };
    let v = d.must("patch", d.c.update_sandbox(&be.id, &up));
    assert_class(&d, &v, Priority::Latency, "after a change to latency");
    let down = UpdateSandbox {
        priority: Some(Priority::BestEffort),
        ..Default::default()
    };
    let v = d.must("patch", d.c.update_sandbox(&lat.id, &down));
    assert_class(
        &d,
        &v,
        Priority::BestEffort,
        "after a change to best_effort",
    );
    assert!(d.metrics().contains("\nshoal_cpu_class_failures_total 0\n"));
}
