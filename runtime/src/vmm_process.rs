//! The one place that turns "run a `shoal-vmm`" into a process: typed
//! options ([`VmmProcess`]) in, a [`Command`] (or a spawned child with its
//! readiness pipe) out. Every VMM Shoal starts (daemon sandboxes,
//! daemon-less sandboxes, template boots, benchmarks, `shoal restore`) is
//! built here, so the flags the VMM accepts are spelled once, and
//! confinement has one place to plug in: [`VmmProcess::command`] builds
//! every command through `confine` (umask 077 for every VMM; with a
//! [`Jail`], `shoal-jailer <spec> -- shoal-vmm <the same args>`: its own
//! uid, namespaces, files, cgroup; see [`crate::jail`]). Seccomp is the
//! VMM's own.

use crate::jail::Jail;
use crate::ready::{ReadyPipe, READY_FD};
use crate::vmm_balloon::BalloonOptions;
use crate::vmm_net::{NetDevice, NetLimits, NetTap};
pub use fds::{open_image, PassedFd, FIRST_PASSED_FD};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// Errors building or starting a VMM process.
#[derive(Debug, thiserror::Error)]
pub enum VmmProcessError {
    /// The options contradict what `shoal-vmm` accepts.
    #[error("invalid shoal-vmm options: {0}")]
    Invalid(&'static str),
    /// A file for the process's standard streams could not be opened.
    #[error("{path}: {source}")]
    Stdio {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The process could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The VMM binary.
        program: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// One virtio-blk disk of a booted VM (`/dev/vda`, `/dev/vdb`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// Backing file.
    pub path: PathBuf,
    /// Refuse guest writes.
    pub read_only: bool,
}

impl Disk {
    /// A writable disk.
    pub fn rw(path: impl Into<PathBuf>) -> Disk {
        Disk {
            path: path.into(),
            read_only: false,
        }
    }

    /// A read-only disk.
    pub fn ro(path: impl Into<PathBuf>) -> Disk {
        Disk {
            path: path.into(),
            read_only: true,
        }
    }

    /// The `--disk` value: `PATH` or `PATH,ro` (`PATH,rw` when the path
    /// itself has a comma, which the VMM would otherwise read as an option).
    fn arg(&self) -> OsString {
        let mut s = self.path.as_os_str().to_os_string();
        if self.read_only {
            s.push(",ro");
        } else if self.path.as_os_str().as_bytes().contains(&b',') {
            s.push(",rw");
        }
        s
    }
}

/// What the VM starts from.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// Boot a kernel.
    Boot {
        /// Uncompressed ELF kernel (vmlinux).
        kernel: PathBuf,
        /// Kernel command line (`None`: the VMM's default).
        cmdline: Option<String>,
        /// initrd / initramfs.
        initrd: Option<PathBuf>,
        /// virtio-blk disks, in order.
        disks: Vec<Disk>,
        /// virtio-pmem images, in order (`/dev/pmem0`, ...).
        pmem: Vec<PathBuf>,
    },
    /// Restore the snapshot in `dir`.
    Restore {
        /// Snapshot directory.
        dir: PathBuf,
        /// Files for the snapshot's virtio-blk disks, in order, in place of
        /// the saved paths (a writable disk: this VM's own copy).
        disks: Vec<PathBuf>,
    },
    /// An empty VM waiting on its control socket for a `restore` request.
    Prewarm {
        /// The VMM ends when the first restored guest stops (`--once`)
        /// instead of waiting for another `restore`.
        once: bool,
    },
}

/// The serial console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serial {
    /// The VMM's stdout.
    Stdout,
    /// Discarded.
    Null,
    /// A file (created or truncated by the VMM).
    File(PathBuf),
}

impl Serial {
    fn arg(&self) -> OsString {
        match self {
            Serial::Stdout => "stdout".into(),
            Serial::Null => "null".into(),
            Serial::File(p) => {
                let mut s = OsString::from("file:");
                s.push(p);
                s
            }
        }
    }
}

