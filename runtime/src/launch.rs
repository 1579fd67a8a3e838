//! Launching one VM process (`shoal-vmm`, or QEMU as the peer) that boots
//! a kernel with a read-only root image (virtio-pmem with DAX by default,
//! or virtio-blk), and timing what it prints.

use crate::vmm_process::{Disk, VmmProcess, VmmProcessError};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The line our init prints once its mounts are done.
pub const INIT_MARKER: &str = "SHOAL-INIT-READY";
/// Prefix of the line with the guest command's exit status.
pub const EXIT_PREFIX: &str = "SHOAL-EXIT ";

/// Errors launching or watching a VM process.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The monitor process could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Waiting for it failed.
    #[error("waiting for the VM process failed: {0}")]
    Wait(std::io::Error),
    /// It did not finish in time (it was killed).
    #[error("VM did not finish within {0:?}; killed")]
    Timeout(Duration),
    /// The VMM's command line.
    #[error(transparent)]
    Vmm(#[from] VmmProcessError),
}

/// Which monitor runs the VM.
#[derive(Debug, Clone)]
pub enum Monitor {
    /// Our VMM binary.
    Shoal(PathBuf),
    /// `qemu-system-x86_64 -M microvm` with `kernel_args` for the CPU
    /// profile (QEMU does not hide CPU features itself).
    QemuMicrovm {
        /// Extra kernel words (e.g. `shoal.pvm clearcpuid=...`).
        kernel_args: String,
    },
}

impl Monitor {
    /// Name used in benchmark rows.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Shoal(_) => "shoal",
            Self::QemuMicrovm { .. } => "qemu-microvm",
        }
    }
}

/// How the read-only root image reaches the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RootKind {
    /// virtio-pmem `/dev/pmem0`, mounted erofs with DAX: every VM on the
    /// image shares the host's page cache of it, the guest keeps no page
    /// cache copy, and the agent runs commands in a writable overlay
    /// (tmpfs upper layer). Needs an image padded to 2 MiB
    /// (`scripts/build-images.sh` and `image::build_image` make them).
    #[default]
    Pmem,
    /// virtio-blk `/dev/vda`, read-only; the root stays read-only.
    Blk,
    /// virtio-blk `/dev/vda` holding a writable ext4 file system, mounted
    /// read-write: the guest writes to the image file itself, so each VM
    /// needs its own copy (the pmem benchmark compares with it).
    BlkExt4Rw,
}

impl RootKind {
    /// Name used in benchmark rows and cache keys.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pmem => "pmem",
            Self::Blk => "blk",
            Self::BlkExt4Rw => "blk-ext4-rw",
        }
    }

    /// Kernel command-line words that mount the root this way.
    pub fn kernel_args(self) -> &'static str {
        match self {
            Self::Pmem => "root=/dev/pmem0 rootfstype=erofs ro rootflags=dax shoal.overlay=1",
            Self::Blk => "root=/dev/vda rootfstype=erofs ro",
            Self::BlkExt4Rw => "root=/dev/vda rootfstype=ext4 rw",
        }
    }
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct BootSpec {
    /// vmlinux.
    pub kernel: PathBuf,
    /// Read-only erofs root image (how the guest gets it: `root_kind`).
    pub root: PathBuf,
    /// virtio-pmem (default) or virtio-blk root. The QEMU peer always uses
    /// virtio-blk.
    pub root_kind: RootKind,
    /// Base kernel command line.
    pub cmdline: String,
    /// The init's arguments (the command to run), if any.
    pub init_args: Vec<String>,
    /// Guest memory.
    pub memory_mib: u32,
    /// vCPUs.
    pub vcpus: u8,
    /// vsock host socket (our VMM only).
    pub vsock_uds: Option<PathBuf>,
    /// More read-only layers over a pmem root (e.g. a toolkit over the
    /// base): `/dev/pmem1`, `/dev/pmem2`, ... in this order, each over the
    /// one before in the guest's overlay. Images like `root` (DAX-ready,
    /// padded to 2 MiB). Pmem roots on our VMM only; ignored otherwise.
    pub extra_pmem: Vec<PathBuf>,
    /// A writable virtio-blk disk holding a pre-formatted ext4 file system
    /// for the overlay's upper layer (large writes), instead of the default
    /// size-limited tmpfs: `/dev/vda`, `shoal.upper=/dev/vda`. Pmem roots on
    /// our VMM only; ignored otherwise. Never share one between running VMs.
    pub upper_disk: Option<PathBuf>,
    /// Size limit of the overlay's tmpfs upper layer (MiB), always written
    /// out as `shoal.upper_size=NNm` on a pmem root (also with a scratch
    /// disk, for the guest's fallback to tmpfs); `None`: half of
    /// `memory_mib` ([`shoal_images::layers::default_upper_size_mib`]).
    pub upper_size_mib: Option<u32>,
}

