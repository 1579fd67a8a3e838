//! Diff snapshots: only the guest pages that differ from the snapshot the
//! VM was restored from.
//!
//! A restored VM's memory is the base snapshot's `memory` file mapped
//! `MAP_PRIVATE`; every page anyone wrote since (the guest through KVM, or
//! a device through the VMM) became a private anonymous page of that
//! mapping. `/proc/self/pagemap` tells those apart from untouched or only
//! read pages (file pages), so the diff is exact without dirty logging and
//! includes device writes that KVM's dirty log would miss. A diff snapshot
//! stores those pages in `memory.diff` (a sparse file, same offsets as
//! `memory`) and names its base; restoring maps the base and reads the
//! diff pages over it.
//!
//! Pages the balloon gave back are the exception pagemap cannot see: the
//! VMM mapped fresh anonymous memory over them (so they read zeros), and
//! until touched again they are not present, like an untouched file page.
//! Every page inside an anonymous mapping of guest RAM (found in
//! `/proc/self/maps`) therefore counts as written too; an all-zero page
//! is left a hole in `memory.diff` (it reads zeros), and the restore reads
//! it over the base, so the restored guest sees zeros there, not the base
//! snapshot's bytes. Pages mapped from the eviction file (`evict`) are
//! counted the same way: their bytes are this VM's, not the base's.

use super::maps::{in_spans, mapping_spans, FileId};
use super::VmError;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

const PAGE_BYTES: usize = 4096;
const PAGE: u64 = PAGE_BYTES as u64;
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;
const PM_FILE_OR_SHARED: u64 = 1 << 61;

fn io(what: String) -> impl FnOnce(std::io::Error) -> VmError {
    move |source| VmError::Io { what, source }
}

/// Page numbers (in memory-file order) that are private to this process:
/// written since the mapping was made, or given back by the balloon (an
/// anonymous mapping over the file's), or evicted (mapped from the
/// eviction file `evicted`, whose pages are no part of the base).
pub(super) fn private_pages(
    mem: &GuestMemoryMmap,
    evicted: Option<&FileId>,
) -> Result<Vec<u64>, VmError> {
    let (anon, from_file) = mapping_spans(evicted)?;
    let pm = File::open("/proc/self/pagemap").map_err(io("/proc/self/pagemap".into()))?;
    let mut out = Vec::new();
    let mut file_page = 0u64;
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
                .map_err(io("reading /proc/self/pagemap".into()))?;
            for (i, e) in bytes.chunks_exact(8).enumerate() {
                let v = u64::from_le_bytes(e.try_into().unwrap_or_default());
                let host = (first + done + i as u64) * PAGE;
                let written = (v & PM_PRESENT != 0 && v & PM_FILE_OR_SHARED == 0)
                    || v & PM_SWAPPED != 0
                    || in_spans(&anon, host)
                    || in_spans(&from_file, host);
                if written {
                    out.push(file_page + done + i as u64);
                }
            }
            done += n as u64;
        }
        file_page += pages;
    }
    Ok(out)
}

/// Host address of memory-file page `page`.
fn host_addr(mem: &GuestMemoryMmap, page: u64) -> Option<*mut u8> {
    let mut base = 0u64;
    for r in mem.iter() {
        let pages = r.len() / PAGE;
        if page < base + pages {
            let off = usize::try_from((page - base) * PAGE).ok()?;
            // SAFETY: the offset is inside this region's mapping.
            return Some(unsafe { r.as_ptr().add(off) });
        }
        base += pages;
    }
    None
}

/// Writes `pages` of guest memory to `path` at their file offsets.
pub(super) fn write_diff(
    mem: &GuestMemoryMmap,
    pages: &[u64],
    path: &Path,
    total: u64,
) -> Result<(), VmError> {
    let f = File::create(path).map_err(io(format!("cannot create {}", path.display())))?;
    f.set_len(total)
        .map_err(io(format!("cannot size {}", path.display())))?;
    for &p in pages {
        let ptr = host_addr(mem, p)
            .ok_or_else(|| VmError::DeviceState(format!("page {p} outside guest memory")))?;
        // SAFETY: `ptr` points at a whole mapped guest page (host_addr
        // checked the region); the vCPUs are paused, so it is stable.
        let page = unsafe { std::slice::from_raw_parts(ptr, PAGE_BYTES) };
        if page.iter().all(|&b| b == 0) {
            // A hole reads zeros (the file was sized, not written).
            continue;
        }
        f.write_all_at(page, p * PAGE)
            .map_err(io(format!("cannot write {}", path.display())))?;
    }
    f.sync_all()
        .map_err(io(format!("cannot write {}", path.display())))
}

/// Reads `pages` from the diff file at `path` over guest memory (which
/// maps the base snapshot). Every page number is checked.
pub(super) fn apply_diff(mem: &GuestMemoryMmap, pages: &[u64], path: &Path) -> Result<(), VmError> {
    let f = File::open(path).map_err(io(format!("cannot open {}", path.display())))?;
    let len = f
        .metadata()
        .map_err(io(format!("cannot open {}", path.display())))?
        .len();
    for &p in pages {
        let ptr = host_addr(mem, p).ok_or_else(|| {
            VmError::DeviceState(format!("diff page {p} is outside guest memory"))
        })?;
        if (p + 1) * PAGE > len {
            return Err(VmError::DeviceState(format!(
                "{} is truncated (page {p})",
                path.display()
            )));
        }
        // SAFETY: `ptr` is a whole mapped guest page; no vCPU runs yet.
        let page = unsafe { std::slice::from_raw_parts_mut(ptr, PAGE_BYTES) };
        f.read_exact_at(page, p * PAGE)
            .map_err(io(format!("cannot read {}", path.display())))?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;