/// Where one of the process's standard streams goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Io {
    /// This process's own (the default, as with [`Command`]).
    #[default]
    Inherit,
    /// `/dev/null`.
    Null,
    /// A pipe to this process.
    Piped,
    /// A file, created if missing and appended to.
    Append(PathBuf),
    /// A file, created or truncated.
    Truncate(PathBuf),
}

impl Io {
    fn stdio(&self) -> Result<Stdio, VmmProcessError> {
        let open = |p: &Path, append: bool| {
            use std::os::unix::fs::OpenOptionsExt;
            // Logs and consoles are their owner's only (a new file).
            std::fs::OpenOptions::new()
                .mode(0o600)
                .create(true)
                .write(true)
                .append(append)
                .truncate(!append)
                .open(p)
                .map(Stdio::from)
                .map_err(|source| VmmProcessError::Stdio {
                    path: p.into(),
                    source,
                })
        };
        Ok(match self {
            Io::Inherit => Stdio::inherit(),
            Io::Null => Stdio::null(),
            Io::Piped => Stdio::piped(),
            Io::Append(p) => open(p, true)?,
            Io::Truncate(p) => open(p, false)?,
        })
    }
}

/// A started VMM process.
#[derive(Debug)]
pub struct Spawned {
    /// The process (its piped streams, if any, are on it).
    pub child: Child,
    /// The read side of its readiness pipe, if [`VmmProcess::ready_pipe`]
    /// asked for one.
    pub ready: Option<ReadyPipe>,
}

/// A `shoal-vmm` process to start: what it runs, its devices and sockets,
/// its standard streams and session.
#[derive(Debug, Clone, PartialEq)]
pub struct VmmProcess {
    program: PathBuf,
    start: Start,
    memory_mib: Option<u32>,
    vcpus: Option<u8>,
    vsock_uds: Option<PathBuf>,
    vsock_cid: Option<u32>,
    api_sock: Option<PathBuf>,
    serial: Option<Serial>,
    serial_limit: Option<u64>,
    timeout: Option<Duration>,
    timings: bool,
    ready_pipe: bool,
    own_session: bool,
    seccomp: bool,
    stdin: Io,
    stdout: Io,
    stderr: Io,
    /// Descriptors passed at fixed numbers ([`fds`]).
    passed: Vec<PassedFd>,
    /// (index in `Start::Boot`'s pmem, descriptor number) of pmem images
    /// passed as descriptors.
    pmem_fds: Vec<(usize, std::os::fd::RawFd)>,
    jail: Option<Jail>,
    net: Option<NetDevice>,
    balloon: Option<BalloonOptions>,
}

#[path = "vmm_process_fds.rs"]
mod fds;

impl VmmProcess {
    fn new(program: &Path, start: Start) -> VmmProcess {
        VmmProcess {
            program: program.into(),
            start,
            memory_mib: None,
            vcpus: None,
            vsock_uds: None,
            vsock_cid: None,
            api_sock: None,
            serial: None,
            serial_limit: None,
            timeout: None,
            timings: false,
            ready_pipe: false,
            own_session: false,
            seccomp: true,
            stdin: Io::Inherit,
            stdout: Io::Inherit,
            stderr: Io::Inherit,
            passed: vec![],
            pmem_fds: vec![],
            jail: None,
            net: None,
            balloon: None,
        }
    }

    /// Boots `kernel` with the VMM at `program`.
    pub fn boot(program: &Path, kernel: &Path) -> VmmProcess {
        Self::new(
            program,
            Start::Boot {
                kernel: kernel.into(),
                cmdline: None,
                initrd: None,
                disks: vec![],
                pmem: vec![],
            },
        )
    }

    /// Restores the snapshot in `dir`.
    pub fn restore(program: &Path, dir: &Path) -> VmmProcess {
        Self::new(
            program,
            Start::Restore {
                dir: dir.into(),
                disks: vec![],
            },
        )
    }

    /// A pre-warmed empty VM (needs [`Self::api_sock`]), kept for further
    /// restores when a guest stops.
    pub fn prewarm(program: &Path) -> VmmProcess {
        Self::new(program, Start::Prewarm { once: false })
    }

