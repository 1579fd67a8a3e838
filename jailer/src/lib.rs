//! `shoal-jailer`: starts one VMM confined, in the order of steps
//! Firecracker's jailer takes, adapted to a VMM whose paths must not
//! change (its snapshot states name absolute paths):
//!
//! 1. the VMM's cgroup is created and its limits written ([`cgroup`]),
//!    or one its starter made is adopted (a daemon that makes them from
//!    a plan it keeps saves every VMM start the jailer's reading of
//!    mountinfo and its own cgroups);
//! 2. the jailer forks into a new pid namespace: the parent stays in the
//!    host's namespaces as a small supervisor (forwards signals, waits,
//!    removes the cgroup, exits as the VMM did); the child is PID 1 of the
//!    new namespace and dies with the supervisor (`PR_SET_PDEATHSIG`);
//! 3. the child enters a network namespace (a new empty one, or the one a
//!    spec names) and new mount, ipc and uts namespaces, makes every mount
//!    a slave, opens (`O_PATH`) every file and directory the VMM needs
//!    while the host's tree is still visible, mounts a fresh tmpfs as the jail root and bind-mounts each
//!    opened file at its own absolute path inside it (read-only ones
//!    remounted `ro,nosuid,nodev`; a bind keeps the inode, so page-cache
//!    and DAX sharing of images across VMs is unaffected), makes
//!    `/dev/kvm` (and `/dev/null`) owned by the jail's uid, mounts a procfs
//!    of its own pid namespace, `pivot_root`s into the tmpfs, detaches the
//!    old root and remounts the tmpfs read-only, then joins the cgroup
//!    (its files opened before the pivot: the set-up runs at its
//!    starter's CPU share);
//! 4. rlimits (`NOFILE`, `MEMLOCK`, `CORE` 0, optionally `NPROC`), umask
//!    077, the bounding, ambient and inheritable capability sets emptied,
//!    groups, gid and uid set to the jail's (which drops the permitted
//!    and effective sets), `no_new_privs`, every descriptor above 2 closed
//!    but those passed on purpose, then `execve` with only the environment
//!    the spec gives.
//!
//! The library holds the typed spec ([`JailSpec`]) with its argument form
//! ([`JailSpec::to_args`], [`JailSpec::parse`]), so that callers build it
//! typed, the cgroup logic, the uid leases ([`uids`]) and the jailing
//! itself ([`run`]), which only the binary calls.

pub mod cgroup;
pub mod deps;
pub mod run;
pub mod uids;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// A spec the jailer refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// An unknown flag.
    #[error("unknown jailer option {0:?}")]
    Unknown(OsString),
    /// A flag without its value.
    #[error("{0} needs a value")]
    Missing(&'static str),
    /// A value that does not parse or is not allowed.
    #[error("{flag}: {why}: {value:?}")]
    Bad {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        why: &'static str,
        /// The value given.
        value: OsString,
    },
    /// Two bind paths where one is inside the other (the inner one would
    /// be created inside the outer bind, i.e. in the host's directory).
    #[error("bind paths overlap: {0} and {1}")]
    Overlap(PathBuf, PathBuf),
    /// The program to run is in no bind.
    #[error("{0} is not inside any bind path")]
    ExecNotBound(PathBuf),
}

/// Resource limits the VMM gets (`RLIMIT_CORE` is always 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimits {
    /// Open descriptors.
    pub nofile: u64,
    /// Locked memory (bytes).
    pub memlock: u64,
    /// Processes and threads of the jail's uid (`None`: left as is).
    pub nproc: Option<u64>,
}

impl Default for Rlimits {
    fn default() -> Self {
        Rlimits {
            nofile: 4096,
            memlock: 0,
            nproc: None,
        }
    }
}

/// The VMM's cgroup: limits written before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupSpec {
    /// Memory limit (bytes).
    pub memory_bytes: Option<u64>,
    /// Most tasks (processes and threads).
    pub pids_max: Option<u64>,
    /// CPU weight, 1..=10000 (cgroup v2 scale; 100 is the default share).
    pub cpu_weight: Option<u64>,
}

