//! The balloon's shared state and the serving of its queues: inflate
//! (give pages back), deflate (bookkeeping), stats (hold the guest's
//! buffer until the host wants new values) and free page reporting.

use super::parse::{check_range, parse_stats, BalloonStats, Coalescer, PageRange, STATS_ENTRY_LEN};
use super::release::GiveBack;
use super::{
    MAX_PAGES_PER_NOTIFY, MAX_PFNS_PER_CHAIN, MAX_STATS_ENTRIES, PAGE_SIZE, QUEUE_SIZE,
    VIRTIO_BALLOON_F_FREE_PAGE_REPORTING, VIRTIO_BALLOON_F_STATS_VQ,
};
use crate::virtio::{VirtioInterrupt, INT_USED_RING};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};

/// Index of the inflate queue.
pub const INFLATEQ: usize = 0;
/// Index of the deflate queue.
pub const DEFLATEQ: usize = 1;

/// Where the optional queues are for a set of negotiated features: each
/// one not negotiated takes no index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLayout {
    /// Index of the stats queue, if negotiated.
    pub stats: Option<usize>,
    /// Index of the free page reporting queue, if negotiated.
    pub reporting: Option<usize>,
    /// Number of queues.
    pub count: usize,
}

impl QueueLayout {
    /// The layout for negotiated `features`.
    pub fn for_features(features: u64) -> Self {
        let mut count = 2;
        let mut next = |on: bool| {
            on.then(|| {
                count += 1;
                count - 1
            })
        };
        let stats = next(features & (1 << VIRTIO_BALLOON_F_STATS_VQ) != 0);
        let reporting = next(features & (1 << VIRTIO_BALLOON_F_FREE_PAGE_REPORTING) != 0);
        Self {
            stats,
            reporting,
            count,
        }
    }
}

/// What the balloon did and refused, for the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonCounters {
    /// Pages the guest inflated (given back).
    pub inflated_pages: u64,
    /// Pages the guest deflated.
    pub deflated_pages: u64,
    /// Bytes the guest reported free (given back).
    pub reported_bytes: u64,
    /// Stats buffers parsed.
    pub stats_updates: u64,
    /// PFNs outside guest memory (inflate or deflate), skipped.
    pub refused_pfns: u64,
    /// Chains refused whole: a descriptor the wrong way (device-writable
    /// on inflate, deflate or stats), outside guest memory, more than
    /// [`MAX_PFNS_PER_CHAIN`] PFNs, or a PFN list whose length is not a
    /// multiple of 4.
    pub refused_chains: u64,
    /// Reported ranges refused: device-readable, empty, unaligned, or not
    /// inside one guest memory region.
    pub refused_reports: u64,
    /// Stats entries with a tag this device does not know.
    pub stats_unknown_tags: u64,
    /// Stats buffers with more than [`MAX_STATS_ENTRIES`] entries or a
    /// partial entry at the end (the excess is ignored).
    pub stats_malformed: u64,
    /// Guest writes of `actual` above guest memory, ignored.
    pub refused_actual: u64,
    /// Ranges the host failed to give back.
    pub give_back_errors: u64,
    /// Notifications that stopped at the per-notification cap (the rest
    /// waits for the guest's next notification), and reported ranges past
    /// it in one chain (returned without being given back).
    pub capped: u64,
}

/// The queues of an activated device.
pub(super) struct Active {
    pub mem: GuestMemoryMmap,
    pub irq: Arc<VirtioInterrupt>,
    pub queues: Vec<Queue>,
    pub layout: QueueLayout,
}

/// State shared by [`super::Balloon`] and [`super::BalloonHandle`].
pub(super) struct Inner {
    /// Features offered.
    pub offered: u64,
    /// Features the driver accepted.
    pub acked: u64,
    /// The host's target, in pages (config `num_pages`).
    pub num_pages: u32,
    /// The guest's balloon size, in pages (config `actual`).
    pub actual: u32,
    /// Guest memory, in pages (the most `num_pages` and `actual` may be).
    pub mem_pages: u64,
    pub active: Option<Active>,
    pub counters: BalloonCounters,
    pub stats: BalloonStats,
    /// Head of the held stats buffer (at the stats queue's next position)
    /// once parsed, so another notification does not parse it again.
    stats_parsed: Option<u16>,
    pub give_back: Box<dyn GiveBack>,
    /// Bytes read from one chain (PFNs or stats), preallocated.
    buf: Box<[u8]>,
}

pub(super) type Shared = Arc<Mutex<Inner>>;

