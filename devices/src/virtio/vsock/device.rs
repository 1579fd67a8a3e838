//! The virtio side: features, config space, and serving the rx, tx and
//! event queues. Runs on vCPU threads (queue notifications) and on the
//! event thread (host readiness), always under the shared lock.

use super::events::VsockEvents;
use super::muxer::{Counters, Muxer};
use super::persist::{VsockArgs, VsockState};
use super::shared::{lock, Active, Inner, Shared};
use super::{EVQ, QUEUE_SIZE, RXQ, TXQ, TYPE_VSOCK};
use crate::virtio::{ActivateError, VirtioDevice, VirtioInterrupt, VIRTIO_F_VERSION_1};
use snapshot::Persist;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// Set-up errors of a vsock device.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// The cid is reserved (0, 1, 2), or not a valid 32-bit guest cid.
    #[error("guest cid {0} is invalid: it must be in 3..=4294967294")]
    Cid(u64),
    /// The host socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The wake-up eventfd could not be created.
    #[error("cannot create eventfd: {0}")]
    EventFd(std::io::Error),
    /// The connect-timeout timerfd could not be created.
    #[error("cannot create timerfd: {0}")]
    TimerFd(std::io::Error),
    /// Saved state with a queue count other than 0 (inactive) or 3.
    #[error("saved vsock state has {0} queues; an active device has 3, an inactive one none")]
    QueueCount(usize),
    /// A saved queue is invalid.
    #[error("saved vsock queue {index} is invalid: {source:?}")]
    Queue {
        /// Queue index.
        index: usize,
        /// virtio-queue's error.
        source: virtio_queue::Error,
    },
    /// Re-activating the restored device failed.
    #[error("re-activating the restored vsock device: {0}")]
    Activate(ActivateError),
}

/// A virtio-vsock device (the part the MMIO transport owns).
pub struct Vsock {
    shared: Shared,
    wake: Arc<EventFd>,
    config: [u8; 8],
    /// The event-thread half until [`Vsock::take_events`] hands it out.
    events: Option<VsockEvents>,
}

/// A cloneable handle on a vsock device for the VMM: transport reset,
/// snapshot state and counters, usable after the device moved into its
/// transport.
#[derive(Clone)]
pub struct VsockHandle {
    shared: Shared,
    wake: Arc<EventFd>,
}

impl Vsock {
    /// A device for guest `cid` whose host side listens on `uds_path` (which
    /// must not exist; it is removed when the [`VsockEvents`] half is
    /// dropped). Register the [`VsockEvents`] half with the VMM's
    /// `EventManager`; put the [`Vsock`] half behind an MMIO transport.
    pub fn new(cid: u64, uds_path: &Path) -> Result<Vsock, VsockError> {
        if !(3..u64::from(u32::MAX)).contains(&cid) {
            return Err(VsockError::Cid(cid));
        }
        let listener = UnixListener::bind(uds_path).map_err(|source| VsockError::Bind {
            path: uds_path.to_owned(),
            source,
        })?;
        let listener = match listener.set_nonblocking(true) {
            Ok(()) => listener,
            Err(source) => {
                let _ = std::fs::remove_file(uds_path);
                return Err(VsockError::Bind {
                    path: uds_path.to_owned(),
                    source,
                });
            }
        };
        let wake = match EventFd::new(libc::EFD_NONBLOCK) {
            Ok(w) => Arc::new(w),
            Err(e) => {
                let _ = std::fs::remove_file(uds_path);
                return Err(VsockError::EventFd(e));
            }
        };
        let shared = Arc::new(Mutex::new(Inner {
            muxer: Muxer::new(cid, uds_path),
            acked: 0,
            active: None,
            reset_pending: false,
            reset_delivered: false,
            reset_acked: true,
        }));
        let timer = match vmm_sys_util::timerfd::TimerFd::new() {
            Ok(t) => t,
            Err(e) => {
                let _ = std::fs::remove_file(uds_path);
                return Err(VsockError::TimerFd(e.into()));
            }
        };
        let events = VsockEvents::new(shared.clone(), listener, wake.clone(), timer, uds_path);
        Ok(Vsock {
            shared,
            wake,
            config: cid.to_le_bytes(),
            events: Some(events),
        })
    }

    /// The event-thread half, once: register it with the VMM's
    /// `EventManager` before the guest uses the device (until then no host
    /// socket is served). `None` after the first call.
    pub fn take_events(&mut self) -> Option<VsockEvents> {
        self.events.take()
    }

