//! The `vm` kind: a full VM on QEMU (`q35`, KVM, virtio over PCI, a
//! display), driven through QMP. Disks are per-sandbox qcow2 overlays over
//! a shared read-only base; pause and resume are QMP `stop`/`cont`;
//! pause-to-disk, snapshots and templates are a migration stream written
//! to a file (`exec:cat > FILE`, as QEMU 7.2 has no `file:` URI) next to a
//! copy of the overlay, and a restore is a new QEMU with
//! `-incoming "exec:cat FILE"`. A networked template and its sandboxes
//! have a virtio-net device on their network slot's TAP (`qemu_net.rs`).
//!
//! Confinement: each QEMU runs in its own session, in its own directory
//! (`<sandbox>/qemu`: overlay, QMP socket, logs, saved state), in its own
//! cgroup `shoal/qemu-<id>` (memory: guest RAM + 256 MiB; at most 256
//! tasks) and under QEMU's seccomp filter (`-sandbox on`, no setuid, no
//! obsolete or scheduler calls). What our jailer adds to `shoal-vmm` does not
//! apply yet: QEMU runs as the daemon's user, outside a chroot and mount
//! namespace (it opens its files by path; `-runas`/`-chroot` are the way).

use super::qemu_launch::{
    self as launch, Firmware, QemuTools, VmSpec, CONSOLE_LOG, DISK_FILE, QEMU_DIR, SPEC_FILE,
    VMSTATE_FILE,
};
use super::qemu_net::Nic;
use super::{
    BackendError, BackendState, Kind, NetAttach, Proc, Reattached, SandboxBackend, SandboxVm,
    Source, Transport, VmStats,
};
use crate::qmp::Qmp;
use crate::sandbox::TemplateSpec;
use serde::{Deserialize, Serialize};
use serde_json::json;
use shoal_images::layer_files::Layer;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use super::qemu_input::InputEvent;
pub use super::qemu_launch::VmImage;

/// The saved state of a sandbox paused to disk (in its QEMU directory).
pub const PAUSED_FILE: &str = "paused.vmstate";
/// The agent's socket (hybrid-vsock style) in a sandbox's QEMU directory.
pub const AGENT_SOCK: &str = "agent.sock";
/// Time allowed for one QMP command.
const QMP_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed to save or load a migration stream.
const MIGRATE_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest screenshot accepted from QEMU.
const MAX_SCREEN: u64 = 64 << 20;

/// The kernel command line of a `vm` guest booting our kernel from an
/// erofs base image on its first virtio disk, with Shoal's agent as PID 1
/// in a writable overlay of it (`shoal.overlay=1`: a tmpfs upper layer, as
/// a microVM's; the agent writes `/etc/resolv.conf` for a network): the
/// microVM base line without `pci=off` (q35 has a PCI bus), then the
/// host's CPU words (`pvm`: on PVM hosts `shoal.pvm clearcpuid=...`,
/// which QEMU does not add; `vmm::vm::profile_kernel_args`).
pub fn vm_cmdline(base: &str, pvm: &str) -> String {
    let base: Vec<&str> = base
        .split_whitespace()
        .filter(|w| *w != "pci=off")
        .collect();
    format!(
        "{} root=/dev/vda rootfstype=erofs ro shoal.overlay=1 init=/sbin/shoal-agent {pvm} --",
        base.join(" ")
    )
    .replace("  ", " ")
}

/// What the backend stores about a sandbox (see [`BackendState`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
enum Stored {
    /// QEMU runs.
    Running {
        pid: i32,
        start: u64,
        qdir: PathBuf,
        cgroups: Vec<PathBuf>,
        spec: VmSpec,
    },
    /// Saved to `qdir/paused.vmstate`; no process.
    Paused { qdir: PathBuf, spec: VmSpec },
}

/// The `vm` kind.
#[derive(Debug, Clone)]
pub struct Qemu {
    tools: QemuTools,
    image: Option<VmImage>,
    boot_timeout: Duration,
}

