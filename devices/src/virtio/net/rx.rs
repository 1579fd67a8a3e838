//! Host-to-guest frames: from the TAP into the guest's rx buffers, one
//! buffer per frame, or with VIRTIO_NET_F_MRG_RXBUF as many as the frame
//! needs.
//!
//! With mergeable buffers a driver posts small buffers (Linux: about one
//! MTU's worth, sized by the frames it has seen) and a frame spans as many
//! as it needs, `num_buffers` in its header saying how many. The device
//! takes buffers until they hold the frame, then writes it and publishes
//! every one of its used entries with one used-index store: a driver
//! polling the ring never sees the first buffer of a frame without the
//! rest (Linux drops such a frame: "buffers missing"). `virtio-queue`
//! publishes one entry per store, so rx writes its used entries here.
//!
//! What the guest controls is bounded: a frame takes at most one ring's
//! worth of buffers; buffers with a device-readable descriptor or an
//! address outside guest memory drop the frame and go back to the guest
//! empty, as do the buffers of a frame that a whole ring of them cannot
//! hold. When the ring has too few buffers for the frame, they stay in the
//! ring (the frame waits, held) and the device asks to be notified when the
//! driver adds more, not at the buffers it already has.

use super::offload;
use super::shared::{frame_bytes, Active, Chain, Inner};
use super::{ETH_HDR_LEN, MAX_FRAME_LEN, VIRTIO_NET_F_MRG_RXBUF, VNET_HDR_LEN};
use std::io::ErrorKind;
use std::num::Wrapping;
use std::sync::atomic::Ordering;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Why a frame was dropped instead of delivered.
enum RxDrop {
    /// A buffer with a device-readable descriptor or outside guest memory.
    Malformed,
    /// The buffers cannot hold it.
    TooSmall,
}

/// What taking buffers for a frame came to.
enum Gathered {
    /// Enough room (or, without mergeable buffers, the one buffer).
    Enough,
    /// The ring ran out first: the frame waits for more.
    Short,
    /// A whole ring of buffers is not enough: drop it.
    Never,
    /// A buffer is not one the device may write.
    Malformed,
}

/// Bytes a buffer can take: the sum of its descriptors' lengths, or `None`
/// if one of them is device-readable.
fn room(chain: &Chain<'_>) -> Option<usize> {
    let mut room = 0usize;
    // The iterator follows at most queue-size links (loops end there).
    for d in chain.clone() {
        if !d.is_write_only() {
            return None;
        }
        room = room.saturating_add(usize::try_from(d.len()).unwrap_or(usize::MAX));
    }
    Some(room)
}

/// Copies the start of `data` into a buffer of device-writable descriptors
/// inside guest memory; returns how much fitted.
fn fill_chain(mem: &GuestMemoryMmap, chain: Chain<'_>, data: &[u8]) -> Result<usize, RxDrop> {
    let mut off = 0usize;
    for d in chain {
        if off == data.len() {
            break;
        }
        if !d.is_write_only() {
            return Err(RxDrop::Malformed);
        }
        let room = usize::try_from(d.len()).unwrap_or(usize::MAX);
        let n = room.min(data.len() - off);
        mem.write_slice(&data[off..off + n], d.addr())
            .map_err(|_| RxDrop::Malformed)?;
        off += n;
    }
    Ok(off)
}

