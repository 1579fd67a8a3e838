//! Snapshot state of a virtio-mmio transport and its device's queues.
//!
//! Restore ([`Persist::restore`] of [`MmioTransport`]) builds the transport
//! around a freshly made device, sets its registers and, for an activated
//! device, re-runs the device's normal activation with queues restored to
//! their saved positions, so devices need no separate queue restore path.

use super::mmio::MmioTransport;
use super::VirtioDevice;
use crate::irq::IrqLine;
use serde::{Deserialize, Serialize};
use snapshot::Persist;
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

/// Serializable mirror of `virtio_queue::QueueState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// Maximum size offered.
    pub max_size: u16,
    /// Next available-ring index.
    pub next_avail: u16,
    /// Next used-ring index.
    pub next_used: u16,
    /// EVENT_IDX negotiated.
    pub event_idx_enabled: bool,
    /// Driver-selected size.
    pub size: u16,
    /// Ready flag.
    pub ready: bool,
    /// Descriptor table address.
    pub desc_table: u64,
    /// Available ring address.
    pub avail_ring: u64,
    /// Used ring address.
    pub used_ring: u64,
}

impl From<virtio_queue::QueueState> for QueueState {
    fn from(q: virtio_queue::QueueState) -> Self {
        Self {
            max_size: q.max_size,
            next_avail: q.next_avail,
            next_used: q.next_used,
            event_idx_enabled: q.event_idx_enabled,
            size: q.size,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
        }
    }
}

impl QueueState {
    /// A validated queue (sizes and ring addresses checked by virtio-queue).
    pub fn to_queue(self) -> Result<Queue, virtio_queue::Error> {
        Queue::try_from(virtio_queue::QueueState {
            max_size: self.max_size,
            next_avail: self.next_avail,
            next_used: self.next_used,
            event_idx_enabled: self.event_idx_enabled,
            size: self.size,
            ready: self.ready,
            desc_table: self.desc_table,
            avail_ring: self.avail_ring,
            used_ring: self.used_ring,
        })
    }
}

/// Saved transport registers and queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioState {
    /// Virtio device type (checked on restore).
    pub device_type: u32,
    /// Device status register.
    pub status: u32,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// Features the driver accepted.
    pub acked_features: u64,
    /// QueueSel.
    pub queue_sel: u32,
    /// ConfigGeneration.
    pub config_generation: u32,
    /// Whether the device was activated.
    pub activated: bool,
    /// Interrupt status register.
    pub interrupt_status: u32,
    /// Queue states: the transport's (before activation) or the device's.
    pub queues: Vec<QueueState>,
}

/// What restoring a transport needs besides its state.
pub struct MmioArgs {
    /// A fresh device of the saved kind (not yet activated).
    pub device: Box<dyn VirtioDevice>,
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// The transport's interrupt line.
    pub irq: IrqLine,
}