/// One confined VMM: who it runs as, what it sees, what it keeps.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JailSpec {
    /// Names the jail (its cgroup, its hostname): `[A-Za-z0-9_.-]{1,64}`.
    pub id: String,
    /// User id (never 0).
    pub uid: u32,
    /// Group id (never 0).
    pub gid: u32,
    /// Supplementary groups.
    pub extra_gids: Vec<u32>,
    /// The program (absolute, inside a bind).
    pub exec: PathBuf,
    /// Its arguments (after argv\[0\], which is `exec`).
    pub args: Vec<OsString>,
    /// Files and directories visible read-only, each at its own path.
    pub ro: Vec<PathBuf>,
    /// Files and directories visible read-write, each at its own path.
    pub rw: Vec<PathBuf>,
    /// Gives the jail `/dev/kvm` (owned by its uid).
    pub kvm: bool,
    /// Descriptors above 2 the VMM keeps (e.g. its readiness pipe).
    pub keep_fds: Vec<i32>,
    /// Descriptors the supervisor keeps open until the VMM ends and the
    /// VMM does not get (e.g. the lease on its uid: [`uids`]).
    pub hold_fds: Vec<i32>,
    /// The VMM's whole environment.
    pub env: Vec<(String, String)>,
    /// A network namespace to join (`None`: a new, empty one).
    pub netns: Option<PathBuf>,
    /// A cgroup of its own (`None`: stays in the starter's).
    pub cgroup: Option<CgroupSpec>,
    /// A cgroup of its own that the starter already made, limits written
    /// (one directory per hierarchy, under `/sys/fs/cgroup`): joined, and
    /// removed after, as one the jailer makes ([`cgroup::Cgroup::adopt`]).
    /// Not with [`Self::cgroup`].
    pub cgroup_dirs: Vec<PathBuf>,
    /// Resource limits.
    pub rlimits: Rlimits,
    /// Where the supervisor writes the VMM's host pid (decimal).
    pub pid_file: Option<PathBuf>,
}

fn os(s: impl AsRef<OsStr>) -> OsString {
    s.as_ref().to_os_string()
}

/// An absolute path with no `.`, `..` or empty components.
fn clean_abs(flag: &'static str, v: &OsStr) -> Result<PathBuf, SpecError> {
    let p = Path::new(v);
    let bad = |why| SpecError::Bad {
        flag,
        why,
        value: v.into(),
    };
    if !p.is_absolute() || v.as_bytes().contains(&0) {
        return Err(bad("not an absolute path"));
    }
    if p.components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
        || v.as_bytes().windows(2).any(|w| w == b"//")
        || (v.len() > 1 && v.as_bytes().ends_with(b"/"))
    {
        return Err(bad("not a normalized path"));
    }
    if p == Path::new("/") {
        return Err(bad("the whole root cannot be bound"));
    }
    Ok(p.into())
}

fn num<T: std::str::FromStr>(flag: &'static str, v: &OsStr) -> Result<T, SpecError> {
    v.to_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| SpecError::Bad {
            flag,
            why: "not a number",
            value: v.into(),
        })
}