impl BootSpec {
    /// How `monitor` gets the root: as asked for our VMM, virtio-blk for
    /// QEMU (which has no virtio-pmem on microvm).
    pub fn root_kind_for(&self, monitor: &Monitor) -> RootKind {
        match (monitor, self.root_kind) {
            (Monitor::Shoal(_), k) | (Monitor::QemuMicrovm { .. }, k @ RootKind::BlkExt4Rw) => k,
            (Monitor::QemuMicrovm { .. }, _) => RootKind::Blk,
        }
    }

    /// The kernel command line our VMM boots this spec with.
    pub fn kernel_cmdline(&self) -> String {
        self.full_cmdline(self.root_kind)
    }

    fn full_cmdline(&self, root: RootKind) -> String {
        let mut c = format!(
            "{} {} init=/sbin/shoal-agent",
            self.cmdline,
            root.kernel_args()
        );
        if root == RootKind::Pmem {
            let size = self
                .upper_size_mib
                .unwrap_or_else(|| shoal_images::layers::default_upper_size_mib(self.memory_mib));
            c.push_str(&format!(" shoal.upper_size={size}m"));
            if self.upper_disk.is_some() {
                // The only virtio-blk disk of a pmem-rooted VM.
                c.push_str(" shoal.upper=/dev/vda");
            }
        }
        // A bare "--" with no command makes the agent serve requests;
        // it also keeps unknown kernel words from reaching init as a command.
        c.push_str(" --");
        if !self.init_args.is_empty() {
            c.push(' ');
            c.push_str(&self.init_args.join(" "));
        }
        c
    }

    /// Our VMM booting this spec (with `--timings`; the caller adds its
    /// sockets and standard streams). Pmem images are opened here and
    /// passed as descriptors (`--pmem fd:N=PATH`), so the VMM needs no
    /// access to their paths; one that is not a regular file is left to
    /// the VMM to open and report.
    pub fn vmm_process(&self, vmm: &Path) -> VmmProcess {
        let mut p = VmmProcess::boot(vmm, &self.kernel);
        match self.root_kind {
            RootKind::Pmem => {
                for img in std::iter::once(&self.root).chain(&self.extra_pmem) {
                    p = match crate::vmm_process::open_image(img) {
                        Some(f) => p.pmem_file(img, std::sync::Arc::new(f)),
                        None => p.pmem(img),
                    };
                }
                if let Some(d) = &self.upper_disk {
                    p = p.disk(Disk::rw(d));
                }
            }
            RootKind::Blk => p = p.disk(Disk::ro(&self.root)),
            RootKind::BlkExt4Rw => p = p.disk(Disk::rw(&self.root)),
        }
        p = p
            .memory_mib(self.memory_mib)
            .vcpus(self.vcpus)
            .cmdline(self.full_cmdline(self.root_kind))
            .timings(true);
        if let Some(v) = &self.vsock_uds {
            p = p.vsock_uds(v);
        }
        p
    }