impl Qemu {
    /// A backend that runs `tools`; templates boot `image`.
    pub fn new(tools: QemuTools, image: Option<VmImage>) -> Qemu {
        Qemu {
            tools,
            image,
            // A PVM host boots our kernel in ~20 s idle, minutes when loaded.
            boot_timeout: Duration::from_secs(300),
        }
    }

    /// With this much time for a cold boot to reach its ready marker.
    pub fn with_boot_timeout(mut self, t: Duration) -> Qemu {
        self.boot_timeout = t;
        self
    }

    /// Boots `spec` cold in the sandbox directory `dir` and waits until it
    /// is up (its ready marker, else running).
    pub fn boot(&self, dir: &Path, spec: &VmSpec) -> Result<Arc<QemuVm>, BackendError> {
        self.boot_with(dir, spec, None)
    }

    /// [`Qemu::boot`] with a net device on `nic` (given exactly when
    /// `spec.net`).
    pub fn boot_with(
        &self,
        dir: &Path,
        spec: &VmSpec,
        nic: Option<&Nic>,
    ) -> Result<Arc<QemuVm>, BackendError> {
        spec.check()?;
        let qdir = prepare(dir)?;
        launch::create_overlay(&self.tools, spec, &qdir.join(DISK_FILE))?;
        if let Firmware::Uefi { vars, .. } = &spec.firmware {
            copy(vars, &qdir.join("OVMF_VARS.fd"))?;
        }
        write_spec(&qdir, spec)?;
        let cmd = launch::command(&self.tools, spec, &qdir, None, nic)?;
        let vm = self.start(dir, &qdir, spec, cmd)?;
        if spec.serial_console {
            if let Err(e) = vm.wait_shell(self.boot_timeout) {
                vm.destroy(Duration::from_secs(5));
                return Err(e);
            }
        } else if let Some(m) = &spec.ready_marker {
            if let Err(e) = launch::wait_marker(&vm.proc, &qdir, m, self.boot_timeout) {
                vm.destroy(Duration::from_secs(5));
                return Err(e);
            }
        }
        Ok(vm)
    }

    /// Starts QEMU from `cmd` and connects to its QMP socket.
    fn start(
        &self,
        dir: &Path,
        qdir: &Path,
        spec: &VmSpec,
        cmd: std::process::Command,
    ) -> Result<Arc<QemuVm>, BackendError> {
        let id = cgroup_id(dir);
        let s = launch::spawn(cmd, qdir, &id, spec.memory_mib)?;
        let vm = Arc::new(QemuVm {
            proc: s.proc,
            qdir: qdir.to_path_buf(),
            cgroups: s.cgroups,
            spec: spec.clone(),
            qmp: Mutex::new(()),
            started: Instant::now(),
            bridge: Mutex::new(None),
        });
        // QEMU answers on its socket once it is set up.
        let up = launch::connect(&vm.proc, qdir, Duration::from_secs(20))
            .and_then(|_| vm.start_bridge());
        if let Err(e) = up {
            vm.destroy(Duration::from_secs(5));
            return Err(e);
        }
        Ok(vm)
    }

    /// Restores a saved VM (`from`: a template, snapshot or own pause) into
    /// `dir` and continues it; one with a net device onto `net`'s TAP.
    fn restore_vm(
        &self,
        dir: &Path,
        from: &Source,
        net: Option<&NetAttach>,
    ) -> Result<Arc<QemuVm>, BackendError> {
        let (spec, qdir, stream) = match from {
            Source::Template(t) | Source::Snapshot(t) => {
                let spec = read_spec(t)?;
                let qdir = prepare(dir)?;
                copy(&t.join(DISK_FILE), &qdir.join(DISK_FILE))?;
                if matches!(spec.firmware, Firmware::Uefi { .. }) {
                    copy(&t.join("OVMF_VARS.fd"), &qdir.join("OVMF_VARS.fd"))?;
                }
                write_spec(&qdir, &spec)?;
                (spec, qdir, t.join(VMSTATE_FILE))
            }
            Source::Paused(st) => match st.decode::<Stored>()? {
                Stored::Paused { qdir, spec } => {
                    let s = qdir.join(PAUSED_FILE);
                    (spec, qdir, s)
                }
                Stored::Running { qdir, .. } => return Err(BackendError::NoSource(qdir)),
            },
        };
        if !stream.is_file() {
            return Err(BackendError::NoSource(stream));
        }
        let nic = super::qemu_net::check_restore(spec.net, net)?;
        let cmd = launch::command(&self.tools, &spec, &qdir, Some(&stream), nic.as_ref())?;
        let vm = self.start(dir, &qdir, &spec, cmd)?;
        let r = vm.with_qmp(|q| {
            launch::wait_migration(q, MIGRATE_TIMEOUT)?;
            q.execute("cont", None, QMP_TIMEOUT)
        });
        if let Err(e) = r {
            vm.destroy(Duration::from_secs(5));
            return Err(e);
        }
        if matches!(from, Source::Paused(_)) {
            let _ = std::fs::remove_file(&stream);
        }
        Ok(vm)
    }
}

