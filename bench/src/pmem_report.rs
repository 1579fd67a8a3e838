//! The report of `shoal bench pmem` (see [`super::pmem`]).

use super::{table, Row};
use serde::Serialize;

/// Host memory of N live VMs after their reads, for one root kind.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// "pmem" or "blk".
    pub root: String,
    /// VMs alive at the measurement.
    pub vms: usize,
    /// VMs whose read failed (they still count in the memory figures).
    pub read_errors: usize,
    /// Sum of the VMMs' `Pss_Anon` + `Pss_Shmem` (KiB).
    pub vmm_private_kib: u64,
    /// Sum of the VMMs' whole PSS (KiB), for reference (includes their
    /// share of mapped page-cache pages).
    pub vmm_pss_kib: u64,
    /// Growth of the host page cache from before the first restore (KiB):
    /// pages of the template memory file and the image (both evicted
    /// first) resident at the measurement.
    pub page_cache_growth_kib: i64,
    /// Growth of `Cached` in `/proc/meminfo` over the same interval (KiB):
    /// whole-host, so it includes anything else the host did meanwhile.
    pub host_cached_growth_kib: i64,
    /// `vmm_private_kib + page_cache_growth_kib`: the host memory the VMs
    /// cost at the peak (KiB).
    pub host_total_kib: i64,
    /// `host_total_kib / vms`.
    pub host_per_vm_kib: f64,
    /// Drop of `MemAvailable` over the same interval (KiB): includes the
    /// kernel's own per-VM memory (KVM, page tables), and any noise.
    pub mem_available_drop_kib: i64,
    /// Guest time of the reads, per VM (ms): min, median, p99, max.
    pub read_ms: Option<crate::stats::Summary>,
    /// The samples behind `read_ms` (figures only).
    #[serde(skip)]
    pub read_samples: Vec<f64>,
}

/// Host disk bytes one VM costs for a write workload.
#[derive(Debug, Clone, Serialize)]
pub struct WriteRow {
    /// "pmem" (tmpfs upper) or "blk-ext4-rw" (a writable per-VM copy).
    pub root: String,
    /// Bytes the guest wrote (and synced).
    pub guest_bytes: u64,
    /// VMs measured.
    pub vms: usize,
    /// Bytes written to make the VM's private root copy (mean).
    pub copy_bytes: f64,
    /// Bytes the VMM process wrote to storage (`write_bytes`, mean).
    pub vmm_write_bytes: f64,
    /// `copy_bytes + vmm_write_bytes`.
    pub host_bytes_per_vm: f64,
    /// Guest time of the write (ms, mean).
    pub write_ms: f64,
}

/// The JSON report.
#[derive(Debug, Serialize)]
pub struct PmemReport {
    /// Always "pmem".
    pub bench: &'static str,
    /// "pvm" or "hardware".
    pub host_kvm: &'static str,
    /// Always "MiB" (rows).
    pub unit: &'static str,
    /// Host memory per VM and VMM PSS per VM, per root kind and VM count.
    pub rows: Vec<Row>,
    /// The benchmark image's size (bytes).
    pub image_bytes: u64,
    /// Bytes each guest read.
    pub read_bytes: u64,
    /// Files they were in.
    pub read_files: usize,
    /// Guest RAM the guest kernel spends on `struct page`s for the pmem
    /// device: image size / 64 (bytes).
    pub pmem_guest_memmap_bytes: u64,
    /// Guest memory of each VM (MiB).
    pub memory_mib: u32,
    /// Memory measurements.
    pub memory: Vec<MemoryRow>,
    /// Disk-write measurements.
    pub writes: Vec<WriteRow>,
    /// Per VM count: how much less host memory pmem took than virtio-blk
    /// (percent of the blk figure; goal: >= 50 at 200 VMs).
    pub host_memory_reduction_pct: Vec<(usize, f64)>,
    /// How many fewer host disk bytes per VM the tmpfs upper layer cost than
    /// a writable per-VM root copy (percent; goal: >= 90).
    pub disk_write_reduction_pct: Option<f64>,
}

/// `100 * (1 - ours / theirs)`.
pub(super) fn reduction_pct(ours: f64, theirs: f64) -> f64 {
    if theirs > 0.0 {
        100.0 * (1.0 - ours / theirs)
    } else {
        0.0
    }
}

pub(super) fn mib(kib: f64) -> f64 {
    kib / 1024.0
}

impl PmemReport {
    /// Human-readable summary.
    pub fn render(&self) -> String {
        let mut s = format!(
            "pmem benchmark, host KVM: {}; image {:.1} MiB, each guest reads {:.1} MB in {} files\n",
            self.host_kvm,
            self.image_bytes as f64 / 1048576.0,
            self.read_bytes as f64 / 1e6,
            self.read_files
        );
        s.push_str(&table(&self.rows, self.unit));
        s.push_str(&format!(
            "{:<6} {:>5} {:>12} {:>14} {:>14} {:>12} {:>14} {:>12}\n",
            "ROOT",
            "VMS",
            "HOST MiB",
            "MiB/VM",
            "VMM PRIV MiB",
            "CACHE MiB",
            "MEMAVAIL MiB",
            "READ ms"
        ));
        for m in &self.memory {
            s.push_str(&format!(
                "{:<6} {:>5} {:>12.1} {:>14.2} {:>14.1} {:>+12.1} {:>14.1} {:>12}\n",
                m.root,
                m.vms,
                mib(m.host_total_kib as f64),
                mib(m.host_per_vm_kib),
                mib(m.vmm_private_kib as f64),
                mib(m.page_cache_growth_kib as f64),
                mib(m.mem_available_drop_kib as f64),
                m.read_ms
                    .as_ref()
                    .map_or("-".into(), |r| format!("{:.0}", r.median)),
            ));
            if m.read_errors > 0 {
                s.push_str(&format!("       ({} reads failed)\n", m.read_errors));
            }
        }
        for (n, pct) in &self.host_memory_reduction_pct {
            s.push_str(&format!(
                "host memory at {n} VMs: pmem {pct:.1}% less than blk (goal >= 50% at 200)\n"
            ));
        }
        s.push_str(&format!(
            "pmem guest page metadata (struct pages, 1/64 of the image): {:.2} MiB per VM\n",
            self.pmem_guest_memmap_bytes as f64 / 1048576.0
        ));
        for w in &self.writes {
            s.push_str(&format!(
                "guest writes {:.0} MB, root {:<12}: host disk {:.1} MB per VM (root copy {:.1} MB + VMM writes {:.1} MB), guest {:.0} ms\n",
                w.guest_bytes as f64 / 1e6,
                w.root,
                w.host_bytes_per_vm / 1e6,
                w.copy_bytes / 1e6,
                w.vmm_write_bytes / 1e6,
                w.write_ms
            ));
        }
        if let Some(pct) = self.disk_write_reduction_pct {
            s.push_str(&format!(
                "host disk writes per VM: pmem {pct:.1}% fewer than a writable root copy (goal >= 90%)\n"
            ));
        }
        s
    }
}
