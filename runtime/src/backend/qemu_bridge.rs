//! The host side of the agent's virtio-serial link (QEMU hosts have no
//! vhost-vsock here): a Unix socket that speaks the hybrid-vsock
//! hand-shake (`CONNECT <port>\n` → `OK <n>\n`), so the daemon's
//! [`super::Transport`] is unchanged, with each connection a stream
//! multiplexed over QEMU's chardev socket of the port
//! ([`agent_proto::serial_mux`]).
//!
//! It lives in the process that holds the [`super::qemu::QemuVm`] (the
//! daemon), as threads: when the daemon restarts, the reattached VM starts
//! a new bridge, whose first frame (`Reset`) makes the guest drop the
//! streams of the old one. Everything from the guest is bounded: frames
//! by the decoder, streams by [`MAX_STREAMS`], and a client that does not
//! read what the guest sends is cut off after [`CLIENT_WRITE_TIMEOUT`]
//! instead of stalling the other streams.

use agent_proto::serial_mux::{encode, Decoder, FrameKind, MAX_PAYLOAD, MAX_STREAMS};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a client may leave guest output unread before it is cut off.
pub const CLIENT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has to send its `CONNECT` line.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client waits for the guest to answer the session's reset
/// (a guest still booting has not opened its port yet).
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// How often `Reset` is sent again until the guest answers (QEMU may drop
/// what the host sends before the guest opens its port).
const RESET_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, Default)]
struct Shared {
    /// Writer to QEMU's chardev socket (None between sessions).
    serial: Mutex<Option<UnixStream>>,
    streams: Mutex<HashMap<u32, UnixStream>>,
    next: AtomicU32,
    stop: AtomicBool,
    /// The guest has answered this session's `Reset`.
    synced: AtomicBool,
}

impl Shared {
    fn send(&self, kind: FrameKind, stream: u32, payload: &[u8]) -> bool {
        let mut g = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_mut() {
            Some(s) => s.write_all(&encode(kind, stream, payload)).is_ok(),
            None => false,
        }
    }

