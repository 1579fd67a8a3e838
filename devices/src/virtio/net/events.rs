//! The event-thread half: serves the TAP's readiness (frames for the
//! guest) and the rate limiter's retry timer.
//!
//! The TAP is watched edge-triggered: rx reads it until it is empty, the
//! guest has no buffer or the rate limit says wait, and in the last two
//! cases something else resumes it (the guest's rx notification, the
//! timer), so a TAP with frames nobody takes does not wake this thread
//! again and again.

use super::shared::{lock, Shared};
use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use std::os::fd::RawFd;

/// The net device's `event_manager` subscriber; register it with the
/// VMM's `EventManager` (boxed, or as `Arc<Mutex<NetEvents>>`).
pub struct NetEvents {
    shared: Shared,
    tap: RawFd,
    timer: RawFd,
}

impl NetEvents {
    /// `tap` and `timer` are fds of the TAP and timerfd `shared` owns (they
    /// live as long as it does).
    pub(super) fn new(shared: Shared, tap: RawFd, timer: RawFd) -> Self {
        Self { shared, tap, timer }
    }
}

impl MutEventSubscriber for NetEvents {
    fn init(&mut self, ops: &mut EventOps) {
        // Failing here leaves the device without host-to-guest frames and
        // rate-limit retries (the guest's notifications still serve it);
        // there is no error channel in this trait.
        let _ = ops.add(Events::new_raw(
            self.tap,
            EventSet::IN | EventSet::EDGE_TRIGGERED,
        ));
        let _ = ops.add(Events::new_raw(self.timer, EventSet::IN));
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        let mut inner = lock(&self.shared);
        if fd == self.tap {
            inner.process();
        } else if fd == self.timer {
            // Non-blocking: a timer re-armed since it fired reads EAGAIN.
            let _ = inner.timer.wait();
            inner.on_timer();
        } else {
            let _ = ops.remove(Events::empty_raw(fd));
        }
    }
}
