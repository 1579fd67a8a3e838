//! Jailed VMMs: what a backend knows about jailing ([`JailConfig`]: the
//! jailer, the VMM's own files, the uid leases) and what one VMM's jail is
//! ([`Jail`], the [`crate::vmm_process::VmmProcess`] option that turns the
//! command into `shoal-jailer <spec> -- shoal-vmm <args>`).
//!
//! Paths are the same inside a jail, so VMM arguments and snapshot states
//! do not change. A VMM sees, read-only: its binary, loader and libraries,
//! `/sys/module/kvm_pvm` where it exists (the VMM tells PVM from hardware
//! KVM by it), and the files of the snapshot it restores; read-write: its
//! sandbox directory (sockets, logs, pause snapshots, scratch disk).
//!
//! Which files a snapshot needs besides its own directory (the images its
//! pmem devices map, which may be another template's) is listed by the
//! runtime, never by a VMM: in a template directory's [`FILES`] (written
//! by the runtime as root once the snapshot is made) and, for pause
//! snapshots, in the backend state the daemon stores.
//!
//! Modes: template files the VMM wrote are given to root and the group
//! every jailed VMM has ([`uids::SHARED_GID`]), 0640 in 0750 directories
//! ([`share_template`]); a sandbox directory belongs to its VMM's uid
//! ([`own_dir`]). A bind is reached without the host's parent
//! directories, so the state directory itself stays 0700 root.

use crate::jail_prep::{CgroupMaker, NetnsStock};
pub use shoal_jailer::{uids, CgroupSpec, JailSpec, Rlimits};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The list of host files a template's snapshot needs besides its own
/// directory (JSON array of absolute paths).
pub const FILES: &str = "jail-files.json";

/// The file in a sandbox directory where the jailer writes its VMM's pid.
pub const PID_FILE: &str = "vmm.pid";

/// Host memory a jailed VMM may use beyond guest RAM and its images: its
/// own heap, thread stacks, virtqueue buffers, page tables (measured:
/// a restored idle VMM's private memory beyond guest pages is ~2-3 MiB;
/// 64 MiB leaves room for vsock buffers under load).
pub const OVERHEAD_BYTES: u64 = 64 << 20;

/// The Cargo target of the static `shoal-jailer` build
/// (`cargo build --release --target x86_64-unknown-linux-musl -p shoal-jailer`).
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-musl";

/// Each VMM's CPU weight (cgroup v2 scale, 100 = the default share;
/// `cpu.shares` 1024 on v1).
pub const CPU_WEIGHT: u64 = 100;

