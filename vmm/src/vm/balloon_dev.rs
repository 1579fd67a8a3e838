//! The VM's virtio-balloon device: how guest RAM is mapped (so pages the
//! guest gives back are dropped the right way), the balloon's state file
//! beside a snapshot, and the control request.
//!
//! Guest RAM is private to this process, mapped one of two ways: anonymous
//! (a booted VM, a pre-warmed one before its first restore) or
//! `MAP_PRIVATE` over a snapshot's `memory` file (a restored VM). A booted
//! VM also has its kernel image mapped from the vmlinux file over part of
//! its RAM ([`crate::kernel_map`]). `MADV_DONTNEED` on a private file
//! mapping would bring the file's old bytes back, so those ranges are
//! given back by mapping fresh anonymous memory over them
//! ([`Backing::PrivateFile`]); the rest with `MADV_DONTNEED`. The spans
//! are shared with the device and updated when the memory is mapped anew.
//!
//! The balloon's own state (target, actual, latest stats, counters) is
//! kept in a `balloon` file in the snapshot directory, written through the
//! snapshot container like `state`; its queues are in `state` with the
//! other transports. A snapshot without that file (or a VM without a
//! balloon) restores as before: the format and layout of `state` do not
//! change.

use super::{Vm, VmError};
use crate::layout::HIGH_RAM_START;
use devices::virtio::balloon::release::{Backing, MappedRegions};
use devices::virtio::balloon::{Balloon, BalloonEvents, BalloonState, BalloonStats, PAGE_SIZE};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// The balloon's state file in a snapshot directory.
pub(super) const STATE_FILE: &str = "balloon";

/// Pages per MiB.
const PAGES_PER_MIB: u64 = (1 << 20) / PAGE_SIZE;

/// Spans of `mem`, all mapped as `backing`.
pub(super) fn spans(mem: &GuestMemoryMmap, backing: Backing) -> MappedRegions {
    let mut m = MappedRegions::new();
    for r in mem.iter() {
        m.add(r.start_addr(), r.len(), backing);
    }
    m
}

