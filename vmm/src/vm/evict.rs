//! Cold-memory eviction: pushing an idle guest's private pages out of host
//! RAM (the `evict` control request).
//!
//! Guest RAM is private to the VMM: anonymous (a booted VM) or `MAP_PRIVATE`
//! over its template's memory file (a clone), where only the pages written
//! since the restore (copy-on-write, anonymous) cost this VM host memory;
//! the clean ones are the template's page cache, shared.
//!
//! Two ways out, chosen per pass by what the host has ([`host_mode`]):
//! - **pageout** (the host has swap or zswap): `madvise(MADV_PAGEOUT)` on
//!   the private pages; the kernel writes them to swap.
//! - **file** (no swap, as on the development hosts, where `MADV_PAGEOUT`
//!   cannot move an anonymous page anywhere): the private pages are written
//!   to a sandbox-owned sparse file (unnamed, `O_TMPFILE`, in the directory
//!   the request names; same offsets as the snapshot's `memory` file), which
//!   is synced, and the ranges are mapped `MAP_FIXED | MAP_PRIVATE` from it.
//!   The guest reads the same bytes (KVM follows the new mapping through
//!   its MMU notifier); the file's page cache is dropped afterwards, so the
//!   pages cost no host RAM until touched again (a read brings one page of
//!   page cache back, a write a private copy).
//!
//! Runs of private pages are coalesced over short gaps so the mapping
//! count stays bounded (each `mmap` can add two VMAs under
//! `vm.max_map_count`): a gap page the file can stand for costs nothing (a
//! page already mapped from the file at its own offset, or an untouched
//! anonymous page: a hole reads zeros), a page of the template is copied
//! into the file (at most [`COPY_GAP`] pages per gap). Past a budget of
//! mappings ([`MAPPING_BUDGET`]) the rest is left resident and counted.
//!
//! The vCPUs are paused and the event thread held during a pass, so no
//! guest or device write can fall between a page's copy and its re-mapping.
//! Pages mapped from the eviction file are written pages as far as diff
//! snapshots go (`diff` counts them, whatever pagemap says); a full
//! snapshot reads them through the mapping; a reload into the VM re-maps
//! all guest RAM and empties the file.

use super::maps::{in_spans, mapping_spans, FileId};
use super::VmError;
pub use crate::evict_mode::{host_mode, Mode};
use devices::virtio::balloon::release::{Backing, MappedRegions};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::PoisonError;
use std::time::Duration;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

const PAGE_BYTES: usize = 4096;
const PAGE: u64 = PAGE_BYTES as u64;
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;
const PM_FILE_OR_SHARED: u64 = 1 << 61;

/// Longest gap (pages) a run of evicted pages is carried over.
pub(super) const MAX_GAP: u64 = 512;
/// Most template pages copied into the file to bridge one gap.
pub(super) const COPY_GAP: u64 = 16;
/// Most mappings made from the eviction file over the VM's life (each
/// may add two VMAs; the balloon's own budget is 16384 replacements).
pub(super) const MAPPING_BUDGET: u64 = 8192;

/// Filesystems whose pages are RAM: a file there frees nothing.
const RAM_FS: [i64; 2] = [0x0102_1994 /* tmpfs */, 0x8584_58f6 /* ramfs */];

/// The eviction file of a VM.
struct EvictFile {
    file: File,
    /// `major:minor` of its device as `/proc/self/maps` writes it, and
    /// its inode.
    id: FileId,
    /// Pages written at least once (not holes).
    written: Vec<u64>,
}

