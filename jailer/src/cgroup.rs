//! A cgroup per VMM: where it goes, which files carry its limits, and the
//! directories themselves.
//!
//! cgroup v2 is used when the unified hierarchy has the memory controller;
//! otherwise each wanted controller (memory, pids, cpu) is taken from its
//! own v1 hierarchy, as on hosts that mount an empty cgroup2 beside the v1
//! controllers. A VMM's cgroup is `shoal/<id>`:
//! - v1: under the jailer's own cgroup of that hierarchy, so a VMM stays
//!   inside whatever limits its daemon runs under (v1 lets a cgroup with
//!   tasks have children);
//! - v2: under the parent of the jailer's own cgroup (v2 forbids enabling
//!   controllers for the children of a cgroup that has tasks), with the
//!   controllers enabled in `subtree_control` on the way down.
//!
//! [`plan`] is pure (mountinfo and `/proc/self/cgroup` text in, paths and
//! file contents out), so it is tested on the layouts of both kinds of
//! host; [`Cgroup`] applies a plan.

use crate::CgroupSpec;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a cgroup could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No hierarchy has the controllers a limit needs.
    #[error("no cgroup hierarchy (v2 with controllers, or v1) has the {0} controller")]
    NoController(&'static str),
    /// A directory or control file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Which cgroup interface a plan uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Separate hierarchies per controller.
    V1,
    /// The unified hierarchy.
    V2,
}

/// What to create and write for one VMM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The interface.
    pub version: Version,
    /// `subtree_control` writes (v2) that come first: (file, "+memory ...").
    pub enable: Vec<(PathBuf, String)>,
    /// The VMM's directories (one in v2, one per controller in v1).
    pub dirs: Vec<PathBuf>,
    /// Limit files and their contents, written after the directories.
    pub limits: Vec<(PathBuf, String)>,
}

/// One cgroup mount from mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    v2: bool,
    /// The cgroup path that is the mount's root (not `/` in a container).
    root: String,
    point: PathBuf,
    /// v1: the controllers it carries.
    controllers: Vec<String>,
}

/// mountinfo octal escapes (`\040` for a space) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = std::str::from_utf8(&b[i + 1..i + 4]).ok();
            if let Some(v) = digits.and_then(|d| u8::from_str_radix(d, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn mounts(mountinfo: &str) -> Vec<Mount> {
    let mut out = vec![];
    for l in mountinfo.lines() {
        let Some((pre, post)) = l.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        let (Some(root), Some(point), Some(fstype)) = (pre.get(3), pre.get(4), post.first()) else {
            continue;
        };
        let opts = post.get(2).copied().unwrap_or("");
        let v2 = match *fstype {
            "cgroup2" => true,
            "cgroup" => false,
            _ => continue,
        };
        out.push(Mount {
            v2,
            root: unescape(root),
            point: PathBuf::from(unescape(point)),
            controllers: opts.split(',').map(String::from).collect(),
        });
    }
    out
}

/// The jailer's own cgroup in the hierarchy whose /proc/self/cgroup
/// controller field is `field` ("" for v2), relative to mount `m`.
fn own(proc_cgroup: &str, m: &Mount) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        let matches = if m.v2 {
            ctl.is_empty()
        } else {
            !ctl.is_empty() && ctl.split(',').all(|c| m.controllers.iter().any(|x| x == c))
        };
        if !matches {
            return None;
        }
        let rel = path.strip_prefix(m.root.as_str()).unwrap_or(path);
        Some(rel.trim_matches('/').to_string())
    })
}

fn join(base: &Path, rel: &str) -> PathBuf {
    rel.split('/')
        .filter(|c| !c.is_empty())
        .fold(base.to_path_buf(), |p, c| p.join(c))
}

/// v1's `cpu.shares` for a v2 weight (100 ↔ 1024, the defaults; at least 2).
pub fn shares_of_weight(w: u64) -> u64 {
    (w.saturating_mul(1024) / 100).max(2)
}