fn lock(m: &Mutex<MappedRegions>) -> std::sync::MutexGuard<'_, MappedRegions> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Vm {
    /// Guest RAM is anonymous but for `[HIGH_RAM_START, kernel_end)`, where
    /// the kernel image may be mapped from its file (a booted VM).
    pub(super) fn ram_booted(&self, kernel_end: u64) {
        let mut m = spans(&self.mem, Backing::Anonymous);
        if let Some(len) = kernel_end.checked_sub(HIGH_RAM_START) {
            m.add(GuestAddress(HIGH_RAM_START), len, Backing::PrivateFile);
        }
        *lock(&self.ram_spans) = m;
    }

    /// All of guest RAM is mapped privately from a snapshot's memory file
    /// (a restore, a reload into a pre-warmed VM).
    pub(super) fn ram_from_snapshot(&self) {
        *lock(&self.ram_spans) = spans(&self.mem, Backing::PrivateFile);
    }

    /// A balloon device for this VM's memory, if the configuration has
    /// one, with its stats timer for the event thread if it asks for one.
    pub(super) fn balloon_device(
        &mut self,
    ) -> Result<Option<(Balloon, Option<BalloonEvents>)>, VmError> {
        let Some(cfg) = self.config.balloon else {
            return Ok(None);
        };
        let dev = Balloon::new(&cfg, &self.mem, Box::new(self.ram_spans.clone()));
        let h = dev.handle();
        let timer = match cfg.stats_interval_s {
            0 => None,
            s => Some(
                h.stats_timer(Duration::from_secs(u64::from(s)))
                    .map_err(|source| VmError::Io {
                        what: "balloon stats timer".into(),
                        source,
                    })?,
            ),
        };
        self.balloon = Some(h);
        Ok(Some((dev, timer)))
    }

    /// Writes the balloon's state beside a snapshot in `dir` (nothing
    /// without a balloon; an older file there is removed).
    pub(super) fn save_balloon(&self, dir: &Path) -> Result<(), VmError> {
        let path = dir.join(STATE_FILE);
        match &self.balloon {
            Some(b) => snapshot::save(&path, &b.save())?,
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
        Ok(())
    }

    /// Loads the balloon's state from the snapshot in `dir` into the
    /// restored device, if both exist (the device's queues came with the
    /// transports).
    pub(super) fn load_balloon(&self, dir: &Path) -> Result<(), VmError> {
        let path = dir.join(STATE_FILE);
        let Some(b) = &self.balloon else {
            return Ok(());
        };
        if !path.is_file() {
            return Ok(());
        }
        let st: BalloonState = snapshot::load(&path)?;
        b.load(&st)
            .map_err(|e| VmError::DeviceState(format!("balloon: {e}")))
    }

    /// The `balloon` control request: sets the target if given, asks the
    /// guest for new stats, and reports.
    pub(super) fn balloon_request(
        &self,
        target_mib: Option<u64>,
    ) -> Result<vmm_api::BalloonInfo, String> {
        let b = self
            .balloon
            .as_ref()
            .ok_or("this VM has no balloon device (--balloon)")?;
        if let Some(mib) = target_mib {
            let pages = mib
                .checked_mul(PAGES_PER_MIB)
                .ok_or_else(|| format!("balloon target {mib} MiB is too large"))?;
            b.set_target(pages).map_err(|e| e.to_string())?;
        }
        b.request_stats();
        let c = b.counters();
        Ok(vmm_api::BalloonInfo {
            target_mib: u64::from(b.target()) / PAGES_PER_MIB,
            actual_mib: u64::from(b.actual()) / PAGES_PER_MIB,
            stats: wire_stats(&b.stats()),
            inflated_pages: c.inflated_pages,
            deflated_pages: c.deflated_pages,
            reported_bytes: c.reported_bytes,
            refused: c.refused_pfns
                + c.refused_chains
                + c.refused_reports
                + c.refused_actual
                + c.stats_malformed,
            give_back_errors: c.give_back_errors,
        })
    }
}

fn wire_stats(s: &BalloonStats) -> vmm_api::GuestMemoryStats {
    vmm_api::GuestMemoryStats {
        swap_in: s.swap_in,
        swap_out: s.swap_out,
        major_faults: s.major_faults,
        minor_faults: s.minor_faults,
        free_memory: s.free_memory,
        total_memory: s.total_memory,
        available_memory: s.available_memory,
        disk_caches: s.disk_caches,
        oom_kills: s.oom_kills,
    }
}

/// The shared spans a new VM starts with: anonymous RAM.
pub(super) fn anonymous_spans(mem: &GuestMemoryMmap) -> Arc<Mutex<MappedRegions>> {
    Arc::new(Mutex::new(spans(mem, Backing::Anonymous)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::virtio::balloon::{GiveBack, PageRange};
    use vm_memory::Bytes;

    #[test]
    fn a_booted_vm_drops_kernel_pages_as_file_backed_and_the_rest_as_anonymous() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
        let mut m = spans(&mem, Backing::Anonymous);
        m.add(GuestAddress(HIGH_RAM_START), 1 << 20, Backing::PrivateFile);
        mem.write_slice(&[7u8; 8192], GuestAddress(HIGH_RAM_START - 4096))
            .unwrap();
        // Over the boundary: one anonymous page, one replaced.
        m.give_back(
            &mem,
            PageRange {
                addr: HIGH_RAM_START - 4096,
                len: 8192,
            },
        )
        .unwrap();
        let mut b = [1u8; 8192];
        mem.read_slice(&mut b, GuestAddress(HIGH_RAM_START - 4096))
            .unwrap();
        assert!(b.iter().all(|&x| x == 0));
    }
}