/// Why jailing cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// The VMM's libraries.
    #[error(transparent)]
    Deps(#[from] shoal_jailer::deps::DepsError),
    /// A uid lease.
    #[error(transparent)]
    Uid(#[from] uids::UidError),
    /// A file or directory.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// How a backend jails its VMMs.
#[derive(Debug, Clone)]
pub struct JailConfig {
    /// The `shoal-jailer` binary.
    pub jailer: PathBuf,
    /// Where uid leases are kept.
    pub uid_dir: PathBuf,
    /// What every VMM sees read-only: its binary, loader and libraries,
    /// the PVM marker.
    pub base_ro: Vec<PathBuf>,
    /// Most tasks (threads) per VMM.
    pub pids_max: u64,
    /// Fresh network namespaces made ahead (root only).
    pub netns: Option<Arc<NetnsStock>>,
    /// Makes each VMM's cgroup from a plan read once (root only).
    pub cgroups: Option<Arc<CgroupMaker>>,
}

impl JailConfig {
    /// Jailing with `jailer` for VMMs run from `vmm`, leases in `uid_dir`.
    pub fn new(jailer: &Path, vmm: &Path, uid_dir: &Path) -> Result<JailConfig, JailError> {
        let vmm = std::fs::canonicalize(vmm).map_err(|e| JailError::Io(vmm.into(), e))?;
        let mut base_ro = vec![vmm.clone()];
        base_ro.extend(shoal_jailer::deps::of(&vmm)?);
        let pvm = Path::new("/sys/module/kvm_pvm");
        if pvm.is_dir() {
            base_ro.push(pvm.into());
        }
        Ok(JailConfig {
            jailer: jailer.into(),
            uid_dir: uid_dir.into(),
            base_ro,
            pids_max: 256,
            netns: NetnsStock::start(),
            // SAFETY: geteuid cannot fail.
            cgroups: (unsafe { libc::geteuid() } == 0)
                .then(CgroupMaker::new)
                .flatten()
                .map(Arc::new),
        })
    }

    /// The `shoal-jailer` to use: `SHOAL_JAILER`, else one beside `vmm`
    /// or this program (test binaries live one level down), or its static
    /// build in the same Cargo profile ([`STATIC_TARGET`]: it starts in a
    /// fraction of the time a dynamically linked one takes, which every
    /// restore pays); of the first directory holding either, the newer.
    pub fn find_jailer(vmm: &Path) -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("SHOAL_JAILER") {
            return Some(p.into());
        }
        let exe = std::env::current_exe().unwrap_or_default();
        let mut dirs: Vec<PathBuf> = vec![];
        dirs.extend(vmm.parent().map(Path::to_path_buf));
        dirs.extend(exe.parent().map(Path::to_path_buf));
        dirs.extend(exe.parent().and_then(Path::parent).map(Path::to_path_buf));
        dirs.into_iter().find_map(|d| {
            let mut found: Vec<PathBuf> = vec![d.join("shoal-jailer")];
            if let (Some(profile), Some(target)) = (d.file_name(), d.parent()) {
                found.push(
                    target
                        .join(STATIC_TARGET)
                        .join(profile)
                        .join("shoal-jailer"),
                );
            }
            found
                .into_iter()
                .filter_map(|p| {
                    let m = std::fs::metadata(&p).ok().filter(|m| m.is_file())?;
                    Some((m.modified().ok(), p))
                })
                .max_by_key(|(t, _)| *t)
                .map(|(_, p)| p)
        })
    }

    /// The default for a daemon: jailed when it runs as root, unless
    /// `SHOAL_JAIL=0`; `Ok(None)` when not jailing.
    pub fn auto(vmm: &Path, state_dir: &Path) -> Result<Option<JailConfig>, String> {
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if !root || std::env::var_os("SHOAL_JAIL").is_some_and(|v| v == "0") {
            return Ok(None);
        }
        let jailer = Self::find_jailer(vmm).ok_or_else(|| {
            format!(
                "no shoal-jailer beside {} (build it: cargo build --release \
                 --target x86_64-unknown-linux-musl -p shoal-jailer; \
                 or set SHOAL_JAILER, or SHOAL_JAIL=0 to run VMMs unjailed)",
                vmm.display()
            )
        })?;
        Self::new(&jailer, vmm, &state_dir.join("jail-uids"))
            .map(Some)
            .map_err(|e| e.to_string())
    }

    /// The jail of the VMM of sandbox `dir` (its id: the directory's
    /// name), restoring a snapshot that needs `files` read-only, with
    /// `memory_bytes` of guest RAM and images.
    pub fn jail_for(
        &self,
        dir: &Path,
        files: &[PathBuf],
        memory_bytes: u64,
    ) -> Result<Jail, JailError> {
        let lease = uids::lease(&self.uid_dir)?;
        let uid = lease.uid();
        own_dir(dir, uid)?;
        let id = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "vmm".into());
        let mut ro: Vec<PathBuf> = self.base_ro.clone();
        for f in files {
            if !ro.contains(f) && f.as_path() != dir {
                ro.push(f.clone());
            }
        }
        let env = ["RUST_LOG", "RUST_BACKTRACE"]
            .into_iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect();
        let cgroup = CgroupSpec {
            memory_bytes: Some(memory_bytes + OVERHEAD_BYTES),
            pids_max: Some(self.pids_max),
            // Every VMM the same share of the CPUs under contention,
            // whatever its number of threads.
            cpu_weight: Some(CPU_WEIGHT),
        };
        let mut spec = JailSpec {
            id,
            uid,
            gid: uid,
            extra_gids: vec![uids::SHARED_GID],
            exec: PathBuf::new(),
            args: vec![],
            ro,
            rw: vec![dir.into()],
            kvm: true,
            keep_fds: vec![],
            // The lease is placed among the passed descriptors when the
            // command is built (`VmmProcess::confine`).
            hold_fds: vec![],
            env,
            netns: None,
            cgroup: Some(cgroup),
            cgroup_dirs: vec![],
            rlimits: Rlimits::default(),
            pid_file: Some(dir.join(PID_FILE)),
        };
        // Made here, the jailer adopts it; if this fails the jailer tries
        // itself and reports why.
        if let Some(m) = &self.cgroups {
            if let Ok(dirs) = m.make(&spec.id, &cgroup) {
                spec.cgroup = None;
                spec.cgroup_dirs = dirs;
            }
        }
        Ok(Jail {
            jailer: self.jailer.clone(),
            spec,
            lease: Some(Arc::new(lease)),
            netns: self.netns.as_ref().and_then(|s| s.take()).map(Arc::new),
        })
    }
}

/// One VMM's jail. The lease on its uid is held by this value until the
/// VMM is spawned, then by the jailer.
#[derive(Debug, Clone)]
pub struct Jail {
    /// The `shoal-jailer` binary.
    pub jailer: PathBuf,
    /// The spec; its program, arguments and kept descriptors are filled
    /// in from the VMM process when the command is built.
    pub spec: JailSpec,
    /// The uid lease (its descriptor is in `spec.hold_fds`).
    pub lease: Option<Arc<uids::Lease>>,
    /// A network namespace made ahead for this VMM alone (passed to the
    /// jailer as a descriptor, `--netns /proc/self/fd/N`); `None`: the
    /// jailer makes a new one.
    pub netns: Option<Arc<std::fs::File>>,
}

