//! i8042 keyboard controller, only as far as a guest's `reboot` needs it:
//! the guest kernel (booted with `reboot=k`) writes 0xFE to port 0x64, which
//! signals the VMM to end with exit status 0.

use crate::bus::BusDevice;
use vm_superio::Trigger;
use vmm_sys_util::eventfd::EventFd;

/// Port base of the controller (data 0x60, command/status 0x64).
pub const I8042_PORT: u64 = 0x60;
/// Length of the port range.
pub const I8042_PORT_LEN: u64 = 5;

/// Trigger adapter for the reset eventfd.
#[derive(Debug)]
pub struct ResetEvt(pub EventFd);

impl Trigger for ResetEvt {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// The i8042 device on the port bus.
pub struct I8042 {
    inner: vm_superio::I8042Device<ResetEvt>,
}

impl I8042 {
    /// A controller that writes `reset` when the guest asks for a CPU reset.
    pub fn new(reset: EventFd) -> Self {
        Self {
            inner: vm_superio::I8042Device::new(ResetEvt(reset)),
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if let (Some(b), Ok(off)) = (data.first_mut(), u8::try_from(offset)) {
            *b = self.inner.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&b), Ok(off)) = (data.first(), u8::try_from(offset)) {
            // A failed eventfd write only loses the reset request; nothing to recover.
            let _ = self.inner.write(off, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command_signals() {
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut dev = I8042::new(evt.try_clone().unwrap());
        dev.write(4, &[0x12]);
        assert!(evt.read().is_err(), "no reset for other commands");
        dev.write(4, &[0xfe]);
        assert_eq!(evt.read().unwrap(), 1);
    }
}
