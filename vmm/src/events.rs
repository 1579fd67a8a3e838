//! The VMM's event thread: one epoll loop (rust-vmm `event-manager`) for
//! devices that wait on host file descriptors (vsock sockets, ...).
//! Subscribers can be added and removed while it runs (device reload).

use event_manager::{
    EventManager, EventOps, Events, MutEventSubscriber, RemoteEndpoint, SubscriberId, SubscriberOps,
};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

/// A device's event subscriber, owned by the event thread.
pub type Subscriber = Box<dyn MutEventSubscriber + Send>;

/// Errors of the event thread.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The thread or its eventfd could not be created.
    #[error("cannot start the event thread: {0}")]
    Start(std::io::Error),
    /// The event manager refused an operation.
    #[error("event thread: {0:?}")]
    Manager(event_manager::Error),
    /// The thread did not stop serving devices in time.
    #[error("the event thread stayed busy for {0:?}")]
    Busy(Duration),
}

/// Ends the loop when its eventfd is written.
struct ExitSubscriber {
    evt: EventFd,
    done: Arc<AtomicBool>,
}

impl MutEventSubscriber for ExitSubscriber {
    fn process(&mut self, _: Events, _: &mut EventOps) {
        let _ = self.evt.read();
        self.done.store(true, Ordering::Release);
    }

    fn init(&mut self, ops: &mut EventOps) {
        // Registration of a fresh eventfd cannot collide; if it failed the
        // loop would only end with the process.
        let _ = ops.add(Events::new_raw(self.evt.as_raw_fd(), EventSet::IN));
    }
}

/// The running event thread.
/// While alive, the event thread serves no device ([`EventThread::hold`]).
pub struct Held {
    _release: mpsc::Sender<()>,
}

pub struct EventThread {
    exit: EventFd,
    handle: JoinHandle<()>,
    endpoint: RemoteEndpoint<Subscriber>,
}

/// Starts the loop with `subs`, its thread under `seccomp`'s event-thread
/// filter (installed before it first polls; failing to install it ends
/// the VMM); returns it and their ids.
pub fn start(
    subs: Vec<Subscriber>,
    seccomp: Option<Arc<crate::seccomp::Filters>>,
) -> Result<(EventThread, Vec<SubscriberId>), EventError> {
    let exit = EventFd::new(libc::EFD_NONBLOCK).map_err(EventError::Start)?;
    let sub_exit = exit.try_clone().map_err(EventError::Start)?;
    let mut em = EventManager::<Subscriber>::new().map_err(EventError::Manager)?;
    let done = Arc::new(AtomicBool::new(false));
    em.add_subscriber(Box::new(ExitSubscriber {
        evt: sub_exit,
        done: done.clone(),
    }));
    let ids = subs.into_iter().map(|s| em.add_subscriber(s)).collect();
    let endpoint = em.remote_endpoint();
    let handle = std::thread::Builder::new()
        .name("events".into())
        .spawn(move || {
            // Installed here, not waited for by the starter: the VM's
            // set-up goes on meanwhile.
            if let Some(Err(e)) = seccomp.map(|f| f.install(crate::seccomp::Role::Events)) {
                crate::seccomp::fatal(e);
            }
            while !done.load(Ordering::Acquire) {
                if em.run().is_err() {
                    break;
                }
            }
        })
        .map_err(EventError::Start)?;
    Ok((
        EventThread {
            exit,
            handle,
            endpoint,
        },
        ids,
    ))
}

impl EventThread {
    /// Adds a subscriber to the running loop.
    pub fn add(&self, s: Subscriber) -> Result<SubscriberId, EventError> {
        self.endpoint
            .call_blocking(move |ops| -> Result<SubscriberId, event_manager::Error> {
                Ok(ops.add_subscriber(s))
            })
            .map_err(EventError::Manager)
    }

    /// Removes (and drops) a subscriber.
    pub fn remove(&self, id: SubscriberId) -> Result<(), EventError> {
        self.endpoint
            .call_blocking(move |ops| ops.remove_subscriber(id).map(drop))
            .map_err(EventError::Manager)
    }

    /// Stops the event thread from serving devices until the returned
    /// guard is dropped (or `longest` passes, so devices never stay stuck
    /// behind a caller that died): while it holds, no device handler runs,
    /// so none writes guest memory. Waits at most `wait` for the thread to
    /// get there (it may be inside a handler).
    pub fn hold(&self, wait: Duration, longest: Duration) -> Result<Held, EventError> {
        let (parked_tx, parked_rx) = mpsc::channel::<()>();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        self.endpoint
            .fire(move |_| {
                let _ = parked_tx.send(());
                // Returns when the guard goes (its sender dropped) or at
                // the deadline.
                let _ = release_rx.recv_timeout(longest);
            })
            .map_err(EventError::Manager)?;
        parked_rx
            .recv_timeout(wait)
            .map_err(|_| EventError::Busy(wait))?;
        Ok(Held {
            _release: release_tx,
        })
    }

    /// Ends the loop and waits for the thread.
    pub fn stop(self) {
        let _ = self.exit.write(1);
        let _ = self.handle.join();
    }
}
