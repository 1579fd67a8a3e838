//! The virtio side of the balloon (features, config space, queue
//! notifications, activation) and the VMM's handle on it (target, stats,
//! counters).

use super::parse::BalloonStats;
use super::persist::{BalloonArgs, BalloonState};
use super::queues::{lock, Active, BalloonCounters, Inner, QueueLayout, Shared};
use super::release::GiveBack;
use super::{BalloonConfig, CONFIG_LEN, PAGE_SIZE, QUEUE_SIZE, TYPE_BALLOON};
use crate::virtio::persist::QueueState;
use crate::virtio::{ActivateError, VirtioDevice, VirtioInterrupt, INT_CONFIG};
use snapshot::Persist;
use std::sync::{Arc, Mutex};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Errors of a balloon device.
#[derive(Debug, thiserror::Error)]
pub enum BalloonError {
    /// A target above guest memory.
    #[error("balloon target of {pages} pages is above guest memory ({mem_pages} pages)")]
    Target {
        /// Asked for.
        pages: u64,
        /// Guest memory.
        mem_pages: u64,
    },
    /// Saved features the device does not offer.
    #[error(
        "saved balloon features {saved:#x} include some the device does not offer ({offered:#x})"
    )]
    Features {
        /// In the snapshot.
        saved: u64,
        /// Offered now.
        offered: u64,
    },
    /// Saved config values above guest memory.
    #[error("saved balloon config (num_pages {num_pages}, actual {actual}) is above guest memory ({mem_pages} pages)")]
    Config {
        /// Saved target.
        num_pages: u32,
        /// Saved balloon size.
        actual: u32,
        /// Guest memory.
        mem_pages: u64,
    },
    /// Saved queues that do not match the saved features.
    #[error("saved balloon state has {saved} queues; its features call for {expected} (or none, inactive)")]
    QueueCount {
        /// In the snapshot.
        saved: usize,
        /// For its features.
        expected: usize,
    },
    /// A saved queue is invalid.
    #[error("saved balloon queue {index} is invalid: {source:?}")]
    Queue {
        /// Queue index.
        index: usize,
        /// virtio-queue's error.
        source: virtio_queue::Error,
    },
    /// Re-activating the restored device failed.
    #[error("re-activating the restored balloon: {0}")]
    Activate(#[source] ActivateError),
}

/// A virtio-balloon device (the part the MMIO transport owns).
pub struct Balloon {
    shared: Shared,
}

/// A cloneable handle for the VMM, usable after the device moved into its
/// transport.
#[derive(Clone)]
pub struct BalloonHandle {
    shared: Shared,
}

/// Guest memory in balloon pages.
fn mem_pages(mem: &GuestMemoryMmap) -> u64 {
    mem.iter().map(|r| r.len() / PAGE_SIZE).sum()
}

impl Balloon {
    /// A device for guest memory `mem` offering what `cfg` says, giving
    /// pages back through `give_back`.
    pub fn new(cfg: &BalloonConfig, mem: &GuestMemoryMmap, give_back: Box<dyn GiveBack>) -> Self {
        let inner = Inner::new(cfg.features(), mem_pages(mem), give_back);
        Self {
            shared: Arc::new(Mutex::new(inner)),
        }
    }

    /// A handle for the VMM.
    pub fn handle(&self) -> BalloonHandle {
        BalloonHandle {
            shared: self.shared.clone(),
        }
    }
}

impl BalloonHandle {
    /// Sets the host's target (config `num_pages`, in 4 KiB pages) and
    /// tells an active guest (config-change interrupt). At most guest
    /// memory.
    pub fn set_target(&self, pages: u64) -> Result<(), BalloonError> {
        let mut inner = lock(&self.shared);
        let too_big = || BalloonError::Target {
            pages,
            mem_pages: inner.mem_pages,
        };
        if pages > inner.mem_pages {
            return Err(too_big());
        }
        inner.num_pages = u32::try_from(pages).map_err(|_| too_big())?;
        if let Some(a) = &inner.active {
            let _ = a.irq.signal(INT_CONFIG);
        }
        Ok(())
    }

    /// The host's target, in pages.
    pub fn target(&self) -> u32 {
        lock(&self.shared).num_pages
    }

    /// The guest's balloon size, in pages (what it last wrote to `actual`).
    pub fn actual(&self) -> u32 {
        lock(&self.shared).actual
    }

    /// The latest statistics the guest sent.
    pub fn stats(&self) -> BalloonStats {
        lock(&self.shared).stats
    }

    /// What the device did and refused.
    pub fn counters(&self) -> BalloonCounters {
        lock(&self.shared).counters
    }

    /// The device's state for a snapshot (see [`super::persist`]).
    pub fn save(&self) -> BalloonState {
        let inner = lock(&self.shared);
        BalloonState {
            num_pages: inner.num_pages,
            actual: inner.actual,
            acked_features: inner.acked,
            queues: inner
                .active
                .iter()
                .flat_map(|a| a.queues.iter().map(|q| QueueState::from(q.state())))
                .collect(),
            stats: inner.stats,
            counters: inner.counters,
        }
    }