/// Why a transport could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum MmioRestoreError {
    /// The snapshot's device differs from the one configured.
    #[error("saved virtio device type {saved} does not match configured type {configured}")]
    DeviceType {
        /// Type in the snapshot.
        saved: u32,
        /// Type configured now.
        configured: u32,
    },
    /// Queue count differs.
    #[error("saved device has {saved} queues, device has {configured}")]
    QueueCount {
        /// In the snapshot.
        saved: usize,
        /// Now.
        configured: usize,
    },
    /// A saved queue is invalid.
    #[error("saved queue {index} is invalid: {source:?}")]
    Queue {
        /// Queue index.
        index: usize,
        /// virtio-queue's error.
        source: virtio_queue::Error,
    },
    /// A saved queue does not fit the device's limits or guest memory.
    #[error("saved queue {index} is out of bounds: {reason}")]
    QueueLimit {
        /// Queue index.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The saved registers are not a state the transport can be in.
    #[error("saved transport registers are inconsistent: {0}")]
    Registers(String),
    /// The device refused re-activation.
    #[error("re-activating restored device: {0}")]
    Activate(#[from] super::ActivateError),
}

/// Device status values a driver can reach (without FAILED and
/// DEVICE_NEEDS_RESET): each phase adds one bit, in the spec's order.
const STATUS_PHASES: [u32; 5] = [0, 1, 3, 11, 15];

/// Checks `s` against the device it is restored into and guest memory
/// `mem` before anything acts on it: a snapshot is data from disk, and a
/// queue larger than the device's, rings outside guest memory, features
/// the device never offered or a status no driver can reach are refused.
/// (The ring indices are any u16 by design: they wrap, and a hostile
/// driver can put them any distance apart, e.g. with heads outside the
/// table that are consumed but never used.)
fn check_state(
    device: &dyn VirtioDevice,
    mem: &GuestMemoryMmap,
    s: &MmioState,
) -> Result<(), MmioRestoreError> {
    use super::mmio::status::{DEVICE_NEEDS_RESET, DRIVER_OK, FAILED};
    let regs = |m: String| Err(MmioRestoreError::Registers(m));
    let phase = s.status & !(FAILED | DEVICE_NEEDS_RESET);
    if !STATUS_PHASES.contains(&phase) {
        return regs(format!(
            "status {:#x} is not one a driver can reach",
            s.status
        ));
    }
    if s.activated != (phase & DRIVER_OK != 0 && s.status & DEVICE_NEEDS_RESET == 0) {
        return regs(format!(
            "activated is {} with status {:#x}",
            s.activated, s.status
        ));
    }
    let offered = device.avail_features();
    if s.acked_features & !offered != 0 {
        return regs(format!(
            "acked features {:#x} include some the device does not offer ({offered:#x})",
            s.acked_features
        ));
    }
    if s.interrupt_status & !(super::INT_USED_RING | super::INT_CONFIG) != 0 {
        return regs(format!("interrupt status {:#x}", s.interrupt_status));
    }
    for (index, (q, &max)) in s.queues.iter().zip(device.queue_max_sizes()).enumerate() {
        let bad = |reason: String| Err(MmioRestoreError::QueueLimit { index, reason });
        if q.max_size != max {
            return bad(format!(
                "maximum size {} (the device's is {max})",
                q.max_size
            ));
        }
        if q.size > max || !q.size.is_power_of_two() {
            return bad(format!(
                "size {} is invalid (at most {max}, a power of two)",
                q.size
            ));
        }
        // Rings the device will use (a transport not yet activated checks
        // its queues again at activation).
        if s.activated {
            let queue = q
                .to_queue()
                .map_err(|source| MmioRestoreError::Queue { index, source })?;
            if !virtio_queue::QueueT::is_valid(&queue, mem) {
                return bad(format!(
                    "rings (descriptors {:#x}, avail {:#x}, used {:#x}) are not aligned \
                     inside guest memory for {} entries",
                    q.desc_table, q.avail_ring, q.used_ring, q.size
                ));
            }
        }
    }
    Ok(())
}

impl Persist for MmioTransport {
    type State = MmioState;
    type ConstructorArgs = MmioArgs;
    type Error = MmioRestoreError;

    fn save(&self) -> Result<MmioState, MmioRestoreError> {
        Ok(self.state())
    }

    fn restore(args: MmioArgs, state: &MmioState) -> Result<Self, MmioRestoreError> {
        let mut t = MmioTransport::new(args.device, args.mem, args.irq);
        t.load_state(state)?;
        Ok(t)
    }
}

impl MmioTransport {
    /// Captures the transport and its queues.
    fn state(&self) -> MmioState {
        let queues = if self.activated {
            self.device.queue_states()
        } else {
            self.queues.iter().map(|q| q.state()).collect()
        };
        MmioState {
            device_type: self.device.device_type(),
            status: self.status,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            acked_features: self.acked_features,
            queue_sel: self.queue_sel,
            config_generation: self.config_generation,
            activated: self.activated,
            interrupt_status: self.interrupt.status(),
            queues: queues.into_iter().map(QueueState::from).collect(),
        }
    }

    /// Applies `s` to a freshly built transport (same device kind).
    fn load_state(&mut self, s: &MmioState) -> Result<(), MmioRestoreError> {
        let configured = self.device.device_type();
        if s.device_type != configured {
            return Err(MmioRestoreError::DeviceType {
                saved: s.device_type,
                configured,
            });
        }
        // A driver past FEATURES_OK set up the queues its features call
        // for (check_state refuses features the device does not offer).
        let n = if s.status & super::mmio::status::FEATURES_OK != 0 {
            let sizes = self.device.queue_max_sizes().len();
            self.device.queue_count(s.acked_features).min(sizes)
        } else {
            self.device.queue_max_sizes().len()
        };
        if s.queues.len() != n {
            return Err(MmioRestoreError::QueueCount {
                saved: s.queues.len(),
                configured: n,
            });
        }
        check_state(self.device.as_ref(), &self.mem, s)?;
        let mut queues = Vec::with_capacity(n);
        for (index, q) in s.queues.iter().enumerate() {
            queues.push(
                q.to_queue()
                    .map_err(|source| MmioRestoreError::Queue { index, source })?,
            );
        }
        self.status = s.status;
        self.device_features_sel = s.device_features_sel;
        self.driver_features_sel = s.driver_features_sel;
        self.acked_features = s.acked_features;
        self.queue_sel = s.queue_sel;
        self.config_generation = s.config_generation;
        self.interrupt.set_status(s.interrupt_status);
        if s.status & super::mmio::status::FEATURES_OK != 0 {
            // As the driver's FEATURES_OK write did (also for a device
            // restored between FEATURES_OK and DRIVER_OK).
            self.device.set_acked_features(s.acked_features);
        }
        if s.activated {
            self.device
                .activate(self.mem.clone(), self.interrupt.clone(), queues)?;
            self.activated = true;
        } else {
            self.queues = queues;
        }
        Ok(())
    }
}
