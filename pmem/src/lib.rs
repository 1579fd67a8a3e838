//! virtio-pmem for Shoal: read-only, DAX-capable images shared between VMs.
//!
//! An image file is mapped `MAP_SHARED`/`PROT_READ` from a read-only fd
//! ([`PmemMapping`]) and given to the guest as a read-only KVM memory slot
//! at a guest-physical address above RAM ([`place`]). The guest's
//! `virtio_pmem` driver learns that address and size from the device's
//! config space ([`Pmem`], virtio type 27) and exposes `/dev/pmemN`; with
//! DAX the guest reads the host's page cache directly, so every VM using the
//! same image shares one copy of it in host memory.
//!
//! # Wiring into a VMM
//!
//! ```text
//! let sizes = images.iter().map(|p| pmem::check_image(p).map(|i| i.len)).collect()?;
//! let ranges = pmem::place(&layout::ram_ranges(mem_bytes), &sizes)?;
//! for (path, r) in images.iter().zip(&ranges) {
//!     let mut m = pmem::PmemMapping::open(path, r.start)?;
//!     let slot = next_slot();
//!     let reg = m.region();            // guest_addr, len, host_addr
//!     vm_fd.set_user_memory_region(slot, reg, KVM_MEM_READONLY)?;
//!     m.set_before_unmap(move |reg| remove_slot(slot, reg)); // memory_size = 0
//!     let dev = pmem::Pmem::from_mapping(&m);
//!     add_virtio(Box::new(dev));       // virtio-mmio transport
//!     keep(m);                         // dropped with, or after, the VM
//! }
//! ```
//!
//! # Guest requirements (Linux 6.1)
//!
//! Kernel: `VIRTIO_PMEM`, `LIBNVDIMM`, `BLK_DEV_PMEM`, `ZONE_DEVICE` (needs
//! `MEMORY_HOTPLUG`, `MEMORY_HOTREMOVE`, `SPARSEMEM_VMEMMAP`), `FS_DAX`, the
//! file system (`EROFS_FS`, `EXT4_FS`), **and `ND_CLAIM`**, which has no
//! prompt and is only selected by `NVDIMM_PFN=y` or `BTT=y`: without it
//! `devm_nsio_enable()` is a stub returning `-ENXIO`, `nd_pmem` silently
//! fails to probe the namespace and no `/dev/pmem0` appears (the virtio
//! device, `region0` and `namespace0.0` still do). `NVDIMM_PFN=y` with
//! `NVDIMM_DAX` unset is enough. No `memmap=` option and no ndctl: the
//! region carries `ND_REGION_PAGEMAP`, so the label-less raw namespace gets
//! `struct page`s from `devm_memremap_pages()` in guest RAM (1/64 of the
//! image size, see [`layout::guest_memmap_overhead`]) and the disk supports
//! DAX (`/sys/block/pmem0/queue/dax` reads 1). The device must be announced
//! like every virtio-mmio device (`virtio_mmio.device=4K@ADDR:IRQ`).
//!
//! Mount: `mount -t erofs -o ro,dax /dev/pmem0 /mnt` (shows `dax=always` in
//! `/proc/mounts`), or `mount -t ext4 -o ro,noload,dax /dev/pmem0 /mnt`; as
//! root file system: `root=/dev/pmem0 rootfstype=erofs ro rootflags=dax`.
//! DAX needs 4 KiB file-system blocks ([`ImageInfo::dax_capable`]). erofs in
//! 6.1 maps only `EROFS_INODE_FLAT_PLAIN` files with DAX: files stored with
//! a tail-packed (inline) last block, mkfs.erofs's default, and compressed
//! files still go through the guest page cache. Build images with
//! `mkfs.erofs -E noinline_data` and no `-z`.
//!
//! Guest writes (e.g. `dd of=/dev/pmem0`) hit the read-only slot and exit
//! to the VMM as MMIO writes, which the VMM must drop (its MMIO bus ignores
//! writes to unclaimed addresses): the guest reads the image back unchanged
//! and the host file never changes. The guest's `fsync` on the device sends
//! FLUSH requests, which succeed. (Checked on the 6.1 guest under KVM/PVM
//! with erofs; the ext4 options follow the kernel source, untested here.)
//!
//! # Modules
//!
//! [`layout`] places devices and explains the alignment; [`image`] checks
//! and pads images; [`mapping`] owns the host mapping and its teardown order;
//! [`device`] and [`request`] are the virtio device; [`persist`] and
//! [`fingerprint`] handle snapshots.

pub mod device;
pub mod fingerprint;
pub mod image;
pub mod layout;
pub mod mapping;
pub mod persist;
pub mod request;

pub use device::{Pmem, PmemMetrics, QUEUE_SIZE, TYPE_PMEM};
pub use fingerprint::{ImageChange, ImageFingerprint};
pub use image::{
    check_file, check_image, pad_image, pad_image_to, FsInfo, FsKind, ImageError, ImageInfo,
};
pub use layout::{
    check_placement, guest_memmap_overhead, place, GuestRange, LayoutError, IMAGE_ALIGN,
    PLACEMENT_ALIGN,
};
pub use mapping::{MappingError, PmemBacking, PmemMapping, SlotRegion};
pub use persist::{PmemPersistError, PmemState};