    /// A handle for the VMM.
    pub fn handle(&self) -> VsockHandle {
        VsockHandle {
            shared: self.shared.clone(),
            wake: self.wake.clone(),
        }
    }

    /// Wakes the event thread if it has sockets to (un)watch.
    fn kick(&self, inner: &Inner) {
        kick(&self.wake, inner);
    }
}

fn kick(wake: &EventFd, inner: &Inner) {
    if inner.muxer.needs_reconcile() {
        // EAGAIN means a wake-up is already pending, which is enough.
        let _ = wake.write(1);
    }
}

impl VsockHandle {
    /// Drops every connection and tells the guest with
    /// VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (now, or as soon as the device is
    /// active and the guest has an event buffer). Use after a restore.
    pub fn send_transport_reset(&self) {
        let mut inner = lock(&self.shared);
        inner.transport_reset();
        kick(&self.wake, &inner);
    }

    /// Live connections.
    pub fn connection_count(&self) -> usize {
        lock(&self.shared).muxer.conn_count()
    }

    /// Guest->host bytes held in VMM memory for slow host readers (at most
    /// [`super::CONN_TX_BUF_SIZE`] per connection).
    pub fn buffered_bytes(&self) -> usize {
        lock(&self.shared).muxer.buffered_bytes()
    }

    /// Packets dropped, RSTs sent, connections opened/closed/refused.
    pub fn counters(&self) -> Counters {
        lock(&self.shared).muxer.counters
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        TYPE_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn avail_features(&self) -> u64 {
        1u64 << VIRTIO_F_VERSION_1
    }

    fn set_acked_features(&mut self, features: u64) {
        lock(&self.shared).acked = features;
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::virtio::read_config_bytes(&self.config, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        irq: Arc<VirtioInterrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        let [rx, tx, ev] =
            <[Queue; 3]>::try_from(queues).map_err(|q| ActivateError::QueueCount {
                expected: 3,
                got: q.len(),
            })?;
        let mut inner = lock(&self.shared);
        inner.active = Some(Active {
            mem,
            irq,
            rx,
            tx,
            ev,
        });
        // Host connections may have queued REQUESTs before the driver came.
        inner.process();
        inner.process_events(false);
        self.kick(&inner);
        Ok(())
    }

    fn queue_notify(&mut self, index: u32) {
        let mut inner = lock(&self.shared);
        match index as usize {
            RXQ | TXQ => inner.process(),
            EVQ => {
                let was = inner.reset_acked;
                inner.process_events(true);
                if inner.reset_acked && !was {
                    // Deferred host connections can go ahead now.
                    let _ = self.wake.write(1);
                }
            }
            _ => return,
        }
        self.kick(&inner);
    }

    fn reset(&mut self) {
        let mut inner = lock(&self.shared);
        inner.muxer.kill_all();
        inner.active = None;
        inner.acked = 0;
        self.kick(&inner);
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        let inner = lock(&self.shared);
        inner
            .active
            .iter()
            .flat_map(|a| [a.rx.state(), a.tx.state(), a.ev.state()])
            .collect()
    }
}

impl Persist for Vsock {
    type State = VsockState;
    type ConstructorArgs = VsockArgs;
    type Error = VsockError;

    fn save(&self) -> Result<VsockState, VsockError> {
        Ok(lock(&self.shared).save())
    }

    /// A new device for the saved cid on `args.uds_path` (connections are
    /// not saved), with the saved features and, if it was active, its
    /// queues at their saved positions. The VMM restores through the MMIO
    /// transport instead, which re-activates a fresh device itself.
    fn restore(args: VsockArgs, state: &VsockState) -> Result<Self, VsockError> {
        let queues = match state.queues.len() {
            0 => None,
            3 => Some(
                state
                    .queues
                    .iter()
                    .enumerate()
                    .map(|(index, q)| {
                        q.to_queue()
                            .map_err(|source| VsockError::Queue { index, source })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            n => return Err(VsockError::QueueCount(n)),
        };
        let mut dev = Vsock::new(state.cid, &args.uds_path)?;
        dev.set_acked_features(state.acked_features);
        if let Some(q) = queues {
            dev.activate(args.mem, args.irq, q)
                .map_err(VsockError::Activate)?;
        }
        Ok(dev)
    }
}
