//! Slots made ahead: a background thread keeps `target` slots ready, so
//! that taking one is a queue pop (a mutex and a `VecDeque`): measured
//! 16 µs for a take against 95 ms to make a slot (about 15 `ip` calls and
//! one `nft`) on the shared 2-core host; `tests/slots.rs`'s pool test
//! prints both (`--nocapture`), it asserts neither. A slot is made with
//! the policy the pool was last asked to prepare ([`SlotPool::prepare`];
//! at first none: it denies everything), and a take prefers a slot that
//! already has the policy wanted ([`SlotPool::take_wait_for`]): the
//! sandboxes of one job mostly share one policy, and then a create runs no
//! `nft` at all ([`Slot::has_policy`]). Otherwise the caller sets the
//! policy ([`Slot::set_policy`], one nft call); its TAP is root's until
//! the caller sets its owner ([`Slot::set_tap_owner`], two ioctls).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::host::HostNet;
use crate::policy::EgressPolicy;
use crate::slot::{GuestLink, Slot, SlotError};

/// The most slots a pool keeps ready.
pub const MAX_TARGET: usize = 256;
/// The longest pause after failures to make a slot.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

#[derive(Default)]
struct State {
    ready: VecDeque<Slot>,
    /// The policy new slots are made with.
    prepare: EgressPolicy,
    stopping: bool,
    last_error: Option<String>,
}

struct Inner {
    net: Arc<HostNet>,
    target: usize,
    state: Mutex<State>,
    cv: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A pool of ready slots with TAP guest links.
pub struct SlotPool {
    inner: Arc<Inner>,
    filler: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for SlotPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPool")
            .field("target", &self.inner.target)
            .field("ready", &self.ready())
            .finish()
    }
}

impl SlotPool {
    /// Starts filling a pool of `target` slots (capped at [`MAX_TARGET`])
    /// from `net` in the background.
    pub fn start(net: Arc<HostNet>, target: usize) -> std::io::Result<SlotPool> {
        let inner = Arc::new(Inner {
            net,
            target: target.min(MAX_TARGET),
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let i = inner.clone();
        let filler = thread::Builder::new()
            .name("shoal-slot-pool".into())
            .spawn(move || fill(&i))?;
        Ok(SlotPool {
            inner,
            filler: Mutex::new(Some(filler)),
        })
    }

    /// A ready slot, if there is one (never waits); the pool makes another.
    pub fn take(&self) -> Option<Slot> {
        let slot = self.inner.lock().ready.pop_front();
        self.inner.cv.notify_all();
        slot
    }

    /// A ready slot, waiting up to `timeout` for one.
    pub fn take_wait(&self, timeout: Duration) -> Option<Slot> {
        self.take_wait_for(&EgressPolicy::default(), timeout)
    }

    /// A ready slot, waiting up to `timeout` for one: one made with
    /// `want` if there is one ready, else the oldest.
    pub fn take_wait_for(&self, want: &EgressPolicy, timeout: Duration) -> Option<Slot> {
        let st = self.inner.lock();
        let (mut st, _) = self
            .inner
            .cv
            .wait_timeout_while(st, timeout, |s| s.ready.is_empty() && !s.stopping)
            .unwrap_or_else(|e| e.into_inner());
        let at = st.ready.iter().position(|s| s.policy() == *want);
        let slot = st.ready.remove(at.unwrap_or(0));
        drop(st);
        self.inner.cv.notify_all();
        slot
    }

    /// The policy slots are made with now.
    pub fn prepared(&self) -> EgressPolicy {
        self.inner.lock().prepare.clone()
    }

    /// Makes the slots made from now on with `policy` (slots already ready
    /// keep theirs).
    pub fn prepare(&self, policy: &EgressPolicy) {
        let mut st = self.inner.lock();
        if st.prepare != *policy {
            st.prepare = policy.clone();
        }
    }

    /// How many slots are ready.
    pub fn ready(&self) -> usize {
        self.inner.lock().ready.len()
    }

    /// The last failure to make a slot, if the pool is short because of it.
    pub fn last_error(&self) -> Option<String> {
        self.inner.lock().last_error.clone()
    }

    /// Stops filling and removes every ready slot; reports the first
    /// removal that failed.
    pub fn shutdown(self) -> Result<(), SlotError> {
        self.stop()
    }

    /// [`SlotPool::shutdown`] of a shared pool: no slot is made or handed
    /// out after it.
    pub fn stop(&self) -> Result<(), SlotError> {
        self.inner.lock().stopping = true;
        self.inner.cv.notify_all();
        let filler = self.filler.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(f) = filler {
            let _ = f.join();
        }
        let ready: Vec<Slot> = self.inner.lock().ready.drain(..).collect();
        let mut first = Ok(());
        for s in ready {
            if let Err(e) = s.remove() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl Drop for SlotPool {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!("removing pooled slots: {e}");
        }
    }
}

fn fill(inner: &Inner) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let policy = {
            let st = inner.lock();
            let st = inner
                .cv
                .wait_while(st, |s| !s.stopping && s.ready.len() >= inner.target)
                .unwrap_or_else(|e| e.into_inner());
            if st.stopping {
                return;
            }
            st.prepare.clone()
        };
        let made = Slot::create(&inner.net, &GuestLink::Tap { owner: None }, policy);
        let mut st = inner.lock();
        match made {
            Ok(slot) if !st.stopping => {
                st.ready.push_back(slot);
                st.last_error = None;
                backoff = Duration::from_millis(100);
                inner.cv.notify_all();
            }
            Ok(slot) => {
                drop(st);
                drop(slot);
                return;
            }
            Err(e) => {
                tracing::warn!("slot pool: {e}");
                st.last_error = Some(e.to_string());
                let _ = inner
                    .cv
                    .wait_timeout_while(st, backoff, |s| !s.stopping)
                    .unwrap_or_else(|e| e.into_inner());
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}
