//! A host-side test driver: plays the guest's part of the virtio-mmio
//! protocol (register writes, descriptor tables, rings) against real guest
//! memory, so devices are tested without booting a guest.

use super::mmio::{status, MmioTransport};
use super::VirtioDevice;
use crate::bus::BusDevice;
use crate::irq::IrqLine;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

/// Guest-physical layout used by the driver.
pub const DESC: u64 = 0x1000;
pub const AVAIL: u64 = 0x3000;
pub const USED: u64 = 0x4000;
/// Start of the data area buffers are carved from.
pub const DATA: u64 = 0x10000;

pub struct Driver {
    pub t: MmioTransport,
    pub mem: GuestMemoryMmap,
    pub irq: IrqLine,
    qsize: u16,
    next_desc: u16,
    avail_idx: u16,
    pub used_seen: u16,
}

pub fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
}

impl Driver {
    pub fn new(dev: Box<dyn VirtioDevice>) -> Self {
        let mem = mem();
        let irq = IrqLine::new(5).unwrap();
        let t = MmioTransport::new(dev, mem.clone(), irq.clone());
        Self {
            t,
            mem,
            irq,
            qsize: 0,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    pub fn rd(&mut self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.t.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    pub fn wr(&mut self, off: u64, v: u32) {
        self.t.write(off, &v.to_le_bytes());
    }

    /// Negotiates `features` and sets up queue 0 with `qsize` entries.
    /// Returns the final status register.
    pub fn bring_up(&mut self, features: u64, qsize: u16) -> u32 {
        self.wr(0x70, status::ACKNOWLEDGE);
        self.wr(0x70, status::ACKNOWLEDGE | status::DRIVER);
        self.wr(0x24, 0);
        self.wr(0x20, features as u32);
        self.wr(0x24, 1);
        self.wr(0x20, (features >> 32) as u32);
        self.wr(
            0x70,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
        );
        self.wr(0x30, 0);
        self.wr(0x38, u32::from(qsize));
        self.wr(0x80, DESC as u32);
        self.wr(0x84, 0);
        self.wr(0x90, AVAIL as u32);
        self.wr(0x94, 0);
        self.wr(0xa0, USED as u32);
        self.wr(0xa4, 0);
        self.wr(0x44, 1);
        self.qsize = qsize;
        self.wr(
            0x70,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
        );
        self.rd(0x70)
    }

    /// Writes a descriptor chain of (addr, len, device-writable) and makes it
    /// available; returns the head index.
    pub fn push_chain(&mut self, bufs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, write)) in bufs.iter().enumerate() {
            let idx = (self.next_desc + i as u16) % self.qsize;
            let more = i + 1 < bufs.len();
            let flags: u16 = u16::from(more) | if write { 2 } else { 0 };
            let next = (idx + 1) % self.qsize;
            self.write_desc(idx, addr, len, flags, next);
        }
        self.next_desc = (self.next_desc + bufs.len() as u16) % self.qsize;
        self.publish(head);
        head
    }

    pub fn write_desc(&self, idx: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = GuestAddress(DESC + u64::from(idx) * 16);
        self.mem.write_obj(addr, d).unwrap();
        self.mem.write_obj(len, d.unchecked_add(8)).unwrap();
        self.mem.write_obj(flags, d.unchecked_add(12)).unwrap();
        self.mem.write_obj(next, d.unchecked_add(14)).unwrap();
    }

    /// Puts `head` on the avail ring and bumps its index.
    pub fn publish(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.qsize);
        self.mem
            .write_obj(head, GuestAddress(AVAIL + 4 + slot * 2))
            .unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
    }

    pub fn notify(&mut self) {
        self.wr(0x50, 0);
    }

    /// Used-ring entries not yet seen: (id, len).
    pub fn take_used(&mut self) -> Vec<(u32, u32)> {
        let idx: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
        let mut out = vec![];
        while self.used_seen != idx {
            let slot = u64::from(self.used_seen % self.qsize);
            let e = GuestAddress(USED + 4 + slot * 8);
            out.push((
                self.mem.read_obj::<u32>(e).unwrap(),
                self.mem.read_obj::<u32>(e.unchecked_add(4)).unwrap(),
            ));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }
}