    /// A pre-warmed empty VM for one guest (`--prewarm --once`: it ends
    /// when the guest it is given stops, as a restored VMM does): a
    /// sandbox's VMM made ahead of its sandbox.
    pub fn prewarm_once(program: &Path) -> VmmProcess {
        Self::new(program, Start::Prewarm { once: true })
    }

    /// What it starts from.
    pub fn start(&self) -> &Start {
        &self.start
    }

    /// Its control socket, if it gets one.
    pub fn control_socket(&self) -> Option<&Path> {
        self.api_sock.as_deref()
    }

    /// The kernel command line (booting only; ignored otherwise).
    pub fn cmdline(mut self, c: impl Into<String>) -> Self {
        if let Start::Boot { cmdline, .. } = &mut self.start {
            *cmdline = Some(c.into());
        }
        self
    }

    /// An initrd (booting only; ignored otherwise).
    pub fn initrd(mut self, p: impl Into<PathBuf>) -> Self {
        if let Start::Boot { initrd, .. } = &mut self.start {
            *initrd = Some(p.into());
        }
        self
    }

    /// Adds a virtio-blk disk: booting, the next device; restoring, the
    /// file for the snapshot's next disk (only the path counts then).
    pub fn disk(mut self, d: Disk) -> Self {
        match &mut self.start {
            Start::Boot { disks, .. } => disks.push(d),
            Start::Restore { disks, .. } => disks.push(d.path),
            Start::Prewarm { .. } => {}
        }
        self
    }

    /// Adds a virtio-pmem image (booting only; ignored otherwise).
    pub fn pmem(mut self, p: impl Into<PathBuf>) -> Self {
        if let Start::Boot { pmem, .. } = &mut self.start {
            pmem.push(p.into());
        }
        self
    }

    /// Adds a virtio-pmem image the VMM inherits as an open descriptor
    /// (`--pmem fd:N=NAME`; `name` is what snapshots record), booting only.
    pub fn pmem_file(mut self, name: impl Into<PathBuf>, file: Arc<File>) -> Self {
        if let Start::Boot { pmem, .. } = &mut self.start {
            pmem.push(name.into());
            let idx = pmem.len() - 1;
            let target = self.pass_fd(file);
            self.pmem_fds.push((idx, target));
        }
        self
    }

    /// Passes `file` to the VMM; returns the descriptor number it has
    /// there.
    pub fn pass_fd(&mut self, file: Arc<File>) -> std::os::fd::RawFd {
        let target = self
            .passed
            .iter()
            .map(|p| p.target + 1)
            .max()
            .unwrap_or(FIRST_PASSED_FD);
        self.passed.push(PassedFd { target, file });
        target
    }

    /// The descriptors the VMM must keep open (beyond 0, 1 and 2): its
    /// readiness pipe and every passed descriptor. A jailer closes all
    /// others.
    pub fn kept_fds(&self) -> Vec<std::os::fd::RawFd> {
        let ready = self.ready_pipe.then_some(READY_FD);
        ready
            .into_iter()
            .chain(self.passed.iter().map(|p| p.target))
            .collect()
    }

    /// Gives it a virtio-net device on `tap` (passed as a descriptor):
    /// `--net` when booting, `--restore-net` (the TAP and MAC the
    /// snapshot's device gets) when restoring or prewarming.
    pub fn net_tap(mut self, tap: Arc<File>, mac: [u8; 6], limits: NetLimits) -> Self {
        let fd = self.pass_fd(tap);
        self.net = Some(NetDevice {
            tap: NetTap::Fd(fd),
            mac,
            limits,
        });
        self
    }

    /// Gives a booted VM a virtio-balloon device (`--balloon`; ignored
    /// when restoring or prewarming: a restored VM has its snapshot's).
    pub fn balloon(mut self, b: BalloonOptions) -> Self {
        self.balloon = Some(b);
        self
    }

    /// Runs the VMM in `jail` (see [`Self::confine`]).
    pub fn jail(mut self, jail: Jail) -> Self {
        self.jail = Some(jail);
        self
    }

    /// Whether it runs jailed.
    pub fn jailed(&self) -> bool {
        self.jail.is_some()
    }

