//! Interrupt lines: an eventfd the VMM registers with KVM as an irqfd.

use std::sync::Arc;
use vmm_sys_util::eventfd::EventFd;

/// One guest interrupt line (a GSI), raised by writing its eventfd.
#[derive(Clone, Debug)]
pub struct IrqLine {
    evt: Arc<EventFd>,
    gsi: u32,
}

impl IrqLine {
    /// A new line for `gsi`; the caller registers [`IrqLine::eventfd`] with KVM.
    pub fn new(gsi: u32) -> std::io::Result<Self> {
        Ok(Self {
            evt: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
            gsi,
        })
    }

    /// The guest interrupt number.
    pub fn gsi(&self) -> u32 {
        self.gsi
    }

    /// The eventfd behind this line.
    pub fn eventfd(&self) -> &EventFd {
        &self.evt
    }

    /// Raises the interrupt (edge).
    pub fn trigger(&self) -> std::io::Result<()> {
        self.evt.write(1)
    }
}

impl vm_superio::Trigger for IrqLine {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        IrqLine::trigger(self)
    }
}
