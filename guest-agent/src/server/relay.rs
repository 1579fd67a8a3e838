//! TCP forwarding: a connection that sends `TcpConnect` becomes a byte
//! relay between the host and a TCP connection to the guest's loopback.
//!
//! The relay lives in the same epoll loop as everything else. Guest-to-host
//! bytes are read from the TCP socket straight into the connection's output
//! buffer (sent by the usual flush, after the `Ok` reply); host-to-guest
//! bytes are read into [`Relay::up`] and written to the TCP socket. Each
//! direction holds at most [`RELAY_BUF`] bytes: past it the side feeding it
//! is not read until the other side takes them (backpressure through the
//! socket buffers, nothing dropped). The host half-closing its side shuts
//! the TCP socket's write side once everything it sent is written; the
//! guest side ending (EOF, error or reset) sends what was read and closes
//! the connection.

use super::*;

/// Bytes held per direction of a relay.
pub(super) const RELAY_BUF: usize = 256 * 1024;
/// Relays at once (each holds up to 2 × [`RELAY_BUF`]).
pub(super) const MAX_RELAYS: usize = 128;
/// Connect timeout when the client asks for none.
const DEFAULT_CONNECT: Duration = Duration::from_secs(10);

/// The TCP side of a relaying connection.
pub(super) struct Relay {
    tcp: OwnedFd,
    /// The `TcpConnect` request id (its reply).
    id: u32,
    /// Until when the connect may take; `None` once connected.
    connecting: Option<Instant>,
    /// Host bytes not written to the TCP socket yet.
    up: Vec<u8>,
    /// The host shut its write side: no more bytes for the guest.
    host_eof: bool,
    /// The TCP socket's write side is shut.
    tcp_shut: bool,
    /// The TCP socket is finished (EOF or error): nothing more is read.
    tcp_done: bool,
    /// Registered epoll events of the TCP socket.
    events: u32,
    /// The TCP socket is in the epoll set.
    registered: bool,
    /// The guest port (for messages).
    port: u16,
}

impl Relay {
    /// The connect deadline while connecting.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.connecting
    }
}

fn relay_token(cid: u32) -> u64 {
    TAG_RELAY | u64::from(cid)
}

/// Where a guest service without TCP listens for port `port`: a Unix
/// socket at `run/shoal/ports/<port>`, relative to the agent's working
/// directory (`/` in the guest: `/run/shoal/ports/<port>`).
pub const PORTS_DIR: &str = "run/shoal/ports";

/// A new non-blocking stream socket of `domain`.
fn stream_socket(domain: libc::c_int) -> Result<OwnedFd, Errno> {
    // SAFETY: no pointers.
    let fd = unsafe {
        libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Connects to the Unix socket of `port` under [`PORTS_DIR`]: `Ok(None)`
/// when there is none (nothing listens there).
fn unix_connect(port: u16) -> Result<Option<OwnedFd>, Errno> {
    let path = format!("{PORTS_DIR}/{port}");
    // SAFETY: sockaddr_un is plain data; zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    #[allow(clippy::cast_possible_truncation)] // AF_UNIX is 1
    {
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    }
    for (d, s) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
        *d = libc::c_char::from_ne_bytes([*s]);
    }
    let fd = stream_socket(libc::AF_UNIX)?;
    #[allow(clippy::cast_possible_truncation)] // 110 bytes
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_un of `len` bytes (the path, at
    // most 26 bytes, is NUL-terminated by the zeroed rest).
    let r = unsafe { libc::connect(fd.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) };
    if r == 0 {
        return Ok(Some(fd));
    }
    match Errno::last() {
        Errno(libc::ENOENT | libc::ECONNREFUSED | libc::ENOTDIR) => Ok(None),
        e => Err(e),
    }
}

/// Connects to the guest's `port`: its Unix socket under [`PORTS_DIR`] if
/// one is there, else TCP `127.0.0.1:port` (a kernel without IPv4 has
/// nothing there: `ECONNREFUSED`). `Ok((fd, true))` connected,
/// `Ok((fd, false))` in progress.
fn tcp_connect(port: u16) -> Result<(OwnedFd, bool), Errno> {
    if let Some(fd) = unix_connect(port)? {
        return Ok((fd, true));
    }
    let fd = match stream_socket(libc::AF_INET) {
        Ok(fd) => fd,
        Err(Errno(libc::EAFNOSUPPORT)) => return Err(Errno(libc::ECONNREFUSED)),
        Err(e) => return Err(e),
    };
    // SAFETY: sockaddr_in is plain data; zero is valid.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    #[allow(clippy::cast_possible_truncation)] // AF_INET is 2
    {
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
    }
    addr.sin_port = port.to_be();
    addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    #[allow(clippy::cast_possible_truncation)] // 16 bytes
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_in of `len` bytes.
    let r = unsafe { libc::connect(fd.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) };
    if r == 0 {
        return Ok((fd, true));
    }
    match Errno::last() {
        Errno(libc::EINPROGRESS) => Ok((fd, false)),
        e => Err(e),
    }
}

/// The pending error of a socket (SO_ERROR): 0 once a connect succeeded.
fn socket_error(fd: &OwnedFd) -> i32 {
    let mut err: libc::c_int = 0;
    #[allow(clippy::cast_possible_truncation)] // 4 bytes
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: err and len are live and sized as getsockopt expects.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            std::ptr::addr_of_mut!(err).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Errno::last().0;
    }
    err
}

/// shutdown(SHUT_WR); failure only means the peer is gone already.
fn shut_write(fd: &OwnedFd) {
    // SAFETY: plain syscall on an open fd.
    unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) };
}

