//! virtio-pmem devices of a VM: each image is mapped read-only and shared
//! ([`pmem::PmemMapping`]), registered as a read-only KVM memory slot above
//! RAM, and announced by a virtio-pmem device ([`pmem::Pmem`]) whose config
//! space tells the guest where it is.
//!
//! ## Slots and teardown
//!
//! Pmem slots are numbered after the RAM slots (RAM region `i` is slot `i`;
//! pmem device `j` is slot `ram_regions + j`). Each mapping carries a
//! before-unmap hook that deletes its slot (`memory_size = 0`) through its
//! own duplicate of the VM fd, so the slot is gone before the host range is
//! unmapped whatever order the [`Vm`]'s fields drop in, and on a reload
//! that re-maps images.
//!
//! ## Guest writes
//!
//! The slots are `KVM_MEM_READONLY`: guest reads are plain memory accesses,
//! guest writes exit to the VMM as MMIO writes. A [`WriteSink`] on the MMIO
//! bus over each device's range drops them and counts them (reported in
//! the control API's stats); only the first write per device is logged.
//!
//! ## Snapshots
//!
//! The image is not copied: the snapshot keeps a [`PmemState`] per device
//! (path, guest address, size, fingerprint). Restore maps the same image at
//! the saved address, refusing a changed one. A reload into a live VM keeps
//! a device's mapping and slot when the saved state names the same open
//! file (same path, address, size, device, inode, mtime), and re-maps
//! otherwise (old slots removed first).

use super::{Vm, VmError};
use crate::layout::ram_ranges;
use ::pmem::{LayoutError, MappingError, PmemMapping, PmemPersistError, PmemState, SlotRegion};
use devices::BusDevice;
use kvm_bindings::{kvm_userspace_memory_region, KVMIO, KVM_MEM_READONLY};
use snapshot::Persist;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use vm_memory::GuestMemoryBackend;

vmm_sys_util::ioctl_iow_nr!(
    KVM_SET_USER_MEMORY_REGION,
    KVMIO,
    0x46,
    kvm_userspace_memory_region
);

