//! Virtio devices behind the MMIO transport (virtio 1.x, modern registers only).

pub mod balloon;
pub mod blk;
pub mod mmio;
pub mod net;
pub mod persist;
#[cfg(any(test, feature = "test-utils"))]
pub mod testing;
pub mod vsock;

use crate::irq::IrqLine;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

/// Feature bit: the device conforms to virtio 1.x.
pub const VIRTIO_F_VERSION_1: u32 = 32;
/// Feature bit: used/avail event index fields.
pub const VIRTIO_RING_F_EVENT_IDX: u32 = 29;

/// Interrupt status bit: a used buffer was added.
pub const INT_USED_RING: u32 = 1;
/// Interrupt status bit: configuration changed.
pub const INT_CONFIG: u32 = 2;

/// The interrupt a transport gives its device at activation.
#[derive(Debug)]
pub struct VirtioInterrupt {
    status: AtomicU32,
    line: IrqLine,
}

impl VirtioInterrupt {
    /// Wraps an interrupt line.
    pub fn new(line: IrqLine) -> Self {
        Self {
            status: AtomicU32::new(0),
            line,
        }
    }

    /// Sets `bits` in the interrupt status and raises the line.
    pub fn signal(&self, bits: u32) -> std::io::Result<()> {
        self.status.fetch_or(bits, Ordering::SeqCst);
        self.line.trigger()
    }

    /// Current interrupt status register value.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// Overwrites the status (snapshot restore).
    pub fn set_status(&self, v: u32) {
        self.status.store(v, Ordering::SeqCst);
    }

    /// Clears acknowledged bits.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// The underlying line.
    pub fn line(&self) -> &IrqLine {
        &self.line
    }
}

/// Why a device refused activation.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// The driver set up a different number of queues than the device needs.
    #[error("device expects {expected} queues, driver readied {got}")]
    QueueCount {
        /// Queues the device needs.
        expected: usize,
        /// Queues the driver made ready.
        got: usize,
    },
    /// Device-specific failure.
    #[error("activation failed: {0}")]
    Device(String),
}

/// A virtio device: its features, config space and queue processing.
/// The transport owns the registers and queue configuration until the
/// driver sets DRIVER_OK; then it hands the queues over in [`VirtioDevice::activate`].
pub trait VirtioDevice: Send {
    /// Virtio device type (2 = block, 19 = vsock, ...).
    fn device_type(&self) -> u32;
    /// Maximum size of each queue; its length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// How many of the queues of [`VirtioDevice::queue_max_sizes`] (the
    /// first ones) a driver that accepted `features` sets up. Most devices
    /// have a fixed set; one whose optional queues come and go with
    /// features (balloon: its stats and reporting queues shift down when
    /// not negotiated) says so here.
    fn queue_count(&self, features: u64) -> usize {
        let _ = features;
        self.queue_max_sizes().len()
    }
    /// Features the device offers.
    fn avail_features(&self) -> u64;
    /// Records the features the driver accepted (a subset of the offer).
    fn set_acked_features(&mut self, features: u64);
    /// Reads device config space at `offset`; out-of-range bytes read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes device config space (most devices ignore it).
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// Takes the ready queues and starts serving them.
    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        irq: Arc<VirtioInterrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError>;
    /// The driver notified queue `index`.
    fn queue_notify(&mut self, index: u32);
    /// Returns to the inactive state (driver reset).
    fn reset(&mut self);
    /// Positions of the queues the device owns while active (for snapshots);
    /// empty when inactive.
    fn queue_states(&self) -> Vec<virtio_queue::QueueState>;
}

/// Copies `src[offset..]` into `data`, zero-filling past the end.
pub fn read_config_bytes(src: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(off) = usize::try_from(offset) else {
        return;
    };
    if off < src.len() {
        let n = data.len().min(src.len() - off);
        data[..n].copy_from_slice(&src[off..off + n]);
    }
}