impl Server {
    /// `TcpConnect`: checks, then connects; the reply comes once the
    /// connect finishes (at once for loopback, usually).
    pub(super) fn tcp_connect(&mut self, cid: u32, id: u32, req: &TcpConnect) {
        let Some(c) = self.conns.get(&cid) else {
            return;
        };
        if c.streams() > 0 {
            let msg = "TcpConnect needs a connection with no other streams".to_string();
            self.reply_err(cid, id, ErrorCode::InvalidArgument, 0, msg);
            return;
        }
        if req.port == 0 {
            let msg = "TcpConnect to port 0".to_string();
            self.reply_err(cid, id, ErrorCode::InvalidArgument, 0, msg);
            return;
        }
        let relays = self.conns.values().filter(|c| c.relay.is_some()).count();
        if relays >= MAX_RELAYS {
            let msg = format!("at most {MAX_RELAYS} TCP relays at once");
            self.reply_err(cid, id, ErrorCode::Busy, 0, msg);
            return;
        }
        let (tcp, connected) = match tcp_connect(req.port) {
            Ok(r) => r,
            Err(e) => {
                self.relay_failed(cid, id, req.port, e);
                return;
            }
        };
        let wait = match req.timeout_ms {
            0 => DEFAULT_CONNECT,
            ms => Duration::from_millis(u64::from(ms.min(TCP_CONNECT_TIMEOUT_MAX_MS))),
        };
        let events = if connected { 0 } else { libc::EPOLLOUT as u32 };
        if let Err(e) = self.ep.add(tcp.as_raw_fd(), events, relay_token(cid)) {
            self.relay_failed(cid, id, req.port, e);
            return;
        }
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        c.relay = Some(Relay {
            tcp,
            id,
            connecting: (!connected).then(|| Instant::now() + wait),
            up: Vec::new(),
            host_eof: false,
            tcp_shut: false,
            tcp_done: false,
            events,
            registered: true,
            port: req.port,
        });
        if connected {
            self.relay_open(cid);
        }
        self.update_events(cid);
    }

    /// A failed connect: the error, then the connection closes.
    fn relay_failed(&mut self, cid: u32, id: u32, port: u16, e: Errno) {
        let msg = format!("connect to guest port {port}: {}", e.text());
        self.reply_err(cid, id, ErrorCode::Io, e.0, msg);
        if let Some(c) = self.conns.get_mut(&cid) {
            c.closing = true;
            if let Some(r) = c.relay.take() {
                let _ = self.ep.delete(r.tcp.as_raw_fd());
            }
        }
        self.update_events(cid);
    }

    /// The connect succeeded: `Ok`, then bytes.
    fn relay_open(&mut self, cid: u32) {
        let Some(r) = self.conns.get_mut(&cid).and_then(|c| c.relay.as_mut()) else {
            return;
        };
        r.connecting = None;
        let id = r.id;
        // Bytes the client sent early (behind its TcpConnect frame) are
        // written once the socket reports writable (see relay_events).
        self.reply_ok(cid, id);
    }

    /// Moves whatever followed the `TcpConnect` frame in the input buffer
    /// (the conn's frame parsing stops at it) into the relay.
    pub(super) fn relay_take_input(&mut self, cid: u32, rest: &[u8]) {
        if let Some(r) = self.conns.get_mut(&cid).and_then(|c| c.relay.as_mut()) {
            r.up.extend_from_slice(rest);
        }
    }

    /// Whether the connection relays (its input is bytes, not frames).
    pub(super) fn is_relay(&self, cid: u32) -> bool {
        self.conns.get(&cid).is_some_and(|c| c.relay.is_some())
    }