/// Where the cgroup of jail `id` goes and what is written, from the text
/// of `/proc/self/mountinfo`, `/proc/self/cgroup` and the unified
/// hierarchy's `cgroup.controllers` (empty when there is none).
pub fn plan(
    mountinfo: &str,
    proc_cgroup: &str,
    v2_controllers: &str,
    id: &str,
    spec: &CgroupSpec,
) -> Result<Plan, CgroupError> {
    let ms = mounts(mountinfo);
    let wanted: Vec<(&'static str, Option<u64>)> = vec![
        ("memory", spec.memory_bytes),
        ("pids", spec.pids_max),
        ("cpu", spec.cpu_weight),
    ];
    let v2 = ms.iter().find(|m| m.v2);
    let v2_has = |c: &str| v2_controllers.split_whitespace().any(|x| x == c);
    if let (Some(m), true) = (v2, v2_has("memory")) {
        let own = own(proc_cgroup, m).unwrap_or_default();
        let parent = own.rsplit_once('/').map_or("", |(p, _)| p);
        let base = join(&m.point, parent);
        let shoal = base.join("shoal");
        let dir = shoal.join(id);
        let ctl: Vec<&str> = wanted
            .iter()
            .map(|(c, _)| *c)
            .filter(|c| v2_has(c))
            .collect();
        let on: String = ctl
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ");
        let mut limits = vec![];
        for (c, v) in &wanted {
            let Some(v) = v else { continue };
            if !v2_has(c) {
                return Err(CgroupError::NoController(c));
            }
            let (file, val) = match *c {
                "memory" => ("memory.max", v.to_string()),
                "pids" => ("pids.max", v.to_string()),
                _ => ("cpu.weight", v.to_string()),
            };
            limits.push((dir.join(file), val));
        }
        return Ok(Plan {
            version: Version::V2,
            enable: vec![
                (base.join("cgroup.subtree_control"), on.clone()),
                (shoal.join("cgroup.subtree_control"), on),
            ],
            dirs: vec![dir],
            limits,
        });
    }
    let mut dirs: Vec<PathBuf> = vec![];
    let mut limits = vec![];
    for (c, v) in &wanted {
        let Some(m) = ms
            .iter()
            .find(|m| !m.v2 && m.controllers.iter().any(|x| x == c))
        else {
            if v.is_some() {
                return Err(CgroupError::NoController(c));
            }
            continue;
        };
        let dir = join(&m.point, &own(proc_cgroup, m).unwrap_or_default())
            .join("shoal")
            .join(id);
        if !dirs.contains(&dir) {
            dirs.push(dir.clone());
        }
        let Some(v) = v else { continue };
        let (file, val) = match *c {
            "memory" => ("memory.limit_in_bytes", v.to_string()),
            "pids" => ("pids.max", v.to_string()),
            _ => ("cpu.shares", shares_of_weight(*v).to_string()),
        };
        limits.push((dir.join(file), val));
    }
    Ok(Plan {
        version: Version::V1,
        enable: vec![],
        dirs,
        limits,
    })
}

/// The plan for this process, read from /proc and the unified hierarchy.
pub fn plan_here(id: &str, spec: &CgroupSpec) -> Result<Plan, CgroupError> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mi = read("/proc/self/mountinfo");
    let v2 = v2_controllers(&mi);
    plan(&mi, &read("/proc/self/cgroup"), &v2, id, spec)
}

/// The controllers of the cgroup2 mount `mountinfo` lists (its root's
/// `cgroup.controllers`; empty without one): [`plan`]'s third input.
pub fn v2_controllers(mountinfo: &str) -> String {
    mounts(mountinfo)
        .into_iter()
        .find(|m| m.v2)
        .and_then(|m| std::fs::read_to_string(m.point.join("cgroup.controllers")).ok())
        .unwrap_or_default()
}