/// Writes `entries` (head, bytes written) to the used ring and then moves
/// its index past all of them with one release store.
fn publish(a: &mut Active, entries: &[(u16, u32)]) -> bool {
    let q = &mut a.rx;
    let size = q.size();
    let ring = GuestAddress(q.used_ring());
    let mut next = Wrapping(q.next_used());
    for &(head, len) in entries {
        // A virtq_used_elem: id (le32), len (le32), after flags and idx.
        let mut elem = [0u8; 8];
        elem[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        elem[4..].copy_from_slice(&len.to_le_bytes());
        let slot = u64::from(next.0 % size.max(1));
        let at = ring.0.checked_add(4 + slot * 8).map(GuestAddress);
        // The ring was checked to lie in guest memory at activation.
        if at.is_none_or(|at| a.mem.write_slice(&elem, at).is_err()) {
            return false;
        }
        next += Wrapping(1);
    }
    q.set_next_used(next.0);
    let Some(idx_at) = ring.0.checked_add(2).map(GuestAddress) else {
        return false;
    };
    a.mem
        .store(next.0.to_le(), idx_at, Ordering::Release)
        .is_ok()
}

/// Asks the driver to notify when it adds buffers after the ones it has
/// made available (with EVENT_IDX: `avail_event` at the ring's end, not at
/// the first buffer the device left there). True if it added some
/// meanwhile.
fn notify_on_more(a: &mut Active) -> bool {
    let Ok(end) = a.rx.avail_idx(&a.mem, Ordering::Acquire) else {
        return false;
    };
    let keep = a.rx.next_avail();
    a.rx.set_next_avail(end.0);
    let more = a.rx.enable_notification(&a.mem).unwrap_or(false);
    a.rx.set_next_avail(keep);
    more
}

impl Inner {
    /// Fills the one held slot from the TAP; false when nothing is queued.
    fn fill_held(&mut self) -> bool {
        loop {
            match self.tap.read(&mut self.rx_buf) {
                Ok(n) if (VNET_HDR_LEN + ETH_HDR_LEN..=MAX_FRAME_LEN).contains(&n) => {
                    // Offloads the driver did not take: dropped.
                    if offload::rx_header(self.acked, &mut self.rx_buf[..n]) {
                        self.rx_held = Some(n);
                        return true;
                    }
                    self.counters.rx_tap_errors += 1;
                }
                Ok(_) => self.counters.rx_tap_errors += 1,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(_) => {
                    self.counters.rx_tap_errors += 1;
                    return false;
                }
            }
        }
    }

    /// Moves frames from the TAP into the guest's rx buffers until the TAP
    /// is empty, the guest has too few buffers, or the rate limit says
    /// wait; at most one frame is held meanwhile. Returns whether a buffer
    /// was used.
    pub(super) fn process_rx(&mut self, a: &mut Active) -> bool {
        let mut used = false;
        if self.rx_retry.is_some_and(|t| (self.clock)() < t) {
            return false;
        }
        let merge = self.acked & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
        let mut rechecked = false;
        let mut entries: Vec<(u16, u32)> = Vec::new();
        loop {
            if self.rx_held.is_none() && !self.fill_held() {
                break;
            }
            let len = self.rx_held.unwrap_or(0);
            let mem = &a.mem;
            let mut chains: Vec<Chain<'_>> = Vec::new();
            let mut have = 0usize;
            let gathered = loop {
                if !chains.is_empty() && (have >= len || !merge) {
                    break Gathered::Enough;
                }
                if chains.len() >= usize::from(a.rx.size()) {
                    break Gathered::Never;
                }
                let Some(chain) = a.rx.pop_descriptor_chain(mem) else {
                    break Gathered::Short;
                };
                let r = room(&chain);
                chains.push(chain);
                match r {
                    Some(r) => have = have.saturating_add(r),
                    None => break Gathered::Malformed,
                }
            };
            if let Gathered::Short = gathered {
                // The buffers stay in the ring; the frame waits for more
                // (the driver's notification runs this again), unless it
                // added some meanwhile.
                for _ in 0..chains.len() {
                    a.rx.go_to_previous_position();
                }
                let more = if chains.is_empty() {
                    a.rx.enable_notification(&a.mem).unwrap_or(false)
                } else {
                    notify_on_more(a)
                };
                if more && !rechecked {
                    rechecked = true;
                    continue;
                }
                break;
            }
            rechecked = false;
            let now = (self.clock)();
            let packets = offload::wire_packets(&self.rx_buf[..len]);
            let limited = self
                .rx_limiter
                .consume_packets(frame_bytes(len), packets, now);
            if let Err(until) = limited {
                for _ in 0..chains.len() {
                    a.rx.go_to_previous_position();
                }
                self.rx_retry = Some(until);
                self.counters.rx_throttled += 1;
                break;
            }
            self.rx_retry = None;
            self.rx_held = None;
            entries.clear();
            let outcome = match gathered {
                Gathered::Malformed => Err(RxDrop::Malformed),
                Gathered::Never => Err(RxDrop::TooSmall),
                _ => self.write_frame(mem, &chains, len, &mut entries),
            };
            match outcome {
                Ok(()) => {
                    self.counters.rx_packets += 1;
                    self.counters.rx_bytes += frame_bytes(len);
                }
                Err(drop) => {
                    match drop {
                        RxDrop::TooSmall => self.counters.rx_too_small += 1,
                        RxDrop::Malformed => self.counters.rx_malformed += 1,
                    }
                    // Every buffer goes back to the guest, empty.
                    entries.clear();
                    entries.extend(chains.iter().map(|c| (c.head_index(), 0)));
                }
            }
            used |= publish(a, &entries);
        }
        used
    }

    /// Writes the held frame (`len` bytes) across `chains`, its header
    /// saying how many; `entries` gets each buffer's head and length.
    fn write_frame(
        &mut self,
        mem: &GuestMemoryMmap,
        chains: &[Chain<'_>],
        len: usize,
        entries: &mut Vec<(u16, u32)>,
    ) -> Result<(), RxDrop> {
        // At most a ring's worth (a u16).
        let count = u16::try_from(chains.len()).map_err(|_| RxDrop::TooSmall)?;
        self.rx_buf[10..12].copy_from_slice(&count.to_le_bytes());
        let mut off = 0usize;
        for chain in chains {
            let n = fill_chain(mem, chain.clone(), &self.rx_buf[off..len])?;
            off += n;
            // At most MAX_FRAME_LEN.
            let n = u32::try_from(n).map_err(|_| RxDrop::TooSmall)?;
            entries.push((chain.head_index(), n));
        }
        if off < len {
            return Err(RxDrop::TooSmall);
        }
        Ok(())
    }
}
