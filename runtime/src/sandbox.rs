//! Sandboxes without the daemon: a template per (image, layers, upper
//! layer, vCPUs, memory) is booted once and snapshotted; each sandbox is a
//! `shoal-vmm` process restored from it (with its own copy of the
//! template's scratch disk, if it has one), reached through its vsock
//! socket by the agent client.

use crate::fresh::{entropy, random_id, unix_nanos};
use crate::launch::{BootSpec, RootKind, INIT_MARKER};
use crate::template::{self, TemplateError};
use crate::vmm_process::{Disk, Io, Serial, VmmProcess};
use agent_client::Client;
use shoal_images::artifacts;
use shoal_images::layers::{self, LayerError, Upper};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// Errors managing sandboxes.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Kernel or image.
    #[error(transparent)]
    Artifacts(#[from] artifacts::ArtifactError),
    /// Template boot or snapshot.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The agent.
    #[error("guest agent: {0}")]
    Agent(#[from] agent_client::ClientError),
    /// File system.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// The VMM process.
    #[error("shoal-vmm: {0}")]
    Vmm(String),
    /// No such sandbox.
    #[error("no sandbox {0} (see `shoal vm ls`)")]
    Unknown(String),
    /// A layer, the upper layer or the scratch disk.
    #[error(transparent)]
    Layer(#[from] LayerError),
}

/// What a template is made of.
#[derive(Debug, Clone)]
pub struct TemplateSpec {
    /// Image name (`base` or `tiny`).
    pub image: String,
    /// vCPUs.
    pub vcpus: u8,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Further read-only layers over the image (erofs image files,
    /// `/dev/pmem1..`; checked with [`layers::check_layer`]).
    pub layers: Vec<PathBuf>,
    /// The overlay's upper layer.
    pub upper: Upper,
    /// A virtio-net device on this TAP at the boot: a networked template,
    /// whose sandboxes each restore with their own (`NetAttach`).
    pub net: Option<crate::vmm_net::BootNet>,
    /// A virtio-balloon device at the boot (its clones keep it).
    pub balloon: Option<crate::vmm_balloon::BalloonOptions>,
    /// A `vm` template's own disk instead of the image (microVMs refuse
    /// one).
    pub vm_disk: Option<crate::vm_disk::VmDisk>,
    /// The `vm` kind: the guest runs a shell on its serial console instead
    /// of Shoal's agent; exec and files go through that console.
    pub serial_console: bool,
}

impl TemplateSpec {
    /// The plain `image` (no layers, the default tmpfs upper layer).
    pub fn new(image: &str, vcpus: u8, memory_mib: u32) -> Self {
        TemplateSpec {
            image: image.into(),
            vcpus,
            memory_mib,
            layers: vec![],
            upper: Upper::default(),
            net: None,
            balloon: None,
            vm_disk: None,
            serial_console: false,
        }
    }
}

/// Where Shoal keeps state for daemon-less use.
pub fn state_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("SHOAL_STATE") {
        return p.into();
    }
    artifacts::cache_dir()
}

/// A 64-bit FNV-1a hash of `parts` (each terminated), as 16 hex digits.
pub fn hash_hex(parts: &[&[u8]]) -> String {
    // FNV-1a 64: a cache key, not a security boundary.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The guest files a template boots.
#[derive(Debug, Clone)]
pub struct GuestFiles {
    /// The guest kernel.
    pub kernel: PathBuf,
    /// The image's read-only root.
    pub image: PathBuf,
    /// The kernel command line (before the root and layer options).
    pub cmdline: String,
}

impl GuestFiles {
    /// For daemon-less use: built by the checkout, or from the installed
    /// layout ([`artifacts::kernel`]).
    pub fn for_image(image: &str) -> Result<GuestFiles, SandboxError> {
        Ok(GuestFiles {
            kernel: artifacts::kernel()?,
            image: artifacts::image(&format!("{image}_erofs"))?,
            // `quiet`: a sandbox's boot log is read by no one, and every
            // console byte is a VM exit (errors still print).
            cmdline: format!("{} quiet", artifacts::base_cmdline()),
        })
    }
}

/// The boot of `spec` with `guest`, less the paths only known once its
/// directory exists (they change neither the command line nor the key),
/// and the key of everything that makes the snapshot what it is.
fn template_boot(
    spec: &TemplateSpec,
    guest: &GuestFiles,
    vmm: &Path,
) -> Result<(BootSpec, String), SandboxError> {
    // Bounds (the API checked them already; direct callers may not have).
    spec.upper.check(spec.memory_mib)?;
    if spec.layers.len() > layers::MAX_LAYERS {
        return Err(LayerError::TooMany(spec.layers.len()).into());
    }
    let mut layer_ids = Vec::with_capacity(spec.layers.len());
    for l in &spec.layers {
        layers::check_layer(l)?;
        layer_ids.push(layers::file_identity(l));
    }
    let boot = BootSpec {
        kernel: guest.kernel.clone(),
        root: guest.image.clone(),
        root_kind: RootKind::default(),
        cmdline: guest.cmdline.clone(),
        init_args: vec![],
        memory_mib: spec.memory_mib,
        vcpus: spec.vcpus,
        vsock_uds: None,
        extra_pmem: spec.layers.clone(),
        upper_disk: spec
            .upper
            .disk_mib()
            .map(|_| PathBuf::from(layers::SCRATCH_DISK)),
        upper_size_mib: Some(spec.upper.tmpfs_mib(spec.memory_mib)),
    };
    let upper_key = spec.upper.key();
    let balloon_key = spec.balloon.map(|b| b.arg()).unwrap_or_default();
    let layer_key = layer_ids.join("\n");
    let key = hash_hex(&[
        guest.kernel.as_os_str().as_encoded_bytes(),
        guest.image.as_os_str().as_encoded_bytes(),
        boot.kernel_cmdline().as_bytes(),
        layer_key.as_bytes(),
        upper_key.as_bytes(),
        balloon_key.as_bytes(),
        RootKind::default().name().as_bytes(),
        &[spec.vcpus],
        &spec.memory_mib.to_le_bytes(),
        &std::fs::metadata(vmm)
            .and_then(|m| m.modified())
            .map(|t| format!("{t:?}"))
            .unwrap_or_default()
            .into_bytes(),
        env!("CARGO_PKG_VERSION").as_bytes(),
    ]);
    Ok((boot, key))
}

/// The template snapshot for `spec`, booting and snapshotting it first if
/// there is none, in the daemon-less cache (`state_dir()/templates`, where
/// templates unused for a day are pruned). `progress` gets a line when
/// that happens.
pub fn template(
    spec: &TemplateSpec,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, SandboxError> {
    let guest = GuestFiles::for_image(&spec.image)?;
    let vmm = artifacts::vmm_binary()?;
    let (_, key) = template_boot(spec, &guest, &vmm)?;
    let dir = state_dir()
        .join("templates")
        .join(format!("{}-{key}", spec.image));
    if dir.join("state").is_file() && dir.join("memory").is_file() {
        // Marks it used (templates unused for a day are pruned).
        let _ = std::fs::File::open(&dir).and_then(|f| f.set_modified(SystemTime::now()));
        return Ok(dir);
    }
    progress(&format!(
        "shoal: creating the '{}' template (boot once, then snapshot; ~20-60 s on PVM hosts, once)...",
        spec.image
    ));
    let tmp = dir.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    build_template(&tmp, spec, &guest, &vmm, None)?;
    // Publish atomically; a concurrent creator may have won the race.
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => {}
        Err(_) if dir.join("state").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Err(e) => return Err(SandboxError::Io(dir, e)),
    }
    // Templates of older kernels, images or VMM builds are never used
    // again (the key changed) and each holds a guest-memory file.
    let _ = prune_templates(&state_dir().join("templates"), &dir, STALE_TEMPLATE_AGE);
    Ok(dir)
}

/// Boots `spec` with `guest` once and snapshots it into `dir` (created;
/// removed again if that fails), with a freshly formatted scratch disk
/// there if its upper layer is one. The snapshot records the image and
/// layer paths: they must stay in place for restores.
pub fn build_template(
    dir: &Path,
    spec: &TemplateSpec,
    guest: &GuestFiles,
    vmm: &Path,
    jail: Option<&crate::jail::JailConfig>,
) -> Result<(), SandboxError> {
    let net = spec.net.clone().map(|n| (n.tap, n.mac));
    build_template_in(dir, spec, guest, vmm, jail, net)
}

/// [`build_template`] of a networked template (unjailed): booted with a
/// virtio-net device on `tap` with `mac` (see
/// [`template::make_with_net`]); restore it with
/// [`Sandbox::start_with_net`].
pub fn build_net_template(
    dir: &Path,
    spec: &TemplateSpec,
    guest: &GuestFiles,
    vmm: &Path,
    tap: std::sync::Arc<std::fs::File>,
    mac: [u8; 6],
) -> Result<(), SandboxError> {
    build_template_in(dir, spec, guest, vmm, None, Some((tap, mac)))
}

fn build_template_in(
    dir: &Path,
    spec: &TemplateSpec,
    guest: &GuestFiles,
    vmm: &Path,
    jail: Option<&crate::jail::JailConfig>,
    net: Option<(std::sync::Arc<std::fs::File>, [u8; 6])>,
) -> Result<(), SandboxError> {
    let (mut boot, _) = template_boot(spec, guest, vmm)?;
    std::fs::create_dir_all(dir).map_err(|e| SandboxError::Io(dir.into(), e))?;
    // A scratch disk is booted freshly formatted and stays in the template
    // directory as it is at the snapshot; each sandbox gets a copy.
    if let Some(mib) = spec.upper.disk_mib() {
        let p = dir.join(layers::SCRATCH_DISK);
        if let Err(e) = layers::format_scratch(&p, mib) {
            let _ = std::fs::remove_dir_all(dir);
            return Err(e.into());
        }
        boot.upper_disk = Some(p);
    }
    boot.vsock_uds = Some(dir.join("boot.vsock"));
    let t = Duration::from_secs(900);
    let devices = template::BootDevices {
        net,
        balloon: spec.balloon,
    };
    let res = template::make_with_devices(&boot, vmm, dir, INIT_MARKER, t, jail, devices);
    let _ = std::fs::remove_file(dir.join("boot.vsock"));
    if let Err(e) = res {
        let _ = std::fs::remove_dir_all(dir);
        return Err(e.into());
    }
    Ok(())
}

/// Templates unused for this long are removed when a new one is made.
const STALE_TEMPLATE_AGE: Duration = Duration::from_secs(24 * 3600);

/// Removes template directories under `root` (other than `keep`) that
/// were last modified more than `age` ago and whose files no running
/// process maps (a VMM restored from a template maps its memory file).
/// Returns the directories removed.
pub fn prune_templates(root: &Path, keep: &Path, age: Duration) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return vec![];
    };
    let mapped = mapped_paths();
    let mut removed = vec![];
    for e in entries.flatten() {
        let dir = e.path();
        if dir == keep || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let old = [dir.clone(), dir.join("state"), dir.join("memory")]
            .iter()
            .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .all(|t| t.elapsed().is_ok_and(|a| a > age));
        let in_use = mapped.iter().any(|m| m.starts_with(&dir));
        if old && !in_use && std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(dir);
        }
    }
    removed
}

