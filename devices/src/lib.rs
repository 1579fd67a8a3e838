//! Emulated devices for the Shoal VMM: legacy PC devices (8250 serial, i8042),
//! the virtio-mmio transport and the virtio devices behind it.
//!
//! Devices are reached through a [`bus::Bus`]: the VMM's vCPU threads route
//! port-I/O and MMIO exits to the device registered at that address.

pub mod bus;
pub mod i8042;
pub mod irq;
pub mod rate_limiter;
pub mod serial;
pub mod virtio;

pub use bus::{Bus, BusDevice};
pub use irq::IrqLine;
