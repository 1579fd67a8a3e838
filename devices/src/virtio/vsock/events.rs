//! The event-thread half: accepts host sockets, reads their CONNECT
//! lines, and reacts to each connection's readiness. It owns the epoll
//! watch list (through `EventOps`); the vCPU side only records what changed
//! and wakes it through an eventfd.
//!
//! A watched connection socket is closed only here, after it left the
//! watch list, so an fd number is never reused while epoll (or
//! `event_manager`'s dispatch table) still knows the old one.
//!
//! A timerfd, armed only while a host socket is still sending its CONNECT
//! line, waits for a transport reset, or waits for the guest's RESPONSE,
//! ticks every [`TICK`]; each tick closes those older than
//! [`CONNECT_TIMEOUT`] (so a guest that never answers holds nothing).

use super::handshake::{Handshake, Progress};
use super::muxer::ConnKey;
use super::shared::{lock, Inner, Shared};
use super::CONNECT_TIMEOUT;
use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use std::collections::HashMap;
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

/// Sockets accepted per listener event before other events get a turn.
const ACCEPT_BATCH: usize = 64;

/// How often the connect timeout is checked while something waits: a
/// socket is closed between [`CONNECT_TIMEOUT`] and that plus one tick
/// after it came.
pub const TICK: Duration = Duration::from_millis(500);

/// What a watched fd is.
enum Watch {
    /// A host socket still sending its CONNECT line.
    Handshake(Handshake),
    /// A connection's host socket, and what is watched on it now.
    Conn { key: ConnKey, interest: EventSet },
}

/// The vsock device's `event_manager` subscriber; register it with the
/// VMM's `EventManager` (e.g. as `Arc<Mutex<VsockEvents>>` or boxed).
/// Dropping it closes the host sockets it accepted and removes the
/// listening socket's path.
pub struct VsockEvents {
    shared: Shared,
    listener: UnixListener,
    listener_paused: bool,
    wake: Arc<EventFd>,
    watched: HashMap<RawFd, Watch>,
    uds_path: PathBuf,
    /// Host connections (after `CONNECT`) waiting for the guest to handle a
    /// transport reset, since when; not watched meanwhile.
    deferred: Vec<(UnixStream, u32, Instant)>,
    /// Ticks while anything waits on the connect timeout.
    timer: TimerFd,
    timer_armed: bool,
}

impl VsockEvents {
    pub(super) fn new(
        shared: Shared,
        listener: UnixListener,
        wake: Arc<EventFd>,
        timer: TimerFd,
        uds_path: &Path,
    ) -> Self {
        Self {
            shared,
            listener,
            listener_paused: false,
            wake,
            watched: HashMap::new(),
            uds_path: uds_path.to_owned(),
            deferred: Vec::new(),
            timer,
            timer_armed: false,
        }
    }

    /// Starts the ticks (something now waits on the connect timeout).
    fn arm(&mut self) {
        if !self.timer_armed && self.timer.reset(TICK, Some(TICK)).is_ok() {
            self.timer_armed = true;
        }
    }

    /// One tick: closes what waited longer than [`CONNECT_TIMEOUT`], and
    /// stops the ticks once nothing waits.
    fn on_tick(&mut self, inner: &mut Inner, ops: &mut EventOps) {
        let _ = self.timer.wait();
        let now = Instant::now();
        let late = |t: Instant| now.saturating_duration_since(t) >= CONNECT_TIMEOUT;
        let stale: Vec<RawFd> = self
            .watched
            .iter()
            .filter_map(|(fd, w)| match w {
                Watch::Handshake(h) if late(h.started) => Some(*fd),
                _ => None,
            })
            .collect();
        let mut expired = 0;
        for fd in stale {
            if let Some(Watch::Handshake(h)) = self.watched.remove(&fd) {
                let _ = ops.remove(Events::empty(&h.stream));
                inner.muxer.handshakes = inner.muxer.handshakes.saturating_sub(1);
                expired += 1;
            }
        }
        let before = self.deferred.len();
        self.deferred.retain(|(_, _, since)| !late(*since));
        expired += before - self.deferred.len();
        inner.muxer.counters.connect_timeouts += u64::try_from(expired).unwrap_or(u64::MAX);
        if inner.muxer.expire_connects(now, CONNECT_TIMEOUT) > 0 {
            // The RSTs go out now; the sockets close in reconcile.
            inner.process();
        }
        if expired > 0 {
            self.resume_listener(ops);
        }
        let waiting = !self.deferred.is_empty()
            || self
                .watched
                .values()
                .any(|w| matches!(w, Watch::Handshake(_)))
            || inner.muxer.awaiting_responses();
        if !waiting && self.timer.clear().is_ok() {
            self.timer_armed = false;
        }
    }

