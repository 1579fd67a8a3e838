//! Virtqueues filled by a hostile driver: descriptor tables, avail rings
//! and indices written from fuzz input into real guest memory
//! (`GuestMemoryMmap`), behind the real MMIO transport, driven by the host
//! test driver ([`devices::virtio::testing::Driver`]).
//!
//! After every notification [`Rig::notify`] checks what any device must
//! guarantee whatever the guest wrote:
//! - it returns (within [`NOTIFY_DEADLINE`]);
//! - guest memory changed only inside buffers the guest marked
//!   device-writable (direct or in an indirect table) and the used rings;
//! - the used ring advanced by at most the number of chains made
//!   available, every used id is a descriptor index of the queue, and every
//!   used length is at most the writable bytes of that chain.
//!
//! [`Rig::reset_and_reuse`] then checks that a driver reset brings the
//! device back to a usable state.

use bolero::TypeGenerator;
use devices::virtio::mmio::status;
use devices::virtio::testing::{layout, mem_sized, Driver, DATA};
use devices::virtio::VirtioDevice;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest memory of a rig.
pub const MEM_BYTES: usize = 256 << 10;
const MEM_END: u64 = MEM_BYTES as u64;
/// Bytes of the data area buffers point into.
pub const DATA_SPAN: u64 = MEM_END - DATA;
/// Longest one notification may take.
pub const NOTIFY_DEADLINE: Duration = Duration::from_secs(2);

/// Descriptor flags.
pub const F_NEXT: u16 = 1;
/// Device-writable.
pub const F_WRITE: u16 = 2;
/// Points at an indirect table.
pub const F_INDIRECT: u16 = 4;

/// A guest address as a hostile driver picks one.
#[derive(Debug, Clone, Copy, TypeGenerator)]
pub enum Addr {
    /// Somewhere in the data area.
    Data(u32),
    /// Near the end of guest memory (buffers that run past it).
    End(u16),
    /// Anything at all.
    Any(u64),
}

impl Addr {
    /// The guest-physical address.
    pub fn get(self) -> u64 {
        match self {
            Addr::Data(x) => DATA + u64::from(x) % DATA_SPAN,
            Addr::End(x) => MEM_END - 0x800 + u64::from(x % 0x1000),
            Addr::Any(x) => x,
        }
    }
}

/// A buffer length as a hostile driver picks one.
#[derive(Debug, Clone, Copy, TypeGenerator)]
pub enum Len {
    /// Up to 255 bytes.
    Small(u8),
    /// Up to 64 KiB.
    Medium(u16),
    /// Anything.
    Any(u32),
}

impl Len {
    /// The length.
    pub fn get(self) -> u32 {
        match self {
            Len::Small(x) => u32::from(x),
            Len::Medium(x) => u32::from(x),
            Len::Any(x) => x,
        }
    }
}

/// One descriptor table entry.
#[derive(Debug, Clone, TypeGenerator)]
pub struct Desc {
    /// Slot (taken modulo the queue size).
    pub slot: u16,
    /// Buffer address.
    pub addr: Addr,
    /// Buffer length.
    pub len: Len,
    /// Flags (low bits: NEXT, WRITE, INDIRECT; the rest as given).
    pub flags: u8,
    /// Next slot (as given: may be out of range).
    pub next: u16,
}

/// What the driver does before one notification.
#[derive(Debug, Clone, TypeGenerator)]
pub struct Kick {
    /// Queue (modulo the device's queue count).
    pub queue: u8,
    /// Descriptors written into its table.
    pub descs: Vec<Desc>,
    /// Heads put on the avail ring (mostly in range, some past the table).
    pub heads: Vec<u16>,
    /// 250 and above: the avail index jumps further than the entries
    /// written (by up to 240), past the queue size for small queues.
    pub skew: u8,
    /// 250 and above: notify this (likely unknown) queue index instead.
    pub notify_other: u8,
}

/// A resolved descriptor as written to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Table slot.
    pub slot: u16,
    /// Guest address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Flags.
    pub flags: u16,
}

/// A device behind a driver that brought it up, and what the driver has
/// made available so far.
pub struct Rig {
    /// The driver (registers, guest memory).
    pub d: Driver,
    /// Queue sizes the driver set.
    pub sizes: Vec<u16>,
    features: u64,
    avail: Vec<u16>,
    used_seen: Vec<u16>,
    /// Whether activation succeeded.
    pub active: bool,
    /// Used entries (queue, id, len) the device added in the last
    /// [`Rig::act`].
    pub last_used: Vec<(usize, u32, u32)>,
}

/// Queue sizes of `max` (each a power of two up to the device's maximum,
/// chosen by `pick`).
pub fn pick_sizes(max: &[u16], pick: &[u8]) -> Vec<u16> {
    max.iter()
        .enumerate()
        .map(|(i, &m)| {
            let p = pick.get(i).copied().unwrap_or(4);
            let s = 1u16 << (p % 9);
            s.min(m).min(256)
        })
        .collect()
}