impl Jail {
    /// The directories of the VMM's cgroup (one per hierarchy): those made
    /// ahead, or those the jailer will make (the same plan: it inherits
    /// this process's cgroups); empty when it has none.
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        if !self.spec.cgroup_dirs.is_empty() {
            return self.spec.cgroup_dirs.clone();
        }
        self.spec
            .cgroup
            .and_then(|c| shoal_jailer::cgroup::plan_here(&self.spec.id, &c).ok())
            .map(|p| p.dirs)
            .unwrap_or_default()
    }
}

/// Removes the cgroup directories of a VMM that is gone (those of one
/// whose jailer was killed before it could); a directory that still has
/// tasks (its VMM runs) is kept, as `rmdir` refuses it. Returns how many
/// went.
pub fn remove_cgroups(dirs: &[PathBuf]) -> usize {
    dirs.iter()
        .filter(|d| d.starts_with(shoal_jailer::cgroup::ROOT) && std::fs::remove_dir(d).is_ok())
        .count()
}

impl PartialEq for Jail {
    fn eq(&self, o: &Jail) -> bool {
        self.jailer == o.jailer && self.spec == o.spec
    }
}

fn io(p: &Path) -> impl FnOnce(std::io::Error) -> JailError + '_ {
    move |e| JailError::Io(p.into(), e)
}

/// Gives directory `dir` and everything in it to `uid` (its group the
/// same), the directory 0700: the sandbox (or template boot) directory of
/// a VMM that runs as `uid` (a pause snapshot written under an earlier uid
/// included). Files with other links (images pinned from the installed
/// artifacts share their inode) are not the directory's to give away.
pub fn own_dir(dir: &Path, uid: u32) -> Result<(), JailError> {
    fn walk(p: &Path, uid: u32) -> std::io::Result<()> {
        let m = std::fs::symlink_metadata(p)?;
        if m.file_type().is_symlink() || (m.is_file() && m.nlink() > 1) {
            return Ok(());
        }
        if m.uid() != uid || m.gid() != uid {
            std::os::unix::fs::lchown(p, Some(uid), Some(uid))?;
        }
        if m.is_dir() {
            for e in std::fs::read_dir(p)? {
                walk(&e?.path(), uid)?;
            }
        }
        Ok(())
    }
    walk(dir, uid).map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))
}

/// Makes template directory `dir` readable by every jailed VMM and no one
/// else: root and [`uids::SHARED_GID`] own it and its files (0750 /
/// 0640); files with other links (images pinned from the installed
/// artifacts, which share their inode) are left as they are.
pub fn share_template(dir: &Path) -> Result<(), JailError> {
    fn walk(p: &Path) -> std::io::Result<()> {
        let m = std::fs::symlink_metadata(p)?;
        if m.file_type().is_symlink() {
            return Ok(());
        }
        if m.is_dir() {
            std::os::unix::fs::lchown(p, Some(0), Some(uids::SHARED_GID))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o750))?;
            for e in std::fs::read_dir(p)? {
                walk(&e?.path())?;
            }
        } else if m.nlink() == 1 {
            std::os::unix::fs::lchown(p, Some(0), Some(uids::SHARED_GID))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o640))?;
        }
        Ok(())
    }
    walk(dir).map_err(io(dir))
}

/// Writes `dir`'s [`FILES`]: `files` other than `dir` and what is inside
/// it, each once.
pub fn write_files(dir: &Path, files: &[PathBuf]) -> Result<(), JailError> {
    let mut v: Vec<&PathBuf> = vec![];
    for f in files {
        if !f.starts_with(dir) && !v.contains(&f) {
            v.push(f);
        }
    }
    let p = dir.join(FILES);
    let body = serde_json::to_vec(&v).unwrap_or_default();
    std::fs::write(&p, body).map_err(io(&p))
}

/// What a template's snapshot needs read-only: its directory and the
/// files its [`FILES`] lists (just the directory when there is none:
/// templates from before jailing keep their images inside).
pub fn template_files(dir: &Path) -> Vec<PathBuf> {
    let listed: Vec<PathBuf> = std::fs::read(dir.join(FILES))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let mut v = vec![dir.to_path_buf()];
    for f in listed {
        if f.is_absolute() && !v.iter().any(|x| f.starts_with(x) || x.starts_with(&f)) {
            v.push(f);
        }
    }
    v
}

/// The host pid of the VMM its jailer (pid `jailer`) started for the
/// sandbox in `dir`: the jailer writes it to [`PID_FILE`]; it is believed
/// only if that process's parent is the jailer.
pub fn vmm_pid(jailer: i32, dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ppid: i32 = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    (ppid == jailer).then_some(pid)
}

#[cfg(test)]
#[path = "jail_tests.rs"]
mod tests;
