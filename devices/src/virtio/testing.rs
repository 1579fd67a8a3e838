//! A host-side test driver: plays the guest's part of the virtio-mmio
//! protocol (register writes, descriptor tables, rings) against real guest
//! memory, so devices are tested without booting a guest.
//!
//! Queue 0 lives at [`DESC`]/[`AVAIL`]/[`USED`]; queues 1..=3 (at most 256
//! entries each) follow in [`EXTRA_QUEUES`], all below [`DATA`]. The
//! single-queue helpers (`bring_up`, `push_chain`, `notify`, ...) act on
//! queue 0; the `*_on`/`_queues` variants take a queue index.

use super::mmio::{status, MmioTransport};
use super::VirtioDevice;
use crate::bus::BusDevice;
use crate::irq::IrqLine;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

/// Guest-physical layout used by the driver.
pub const DESC: u64 = 0x1000;
pub const AVAIL: u64 = 0x3000;
pub const USED: u64 = 0x4000;
/// Queues after the first: each gets desc, avail and used pages from here.
pub const EXTRA_QUEUES: u64 = 0x5000;
/// Start of the data area buffers are carved from.
pub const DATA: u64 = 0x10000;
/// Most queues the layout has room for.
pub const MAX_QUEUES: usize = 4;

/// Driver-side state of one queue.
#[derive(Debug, Clone, Copy, Default)]
struct DriverQueue {
    desc: u64,
    avail: u64,
    used: u64,
    size: u16,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
}

/// The low 32 bits (a register takes a 64-bit value in two halves).
fn lo(v: u64) -> u32 {
    u32::try_from(v & u64::from(u32::MAX)).unwrap()
}

/// Guest addresses of queue `index`'s descriptor table, avail and used
/// rings in the driver's layout.
pub fn layout(index: usize) -> (u64, u64, u64) {
    if index == 0 {
        return (DESC, AVAIL, USED);
    }
    let base = EXTRA_QUEUES + (index as u64 - 1) * 0x3000;
    (base, base + 0x1000, base + 0x2000)
}

pub struct Driver {
    pub t: MmioTransport,
    pub mem: GuestMemoryMmap,
    pub irq: IrqLine,
    queues: Vec<DriverQueue>,
}

/// 1 MiB of guest memory.
pub fn mem() -> GuestMemoryMmap {
    mem_sized(1 << 20)
}

/// `bytes` of guest memory starting at address 0.
pub fn mem_sized(bytes: usize) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), bytes)]).unwrap()
}

impl Driver {
    pub fn new(dev: Box<dyn VirtioDevice>) -> Self {
        Self::with_mem(dev, mem())
    }

