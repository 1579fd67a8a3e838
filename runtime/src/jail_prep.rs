//! What a jail needs that the runtime makes ahead of the jailer, to keep
//! it off each VMM's start (measured on the development host, p50 from
//! the jailer's start to the VMM's `execve`: a new network namespace
//! 0.33 ms, planning and making the cgroup in the jailer 0.3 ms):
//!
//! - [`NetnsStock`]: fresh, empty network namespaces, made by a thread of
//!   its own a few at a time before they are asked for. Each is handed to
//!   one VMM only (the jailer joins it by the descriptor it is passed) and
//!   never reused: it ends with that VMM.
//! - [`CgroupMaker`]: the cgroup plan's inputs (mountinfo, this process's
//!   cgroups, the v2 controllers) read once, so that each VMM's cgroup is
//!   planned from memory and made with a few `mkdir`s and writes; the
//!   jailer adopts it (`--cgroup-dir`) and removes it after, as its own.

use shoal_jailer::cgroup::{self, Cgroup, CgroupError};
use shoal_jailer::CgroupSpec;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

/// How many spare network namespaces are kept ready.
pub const NETNS_STOCK: usize = 4;

/// Fresh network namespaces, made ahead by a background thread.
#[derive(Debug)]
pub struct NetnsStock {
    inner: Mutex<Vec<File>>,
    wake: Condvar,
}

impl NetnsStock {
    /// Starts the thread that keeps [`NETNS_STOCK`] namespaces ready;
    /// `None` if this process cannot make them (not root, no
    /// `CLONE_NEWNET`): the jailer then makes each VMM's own, as before.
    pub fn start() -> Option<Arc<NetnsStock>> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let s = Arc::new(NetnsStock {
            inner: Mutex::new(vec![]),
            wake: Condvar::new(),
        });
        let weak = Arc::downgrade(&s);
        std::thread::Builder::new()
            .name("shoal-netns".into())
            .spawn(move || loop {
                let Some(s) = weak.upgrade() else { return };
                let need = {
                    let g = s.inner.lock().unwrap_or_else(|e| e.into_inner());
                    let g = s
                        .wake
                        .wait_timeout_while(g, std::time::Duration::from_secs(5), |v| {
                            v.len() >= NETNS_STOCK
                        })
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0);
                    NETNS_STOCK.saturating_sub(g.len())
                };
                for _ in 0..need {
                    match new_netns() {
                        Ok(f) => s.inner.lock().unwrap_or_else(|e| e.into_inner()).push(f),
                        Err(e) => {
                            // The jailer makes each VMM's own meanwhile
                            // (and says why, should it fail there too).
                            let _ = e;
                            drop(s);
                            std::thread::sleep(std::time::Duration::from_secs(10));
                            break;
                        }
                    }
                }
            })
            .ok()?;
        Some(s)
    }

    /// A fresh namespace, if one is ready (`None`: the jailer makes one).
    pub fn take(&self) -> Option<File> {
        let f = self.inner.lock().unwrap_or_else(|e| e.into_inner()).pop();
        self.wake.notify_one();
        f
    }
}

/// A new network namespace, held by its descriptor. Run on the stock's
/// own thread: `unshare` moves the calling thread into it, and that
/// thread does nothing else.
fn new_netns() -> std::io::Result<File> {
    // SAFETY: unshare with one flag; it changes only this thread's
    // namespace, and the stock's thread runs nothing that needs the old.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    File::open("/proc/thread-self/ns/net")
}

/// Plans and makes VMM cgroups from inputs read once.
#[derive(Debug)]
pub struct CgroupMaker {
    mountinfo: String,
    own: String,
    v2_controllers: String,
}

impl CgroupMaker {
    /// Reads the plan's inputs; `None` when there is no cgroup hierarchy
    /// to plan in.
    pub fn new() -> Option<CgroupMaker> {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let mountinfo = read("/proc/self/mountinfo");
        let own = read("/proc/self/cgroup");
        let v2_controllers = cgroup::v2_controllers(&mountinfo);
        let m = CgroupMaker {
            mountinfo,
            own,
            v2_controllers,
        };
        m.plan("probe", &CgroupSpec::default()).ok()?;
        Some(m)
    }

    fn plan(&self, id: &str, spec: &CgroupSpec) -> Result<cgroup::Plan, CgroupError> {
        cgroup::plan(&self.mountinfo, &self.own, &self.v2_controllers, id, spec)
    }

    /// Makes the cgroup `shoal/<id>` with `spec`'s limits; its
    /// directories, for the jailer's `--cgroup-dir`.
    pub fn make(&self, id: &str, spec: &CgroupSpec) -> Result<Vec<PathBuf>, CgroupError> {
        Ok(Cgroup::create(self.plan(id, spec)?)?.plan().dirs.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_stock_hands_out_fresh_namespaces_none_twice() {
        // SAFETY: geteuid cannot fail.
        assert_eq!(unsafe { libc::geteuid() }, 0, "run the tests as root");
        let s = NetnsStock::start().expect("root can make network namespaces");
        let ours = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        let mut seen = vec![ours];
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while seen.len() < NETNS_STOCK + 2 {
            assert!(
                std::time::Instant::now() < end,
                "the stock stopped at {seen:?}"
            );
            match s.take() {
                Some(f) => {
                    let ino = f.metadata().unwrap().ino();
                    assert!(!seen.contains(&ino), "namespace {ino} handed out twice");
                    seen.push(ino);
                }
                None => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        // Taking from this thread never moved it.
        assert_eq!(std::fs::metadata("/proc/self/ns/net").unwrap().ino(), ours);
    }

    #[test]
    fn cgroups_are_planned_from_inputs_read_once() {
        // SAFETY: geteuid cannot fail.
        assert_eq!(unsafe { libc::geteuid() }, 0, "run the tests as root");
        let m = CgroupMaker::new().expect("a cgroup hierarchy with the memory controller");
        let spec = CgroupSpec {
            memory_bytes: Some(64 << 20),
            pids_max: Some(17),
            cpu_weight: Some(100),
        };
        let id = format!("prep-test-{}", std::process::id());
        let dirs = m.make(&id, &spec).unwrap();
        assert!(!dirs.is_empty());
        assert!(dirs
            .iter()
            .all(|d| d.ends_with(format!("shoal/{id}")) && d.is_dir()));
        let pids = dirs
            .iter()
            .find_map(|d| std::fs::read_to_string(d.join("pids.max")).ok())
            .expect("a pids cgroup");
        assert_eq!(pids.trim(), "17");
        for d in &dirs {
            std::fs::remove_dir(d).unwrap();
        }
    }
}
