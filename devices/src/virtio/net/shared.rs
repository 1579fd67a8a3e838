//! The state both halves of a net device share under one lock: the TAP,
//! the active queues, the rate limiters and counters; and moving frames
//! between the TAP and the rx and tx queues. [`super::device`] (vCPU
//! threads) and [`super::events`] (the event thread) both drive it.

use super::offload;
use super::tap::Tap;
use super::{MacAddr, ETH_HDR_LEN, MAX_FRAME_LEN, VNET_HDR_LEN};
use crate::rate_limiter::RateLimiter;
use crate::virtio::{VirtioInterrupt, INT_USED_RING};
use serde::{Deserialize, Serialize};
use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::timerfd::TimerFd;

/// Where the device reads the time (a test freezes it).
pub(super) type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// Frame and drop counters, readable by the host through
/// [`super::NetHandle::counters`]. Bytes are Ethernet frame bytes (without
/// the virtio header).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetCounters {
    /// Frames delivered to the guest.
    pub rx_packets: u64,
    /// Bytes delivered to the guest.
    pub rx_bytes: u64,
    /// Frames the guest sent that were written to the TAP.
    pub tx_packets: u64,
    /// Bytes written to the TAP.
    pub tx_bytes: u64,
    /// Guest frames dropped: Ethernet source other than the device's MAC.
    pub tx_spoofed: u64,
    /// Guest frames dropped: a device-writable descriptor, an address or
    /// length outside guest memory, or shorter than header + Ethernet header.
    pub tx_malformed: u64,
    /// Guest frames dropped: longer than [`MAX_FRAME_LEN`] with the header.
    pub tx_oversize: u64,
    /// Guest frames the TAP refused (interface down, ...).
    pub tx_tap_errors: u64,
    /// Host frames dropped: the guest's buffer was too small for them.
    pub rx_too_small: u64,
    /// Host frames dropped: the guest's buffer had a device-readable
    /// descriptor or an address outside guest memory.
    pub rx_malformed: u64,
    /// TAP read errors (other than "nothing queued"), and frames from the
    /// TAP whose header asks for an offload the driver did not take.
    pub rx_tap_errors: u64,
    /// Times the rx rate limit stopped delivery until its deadline.
    pub rx_throttled: u64,
    /// Times the tx rate limit stopped the guest's frames until its deadline.
    pub tx_throttled: u64,
}

/// The queues of an activated device.
pub(super) struct Active {
    pub mem: GuestMemoryMmap,
    pub irq: Arc<VirtioInterrupt>,
    pub rx: Queue,
    pub tx: Queue,
    /// The rx queue's used index when the guest was last considered for
    /// an interrupt (rx publishes its used entries itself, in one store).
    pub rx_signalled: Wrapping<u16>,
}

impl Active {
    pub fn new(mem: GuestMemoryMmap, irq: Arc<VirtioInterrupt>, rx: Queue, tx: Queue) -> Self {
        let rx_signalled = Wrapping(rx.next_used());
        Self {
            mem,
            irq,
            rx,
            tx,
            rx_signalled,
        }
    }
}

/// State shared by [`super::Net`], [`super::NetEvents`] and
/// [`super::NetHandle`].
pub(super) struct Inner {
    pub tap: Tap,
    pub mac: MacAddr,
    /// Features the driver accepted.
    pub acked: u64,
    pub active: Option<Active>,
    pub counters: NetCounters,
    pub rx_limiter: RateLimiter,
    pub tx_limiter: RateLimiter,
    /// The one frame rx holds (read from the TAP, not yet delivered).
    pub(super) rx_buf: Box<[u8]>,
    /// Length of the frame in `rx_buf`, header included.
    pub(super) rx_held: Option<usize>,
    tx_buf: Box<[u8]>,
    /// When the rate limiters let rx / tx go on.
    pub rx_retry: Option<Instant>,
    pub tx_retry: Option<Instant>,
    /// Fires at the earliest retry deadline (non-blocking).
    pub timer: TimerFd,
    /// The deadline the timer is armed for.
    armed: Option<Instant>,
    pub clock: Clock,
}

pub(super) type Shared = Arc<Mutex<Inner>>;