/// Locks the shared state; a poisoned lock is still consistent (every step
/// leaves it so).
pub(super) fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

type Chain<'a> = DescriptorChain<&'a GuestMemoryMmap>;

/// Copies the device-readable chain's bytes into `buf`: `Ok(total)` with
/// at most `buf.len()` bytes copied (`total` may be more); `Err` for a
/// device-writable descriptor or one outside guest memory.
fn read_chain(mem: &GuestMemoryMmap, chain: Chain<'_>, buf: &mut [u8]) -> Result<u64, ()> {
    let mut total = 0u64;
    // The chain iterator follows at most queue-size links (loops end).
    for d in chain {
        if d.is_write_only() {
            return Err(());
        }
        let off = usize::try_from(total).unwrap_or(usize::MAX).min(buf.len());
        let n = usize::try_from(d.len())
            .unwrap_or(usize::MAX)
            .min(buf.len() - off);
        if n > 0 {
            mem.read_slice(&mut buf[off..off + n], d.addr())
                .map_err(|_| ())?;
        }
        total += u64::from(d.len());
    }
    Ok(total)
}

impl Inner {
    pub fn new(offered: u64, mem_pages: u64, give_back: Box<dyn GiveBack>) -> Self {
        Self {
            offered,
            acked: 0,
            num_pages: 0,
            actual: 0,
            mem_pages,
            active: None,
            counters: BalloonCounters::default(),
            stats: BalloonStats::default(),
            stats_parsed: None,
            give_back,
            buf: vec![0; (MAX_PFNS_PER_CHAIN * 4).max(MAX_STATS_ENTRIES * STATS_ENTRY_LEN)]
                .into_boxed_slice(),
        }
    }

    /// Drops the queues (driver reset); the host's target stays.
    pub fn deactivate(&mut self) {
        self.active = None;
        self.acked = 0;
        self.actual = 0;
        self.stats_parsed = None;
    }

    /// Serves queue `index` and interrupts the guest if it wants to hear.
    pub fn process(&mut self, index: usize) {
        let Some(mut a) = self.active.take() else {
            return;
        };
        let used = match index {
            INFLATEQ | DEFLATEQ => self.process_pfns(&mut a, index),
            i if Some(i) == a.layout.stats => self.process_stats(&mut a, i),
            i if Some(i) == a.layout.reporting => self.process_reports(&mut a, i),
            _ => false,
        };
        if used && a.queues[index].needs_notification(&a.mem).unwrap_or(true) {
            let _ = a.irq.signal(INT_USED_RING);
        }
        self.active = Some(a);
    }

    /// Returns the held stats buffer to the guest, which answers with a
    /// new one; false when none is held (the guest has not sent one yet,
    /// or is still answering).
    pub fn request_stats(&mut self) -> bool {
        let Some(a) = self.active.as_mut() else {
            return false;
        };
        let Some(i) = a.layout.stats else {
            return false;
        };
        let q = &mut a.queues[i];
        let Some(chain) = q.pop_descriptor_chain(&a.mem) else {
            return false;
        };
        self.stats_parsed = None;
        if q.add_used(&a.mem, chain.head_index(), 0).is_err() {
            return false;
        }
        if q.needs_notification(&a.mem).unwrap_or(true) {
            let _ = a.irq.signal(INT_USED_RING);
        }
        true
    }

    fn give_back(&mut self, mem: &GuestMemoryMmap, r: PageRange) {
        if self.give_back.give_back(mem, r).is_err() {
            self.counters.give_back_errors += 1;
        }
    }

    /// Inflate (give each page back) or deflate (count them). Returns
    /// whether a chain was used.
    fn process_pfns(&mut self, a: &mut Active, index: usize) -> bool {
        let inflate = index == INFLATEQ;
        let (mut pages, mut chains, mut used) = (0u64, 0usize, false);
        while let Some(chain) = a.queues[index].pop_descriptor_chain(&a.mem) {
            if pages >= MAX_PAGES_PER_NOTIFY || chains >= usize::from(QUEUE_SIZE) {
                // Left for the guest's next notification.
                a.queues[index].go_to_previous_position();
                self.counters.capped += 1;
                break;
            }
            chains += 1;
            let head = chain.head_index();
            let cap = MAX_PFNS_PER_CHAIN * 4;
            match read_chain(&a.mem, chain, &mut self.buf[..cap]) {
                Ok(n) if n.is_multiple_of(4) && n <= cap as u64 => {
                    // n <= cap, a usize.
                    let n = usize::try_from(n).unwrap_or(0);
                    pages += (n / 4) as u64;
                    self.serve_pfns(&a.mem, n, inflate);
                }
                _ => self.counters.refused_chains += 1,
            }
            // Fails only for a head outside the table: that entry is
            // consumed and nothing is returned for it.
            used |= a.queues[index].add_used(&a.mem, head, 0).is_ok();
        }
        used
    }