/// Makes (and empties of stale sockets) the sandbox's QEMU directory.
fn prepare(dir: &Path) -> Result<PathBuf, BackendError> {
    let qdir = dir.join(QEMU_DIR);
    std::fs::create_dir_all(&qdir).map_err(|source| BackendError::Io {
        path: qdir.clone(),
        source,
    })?;
    for f in [
        launch::QMP_SOCK,
        launch::PORT_SOCK,
        AGENT_SOCK,
        CONSOLE_LOG,
        super::qemu_console::CONSOLE_SOCK,
    ] {
        let _ = std::fs::remove_file(qdir.join(f));
    }
    Ok(qdir)
}

fn copy(from: &Path, to: &Path) -> Result<(), BackendError> {
    let _ = std::fs::remove_file(to);
    shoal_images::layers::clone_file(from, to)?;
    Ok(())
}

fn write_spec(dir: &Path, spec: &VmSpec) -> Result<(), BackendError> {
    let p = dir.join(SPEC_FILE);
    let text = serde_json::to_vec_pretty(spec).unwrap_or_default();
    std::fs::write(&p, text).map_err(|source| BackendError::Io { path: p, source })
}

fn read_spec(dir: &Path) -> Result<VmSpec, BackendError> {
    let p = dir.join(SPEC_FILE);
    let text = std::fs::read_to_string(&p).map_err(|_| BackendError::NoSource(dir.into()))?;
    serde_json::from_str(&text).map_err(|source| BackendError::State {
        state: text.chars().take(200).collect(),
        source,
    })
}

/// The cgroup name of the sandbox in `dir`: its directory's name, cut to
/// what a jail id allows.
fn cgroup_id(dir: &Path) -> String {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("vm");
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        .take(48)
        .collect()
}