    /// A driver over caller-sized guest memory (at least [`DATA`] bytes).
    pub fn with_mem(dev: Box<dyn VirtioDevice>, mem: GuestMemoryMmap) -> Self {
        let irq = IrqLine::new(5).unwrap();
        let t = MmioTransport::new(dev, mem.clone(), irq.clone());
        Self {
            t,
            mem,
            irq,
            queues: vec![],
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
        self.bring_up_queues(features, &[qsize])
    }

    /// Negotiates `features` and sets up one queue per entry of `sizes`
    /// (queue `i` gets `sizes[i]` entries). Returns the final status register.
    pub fn bring_up_queues(&mut self, features: u64, sizes: &[u16]) -> u32 {
        assert!(
            sizes.len() <= MAX_QUEUES,
            "test layout holds {MAX_QUEUES} queues"
        );
        self.wr(0x70, status::ACKNOWLEDGE);
        self.wr(0x70, status::ACKNOWLEDGE | status::DRIVER);
        self.wr(0x24, 0);
        self.wr(0x20, lo(features));
        self.wr(0x24, 1);
        self.wr(0x20, lo(features >> 32));
        self.wr(
            0x70,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
        );
        self.set_up_queues(sizes)
    }

    /// After FEATURES_OK: sets up one queue per entry of `sizes` and sets
    /// DRIVER_OK. Returns the final status register.
    pub fn set_up_queues(&mut self, sizes: &[u16]) -> u32 {
        assert!(
            sizes.len() <= MAX_QUEUES,
            "test layout holds {MAX_QUEUES} queues"
        );
        self.queues.clear();
        for (i, &qsize) in sizes.iter().enumerate() {
            assert!(i == 0 || qsize <= 256, "extra queues hold 256 entries");
            let (desc, avail, used) = layout(i);
            self.wr(0x30, u32::try_from(i).unwrap());
            self.wr(0x38, u32::from(qsize));
            self.wr(0x80, lo(desc));
            self.wr(0x84, 0);
            self.wr(0x90, lo(avail));
            self.wr(0x94, 0);
            self.wr(0xa0, lo(used));
            self.wr(0xa4, 0);
            self.wr(0x44, 1);
            self.queues.push(DriverQueue {
                desc,
                avail,
                used,
                size: qsize,
                ..Default::default()
            });
        }
        self.wr(
            0x70,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
        );
        self.rd(0x70)
    }

    /// Writes a descriptor chain of (addr, len, device-writable) on queue 0
    /// and makes it available; returns the head index.
    pub fn push_chain(&mut self, bufs: &[(u64, u32, bool)]) -> u16 {
        self.push_chain_on(0, bufs)
    }

    /// [`Driver::push_chain`] on queue `q`. Descriptors are handed out
    /// round-robin, so at most queue-size of them may be outstanding.
    pub fn push_chain_on(&mut self, q: usize, bufs: &[(u64, u32, bool)]) -> u16 {
        let qs = self.queues[q];
        let head = qs.next_desc;
        for (i, &(addr, len, write)) in bufs.iter().enumerate() {
            let idx = (qs.next_desc + u16::try_from(i).unwrap()) % qs.size;
            let more = i + 1 < bufs.len();
            let flags: u16 = u16::from(more) | if write { 2 } else { 0 };
            let next = (idx + 1) % qs.size;
            self.write_desc_on(q, idx, addr, len, flags, next);
        }
        self.queues[q].next_desc = (qs.next_desc + u16::try_from(bufs.len()).unwrap()) % qs.size;
        self.publish_on(q, head);
        head
    }

    pub fn write_desc(&self, idx: u16, addr: u64, len: u32, flags: u16, next: u16) {
        self.write_desc_on(0, idx, addr, len, flags, next);
    }

    /// Writes descriptor `idx` of queue `q`.
    pub fn write_desc_on(&self, q: usize, idx: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = GuestAddress(self.queues[q].desc + u64::from(idx) * 16);
        self.mem.write_obj(addr, d).unwrap();
        self.mem.write_obj(len, d.unchecked_add(8)).unwrap();
        self.mem.write_obj(flags, d.unchecked_add(12)).unwrap();
        self.mem.write_obj(next, d.unchecked_add(14)).unwrap();
    }

    /// Puts `head` on queue 0's avail ring and bumps its index.
    pub fn publish(&mut self, head: u16) {
        self.publish_on(0, head);
    }

    /// Puts `head` on queue `q`'s avail ring and bumps its index.
    pub fn publish_on(&mut self, q: usize, head: u16) {
        let qs = &mut self.queues[q];
        let slot = u64::from(qs.avail_idx % qs.size);
        self.mem
            .write_obj(head, GuestAddress(qs.avail + 4 + slot * 2))
            .unwrap();
        qs.avail_idx = qs.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(qs.avail_idx, GuestAddress(qs.avail + 2))
            .unwrap();
    }

    /// Notifies queue 0.
    pub fn notify(&mut self) {
        self.notify_queue(0);
    }

    /// Notifies queue `q`.
    pub fn notify_queue(&mut self, q: u32) {
        self.wr(0x50, q);
    }

    /// Used-ring entries of queue 0 not yet seen: (id, len).
    pub fn take_used(&mut self) -> Vec<(u32, u32)> {
        self.take_used_on(0)
    }

    /// Used-ring entries of queue `q` not yet seen: (id, len).
    pub fn take_used_on(&mut self, q: usize) -> Vec<(u32, u32)> {
        let qs = &mut self.queues[q];
        let idx: u16 = self.mem.read_obj(GuestAddress(qs.used + 2)).unwrap();
        let mut out = vec![];
        while qs.used_seen != idx {
            let slot = u64::from(qs.used_seen % qs.size);
            let e = GuestAddress(qs.used + 4 + slot * 8);
            out.push((
                self.mem.read_obj::<u32>(e).unwrap(),
                self.mem.read_obj::<u32>(e.unchecked_add(4)).unwrap(),
            ));
            qs.used_seen = qs.used_seen.wrapping_add(1);
        }
        out
    }
}
