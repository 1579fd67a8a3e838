//! The virtio side: features, config space (the host's MAC and the link
//! status), and serving the rx and tx queues on queue notifications.

use super::events::NetEvents;
use super::persist::{NetArgs, NetState};
use super::shared::{lock, Active, Inner, NetCounters, Shared};
use super::tap::Tap;
use super::{
    MacAddr, MacError, NetConfig, QUEUE_SIZE, RXQ, TXQ, TYPE_NET, VIRTIO_NET_F_MAC,
    VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use crate::rate_limiter::{RateLimitError, RateLimiter};
use crate::virtio::persist::QueueState;
use crate::virtio::{
    ActivateError, VirtioDevice, VirtioInterrupt, INT_CONFIG, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX,
};
use snapshot::Persist;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::timerfd::TimerFd;

/// Set-up errors of a net device.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The MAC cannot be a device's own.
    #[error(transparent)]
    Mac(#[from] MacError),
    /// A rate limit is invalid.
    #[error("invalid {direction} rate limit: {source}")]
    RateLimit {
        /// "rx" or "tx".
        direction: &'static str,
        /// What is wrong with it.
        source: RateLimitError,
    },
    /// The retry timerfd could not be created.
    #[error("cannot create the rate limiter's timerfd: {0}")]
    TimerFd(#[source] std::io::Error),
    /// Saved state with a queue count other than 0 (inactive) or 2.
    #[error("saved net state has {0} queues; an active device has 2, an inactive one none")]
    QueueCount(usize),
    /// Saved features the device does not offer.
    #[error("saved net features {saved:#x} include some the device does not offer ({offered:#x})")]
    Features {
        /// In the snapshot.
        saved: u64,
        /// Offered now.
        offered: u64,
    },
    /// A saved queue is invalid.
    #[error("saved net queue {index} is invalid: {source:?}")]
    Queue {
        /// Queue index.
        index: usize,
        /// virtio-queue's error.
        source: virtio_queue::Error,
    },
    /// Re-activating the restored device failed.
    #[error("re-activating the restored net device: {0}")]
    Activate(#[source] ActivateError),
}

/// A virtio-net device (the part the MMIO transport owns).
pub struct Net {
    shared: Shared,
    /// The event-thread half until [`Net::take_events`] hands it out.
    events: Option<NetEvents>,
}

/// A cloneable handle on a net device for the VMM, usable after the
/// device moved into its transport.
#[derive(Clone)]
pub struct NetHandle {
    shared: Shared,
}

const FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_NET_F_MAC)
    | (1 << VIRTIO_NET_F_STATUS)
    | (1 << VIRTIO_NET_F_MRG_RXBUF)
    | super::offload::OFFLOAD_FEATURES;

impl Net {
    /// A device on `tap` with `cfg`'s MAC and rate limits. Register the
    /// [`NetEvents`] half ([`Net::take_events`]) with the VMM's
    /// `EventManager`; put the [`Net`] half behind an MMIO transport.
    pub fn new(tap: Tap, cfg: &NetConfig) -> Result<Net, NetError> {
        let mac = cfg.mac.validate()?;
        let now = Instant::now();
        let limiter = |limit, direction| {
            RateLimiter::new(limit, now).map_err(|source| NetError::RateLimit { direction, source })
        };
        let rx = limiter(cfg.rx_rate, "rx")?;
        let tx = limiter(cfg.tx_rate, "tx")?;
        let timer = TimerFd::new().map_err(|e| NetError::TimerFd(e.into()))?;
        set_nonblocking(timer.as_raw_fd()).map_err(NetError::TimerFd)?;
        // A TAP reused from an earlier device may still have offloads on:
        // none until this device's driver takes them (best effort: frames
        // asking for more than the driver took are dropped anyway).
        let _ = tap.set_offload(0);
        let tap_fd = tap.as_raw_fd();
        let timer_fd = timer.as_raw_fd();
        let shared = Arc::new(Mutex::new(Inner::new(tap, mac, rx, tx, timer)));
        let events = NetEvents::new(shared.clone(), tap_fd, timer_fd);
        Ok(Net {
            shared,
            events: Some(events),
        })
    }

    /// The event-thread half, once: register it with the VMM's
    /// `EventManager` (until then frames the host sends wait in the TAP's
    /// queue, and a rate-limited direction resumes only on the guest's next
    /// notification). `None` after the first call.
    pub fn take_events(&mut self) -> Option<NetEvents> {
        self.events.take()
    }

    /// A handle for the VMM.
    pub fn handle(&self) -> NetHandle {
        NetHandle {
            shared: self.shared.clone(),
        }
    }

    /// Replaces the clock the rate limiters read (tests freeze it, so a
    /// budget is counted in tokens, not in how fast the host runs).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn set_clock(&self, clock: Arc<dyn Fn() -> Instant + Send + Sync>) {
        lock(&self.shared).clock = clock;
    }
}

fn set_nonblocking(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: F_GETFL on an fd the caller owns; the result is checked.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: F_SETFL with the flags just read plus O_NONBLOCK.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl NetHandle {
    /// Frame and drop counters.
    pub fn counters(&self) -> NetCounters {
        lock(&self.shared).counters
    }

    /// The MAC in config space (the only one the guest may send from).
    pub fn mac(&self) -> MacAddr {
        lock(&self.shared).mac
    }

    /// The TAP's interface name.
    pub fn tap_name(&self) -> String {
        lock(&self.shared).tap.name().to_owned()
    }

    /// When a rate-limited direction will be served again, if one waits.
    /// [`NetEvents`] serves it then by itself (a timerfd); this is for
    /// reporting.
    pub fn retry_deadline(&self) -> Option<Instant> {
        lock(&self.shared).retry_deadline()
    }

    /// Bytes of host-to-guest frame held in VMM memory waiting for a guest
    /// buffer or the rate limit: 0 or one frame, at most
    /// [`super::MAX_FRAME_LEN`].
    pub fn held_bytes(&self) -> usize {
        lock(&self.shared).held_bytes()
    }

    /// Raises the configuration-change interrupt if the device is active
    /// and the driver took VIRTIO_NET_F_STATUS (after a restore: config
    /// space now has the clone's MAC). Returns whether it was raised.
    /// Linux re-reads only the link status on it, not the MAC: the guest
    /// agent sets the interface's address itself.
    pub fn signal_config_change(&self) -> bool {
        let inner = lock(&self.shared);
        match &inner.active {
            Some(a) if inner.acked & (1 << VIRTIO_NET_F_STATUS) != 0 => {
                a.irq.signal(INT_CONFIG).is_ok()
            }
            _ => false,
        }
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        TYPE_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 2]
    }

    fn avail_features(&self) -> u64 {
        FEATURES
    }

    fn set_acked_features(&mut self, features: u64) {
        lock(&self.shared).acked = features & FEATURES;
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_net_config: mac[6], status (le16).
        let mut config = [0u8; 8];
        config[..6].copy_from_slice(&lock(&self.shared).mac.0);
        config[6..].copy_from_slice(&VIRTIO_NET_S_LINK_UP.to_le_bytes());
        crate::virtio::read_config_bytes(&config, offset, data);
    }

    /// The MAC is the host's: config writes are ignored.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        irq: Arc<VirtioInterrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        let [mut rx, mut tx] =
            <[Queue; 2]>::try_from(queues).map_err(|q| ActivateError::QueueCount {
                expected: 2,
                got: q.len(),
            })?;
        let mut inner = lock(&self.shared);
        let event_idx = inner.acked & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        rx.set_event_idx(event_idx);
        tx.set_event_idx(event_idx);
        inner.set_tap_offload();
        inner.active = Some(Active::new(mem, irq, rx, tx));
        // Frames may have queued on the TAP before the driver came.
        inner.process();
        Ok(())
    }

    fn queue_notify(&mut self, index: u32) {
        if matches!(usize::try_from(index), Ok(RXQ | TXQ)) {
            lock(&self.shared).process();
        }
    }

    fn reset(&mut self) {
        lock(&self.shared).deactivate();
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        let inner = lock(&self.shared);
        inner
            .active
            .iter()
            .flat_map(|a| [a.rx.state(), a.tx.state()])
            .collect()
    }
}