impl JailSpec {
    /// The jailer's arguments (after its own argv\[0\]): flags, `--`, the
    /// program and its arguments.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut f = |k: &str, v: OsString| {
            a.push(k.into());
            a.push(v);
        };
        f("--id", os(&self.id));
        f("--uid", os(self.uid.to_string()));
        f("--gid", os(self.gid.to_string()));
        for g in &self.extra_gids {
            f("--extra-gid", os(g.to_string()));
        }
        for p in &self.ro {
            f("--ro", os(p));
        }
        for p in &self.rw {
            f("--rw", os(p));
        }
        for fd in &self.keep_fds {
            f("--keep-fd", os(fd.to_string()));
        }
        for fd in &self.hold_fds {
            f("--hold-fd", os(fd.to_string()));
        }
        for (k, v) in &self.env {
            f("--env", os(format!("{k}={v}")));
        }
        if let Some(n) = &self.netns {
            f("--netns", os(n));
        }
        if let Some(c) = &self.cgroup {
            a.push("--cgroup".into());
            let mut f = |k: &str, v: Option<u64>| {
                if let Some(v) = v {
                    a.push(k.into());
                    a.push(os(v.to_string()));
                }
            };
            f("--memory-bytes", c.memory_bytes);
            f("--pids-max", c.pids_max);
            f("--cpu-weight", c.cpu_weight);
        }
        for d in &self.cgroup_dirs {
            a.push("--cgroup-dir".into());
            a.push(os(d));
        }
        let mut f = |k: &str, v: OsString| {
            a.push(k.into());
            a.push(v);
        };
        f("--nofile", os(self.rlimits.nofile.to_string()));
        f("--memlock", os(self.rlimits.memlock.to_string()));
        if let Some(n) = self.rlimits.nproc {
            f("--nproc", os(n.to_string()));
        }
        if let Some(p) = &self.pid_file {
            f("--pid-file", os(p));
        }
        if self.kvm {
            a.push("--kvm".into());
        }
        a.push("--".into());
        a.push(os(&self.exec));
        a.extend(self.args.iter().cloned());
        a
    }

    /// Parses [`Self::to_args`]'s form and checks it ([`Self::check`]).
    pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<JailSpec, SpecError> {
        let mut s = JailSpec::default();
        let mut cg: Option<CgroupSpec> = None;
        let mut it = args.into_iter();
        let (mut uid, mut gid) = (None, None);
        while let Some(a) = it.next() {
            if a == "--" {
                let exec = it.next().ok_or(SpecError::Missing("--"))?;
                s.exec = clean_abs("exec", &exec)?;
                s.args = it.collect();
                break;
            }
            match a.to_str() {
                Some("--kvm") => {
                    s.kvm = true;
                    continue;
                }
                Some("--cgroup") => {
                    cg.get_or_insert_with(CgroupSpec::default);
                    continue;
                }
                _ => {}
            }
            let Some(flag) = a
                .to_str()
                .and_then(|f| VALUED.iter().copied().find(|k| *k == f))
            else {
                return Err(SpecError::Unknown(a));
            };
            let v = it.next().ok_or(SpecError::Missing(flag))?;
            let cgroup = || SpecError::Bad {
                flag,
                why: "comes before --cgroup",
                value: v.clone(),
            };
            match flag {
                "--id" => s.id = v.to_string_lossy().into_owned(),
                "--uid" => uid = Some(num(flag, &v)?),
                "--gid" => gid = Some(num(flag, &v)?),
                "--extra-gid" => s.extra_gids.push(num(flag, &v)?),
                "--ro" => s.ro.push(clean_abs(flag, &v)?),
                "--rw" => s.rw.push(clean_abs(flag, &v)?),
                "--keep-fd" => s.keep_fds.push(num(flag, &v)?),
                "--hold-fd" => s.hold_fds.push(num(flag, &v)?),
                "--env" => {
                    let kv = v.to_str().and_then(|x| x.split_once('='));
                    match kv {
                        Some((k, val)) if valid_env_key(k) => s.env.push((k.into(), val.into())),
                        _ => {
                            return Err(SpecError::Bad {
                                flag,
                                why: "not KEY=VALUE",
                                value: v,
                            })
                        }
                    }
                }
                "--netns" => s.netns = Some(clean_abs(flag, &v)?),
                "--cgroup-dir" => s.cgroup_dirs.push(clean_abs(flag, &v)?),
                "--memory-bytes" => {
                    cg.as_mut().ok_or_else(cgroup)?.memory_bytes = Some(num(flag, &v)?)
                }
                "--pids-max" => cg.as_mut().ok_or_else(cgroup)?.pids_max = Some(num(flag, &v)?),
                "--cpu-weight" => cg.as_mut().ok_or_else(cgroup)?.cpu_weight = Some(num(flag, &v)?),
                "--nofile" => s.rlimits.nofile = num(flag, &v)?,
                "--memlock" => s.rlimits.memlock = num(flag, &v)?,
                "--nproc" => s.rlimits.nproc = Some(num(flag, &v)?),
                "--pid-file" => s.pid_file = Some(clean_abs(flag, &v)?),
                _ => return Err(SpecError::Unknown(a)),
            }
        }
        if s.exec.as_os_str().is_empty() {
            return Err(SpecError::Missing("-- PROGRAM"));
        }
        s.uid = uid.ok_or(SpecError::Missing("--uid"))?;
        s.gid = gid.ok_or(SpecError::Missing("--gid"))?;
        s.cgroup = cg;
        s.check()?;
        Ok(s)
    }

    /// What a spec must satisfy: a valid id, unprivileged ids, descriptors
    /// above 2 without duplicates, binds that do not nest, the program in
    /// a bind, a CPU weight in range.
    pub fn check(&self) -> Result<(), SpecError> {
        let bad = |flag, why, value: &dyn AsRef<OsStr>| SpecError::Bad {
            flag,
            why,
            value: os(value),
        };
        let id_ok = (1..=64).contains(&self.id.len())
            && self
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
            && !self.id.starts_with('.');
        if !id_ok {
            return Err(bad("--id", "not [A-Za-z0-9_.-]{1,64}", &self.id));
        }
        if self.uid == 0 {
            return Err(bad("--uid", "root is not a jail user", &"0"));
        }
        if self.gid == 0 || self.extra_gids.contains(&0) {
            return Err(bad("--gid", "root's group is not a jail group", &"0"));
        }
        let mut fds: Vec<i32> = self
            .keep_fds
            .iter()
            .chain(&self.hold_fds)
            .copied()
            .collect();
        fds.sort_unstable();
        for w in fds.windows(2) {
            if w[0] == w[1] {
                return Err(bad("--keep-fd", "given twice", &w[0].to_string()));
            }
        }
        if let Some(fd) = fds.iter().find(|f| **f <= 2) {
            return Err(bad("--keep-fd", "0-2 are always kept", &fd.to_string()));
        }
        let all: Vec<&PathBuf> = self.ro.iter().chain(&self.rw).collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                if a.starts_with(b) || b.starts_with(a) {
                    return Err(SpecError::Overlap((*a).clone(), (*b).clone()));
                }
            }
        }
        if !all.iter().any(|b| self.exec.starts_with(b)) {
            return Err(SpecError::ExecNotBound(self.exec.clone()));
        }
        if let Some(d) = self.cgroup_dirs.first() {
            if self.cgroup.is_some() {
                return Err(bad("--cgroup-dir", "not with --cgroup", d));
            }
        }
        for d in &self.cgroup_dirs {
            if !d.starts_with(cgroup::ROOT) || d.components().count() < 6 {
                return Err(bad(
                    "--cgroup-dir",
                    "not a cgroup below /sys/fs/cgroup/*/",
                    d,
                ));
            }
        }
        if let Some(w) = self.cgroup.and_then(|c| c.cpu_weight) {
            if !(1..=10000).contains(&w) {
                return Err(bad("--cpu-weight", "not in 1..=10000", &w.to_string()));
            }
        }
        Ok(())
    }
}

/// The flags that take a value.
const VALUED: [&str; 18] = [
    "--id",
    "--uid",
    "--gid",
    "--extra-gid",
    "--ro",
    "--rw",
    "--keep-fd",
    "--hold-fd",
    "--env",
    "--netns",
    "--cgroup-dir",
    "--memory-bytes",
    "--pids-max",
    "--cpu-weight",
    "--nofile",
    "--memlock",
    "--nproc",
    "--pid-file",
];

fn valid_env_key(k: &str) -> bool {
    !k.is_empty()
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !k.as_bytes()[0].is_ascii_digit()
}

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
