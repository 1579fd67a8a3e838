//! virtio-mmio transport, version 2 (modern) registers only.
//!
//! The transport owns the register file and the queue configuration. The
//! driver's status writes must follow the spec's order (ACKNOWLEDGE, DRIVER,
//! FEATURES_OK, DRIVER_OK); queue and feature registers are only writable in
//! the phase where the spec allows them, so a hostile driver cannot change a
//! queue under a running device.

use super::{ActivateError, VirtioDevice, VirtioInterrupt, VIRTIO_F_VERSION_1};
use crate::bus::BusDevice;
use crate::irq::IrqLine;
use std::sync::Arc;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

/// Size of one device's MMIO window.
pub const MMIO_LEN: u64 = 0x1000;
const MAGIC: u32 = 0x7472_6976; // "virt"
const VERSION: u32 = 2;
const VENDOR_ID: u32 = 0x5348_4f4c; // "SHOL"

/// Device status bits.
pub mod status {
    /// Guest noticed the device.
    pub const ACKNOWLEDGE: u32 = 1;
    /// Guest has a driver for it.
    pub const DRIVER: u32 = 2;
    /// Driver is ready.
    pub const DRIVER_OK: u32 = 4;
    /// Feature negotiation done.
    pub const FEATURES_OK: u32 = 8;
    /// Device hit an error and needs a reset.
    pub const DEVICE_NEEDS_RESET: u32 = 64;
    /// Driver gave up.
    pub const FAILED: u32 = 128;
}

/// One virtio device on the MMIO bus.
pub struct MmioTransport {
    pub(super) device: Box<dyn VirtioDevice>,
    pub(super) mem: GuestMemoryMmap,
    pub(super) interrupt: Arc<VirtioInterrupt>,
    pub(super) queues: Vec<Queue>,
    pub(super) status: u32,
    pub(super) device_features_sel: u32,
    pub(super) driver_features_sel: u32,
    pub(super) acked_features: u64,
    pub(super) queue_sel: u32,
    pub(super) config_generation: u32,
    pub(super) activated: bool,
}

impl MmioTransport {
    /// Wraps `device`, signalling the guest through `irq`.
    pub fn new(device: Box<dyn VirtioDevice>, mem: GuestMemoryMmap, irq: IrqLine) -> Self {
        let queues = make_queues(device.queue_max_sizes());
        Self {
            device,
            mem,
            interrupt: Arc::new(VirtioInterrupt::new(irq)),
            queues,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            queue_sel: 0,
            config_generation: 0,
            activated: false,
        }
    }

    /// Whether the device has been activated by its driver.
    pub fn is_activated(&self) -> bool {
        self.activated
    }

    /// The device's interrupt line.
    pub fn irq(&self) -> &IrqLine {
        self.interrupt.line()
    }

