//! How a `vm`-kind sandbox's QEMU is started: the machine (`q35`, KVM,
//! virtio over PCI), its disk (a per-sandbox qcow2 overlay over a shared
//! read-only base), its control socket (QMP), its console log, its cgroup,
//! and for a restore, `-incoming` from a migration stream file.

use super::BackendError;
use crate::qmp::{Qmp, QmpError};
use crate::vm::{self, Proc};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The disk and boot a template of this kind is built from.
#[derive(Debug, Clone)]
pub struct VmImage {
    /// Base image (never written).
    pub base: PathBuf,
    /// `raw` or `qcow2`.
    pub base_format: String,
    /// A kernel to boot directly, else the disk boots.
    pub kernel: Option<PathBuf>,
    /// Its command line.
    pub append: String,
    /// Firmware.
    pub firmware: Firmware,
    /// The console line that says the guest is up.
    pub ready_marker: Option<String>,
}

/// Files of a `vm` template or snapshot directory.
pub const SPEC_FILE: &str = "vm.json";
/// The migration stream (RAM and device state) in a template or snapshot.
pub const VMSTATE_FILE: &str = "vmstate";
/// The disk (a qcow2 overlay over the base image) in a template, snapshot
/// or sandbox directory.
pub const DISK_FILE: &str = "disk.qcow2";
/// The dedicated directory of a sandbox's QEMU, inside its sandbox dir.
pub const QEMU_DIR: &str = "qemu";
/// QEMU's console (first serial port) log.
pub const CONSOLE_LOG: &str = "console.log";
/// QEMU's own stderr.
pub const QEMU_LOG: &str = "qemu.log";
/// QMP control socket.
pub const QMP_SOCK: &str = "qmp.sock";
/// QEMU's chardev socket of the agent's virtio-serial port.
pub const PORT_SOCK: &str = "agent-port.sock";

/// Firmware a VM boots with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    /// SeaBIOS (QEMU's default).
    Bios,
    /// UEFI: OVMF code (read-only pflash); each VM gets a copy of `vars`.
    Uefi {
        /// `OVMF_CODE.fd`.
        code: PathBuf,
        /// `OVMF_VARS.fd` (template copied per VM).
        vars: PathBuf,
    },
}

/// What a `vm` sandbox is made of (stored as [`SPEC_FILE`] in templates
/// and snapshots).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSpec {
    /// vCPUs.
    pub vcpus: u8,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Base disk image, never written (the overlay's backing file).
    pub base: PathBuf,
    /// Its format: `raw` or `qcow2`.
    pub base_format: String,
    /// A kernel to boot directly (PVH ELF vmlinux), else the disk boots.
    pub kernel: Option<PathBuf>,
    /// Its command line.
    pub append: String,
    /// Firmware.
    pub firmware: Firmware,
    /// A console line that says the guest is up (Shoal's agent prints
    /// `SHOAL-INIT-READY`); `None`: running is enough.
    pub ready_marker: Option<String>,
    /// The guest runs no Shoal agent but a shell on its serial console,
    /// which exec and files go through (`qemu_console.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub serial_console: bool,
    /// It has a virtio-net device (a networked template and its
    /// sandboxes, each restored onto its own slot's TAP: `qemu_net.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub net: bool,
}

impl VmSpec {
    /// Checks what can be checked before QEMU runs, with clear errors.
    pub fn check(&self) -> Result<(), BackendError> {
        let bad = |m: String| Err(BackendError::Reply(m));
        if self.vcpus == 0 || self.vcpus > 64 {
            return bad(format!("vcpus {} not in 1..=64", self.vcpus));
        }
        if !(16..=1 << 20).contains(&self.memory_mib) {
            return bad(format!(
                "memory_mib {} not in 16..=1048576",
                self.memory_mib
            ));
        }
        if !matches!(self.base_format.as_str(), "raw" | "qcow2") {
            return bad(format!("disk format {:?}: raw or qcow2", self.base_format));
        }
        let file = |p: &Path, what: &str| -> Result<(), BackendError> {
            match std::fs::metadata(p) {
                Ok(m) if m.is_file() => Ok(()),
                Ok(_) => bad(format!("{what} {} is not a file", p.display())),
                Err(e) => bad(format!("{what} {}: {e}", p.display())),
            }
        };
        file(&self.base, "disk image")?;
        if let Some(k) = &self.kernel {
            file(k, "kernel")?;
        }
        if let Firmware::Uefi { code, vars } = &self.firmware {
            file(code, "OVMF code (UEFI firmware; Debian package ovmf)")?;
            file(vars, "OVMF vars (UEFI firmware; Debian package ovmf)")?;
        }
        Ok(())
    }
}