/// Every file some process on the host maps (from /proc/*/maps).
fn mapped_paths() -> Vec<PathBuf> {
    let mut out = std::collections::BTreeSet::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if !p
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(maps) = std::fs::read_to_string(p.path().join("maps")) else {
            continue;
        };
        for l in maps.lines() {
            if let Some(i) = l.find(" /") {
                out.insert(PathBuf::from(l[i + 1..].trim_end_matches(" (deleted)")));
            }
        }
    }
    out.into_iter().collect()
}

/// A running sandbox: a restored VMM process and its sockets.
#[derive(Debug)]
pub struct Sandbox {
    /// Short id.
    pub id: String,
    /// Its directory (sockets, pid).
    pub dir: PathBuf,
    /// VMM control socket.
    pub api_sock: PathBuf,
    /// vsock host socket.
    pub vsock: PathBuf,
}

impl Sandbox {
    /// Sandboxes live under this directory.
    pub fn root() -> PathBuf {
        state_dir().join("vms")
    }

    /// Restores a new sandbox from `tpl` (with its own copy of the
    /// template's scratch disk, if it has one). With `detach`, the VMM
    /// process outlives this one (its own session).
    pub fn start(
        tpl: &Path,
        detach: bool,
    ) -> Result<(Sandbox, Option<std::process::Child>), SandboxError> {
        Self::start_with_net(tpl, detach, None)
    }

