//! Snapshots: writing one from a paused VM, restoring one into a new VM,
//! and reloading one into an existing (pre-warmed or finished) VM.
//!
//! Guest memory is never copied on restore: the snapshot's `memory` file is
//! mapped `MAP_PRIVATE`, so every VM restored from one snapshot shares its
//! clean pages in the host page cache and copies only the pages it writes.

use super::build::{anonymous_memory, create_base};
use super::{console_sink, default_profile, io_err, RestoreOptions, Vm, VmError};
use crate::config::{BootSource, VmConfig};
use crate::layout::ram_ranges;
use crate::persist::{SnapshotMeta, SnapshotState, VcpuRef, VcpuState, VmRef};
use snapshot::Persist;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

fn incompatible(dir: &Path) -> impl Fn(String) -> VmError + '_ {
    move |reason| VmError::Incompatible {
        dir: dir.into(),
        reason,
    }
}

/// Loads `dir/state` and checks it against this host; returns it with the
/// configuration it carries.
fn load_checked(dir: &Path) -> Result<(SnapshotState, VmConfig), VmError> {
    let st: SnapshotState = snapshot::load(&dir.join("state"))?;
    let cfg = check_state(dir, &st)?;
    Ok((st, cfg))
}

/// Checks a loaded state (read from `dir`) against this host and its own
/// configuration, and bounds everything restore sizes from it; returns
/// the configuration. Device registers and queues are checked against the
/// devices and guest memory when the transports are restored.
pub(crate) fn check_state(dir: &Path, st: &SnapshotState) -> Result<VmConfig, VmError> {
    let bad = incompatible(dir);
    let cfg: VmConfig = serde_json::from_str(&st.config_json)
        .map_err(|e| bad(format!("saved configuration: {e}")))?;
    cfg.validate()?;
    let host = crate::host::kvm_kind().as_str();
    if st.meta.host_kvm != host {
        return Err(bad(format!(
            "it was taken on a {} KVM host; this host is {host}",
            st.meta.host_kvm
        )));
    }
    let profile = default_profile(&cfg);
    if st.meta.cpu_profile != profile {
        return Err(bad(format!(
            "it was taken with CPU profile {}; this host uses {profile}",
            st.meta.cpu_profile
        )));
    }
    if st.meta.memory_bytes != cfg.mem_bytes() || st.memory_regions != ram_ranges(cfg.mem_bytes()) {
        return Err(bad("memory layout does not match its configuration".into()));
    }
    if st.vcpus.len() != usize::from(cfg.vcpus) || st.meta.vcpus != cfg.vcpus {
        return Err(bad("vCPU count does not match its configuration".into()));
    }
    let devices = cfg.virtio_devices();
    if st.virtio.len() != devices {
        return Err(bad(format!(
            "{} saved virtio devices, configuration has {devices}",
            st.virtio.len(),
        )));
    }
    let paths: Vec<&Path> = cfg.pmem.iter().map(|p| p.path.as_path()).collect();
    super::pmem_dev::check_saved(&paths, &st.pmem).map_err(|e| bad(e.to_string()))?;
    let pages = st.meta.memory_bytes / 4096;
    if st.diff_pages.len() as u64 > pages || (st.diff_base.is_none() && !st.diff_pages.is_empty()) {
        return Err(bad(format!(
            "{} diff pages for {pages} pages of guest memory",
            st.diff_pages.len()
        )));
    }
    Ok(cfg)
}

/// Points the saved disks of `cfg` at `disks` (in order; see
/// [`RestoreOptions::disks`]). A saved path is data read from the
/// snapshot, not a choice of the caller: a disk the caller did not give
/// keeps its saved path only if it was read-only (and is opened read-only);
/// a writable one without a file from the caller is refused, so an edited
/// state cannot make the VMM open a host file for writing.
pub(crate) fn override_disks(
    dir: &Path,
    cfg: &mut VmConfig,
    disks: &[std::path::PathBuf],
) -> Result<(), VmError> {
    if disks.len() > cfg.disks.len() {
        return Err(incompatible(dir)(format!(
            "{} disk files given for a snapshot with {} disks",
            disks.len(),
            cfg.disks.len()
        )));
    }
    for (d, p) in cfg.disks.iter_mut().zip(disks) {
        if p.as_os_str().is_empty() {
            return Err(incompatible(dir)("an empty disk path was given".into()));
        }
        d.path.clone_from(p);
    }
    if let Some((i, d)) = cfg
        .disks
        .iter()
        .enumerate()
        .skip(disks.len())
        .find(|(_, d)| !d.read_only)
    {
        return Err(incompatible(dir)(format!(
            "saved disk {i} ({}) is writable: a saved disk path is opened read-only at \
             most, so give the file for it (--restore-disk, one per disk in order)",
            d.path.display()
        )));
    }
    Ok(())
}

