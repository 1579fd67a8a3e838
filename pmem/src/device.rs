//! The virtio-pmem device: features, config space and its request queue.
//!
//! The guest reaches the image's bytes directly through the KVM slot the VMM
//! registers for the [`crate::PmemMapping`]; this device only tells the
//! guest where that memory is (config space) and answers flush requests.

use crate::mapping::{PmemBacking, PmemMapping};
use crate::request::{self, RequestError};
use devices::virtio::{
    read_config_bytes, ActivateError, VirtioDevice, VirtioInterrupt, INT_USED_RING,
    VIRTIO_F_VERSION_1,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

/// Virtio device type of a pmem device.
pub const TYPE_PMEM: u32 = 27;
/// Size of the one request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Config space: `le64 start; le64 size;`.
pub const CONFIG_LEN: usize = 16;

/// Counters a VMM can report; shared with the device.
#[derive(Debug, Default)]
pub struct PmemMetrics {
    /// Flushes answered with success.
    pub flushes: AtomicU64,
    /// Malformed requests answered with an error.
    pub bad_requests: AtomicU64,
    /// Requests returned unanswered (no room or no memory for a response).
    pub dropped: AtomicU64,
}

struct Active {
    mem: GuestMemoryMmap,
    irq: Arc<VirtioInterrupt>,
    queue: Queue,
}

/// A virtio-pmem device.
pub struct Pmem {
    backing: PmemBacking,
    config: [u8; CONFIG_LEN],
    acked: u64,
    active: Option<Active>,
    metrics: Arc<PmemMetrics>,
}

impl std::fmt::Debug for Pmem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmem")
            .field("path", &self.backing.path)
            .field(
                "guest_addr",
                &format_args!("{:#x}", self.backing.guest_addr),
            )
            .field("len", &self.backing.len)
            .field("active", &self.active.is_some())
            .finish()
    }
}

impl Pmem {
    /// A device for the mapped image `backing` (from
    /// [`PmemMapping::backing`]).
    pub fn new(backing: PmemBacking) -> Self {
        let mut config = [0u8; CONFIG_LEN];
        config[..8].copy_from_slice(&backing.guest_addr.to_le_bytes());
        config[8..].copy_from_slice(&backing.len.to_le_bytes());
        Self {
            backing,
            config,
            acked: 0,
            active: None,
            metrics: Arc::default(),
        }
    }

    /// A device for `mapping`.
    pub fn from_mapping(mapping: &PmemMapping) -> Self {
        Self::new(mapping.backing())
    }

    /// The device's counters.
    pub fn metrics(&self) -> Arc<PmemMetrics> {
        self.metrics.clone()
    }

    /// Guest-physical start reported to the guest.
    pub fn guest_addr(&self) -> u64 {
        self.backing.guest_addr
    }

    /// Size reported to the guest.
    pub fn len(&self) -> u64 {
        self.backing.len
    }

    /// Always false: empty images are refused.
    pub fn is_empty(&self) -> bool {
        self.backing.len == 0
    }

    pub(crate) fn backing(&self) -> &PmemBacking {
        &self.backing
    }

    fn process(&mut self) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let mut used_any = false;
        loop {
            let mut progressed = false;
            // The chain iterator follows at most queue-size links and
            // rejects loops; `take` bounds it again.
            while let Some(chain) = a.queue.pop_descriptor_chain(&a.mem) {
                let head = chain.head_index();
                let descs: Vec<_> = chain.take(usize::from(QUEUE_SIZE)).collect();
                let done = request::handle(&a.mem, &descs);
                let counter = match (&done.error, done.used_len) {
                    (None, _) => &self.metrics.flushes,
                    (Some(_), 0) => &self.metrics.dropped,
                    (Some(_), _) => &self.metrics.bad_requests,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if let Some(e @ (RequestError::UnknownType(_) | RequestError::Order)) = &done.error
                {
                    log::debug!("virtio-pmem {}: {e}", self.backing.path.display());
                }
                if a.queue.add_used(&a.mem, head, done.used_len).is_err() {
                    // A head index past the queue (hostile ring): skip it.
                    // Every pop advanced `next_avail`, so this ends.
                    continue;
                }
                used_any = true;
                progressed = true;
            }
            // Re-check after re-enabling notifications so a request added in
            // between is not missed.
            match a.queue.enable_notification(&a.mem) {
                Ok(true) if progressed => continue,
                _ => break,
            }
        }
        if used_any && a.queue.needs_notification(&a.mem).unwrap_or(true) {
            let _ = a.irq.signal(INT_USED_RING);
        }
    }
}

impl VirtioDevice for Pmem {
    fn device_type(&self) -> u32 {
        TYPE_PMEM
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn avail_features(&self) -> u64 {
        // No EVENT_IDX: flushes are rare and synchronous in the guest.
        1 << VIRTIO_F_VERSION_1
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked = features & self.avail_features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // Config space is read-only.
    }

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        irq: Arc<VirtioInterrupt>,
        mut queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if queues.len() != 1 {
            return Err(ActivateError::QueueCount {
                expected: 1,
                got: queues.len(),
            });
        }
        let mut queue = queues.remove(0);
        queue.set_event_idx(false);
        self.active = Some(Active { mem, irq, queue });
        // Serve anything queued before DRIVER_OK (or before a snapshot).
        self.process();
        Ok(())
    }

    fn queue_notify(&mut self, index: u32) {
        if index == 0 {
            self.process();
        }
    }

    fn reset(&mut self) {
        self.active = None;
        self.acked = 0;
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        self.active.iter().map(|a| a.queue.state()).collect()
    }
}

#[cfg(test)]
#[path = "device_tests.rs"]
pub(crate) mod tests;