    /// [`Self::start`] from a networked template (see
    /// [`crate::template::make_with_net`]), its net device on `net`'s TAP
    /// with `net`'s MAC (`--restore-net`).
    pub fn start_with_net(
        tpl: &Path,
        detach: bool,
        net: Option<(std::sync::Arc<std::fs::File>, [u8; 6])>,
    ) -> Result<(Sandbox, Option<std::process::Child>), SandboxError> {
        Self::reap_stale();
        let id = random_id();
        let dir = Self::root().join(&id);
        std::fs::create_dir_all(&dir).map_err(|e| SandboxError::Io(dir.clone(), e))?;
        let p = crate::vm::Paths::new(&dir);
        let sb = Sandbox {
            api_sock: p.api_sock,
            vsock: p.vsock,
            id,
            dir,
        };
        let disk = match layers::scratch_disk(tpl) {
            Some(src) => {
                let own = sb.dir.join(layers::SCRATCH_DISK);
                if let Err(e) = layers::clone_file(&src, &own) {
                    let _ = std::fs::remove_dir_all(&sb.dir);
                    return Err(e.into());
                }
                Some(own)
            }
            None => None,
        };
        let vmm = match artifacts::vmm_binary() {
            Ok(v) => v,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&sb.dir);
                return Err(e.into());
            }
        };
        let mut p = VmmProcess::restore(&vmm, tpl);
        if let Some(d) = disk {
            p = p.disk(Disk::rw(d));
        }
        if let Some((tap, mac)) = net {
            p = p.net_tap(tap, mac, crate::vmm_net::NetLimits::default());
        }
        let spawned = p
            .api_sock(&sb.api_sock)
            .vsock_uds(&sb.vsock)
            .serial(Serial::File(sb.dir.join("console.log")))
            .stdin(Io::Null)
            .stdout(Io::Null)
            .stderr(Io::Truncate(sb.dir.join("vmm.log")))
            .own_session(detach)
            .spawn();
        let child = match spawned {
            Ok(s) => s.child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&sb.dir);
                return Err(SandboxError::Vmm(format!("cannot start: {e}")));
            }
        };
        let _ = std::fs::write(sb.dir.join("pid"), child.id().to_string());
        Ok((sb, Some(child)))
    }

    /// Removes the directories of sandboxes whose VMM is gone (killed with
    /// its starter, e.g. a `shoal run` interrupted by SIGKILL): a directory
    /// whose recorded pid is not a live `shoal-vmm`, or which never got a
    /// pid file and is over a minute old.
    pub fn reap_stale() {
        reap_stale_in(&Self::root());
    }

    /// The last lines the VMM wrote to its log (for error messages).
    pub fn vmm_log_tail(&self) -> String {
        crate::vm::log_tail(&self.dir.join("vmm.log"), 5, "\n")
    }

    /// An existing sandbox by id.
    pub fn open(id: &str) -> Result<Sandbox, SandboxError> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(SandboxError::Unknown(id.into()));
        }
        let dir = Self::root().join(id);
        let p = crate::vm::Paths::new(&dir);
        if !p.api_sock.exists() {
            return Err(SandboxError::Unknown(id.into()));
        }
        Ok(Sandbox {
            api_sock: p.api_sock,
            vsock: p.vsock,
            id: id.into(),
            dir,
        })
    }

    /// Ids of existing sandboxes.
    pub fn list() -> Vec<String> {
        Self::reap_stale();
        let mut v: Vec<String> = std::fs::read_dir(Self::root())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join("api.sock").exists())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Connects to the agent (retrying while the restored VM comes up) and,
    /// on the first connection after a restore, gives the guest fresh
    /// entropy and the current time.
    pub fn connect(&self, timeout: Duration, post_restore: bool) -> Result<Client, SandboxError> {
        let c = Client::connect_vsock_retry(&self.vsock, agent_proto::VSOCK_PORT, timeout)?;
        if post_restore {
            c.post_restore(entropy(), unix_nanos())?;
        }
        Ok(c)
    }

    /// Stops the VM and removes the sandbox's files. `child` is the VMM
    /// process when this process started it (it is then reaped here).
    pub fn stop(&self, child: Option<&mut std::process::Child>) {
        let _ = vmm_api::Client::new(&self.api_sock, Duration::from_secs(10)).shutdown();
        let end = Instant::now() + Duration::from_secs(5);
        match child {
            Some(c) => {
                while matches!(c.try_wait(), Ok(None)) && Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(2));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
            None => {
                let pid: Option<i32> = std::fs::read_to_string(self.dir.join("pid"))
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
                if let Some(pid) = pid {
                    // A detached VMM is not our child: probe until it is gone.
                    // SAFETY: kill with signal 0 only probes for the process.
                    while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < end {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    // SAFETY: SIGKILL to the VMM, if it is still there.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// [`Sandbox::reap_stale`] over the sandbox directories under `root`.
fn reap_stale_in(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let dir = e.path();
        let pid: Option<u32> = std::fs::read_to_string(dir.join("pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let stale = match pid {
            Some(pid) => !std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(9).any(|w| w == b"shoal-vmm")),
            None => e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(60)),
        };
        if stale && e.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn prune_templates_removes_only_old_unmapped_ones() {
        let root = tempfile::tempdir().unwrap();
        let mk = |name: &str| {
            let d = root.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("state"), b"s").unwrap();
            std::fs::write(d.join("memory"), vec![0u8; 4096]).unwrap();
            d
        };
        let (keep, old, mapped) = (mk("tiny-keep"), mk("tiny-old"), mk("tiny-mapped"));
        // A live mapping of one template's memory file (as a restored VMM has).
        let f = std::fs::File::open(mapped.join("memory")).unwrap();
        // SAFETY: a fresh read-only shared mapping of a 4 KiB file we own,
        // unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // Nothing is older than an hour: nothing goes.
        assert!(prune_templates(root.path(), &keep, Duration::from_secs(3600)).is_empty());
        std::thread::sleep(Duration::from_millis(20));
        let removed = prune_templates(root.path(), &keep, Duration::from_millis(10));
        // SAFETY: the mapping made above, of 4096 bytes.
        unsafe { libc::munmap(p, 4096) };
        assert_eq!(removed, vec![old.clone()]);
        assert!(keep.exists() && mapped.exists() && !old.exists());
    }

    #[test]
    fn reap_stale_removes_dirs_of_dead_vmms_only() {
        let root = tempfile::tempdir().unwrap();
        let mk = |name: &str, pid: Option<u32>| {
            let d = root.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vmm.log"), "x").unwrap();
            if let Some(pid) = pid {
                std::fs::write(d.join("pid"), pid.to_string()).unwrap();
            }
            d
        };
        // A live process named shoal-vmm (a copy of sleep).
        let fake = root.path().join("shoal-vmm");
        std::fs::copy("/bin/sleep", &fake).unwrap();
        let mut live = Command::new(&fake).arg("30").spawn().unwrap();
        // Its command line names shoal-vmm once it has exec'd (seen to lag
        // the spawn once in a full parallel test run).
        let cmdline = format!("/proc/{}/cmdline", live.id());
        let t0 = std::time::Instant::now();
        while !std::fs::read(&cmdline).is_ok_and(|c| c.windows(9).any(|w| w == b"shoal-vmm")) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the fake VMM never showed up as shoal-vmm"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // A process that has ended.
        let mut dead = Command::new("/bin/true").spawn().unwrap();
        let dead_pid = dead.id();
        dead.wait().unwrap();

        let alive = mk("a1", Some(live.id()));
        let gone = mk("d1", Some(dead_pid));
        let other = mk("o1", Some(std::process::id())); // alive, but not a VMM
        let fresh = mk("f1", None); // being created: no pid file yet
        reap_stale_in(root.path());
        live.kill().unwrap();
        live.wait().unwrap();
        assert!(alive.exists(), "a live VMM's directory was removed");
        assert!(!gone.exists(), "a dead VMM's directory was kept");
        assert!(!other.exists(), "a non-VMM pid's directory was kept");
        assert!(fresh.exists(), "a directory without a pid yet was removed");
    }
}