/// A VMM's cgroup directories, made by [`Cgroup::create`].
#[derive(Debug)]
pub struct Cgroup {
    plan: Plan,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.into(),
        source,
    }
}

/// Where cgroup hierarchies are mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

impl Cgroup {
    /// A cgroup someone else made from a [`Plan`] (its directories, one
    /// per hierarchy), to join and remove like one [`Self::create`] made;
    /// v1 if its first directory has a `tasks` file.
    pub fn adopt(dirs: Vec<PathBuf>) -> Cgroup {
        let version = match dirs.first() {
            Some(d) if d.join("tasks").exists() => Version::V1,
            _ => Version::V2,
        };
        Cgroup {
            plan: Plan {
                version,
                enable: vec![],
                dirs,
                limits: vec![],
            },
        }
    }

    /// Makes the directories (a leftover of the same id is removed first,
    /// if empty) and writes the limits.
    pub fn create(plan: Plan) -> Result<Cgroup, CgroupError> {
        for (f, v) in &plan.enable {
            if let Some(d) = f.parent() {
                std::fs::create_dir_all(d).map_err(io(d))?;
            }
            // Controllers already enabled are fine; one the parent lacks
            // fails here and the limit write below says which.
            let _ = std::fs::write(f, v);
        }
        let cg = Cgroup { plan };
        for d in &cg.plan.dirs {
            let _ = std::fs::remove_dir(d);
            if let Some(p) = d.parent() {
                std::fs::create_dir_all(p).map_err(io(p))?;
            }
            if let Err(e) = std::fs::create_dir(d) {
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    cg.remove(Duration::ZERO);
                    return Err(io(d)(e));
                }
            }
        }
        for (f, v) in &cg.plan.limits {
            if let Err(e) = std::fs::write(f, v) {
                cg.remove(Duration::ZERO);
                return Err(io(f)(e));
            }
        }
        Ok(cg)
    }

    /// The plan it was made from.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The files a single-threaded process writes "0" to, to move itself
    /// in: v1's `tasks` (moving one thread takes only the cgroup mutex;
    /// `cgroup.procs` also takes the thread-group rwsem for writing, which
    /// waits out an RCU grace period: ~11 ms per VMM on a PVM host), v2's
    /// `cgroup.procs`.
    pub fn procs_files(&self) -> Vec<std::ffi::CString> {
        let file = match self.plan.version {
            Version::V1 => "tasks",
            Version::V2 => "cgroup.procs",
        };
        self.plan
            .dirs
            .iter()
            .filter_map(|d| {
                std::ffi::CString::new(d.join(file).as_os_str().as_encoded_bytes()).ok()
            })
            .collect()
    }

    /// Removes the directories, retrying for up to `patience` while the
    /// last tasks finish exiting. Returns whether all are gone.
    pub fn remove(&self, patience: Duration) -> bool {
        let end = Instant::now() + patience;
        loop {
            let left: Vec<&PathBuf> = self
                .plan
                .dirs
                .iter()
                .filter(|d| match std::fs::remove_dir(d) {
                    Ok(()) => false,
                    Err(e) => e.kind() != std::io::ErrorKind::NotFound,
                })
                .collect();
            if left.is_empty() {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Removes the empty VMM cgroups (`shoal/*`) of this process's
/// hierarchies that are older than `age` (a jailer that died by SIGKILL
/// leaves its cgroup; one that is still in use cannot be removed, as
/// `rmdir` refuses a cgroup with tasks). Returns how many went.
pub fn sweep(age: Duration) -> usize {
    let Ok(p) = plan_here("x", &CgroupSpec::default()) else {
        return 0;
    };
    let mut n = 0;
    for d in &p.dirs {
        let Some(shoal) = d.parent() else { continue };
        for e in std::fs::read_dir(shoal).into_iter().flatten().flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|a| a >= age);
            if e.file_type().is_ok_and(|t| t.is_dir())
                && old
                && std::fs::remove_dir(e.path()).is_ok()
            {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