/// The directory whose `memory` file backs the snapshot in `dir`: itself,
/// or for a diff snapshot its base (which must be a full snapshot).
fn memory_dir(dir: &Path, st: &SnapshotState) -> Result<std::path::PathBuf, VmError> {
    let Some(base) = &st.diff_base else {
        return Ok(dir.to_path_buf());
    };
    let bad = incompatible(dir);
    if !base.join("memory").is_file() {
        return Err(bad(format!(
            "it is a diff snapshot of {}, which has no full memory file",
            base.display()
        )));
    }
    let max = st.memory_regions.iter().map(|r| r.1).sum::<u64>() / 4096;
    if st.diff_pages.iter().any(|&p| p >= max) {
        return Err(bad("diff page outside guest memory".into()));
    }
    Ok(base.clone())
}

/// Opens the memory file and checks its size against `regions`.
fn open_memory(dir: &Path, regions: &[(u64, u64)]) -> Result<std::fs::File, VmError> {
    let bad = incompatible(dir);
    let path = dir.join("memory");
    let f = std::fs::File::open(&path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let len = f
        .metadata()
        .map_err(|e| bad(format!("{}: {e}", path.display())))?
        .len();
    let want: u64 = regions.iter().map(|r| r.1).sum();
    if len != want {
        return Err(bad(format!(
            "memory file is {len} bytes, the saved layout needs {want}"
        )));
    }
    Ok(f)
}

/// Maps the memory file privately (copy-on-write) at `regions`.
fn map_memory_file(
    f: std::fs::File,
    regions: &[(u64, u64)],
    mib: u32,
) -> Result<GuestMemoryMmap, VmError> {
    let f = Arc::new(f);
    let mut out = Vec::with_capacity(regions.len());
    let mut off = 0u64;
    for &(start, size) in regions {
        let len = usize::try_from(size).map_err(|_| VmError::Memory(mib))?;
        let region = vm_memory::MmapRegion::build(
            Some(vm_memory::FileOffset::from_arc(f.clone(), off)),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_NORESERVE,
        )
        .map_err(|_| VmError::Memory(mib))?;
        out.push(
            vm_memory::GuestRegionMmap::new(region, GuestAddress(start))
                .ok_or(VmError::Memory(mib))?,
        );
        off += size;
    }
    GuestMemoryMmap::from_regions(out).map_err(|_| VmError::Memory(mib))
}

impl Vm {
    /// Rebuilds a VM from the snapshot in `dir`, with `opts` applied
    /// (`console`, if given, receives the console whatever `opts` says).
    pub fn restore(
        dir: &Path,
        console: Option<Box<dyn Write + Send>>,
        opts: RestoreOptions,
    ) -> Result<Self, VmError> {
        let (st, mut cfg) = load_checked(dir)?;
        if let Some(s) = opts.serial {
            cfg.serial = s;
        }
        if let (Some(v), Some(p)) = (cfg.vsock.as_mut(), opts.vsock_uds) {
            v.uds_path = p;
        }
        override_disks(dir, &mut cfg, &opts.disks)?;
        super::net_dev::apply_restore_net(dir, &mut cfg, opts.net.as_ref())?;
        let mem_dir = memory_dir(dir, &st)?;
        let f = open_memory(&mem_dir, &st.memory_regions)?;
        let mem = map_memory_file(f, &st.memory_regions, cfg.memory_mib)?;
        if st.diff_base.is_some() {
            super::diff::apply_diff(&mem, &st.diff_pages, &dir.join("memory.diff"))?;
        }
        let base = create_base()?;
        let sink = console_sink(&cfg, console)?;
        let (mut vm, _) = Self::shell(&cfg, base, mem, sink)?;
        // Every slot before the irqchip (see `create_base`); load_state
        // then keeps these mappings.
        vm.map_pmem_saved(&st.pmem)?;
        vm.finish_shell()?;
        vm.load_state(&st)?;
        vm.load_balloon(dir)?;
        vm.memory_base = Some(mem_dir);
        Ok(vm)
    }

    /// An empty, pre-warmed VM: KVM VM, irqchip, PIT, vCPUs and `memory_mib`
    /// of registered (unpopulated) guest memory, waiting for
    /// [`Vm::reload`]. Creating those is most of a restore's cost, so a pool
    /// of pre-warmed VMs turns a restore into loading state.
    pub fn prewarmed(
        memory_mib: u32,
        vcpus: u8,
        console: Option<Box<dyn Write + Send>>,
        opts: RestoreOptions,
    ) -> Result<Self, VmError> {
        let serial = opts.serial.unwrap_or_default();
        let cfg = VmConfig {
            // Replaced by the snapshot's configuration on reload.
            boot: BootSource::RealMode {
                code: vec![0xf4],
                addr: 0x1000,
            },
            vcpus,
            memory_mib,
            disks: vec![],
            serial,
            serial_limit_bytes: VmConfig::linux("".into()).serial_limit_bytes,
            cpu_profile: None,
            vsock: None,
            pmem: vec![],
            net: None,
            balloon: None,
        };
        cfg.validate()?;
        let mem = anonymous_memory(&cfg)?;
        let base = create_base()?;
        let sink = console_sink(&cfg, console)?;
        let (mut vm, _) = Self::shell(&cfg, base, mem, sink)?;
        vm.finish_shell()?;
        vm.vsock_path = opts.vsock_uds;
        vm.net_override = opts.net;
        Ok(vm)
    }

    /// Replaces the guest with the snapshot in `dir`, keeping the KVM VM,
    /// its memory slots, vCPUs and console: guest memory is re-mapped from
    /// the snapshot over the same host range (dropping every page the old
    /// guest wrote), and all device and vCPU state is reloaded. The vCPUs
    /// must not be running.
    pub fn reload(&mut self, dir: &Path) -> Result<(), VmError> {
        self.reload_with_disks(dir, &[])
    }

    /// [`Vm::reload`] with the saved disks pointed at `disks` (see
    /// [`RestoreOptions::disks`]).
    pub fn reload_with_disks(
        &mut self,
        dir: &Path,
        disks: &[std::path::PathBuf],
    ) -> Result<(), VmError> {
        let (st, mut cfg) = load_checked(dir)?;
        override_disks(dir, &mut cfg, disks)?;
        super::net_dev::apply_restore_net(dir, &mut cfg, self.net_override.as_ref())?;
        let bad = incompatible(dir);
        let current: Vec<(u64, u64)> = self
            .mem
            .iter()
            .map(|r| (r.start_addr().0, r.len()))
            .collect();
        if current != st.memory_regions {
            return Err(bad(format!(
                "it needs {} MiB of guest memory; this VM has {} MiB",
                st.meta.memory_bytes >> 20,
                self.config.memory_mib
            )));
        }
        if self.vcpus.len() != st.vcpus.len() {
            return Err(bad(format!(
                "it has {} vCPUs; this VM has {}",
                st.vcpus.len(),
                self.vcpus.len()
            )));
        }
        let mem_dir = memory_dir(dir, &st)?;
        let f = open_memory(&mem_dir, &st.memory_regions)?;
        let mut off: libc::off_t = 0;
        for r in self.mem.iter() {
            let too_big = || VmError::Memory(self.config.memory_mib);
            let len = usize::try_from(r.len()).map_err(|_| too_big())?;
            let step = libc::off_t::try_from(r.len()).map_err(|_| too_big())?;
            // SAFETY: the target range is exactly this region's existing
            // mapping, owned by `self.mem` and registered with KVM;
            // MAP_FIXED replaces it in place (KVM's MMU notifier drops its
            // shadow of the old pages), and the file outlives the call (the
            // mapping keeps its own reference).
            let p = unsafe {
                libc::mmap(
                    r.as_ptr().cast(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    f.as_raw_fd(),
                    off,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(VmError::Memory(self.config.memory_mib));
            }
            off += step;
        }
        if st.diff_base.is_some() {
            super::diff::apply_diff(&self.mem, &st.diff_pages, &dir.join("memory.diff"))?;
        }
        self.memory_base = Some(mem_dir);
        // Nothing maps the eviction file any more.
        self.evictor.forget_mappings();
        cfg.serial = self.config.serial.clone();
        // A reloaded VM keeps its own vsock socket path.
        if let (Some(v), Some(old)) = (cfg.vsock.as_mut(), self.vsock_path.as_ref()) {
            v.uds_path = old.clone();
        }
        self.config = cfg;
        self.profile = default_profile(&self.config);
        self.load_state(&st)?;
        self.load_balloon(dir)
    }

    /// Loads devices, VM-wide and vCPU state into the shell.
    fn load_state(&mut self, st: &SnapshotState) -> Result<(), VmError> {
        self.loaded = false;
        // Guest RAM is the snapshot's memory file, mapped privately.
        self.ram_from_snapshot();
        // Pmem images first: their devices are built from the mappings.
        self.map_pmem_saved(&st.pmem)?;
        self.attach_devices(Some(st))?;
        VmRef::restore(VmRef(&self.vm_fd), &st.vm)?;
        for (fd, vs) in self.vcpus.iter().zip(&st.vcpus) {
            VcpuRef::restore(
                VcpuRef {
                    fd,
                    msr_list: &[],
                    xsave: self.xsave,
                },
                vs,
            )?;
        }
        self.msr_list = Arc::new(st.vcpus[0].msrs.iter().map(|m| m.0).collect());
        self.cmdline = None;
        // Connections open at snapshot time did not survive; tell the guest.
        if let Some(v) = self.vsock.as_ref().filter(|_| st.vsock_had_connections) {
            v.send_transport_reset();
        }
        self.loaded = true;
        Ok(())
    }

    /// Writes `dir/memory` and `dir/state` from paused vCPU states.
    /// Writes all of guest memory to `dir/memory`, through a temporary
    /// name: a VM restored from an older snapshot in this directory keeps
    /// its mapping of the old file.
    fn write_full_memory(&self, dir: &Path, regions: &[(u64, u64)]) -> Result<(), VmError> {
        let mem_path = dir.join("memory");
        let tmp = dir.join("memory.tmp");
        let mut f = std::fs::File::create(&tmp)
            .map_err(io_err(format!("cannot create {}", tmp.display())))?;
        for &(start, len) in regions {
            vm_memory::Bytes::write_all_volatile_to(
                &self.mem,
                GuestAddress(start),
                &mut f,
                usize::try_from(len).map_err(|_| VmError::Memory(self.config.memory_mib))?,
            )
            .map_err(|e| VmError::DeviceState(format!("writing guest memory: {e}")))?;
        }
        f.sync_all()
            .map_err(io_err(format!("cannot write {}", mem_path.display())))?;
        std::fs::rename(&tmp, &mem_path)
            .map_err(io_err(format!("cannot write {}", mem_path.display())))
    }

    pub(super) fn save_snapshot(
        &self,
        vcpus: Vec<VcpuState>,
        dir: &Path,
        diff: bool,
    ) -> Result<(u64, u64), VmError> {
        std::fs::create_dir_all(dir).map_err(io_err(format!("cannot create {}", dir.display())))?;
        let vm = VmRef(&self.vm_fd).save()?;
        let serial = devices::bus::lock(&self.serial)
            .save()
            .map_err(|e| VmError::DeviceState(e.to_string()))?;
        let virtio = self
            .virtio
            .iter()
            .map(|t| devices::bus::lock(t).save())
            .collect::<Result<_, _>>()?;
        let pmem = self.save_pmem()?;
        let regions: Vec<(u64, u64)> = self
            .mem
            .iter()
            .map(|r| (r.start_addr().0, r.len()))
            .collect();
        let total_bytes: u64 = regions.iter().map(|r| r.1).sum();
        let (diff_base, diff_pages, total) = if diff {
            let base = self.memory_base.clone().ok_or_else(|| {
                VmError::DeviceState(
                    "a diff snapshot needs a VM restored from a full snapshot".into(),
                )
            })?;
            if std::fs::canonicalize(&base).ok() == std::fs::canonicalize(dir).ok() {
                return Err(VmError::DeviceState(
                    "a diff snapshot cannot go into its own base directory".into(),
                ));
            }
            let pages = super::diff::private_pages(&self.mem, self.evictor.file_id())?;
            let tmp = dir.join("memory.diff.tmp");
            super::diff::write_diff(&self.mem, &pages, &tmp, total_bytes)?;
            std::fs::rename(&tmp, dir.join("memory.diff"))
                .map_err(io_err(format!("cannot write {}", dir.display())))?;
            let _ = std::fs::remove_file(dir.join("memory"));
            let n = pages.len() as u64 * 4096;
            (Some(base), pages, n)
        } else {
            self.write_full_memory(dir, &regions)?;
            let _ = std::fs::remove_file(dir.join("memory.diff"));
            (None, vec![], total_bytes)
        };
        let state = SnapshotState {
            meta: SnapshotMeta {
                vmm_version: env!("CARGO_PKG_VERSION").into(),
                host_kvm: crate::host::kvm_kind().as_str().into(),
                cpu_profile: self.profile,
                memory_bytes: self.config.mem_bytes(),
                vcpus: self.config.vcpus,
            },
            config_json: serde_json::to_string(&self.config)
                .map_err(|e| VmError::DeviceState(e.to_string()))?,
            vm,
            vcpus,
            serial,
            virtio,
            memory_regions: regions,
            vsock_had_connections: self
                .vsock
                .as_ref()
                .is_some_and(|v| v.connection_count() > 0),
            pmem,
            diff_base,
            diff_pages,
        };
        self.save_balloon(dir)?;
        let state_path = dir.join("state");
        snapshot::save(&state_path, &state)?;
        let state_bytes = std::fs::metadata(&state_path).map(|m| m.len()).unwrap_or(0);
        Ok((state_bytes, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DiskConfig;

    /// A writable disk then a read-only one.
    fn two_disks() -> VmConfig {
        let mut c = VmConfig::linux("/k".into());
        for (p, read_only) in [("/saved/a", false), ("/saved/b", true)] {
            c.disks.push(DiskConfig {
                path: p.into(),
                read_only,
            });
        }
        c
    }

    #[test]
    fn disk_overrides_replace_saved_paths_in_order() {
        let dir = Path::new("/snap");
        let mut c = two_disks();
        override_disks(dir, &mut c, &["/clone/a".into()]).unwrap();
        assert_eq!(c.disks[0].path, Path::new("/clone/a"));
        assert_eq!(c.disks[1].path, Path::new("/saved/b"), "the rest as saved");
        assert!(!c.disks[0].read_only);
        assert!(c.disks[1].read_only);
        override_disks(dir, &mut c, &["/x".into(), "/y".into()]).unwrap();
        assert_eq!(c.disks[1].path, Path::new("/y"));
        // Read-only saved disks need no file from the caller.
        let mut ro = two_disks();
        ro.disks[0].read_only = true;
        override_disks(dir, &mut ro, &[]).unwrap();
        assert_eq!(ro.disks[0].path, Path::new("/saved/a"));
    }

    /// A state edited to point a writable disk at a host file: without a
    /// file from the caller the saved path is never opened for writing.
    #[test]
    fn saved_writable_disk_paths_are_not_opened_without_the_caller() {
        let dir = Path::new("/snap");
        let mut c = two_disks();
        c.disks[0].path = "/etc/passwd".into();
        let e = override_disks(dir, &mut c, &[]).unwrap_err().to_string();
        assert!(
            e.contains("saved disk 0 (/etc/passwd) is writable") && e.contains("--restore-disk"),
            "{e}"
        );
        // Both writable: the caller must give both.
        c.disks[1].read_only = false;
        let e = override_disks(dir, &mut c, &["/clone/a".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("saved disk 1 (/saved/b) is writable"), "{e}");
        override_disks(dir, &mut c, &["/clone/a".into(), "/clone/b".into()]).unwrap();
        assert_eq!(c.disks[1].path, Path::new("/clone/b"));
    }

    #[test]
    fn bad_disk_overrides_are_refused() {
        let dir = Path::new("/snap");
        let mut c = two_disks();
        let e = override_disks(dir, &mut c, &["/a".into(), "/b".into(), "/c".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("3 disk files given for a snapshot with 2 disks"),
            "{e}"
        );
        let e = override_disks(dir, &mut c, &["".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty disk path"), "{e}");
        assert_eq!(c.disks[0].path, Path::new("/saved/a"));
    }
}