/// One VM's eviction state.
#[derive(Default)]
pub(super) struct Evictor {
    file: Option<EvictFile>,
    mappings: u64,
    total_pages: u64,
    total_faulted_back: u64,
    passes: u64,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Pass {
    pub pages: u64,
    pub written_bytes: u64,
    pub mappings: u64,
    pub skipped_pages: u64,
    pub faulted_back_pages: u64,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmError {
    let what = what.into();
    move |source| VmError::Io { what, source }
}

/// How a guest page is held now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Private to this VM (written since mapped, or swapped): evicted.
    Private,
    /// Mapped from the eviction file at its own offset and not private:
    /// re-mapping it changes nothing.
    FromFile,
    /// [`Class::FromFile`], in RAM (read since): dropped again, as the
    /// file holds its bytes.
    FromFileResident,
    /// Anonymous and not present: reads zeros.
    Zero,
    /// A page of another file (the template, the kernel image).
    Other,
}

/// Every page of `mem` in memory-file order, classified, and how many of
/// the pages mapped from the eviction file are in RAM again (read or
/// written since they were evicted).
fn classify(mem: &GuestMemoryMmap, id: Option<&FileId>) -> Result<(Vec<Class>, u64), VmError> {
    let (anon, from_file) = mapping_spans(id)?;
    let pm = File::open("/proc/self/pagemap").map_err(io("/proc/self/pagemap"))?;
    let mut out = Vec::new();
    let mut back = 0u64;
    let mut buf = vec![0u8; 8 * 4096];
    for r in mem.iter() {
        let pages = r.len() / PAGE;
        let first = r.as_ptr() as u64 / PAGE;
        let mut done = 0u64;
        while done < pages {
            let cap = buf.len() / 8;
            let n = usize::try_from(pages - done).map_or(cap, |left| left.min(cap));
            let bytes = &mut buf[..n * 8];
            pm.read_exact_at(bytes, (first + done) * 8)
                .map_err(io("reading /proc/self/pagemap"))?;
            for (i, e) in bytes.chunks_exact(8).enumerate() {
                let v = u64::from_le_bytes(e.try_into().unwrap_or_default());
                let host = (first + done + i as u64) * PAGE;
                let present = v & PM_PRESENT != 0;
                back += u64::from(present && in_spans(&from_file, host));
                out.push(
                    if (present && v & PM_FILE_OR_SHARED == 0) || v & PM_SWAPPED != 0 {
                        Class::Private
                    } else if in_spans(&from_file, host) && present {
                        Class::FromFileResident
                    } else if in_spans(&from_file, host) {
                        Class::FromFile
                    } else if in_spans(&anon, host) {
                        Class::Zero
                    } else {
                        Class::Other
                    },
                );
            }
            done += n as u64;
        }
    }
    Ok((out, back))
}

/// Runs `[start, end)` of memory-file pages to evict, within `bounds`
/// (each region's page range), carried over gaps the file can stand for
/// (at most [`MAX_GAP`] pages, [`COPY_GAP`] of them copied).
fn runs(classes: &[Class], bounds: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(lo, hi) in bounds {
        let mut run: Option<(u64, u64)> = None;
        let (mut gap, mut copied) = (0u64, 0u64);
        for p in lo..hi {
            match class_at(classes, p) {
                Class::Private => {
                    run = match run {
                        Some((s, _)) => Some((s, p + 1)),
                        None => Some((p, p + 1)),
                    };
                    gap = 0;
                    copied = 0;
                }
                c => {
                    if run.is_none() {
                        continue;
                    }
                    gap += 1;
                    copied += u64::from(c == Class::Other);
                    if gap > MAX_GAP || copied > COPY_GAP {
                        out.extend(run.take());
                        gap = 0;
                        copied = 0;
                    }
                }
            }
        }
        out.extend(run);
    }
    out
}

/// `p` as an index (out of range of any slice where it does not fit).
fn idx(p: u64) -> usize {
    usize::try_from(p).unwrap_or(usize::MAX)
}

/// The class of page `p` (`Other` past the end).
fn class_at(classes: &[Class], p: u64) -> Class {
    classes.get(idx(p)).copied().unwrap_or(Class::Other)
}

fn bit(v: &[u64], p: u64) -> bool {
    v.get(idx(p / 64)).is_some_and(|w| w & (1 << (p % 64)) != 0)
}

fn set_bit(v: &mut [u64], p: u64) {
    if let Some(w) = v.get_mut(idx(p / 64)) {
        *w |= 1 << (p % 64);
    }
}

/// Host address of memory-file page `p` and the pages left in its region.
fn host_of(mem: &GuestMemoryMmap, p: u64) -> Option<(*mut u8, u64, GuestAddress)> {
    let mut base = 0u64;
    for r in mem.iter() {
        let pages = r.len() / PAGE;
        if p < base + pages {
            let off = (p - base) * PAGE;
            // SAFETY: the offset is inside this region's mapping.
            let ptr = unsafe { r.as_ptr().add(usize::try_from(off).ok()?) };
            return Some((ptr, base + pages - p, GuestAddress(r.start_addr().0 + off)));
        }
        base += pages;
    }
    None
}

impl Evictor {
    /// Totals since the VM started: passes, pages evicted, pages found
    /// back in RAM at a later pass.
    pub fn totals(&self) -> (u64, u64, u64) {
        (self.passes, self.total_pages, self.total_faulted_back)
    }

    /// The eviction file's identity, while there is one (diff snapshots
    /// count its pages as written).
    pub fn file_id(&self) -> Option<&FileId> {
        self.file.as_ref().map(|f| &f.id)
    }

