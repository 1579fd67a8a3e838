//! Address-range bus shared by port I/O and MMIO.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device that answers reads and writes on a bus range.
///
/// `offset` is relative to the start of the range the device was inserted at.
pub trait BusDevice: Send {
    /// Guest read of `data.len()` bytes at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Guest write of `data` at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Errors from bus set-up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The new range overlaps one already registered.
    #[error("bus range {base:#x}+{len:#x} overlaps an existing device")]
    Overlap {
        /// Start of the rejected range.
        base: u64,
        /// Length of the rejected range.
        len: u64,
    },
    /// A zero-length or wrapping range.
    #[error("invalid bus range {base:#x}+{len:#x}")]
    InvalidRange {
        /// Start of the rejected range.
        base: u64,
        /// Length of the rejected range.
        len: u64,
    },
}

type Entry = (u64, Arc<Mutex<dyn BusDevice>>);

/// Maps address ranges to devices. Lookups are `O(log n)`.
#[derive(Default, Clone)]
pub struct Bus {
    /// Keyed by range start; value is (length, device).
    ranges: BTreeMap<u64, Entry>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `dev` for `[base, base + len)`.
    pub fn insert(
        &mut self,
        dev: Arc<Mutex<dyn BusDevice>>,
        base: u64,
        len: u64,
    ) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::InvalidRange { base, len })?;
        if let Some((&b, &(l, _))) = self.ranges.range(..end).next_back() {
            if b + l > base {
                return Err(BusError::Overlap { base, len });
            }
        }
        self.ranges.insert(base, (len, dev));
        Ok(())
    }

    /// The device covering `addr` and the offset of `addr` inside its range.
    pub fn resolve(&self, addr: u64) -> Option<(Arc<Mutex<dyn BusDevice>>, u64)> {
        let (&base, (len, dev)) = self.ranges.range(..=addr).next_back()?;
        let off = addr - base;
        (off < *len).then(|| (dev.clone(), off))
    }

    /// Dispatches a read; returns false when nothing is mapped at `addr`.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr) {
            Some((dev, off)) => {
                lock(&dev).read(off, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches a write; returns false when nothing is mapped at `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.resolve(addr) {
            Some((dev, off)) => {
                lock(&dev).write(off, data);
                true
            }
            None => false,
        }
    }
}

/// Locks a device, recovering from poisoning: a panicking vCPU thread must not
/// wedge every other thread that touches the same device.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rec(Vec<(u64, Vec<u8>)>);
    impl BusDevice for Rec {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset.to_le_bytes()[0]);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn routes_by_range_and_rejects_overlap() {
        let mut bus = Bus::new();
        let a = Arc::new(Mutex::new(Rec(vec![])));
        bus.insert(a.clone(), 0x100, 0x10).unwrap();
        assert_eq!(
            bus.insert(a.clone(), 0x10f, 1),
            Err(BusError::Overlap {
                base: 0x10f,
                len: 1
            })
        );
        assert_eq!(
            bus.insert(a.clone(), 0xf8, 0x9),
            Err(BusError::Overlap { base: 0xf8, len: 9 })
        );
        bus.insert(a.clone(), 0x110, 4).unwrap();
        assert!(bus.insert(a.clone(), u64::MAX, 2).is_err());
        assert!(bus.insert(a.clone(), 0x1000, 0).is_err());
        let mut b = [0u8; 2];
        assert!(bus.read(0x105, &mut b));
        assert_eq!(b, [5, 5]);
        assert!(!bus.read(0x114, &mut b));
        assert!(!bus.read(0xff, &mut b));
        assert!(bus.write(0x112, &[9]));
        assert_eq!(lock(&a).0, vec![(2, vec![9])]);
    }
}