    /// The monitor command line that boots this spec.
    pub fn command(&self, monitor: &Monitor) -> Result<Command, LaunchError> {
        match monitor {
            Monitor::Shoal(vmm) => Ok(self.vmm_process(vmm).command()?),
            Monitor::QemuMicrovm { kernel_args } => {
                let mut c = Command::new("qemu-system-x86_64");
                // QEMU appends its own virtio_mmio.device= words after the
                // init's " -- " unless told not to, so name the one device
                // ourselves (the transport QEMU attaches the first device
                // to); it also ignores reboot=k on microvm, so reboot by
                // triple fault, which -no-reboot turns into an exit.
                let extra = format!("{kernel_args} virtio_mmio.device=512@0xfeb00e00:12 reboot=t");
                let root = self.root_kind_for(monitor);
                let cmdline =
                    vmm_api::cmdline::insert_kernel_args(&self.full_cmdline(root), extra.trim());
                let readonly = if root == RootKind::Blk {
                    ",readonly=on"
                } else {
                    ""
                };
                c.args([
                    "-M",
                    "microvm,acpi=off,auto-kernel-cmdline=off",
                    "-enable-kvm",
                ])
                // This host's KVM refuses the arch-capabilities MSR.
                .args(["-cpu", "host,-arch-capabilities"])
                .args(["-smp", &self.vcpus.to_string()])
                .args(["-m", &self.memory_mib.to_string()])
                .args(["-nodefaults", "-no-user-config", "-display", "none"])
                .args(["-serial", "stdio", "-no-reboot"])
                .arg("-kernel")
                .arg(&self.kernel)
                .arg("-drive")
                .arg(format!(
                    "file={},if=none,id=root,format=raw{readonly}",
                    self.root.display()
                ))
                .args(["-device", "virtio-blk-device,drive=root"])
                .arg("-append")
                .arg(cmdline);
                Ok(c)
            }
        }
    }
}

/// Timings (ms since the process was spawned) and results of one boot.
#[derive(Debug, Clone, Default)]
pub struct BootRun {
    /// First guest instruction (our VMM reports it; QEMU cannot).
    pub first_instruction_ms: Option<f64>,
    /// First console line.
    pub first_line_ms: Option<f64>,
    /// Init marker line.
    pub marker_ms: Option<f64>,
    /// Process exit.
    pub exit_ms: f64,
    /// The guest command's exit code (from `SHOAL-EXIT`).
    pub guest_exit: Option<i32>,
    /// The monitor's own memory at the marker: RSS minus guest RAM (KiB).
    pub own_rss_kib: Option<u64>,
    /// The monitor's exit status.
    pub status: Option<ExitStatus>,
}

/// CLOCK_MONOTONIC in nanoseconds (the clock `shoal-vmm --timings` uses).
pub fn monotonic_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // The monotonic clock is never negative.
    u128::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u128::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Resident KiB of `pid` that is the monitor's own: its RSS less guest
/// RAM and less the files mapped into the guest (`guest_files`: pmem
/// images, whose resident pages are what a virtio-blk guest keeps in its
/// page cache inside guest RAM).
pub fn own_rss_kib(pid: u32, guest_kib: u64, guest_files: &[PathBuf]) -> Option<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    Some(own_rss_from_smaps(&smaps, guest_kib, guest_files))
}

/// One mapping of an smaps listing.
#[derive(Debug, Default)]
struct Vma {
    start: u64,
    end: u64,
    path: String,
    rss_kib: u64,
}

fn parse_smaps(smaps: &str) -> Vec<Vma> {
    let mut vmas: Vec<Vma> = Vec::new();
    for l in smaps.lines() {
        let mut w = l.split_whitespace();
        let Some(first) = w.next() else { continue };
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                // "start-end perms offset dev inode [path]"
                let path = w.nth(4).unwrap_or("").to_string();
                vmas.push(Vma {
                    start,
                    end,
                    path,
                    rss_kib: 0,
                });
                continue;
            }
        }
        if first == "Rss:" {
            if let (Some(v), Some(rss)) = (vmas.last_mut(), w.next().and_then(|x| x.parse().ok())) {
                v.rss_kib = rss;
            }
        }
    }
    vmas
}

