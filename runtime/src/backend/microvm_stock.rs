//! MicroVMs made ahead of their sandboxes ([`super::StockedVm`]): a
//! `shoal-vmm --prewarm --once` started for one sandbox directory and one
//! template, through the jailer when the backend jails, so that everything
//! but the restore itself is done before the sandbox is asked for: the
//! uid lease and the directory's owner, the network namespace, the cgroup
//! (its memory limit is the template's guest RAM and images plus the
//! overhead, known here), the jailer's mounts (`pivot_root` into a root
//! holding the template's directory and the files its
//! [`crate::jail::FILES`] lists, bound read-only at their own paths, as a
//! cold restore's jail has them), the VMM's KVM VM, memory slots and
//! vCPUs, and the sandbox's own copy of the template's scratch disk. The
//! create then sends `restore` on the control socket: paths in the
//! snapshot are the same inside the jail, so nothing is passed but the
//! template's directory and that copy.
//!
//! With `--once` the VMM ends when its guest stops, as a restored one
//! does, so the daemon's supervision (a pidfd on the jailer) is the same
//! for both.

use super::{guest_bytes, log_tail, stop, wait_ready, MicroVm, MicroVmSandbox, READY_TIMEOUT};
use crate::backend::{BackendError, NetAttach, Proc, SandboxVm, StockedVm};
use crate::jail;
use crate::vm::{self, Paths};
use crate::vmm_process::{Io, Serial, VmmProcess, VmmProcessError};
use shoal_images::layers;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use vmm_api::Client;

/// One VMM made ahead, waiting for its `restore`.
#[derive(Debug)]
struct Stocked {
    proc: Proc,
    paths: Paths,
    /// The template it was made for (its jail binds that one's files).
    template: PathBuf,
    /// What the template's snapshot needs outside its directory.
    files: Vec<PathBuf>,
    /// The sandbox's copy of the template's scratch disk.
    disk: Option<PathBuf>,
    jailed: bool,
    /// Its cgroup's directories (jailed).
    cgroups: Vec<PathBuf>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BackendError + '_ {
    move |source| BackendError::Io {
        path: path.into(),
        source,
    }
}

/// Starts the VMM of a sandbox in `dir` that `template` will be restored
/// into, and waits until its control socket serves. With `net`, its net
/// device will be on that TAP and its jail joins that netns (a networked
/// template's stock: each entry has a slot of its own).
pub(super) fn stock(
    b: &MicroVm,
    dir: &Path,
    template: &Path,
    (vcpus, memory_mib): (u8, u32),
    net: Option<&NetAttach>,
) -> Result<Box<dyn StockedVm>, BackendError> {
    if !template.join("state").is_file() {
        return Err(BackendError::NoSource(template.into()));
    }
    let files = jail::template_files(template);
    let paths = Paths::new(dir);
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let _ = std::fs::remove_file(&paths.api_sock);
    let _ = std::fs::remove_file(&paths.vsock);
    let mut p = VmmProcess::prewarm_once(&b.vmm)
        .memory_mib(memory_mib)
        .vcpus(vcpus);
    if let Some(n) = net {
        p = p.net_tap(n.tap.clone(), n.mac, n.limits);
    }
    let mut uid = None;
    let mut cgroups = vec![];
    if let Some(j) = &b.jail {
        let _ = std::fs::remove_file(dir.join(jail::PID_FILE));
        let mut j = j
            .jail_for(dir, &files, guest_bytes(template, &files))
            .map_err(|e| BackendError::Jail(e.to_string()))?;
        if let Some(n) = net {
            let ns = std::fs::File::open(&n.netns).map_err(io(&n.netns))?;
            j.netns = Some(Arc::new(ns));
        }
        uid = Some(j.spec.uid);
        cgroups = j.cgroup_dirs();
        p = p.jail(j);
    }
    // The sandbox's own copy of the scratch disk, made now (a clone where
    // the file system can), given to the VMM's uid.
    let disk = match layers::scratch_disk(template) {
        Some(src) => {
            let own = dir.join(layers::SCRATCH_DISK);
            let _ = std::fs::remove_file(&own);
            layers::clone_file(&src, &own)?;
            if let Some(uid) = uid {
                std::os::unix::fs::lchown(&own, Some(uid), Some(uid)).map_err(io(&own))?;
            }
            Some(own)
        }
        None => None,
    };
    let s = p
        .api_sock(&paths.api_sock)
        .vsock_uds(&paths.vsock)
        .serial(Serial::File(dir.join("console.log")))
        .stdin(Io::Null)
        .stdout(Io::Null)
        .stderr(Io::Append(dir.join("vmm.log")))
        .ready_pipe(true)
        .own_session(true)
        .spawn()?;
    let pid = vm::pid_of(&s.child);
    // Reaped by whoever watches it (the stock, then the sandbox's watcher).
    drop(s.child);
    let proc = Proc {
        pid,
        start: vm::pid_start(pid).unwrap_or(0),
    };
    let mut ready = s.ready.ok_or(BackendError::Spawn(VmmProcessError::Invalid(
        "no readiness pipe",
    )))?;
    // Pre-warmed, "ready" means its control socket serves.
    wait_ready(&proc, &mut ready, &paths)?;
    Ok(Box::new(Stocked {
        proc,
        paths,
        template: template.into(),
        files,
        disk,
        jailed: b.jail.is_some(),
        cgroups,
    }))
}

impl StockedVm for Stocked {
    fn pid(&self) -> i32 {
        self.proc.pid
    }

    fn alive(&self) -> bool {
        // A jailer ends with its VMM.
        self.proc.alive()
    }

    fn restore(self: Box<Self>, template: &Path) -> Result<Arc<dyn SandboxVm>, BackendError> {
        if template != self.template {
            self.discard();
            return Err(BackendError::NoSource(template.into()));
        }
        let disks: Vec<PathBuf> = self.disk.iter().cloned().collect();
        let r = Client::new(&self.paths.api_sock, READY_TIMEOUT).restore(template, &disks);
        if let Err(e) = r {
            let status = stop(&self.proc, Duration::from_secs(2));
            let detail = vm::with_exit_cause(status, &log_tail(&self.paths));
            return Err(BackendError::Unusable {
                pid: self.proc.pid,
                detail: format!("restore into the stocked VMM: {e}: {detail}"),
            });
        }
        Ok(Arc::new(MicroVmSandbox {
            proc: self.proc,
            paths: self.paths,
            files: self.files,
            jailed: self.jailed,
            cgroups: self.cgroups,
        }))
    }

    fn discard(self: Box<Self>) {
        stop(&self.proc, Duration::from_secs(2));
        self.proc.reap();
    }
}
