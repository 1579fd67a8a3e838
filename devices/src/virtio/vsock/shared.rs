//! The state both halves of a vsock device share under one lock: the
//! muxer, the active queues, and the transport-reset handshake; and serving
//! the rx, tx and event queues. [`super::device`] (vCPU threads) and
//! [`super::events`] (the event thread) both drive it; it knows neither.

use super::muxer::Muxer;
use super::packet::{self, RxPacket};
use super::persist::VsockState;
use super::{MAX_PKT_DATA, QUEUE_SIZE};
use crate::virtio::persist::QueueState;
use crate::virtio::{VirtioInterrupt, INT_USED_RING};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use virtio_vsock::packet::VsockPacket;
use vm_memory::{Bytes, GuestMemoryMmap};

/// Event id of VIRTIO_VSOCK_EVENT_TRANSPORT_RESET.
const EVENT_TRANSPORT_RESET: u32 = 0;

/// The queues of an activated device.
pub(super) struct Active {
    pub mem: GuestMemoryMmap,
    pub irq: Arc<VirtioInterrupt>,
    pub rx: Queue,
    pub tx: Queue,
    pub ev: Queue,
}

/// State shared by [`Vsock`], [`VsockEvents`] and [`VsockHandle`].
pub(super) struct Inner {
    pub muxer: Muxer,
    /// Features the driver accepted.
    pub acked: u64,
    /// The queues, once the driver activated the device.
    pub active: Option<Active>,
    /// A TRANSPORT_RESET waits for an event buffer.
    pub reset_pending: bool,
    /// A TRANSPORT_RESET was written to the guest's event buffer.
    pub reset_delivered: bool,
    /// The guest has handled the last TRANSPORT_RESET (it re-posted its
    /// event buffer). Until then new host connections wait: a REQUEST the
    /// guest saw before the reset would be reset along with the old ones.
    pub reset_acked: bool,
}

pub(super) type Shared = Arc<Mutex<Inner>>;

/// Locks the shared state. Nothing panics while holding it, but a poisoned
/// lock is still usable: every step leaves the state consistent.
pub(super) fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    /// Serves rx and tx until neither makes progress, then interrupts the
    /// guest if it wants to hear about it.
    pub fn process(&mut self) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let (mut rx_used, mut tx_used) = (false, false);
        loop {
            rx_used |= process_rx(a, &mut self.muxer);
            let tx = process_tx(a, &mut self.muxer);
            tx_used |= tx;
            if !tx {
                break;
            }
        }
        let notify = (rx_used && a.rx.needs_notification(&a.mem).unwrap_or(true))
            || (tx_used && a.tx.needs_notification(&a.mem).unwrap_or(true));
        if notify {
            let _ = a.irq.signal(INT_USED_RING);
        }
    }

    /// Delivers a pending TRANSPORT_RESET if the guest gave an event buffer.
    /// `guest_notified`: the guest kicked the event queue, which it does
    /// after handling an event (re-posting the buffer).
    pub fn process_events(&mut self, guest_notified: bool) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        if guest_notified && self.reset_delivered && !self.reset_pending {
            self.reset_delivered = false;
            self.reset_acked = true;
        }
        let mut used = false;
        while self.reset_pending {
            let Some(chain) = a.ev.pop_descriptor_chain(&a.mem) else {
                break;
            };
            let head = chain.head_index();
            let mut len = 0;
            let desc = chain
                .take(usize::from(QUEUE_SIZE))
                .find(|d| d.is_write_only() && d.len() >= 4);
            if let Some(d) = desc {
                let id = EVENT_TRANSPORT_RESET.to_le_bytes();
                if a.mem.write_slice(&id, d.addr()).is_ok() {
                    len = 4;
                    self.reset_pending = false;
                    self.reset_delivered = true;
                }
            }
            if a.ev.add_used(&a.mem, head, len).is_err() {
                break;
            }
            used = true;
        }
        if used && a.ev.needs_notification(&a.mem).unwrap_or(true) {
            let _ = a.irq.signal(INT_USED_RING);
        }
    }

    /// Drops every connection and queues a TRANSPORT_RESET for the guest.
    pub fn transport_reset(&mut self) {
        self.muxer.kill_all();
        self.reset_pending = true;
        self.reset_acked = false;
        self.process_events(false);
    }

    /// The device's snapshot state.
    pub fn save(&self) -> VsockState {
        VsockState {
            cid: self.muxer.cid(),
            acked_features: self.acked,
            queues: self
                .active
                .iter()
                .flat_map(|a| [&a.rx, &a.tx, &a.ev])
                .map(|q| QueueState::from(q.state()))
                .collect(),
        }
    }
}

/// Fills guest RX buffers with what the muxer owes the guest.
fn process_rx(a: &mut Active, muxer: &mut Muxer) -> bool {
    let mut used = false;
    while muxer.has_rx() {
        let Some(mut chain) = a.rx.pop_descriptor_chain(&a.mem) else {
            break;
        };
        let head = chain.head_index();
        let len = match VsockPacket::from_rx_virtq_chain(&a.mem, &mut chain, MAX_PKT_DATA) {
            Ok(mut pkt) => {
                let pkt: &mut RxPacket<'_> = &mut pkt;
                match muxer.fill_rx(pkt) {
                    Some(n) => n,
                    None => {
                        // Nothing owed after all: leave the buffer to the guest.
                        a.rx.go_to_previous_position();
                        break;
                    }
                }
            }
            // An unusable buffer goes back empty.
            Err(_) => 0,
        };
        if a.rx.add_used(&a.mem, head, len).is_err() {
            break;
        }
        used = true;
    }
    used
}

/// Takes guest TX packets and hands the valid ones to the muxer.
fn process_tx(a: &mut Active, muxer: &mut Muxer) -> bool {
    let mut used = false;
    while !muxer.tx_paused() {
        // The chain iterator follows at most queue-size links and rejects
        // loops, so a hostile ring cannot spin us.
        let Some(mut chain) = a.tx.pop_descriptor_chain(&a.mem) else {
            break;
        };
        let head = chain.head_index();
        match packet::parse_tx(&a.mem, &mut chain, muxer.cid()) {
            Ok(pkt) => muxer.on_guest_pkt(&pkt),
            Err(_) => muxer.counters.tx_dropped += 1,
        }
        if a.tx.add_used(&a.mem, head, 0).is_err() {
            break;
        }
        used = true;
    }
    used
}