/// Errors setting up, saving or restoring pmem devices.
#[derive(Debug, thiserror::Error)]
pub enum PmemError {
    /// The host KVM cannot map memory read-only.
    #[error(
        "this host's KVM lacks KVM_CAP_READONLY_MEM, which virtio-pmem needs (the shared \
         image is mapped read-only into the guest); use a virtio-blk disk instead"
    )]
    NoReadonlyMem,
    /// The devices cannot be placed in guest-physical space.
    #[error("cannot place pmem devices: {0}")]
    Layout(#[from] LayoutError),
    /// An image could not be checked or mapped.
    #[error(transparent)]
    Mapping(#[from] MappingError),
    /// Saving or restoring a device's state failed (e.g. a changed image).
    #[error(transparent)]
    Persist(#[from] PmemPersistError),
    /// KVM refused the memory slot.
    #[error("cannot register pmem image {path} as KVM memory slot {slot}: {source}")]
    Slot {
        /// The image.
        path: PathBuf,
        /// The slot number.
        slot: u32,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// The VM fd could not be duplicated for the slot-removal hook.
    #[error("cannot duplicate the VM fd: {0}")]
    Dup(std::io::Error),
    /// The snapshot's pmem devices do not match its configuration.
    #[error("saved pmem devices do not match the configuration: {0}")]
    Mismatch(String),
}

/// One mapped, registered pmem image.
pub(super) struct PmemDev {
    /// The mapping; dropping it removes the slot, then unmaps.
    pub mapping: PmemMapping,
    /// KVM slot number.
    pub slot: u32,
    /// Guest writes dropped so far.
    pub writes: Arc<AtomicU64>,
}

/// What a VM's pmem device looks like from outside (tests, stats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmemInfo {
    /// The image.
    pub path: PathBuf,
    /// Guest-physical start.
    pub guest_addr: u64,
    /// Size in bytes.
    pub len: u64,
    /// KVM memory slot.
    pub slot: u32,
    /// Host virtual address of the mapping.
    pub host_addr: u64,
    /// Guest writes dropped (the slot is read-only).
    pub guest_writes: u64,
}

/// What `attach_devices` puts on the MMIO bus for one pmem device.
pub(super) struct PmemBusParts {
    /// The virtio device.
    pub device: ::pmem::Pmem,
    /// The write sink over the guest range.
    pub sink: Arc<Mutex<dyn BusDevice>>,
    /// Guest range start.
    pub base: u64,
    /// Guest range length.
    pub len: u64,
}

/// Drops and counts guest writes to a read-only pmem range.
struct WriteSink {
    index: usize,
    path: PathBuf,
    guest_addr: u64,
    writes: Arc<AtomicU64>,
}

impl BusDevice for WriteSink {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        // Reads are served by the slot and never exit here; if one does
        // (no slot), the guest sees all-ones, like a missing device.
        data.fill(0xff);
    }

    fn write(&mut self, offset: u64, _data: &[u8]) {
        if self.writes.fetch_add(1, Ordering::Relaxed) == 0 {
            eprintln!(
                "shoal-vmm: guest wrote to read-only pmem device {} ({}) at {:#x}; \
                 guest writes to it are dropped and counted (see stats), not logged",
                self.index,
                self.path.display(),
                self.guest_addr.saturating_add(offset)
            );
        }
    }
}

/// Deletes KVM slot `slot` through `vm` (a duplicate of the VM fd).
fn delete_slot(vm: &OwnedFd, slot: u32, r: &SlotRegion) -> std::io::Result<()> {
    let region = kvm_userspace_memory_region {
        slot,
        flags: KVM_MEM_READONLY,
        guest_phys_addr: r.guest_addr,
        memory_size: 0,
        userspace_addr: r.host_addr,
    };
    // SAFETY: KVM_SET_USER_MEMORY_REGION reads one kvm_userspace_memory_region
    // from the pointer, which refers to a live local; `vm` is an open VM fd.
    // With memory_size 0 it only deletes the slot, touching no memory.
    let rc =
        unsafe { vmm_sys_util::ioctl::ioctl_with_ref(vm, KVM_SET_USER_MEMORY_REGION(), &region) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `dev` maps exactly the file `st` describes, unchanged since it
/// was fingerprinted (same path, address, size, inode and mtime): then the
/// mapping and its slot can stay across a reload.
fn same_image(dev: &PmemDev, st: &PmemState) -> bool {
    let m = &dev.mapping;
    if (m.path(), m.guest_addr(), m.len()) != (st.path.as_path(), st.guest_addr, st.len) {
        return false;
    }
    m.backing()
        .file
        .metadata()
        .is_ok_and(|meta| st.image.same_file_unmodified(&meta))
}

impl Vm {
    /// The KVM slot number of the next pmem device (after the RAM slots
    /// and the pmem devices registered so far).
    fn next_pmem_slot(&self) -> Result<u32, VmError> {
        u32::try_from(self.mem.num_regions() + self.pmem.len())
            .map_err(|_| PmemError::Mismatch("too many memory slots".into()).into())
    }

    /// Maps the configured images at addresses chosen by [`pmem::place`]
    /// and registers their slots (boot).
    pub(super) fn map_pmem_for_boot(&mut self) -> Result<(), VmError> {
        self.pmem.clear();
        if self.config.pmem.is_empty() {
            return Ok(());
        }
        self.require_readonly_mem()?;
        // Each image is opened once (or taken from its inherited
        // descriptor): what is checked and placed is what is mapped.
        let files = self
            .config
            .pmem
            .iter()
            .map(open_image)
            .collect::<Result<Vec<File>, _>>()
            .map_err(|e| PmemError::Mapping(e.into()))?;
        let sizes = files
            .iter()
            .zip(&self.config.pmem)
            .map(|(f, c)| ::pmem::check_file(f, &c.path).map(|i| i.len))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(|e| PmemError::Mapping(e.into()))?;
        let ranges =
            ::pmem::place(&ram_ranges(self.config.mem_bytes()), &sizes).map_err(PmemError::from)?;
        let paths: Vec<PathBuf> = self.config.pmem.iter().map(|p| p.path.clone()).collect();
        for ((file, path), r) in files.into_iter().zip(&paths).zip(&ranges) {
            let m = PmemMapping::from_file(file, path, r.start).map_err(PmemError::from)?;
            self.register_pmem(m)?;
        }
        Ok(())
    }

    /// Makes the pmem devices match `saved` (restore or reload): keeps a
    /// live mapping that is exactly the saved one, re-maps everything
    /// otherwise.
    pub(super) fn map_pmem_saved(&mut self, saved: &[PmemState]) -> Result<(), VmError> {
        let keep = self.pmem.len() == saved.len()
            && self.pmem.iter().zip(saved).all(|(d, s)| same_image(d, s));
        if keep {
            return Ok(());
        }
        // Old slots go first (their drop deletes them): a new mapping may
        // take the same guest range.
        self.drop_pmem()?;
        if saved.is_empty() {
            return Ok(());
        }
        self.require_readonly_mem()?;
        let ranges: Vec<_> = saved.iter().map(PmemState::range).collect();
        ::pmem::check_placement(&ram_ranges(self.config.mem_bytes()), &ranges)
            .map_err(PmemError::from)?;
        for st in saved {
            let m = PmemMapping::restore(st).map_err(PmemError::from)?;
            self.register_pmem(m)?;
        }
        Ok(())
    }

    /// Removes every pmem slot and mapping.
    pub(super) fn drop_pmem(&mut self) -> Result<(), VmError> {
        let mut first = None;
        for d in self.pmem.drain(..) {
            if let Err(e) = d.mapping.close() {
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(PmemError::from(e).into()),
            None => Ok(()),
        }
    }

    fn require_readonly_mem(&self) -> Result<(), VmError> {
        if self.vm_fd.check_extension(kvm_ioctls::Cap::ReadonlyMem) {
            Ok(())
        } else {
            Err(PmemError::NoReadonlyMem.into())
        }
    }

    /// Registers `m` as the next read-only slot and installs the hook that
    /// deletes the slot before the mapping goes away.
    fn register_pmem(&mut self, mut m: PmemMapping) -> Result<(), VmError> {
        let slot = self.next_pmem_slot()?;
        let reg = m.region();
        // SAFETY: F_DUPFD_CLOEXEC on our own open VM fd; the result is
        // checked and owned below.
        let fd = unsafe { libc::fcntl(self.vm_fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(PmemError::Dup(std::io::Error::last_os_error()).into());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let vm = unsafe { OwnedFd::from_raw_fd(fd) };
        let region = kvm_userspace_memory_region {
            slot,
            flags: KVM_MEM_READONLY,
            guest_phys_addr: reg.guest_addr,
            memory_size: reg.len,
            userspace_addr: reg.host_addr,
        };
        // SAFETY: the host range is the image mapping owned by `m`, which
        // stays mapped until its before-unmap hook (installed next, before
        // anything can drop `m`) has deleted this slot.
        unsafe { self.vm_fd.set_user_memory_region(region) }.map_err(|source| PmemError::Slot {
            path: m.path().to_path_buf(),
            slot,
            source,
        })?;
        m.set_before_unmap(move |r| delete_slot(&vm, slot, r));
        self.pmem.push(PmemDev {
            mapping: m,
            slot,
            writes: Arc::default(),
        });
        Ok(())
    }

    /// The pmem devices for the MMIO bus: a virtio device per mapping, and
    /// a write sink over each guest range. Called by `attach_devices`.
    pub(super) fn pmem_devices(&self) -> Result<Vec<PmemBusParts>, VmError> {
        if self.pmem.len() != self.config.pmem.len() {
            return Err(PmemError::Mismatch(format!(
                "{} mapped, {} configured",
                self.pmem.len(),
                self.config.pmem.len()
            ))
            .into());
        }
        Ok(self
            .pmem
            .iter()
            .enumerate()
            .map(|(index, d)| {
                let r = d.mapping.region();
                let sink: Arc<Mutex<dyn BusDevice>> = Arc::new(Mutex::new(WriteSink {
                    index,
                    path: d.mapping.path().to_path_buf(),
                    guest_addr: r.guest_addr,
                    writes: d.writes.clone(),
                }));
                PmemBusParts {
                    device: ::pmem::Pmem::from_mapping(&d.mapping),
                    sink,
                    base: r.guest_addr,
                    len: r.len,
                }
            })
            .collect())
    }

    /// Saved state of every pmem device, in order.
    pub(super) fn save_pmem(&self) -> Result<Vec<PmemState>, VmError> {
        self.pmem
            .iter()
            .map(|d| {
                ::pmem::Pmem::from_mapping(&d.mapping)
                    .save()
                    .map_err(|e| PmemError::from(e).into())
            })
            .collect()
    }

    /// The VM's pmem devices.
    pub fn pmem_info(&self) -> Vec<PmemInfo> {
        self.pmem
            .iter()
            .map(|d| {
                let r = d.mapping.region();
                PmemInfo {
                    path: d.mapping.path().to_path_buf(),
                    guest_addr: r.guest_addr,
                    len: r.len,
                    slot: d.slot,
                    host_addr: r.host_addr,
                    guest_writes: d.writes.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Guest writes dropped by all pmem devices.
    pub(super) fn pmem_guest_writes(&self) -> u64 {
        self.pmem
            .iter()
            .map(|d| d.writes.load(Ordering::Relaxed))
            .sum()
    }
}

/// Checks the saved pmem devices against the snapshot's configuration.
pub(super) fn check_saved(cfg_paths: &[&Path], saved: &[PmemState]) -> Result<(), PmemError> {
    if cfg_paths.len() != saved.len() {
        return Err(PmemError::Mismatch(format!(
            "{} saved, {} configured",
            saved.len(),
            cfg_paths.len()
        )));
    }
    for (i, (p, s)) in cfg_paths.iter().zip(saved).enumerate() {
        if *p != s.path.as_path() {
            return Err(PmemError::Mismatch(format!(
                "device {i} is {} in the state but {} in the configuration",
                s.path.display(),
                p.display()
            )));
        }
    }
    Ok(())
}

/// The image of one pmem device, read-only: a duplicate of its inherited
/// descriptor (`fd`; `path` only names it), or `path` opened without
/// following a final symbolic link.
fn open_image(c: &crate::config::PmemConfig) -> Result<File, ::pmem::ImageError> {
    let io = |what: &'static str| {
        let path = c.path.clone();
        move |source| ::pmem::ImageError::Io { path, what, source }
    };
    match c.fd {
        Some(fd) => {
            // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor of an
            // inherited one (or fails); no memory is passed.
            let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if dup < 0 {
                return Err(io("cannot use the inherited descriptor")(
                    std::io::Error::last_os_error(),
                ));
            }
            // SAFETY: a new descriptor owned by nothing else.
            Ok(unsafe { File::from_raw_fd(dup) })
        }
        None => std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&c.path)
            .map_err(io("cannot open")),
    }
}