    /// Guest memory (MiB).
    pub fn memory_mib(mut self, m: u32) -> Self {
        self.memory_mib = Some(m);
        self
    }

    /// vCPUs.
    pub fn vcpus(mut self, n: u8) -> Self {
        self.vcpus = Some(n);
        self
    }

    /// The vsock device's host socket (restoring: this VM's own, in place
    /// of the saved one).
    pub fn vsock_uds(mut self, p: impl Into<PathBuf>) -> Self {
        self.vsock_uds = Some(p.into());
        self
    }

    /// The vsock device's guest context id.
    pub fn vsock_cid(mut self, cid: u32) -> Self {
        self.vsock_cid = Some(cid);
        self
    }

    /// Serves the control protocol on this socket.
    pub fn api_sock(mut self, p: impl Into<PathBuf>) -> Self {
        self.api_sock = Some(p.into());
        self
    }

    /// Where the serial console goes (default: the VMM's stdout).
    pub fn serial(mut self, s: Serial) -> Self {
        self.serial = Some(s);
        self
    }

    /// Most bytes of console output kept.
    pub fn serial_limit(mut self, bytes: u64) -> Self {
        self.serial_limit = Some(bytes);
        self
    }

    /// Stops the guest after this long (the VMM exits with 124).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// Prints `SHOAL-TIMING` lines on stderr.
    pub fn timings(mut self, on: bool) -> Self {
        self.timings = on;
        self
    }

    /// Gives the VMM a readiness pipe (`--ready-fd`): [`Self::spawn`]
    /// returns its read side, which reports when the vCPUs run.
    pub fn ready_pipe(mut self, on: bool) -> Self {
        self.ready_pipe = on;
        self
    }

    /// Starts the VMM in its own session (`setsid`), so that it outlives
    /// its starter's process group and terminal.
    pub fn own_session(mut self, on: bool) -> Self {
        self.own_session = on;
        self
    }

    /// Runs every VMM thread under its seccomp filter (the default);
    /// `false` passes `--no-seccomp` (debugging, A/B benchmarks).
    pub fn seccomp(mut self, on: bool) -> Self {
        self.seccomp = on;
        self
    }

    /// Standard input.
    pub fn stdin(mut self, io: Io) -> Self {
        self.stdin = io;
        self
    }

    /// Standard output (the guest console, unless [`Self::serial`] says
    /// otherwise).
    pub fn stdout(mut self, io: Io) -> Self {
        self.stdout = io;
        self
    }

    /// Standard error (the VMM's own messages and timings).
    pub fn stderr(mut self, io: Io) -> Self {
        self.stderr = io;
        self
    }

    /// Checks the combinations `shoal-vmm` refuses (its `clap` rules).
    fn check(&self) -> Result<(), VmmProcessError> {
        if matches!(self.start, Start::Prewarm { .. }) && self.api_sock.is_none() {
            return Err(VmmProcessError::Invalid(
                "a pre-warmed VM needs a control socket",
            ));
        }
        Ok(())
    }