    /// The listening socket's path.
    pub fn uds_path(&self) -> &Path {
        &self.uds_path
    }

    fn accept(&mut self, inner: &mut Inner, ops: &mut EventOps) {
        for _ in 0..ACCEPT_BATCH {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    // Out of fds or similar: stop watching the listener (it
                    // would stay readable) until a connection closes.
                    if ops
                        .modify(Events::new(&self.listener, EventSet::empty()))
                        .is_ok()
                    {
                        self.listener_paused = true;
                    }
                    return;
                }
            };
            // Over the limit the socket is closed at once; the client sees EOF.
            if inner.muxer.at_capacity() {
                inner.muxer.counters.refused += 1;
                continue;
            }
            if stream.set_nonblocking(true).is_err()
                || ops.add(Events::new(&stream, EventSet::IN)).is_err()
            {
                continue;
            }
            self.watched
                .insert(stream.as_raw_fd(), Watch::Handshake(Handshake::new(stream)));
            inner.muxer.handshakes += 1;
            self.arm();
        }
    }

    fn handshake(&mut self, fd: RawFd, ev: EventSet, inner: &mut Inner, ops: &mut EventOps) {
        let Some(Watch::Handshake(h)) = self.watched.get_mut(&fd) else {
            return;
        };
        let progress = match h.read() {
            Progress::Pending if ev.intersects(EventSet::HANG_UP | EventSet::ERROR) => {
                Progress::Failed
            }
            p => p,
        };
        if progress == Progress::Pending {
            return;
        }
        let Some(Watch::Handshake(h)) = self.watched.remove(&fd) else {
            return;
        };
        inner.muxer.handshakes = inner.muxer.handshakes.saturating_sub(1);
        let refused = match progress {
            Progress::Connect(port) if !inner.reset_acked => {
                // Wait until the guest has handled the transport reset.
                if self.deferred.len() < super::MAX_CONNECTIONS {
                    let _ = ops.remove(Events::empty(&h.stream));
                    // Its time counts from its CONNECT.
                    self.deferred.push((h.stream, port, h.started));
                    return;
                }
                h.stream
            }
            Progress::Connect(port) => match inner.muxer.add_host_conn(h.stream, port) {
                Ok(key) => {
                    self.watched.insert(
                        fd,
                        Watch::Conn {
                            key,
                            interest: EventSet::IN,
                        },
                    );
                    inner.process();
                    return;
                }
                Err(stream) => stream,
            },
            _ => h.stream,
        };
        let _ = ops.remove(Events::empty(&refused));
        self.resume_listener(ops);
    }

    /// Brings the watch list in line with the connection table: unwatches
    /// and closes removed connections' sockets, watches new ones, and
    /// updates interest where it changed.
    fn reconcile(&mut self, inner: &mut Inner, ops: &mut EventOps) {
        loop {
            let graves = inner.muxer.take_graveyard();
            let touched = inner.muxer.take_touched();
            if graves.is_empty() && touched.is_empty() {
                return;
            }
            let mut killed = false;
            if !graves.is_empty() {
                for stream in graves {
                    let fd = stream.as_raw_fd();
                    if self.watched.remove(&fd).is_some() {
                        let _ = ops.remove(Events::empty_raw(fd));
                    }
                    // Dropping `stream` closes it, now that epoll forgot it.
                }
                self.resume_listener(ops);
            }
            for key in touched {
                let Some((fd, want)) = inner.muxer.watch(key) else {
                    continue;
                };
                let have = match self.watched.get(&fd) {
                    Some(Watch::Conn { key: k, interest }) if *k == key => Some(*interest),
                    // Cannot happen: a live socket's fd is not reused.
                    Some(_) => continue,
                    None => None,
                };
                let ok = match (have, want) {
                    (None, None) => true,
                    (None, Some(w)) => {
                        let ok = ops.add(Events::new_raw(fd, w)).is_ok();
                        if ok {
                            self.watched.insert(fd, Watch::Conn { key, interest: w });
                            inner.muxer.set_watched(key, true);
                        }
                        ok
                    }
                    (Some(_), None) => {
                        self.watched.remove(&fd);
                        let ok = ops.remove(Events::empty_raw(fd)).is_ok();
                        if ok {
                            inner.muxer.set_watched(key, false);
                        }
                        ok
                    }
                    (Some(h), Some(w)) if h != w => {
                        let ok = ops.modify(Events::new_raw(fd, w)).is_ok();
                        if ok {
                            self.watched.insert(fd, Watch::Conn { key, interest: w });
                        }
                        ok
                    }
                    (Some(_), Some(_)) => true,
                };
                if !ok {
                    inner.muxer.kill(key, true);
                    killed = true;
                }
            }
            if killed {
                // The RSTs just queued go out now.
                inner.process();
            }
        }
    }

    /// Starts the host connections that waited for a transport reset.
    fn start_deferred(&mut self, inner: &mut Inner, ops: &mut EventOps) {
        if !inner.reset_acked || self.deferred.is_empty() {
            return;
        }
        for (stream, port, _) in std::mem::take(&mut self.deferred) {
            let fd = stream.as_raw_fd();
            match inner.muxer.add_host_conn(stream, port) {
                Ok(key) => {
                    if ops.add(Events::new_raw(fd, EventSet::IN)).is_ok() {
                        self.watched.insert(
                            fd,
                            Watch::Conn {
                                key,
                                interest: EventSet::IN,
                            },
                        );
                        inner.muxer.set_watched(key, true);
                    } else {
                        inner.muxer.kill(key, true);
                    }
                }
                Err(refused) => drop(refused),
            }
        }
        inner.process();
    }

    fn resume_listener(&mut self, ops: &mut EventOps) {
        if self.listener_paused
            && ops
                .modify(Events::new(&self.listener, EventSet::IN))
                .is_ok()
        {
            self.listener_paused = false;
        }
    }
}