impl Rig {
    /// Brings `dev` up with `features` and one queue per entry of `sizes`.
    pub fn new(dev: Box<dyn VirtioDevice>, features: u64, sizes: &[u16]) -> Rig {
        let mut d = Driver::with_mem(dev, mem_sized(MEM_BYTES));
        let st = d.bring_up_queues(features, sizes);
        let active = st & status::DRIVER_OK != 0;
        assert!(
            active || st & status::DEVICE_NEEDS_RESET != 0,
            "activation neither succeeded nor reported an error: status {st:#x}"
        );
        Rig {
            d,
            sizes: sizes.to_vec(),
            features,
            avail: vec![0; sizes.len()],
            used_seen: vec![0; sizes.len()],
            active,
            last_used: Vec::new(),
        }
    }

    /// Guest memory.
    pub fn mem(&self) -> &GuestMemoryMmap {
        &self.d.mem
    }

    /// Writes `k`'s descriptors and heads into queue `q` (returned with the
    /// descriptors as written); notify with [`Rig::notify`].
    pub fn load(&mut self, k: &Kick) -> (usize, Vec<Written>) {
        let q = usize::from(k.queue) % self.sizes.len();
        let size = self.sizes[q];
        let (desc, avail, _) = layout(q);
        let mem = &self.d.mem;
        let mut out = Vec::with_capacity(k.descs.len());
        for dsc in &k.descs {
            let w = Written {
                slot: dsc.slot % size,
                addr: dsc.addr.get(),
                len: dsc.len.get(),
                flags: u16::from(dsc.flags),
            };
            let at = GuestAddress(desc + u64::from(w.slot) * 16);
            mem.write_obj(w.addr, at).unwrap();
            mem.write_obj(w.len, GuestAddress(at.0 + 8)).unwrap();
            mem.write_obj(w.flags, GuestAddress(at.0 + 12)).unwrap();
            mem.write_obj(dsc.next, GuestAddress(at.0 + 14)).unwrap();
            out.push(w);
        }
        let range = u32::from(size) + u32::from(size) / 8 + 1;
        for &h in &k.heads {
            let head = u16::try_from(u32::from(h) % range).unwrap_or(0);
            let slot = u64::from(self.avail[q] % size);
            mem.write_obj(head, GuestAddress(avail + 4 + slot * 2))
                .unwrap();
            self.avail[q] = self.avail[q].wrapping_add(1);
        }
        if k.skew >= 250 {
            self.avail[q] = self.avail[q].wrapping_add((u16::from(k.skew) - 249) * 40);
        }
        mem.write_obj(self.avail[q], GuestAddress(avail + 2))
            .unwrap();
        (q, out)
    }

    /// Notifies queue `q` (or, per `k.notify_other`, another index) and
    /// checks the device's answer (see the module documentation).
    pub fn notify(&mut self, q: usize, k: &Kick) {
        let index = if k.notify_other >= 250 {
            u32::from(k.notify_other)
        } else {
            u32::try_from(q).unwrap_or(0)
        };
        self.act(|d| d.notify_queue(index));
    }

    /// Runs `f` (something that makes the device work: a notification,
    /// host events) and checks what the device did meanwhile.
    pub fn act(&mut self, f: impl FnOnce(&mut Driver)) {
        let before = snapshot(&self.d.mem);
        let allowed = self.writable_ranges(&before);
        let t0 = Instant::now();
        f(&mut self.d);
        let took = t0.elapsed();
        assert!(took < NOTIFY_DEADLINE, "the device took {took:?} to answer");
        let after = snapshot(&self.d.mem);
        self.last_used.clear();
        if before != after {
            self.check_writes(&before, &after, &allowed);
        }
        for qi in 0..self.sizes.len() {
            self.check_used(qi, &before);
        }
    }

    fn check_writes(&self, before: &[u8], after: &[u8], allowed: &[(u64, u64)]) {
        const CHUNK: usize = 256;
        for (c, (a, b)) in before.chunks(CHUNK).zip(after.chunks(CHUNK)).enumerate() {
            if a == b {
                continue;
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                if x != y {
                    let addr = (c * CHUNK + i) as u64;
                    assert!(
                        allowed.iter().any(|&(s, e)| s <= addr && addr < e),
                        "device wrote guest memory at {addr:#x}, outside every \
                         device-writable buffer and used ring"
                    );
                }
            }
        }
    }

    /// [`Rig::load`] then [`Rig::notify`].
    pub fn kick(&mut self, k: &Kick) {
        let (q, _) = self.load(k);
        self.notify(q, k);
    }

