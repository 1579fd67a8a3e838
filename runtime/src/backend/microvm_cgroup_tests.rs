//! A VMM's cgroup across a daemon restart: the directories its state
//! records are removed once it is gone (a jailer killed before it could),
//! kept while it runs.

use super::*;
use crate::jail::{remove_cgroups, CgroupSpec, CPU_WEIGHT};

#[test]
fn a_gone_vmms_recorded_cgroup_is_removed_a_live_ones_kept() {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run the tests as root");
    let m =
        crate::jail_prep::CgroupMaker::new().expect("a cgroup hierarchy (v2, or v1 controllers)");
    let spec = CgroupSpec {
        memory_bytes: Some(64 << 20),
        pids_max: Some(8),
        cpu_weight: Some(CPU_WEIGHT),
    };
    let me = std::process::id();
    let live = m.make(&format!("cg-live-{me}"), &spec).unwrap();
    let dead = m.make(&format!("cg-dead-{me}"), &spec).unwrap();
    assert!(live.iter().chain(&dead).all(|d| d.is_dir()));
    // A "VMM" in the live cgroup.
    let mut vmm = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    for d in &live {
        std::fs::write(d.join("cgroup.procs"), vmm.id().to_string()).unwrap();
    }
    assert_eq!(remove_cgroups(&live), 0, "a cgroup with tasks is kept");
    assert!(live.iter().all(|d| d.is_dir()));
    // A restarted daemon finds a VMM gone whose jailer was killed before it
    // could remove its cgroup: reattaching it removes what its state recorded.
    let tmp = tempfile::tempdir().unwrap();
    let b = MicroVm::new(
        "/nonexistent/shoal-vmm",
        shoal_images::artifacts::Layout::at(tmp.path()),
    );
    let mut gone = std::process::Command::new("/bin/true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let state = BackendState::from_stored(
        serde_json::json!({
            "state": "running", "pid": gone_pid, "start": 1,
            "api_sock": tmp.path().join("api.sock"), "vsock": tmp.path().join("v.sock"),
            "cgroups": dead,
        })
        .to_string(),
    );
    assert!(matches!(
        b.reattach(tmp.path(), &state),
        Err(BackendError::Gone(_))
    ));
    assert!(dead.iter().all(|d| !d.exists()), "{dead:?} left behind");
    // Once its VMM is gone, the live one goes too.
    vmm.kill().unwrap();
    vmm.wait().unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut removed = 0;
    while removed < live.len() && std::time::Instant::now() < end {
        removed += remove_cgroups(&live);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(live.iter().all(|d| !d.exists()), "{live:?} left behind");
    // Nothing outside the cgroup hierarchies is touched.
    let plain = tmp.path().join("not-a-cgroup");
    std::fs::create_dir(&plain).unwrap();
    assert_eq!(remove_cgroups(std::slice::from_ref(&plain)), 0);
    assert!(plain.is_dir());
}