/// Locks the shared state. Nothing panics while holding it, but a poisoned
/// lock is still usable: every step leaves the state consistent.
pub(super) fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why a guest tx chain was refused.
enum TxDrop {
    Malformed,
    Oversize,
}

pub(super) type Chain<'a> = DescriptorChain<&'a GuestMemoryMmap>;

/// Copies a tx chain into `buf`: only device-readable descriptors, every
/// one inside guest memory, at most `buf.len()` bytes in all.
fn read_chain(mem: &GuestMemoryMmap, chain: Chain<'_>, buf: &mut [u8]) -> Result<usize, TxDrop> {
    let mut len = 0usize;
    // The iterator follows at most queue-size links (loops end there).
    for d in chain {
        if d.is_write_only() {
            return Err(TxDrop::Malformed);
        }
        let n = usize::try_from(d.len()).map_err(|_| TxDrop::Oversize)?;
        let end = len
            .checked_add(n)
            .filter(|&e| e <= buf.len())
            .ok_or(TxDrop::Oversize)?;
        mem.read_slice(&mut buf[len..end], d.addr())
            .map_err(|_| TxDrop::Malformed)?;
        len = end;
    }
    if len < VNET_HDR_LEN + ETH_HDR_LEN {
        return Err(TxDrop::Malformed);
    }
    Ok(len)
}

pub(super) fn frame_bytes(len: usize) -> u64 {
    u64::try_from(len.saturating_sub(VNET_HDR_LEN)).unwrap_or(u64::MAX)
}

impl Inner {
    pub fn new(tap: Tap, mac: MacAddr, rx: RateLimiter, tx: RateLimiter, timer: TimerFd) -> Self {
        Self {
            tap,
            mac,
            acked: 0,
            active: None,
            counters: NetCounters::default(),
            rx_limiter: rx,
            tx_limiter: tx,
            rx_buf: vec![0; MAX_FRAME_LEN].into_boxed_slice(),
            rx_held: None,
            tx_buf: vec![0; MAX_FRAME_LEN].into_boxed_slice(),
            rx_retry: None,
            tx_retry: None,
            timer,
            armed: None,
            clock: Arc::new(Instant::now),
        }
    }

    /// Bytes of the frame rx holds for the guest (0 or one frame).
    pub fn held_bytes(&self) -> usize {
        self.rx_held.unwrap_or(0)
    }

    /// Tells the TAP which offloads it may use toward the driver: what
    /// the driver took. A failure leaves the TAP sending whole frames, which
    /// every driver takes.
    pub fn set_tap_offload(&mut self) {
        let _ = self.tap.set_offload(offload::tun_offload(self.acked));
    }

    /// Drops the queues and the held frame (driver reset).
    pub fn deactivate(&mut self) {
        self.active = None;
        self.acked = 0;
        self.set_tap_offload();
        self.rx_held = None;
        self.rx_retry = None;
        self.tx_retry = None;
        self.arm_timer();
    }

    /// Serves tx, then rx, and interrupts the guest if it wants to hear
    /// about it.
    pub fn process(&mut self) {
        let Some(mut a) = self.active.take() else {
            return;
        };
        let tx_used = self.process_tx(&mut a);
        let rx_used = self.process_rx(&mut a);
        // Both asked (each call ends that queue's count of new entries);
        // with EVENT_IDX the driver's used_event says whether it wants it.
        let rx_wants = rx_used && rx_needs_interrupt(&mut a);
        let tx_wants = tx_used && a.tx.needs_notification(&a.mem).unwrap_or(true);
        let notify = rx_wants || tx_wants;
        if notify {
            let _ = a.irq.signal(INT_USED_RING);
        }
        self.active = Some(a);
        self.arm_timer();
    }

    /// The timer fired: forget deadlines that passed and serve both queues.
    pub fn on_timer(&mut self) {
        // One-shot: it is disarmed now.
        self.armed = None;
        let now = (self.clock)();
        self.rx_retry = self.rx_retry.filter(|&t| t > now);
        self.tx_retry = self.tx_retry.filter(|&t| t > now);
        self.process();
    }