impl Persist for Net {
    type State = NetState;
    type ConstructorArgs = NetArgs;
    type Error = NetError;

    fn save(&self) -> Result<NetState, NetError> {
        let inner = lock(&self.shared);
        Ok(NetState {
            mac: inner.mac,
            acked_features: inner.acked,
            queues: inner
                .active
                .iter()
                .flat_map(|a| [a.rx.state(), a.tx.state()])
                .map(QueueState::from)
                .collect(),
        })
    }

    /// A new device on `args.tap` with `args.config`'s MAC (never the saved
    /// one: a clone must not send as its template), the saved features and,
    /// if it was active, its queues at their saved positions. The frame rx
    /// held and the rate limiters' levels are not saved (buckets start
    /// full). The VMM may restore through the MMIO transport instead, which
    /// re-activates a fresh [`Net::new`] itself; either way config space
    /// shows the new MAC.
    fn restore(args: NetArgs, state: &NetState) -> Result<Self, NetError> {
        if state.acked_features & !FEATURES != 0 {
            return Err(NetError::Features {
                saved: state.acked_features,
                offered: FEATURES,
            });
        }
        let queues = match state.queues.len() {
            0 => None,
            2 => Some(
                state
                    .queues
                    .iter()
                    .enumerate()
                    .map(|(index, q)| {
                        q.to_queue()
                            .map_err(|source| NetError::Queue { index, source })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            n => return Err(NetError::QueueCount(n)),
        };
        let mut dev = Net::new(args.tap, &args.config)?;
        dev.set_acked_features(state.acked_features);
        if let Some(q) = queues {
            if let Some(bad) = q.iter().position(|q| !q.is_valid(&args.mem)) {
                return Err(NetError::Activate(ActivateError::Device(format!(
                    "queue {bad} is not valid"
                ))));
            }
            dev.activate(args.mem, args.irq, q)
                .map_err(NetError::Activate)?;
        }
        Ok(dev)
    }
}