    /// The current device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        if self.status & status::FEATURES_OK == 0 || self.status & status::DRIVER_OK != 0 {
            return None;
        }
        self.queues.get_mut(self.queue_sel as usize)
    }

    fn reset(&mut self) {
        if self.activated {
            self.device.reset();
        }
        self.activated = false;
        self.queues = make_queues(self.device.queue_max_sizes());
        self.status = 0;
        self.acked_features = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        self.interrupt.ack(u32::MAX);
    }

    fn set_status(&mut self, v: u32) {
        use status::*;
        if v == 0 {
            self.reset();
            return;
        }
        if v & FAILED != 0 {
            self.status |= FAILED;
            return;
        }
        // Bits may only be added, one phase at a time.
        let added = v & !self.status;
        if v & self.status != self.status {
            return;
        }
        let ok = match added {
            ACKNOWLEDGE => self.status == 0,
            DRIVER => self.status == ACKNOWLEDGE,
            FEATURES_OK => {
                self.status == ACKNOWLEDGE | DRIVER
                    && self.acked_features & (1 << VIRTIO_F_VERSION_1) != 0
            }
            DRIVER_OK => self.status == ACKNOWLEDGE | DRIVER | FEATURES_OK,
            _ => false,
        };
        if !ok {
            return;
        }
        if added == DRIVER_OK {
            match self.activate() {
                Ok(()) => self.status = v,
                Err(_) => self.status |= DEVICE_NEEDS_RESET,
            }
        } else {
            if added == FEATURES_OK {
                self.device.set_acked_features(self.acked_features);
                // The queues the driver sets up now are those its features
                // call for (no queue register was writable before).
                let sizes = self.device.queue_max_sizes();
                let n = self
                    .device
                    .queue_count(self.acked_features)
                    .min(sizes.len());
                self.queues = make_queues(&sizes[..n]);
            }
            self.status = v;
        }
    }

    fn activate(&mut self) -> Result<(), ActivateError> {
        let ready = self.queues.iter().filter(|q| q.ready()).count();
        if ready != self.queues.len() {
            return Err(ActivateError::QueueCount {
                expected: self.queues.len(),
                got: ready,
            });
        }
        if let Some(bad) = self.queues.iter().position(|q| !q.is_valid(&self.mem)) {
            return Err(ActivateError::Device(format!("queue {bad} is not valid")));
        }
        // The device owns the queues from here on; the transport keeps no
        // copy that could drift from the device's view.
        let queues = std::mem::take(&mut self.queues);
        self.device
            .activate(self.mem.clone(), self.interrupt.clone(), queues)?;
        self.activated = true;
        Ok(())
    }

    fn read_reg(&mut self, off: u64) -> u32 {
        match off {
            0x000 => MAGIC,
            0x004 => VERSION,
            0x008 => self.device.device_type(),
            0x00c => VENDOR_ID,
            0x010 => {
                let f = self.device.avail_features();
                match self.device_features_sel {
                    // The selected half of the feature word: truncation
                    // is the point.
                    #[allow(clippy::cast_possible_truncation)]
                    0 => f as u32,
                    #[allow(clippy::cast_possible_truncation)]
                    1 => (f >> 32) as u32,
                    _ => 0,
                }
            }
            0x034 => self.queue_num_max(),
            0x044 if self.activated => 1,
            0x044 => self
                .queues
                .get(self.queue_sel as usize)
                .map_or(0, |q| u32::from(q.ready())),
            0x060 => self.interrupt.status(),
            0x070 => self.status,
            0x0fc => self.config_generation,
            _ => 0,
        }
    }

    fn write_reg(&mut self, off: u64, v: u32) {
        let negotiating = self.status == status::ACKNOWLEDGE | status::DRIVER;
        match off {
            0x014 => self.device_features_sel = v,
            0x020 if negotiating => {
                let offered = self.device.avail_features();
                match self.driver_features_sel {
                    0 => {
                        self.acked_features =
                            (self.acked_features & !0xffff_ffff) | (u64::from(v) & offered)
                    }
                    1 => {
                        self.acked_features =
                            (self.acked_features & 0xffff_ffff) | ((u64::from(v) << 32) & offered)
                    }
                    _ => {}
                }
            }
            0x024 => self.driver_features_sel = v,
            0x030 => self.queue_sel = v,
            0x038 => {
                if let Some(q) = self.selected_queue() {
                    // virtio-queue validates the size (power of two, <= max);
                    // an invalid one makes the queue invalid at activation.
                    q.set_size(u16::try_from(v).unwrap_or(0));
                }
            }
            0x044 => {
                if let Some(q) = self.selected_queue() {
                    q.set_ready(v == 1);
                }
            }
            0x050 if self.activated && self.status & status::DEVICE_NEEDS_RESET == 0 => {
                self.device.queue_notify(v);
            }
            0x064 => self.interrupt.ack(v),
            0x070 => self.set_status(v),
            0x080 => self.with_queue(|q| q.set_desc_table_address(Some(v), None)),
            0x084 => self.with_queue(|q| q.set_desc_table_address(None, Some(v))),
            0x090 => self.with_queue(|q| q.set_avail_ring_address(Some(v), None)),
            0x094 => self.with_queue(|q| q.set_avail_ring_address(None, Some(v))),
            0x0a0 => self.with_queue(|q| q.set_used_ring_address(Some(v), None)),
            0x0a4 => self.with_queue(|q| q.set_used_ring_address(None, Some(v))),
            _ => {}
        }
    }

    /// QueueNumMax of the selected queue: 0 for a queue the negotiated
    /// features do not call for (once FEATURES_OK is set).
    fn queue_num_max(&self) -> u32 {
        let sel = self.queue_sel as usize;
        if self.status & status::FEATURES_OK != 0
            && sel >= self.device.queue_count(self.acked_features)
        {
            return 0;
        }
        self.device
            .queue_max_sizes()
            .get(sel)
            .map_or(0, |&s| u32::from(s))
    }

    fn with_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        if let Some(q) = self.selected_queue() {
            f(q);
        }
    }
}

fn make_queues(sizes: &[u16]) -> Vec<Queue> {
    sizes
        .iter()
        // Sizes come from our own device code; a zero size is a programming
        // error that surfaces as a queue the driver cannot use.
        .filter_map(|&s| Queue::new(s).ok())
        .collect()
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= 0x100 {
            self.device.read_config(offset - 0x100, data);
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            data.fill(0);
            return;
        }
        let v = self.read_reg(offset);
        data.copy_from_slice(&v.to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= 0x100 {
            if self.status & status::DRIVER != 0 {
                self.device.write_config(offset - 0x100, data);
                self.config_generation = self.config_generation.wrapping_add(1);
            }
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            return;
        };
        if offset.is_multiple_of(4) {
            self.write_reg(offset, u32::from_le_bytes(bytes));
        }
    }
}