    /// The earliest instant a rate limiter lets a waiting direction go on.
    pub fn retry_deadline(&self) -> Option<Instant> {
        match (self.rx_retry, self.tx_retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Arms the timer for the earliest deadline, or disarms it (no system
    /// call when that has not changed).
    fn arm_timer(&mut self) {
        let want = self.retry_deadline();
        if want == self.armed {
            return;
        }
        self.armed = want;
        match want {
            Some(t) => {
                let now = (self.clock)();
                // A zero duration would disarm it: fire at once instead.
                let d = t
                    .saturating_duration_since(now)
                    .max(Duration::from_micros(1));
                let _ = self.timer.reset(d, None);
            }
            None => {
                let _ = self.timer.clear();
            }
        }
    }

    /// Writes the guest's frames to the TAP until the queue is empty or the
    /// rate limit says wait. Returns whether a chain was used.
    fn process_tx(&mut self, a: &mut Active) -> bool {
        let mut used = false;
        // Throttled: the first chain waits for the deadline (no copying it
        // again on every notification meanwhile).
        if self.tx_retry.is_some_and(|t| (self.clock)() < t) {
            return false;
        }
        // Whether the ring was looked at again since the last chain (a ring
        // whose index is garbage says "more" but yields nothing: once).
        let mut rechecked = false;
        loop {
            let Some(chain) = a.tx.pop_descriptor_chain(&a.mem) else {
                // Drained: ask for the driver's next notification (with
                // EVENT_IDX, avail_event moves here) and look once more
                // for a frame added meanwhile.
                match a.tx.enable_notification(&a.mem) {
                    Ok(true) if !rechecked => {
                        rechecked = true;
                        continue;
                    }
                    _ => break,
                }
            };
            rechecked = false;
            let head = chain.head_index();
            match read_chain(&a.mem, chain, &mut self.tx_buf) {
                Err(TxDrop::Malformed) => self.counters.tx_malformed += 1,
                Err(TxDrop::Oversize) => self.counters.tx_oversize += 1,
                Ok(len) => {
                    let now = (self.clock)();
                    // A TCP segment counts as the packets it becomes.
                    let packets = offload::wire_packets(&self.tx_buf[..len]);
                    let limited = self
                        .tx_limiter
                        .consume_packets(frame_bytes(len), packets, now);
                    if let Err(until) = limited {
                        // The chain stays available for the retry.
                        a.tx.go_to_previous_position();
                        self.tx_retry = Some(until);
                        self.counters.tx_throttled += 1;
                        break;
                    }
                    self.tx_retry = None;
                    let frame = &mut self.tx_buf[..len];
                    let src = &frame[VNET_HDR_LEN + 6..VNET_HDR_LEN + 12];
                    if src != self.mac.0 {
                        self.counters.tx_spoofed += 1;
                    } else if !offload::tx_header(self.acked, frame) {
                        // Offload fields it did not take, or out of the frame.
                        self.counters.tx_malformed += 1;
                    } else {
                        match self.tap.write(frame) {
                            Ok(_) => {
                                self.counters.tx_packets += 1;
                                self.counters.tx_bytes += frame_bytes(len);
                            }
                            Err(_) => self.counters.tx_tap_errors += 1,
                        }
                    }
                }
            }
            // Fails only for a head outside the table: that entry is
            // consumed and nothing is returned for it.
            used |= a.tx.add_used(&a.mem, head, 0).is_ok();
        }
        used
    }
}

/// Whether the guest wants an interrupt for the rx entries published since
/// the last time this was asked: always without VIRTIO_RING_F_EVENT_IDX,
/// with it when the driver's `used_event` lies among them.
fn rx_needs_interrupt(a: &mut Active) -> bool {
    let new = Wrapping(a.rx.next_used());
    let old = std::mem::replace(&mut a.rx_signalled, new);
    if !a.rx.event_idx_enabled() {
        return true;
    }
    // The used entries are visible before the driver's event is read.
    fence(Ordering::SeqCst);
    let at = 4 + u64::from(a.rx.size()) * 2;
    let Some(addr) = a.rx.avail_ring().checked_add(at).map(GuestAddress) else {
        return true;
    };
    let Ok(event) = a.mem.load::<u16>(addr, Ordering::Relaxed) else {
        return true;
    };
    let event = Wrapping(u16::from_le(event));
    new - event - Wrapping(1) < new - old
}
