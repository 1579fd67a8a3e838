//! The guest side of the agent's virtio-serial link (QEMU `vm` sandboxes on
//! hosts without vhost-vsock): when a virtio port named
//! [`agent_proto::serial_mux::PORT_NAME`] exists, the server listens on a
//! local Unix socket instead of vsock, and this thread turns each stream the
//! host opens on the port into a connection to that socket
//! ([`agent_proto::serial_mux`] framing). The host is trusted as much as
//! over vsock; frames are still checked and bounded by the decoder.

use agent_proto::serial_mux::{encode, Decoder, FrameKind, MAX_PAYLOAD, MAX_STREAMS, PORT_NAME};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where the server listens when it is reached over the port.
pub const LOCAL_SOCK: &str = "/dev/shoal-agent.sock";

/// The device of the agent's port, if the VM has one.
pub fn find() -> Option<PathBuf> {
    for e in std::fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        let name = std::fs::read(e.path().join("name")).unwrap_or_default();
        if name.strip_suffix(b"\n").unwrap_or(&name) == PORT_NAME.as_bytes() {
            return Some(Path::new("/dev").join(e.file_name()));
        }
    }
    None
}

type Streams = Arc<Mutex<HashMap<u32, UnixStream>>>;

/// Blocks SIGCHLD and SIGPIPE in the calling thread. The server reaps its
/// children through a signalfd with SIGCHLD blocked in its own thread; a
/// thread of ours with SIGCHLD unblocked would take the signal instead
/// (default action: discarded) and an exec would never see its child end.
fn block_signals() {
    // SAFETY: sigset_t is plain data, filled by sigemptyset/sigaddset
    // before pthread_sigmask reads it; no other pointers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts the demultiplexer on `dev` (a thread for the port, one per
/// stream); the server must already listen on [`LOCAL_SOCK`].
pub fn start(dev: &Path, local: &Path) -> std::io::Result<()> {
    let port = File::options().read(true).write(true).open(dev)?;
    let writer: Port = Arc::new(Mutex::new(Box::new(port.try_clone()?)));
    spawn(port, writer, local)
}

/// Starts the demultiplexer on a port read through `port` and written
/// through `writer`.
fn spawn(port: impl Read + Send + 'static, writer: Port, local: &Path) -> std::io::Result<()> {
    let local = local.to_path_buf();
    std::thread::Builder::new()
        .name("vport".into())
        .spawn(move || {
            block_signals();
            demux(port, &writer, &local);
        })?;
    Ok(())
}

/// The port's writing side, shared by the streams.
type Port = Arc<Mutex<Box<dyn Write + Send>>>;

fn send(w: &Mutex<Box<dyn Write + Send>>, kind: FrameKind, id: u32, payload: &[u8]) {
    let _ = lock(w).write_all(&encode(kind, id, payload));
}

fn drop_all(streams: &Streams) {
    for (_, s) in lock(streams).drain() {
        let _ = s.shutdown(Shutdown::Both);
    }
}

fn demux(mut port: impl Read, w: &Port, local: &Path) {
    let streams: Streams = Arc::default();
    // What arrives before the port was opened is discarded by the guest
    // kernel, which may cut a frame: start at the host's next whole Reset.
    let mut d = Decoder::syncing_on(FrameKind::Reset);
    let mut buf = vec![0u8; MAX_PAYLOAD];
    loop {
        let want = d.room().min(buf.len());
        let n = match port.read(&mut buf[..want]) {
            // No host on the other end yet (or it left): wait for one.
            Ok(0) => {
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => {
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
        };
        let mut next = d.push(&buf[..n]);
        loop {
            match next {
                Ok(Some(f)) => frame(f.kind, f.stream, &f.payload, w, &streams, local),
                Ok(None) => break,
                // Out of step: drop everything and wait for the host's
                // next Reset (it sends one when it connects again).
                Err(_) => {
                    drop_all(&streams);
                    d = Decoder::syncing_on(FrameKind::Reset);
                    break;
                }
            }
            next = d.push(&[]);
        }
    }
}

fn frame(kind: FrameKind, id: u32, payload: &[u8], w: &Port, streams: &Streams, local: &Path) {
    match kind {
        FrameKind::Reset => {
            drop_all(streams);
            send(w, FrameKind::ResetAck, 0, &[]);
        }
        FrameKind::Open => {
            let port = payload
                .try_into()
                .map(u32::from_le_bytes)
                .unwrap_or(u32::MAX);
            let ok = port == agent_proto::VSOCK_PORT && lock(streams).len() < MAX_STREAMS;
            let conn = if ok {
                UnixStream::connect(local).ok()
            } else {
                None
            };
            let Some(c) = conn else {
                send(w, FrameKind::Close, id, &[]);
                return;
            };
            let Ok(r) = c.try_clone() else {
                send(w, FrameKind::Close, id, &[]);
                return;
            };
            if let Some(old) = lock(streams).insert(id, c) {
                let _ = old.shutdown(Shutdown::Both);
            }
            let (w2, streams2) = (w.clone(), streams.clone());
            let spawned = std::thread::Builder::new()
                .name("vport-stream".into())
                .spawn(move || {
                    block_signals();
                    upstream(r, id, &w2, &streams2);
                });
            if spawned.is_err() {
                if let Some(c) = lock(streams).remove(&id) {
                    let _ = c.shutdown(Shutdown::Both);
                }
                send(w, FrameKind::Close, id, &[]);
            }
        }
        FrameKind::Data => {
            let c = lock(streams).get(&id).and_then(|c| c.try_clone().ok());
            if let Some(mut c) = c {
                if c.write_all(payload).is_err() {
                    send(w, FrameKind::Close, id, &[]);
                    if let Some(c) = lock(streams).remove(&id) {
                        let _ = c.shutdown(Shutdown::Both);
                    }
                }
            }
        }
        FrameKind::Close => {
            if let Some(c) = lock(streams).remove(&id) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
        FrameKind::ResetAck => {}
    }
}

/// The server's bytes of stream `id` to the host, until either side ends.
fn upstream(mut r: UnixStream, id: u32, w: &Port, streams: &Streams) {
    let mut buf = vec![0u8; MAX_PAYLOAD];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => send(w, FrameKind::Data, id, &buf[..n]),
        }
    }
    // Closed here first (not by the host): tell the host.
    if lock(streams).remove(&id).is_some() {
        send(w, FrameKind::Close, id, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_proto::serial_mux::Decoder;
    use std::os::unix::net::UnixListener;

    /// Frames from the guest side until one of `kind` arrives.
    fn next(r: &mut UnixStream, d: &mut Decoder) -> agent_proto::serial_mux::Frame {
        let mut b = [0u8; 4096];
        loop {
            if let Some(f) = d.push(&[]).unwrap() {
                return f;
            }
            let n = r.read(&mut b).unwrap();
            assert!(n > 0, "the port closed");
            if let Some(f) = d.push(&b[..n]).unwrap() {
                return f;
            }
        }
    }

    #[test]
    fn streams_on_the_port_become_local_connections() {
        let dir = std::env::temp_dir().join(format!("vport-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let sock = dir.join("agent.sock");
        let _ = std::fs::remove_file(&sock);
        let l = UnixListener::bind(&sock).unwrap();
        // An echo server in place of the agent's.
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = c.unwrap();
                std::thread::spawn(move || {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = c.read(&mut b) {
                        if n == 0 || c.write_all(&b[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let (guest, mut host) = UnixStream::pair().unwrap();
        let w: Port = Arc::new(Mutex::new(Box::new(guest.try_clone().unwrap())));
        spawn(guest, w, &sock).unwrap();
        host.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut d = Decoder::syncing();
        host.write_all(&encode(FrameKind::Reset, 0, &[])).unwrap();
        assert_eq!(next(&mut host, &mut d).kind, FrameKind::ResetAck);
        host.write_all(&encode(
            FrameKind::Open,
            1,
            &agent_proto::VSOCK_PORT.to_le_bytes(),
        ))
        .unwrap();
        host.write_all(&encode(FrameKind::Data, 1, b"ping"))
            .unwrap();
        let f = next(&mut host, &mut d);
        assert_eq!(
            (f.kind, f.stream, f.payload.as_slice()),
            (FrameKind::Data, 1, &b"ping"[..])
        );
        // Another port is refused.
        host.write_all(&encode(FrameKind::Open, 2, &22u32.to_le_bytes()))
            .unwrap();
        let f = next(&mut host, &mut d);
        assert_eq!((f.kind, f.stream), (FrameKind::Close, 2));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