    /// The host side is readable.
    pub(super) fn relay_host_read(&mut self, cid: u32) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let Some(r) = c.relay.as_mut() else {
            return;
        };
        if c.closing || c.dead || r.connecting.is_some() || r.host_eof {
            return;
        }
        let room = RELAY_BUF.saturating_sub(r.up.len());
        if room == 0 {
            return;
        }
        match os::read_append(os::fd_ref(&c.fd), &mut r.up, room, true) {
            Ok(0) => r.host_eof = true,
            Ok(_) => {}
            Err(Errno(libc::EAGAIN | libc::EINTR)) => return,
            Err(_) => {
                self.kill_conn(cid);
                return;
            }
        }
        self.relay_write_tcp(cid);
        self.update_events(cid);
    }

    /// Writes pending host bytes to the TCP socket (one send), and shuts
    /// its write side once the host is done and all is written.
    fn relay_write_tcp(&mut self, cid: u32) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let Some(r) = c.relay.as_mut() else {
            return;
        };
        if r.connecting.is_some() || r.tcp_done {
            return;
        }
        if !r.up.is_empty() {
            match os::send(os::fd_ref(&r.tcp), &r.up) {
                Ok(n) => {
                    r.up.drain(..n.min(r.up.len()));
                }
                Err(Errno(libc::EAGAIN | libc::EINTR)) => {}
                Err(_) => {
                    // The guest side is gone: send what it said, then close.
                    r.tcp_done = true;
                    r.up.clear();
                    c.closing = true;
                }
            }
        }
        if r.host_eof && r.up.is_empty() && !r.tcp_shut && !r.tcp_done {
            r.tcp_shut = true;
            shut_write(&r.tcp);
        }
        self.mark_dirty(cid);
    }

    /// An event on the TCP socket.
    pub(super) fn relay_tcp_event(&mut self, cid: u32, mask: u32) {
        let Some(r) = self.conns.get_mut(&cid).and_then(|c| c.relay.as_mut()) else {
            return;
        };
        if r.connecting.is_some() {
            match socket_error(&r.tcp) {
                0 => self.relay_open(cid),
                e => {
                    let (id, port) = (r.id, r.port);
                    self.relay_failed(cid, id, port, Errno(e));
                    return;
                }
            }
            self.update_events(cid);
            return;
        }
        if mask & libc::EPOLLOUT as u32 != 0 {
            self.relay_write_tcp(cid);
        }
        let hup = mask & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0;
        if mask & libc::EPOLLIN as u32 != 0 || hup {
            self.relay_tcp_read(cid);
        }
        self.update_events(cid);
    }

    /// Reads guest bytes straight into the connection's output buffer.
    fn relay_tcp_read(&mut self, cid: u32) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let room = RELAY_BUF.saturating_sub(c.out_len());
        let Some(r) = c.relay.as_mut() else {
            return;
        };
        if r.tcp_done || room == 0 {
            return;
        }
        match os::read_append(os::fd_ref(&r.tcp), &mut c.out, room, true) {
            Ok(0) | Err(Errno(libc::ECONNRESET | libc::EPIPE | libc::ETIMEDOUT)) => {
                r.tcp_done = true;
                c.closing = true;
            }
            Ok(_) | Err(Errno(libc::EAGAIN | libc::EINTR)) => {}
            Err(_) => {
                r.tcp_done = true;
                c.closing = true;
            }
        }
        self.mark_dirty(cid);
    }

    /// The epoll events of both sockets of a relaying connection, from its
    /// state; `false` if this is no relay.
    pub(super) fn relay_events(&mut self, cid: u32) -> bool {
        let Some(c) = self.conns.get_mut(&cid) else {
            return false;
        };
        if c.dead {
            return c.relay.is_some();
        }
        let out_len = c.out_len();
        let closing = c.closing;
        let Some(r) = c.relay.as_mut() else {
            return false;
        };
        let mut host = 0;
        if !closing && r.connecting.is_none() && !r.host_eof && r.up.len() < RELAY_BUF {
            host |= libc::EPOLLIN as u32;
        }
        if c.blocked {
            host |= libc::EPOLLOUT as u32;
        }
        let mut tcp = 0;
        if r.connecting.is_some() || (!r.up.is_empty() && !r.tcp_done) {
            tcp |= libc::EPOLLOUT as u32;
        }
        if r.connecting.is_none() && !r.tcp_done && out_len < RELAY_BUF {
            tcp |= libc::EPOLLIN as u32;
        }
        if r.tcp_done {
            // Finished: a finished socket still reports EPOLLHUP, of no
            // use now: take it out of the set.
            if r.registered {
                let _ = self.ep.delete(r.tcp.as_raw_fd());
                r.registered = false;
            }
        } else if tcp != r.events {
            if self
                .ep
                .modify(r.tcp.as_raw_fd(), tcp, relay_token(cid))
                .is_ok()
            {
                r.events = tcp;
            } else {
                c.dead = true;
            }
        }
        if host != c.events && !c.dead {
            if self
                .ep
                .modify(c.fd.as_raw_fd(), host, TAG_CONN | u64::from(cid))
                .is_ok()
            {
                c.events = host;
            } else {
                c.dead = true;
            }
        }
        true
    }

    /// Connect deadlines.
    pub(super) fn relay_timers(&mut self) {
        let now = Instant::now();
        let due: Vec<(u32, u32, u16)> = self
            .conns
            .iter()
            .filter_map(|(&cid, c)| {
                let r = c.relay.as_ref()?;
                r.connecting
                    .filter(|d| *d <= now)
                    .map(|_| (cid, r.id, r.port))
            })
            .collect();
        for (cid, id, port) in due {
            self.relay_failed(cid, id, port, Errno(libc::ETIMEDOUT));
        }
    }
}