    /// The argument list (after the program), in a fixed order.
    pub fn args(&self) -> Result<Vec<OsString>, VmmProcessError> {
        self.check()?;
        let mut a: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, v: &OsStr| {
            a.push(name.into());
            a.push(v.into());
        };
        match &self.start {
            Start::Boot {
                kernel,
                cmdline,
                initrd,
                disks,
                pmem,
            } => {
                flag("--kernel", kernel.as_os_str());
                if let Some(c) = cmdline {
                    flag("--cmdline", c.as_ref());
                }
                if let Some(i) = initrd {
                    flag("--initrd", i.as_os_str());
                }
                for (i, p) in pmem.iter().enumerate() {
                    match self.pmem_fds.iter().find(|(idx, _)| *idx == i) {
                        Some((_, fd)) => {
                            let mut v = OsString::from(format!("fd:{fd}="));
                            v.push(p);
                            flag("--pmem", &v);
                        }
                        None => flag("--pmem", p.as_os_str()),
                    }
                }
                for d in disks {
                    flag("--disk", &d.arg());
                }
            }
            Start::Restore { dir, disks } => {
                flag("--restore", dir.as_os_str());
                for d in disks {
                    flag("--restore-disk", d.as_os_str());
                }
            }
            Start::Prewarm { .. } => {}
        }
        if let Some(n) = &self.net {
            let name = match self.start {
                Start::Boot { .. } => "--net",
                Start::Restore { .. } | Start::Prewarm { .. } => "--restore-net",
            };
            flag(name, n.arg().as_ref());
        }
        if let (Some(b), Start::Boot { .. }) = (&self.balloon, &self.start) {
            flag("--balloon", b.arg().as_ref());
        }
        if let Some(m) = self.memory_mib {
            flag("--memory", m.to_string().as_ref());
        }
        if let Some(n) = self.vcpus {
            flag("--vcpus", n.to_string().as_ref());
        }
        if let Some(s) = &self.api_sock {
            flag("--api-sock", s.as_os_str());
        }
        if let Some(v) = &self.vsock_uds {
            flag("--vsock-uds", v.as_os_str());
        }
        if let Some(c) = self.vsock_cid {
            flag("--vsock-cid", c.to_string().as_ref());
        }
        if let Some(s) = &self.serial {
            flag("--serial", &s.arg());
        }
        if let Some(l) = self.serial_limit {
            flag("--serial-limit", l.to_string().as_ref());
        }
        if let Some(t) = self.timeout {
            // Seconds as a decimal number ("900", "0.5").
            flag("--timeout", t.as_secs_f64().to_string().as_ref());
        }
        if self.ready_pipe {
            flag("--ready-fd", READY_FD.to_string().as_ref());
        }
        if let Start::Prewarm { once } = self.start {
            a.push("--prewarm".into());
            if once {
                a.push("--once".into());
            }
        }
        if self.timings {
            a.push("--timings".into());
        }
        if !self.seccomp {
            a.push("--no-seccomp".into());
        }
        Ok(a)
    }

    /// The command that starts this VMM, confined as far as Shoal confines
    /// VMMs (see `confine`). The readiness pipe and the own session are set
    /// up by [`Self::spawn`], not here.
    pub fn command(&self) -> Result<Command, VmmProcessError> {
        self.command_with(vec![], None)
    }

    /// [`Self::command`], also passing `extra` descriptors, and running
    /// `also` in the child before exec.
    fn command_with(
        &self,
        extra: Vec<PassedFd>,
        also: Option<fn() -> std::io::Result<()>>,
    ) -> Result<Command, VmmProcessError> {
        let mut passed: Vec<PassedFd> = self.passed.iter().cloned().chain(extra).collect();
        let mut c = self.confine(self.args()?, &mut passed)?;
        c.stdin(self.stdin.stdio()?)
            .stdout(self.stdout.stdio()?)
            .stderr(self.stderr.stdio()?);
        if !passed.is_empty() || also.is_some() {
            fds::install(&mut c, passed, also);
        }
        Ok(c)
    }

    /// The program actually started: the jailer when jailed.
    fn started_program(&self) -> &Path {
        self.jail.as_ref().map_or(&self.program, |j| &j.jailer)
    }