/// Guest RAM is one host mapping of exactly `guest_kib`, which our VMM
/// splits into adjacent pieces where it maps the kernel file over it: the
/// first run of adjacent mappings whose sizes add up to `guest_kib` is
/// taken as guest RAM (else the largest single mapping of at least that
/// size, as a monitor with padded RAM has).
fn own_rss_from_smaps(smaps: &str, guest_kib: u64, guest_files: &[PathBuf]) -> u64 {
    let vmas = parse_smaps(smaps);
    let total: u64 = vmas.iter().map(|v| v.rss_kib).sum();
    let size = |v: &Vma| (v.end - v.start) / 1024;
    let mut guest: Option<(usize, usize)> = None;
    'outer: for i in 0..vmas.len() {
        let mut sum = 0;
        for j in i..vmas.len() {
            if j > i && vmas[j].start != vmas[j - 1].end {
                break;
            }
            sum += size(&vmas[j]);
            if sum == guest_kib {
                guest = Some((i, j));
                break 'outer;
            }
            if sum > guest_kib {
                break;
            }
        }
    }
    let guest_rss = match guest {
        Some((i, j)) => vmas[i..=j].iter().map(|v| v.rss_kib).sum(),
        None => vmas
            .iter()
            .filter(|v| size(v) >= guest_kib)
            .map(|v| v.rss_kib)
            .max()
            .unwrap_or(0),
    };
    let files: u64 = vmas
        .iter()
        .enumerate()
        .filter(|(k, v)| {
            !guest.is_some_and(|(i, j)| (i..=j).contains(k))
                && guest_files
                    .iter()
                    .any(|f| Path::new(&v.path) == f.as_path())
        })
        .map(|(_, v)| v.rss_kib)
        .sum();
    total.saturating_sub(guest_rss + files)
}

/// Boots `spec` under `monitor`, passing each console line to `on_line`.
pub fn boot(
    spec: &BootSpec,
    monitor: &Monitor,
    timeout: Duration,
    on_line: &mut dyn FnMut(&str),
) -> Result<BootRun, LaunchError> {
    let mut cmd = spec.command(monitor)?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let t0_ns = monotonic_ns();
    let mut child: Child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        program: format!("{:?}", cmd.get_program()),
        source,
    })?;
    let pid = child.id();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    // A watchdog kills the VM if it overstays; the reader then sees EOF.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let timed_out = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let (done, timed_out) = (done.clone(), timed_out.clone());
        std::thread::spawn(move || {
            let end = Instant::now() + timeout;
            while Instant::now() < end {
                if done.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            timed_out.store(true, std::sync::atomic::Ordering::Release);
            if let Ok(pid) = i32::try_from(pid) {
                // SAFETY: kill(2) with a pid we spawned and have not reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        })
    };
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    });
    let ms = |t: Instant| t.duration_since(t0).as_secs_f64() * 1e3;
    let mut run = BootRun::default();
    let guest_kib = u64::from(spec.memory_mib) * 1024;
    let guest_files: Vec<PathBuf> = std::iter::once(&spec.root)
        .chain(&spec.extra_pmem)
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    if let Some(out) = stdout {
        // Lines cut to a fixed length: the guest decides what it prints.
        for line in crate::console_lines::ConsoleLines::new(out) {
            let now = Instant::now();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches('\r');
            run.first_line_ms.get_or_insert(ms(now));
            if line.contains(INIT_MARKER) && run.marker_ms.is_none() {
                run.marker_ms = Some(ms(now));
                run.own_rss_kib = own_rss_kib(pid, guest_kib, &guest_files);
            }
            if let Some(code) = line.trim().strip_prefix(EXIT_PREFIX) {
                run.guest_exit = code.trim().parse().ok();
            }
            on_line(line);
        }
    }
    let status = child.wait().map_err(LaunchError::Wait)?;
    run.exit_ms = ms(Instant::now());
    done.store(true, std::sync::atomic::Ordering::Release);
    let _ = watchdog.join();
    let err = err_reader.join().unwrap_or_default();
    if timed_out.load(std::sync::atomic::Ordering::Acquire) {
        return Err(LaunchError::Timeout(timeout));
    }
    run.status = Some(status);
    for l in err.lines() {
        if let Some(rest) = l.strip_prefix("SHOAL-TIMING ") {
            let first = rest
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix("first_run_ns="))
                .and_then(|v| v.parse::<u128>().ok());
            run.first_instruction_ms = first.map(|f| f.saturating_sub(t0_ns) as f64 / 1e6);
        } else if !l.trim().is_empty() {
            on_line(l);
        }
    }
    Ok(run)
}

#[cfg(test)]
mod tests {

    fn vma(start: u64, end: u64, path: &str, rss: u64) -> String {
        format!(
            "{start:x}-{end:x} rw-p 00000000 00:00 0 {path}\nSize: {} kB\nRss: {rss} kB\nPss: {rss} kB\n",
            (end - start) / 1024
        )
    }