impl MutEventSubscriber for VsockEvents {
    fn init(&mut self, ops: &mut EventOps) {
        // Failing here leaves the device without a host side; there is no
        // error channel in this trait, and the guest side still works.
        let _ = ops.add(Events::new(&self.listener, EventSet::IN));
        let _ = ops.add(Events::new(&*self.wake, EventSet::IN));
        let _ = ops.add(Events::new(&self.timer, EventSet::IN));
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        let ev = events.event_set();
        let shared = self.shared.clone();
        let mut inner = lock(&shared);
        if fd == self.listener.as_raw_fd() {
            self.accept(&mut inner, ops);
        } else if fd == self.wake.as_raw_fd() {
            let _ = self.wake.read();
            self.start_deferred(&mut inner, ops);
        } else if fd == self.timer.as_raw_fd() {
            self.on_tick(&mut inner, ops);
        } else {
            match self.watched.get(&fd) {
                Some(Watch::Handshake(_)) => self.handshake(fd, ev, &mut inner, ops),
                Some(Watch::Conn { key, .. }) => {
                    let key = *key;
                    inner.muxer.on_conn_event(key, ev);
                    inner.process();
                }
                None => {
                    let _ = ops.remove(Events::empty_raw(fd));
                }
            }
        }
        self.reconcile(&mut inner, ops);
    }
}

impl Drop for VsockEvents {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.uds_path);
    }
}