    fn drop_stream(&self, id: u32) {
        let s = lock(&self.streams).remove(&id);
        if let Some(s) = s {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn drop_all(&self) {
        for (_, s) in lock(&self.streams).drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A running bridge; dropping it stops it and removes its socket.
#[derive(Debug)]
pub struct Bridge {
    shared: Arc<Shared>,
    agent_sock: PathBuf,
}

impl Bridge {
    /// Serves `agent_sock` (replaced) and links it to the port's chardev
    /// socket `serial_sock` (QEMU's server; connected again whenever it
    /// drops, while QEMU runs).
    pub fn start(agent_sock: &Path, serial_sock: &Path) -> std::io::Result<Bridge> {
        let _ = std::fs::remove_file(agent_sock);
        let listener = UnixListener::bind(agent_sock)?;
        let shared = Arc::new(Shared::default());
        let (sh, serial) = (shared.clone(), serial_sock.to_path_buf());
        std::thread::Builder::new()
            .name("qemu-bridge-port".into())
            .spawn(move || port_loop(&sh, &serial))?;
        let sh = shared.clone();
        std::thread::Builder::new()
            .name("qemu-bridge-accept".into())
            .spawn(move || {
                for c in listener.incoming() {
                    if sh.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Ok(c) = c {
                        let sh = sh.clone();
                        let _ = std::thread::Builder::new()
                            .name("qemu-bridge-conn".into())
                            .spawn(move || client(&sh, c));
                    }
                }
            })?;
        Ok(Bridge {
            shared,
            agent_sock: agent_sock.to_path_buf(),
        })
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.drop_all();
        if let Some(s) = lock(&self.shared.serial).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Wake the accept loop so it sees `stop`.
        let _ = UnixStream::connect(&self.agent_sock);
        let _ = std::fs::remove_file(&self.agent_sock);
    }
}

/// One client: the hand-shake, then its bytes to the guest.
fn client(sh: &Shared, mut c: UnixStream) {
    let Some(port) = handshake(&mut c) else {
        return;
    };
    // Streams opened before the guest answered the reset would be dropped
    // by it: wait for the answer (the client sees a closed connection if
    // none comes, and retries).
    let end = std::time::Instant::now() + SYNC_TIMEOUT;
    while !sh.synced.load(Ordering::Acquire) {
        if std::time::Instant::now() >= end || sh.stop.load(Ordering::Relaxed) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let id = sh.next.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
    {
        let mut streams = lock(&sh.streams);
        if streams.len() >= MAX_STREAMS {
            let _ = c.write_all(b"ERR too many connections\n");
            return;
        }
        let Ok(w) = c.try_clone() else { return };
        let _ = w.set_write_timeout(Some(CLIENT_WRITE_TIMEOUT));
        streams.insert(id, w);
    }
    if !sh.send(FrameKind::Open, id, &port.to_le_bytes())
        || c.write_all(format!("OK {id}\n").as_bytes()).is_err()
    {
        sh.drop_stream(id);
        return;
    }
    let _ = c.set_read_timeout(None);
    let mut buf = vec![0u8; MAX_PAYLOAD];
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if !sh.send(FrameKind::Data, id, &buf[..n]) {
                    break;
                }
            }
        }
    }
    if lock(&sh.streams).contains_key(&id) {
        sh.send(FrameKind::Close, id, &[]);
        sh.drop_stream(id);
    }
}

/// Reads `CONNECT <port>\n` (bounded, with a deadline).
fn handshake(c: &mut UnixStream) -> Option<u32> {
    c.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).ok()?;
    let mut line = Vec::with_capacity(32);
    let mut b = [0u8; 1];
    while line.len() < 32 {
        if c.read(&mut b).ok()? == 0 {
            return None;
        }
        if b[0] == b'\n' {
            let s = std::str::from_utf8(&line).ok()?;
            return s.strip_prefix("CONNECT ")?.trim().parse().ok();
        }
        line.push(b[0]);
    }
    None
}

/// Sessions on the port's chardev socket, one after another while the
/// bridge runs.
fn port_loop(sh: &Shared, serial: &Path) {
    while !sh.stop.load(Ordering::Relaxed) {
        let Ok(s) = UnixStream::connect(serial) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let Ok(w) = s.try_clone() else { continue };
        *lock(&sh.serial) = Some(w);
        // A new session: the guest drops the streams of any earlier one.
        sh.synced.store(false, Ordering::Release);
        sh.drop_all();
        sh.send(FrameKind::Reset, 0, &[]);
        session(sh, s);
        sh.synced.store(false, Ordering::Release);
        *lock(&sh.serial) = None;
        sh.drop_all();
        if !sh.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Reads frames from the guest until the socket ends or a frame is bad.
fn session(sh: &Shared, mut s: UnixStream) {
    let mut d = Decoder::syncing();
    let mut buf = vec![0u8; MAX_PAYLOAD];
    let _ = s.set_read_timeout(Some(RESET_EVERY));
    loop {
        let want = d.room().min(buf.len());
        let n = match s.read(&mut buf[..want]) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if !sh.synced.load(Ordering::Acquire) {
                    sh.send(FrameKind::Reset, 0, &[]);
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let mut next = d.push(&buf[..n]);
        loop {
            match next {
                Ok(Some(f)) => deliver(sh, f.kind, f.stream, &f.payload),
                Ok(None) => break,
                // A guest that breaks the framing gets a new session.
                Err(_) => return,
            }
            next = d.push(&[]);
        }
    }
}

/// A frame from the guest.
fn deliver(sh: &Shared, kind: FrameKind, id: u32, payload: &[u8]) {
    match kind {
        FrameKind::Data => {
            let w = lock(&sh.streams).get(&id).and_then(|s| s.try_clone().ok());
            // Unknown streams (closed here already) are ignored.
            if let Some(mut w) = w {
                if w.write_all(payload).is_err() {
                    sh.send(FrameKind::Close, id, &[]);
                    sh.drop_stream(id);
                }
            }
        }
        FrameKind::Close => sh.drop_stream(id),
        FrameKind::ResetAck => sh.synced.store(true, Ordering::Release),
        // Only the host opens and resets.
        FrameKind::Open | FrameKind::Reset => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for QEMU's chardev socket with a guest behind it that
    /// first sends garbage (a half frame of an earlier session), ignores
    /// the first reset (as QEMU may drop it), then acks and echoes.
    fn fake_guest(path: &Path) {
        let l = UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(&[2, 9, 0, 0, 0, 0x10, 0, 0]).unwrap();
            let mut d = Decoder::new();
            let mut resets = 0;
            let mut b = vec![0u8; 4096];
            loop {
                let n = match s.read(&mut b) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let mut next = d.push(&b[..n]).unwrap();
                while let Some(f) = next {
                    match f.kind {
                        FrameKind::Reset => {
                            resets += 1;
                            if resets > 1 {
                                s.write_all(&encode(FrameKind::ResetAck, 0, &[])).unwrap();
                            }
                        }
                        FrameKind::Data => {
                            s.write_all(&encode(FrameKind::Data, f.stream, &f.payload))
                                .unwrap();
                        }
                        _ => {}
                    }
                    next = d.push(&[]).unwrap();
                }
            }
        });
    }

    #[test]
    fn clients_reach_the_guest_through_one_port_after_it_answers_the_reset() {
        let t = tempfile::tempdir().unwrap();
        let (agent, port) = (t.path().join("agent.sock"), t.path().join("port.sock"));
        fake_guest(&port);
        let b = Bridge::start(&agent, &port).unwrap();
        let mut c = UnixStream::connect(&agent).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"CONNECT 5000\n").unwrap();
        let mut ok = [0u8; 5];
        c.read_exact(&mut ok).unwrap();
        assert_eq!(&ok, b"OK 1\n");
        c.write_all(b"echo me").unwrap();
        let mut got = [0u8; 7];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"echo me");

        // A bad hand-shake is closed without an answer.
        let mut bad = UnixStream::connect(&agent).unwrap();
        bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        bad.write_all(b"HELLO\n").unwrap();
        assert_eq!(bad.read(&mut got).unwrap(), 0);

        drop(b);
        assert!(!agent.exists(), "the socket goes with the bridge");
        assert_eq!(c.read(&mut got).unwrap_or(0), 0, "its streams end");
    }
}