    /// Disk blocks the eviction file holds.
    pub fn file_bytes(&self) -> u64 {
        self.file
            .as_ref()
            .and_then(|f| f.file.metadata().ok())
            .map_or(0, |m| m.blocks() * 512)
    }

    /// Guest RAM was mapped anew (a reload): nothing maps the file any
    /// more, so its blocks go.
    pub fn forget_mappings(&mut self) {
        if let Some(f) = &mut self.file {
            let len = f.file.metadata().map(|m| m.len()).unwrap_or(0);
            if f.file
                .set_len(0)
                .and_then(|()| f.file.set_len(len))
                .is_err()
            {
                self.file = None;
            } else {
                f.written.iter_mut().for_each(|w| *w = 0);
            }
        }
        self.mappings = 0;
    }

    fn open(&mut self, dir: &Path, total: u64) -> Result<&mut EvictFile, VmError> {
        if self.file.is_none() {
            let what = format!("eviction file in {}", dir.display());
            let d = File::open(dir).map_err(io(what.clone()))?;
            // SAFETY: statfs fills the zeroed struct it is given; the
            // descriptor is open.
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { libc::fstatfs(d.as_raw_fd(), &mut st) } != 0 {
                return Err(io(what)(std::io::Error::last_os_error()));
            }
            #[allow(clippy::unnecessary_cast)]
            if RAM_FS.contains(&(st.f_type as i64)) {
                return Err(VmError::DeviceState(format!(
                    "{} is on tmpfs or ramfs: evicting there frees no memory",
                    dir.display()
                )));
            }
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_TMPFILE)
                .open(dir)
                .map_err(io(what.clone()))?;
            file.set_len(total).map_err(io(what.clone()))?;
            let m = file.metadata().map_err(io(what))?;
            let dev = m.dev();
            let id = FileId {
                dev: format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev)),
                ino: m.ino(),
            };
            self.file = Some(EvictFile {
                file,
                id,
                written: vec![0; idx(total.div_ceil(PAGE * 64))],
            });
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    /// One pass over `mem` (the vCPUs paused, the devices held). `dir`:
    /// where the eviction file goes (first pass only; file mode).
    pub fn evict(
        &mut self,
        mem: &GuestMemoryMmap,
        spans: &mut MappedRegions,
        dir: &Path,
        mode: Mode,
    ) -> Result<Pass, VmError> {
        let total: u64 = mem.iter().map(|r| r.len()).sum();
        let id = self.file.as_ref().map(|f| f.id.clone());
        let (classes, back) = classify(mem, id.as_ref())?;
        let mut bounds = Vec::new();
        let mut base = 0;
        for r in mem.iter() {
            bounds.push((base, base + r.len() / PAGE));
            base += r.len() / PAGE;
        }
        let mut pass = Pass {
            faulted_back_pages: back,
            ..Pass::default()
        };
        self.passes += 1;
        self.total_faulted_back += back;
        let runs = runs(&classes, &bounds);
        if mode == Mode::PageOut {
            for &(s, e) in &runs {
                for p in s..e {
                    if class_at(&classes, p) != Class::Private {
                        continue;
                    }
                    let (ptr, _, _) = host_of(mem, p).ok_or(VmError::Memory(0))?;
                    // SAFETY: one whole page of guest RAM this VM maps;
                    // paging it out keeps its contents.
                    if unsafe { libc::madvise(ptr.cast(), PAGE_BYTES, libc::MADV_PAGEOUT) } != 0 {
                        return Err(io("madvise(MADV_PAGEOUT)")(std::io::Error::last_os_error()));
                    }
                    pass.pages += 1;
                }
            }
            self.total_pages += pass.pages;
            return Ok(pass);
        }
        let budget = MAPPING_BUDGET.saturating_sub(self.mappings);
        let f = self.open(dir, total)?;
        let (taken, left) = runs.split_at(runs.len().min(idx(budget)));
        pass.skipped_pages = left
            .iter()
            .flat_map(|&(s, e)| s..e)
            .filter(|&p| class_at(&classes, p) == Class::Private)
            .count() as u64;
        let write_err = |source| VmError::Io {
            what: "writing the eviction file".into(),
            source,
        };
        for &(s, e) in taken {
            let mut p = s;
            while p < e {
                let (ptr, _, _) = host_of(mem, p).ok_or(VmError::Memory(0))?;
                let c = class_at(&classes, p);
                if matches!(c, Class::FromFile | Class::FromFileResident)
                    || (c == Class::Zero && !bit(&f.written, p))
                {
                    p += 1;
                    continue;
                }
                // SAFETY: a whole page of guest RAM; vCPUs and devices are
                // held, so it is stable while read.
                let page = unsafe { std::slice::from_raw_parts(ptr, PAGE_BYTES) };
                if page.iter().all(|&b| b == 0) && !bit(&f.written, p) {
                    // A hole already reads zeros.
                } else {
                    f.file.write_all_at(page, p * PAGE).map_err(write_err)?;
                    set_bit(&mut f.written, p);
                    pass.written_bytes += PAGE;
                }
                pass.pages += u64::from(c == Class::Private);
                p += 1;
            }
        }
        f.file.sync_data().map_err(write_err)?;
        let fd = f.file.as_raw_fd();
        for &(s, e) in taken {
            let (ptr, left, gpa) = host_of(mem, s).ok_or(VmError::Memory(0))?;
            let n = (e - s).min(left);
            let len = usize::try_from(n * PAGE).map_err(|_| VmError::Memory(0))?;
            let off = libc::off_t::try_from(s * PAGE).map_err(|_| VmError::Memory(0))?;
            // SAFETY: `ptr..ptr + len` is guest RAM inside one region this
            // VM maps (runs never cross a region); the file holds exactly
            // what the guest had there (written and synced above, while
            // nothing can write guest memory), so MAP_FIXED swaps the
            // backing without changing what the guest reads. KVM's MMU
            // notifier drops its translations of the old pages.
            let p = unsafe {
                libc::mmap(
                    ptr.cast(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    fd,
                    off,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io("mmap of the eviction file")(
                    std::io::Error::last_os_error(),
                ));
            }
            pass.mappings += 1;
            // The balloon gives these back by mapping fresh memory over
            // them (MADV_DONTNEED would bring the file's bytes back).
            spans.add(gpa, n * PAGE, Backing::PrivateFile);
        }
        // Pages read back from the file since an earlier pass, outside
        // this pass's runs: dropped (the file holds their bytes).
        let mut p = 0u64;
        while p < classes.len() as u64 {
            if class_at(&classes, p) != Class::FromFileResident
                || taken.iter().any(|&(s, e)| (s..e).contains(&p))
            {
                p += 1;
                continue;
            }
            let (ptr, left, _) = host_of(mem, p).ok_or(VmError::Memory(0))?;
            let mut n = 1;
            while n < left && class_at(&classes, p + n) == Class::FromFileResident {
                n += 1;
            }
            let len = usize::try_from(n * PAGE).map_err(|_| VmError::Memory(0))?;
            // SAFETY: guest RAM inside one region, mapped privately from the
            // eviction file and not written since (not private): dropping
            // the pages makes the next touch read the same bytes from the
            // file.
            if unsafe { libc::madvise(ptr.cast(), len, libc::MADV_DONTNEED) } != 0 {
                return Err(io("madvise(MADV_DONTNEED)")(std::io::Error::last_os_error()));
            }
            p += n;
        }
        // The written pages are on disk: their page cache can go.
        // SAFETY: plain advice on an open descriptor.
        unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
        self.mappings += pass.mappings;
        self.total_pages += pass.pages;
        Ok(pass)
    }
}

impl super::Vm {
    /// The `evict` control request, the vCPUs paused: holds the devices,
    /// evicts, reports.
    pub(super) fn evict_request(
        &mut self,
        dir: &Path,
        t0: std::time::Instant,
    ) -> Result<vmm_api::EvictInfo, String> {
        if !dir.is_absolute() {
            return Err(format!("evict: {} is not an absolute path", dir.display()));
        }
        let mode = host_mode();
        let held = match &self.events {
            Some(t) => Some(
                t.hold(Duration::from_secs(5), Duration::from_secs(60))
                    .map_err(|e| format!("evict: {e}"))?,
            ),
            None => None,
        };
        let mut spans = self
            .ram_spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let res = self.evictor.evict(&self.mem, &mut spans, dir, mode);
        drop(spans);
        drop(held);
        let held_ms = t0.elapsed().as_secs_f64() * 1e3;
        let pass = res.map_err(|e| format!("evict: {e}"))?;
        let (total_passes, total_pages, total_faulted_back_pages) = self.evictor.totals();
        Ok(vmm_api::EvictInfo {
            mode: mode.as_str().into(),
            pages: pass.pages,
            written_bytes: pass.written_bytes,
            mappings: pass.mappings,
            skipped_pages: pass.skipped_pages,
            faulted_back_pages: pass.faulted_back_pages,
            held_ms,
            total_passes,
            total_pages,
            total_faulted_back_pages,
            file_bytes: self.evictor.file_bytes(),
        })
    }
}

#[cfg(test)]
#[path = "evict_tests.rs"]
mod tests;