/// Removes a gone QEMU's cgroup, waiting briefly for its last threads
/// to finish exiting (a cgroup with tasks is kept).
fn remove_cgroups(dirs: &[PathBuf]) {
    if !dirs.is_empty() {
        shoal_jailer::cgroup::Cgroup::adopt(dirs.to_vec()).remove(Duration::from_secs(2));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SandboxBackend for Qemu {
    fn kind(&self) -> Kind {
        Kind::Vm
    }

    fn build_template(
        &self,
        spec: TemplateSpec,
        layers: &[Layer],
        dir: &Path,
    ) -> Result<(), BackendError> {
        if !layers.is_empty() || !spec.layers.is_empty() {
            return Err(BackendError::Reply("the vm kind takes no layers".into()));
        }
        // A networked template boots on the TAP lent for it; the guest
        // leaves its link down until a restore's NetConfigure.
        let nic = spec.net.as_ref().map(|n| Nic {
            tap: n.tap.clone(),
            mac: n.mac,
        });
        if nic.is_some() && spec.serial_console {
            return Err(BackendError::Reply(
                "a vm without the agent takes no network (the agent configures the link)".into(),
            ));
        }
        let image = super::qemu_disk::image_for(self.image.as_ref(), spec.vm_disk.as_ref())?;
        let console = spec.serial_console;
        let vm_spec = VmSpec {
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            base: image.base,
            base_format: image.base_format,
            kernel: image.kernel,
            append: match console {
                true => super::qemu_console::cmdline(&image.append),
                false => image.append,
            },
            firmware: image.firmware,
            ready_marker: image.ready_marker.filter(|_| !console),
            serial_console: console,
            net: nic.is_some(),
        };
        let boot_dir = dir.with_extension("boot");
        let r = self
            .boot_with(&boot_dir, &vm_spec, nic.as_ref())
            .and_then(|vm| {
                let r = vm.snapshot(dir);
                vm.destroy(Duration::from_secs(5));
                r
            });
        let _ = std::fs::remove_dir_all(&boot_dir);
        if r.is_err() {
            let _ = std::fs::remove_dir_all(dir);
        }
        r
    }

    fn restore(
        &self,
        dir: &Path,
        from: &Source,
        net: Option<&NetAttach>,
    ) -> Result<Arc<dyn SandboxVm>, BackendError> {
        Ok(self.restore_vm(dir, from, net)?)
    }

    fn reattach(&self, _dir: &Path, state: &BackendState) -> Result<Reattached, BackendError> {
        let Stored::Running {
            pid,
            start,
            qdir,
            cgroups,
            spec,
        } = state.decode::<Stored>()?
        else {
            return Err(BackendError::Reply("a paused vm has no process".into()));
        };
        let proc = Proc { pid, start };
        if !proc.alive() {
            return Err(BackendError::Gone(pid));
        }
        let vm = QemuVm {
            proc,
            qdir,
            cgroups,
            spec,
            qmp: Mutex::new(()),
            started: Instant::now(),
            bridge: Mutex::new(None),
        };
        match vm.stats().and_then(|s| vm.start_bridge().map(|()| s)) {
            Ok(s) => Ok(Reattached {
                frozen: s.frozen,
                vm: Arc::new(vm),
            }),
            Err(e) => {
                vm.destroy(Duration::from_secs(5));
                Err(e)
            }
        }
    }

    fn discard(&self, _dir: &Path, state: &BackendState) {
        if let Ok(Stored::Running {
            pid,
            start,
            cgroups,
            ..
        }) = state.decode::<Stored>()
        {
            super::end(&Proc { pid, start }, Duration::from_secs(5));
            remove_cgroups(&cgroups);
        }
    }

    fn can_resume(&self, _dir: &Path, state: &BackendState) -> bool {
        matches!(state.decode::<Stored>(), Ok(Stored::Paused { qdir, .. }) if qdir.join(PAUSED_FILE).is_file())
    }

    fn reclaim_strays(&self, root: &Path, keep: &dyn Fn(i32) -> bool) -> usize {
        let prog = self
            .tools
            .qemu
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("qemu-system-x86_64")
            .to_string();
        let mut n = 0;
        for p in crate::vm::processes_under(root, &prog) {
            if !keep(p.pid) {
                super::end(&p, Duration::from_secs(5));
                n += 1;
            }
        }
        n
    }

    fn sweep_cgroups(&self, age: Duration) -> usize {
        shoal_jailer::cgroup::sweep(age)
    }
}

/// One QEMU VM.
#[derive(Debug)]
pub struct QemuVm {
    proc: Proc,
    qdir: PathBuf,
    cgroups: Vec<PathBuf>,
    spec: VmSpec,
    /// One QMP session at a time from this process (QEMU serves one).
    qmp: Mutex<()>,
    started: Instant,
    /// The agent's socket, bridged to the virtio-serial port, and the
    /// console log's size cap: threads of this process, started again by a
    /// reattach.
    bridge: Mutex<Option<(super::qemu_console_agent::Link, launch::ConsoleCap)>>,
}

impl QemuVm {
    /// Its QEMU directory.
    pub fn dir(&self) -> &Path {
        &self.qdir
    }

    /// Its cgroup's directories.
    pub fn cgroups(&self) -> &[PathBuf] {
        &self.cgroups
    }

    /// Serves [`AGENT_SOCK`], bridged to the agent's serial port (a new
    /// session there: the guest drops any streams of an earlier bridge).
    fn start_bridge(&self) -> Result<(), BackendError> {
        let sock = self.qdir.join(AGENT_SOCK);
        let b = super::qemu_console_agent::Link::start(&self.qdir, &sock, self.spec.serial_console)
            .map_err(|source| BackendError::Io {
                path: sock.clone(),
                source,
            })?;
        let cap = launch::ConsoleCap::start(&self.qdir)
            .map_err(|source| BackendError::Io { path: sock, source })?;
        *lock(&self.bridge) = Some((b, cap));
        Ok(())
    }

    /// Waits until a freshly booted console-shell guest's shell answers,
    /// and sets it up (`qemu_console::wait_shell`).
    fn wait_shell(&self, timeout: Duration) -> Result<(), BackendError> {
        let g = lock(&self.bridge);
        let c = g.as_ref().and_then(|(l, _)| l.console());
        let c = c.ok_or_else(|| BackendError::Reply("no serial console".into()))?;
        super::qemu_console::wait_shell(c, timeout, &|| self.proc.alive()).map_err(|e| {
            BackendError::NotReady {
                timeout,
                detail: format!("{e}; {}", launch::last_words(&self.qdir)),
            }
        })
    }

    /// Runs `f` on a QMP session of its own. A session per request (a
    /// connection and greeting: well under a millisecond) holds nothing
    /// between requests, so a restarted daemon, or anyone holding the
    /// state, can always reach QEMU, which serves one session at a time.
    fn with_qmp<T>(
        &self,
        f: impl FnOnce(&mut Qmp) -> Result<T, crate::qmp::QmpError>,
    ) -> Result<T, BackendError> {
        let _one = lock(&self.qmp);
        if !self.proc.alive() {
            return Err(BackendError::Exited {
                detail: launch::ended(&self.proc, &self.qdir),
            });
        }
        let mut q = launch::connect(&self.proc, &self.qdir, Duration::from_secs(5))?;
        f(&mut q).map_err(|e| launch::qmp_err(&self.proc, &self.qdir, e))
    }

    fn command(&self, cmd: &str) -> Result<(), BackendError> {
        self.with_qmp(|q| q.execute(cmd, None, QMP_TIMEOUT).map(drop))
    }

    /// Stops the vCPUs and writes the migration stream to `file` (through
    /// a temporary name, so a half-written stream is never taken for one).
    fn save(&self, file: &Path) -> Result<(), BackendError> {
        let tmp = file.with_extension("partial");
        let uri = format!("exec:cat > {}", launch::sh_quote(&tmp)?);
        self.with_qmp(|q| {
            q.execute("stop", None, QMP_TIMEOUT)?;
            q.execute("migrate", Some(json!({ "uri": uri })), QMP_TIMEOUT)?;
            launch::wait_migration(q, MIGRATE_TIMEOUT)
        })?;
        std::fs::rename(&tmp, file).map_err(|source| BackendError::Io {
            path: file.to_path_buf(),
            source,
        })
    }

    /// A PNG of its display (QMP `screendump`, QEMU ≥ 7.1).
    pub fn screen(&self) -> Result<Vec<u8>, BackendError> {
        let f = self.qdir.join("screen.png");
        let _ = std::fs::remove_file(&f);
        let name = f.display().to_string();
        self.with_qmp(|q| {
            q.execute(
                "screendump",
                Some(json!({ "filename": name, "format": "png" })),
                QMP_TIMEOUT,
            )
        })?;
        let io = |source| BackendError::Io {
            path: f.clone(),
            source,
        };
        let len = std::fs::metadata(&f).map_err(io)?.len();
        if len > MAX_SCREEN {
            let _ = std::fs::remove_file(&f);
            return Err(BackendError::Reply(format!("screendump of {len} bytes")));
        }
        let png = std::fs::read(&f).map_err(io);
        let _ = std::fs::remove_file(&f);
        png
    }

    /// Sends key and pointer events (checked first: see [`InputEvent`]).
    pub fn input(&self, events: &[InputEvent]) -> Result<(), BackendError> {
        let evs = super::qemu_input::to_qmp(events).map_err(BackendError::Reply)?;
        self.with_qmp(|q| {
            q.execute(
                "input-send-event",
                Some(json!({ "events": evs })),
                QMP_TIMEOUT,
            )
            .map(drop)
        })
    }
}

impl SandboxVm for QemuVm {
    fn kind(&self) -> Kind {
        Kind::Vm
    }

    fn pid(&self) -> i32 {
        self.proc.pid
    }

    fn state(&self) -> BackendState {
        BackendState::encode(&Stored::Running {
            pid: self.proc.pid,
            start: self.proc.start,
            qdir: self.qdir.clone(),
            cgroups: self.cgroups.clone(),
            spec: self.spec.clone(),
        })
    }

    fn agent(&self) -> Transport {
        match self.spec.serial_console {
            // Served here, over the console (qemu_console_agent.rs).
            true => Transport::Unix(self.qdir.join(AGENT_SOCK)),
            false => Transport::hybrid_vsock(self.qdir.join(AGENT_SOCK)),
        }
    }

    fn freeze(&self) -> Result<(), BackendError> {
        self.command("stop")
    }

    fn thaw(&self) -> Result<(), BackendError> {
        self.command("cont")
    }

    fn stats(&self) -> Result<VmStats, BackendError> {
        let r = self.with_qmp(|q| q.execute("query-status", None, QMP_TIMEOUT))?;
        let running = r.get("status").and_then(|s| s.as_str()) == Some("running");
        Ok(VmStats {
            frozen: !running,
            uptime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    }

    fn pause_to_disk(&self) -> Result<BackendState, BackendError> {
        self.save(&self.qdir.join(PAUSED_FILE))?;
        self.destroy(Duration::from_secs(5));
        Ok(BackendState::encode(&Stored::Paused {
            qdir: self.qdir.clone(),
            spec: self.spec.clone(),
        }))
    }

    fn snapshot(&self, dir: &Path) -> Result<(), BackendError> {
        let r = (|| {
            std::fs::create_dir_all(dir).map_err(|source| BackendError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
            self.save(&dir.join(VMSTATE_FILE))?;
            // Stopped and migrated: QEMU has flushed the overlay.
            copy(&self.qdir.join(DISK_FILE), &dir.join(DISK_FILE))?;
            if matches!(self.spec.firmware, Firmware::Uefi { .. }) {
                copy(&self.qdir.join("OVMF_VARS.fd"), &dir.join("OVMF_VARS.fd"))?;
            }
            write_spec(dir, &self.spec)
        })();
        if r.is_err() {
            let _ = std::fs::remove_dir_all(dir);
        }
        let cont = self.command("cont");
        r.and(cont)
    }

    fn kill(&self) {
        self.proc.kill();
    }

    fn destroy(&self, timeout: Duration) {
        lock(&self.bridge).take();
        super::end(&self.proc, timeout);
        self.proc.reap();
        remove_cgroups(&self.cgroups);
        for f in [
            launch::QMP_SOCK,
            launch::PORT_SOCK,
            super::qemu_console::CONSOLE_SOCK,
        ] {
            let _ = std::fs::remove_file(self.qdir.join(f));
        }
    }

    fn exit_fd(&self) -> std::io::Result<OwnedFd> {
        self.proc.pidfd()
    }

    fn alive(&self) -> bool {
        self.proc.alive()
    }

    fn reap(&self) -> Option<std::process::ExitStatus> {
        let st = self.proc.reap();
        // Gone: its cgroup goes now, not at the next sweep.
        if !self.proc.alive() {
            remove_cgroups(&self.cgroups);
        }
        st
    }

    fn last_words(&self) -> String {
        launch::last_words(&self.qdir)
    }

    fn screen(&self) -> Result<Vec<u8>, BackendError> {
        QemuVm::screen(self)
    }

    fn input(&self, events: &[InputEvent]) -> Result<(), BackendError> {
        QemuVm::input(self, events)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_vm_command_line_drops_pci_off_and_ends_in_the_init_separator() {
        let c = super::vm_cmdline("console=ttyS0 pci=off loglevel=6", "shoal.pvm");
        assert_eq!(
            c,
            "console=ttyS0 loglevel=6 root=/dev/vda rootfstype=erofs ro shoal.overlay=1 \
             init=/sbin/shoal-agent shoal.pvm --"
        );
    }
}