    /// Puts back the saved config, stats and counters into a device whose
    /// transport was restored (and re-activated) from the same snapshot
    /// (the held stats buffer is in the queue state). Values above guest
    /// memory are refused.
    pub fn load(&self, state: &BalloonState) -> Result<(), BalloonError> {
        let mut inner = lock(&self.shared);
        let pages = inner.mem_pages;
        if u64::from(state.num_pages) > pages || u64::from(state.actual) > pages {
            return Err(BalloonError::Config {
                num_pages: state.num_pages,
                actual: state.actual,
                mem_pages: pages,
            });
        }
        inner.num_pages = state.num_pages;
        inner.actual = state.actual;
        inner.stats = state.stats;
        inner.counters = state.counters;
        Ok(())
    }

    /// A subscriber for the VMM's event thread that asks the guest for new
    /// stats every `every` (a periodic timerfd).
    pub fn stats_timer(&self, every: std::time::Duration) -> std::io::Result<super::BalloonEvents> {
        super::BalloonEvents::new(self.clone(), every)
    }

    /// Asks the guest for new statistics (returns the buffer it holds);
    /// they arrive asynchronously in [`BalloonHandle::stats`]. False when
    /// no buffer is held (stats not negotiated, not active, or the guest
    /// has not answered the previous request yet).
    pub fn request_stats(&self) -> bool {
        lock(&self.shared).request_stats()
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        TYPE_BALLOON
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 4]
    }

    fn queue_count(&self, features: u64) -> usize {
        QueueLayout::for_features(features).count
    }

    fn avail_features(&self) -> u64 {
        lock(&self.shared).offered
    }

    fn set_acked_features(&mut self, features: u64) {
        let mut inner = lock(&self.shared);
        inner.acked = features & inner.offered;
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let inner = lock(&self.shared);
        crate::virtio::read_config_bytes(&config_bytes(&inner), offset, data);
    }

    /// Only `actual` (bytes 4..8) is the guest's to write; a value above
    /// guest memory is refused and counted.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let mut inner = lock(&self.shared);
        let mut cfg = config_bytes(&inner);
        let Ok(off) = usize::try_from(offset) else {
            return;
        };
        let Some(end) = off.checked_add(data.len()).filter(|&e| e <= CONFIG_LEN) else {
            return;
        };
        if off < 4 || end > 8 {
            return;
        }
        cfg[off..end].copy_from_slice(data);
        let actual = u32::from_le_bytes([cfg[4], cfg[5], cfg[6], cfg[7]]);
        if u64::from(actual) > inner.mem_pages {
            inner.counters.refused_actual += 1;
            return;
        }
        inner.actual = actual;
    }

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        irq: Arc<VirtioInterrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        let mut inner = lock(&self.shared);
        let layout = QueueLayout::for_features(inner.acked);
        if queues.len() != layout.count {
            return Err(ActivateError::QueueCount {
                expected: layout.count,
                got: queues.len(),
            });
        }
        inner.active = Some(Active {
            mem,
            irq,
            queues,
            layout,
        });
        // Buffers may have been posted before DRIVER_OK.
        for i in 0..layout.count {
            inner.process(i);
        }
        Ok(())
    }

    fn queue_notify(&mut self, index: u32) {
        if let Ok(i) = usize::try_from(index) {
            lock(&self.shared).process(i);
        }
    }

    fn reset(&mut self) {
        lock(&self.shared).deactivate();
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        let inner = lock(&self.shared);
        inner
            .active
            .iter()
            .flat_map(|a| a.queues.iter().map(|q| q.state()))
            .collect()
    }
}

fn config_bytes(inner: &Inner) -> [u8; CONFIG_LEN] {
    // struct virtio_balloon_config: num_pages, actual,
    // free_page_hint_cmd_id, poison_val (le32 each); the last two unused.
    let mut c = [0u8; CONFIG_LEN];
    c[..4].copy_from_slice(&inner.num_pages.to_le_bytes());
    c[4..8].copy_from_slice(&inner.actual.to_le_bytes());
    c
}

impl Persist for Balloon {
    type State = BalloonState;
    type ConstructorArgs = BalloonArgs;
    type Error = BalloonError;

    fn save(&self) -> Result<BalloonState, BalloonError> {
        Ok(self.handle().save())
    }

    /// A device with the saved config, features, stats and counters; if it
    /// was active, re-activated with its queues at their saved positions
    /// (the held stats buffer is the stats queue's next entry). Everything is checked against the
    /// device `args` describes and guest memory first.
    fn restore(args: BalloonArgs, state: &BalloonState) -> Result<Self, BalloonError> {
        let mut dev = Balloon::new(&args.config, &args.mem, args.give_back);
        let offered = dev.avail_features();
        if state.acked_features & !offered != 0 {
            return Err(BalloonError::Features {
                saved: state.acked_features,
                offered,
            });
        }
        let layout = QueueLayout::for_features(state.acked_features);
        if !state.queues.is_empty() && state.queues.len() != layout.count {
            return Err(BalloonError::QueueCount {
                saved: state.queues.len(),
                expected: layout.count,
            });
        }
        dev.set_acked_features(state.acked_features);
        if !state.queues.is_empty() {
            let mut queues = Vec::with_capacity(layout.count);
            for (index, q) in state.queues.iter().enumerate() {
                let queue = q
                    .to_queue()
                    .map_err(|source| BalloonError::Queue { index, source })?;
                if q.size > QUEUE_SIZE || !queue.is_valid(&args.mem) {
                    return Err(BalloonError::Activate(ActivateError::Device(format!(
                        "queue {index} is not valid"
                    ))));
                }
                queues.push(queue);
            }
            dev.activate(args.mem, args.irq, queues)
                .map_err(BalloonError::Activate)?;
        }
        dev.handle().load(state)?;
        Ok(dev)
    }
}