    /// **The confinement hook.** Every VMM command is built here.
    ///
    /// Every VMM gets umask 077, so the files and sockets it makes (control
    /// and vsock sockets, snapshot memory and state) are its owner's only,
    /// whatever its starter's umask. With a [`Jail`] (the daemon's VMMs
    /// when it runs as root) the command becomes `shoal-jailer <spec> --
    /// shoal-vmm <args>` (its own uid/gid, namespaces, a root holding only
    /// the files it needs at their own paths, no capabilities,
    /// `no_new_privs`, rlimits, only the passed descriptors above 2, a
    /// clean environment, a cgroup: `shoal_jailer`); the VMM's arguments are
    /// the same either way. The jail's uid lease and its network namespace
    /// made ahead join `passed` (after the others), for the jailer's
    /// supervisor alone to hold (the jailer joins the namespace by it). Seccomp filters
    /// are installed by the VMM itself.
    fn confine(
        &self,
        args: Vec<OsString>,
        passed: &mut Vec<PassedFd>,
    ) -> Result<Command, VmmProcessError> {
        use std::os::unix::process::CommandExt;
        let mut c = match &self.jail {
            None => {
                let mut c = Command::new(&self.program);
                c.args(args);
                c
            }
            Some(j) => {
                let mut spec = j.spec.clone();
                spec.exec.clone_from(&self.program);
                spec.args = args;
                let mut keep = self.kept_fds();
                for p in passed.iter() {
                    if !keep.contains(&p.target) {
                        keep.push(p.target);
                    }
                }
                spec.keep_fds = keep;
                spec.hold_fds.clear();
                let mut held: Vec<(std::fs::File, bool)> = vec![];
                if let Some(l) = &j.lease {
                    let file = l.file().map_err(|source| VmmProcessError::Spawn {
                        program: j.jailer.clone(),
                        source,
                    })?;
                    held.push((file, false));
                }
                if let Some(n) = &j.netns {
                    let file = n.try_clone().map_err(|source| VmmProcessError::Spawn {
                        program: j.jailer.clone(),
                        source,
                    })?;
                    held.push((file, true));
                }
                for (file, is_netns) in held {
                    let target = passed
                        .iter()
                        .map(|p| p.target + 1)
                        .max()
                        .unwrap_or(FIRST_PASSED_FD)
                        .max(FIRST_PASSED_FD);
                    passed.push(PassedFd {
                        target,
                        file: Arc::new(file),
                    });
                    spec.hold_fds.push(target);
                    if is_netns {
                        spec.netns = Some(format!("/proc/self/fd/{target}").into());
                    }
                }
                let mut c = Command::new(&j.jailer);
                c.args(spec.to_args());
                c
            }
        };
        // SAFETY: between fork and exec the closure calls only umask
        // (async-signal-safe, cannot fail).
        unsafe {
            c.pre_exec(|| {
                libc::umask(0o077);
                Ok(())
            })
        };
        Ok(c)
    }

    /// Starts the VMM: in its own session if asked, with its readiness pipe
    /// if asked.
    pub fn spawn(&self) -> Result<Spawned, VmmProcessError> {
        let spawn_err = |source| VmmProcessError::Spawn {
            program: self.started_program().to_path_buf(),
            source,
        };
        // setsid in the child between fork and exec (async-signal-safe).
        fn setsid() -> std::io::Result<()> {
            // SAFETY: setsid takes no arguments and touches no memory
            // shared with the parent.
            unsafe { libc::setsid() };
            Ok(())
        }
        let also = self
            .own_session
            .then_some(setsid as fn() -> std::io::Result<()>);
        if !self.passed.is_empty() || self.jail.is_some() {
            // Passed descriptors (a jail's uid lease among them) and the
            // readiness pipe are placed together
            // (one step that no numbering can trip up).
            let mut extra = vec![];
            let mut ready = None;
            if self.ready_pipe {
                let (read, write) = fds::ready_pipe().map_err(spawn_err)?;
                extra.push(PassedFd {
                    target: READY_FD,
                    file: Arc::new(write),
                });
                ready = Some(ReadyPipe::from_read(read));
            }
            let mut cmd = self.command_with(extra, also)?;
            let child = cmd.spawn().map_err(spawn_err)?;
            // Our write end goes with the command: EOF then comes when the
            // child closes its own.
            drop(cmd);
            return Ok(Spawned { child, ready });
        }
        let mut cmd = self.command()?;
        if self.ready_pipe {
            let (child, ready) = ReadyPipe::spawn(&mut cmd, also).map_err(spawn_err)?;
            return Ok(Spawned {
                child,
                ready: Some(ready),
            });
        }
        if let Some(f) = also {
            use std::os::unix::process::CommandExt;
            // SAFETY: `f` is setsid above, async-signal-safe.
            unsafe { cmd.pre_exec(f) };
        }
        let child = cmd.spawn().map_err(spawn_err)?;
        Ok(Spawned { child, ready: None })
    }
}

#[cfg(test)]
#[path = "vmm_process_tests.rs"]
mod tests;