/// Host programs the backend runs.
#[derive(Debug, Clone)]
pub struct QemuTools {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// `qemu-img`.
    pub qemu_img: PathBuf,
}

impl Default for QemuTools {
    fn default() -> Self {
        QemuTools {
            qemu: "qemu-system-x86_64".into(),
            qemu_img: "qemu-img".into(),
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BackendError + '_ {
    move |source| BackendError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Runs `qemu-img` with `args`; its stderr is the error.
pub fn qemu_img(tools: &QemuTools, args: &[&std::ffi::OsStr]) -> Result<(), BackendError> {
    let out = Command::new(&tools.qemu_img)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(io(&tools.qemu_img))?;
    if out.status.success() {
        return Ok(());
    }
    Err(BackendError::Reply(format!(
        "qemu-img {}: {}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Makes `overlay`, a new qcow2 over `spec`'s base (which QEMU opens
/// read-only through it). A base that is not a valid image of its format
/// fails here, before any QEMU runs.
pub fn create_overlay(
    tools: &QemuTools,
    spec: &VmSpec,
    overlay: &Path,
) -> Result<(), BackendError> {
    let base = std::fs::canonicalize(&spec.base).map_err(io(&spec.base))?;
    if spec.base_format == "qcow2" {
        // qemu-img does not check a backing file's contents when it
        // creates an overlay: check it here so a bad image fails clearly.
        qemu_img(tools, &["check".as_ref(), "-q".as_ref(), base.as_os_str()])?;
    }
    let _ = std::fs::remove_file(overlay);
    qemu_img(
        tools,
        &[
            "create".as_ref(),
            "-q".as_ref(),
            "-f".as_ref(),
            "qcow2".as_ref(),
            "-b".as_ref(),
            base.as_os_str(),
            "-F".as_ref(),
            spec.base_format.as_ref(),
            overlay.as_os_str(),
        ],
    )
}

/// Quotes `p` for the `/bin/sh -c` QEMU runs an `exec:` migration URI in.
pub fn sh_quote(p: &Path) -> Result<String, BackendError> {
    let s = p
        .to_str()
        .ok_or_else(|| BackendError::Reply(format!("{} is not UTF-8", p.display())))?;
    Ok(format!("'{}'", s.replace('\'', r"'\''")))
}

/// The QEMU command line for `spec` in `qdir` (overlay, sockets and logs
/// there); `incoming`: restore from that migration stream (the VM stays
/// paused until `cont`); `nic`: its net device's TAP and MAC (given
/// exactly when `spec.net`).
pub fn command(
    tools: &QemuTools,
    spec: &VmSpec,
    qdir: &Path,
    incoming: Option<&Path>,
    nic: Option<&super::qemu_net::Nic>,
) -> Result<Command, BackendError> {
    if spec.net != nic.is_some() {
        return Err(BackendError::Reply(format!(
            "a vm {} a network device, and its QEMU was given {}",
            if spec.net { "has" } else { "has no" },
            if nic.is_some() { "one" } else { "none" }
        )));
    }
    let mut c = Command::new(&tools.qemu);
    c.args(["-M", "q35", "-accel", "kvm"])
        // PVM hosts refuse the arch-capabilities MSR (plain `host` aborts).
        .args(["-cpu", "host,-arch-capabilities"])
        .args(["-smp", &spec.vcpus.to_string()])
        .args(["-m", &spec.memory_mib.to_string()])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        // A display for screendump and input; no VNC or other port.
        .args(["-vga", "std"])
        .args(["-device", "qemu-xhci,id=usb"])
        .args(["-device", "usb-kbd,bus=usb.0"])
        .args(["-device", "usb-tablet,bus=usb.0"])
        // Appending, so that the log can be cut from outside (ConsoleCap).
        .arg("-chardev")
        .arg(match spec.serial_console {
            false => format!(
                "file,id=console,path={},append=on",
                qdir.join(CONSOLE_LOG).display()
            ),
            true => super::qemu_console::chardev(qdir, &qdir.join(CONSOLE_LOG)),
        })
        .args(["-serial", "chardev:console"])
        .arg("-qmp")
        .arg(format!(
            "unix:{},server=on,wait=off",
            qdir.join(QMP_SOCK).display()
        ))
        // Seccomp: no obsolete calls, no setuid, no scheduler changes.
        // Spawning stays allowed: `exec:` migration runs `cat`.
        .args([
            "-sandbox",
            "on,obsolete=deny,elevateprivileges=deny,resourcecontrol=deny",
        ])
        .arg("-drive")
        .arg(format!(
            "file={},if=none,id=disk0,format=qcow2,cache=writeback,discard=unmap",
            qdir.join(DISK_FILE).display()
        ))
        .args(["-device", "virtio-blk-pci,drive=disk0,bootindex=1"])
        // The agent's link: one virtio-serial port (no vhost-vsock here),
        // bridged on the host (qemu_bridge.rs).
        .arg("-chardev")
        .arg(format!(
            "socket,id=agent,path={},server=on,wait=off",
            qdir.join(PORT_SOCK).display()
        ))
        .args(["-device", "virtio-serial-pci,id=vser,max_ports=2"])
        .arg("-device")
        .arg(format!(
            "virtserialport,bus=vser.0,chardev=agent,name={}",
            agent_proto::serial_mux::PORT_NAME
        ))
        .args(["-no-reboot"]);
    if let Firmware::Uefi { code, .. } = &spec.firmware {
        c.arg("-drive").arg(format!(
            "if=pflash,format=raw,unit=0,readonly=on,file={}",
            code.display()
        ));
        c.arg("-drive").arg(format!(
            "if=pflash,format=raw,unit=1,file={}",
            qdir.join("OVMF_VARS.fd").display()
        ));
    }
    // After every other device: the same PCI addresses at the boot and
    // at each restore.
    if let Some(n) = nic {
        n.add_to(&mut c);
    }
    if let Some(k) = &spec.kernel {
        c.arg("-kernel").arg(k).arg("-append").arg(&spec.append);
    }
    if let Some(f) = incoming {
        c.arg("-S")
            .arg("-incoming")
            .arg(format!("exec:cat {}", sh_quote(f)?));
    }
    Ok(c)
}

/// A started QEMU: its process and its cgroup's directories.
#[derive(Debug)]
pub struct Started {
    /// The process.
    pub proc: Proc,
    /// Its cgroup's directories (empty without one).
    pub cgroups: Vec<PathBuf>,
}

/// Starts `cmd` in `qdir` (stderr to [`QEMU_LOG`]) in its own session, and
/// puts it in the cgroup `shoal/<id>` (memory: guest RAM plus 256 MiB of
/// QEMU overhead; tasks capped) when the host has one.
pub fn spawn(
    mut cmd: Command,
    qdir: &Path,
    id: &str,
    memory_mib: u32,
) -> Result<Started, BackendError> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(qdir.join(QEMU_LOG))
        .map_err(io(qdir))?;
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory; it puts
    // QEMU in its own session so the daemon's terminal signals skip it.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(io(&PathBuf::from(cmd.get_program())))?;
    let pid = vm::pid_of(&child);
    // Reaped by whoever watches its pidfd, as the microVM's.
    drop(child);
    let proc = Proc {
        pid,
        start: vm::pid_start(pid).unwrap_or(0),
    };
    let mut cgroups = vec![];
    if let Some(m) = crate::jail_prep::CgroupMaker::new() {
        let spec = shoal_jailer::CgroupSpec {
            memory_bytes: Some((u64::from(memory_mib) + 256) << 20),
            pids_max: Some(256),
            cpu_weight: None,
        };
        // The pid makes the name unique on this host (sandbox directory
        // names are unique only within one state directory).
        match m.make(&format!("qemu-{id}-{pid}"), &spec) {
            Ok(dirs) => {
                for d in &dirs {
                    let f = d.join("cgroup.procs");
                    if let Err(e) = std::fs::write(&f, pid.to_string()) {
                        proc.kill();
                        proc.wait_gone(Duration::from_secs(2));
                        crate::jail::remove_cgroups(&dirs);
                        return Err(io(&f)(e));
                    }
                }
                cgroups = dirs;
            }
            Err(e) => {
                proc.kill();
                proc.wait_gone(Duration::from_secs(2));
                return Err(BackendError::Jail(format!("QEMU cgroup: {e}")));
            }
        }
    }
    Ok(Started { proc, cgroups })
}

/// Most bytes the console log may hold: the guest writes it, and a hostile
/// one could fill the host's disk.
pub const CONSOLE_CAP: u64 = 16 << 20;

/// Empties `log` when it is over `cap` bytes (leaving a line that says so);
/// returns whether it did. QEMU appends to it, so its next write lands at
/// the new end.
pub fn cap_log(log: &Path, cap: u64) -> bool {
    let over = std::fs::metadata(log).is_ok_and(|m| m.len() > cap);
    if over {
        if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(log) {
            use std::io::Write;
            let _ = f.set_len(0);
            let _ = writeln!(f, "[shoal: console log cut: over {cap} bytes]");
        }
    }
    over
}

/// A thread that keeps a VM's console log under [`CONSOLE_CAP`] (checked
/// every second); it stops when dropped.
#[derive(Debug)]
pub struct ConsoleCap(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl ConsoleCap {
    /// Watches `qdir`'s console log.
    pub fn start(qdir: &Path) -> std::io::Result<ConsoleCap> {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, log) = (stop.clone(), qdir.join(CONSOLE_LOG));
        std::thread::Builder::new()
            .name("qemu-console-cap".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    cap_log(&log, CONSOLE_CAP);
                    std::thread::sleep(Duration::from_secs(1));
                }
            })?;
        Ok(ConsoleCap(stop))
    }
}

impl Drop for ConsoleCap {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How QEMU ended (if this process reaped it) and its last words.
pub fn ended(p: &Proc, qdir: &Path) -> String {
    use std::os::unix::process::ExitStatusExt;
    let how = match p.reap() {
        None => "QEMU ended".to_string(),
        Some(st) => match st.signal() {
            Some(libc::SIGSYS) => "QEMU was killed by its seccomp filter (-sandbox)".into(),
            Some(sig) => format!("QEMU was killed by signal {sig}"),
            None => format!("QEMU exited with status {}", st.code().unwrap_or(-1)),
        },
    };
    format!("{how}; {}", last_words(qdir))
}

/// QEMU's last messages: its stderr and the console's last lines.
pub fn last_words(qdir: &Path) -> String {
    let q = tail_lines(&qdir.join(QEMU_LOG), 5);
    let c = tail_lines(&qdir.join(CONSOLE_LOG), 5);
    format!("qemu: {q}; console: {c}")
}

/// Connects to QMP once QEMU has made its socket (it does so before
/// anything else), or says why not: QEMU exited, or time ran out.
pub fn connect(p: &Proc, qdir: &Path, timeout: Duration) -> Result<Qmp, BackendError> {
    let end = Instant::now() + timeout;
    let sock = qdir.join(QMP_SOCK);
    loop {
        if !p.alive() {
            return Err(BackendError::Exited {
                detail: ended(p, qdir),
            });
        }
        match Qmp::connect(&sock, Duration::from_secs(5)) {
            Ok(q) => return Ok(q),
            Err(e) if Instant::now() >= end => {
                return Err(BackendError::NotReady {
                    timeout,
                    detail: format!("{e}; {}", last_words(qdir)),
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A QMP error as a backend error (QEMU gone: its last words).
pub fn qmp_err(p: &Proc, qdir: &Path, e: QmpError) -> BackendError {
    if !p.alive() || matches!(e, QmpError::Closed(_)) {
        return BackendError::Exited {
            detail: format!("{e}; {}", last_words(qdir)),
        };
    }
    BackendError::Unusable {
        pid: p.pid,
        detail: e.to_string(),
    }
}

/// Waits until a migration QEMU runs (outgoing or incoming) completes.
pub fn wait_migration(q: &mut Qmp, timeout: Duration) -> Result<(), QmpError> {
    let end = Instant::now() + timeout;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let r = q.execute("query-migrate", None, left.max(Duration::from_millis(100)))?;
        match r.get("status").and_then(|s| s.as_str()).unwrap_or("") {
            "completed" => return Ok(()),
            "failed" | "cancelled" => {
                return Err(QmpError::Command {
                    command: "migrate".into(),
                    class: "failed".into(),
                    desc: r
                        .get("error-desc")
                        .and_then(|s| s.as_str())
                        .unwrap_or("migration failed")
                        .into(),
                })
            }
            _ if left.is_zero() => {
                return Err(QmpError::Timeout {
                    what: "migration".into(),
                    timeout,
                })
            }
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Waits until the console shows `marker` (the guest is up), QEMU ends or
/// `timeout` passes.
pub fn wait_marker(
    p: &Proc,
    qdir: &Path,
    marker: &str,
    timeout: Duration,
) -> Result<(), BackendError> {
    let end = Instant::now() + timeout;
    let log = qdir.join(CONSOLE_LOG);
    loop {
        // The console log grows with what the guest prints: read its tail
        // only (bounded), as the marker is the guest's latest line.
        if tail_has(&log, marker.as_bytes()) {
            return Ok(());
        }
        if !p.alive() {
            return Err(BackendError::Exited {
                detail: ended(p, qdir),
            });
        }
        if Instant::now() >= end {
            return Err(BackendError::NotReady {
                timeout,
                detail: last_words(qdir),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last `max` bytes of `path` (the console log is the guest's to
/// fill: never read whole).
fn tail(path: &Path, max: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return vec![];
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    buf
}

/// Whether the last 64 KiB of `path` contain `needle`.
fn tail_has(path: &Path, needle: &[u8]) -> bool {
    tail(path, 64 << 10)
        .windows(needle.len().max(1))
        .any(|w| w == needle)
}

/// The last `n` lines of `path` (from its last 4 KiB), joined with " | ".
fn tail_lines(path: &Path, n: usize) -> String {
    let t = tail(path, 4096);
    let text = String::from_utf8_lossy(&t);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_console_log_over_its_cap_is_cut() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("console.log");
        std::fs::write(&log, vec![b'x'; 1000]).unwrap();
        assert!(!cap_log(&log, 1000));
        std::fs::write(&log, vec![b'x'; 1001]).unwrap();
        assert!(cap_log(&log, 1000));
        let s = std::fs::read_to_string(&log).unwrap();
        assert!(
            s.starts_with("[shoal: console log cut") && s.len() < 100,
            "{s}"
        );
    }

    #[test]
    fn paths_are_quoted_for_the_migration_shell() {
        assert_eq!(sh_quote(Path::new("/a b/c")).unwrap(), "'/a b/c'");
        assert_eq!(sh_quote(Path::new("/a'b")).unwrap(), r"'/a'\''b'");
    }

    #[test]
    fn specs_are_checked_before_qemu_runs() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("base.img");
        std::fs::write(&base, [0u8; 4096]).unwrap();
        let spec = VmSpec {
            vcpus: 1,
            memory_mib: 128,
            base: base.clone(),
            base_format: "raw".into(),
            kernel: None,
            append: String::new(),
            firmware: Firmware::Bios,
            ready_marker: None,
            serial_console: false,
            net: false,
        };
        spec.check().unwrap();
        let e = VmSpec {
            base_format: "vmdk".into(),
            ..spec.clone()
        }
        .check()
        .unwrap_err();
        assert!(e.to_string().contains("raw or qcow2"), "{e}");
        let e = VmSpec {
            firmware: Firmware::Uefi {
                code: d.path().join("nope.fd"),
                vars: base.clone(),
            },
            ..spec.clone()
        }
        .check()
        .unwrap_err();
        assert!(e.to_string().contains("nope.fd"), "{e}");
        let e = VmSpec { vcpus: 0, ..spec }.check().unwrap_err();
        assert!(e.to_string().contains("vcpus"), "{e}");
    }
}