    /// Checks the `n` bytes of PFNs in `buf`, coalesces them and gives the
    /// ranges back (inflate) or counts them (deflate).
    fn serve_pfns(&mut self, mem: &GuestMemoryMmap, n: usize, inflate: bool) {
        let mut c = Coalescer::default();
        let mut ranges = Vec::new();
        let mut ok = 0u64;
        for p in self.buf[..n].chunks_exact(4) {
            let pfn = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
            match c.push(mem, pfn) {
                Ok(done) => {
                    ok += 1;
                    ranges.extend(done);
                }
                Err(_) => self.counters.refused_pfns += 1,
            }
        }
        ranges.extend(c.finish());
        if inflate {
            self.counters.inflated_pages += ok;
            for r in ranges {
                self.give_back(mem, r);
            }
        } else {
            self.counters.deflated_pages += ok;
        }
    }

    /// Parses new stats buffers and holds the latest one. The held buffer
    /// stays in the avail ring (the queue position is not advanced past
    /// it), so a snapshot's queue state carries it without more state and
    /// [`Inner::request_stats`] finds it after a restore too. Earlier
    /// buffers (a guest should post one at a time) are returned.
    fn process_stats(&mut self, a: &mut Active, index: usize) -> bool {
        let mut used = false;
        let cap = MAX_STATS_ENTRIES * STATS_ENTRY_LEN;
        for _ in 0..QUEUE_SIZE {
            let q = &mut a.queues[index];
            let Some(chain) = q.pop_descriptor_chain(&a.mem) else {
                break;
            };
            let head = chain.head_index();
            let last = q
                .avail_idx(&a.mem, Ordering::Acquire)
                .map_or(true, |i| i.0 == q.next_avail());
            let parsed = self.stats_parsed == Some(head);
            let ok = parsed || self.parse_stats_chain(&a.mem, chain, cap);
            if ok && last {
                q.go_to_previous_position();
                self.stats_parsed = Some(head);
                break;
            }
            self.stats_parsed = None;
            used |= q.add_used(&a.mem, head, 0).is_ok();
        }
        used
    }

    /// Reads a stats chain into the latest values; false (counted) for a
    /// device-writable descriptor or one outside guest memory.
    fn parse_stats_chain(&mut self, mem: &GuestMemoryMmap, chain: Chain<'_>, cap: usize) -> bool {
        let Ok(total) = read_chain(mem, chain, &mut self.buf[..cap]) else {
            self.counters.refused_chains += 1;
            return false;
        };
        let n = usize::try_from(total).unwrap_or(usize::MAX).min(cap);
        let mut p = parse_stats(&self.buf[..n], &mut self.stats);
        p.truncated |= total > cap as u64;
        self.counters.stats_updates += 1;
        self.counters.stats_unknown_tags += p.unknown as u64;
        if p.truncated || p.partial {
            self.counters.stats_malformed += 1;
        }
        true
    }

    /// Gives back each reported range (device-writable descriptors, page
    /// aligned, inside one region) and returns the chain.
    fn process_reports(&mut self, a: &mut Active, index: usize) -> bool {
        let (mut pages, mut chains, mut used) = (0u64, 0usize, false);
        while let Some(chain) = a.queues[index].pop_descriptor_chain(&a.mem) {
            if pages >= MAX_PAGES_PER_NOTIFY || chains >= usize::from(QUEUE_SIZE) {
                a.queues[index].go_to_previous_position();
                self.counters.capped += 1;
                break;
            }
            chains += 1;
            let head = chain.head_index();
            for d in chain {
                let len = u64::from(d.len());
                match check_range(&a.mem, d.addr().0, len) {
                    Ok(r) if d.is_write_only() => {
                        // A chain can name all of guest memory many times
                        // over: past the cap, ranges are returned untouched.
                        if pages >= MAX_PAGES_PER_NOTIFY {
                            self.counters.capped += 1;
                            continue;
                        }
                        pages += r.len / PAGE_SIZE;
                        self.counters.reported_bytes += r.len;
                        self.give_back(&a.mem, r);
                    }
                    _ => self.counters.refused_reports += 1,
                }
            }
            used |= a.queues[index].add_used(&a.mem, head, 0).is_ok();
        }
        used
    }
}
