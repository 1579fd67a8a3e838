//! The `balloon` request's reply (its wire form is in `wire`): the balloon device's target, the guest's
//! balloon size, its latest memory statistics and what it gave back.

use serde::{Deserialize, Serialize};

/// Reply to `balloon`: `{"ok":true,"balloon":{..}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BalloonInfo {
    /// The host's target: guest memory the balloon should hold, in MiB
    /// (4 KiB pages rounded down).
    pub target_mib: u64,
    /// What the guest says its balloon holds, in MiB.
    pub actual_mib: u64,
    /// The guest's latest memory statistics (from before this request: it
    /// also asks the guest for new ones).
    pub stats: GuestMemoryStats,
    /// Pages the guest inflated (given back to the host) since it booted
    /// (counters carry on through snapshots), 4 KiB each.
    pub inflated_pages: u64,
    /// Pages the guest deflated since it booted.
    pub deflated_pages: u64,
    /// Bytes the guest reported free (given back) since it booted.
    pub reported_bytes: u64,
    /// Guest input refused (PFNs, ranges, chains, `actual` values).
    pub refused: u64,
    /// Ranges the host failed to give back.
    pub give_back_errors: u64,
}

/// A guest's memory statistics (virtio-balloon stats tags); absent: the
/// guest has not sent that one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GuestMemoryStats {
    /// Bytes swapped in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_in: Option<u64>,
    /// Bytes swapped out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_out: Option<u64>,
    /// Major page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    /// Minor page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor_faults: Option<u64>,
    /// Free memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<u64>,
    /// Total memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    /// Available memory (estimate), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_memory: Option<u64>,
    /// Disk caches, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_caches: Option<u64>,
    /// OOM kills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
}

/// Reply to `evict`: `{"ok":true,"evict":{..}}`. Pages are 4 KiB.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EvictInfo {
    /// `file` (a sparse file re-mapped over guest RAM) or `pageout`
    /// (`MADV_PAGEOUT` to swap).
    pub mode: String,
    /// Private pages pushed out by this request.
    pub pages: u64,
    /// Bytes written to the eviction file by this request.
    pub written_bytes: u64,
    /// Mappings made from the file by this request.
    pub mappings: u64,
    /// Private pages left resident (the mapping budget was spent).
    pub skipped_pages: u64,
    /// Pages evicted before and found in RAM again (touched since).
    pub faulted_back_pages: u64,
    /// Milliseconds the guest was held (vCPUs paused, devices idle).
    pub held_ms: f64,
    /// Since the VM started: eviction passes, pages evicted, pages found
    /// back.
    pub total_passes: u64,
    /// See `total_passes`.
    pub total_pages: u64,
    /// See `total_passes`.
    pub total_faulted_back_pages: u64,
    /// Disk the eviction file takes now.
    pub file_bytes: u64,
}