    fn check_used(&mut self, q: usize, table_mem: &[u8]) {
        let size = self.sizes[q];
        let (_, _, used) = layout(q);
        let idx: u16 = self.d.mem.read_obj(GuestAddress(used + 2)).unwrap();
        let added = idx.wrapping_sub(self.used_seen[q]);
        let offered = self.avail[q].wrapping_sub(self.used_seen[q]);
        assert!(
            added <= offered,
            "queue {q}: {added} new used entries, but only {offered} chains were made available"
        );
        let mut seen = self.used_seen[q];
        while seen != idx {
            let e = used + 4 + u64::from(seen % size) * 8;
            let id: u32 = self.d.mem.read_obj(GuestAddress(e)).unwrap();
            let len: u32 = self.d.mem.read_obj(GuestAddress(e + 4)).unwrap();
            assert!(
                id < u32::from(size),
                "queue {q}: used id {id} is not a descriptor of a {size}-entry queue"
            );
            let bound = writable_bytes(table_mem, q, size, u16::try_from(id).unwrap_or(0));
            assert!(
                u64::from(len) <= bound,
                "queue {q}: used length {len} for chain {id}, which has {bound} writable bytes"
            );
            self.last_used.push((q, id, len));
            seen = seen.wrapping_add(1);
        }
        self.used_seen[q] = idx;
    }

    /// Guest ranges the device may write: every writable buffer in any
    /// queue's table (and in indirect tables they point at), and the used
    /// rings.
    fn writable_ranges(&self, mem: &[u8]) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for (q, &size) in self.sizes.iter().enumerate() {
            let (desc, _, used) = layout(q);
            out.push((used, used + 6 + 8 * u64::from(size)));
            for slot in 0..size {
                let (addr, len, flags, _) = read_desc(mem, desc + u64::from(slot) * 16);
                push_writable(&mut out, addr, len, flags);
                if flags & F_INDIRECT != 0 {
                    for j in 0..indirect_entries(addr, len) {
                        let Some(at) = addr.checked_add(j * 16) else {
                            break;
                        };
                        let (a, l, f, _) = read_desc(mem, at);
                        push_writable(&mut out, a, l, f);
                    }
                }
            }
        }
        out
    }

    /// Resets the device (status 0), brings it up again with the same
    /// queue sizes, and checks it is active (when it was the first time).
    pub fn reset_and_reuse(&mut self) {
        self.d.wr(0x70, 0);
        assert_eq!(self.d.rd(0x70), 0, "status after reset");
        // Clean rings before DRIVER_OK, as a freshly loaded driver has them
        // (a device may serve what is available as soon as it is activated).
        for q in 0..self.sizes.len() {
            let (_, avail, used) = layout(q);
            self.d.mem.write_obj(0u16, GuestAddress(avail + 2)).unwrap();
            self.d.mem.write_obj(0u16, GuestAddress(used + 2)).unwrap();
        }
        let st = self.d.bring_up_queues(self.features, &self.sizes);
        if self.active {
            assert_ne!(
                st & status::DRIVER_OK,
                0,
                "device unusable after a driver reset: status {st:#x}"
            );
        }
        for z in self.avail.iter_mut().chain(self.used_seen.iter_mut()) {
            *z = 0;
        }
    }
}

fn indirect_entries(addr: u64, len: u32) -> u64 {
    let fit = MEM_END.saturating_sub(addr) / 16;
    u64::from(len / 16).min(fit).min(1 << 16)
}

fn push_writable(out: &mut Vec<(u64, u64)>, addr: u64, len: u32, flags: u16) {
    if flags & F_WRITE != 0 && len > 0 {
        out.push((addr, addr.saturating_add(u64::from(len))));
    }
}

fn read_desc(mem: &[u8], at: u64) -> (u64, u32, u16, u16) {
    let Some(b) = usize::try_from(at)
        .ok()
        .and_then(|a| mem.get(a..a.checked_add(16)?))
    else {
        return (0, 0, 0, 0);
    };
    (
        u64::from_le_bytes(b[0..8].try_into().unwrap()),
        u32::from_le_bytes(b[8..12].try_into().unwrap()),
        u16::from_le_bytes(b[12..14].try_into().unwrap()),
        u16::from_le_bytes(b[14..16].try_into().unwrap()),
    )
}

/// An upper bound of the writable bytes of the chain at `head` of queue
/// `q` (following `next` up to `size` times; every entry of an indirect
/// table counts).
fn writable_bytes(mem: &[u8], q: usize, size: u16, head: u16) -> u64 {
    let (desc, _, _) = layout(q);
    let mut total = 0u64;
    let mut slot = head;
    for _ in 0..size {
        let (addr, len, flags, next) = read_desc(mem, desc + u64::from(slot) * 16);
        if flags & F_INDIRECT != 0 {
            for j in 0..indirect_entries(addr, len) {
                let Some(at) = addr.checked_add(j * 16) else {
                    break;
                };
                let (_, l, f, _) = read_desc(mem, at);
                if f & F_WRITE != 0 {
                    total += u64::from(l);
                }
            }
        } else if flags & F_WRITE != 0 {
            total += u64::from(len);
        }
        if flags & F_NEXT == 0 || next >= size {
            break;
        }
        slot = next;
    }
    total
}

/// A copy of all guest memory.
pub fn snapshot(mem: &GuestMemoryMmap) -> Vec<u8> {
    let mut v = vec![0u8; MEM_BYTES];
    mem.read_slice(&mut v, GuestAddress(0)).unwrap();
    v
}
