//! The balloon's stats timer on the VMM's event thread: every interval it
//! returns the stats buffer the device holds, so the guest sends fresh
//! statistics without anyone asking.

use super::device::BalloonHandle;
use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use std::os::fd::AsRawFd;
use std::time::Duration;
use vmm_sys_util::timerfd::TimerFd;

/// An `event_manager` subscriber asking the guest for new stats every
/// interval (see [`BalloonHandle::stats_timer`]).
pub struct BalloonEvents {
    handle: BalloonHandle,
    timer: TimerFd,
}

impl BalloonEvents {
    pub(super) fn new(handle: BalloonHandle, every: Duration) -> std::io::Result<Self> {
        let mut timer = TimerFd::new().map_err(std::io::Error::from)?;
        timer
            .reset(every, Some(every))
            .map_err(std::io::Error::from)?;
        Ok(Self { handle, timer })
    }
}

impl MutEventSubscriber for BalloonEvents {
    fn init(&mut self, ops: &mut EventOps) {
        // Failing here leaves stats to explicit requests; the trait has no
        // error channel.
        let _ = ops.add(Events::new_raw(self.timer.as_raw_fd(), EventSet::IN));
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if events.fd() != self.timer.as_raw_fd() {
            let _ = ops.remove(Events::empty_raw(events.fd()));
            return;
        }
        // Readable: the expiry count is there, so this does not block.
        let _ = self.timer.wait();
        self.handle.request_stats();
    }
}