    #[test]
    fn own_rss_leaves_out_split_guest_ram_and_pmem_images() {
        let mib = 1u64 << 20;
        let g = 0x7f00_0000_0000u64;
        // Guest RAM (128 MiB) split by a kernel file mapping, the pmem
        // image right below it, a heap and a library.
        let smaps = [
            vma(0x1000, 0x1000 + mib, "[heap]", 700),
            vma(g - 8 * mib, g, "/img/tiny.erofs", 2048),
            vma(g, g + 16 * mib, "", 9000),
            vma(g + 16 * mib, g + 32 * mib, "/k/vmlinux", 15000),
            vma(g + 32 * mib, g + 128 * mib, "", 20000),
            vma(g + 200 * mib, g + 201 * mib, "/lib/libc.so.6", 300),
        ]
        .concat();
        let own = own_rss_from_smaps(&smaps, 128 * 1024, &[PathBuf::from("/img/tiny.erofs")]);
        assert_eq!(own, 700 + 300);
        // Without the image named, its pages count as the monitor's.
        assert_eq!(
            own_rss_from_smaps(&smaps, 128 * 1024, &[]),
            700 + 300 + 2048
        );
        // A monitor with one padded RAM mapping (QEMU).
        let q = [
            vma(0x1000, 0x1000 + mib, "[heap]", 500),
            vma(g, g + 130 * mib, "", 50000),
        ]
        .concat();
        assert_eq!(own_rss_from_smaps(&q, 128 * 1024, &[]), 500);
    }
    use super::*;

    fn spec() -> BootSpec {
        BootSpec {
            kernel: "/k/vmlinux".into(),
            root: "/i/base.img".into(),
            root_kind: RootKind::Pmem,
            cmdline: "console=ttyS0".into(),
            init_args: vec![],
            memory_mib: 256,
            vcpus: 1,
            vsock_uds: None,
            extra_pmem: vec![],
            upper_disk: None,
            upper_size_mib: None,
        }
    }

    fn args(c: &Command) -> Vec<String> {
        c.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn cmdline_of(s: &BootSpec) -> String {
        let a = args(&s.command(&Monitor::Shoal("/vmm".into())).unwrap());
        let i = a.iter().position(|x| x == "--cmdline").unwrap();
        a[i + 1].clone()
    }

    #[test]
    fn pmem_root_always_names_the_tmpfs_upper_size() {
        let s = spec();
        assert_eq!(
            cmdline_of(&s),
            "console=ttyS0 root=/dev/pmem0 rootfstype=erofs ro rootflags=dax shoal.overlay=1 \
             init=/sbin/shoal-agent shoal.upper_size=128m --"
        );
        let s = BootSpec {
            upper_size_mib: Some(8),
            init_args: vec!["/bin/sh".into(), "-c".into(), "true".into()],
            ..spec()
        };
        let c = cmdline_of(&s);
        assert!(
            c.ends_with(" shoal.upper_size=8m -- /bin/sh -c true"),
            "{c}"
        );
        assert!(!c.contains("shoal.upper="), "{c}");
    }

    #[test]
    fn layers_and_scratch_disk_become_devices_and_words() {
        let s = BootSpec {
            extra_pmem: vec!["/l/kit.img".into(), "/l/more.img".into()],
            upper_disk: Some("/t/scratch.ext4".into()),
            ..spec()
        };
        let a = args(&s.command(&Monitor::Shoal("/vmm".into())).unwrap());
        let pmem: Vec<&str> = a
            .windows(2)
            .filter(|w| w[0] == "--pmem")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(pmem, ["/i/base.img", "/l/kit.img", "/l/more.img"]);
        let disks: Vec<&str> = a
            .windows(2)
            .filter(|w| w[0] == "--disk")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(disks, ["/t/scratch.ext4"]);
        let c = cmdline_of(&s);
        assert!(
            c.ends_with(" shoal.upper_size=128m shoal.upper=/dev/vda --"),
            "{c}"
        );
    }

    #[test]
    fn blk_roots_get_no_overlay_words() {
        for kind in [RootKind::Blk, RootKind::BlkExt4Rw] {
            let s = BootSpec {
                root_kind: kind,
                upper_disk: Some("/ignored".into()),
                upper_size_mib: Some(8),
                ..spec()
            };
            let c = cmdline_of(&s);
            assert!(!c.contains("shoal.upper"), "{c}");
        }
    }
}
