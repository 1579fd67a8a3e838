//! The agent's request server: one thread, one level-triggered epoll loop,
//! no threads per request.
//!
//! System-call economy (every guest syscall costs ~0.5 ms under PVM):
//! - sockets are left blocking and read/written with `MSG_DONTWAIT`, so no
//!   fcntl per connection; a readiness event gets exactly one `recv` into a
//!   2 MiB buffer (room for two whole frames);
//! - replies are appended to a per-connection output buffer and sent once
//!   per loop iteration, one `send` for all of them;
//! - children are reaped through one signalfd for SIGCHLD and `waitpid(-1,
//!   WNOHANG)`, dispatched by pid: as PID 1 this also reaps orphans without
//!   stealing the status of a command we wait for;
//! - commands are started with `clone(CLONE_VM | CLONE_VFORK)`;
//! - the clock is only read while some exec has a timeout (vDSO anyway).
//!
//! Memory is bounded everywhere: at most [`OUT_MAX`] queued per connection
//! before its requests stop being read, a command's pipes stop being read
//! while its client's output buffer is above [`OUT_HIGH`], stdin is buffered
//! up to [`STDIN_LIMIT`] per exec before the connection stops being read, and
//! an exec nobody is attached to keeps only the last
//! [`DETACHED_OUTPUT_LIMIT`] bytes of output (the rest is counted in
//! `dropped_bytes`).

mod files;
pub mod guest;
mod launch;
pub mod listen;
pub mod os;

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use agent_proto::{
    self as proto, begin_frame, decode, end_frame, put_data, put_empty, put_message, AgentMode,
    AttachRequest, ChmodRequest, Command, DirEntries, ErrorCode, ErrorReply, ExecRequest,
    ExecResult, ExecStarted, ExitStatus, FileDone, FileRead, FileWrite, Header, HealthReply, Hello,
    HelloOk, Kind, Message, MkdirRequest, PathRequest, PostRestore, PowerAction, PowerRequest,
    RemoveRequest, RenameRequest, SignalRequest, VersionReply, DETACHED_OUTPUT_LIMIT, HEADER_LEN,
    HELLO_MAGIC, MAX_PAYLOAD, PROTOCOL_VERSION,
};

use guest::Guest;
use os::{Epoll, Errno};

const TOKEN_LISTENER: u64 = 0;
const TOKEN_SIGNAL: u64 = 1;
const TAG_CONN: u64 = 1 << 62;
const TAG_PIPE: u64 = 2 << 62;
const TAG_MASK: u64 = 3 << 62;

/// Input buffer of a connection: two whole frames and some.
const IN_CAP: usize = 2 * (HEADER_LEN + MAX_PAYLOAD) + 64 * 1024;
/// Above this much queued output, command pipes and downloads of the
/// connection pause.
const OUT_HIGH: usize = MAX_PAYLOAD;
/// Below this much queued output they resume.
const OUT_LOW: usize = 256 * 1024;
/// Above this much queued output the connection's requests are not read.
const OUT_MAX: usize = 8 << 20;
/// Stdin buffered per exec before its connection stops being read.
const STDIN_LIMIT: usize = 1 << 20;
/// Connections served at once.
const MAX_CONNS: usize = 256;
/// Execs known at once (running or retained).
const MAX_EXECS: usize = 1024;
/// Finished execs kept (with their output) for a later attach.
const MAX_RETAINED: usize = 64;
/// Streams (execs, uploads, downloads) per connection.
const MAX_STREAMS: usize = 1024;
/// How long to keep reading a command's pipes after it exited (background
/// processes may hold them open).
const LINGER: Duration = Duration::from_millis(100);
/// Download chunks sent per connection per loop iteration (fairness).
const DOWNLOAD_BUDGET: usize = 8;
/// Pipe size asked for once a command fills the default 64 KiB pipe.
const PIPE_GROWN: libc::c_int = 1 << 20;
/// PATH when the environment has none.
const DEFAULT_PATH: &[u8] = b"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A client connection.
struct Conn {
    fd: OwnedFd,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
    hello: bool,
    /// Send what is queued, then close; nothing more is read.
    closing: bool,
    dead: bool,
    dirty: bool,
    /// The last send could not take everything: EPOLLOUT wanted.
    blocked: bool,
    /// Registered epoll events.
    events: u32,
    /// Execs whose stdin buffer is full (reads paused while > 0).
    stdin_blocked: u32,
    /// Request id -> exec id of execs attached here.
    execs: HashMap<u32, u64>,
    uploads: HashMap<u32, Upload>,
    downloads: VecDeque<Download>,
    /// Execs whose pipes were paused for this connection's output.
    paused_execs: Vec<u64>,
}

impl Conn {
    fn out_len(&self) -> usize {
        self.out.len().saturating_sub(self.out_pos)
    }

    fn streams(&self) -> usize {
        self.execs.len() + self.uploads.len() + self.downloads.len()
    }

    fn id_in_use(&self, id: u32) -> bool {
        self.execs.contains_key(&id)
            || self.uploads.contains_key(&id)
            || self.downloads.iter().any(|d| d.id == id)
    }
}

struct Upload {
    file: OwnedFd,
    bytes: u64,
}

struct Download {
    id: u32,
    file: OwnedFd,
    /// Bytes still to send (None: until EOF).
    left: Option<u64>,
    sent: u64,
}

/// A started command.
struct Exec {
    pid: libc::pid_t,
    /// (connection, request id) receiving its output.
    attached: Option<(u32, u32)>,
    /// stdout and stderr read ends.
    pipes: [Option<OwnedFd>; 2],
    grown: [bool; 2],
    paused: bool,
    stdin: Option<OwnedFd>,
    stdin_buf: Vec<u8>,
    stdin_close: bool,
    stdin_watch: bool,
    stdin_blocking: Option<u32>,
    /// Output kept while detached.
    pending: VecDeque<(Kind, Vec<u8>)>,
    pending_bytes: usize,
    dropped: u64,
    status: Option<ExitStatus>,
    timed_out: bool,
    deadline: Option<Instant>,
    linger: Option<Instant>,
    cgroup: Option<CString>,
    /// Result kept for a later attach (finished while detached).
    result: Option<ExecResult>,
}

fn pipe_token(exec: u64, stream: u64) -> u64 {
    TAG_PIPE | (exec << 2) | stream
}

/// The server state.
pub struct Server {
    ep: Epoll,
    listener: OwnedFd,
    unix: bool,
    listener_paused: bool,
    sigfd: OwnedFd,
    devnull: OwnedFd,
    mode: AgentMode,
    base_env: Vec<(Vec<u8>, Vec<u8>)>,
    /// `base_env` as C strings, and a NULL-terminated pointer array over
    /// them, built once: an exec without environment changes copies none.
    _base_envp: Vec<CString>,
    base_env_ptrs: Vec<*const libc::c_char>,
    guest: Guest,
    conns: HashMap<u32, Conn>,
    next_conn: u32,
    execs: HashMap<u64, Exec>,
    by_pid: HashMap<libc::pid_t, u64>,
    next_exec: u64,
    retained: VecDeque<u64>,
    stale_cgroups: Vec<CString>,
    dirty: Vec<u32>,
    scratch: Vec<u8>,
    more_work: bool,
    shutdown: Option<PowerAction>,
}

/// Splits `NAME=value` entries.
pub fn split_env(entries: impl IntoIterator<Item = Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for e in entries {
        let Some(eq) = e.iter().position(|&b| b == b'=') else {
            continue;
        };
        let key = e.get(..eq).unwrap_or_default().to_vec();
        let val = e.get(eq + 1..).unwrap_or_default().to_vec();
        if !out.iter().any(|(k, _)| *k == key) {
            out.push((key, val));
        }
    }
    out
}

impl Server {
    /// Sets up signals and epoll around an already listening socket.
    pub fn new(
        listener: OwnedFd,
        unix: bool,
        mode: AgentMode,
        base_env: Vec<(Vec<u8>, Vec<u8>)>,
        guest: Guest,
    ) -> Result<Server, (&'static str, Errno)> {
        os::ensure_std_fds();
        let sigfd = os::block_signals_signalfd().map_err(|e| ("signalfd", e))?;
        let ep = Epoll::new().map_err(|e| ("epoll_create1", e))?;
        let devnull = os::open(c"/dev/null", libc::O_RDWR, 0).map_err(|e| ("open /dev/null", e))?;
        ep.add(listener.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_LISTENER)
            .map_err(|e| ("epoll_ctl", e))?;
        ep.add(sigfd.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_SIGNAL)
            .map_err(|e| ("epoll_ctl", e))?;
        let base_envp = env_cstrings(&base_env);
        let base_env_ptrs = launch::pointers(&base_envp);
        Ok(Server {
            ep,
            listener,
            unix,
            listener_paused: false,
            sigfd,
            devnull,
            mode,
            base_env,
            _base_envp: base_envp,
            base_env_ptrs,
            guest,
            conns: HashMap::new(),
            next_conn: 0,
            execs: HashMap::new(),
            by_pid: HashMap::new(),
            next_exec: 1,
            retained: VecDeque::new(),
            stale_cgroups: Vec::new(),
            dirty: Vec::new(),
            scratch: Vec::with_capacity(MAX_PAYLOAD),
            more_work: false,
            shutdown: None,
        })
    }

    /// Serves forever (until a power request).
    pub fn run(mut self) -> ! {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            let timeout = self.timeout_ms();
            let n = self.ep.wait(&mut events, timeout);
            for ev in events.iter().take(n) {
                let (mask, token) = (ev.events, ev.u64);
                self.dispatch(token, mask);
            }
            self.check_timers();
            self.flush();
            if let Some(action) = self.shutdown {
                guest::power(self.mode, action);
            }
        }
    }

    fn timeout_ms(&self) -> libc::c_int {
        if self.more_work {
            return 0;
        }
        let next = self
            .execs
            .values()
            .flat_map(|e| [e.deadline, e.linger])
            .flatten()
            .min();
        let Some(next) = next else {
            return -1;
        };
        let left = next.saturating_duration_since(Instant::now());
        // Round up so we do not wake just before the deadline.
        let ms = left.as_micros().div_ceil(1000);
        libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
    }

    fn dispatch(&mut self, token: u64, mask: u32) {
        match token & TAG_MASK {
            TAG_CONN => {
                let cid = (token & 0xffff_ffff) as u32;
                let hup = mask & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0;
                let readable = mask & libc::EPOLLIN as u32 != 0;
                let reading = self
                    .conns
                    .get(&cid)
                    .is_some_and(|c| c.events & libc::EPOLLIN as u32 != 0);
                if (readable || hup) && reading {
                    self.conn_read(cid);
                } else if hup {
                    self.kill_conn(cid);
                }
                if mask & libc::EPOLLOUT as u32 != 0 {
                    self.mark_dirty(cid);
                }
            }
            TAG_PIPE => {
                let exec = (token & !TAG_MASK) >> 2;
                match token & 3 {
                    0 => self.pipe_readable(exec, 0, mask),
                    1 => self.pipe_readable(exec, 1, mask),
                    _ => self.stdin_writable(exec),
                }
            }
            _ if token == TOKEN_LISTENER => self.accept(),
            _ => self.on_sigchld(),
        }
    }

    // ----------------------------------------------------------------- conns

    fn accept(&mut self) {
        let fd = match listen::accept(&self.listener, self.unix) {
            Ok(fd) => fd,
            Err(Errno(libc::EMFILE | libc::ENFILE)) => {
                // Out of fds: stop listening until something closes, or the
                // level-triggered listener would spin.
                let _ = self.ep.delete(self.listener.as_raw_fd());
                self.listener_paused = true;
                return;
            }
            Err(_) => return,
        };
        if self.conns.len() >= MAX_CONNS {
            return; // dropped: the client sees the connection close
        }
        let mut cid = self.next_conn;
        while self.conns.contains_key(&cid) {
            cid = cid.wrapping_add(1);
        }
        self.next_conn = cid.wrapping_add(1);
        let events = libc::EPOLLIN as u32;
        if self
            .ep
            .add(fd.as_raw_fd(), events, TAG_CONN | u64::from(cid))
            .is_err()
        {
            return;
        }
        self.conns.insert(
            cid,
            Conn {
                fd,
                inbuf: Vec::with_capacity(IN_CAP),
                out: Vec::new(),
                out_pos: 0,
                hello: false,
                closing: false,
                dead: false,
                dirty: false,
                blocked: false,
                events,
                stdin_blocked: 0,
                execs: HashMap::new(),
                uploads: HashMap::new(),
                downloads: VecDeque::new(),
                paused_execs: Vec::new(),
            },
        );
    }

    fn resume_listener(&mut self) {
        if self.listener_paused
            && self
                .ep
                .add(
                    self.listener.as_raw_fd(),
                    libc::EPOLLIN as u32,
                    TOKEN_LISTENER,
                )
                .is_ok()
        {
            self.listener_paused = false;
        }
    }

    fn mark_dirty(&mut self, cid: u32) {
        if let Some(c) = self.conns.get_mut(&cid) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(cid);
            }
        }
    }

    fn kill_conn(&mut self, cid: u32) {
        if let Some(c) = self.conns.get_mut(&cid) {
            c.dead = true;
        }
        self.mark_dirty(cid);
    }

    /// Queues a fatal error and closes the connection once it is sent.
    fn fail_conn(&mut self, cid: u32, id: u32, code: ErrorCode, message: String) {
        self.reply_err(cid, id, code, 0, message);
        if let Some(c) = self.conns.get_mut(&cid) {
            c.closing = true;
        }
        self.update_events(cid);
    }

    fn update_events(&mut self, cid: u32) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        if c.dead {
            return;
        }
        let mut ev = 0;
        if !c.closing && c.stdin_blocked == 0 && c.out_len() < OUT_MAX {
            ev |= libc::EPOLLIN as u32;
        }
        if c.blocked {
            ev |= libc::EPOLLOUT as u32;
        }
        if ev != c.events {
            if self
                .ep
                .modify(c.fd.as_raw_fd(), ev, TAG_CONN | u64::from(cid))
                .is_ok()
            {
                c.events = ev;
            } else {
                c.dead = true;
            }
        }
    }

    fn conn_read(&mut self, cid: u32) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        if c.closing || c.dead {
            return;
        }
        let mut buf = std::mem::take(&mut c.inbuf);
        let room = IN_CAP.saturating_sub(buf.len());
        match os::read_append(os::fd_ref(&c.fd), &mut buf, room, true) {
            Ok(0) => {
                c.inbuf = buf;
                self.kill_conn(cid);
                return;
            }
            Ok(_) => {}
            Err(Errno(libc::EAGAIN | libc::EINTR)) => {
                c.inbuf = buf;
                return;
            }
            Err(_) => {
                c.inbuf = buf;
                self.kill_conn(cid);
                return;
            }
        }
        c.inbuf = buf;
        self.conn_frames(cid, false);
    }

    /// Handles the complete frames in a connection's input buffer.
    fn conn_frames(&mut self, cid: u32, waited: bool) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let mut buf = std::mem::take(&mut c.inbuf);
        let mut pos = 0;
        while let Some(h) = buf.get(pos..).and_then(Header::parse_prefix) {
            let len = match h.checked_len() {
                Ok(len) => len,
                Err(e) => {
                    // The stream cannot be resynchronised past a bogus
                    // length: report and close.
                    self.fail_conn(cid, h.id, ErrorCode::TooLarge, e.to_string());
                    pos = buf.len();
                    break;
                }
            };
            let end = pos + HEADER_LEN + len;
            let Some(payload) = buf.get(pos + HEADER_LEN..end) else {
                break; // incomplete: wait for the rest
            };
            self.handle_frame(cid, h, payload);
            pos = end;
            if self.conns.get(&cid).is_none_or(|c| c.closing || c.dead) {
                pos = buf.len();
                break;
            }
        }
        buf.copy_within(pos.., 0);
        buf.truncate(buf.len() - pos);
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        // A frame is half here: the client writes frames whole, so wait
        // (bounded by SO_RCVTIMEO) for the rest in the same system call
        // rather than waking up per socket buffer's worth of it.
        let missing = Header::parse_prefix(&buf)
            .and_then(|h| h.checked_len().ok())
            .map(|len| (HEADER_LEN + len).saturating_sub(buf.len()))
            .unwrap_or(0);
        if missing > 0 && !waited && !c.closing && c.stdin_blocked == 0 {
            match os::recv_waitall(os::fd_ref(&c.fd), &mut buf, missing) {
                Ok(0) => {
                    c.inbuf = buf;
                    self.kill_conn(cid);
                    return;
                }
                Ok(_) => {
                    c.inbuf = buf;
                    return self.conn_frames(cid, true);
                }
                Err(_) => {} // timeout: wait for readiness as usual
            }
        }
        c.inbuf = buf;
    }

    // --------------------------------------------------------------- replies

    fn out(&mut self, cid: u32) -> Option<&mut Vec<u8>> {
        self.mark_dirty(cid);
        self.conns.get_mut(&cid).map(|c| &mut c.out)
    }

    fn reply<M: Message>(&mut self, cid: u32, id: u32, m: &M) {
        if let Some(out) = self.out(cid) {
            put_message(out, id, m);
        }
    }

    fn reply_ok(&mut self, cid: u32, id: u32) {
        if let Some(out) = self.out(cid) {
            put_empty(out, Kind::Ok, id);
        }
    }

    fn reply_err(&mut self, cid: u32, id: u32, code: ErrorCode, errno: i32, message: String) {
        self.reply(
            cid,
            id,
            &ErrorReply {
                code,
                errno,
                message,
            },
        );
    }

    fn reply_errno(&mut self, cid: u32, id: u32, what: &str, e: Errno) {
        let code = if e.0 == libc::EINVAL && what.is_empty() {
            ErrorCode::InvalidArgument
        } else {
            ErrorCode::Io
        };
        self.reply_err(cid, id, code, e.0, format!("{what}: {}", e.text()));
    }

    fn reply_result(&mut self, cid: u32, id: u32, what: &str, r: Result<(), Errno>) {
        match r {
            Ok(()) => self.reply_ok(cid, id),
            Err(e) => self.reply_errno(cid, id, what, e),
        }
    }

    // -------------------------------------------------------------- requests

    fn handle_frame(&mut self, cid: u32, h: Header, payload: &[u8]) {
        let id = h.id;
        let hello_done = self.conns.get(&cid).is_some_and(|c| c.hello);
        if !hello_done {
            self.handshake(cid, h, payload);
            return;
        }
        let Some(kind) = Kind::from_u8(h.kind) else {
            let msg = format!("unknown frame kind {:#04x}", h.kind);
            self.reply_err(cid, id, ErrorCode::UnknownKind, 0, msg);
            return;
        };
        macro_rules! msg {
            ($t:ty) => {
                match decode::<$t>(payload) {
                    Ok(m) => m,
                    Err(e) => {
                        let msg = format!("bad {:?} payload: {e}", kind);
                        self.reply_err(cid, id, ErrorCode::BadPayload, 0, msg);
                        return;
                    }
                }
            };
        }
        let empty_kind = matches!(
            kind,
            Kind::Health | Kind::Version | Kind::StdinClose | Kind::FileEnd
        );
        if empty_kind && !payload.is_empty() {
            let msg = format!("{kind:?} frames carry no payload");
            self.reply_err(cid, id, ErrorCode::BadPayload, 0, msg);
            return;
        }
        match kind {
            Kind::Health => {
                let reply = HealthReply {
                    running_execs: count(self.execs.values().filter(|e| e.status.is_none())),
                    execs: count(self.execs.values()),
                    connections: count(self.conns.values()),
                    mode: self.mode,
                };
                self.reply(cid, id, &reply);
            }
            Kind::Version => {
                let reply = VersionReply {
                    protocol: PROTOCOL_VERSION,
                    agent: env!("CARGO_PKG_VERSION").into(),
                    mode: self.mode,
                };
                self.reply(cid, id, &reply);
            }
            Kind::PostRestore => {
                let req = msg!(PostRestore);
                match guest::post_restore(self.mode, &req) {
                    Ok(r) => self.reply(cid, id, &r),
                    Err(e) => self.reply_errno(cid, id, "post_restore", e),
                }
            }
            Kind::Power => {
                let req = msg!(PowerRequest);
                self.reply_ok(cid, id);
                self.shutdown = Some(req.action);
            }
            Kind::Exec => {
                let req = msg!(ExecRequest);
                self.start_exec(cid, id, req);
            }
            Kind::Stdin => self.stdin_data(cid, id, payload),
            Kind::StdinClose => self.stdin_close(cid, id),
            Kind::Signal => {
                let req = msg!(SignalRequest);
                self.signal(cid, id, &req);
            }
            Kind::Attach => {
                let req = msg!(AttachRequest);
                self.attach(cid, id, req.exec_id);
            }
            Kind::FileWrite => {
                let req = msg!(FileWrite);
                self.file_write(cid, id, &req);
            }
            Kind::FileData => self.file_data(cid, id, payload),
            Kind::FileEnd => {
                if let Some(up) = self.conns.get_mut(&cid).and_then(|c| c.uploads.remove(&id)) {
                    self.reply(cid, id, &FileDone { bytes: up.bytes });
                }
            }
            Kind::FileRead => {
                let req = msg!(FileRead);
                self.file_read(cid, id, &req);
            }
            Kind::Stat => {
                let req = msg!(PathRequest);
                match files::stat(&req.path, req.nofollow) {
                    Ok(st) => self.reply(cid, id, &st),
                    Err(e) => self.reply_errno(cid, id, "stat", e),
                }
            }
            Kind::ListDir => {
                let req = msg!(PathRequest);
                let mut parts = Vec::new();
                match files::list_dir(&req.path, |entries| parts.push(entries)) {
                    Ok(()) => {
                        let n = parts.len();
                        for (i, entries) in parts.into_iter().enumerate() {
                            let last = i + 1 == n;
                            self.reply(cid, id, &DirEntries { entries, last });
                        }
                    }
                    Err(e) => self.reply_errno(cid, id, "list", e),
                }
            }
            Kind::Mkdir => {
                let req = msg!(MkdirRequest);
                let r = files::mkdir(&req.path, req.mode, req.parents);
                self.reply_result(cid, id, "mkdir", r);
            }
            Kind::Remove => {
                let req = msg!(RemoveRequest);
                let r = files::remove(&req.path, req.recursive);
                self.reply_result(cid, id, "remove", r);
            }
            Kind::Rename => {
                let req = msg!(RenameRequest);
                let r = files::rename(&req.from, &req.to);
                self.reply_result(cid, id, "rename", r);
            }
            Kind::Chmod => {
                let req = msg!(ChmodRequest);
                let r = files::chmod(&req.path, req.mode);
                self.reply_result(cid, id, "chmod", r);
            }
            Kind::Hello => {
                let msg = "Hello is only valid as the first frame".to_string();
                self.reply_err(cid, id, ErrorCode::UnknownKind, 0, msg);
            }
            _ => {
                let msg = format!("{kind:?} frames are sent by the agent, not to it");
                self.reply_err(cid, id, ErrorCode::UnknownKind, 0, msg);
            }
        }
    }

    fn handshake(&mut self, cid: u32, h: Header, payload: &[u8]) {
        if h.kind != Kind::Hello as u8 {
            let msg = format!("expected a Hello frame first, got kind {:#04x}", h.kind);
            self.fail_conn(cid, h.id, ErrorCode::HandshakeRequired, msg);
            return;
        }
        // Magic and version are decoded on their own first: a client of
        // another version may send a differently shaped rest.
        let mut r = proto::Reader::new(payload);
        let head = r.array::<4>().and_then(|m| {
            let v = <u16 as proto::Wire>::get(&mut r)?;
            Ok((m, v))
        });
        match head {
            Ok((magic, _)) if magic != HELLO_MAGIC => {
                let msg = "bad Hello magic: not a Shoal agent client".to_string();
                self.fail_conn(cid, h.id, ErrorCode::HandshakeRequired, msg);
            }
            Ok((_, v)) if v != PROTOCOL_VERSION => {
                let msg = format!(
                    "protocol version mismatch: client speaks {v}, agent speaks {PROTOCOL_VERSION}"
                );
                self.fail_conn(cid, h.id, ErrorCode::VersionMismatch, msg);
            }
            Ok(_) => match decode::<Hello>(payload) {
                Ok(_) => {
                    if let Some(c) = self.conns.get_mut(&cid) {
                        c.hello = true;
                    }
                    let ok = HelloOk {
                        version: PROTOCOL_VERSION,
                        agent: env!("CARGO_PKG_VERSION").into(),
                        mode: self.mode,
                    };
                    self.reply(cid, h.id, &ok);
                }
                Err(e) => {
                    let msg = format!("bad Hello payload: {e}");
                    self.fail_conn(cid, h.id, ErrorCode::HandshakeRequired, msg);
                }
            },
            Err(e) => {
                let msg = format!("bad Hello payload: {e}");
                self.fail_conn(cid, h.id, ErrorCode::HandshakeRequired, msg);
            }
        }
    }

    /// Common checks before a new stream with request id `id`.
    fn stream_allowed(&mut self, cid: u32, id: u32) -> bool {
        let Some(c) = self.conns.get(&cid) else {
            return false;
        };
        if c.id_in_use(id) {
            let msg = format!("request id {id} is in use by a stream");
            self.reply_err(cid, id, ErrorCode::IdInUse, 0, msg);
            return false;
        }
        if c.streams() >= MAX_STREAMS {
            let msg = format!("at most {MAX_STREAMS} streams per connection");
            self.reply_err(cid, id, ErrorCode::Busy, 0, msg);
            return false;
        }
        true
    }

    // ------------------------------------------------------------------ exec

    fn start_exec(&mut self, cid: u32, id: u32, req: ExecRequest) {
        if !self.stream_allowed(cid, id) {
            return;
        }
        if self.execs.len() >= MAX_EXECS {
            // Make room by forgetting the oldest finished exec nobody wants.
            if let Some(old) = self.retained.pop_front() {
                self.execs.remove(&old);
            } else {
                let msg = format!("at most {MAX_EXECS} execs at once");
                self.reply_err(cid, id, ErrorCode::Busy, 0, msg);
                return;
            }
        }
        let prep = match self.prepare(&req) {
            Ok(p) => p,
            Err(msg) => {
                self.reply_err(cid, id, ErrorCode::InvalidArgument, 0, msg);
                return;
            }
        };
        let (out_r, out_w) = match os::pipe() {
            Ok(p) => p,
            Err(e) => return self.reply_errno(cid, id, "pipe", e),
        };
        let (err_r, err_w) = match os::pipe() {
            Ok(p) => p,
            Err(e) => return self.reply_errno(cid, id, "pipe", e),
        };
        let (in_r, in_w) = if req.stdin {
            match os::pipe() {
                Ok((r, w)) => (Some(r), Some(w)),
                Err(e) => return self.reply_errno(cid, id, "pipe", e),
            }
        } else {
            (None, None)
        };
        let exec_id = self.next_exec;
        self.next_exec += 1;
        let guest = self.mode == AgentMode::Guest;
        let cgroup = if guest {
            self.guest.exec_cgroup(exec_id)
        } else {
            None
        };
        let spec = launch::SpawnSpec {
            paths: &prep.paths,
            argv: &prep.argv,
            envp: prep
                .env
                .as_ref()
                .map_or(&self.base_env_ptrs, |(_, ptrs)| ptrs),
            cwd: prep.cwd.as_deref(),
            user: req.user.map(|u| (u.uid, u.gid)),
            stdio: [
                in_r.as_ref().unwrap_or(&self.devnull).as_raw_fd(),
                out_w.as_raw_fd(),
                err_w.as_raw_fd(),
            ],
            cgroup: cgroup.as_ref(),
            reset_oom: guest,
        };
        let spawned = launch::spawn(&spec);
        drop((out_w, err_w, in_r));
        let spawned = match spawned {
            Ok(s) => s,
            Err((stage, e)) => {
                if let Some((dir, _)) = cgroup {
                    self.stale_cgroups.push(dir);
                }
                let argv0 = prep
                    .argv
                    .first()
                    .map(|a| a.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let msg = format!("{} {argv0}: {}", stage.what(), e.text());
                self.reply_err(cid, id, ErrorCode::SpawnFailed, e.0, msg);
                return;
            }
        };
        if let Some(w) = &in_w {
            let _ = os::set_nonblocking(os::fd_ref(w));
        }
        let readable = libc::EPOLLIN as u32;
        let _ = self
            .ep
            .add(out_r.as_raw_fd(), readable, pipe_token(exec_id, 0));
        let _ = self
            .ep
            .add(err_r.as_raw_fd(), readable, pipe_token(exec_id, 1));
        // An absurd timeout (overflowing Instant) means no timeout.
        let deadline = (req.timeout_ms > 0)
            .then(|| Instant::now().checked_add(Duration::from_millis(req.timeout_ms)))
            .flatten();
        let cgroup = cgroup.filter(|_| spawned.in_cgroup).map(|(dir, _)| dir);
        self.execs.insert(
            exec_id,
            Exec {
                pid: spawned.pid,
                attached: Some((cid, id)),
                pipes: [Some(out_r), Some(err_r)],
                grown: [false; 2],
                paused: false,
                stdin: in_w,
                stdin_buf: Vec::new(),
                stdin_close: false,
                stdin_watch: false,
                stdin_blocking: None,
                pending: VecDeque::new(),
                pending_bytes: 0,
                dropped: 0,
                status: None,
                timed_out: false,
                deadline,
                linger: None,
                cgroup,
                result: None,
            },
        );
        self.by_pid.insert(spawned.pid, exec_id);
        if let Some(c) = self.conns.get_mut(&cid) {
            c.execs.insert(id, exec_id);
        }
        let started = ExecStarted {
            exec_id,
            pid: spawned.pid,
        };
        self.reply(cid, id, &started);
    }

    /// Turns a request into what the child needs; Err is a message for
    /// InvalidArgument. The agent's base environment is used as it is
    /// unless the request changes it.
    fn prepare(&self, req: &ExecRequest) -> Result<Prepared, String> {
        let words: Vec<&[u8]> = match &req.command {
            Command::Argv(a) => a.iter().map(Vec::as_slice).collect(),
            Command::Shell(s) => vec![b"/bin/sh", b"-c", s.as_slice()],
        };
        let Some(&argv0) = words.first() else {
            return Err("empty argv".into());
        };
        let argv = words
            .iter()
            .map(|w| CString::new(*w).map_err(|_| "NUL byte in an argument".to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut env = None;
        if req.clear_env || !req.env.is_empty() {
            let mut e: Vec<(Vec<u8>, Vec<u8>)> = if req.clear_env {
                Vec::new()
            } else {
                self.base_env.clone()
            };
            for (k, v) in &req.env {
                if k.is_empty() || k.contains(&b'=') || k.contains(&0) || v.contains(&0) {
                    return Err(format!(
                        "invalid environment variable {:?}",
                        String::from_utf8_lossy(k)
                    ));
                }
                match e.iter_mut().find(|(ek, _)| ek == k) {
                    Some(slot) => slot.1.clone_from(v),
                    None => e.push((k.clone(), v.clone())),
                }
            }
            env = Some(e);
        }
        let path_var = env
            .as_ref()
            .unwrap_or(&self.base_env)
            .iter()
            .find(|(k, _)| k == b"PATH")
            .map_or(DEFAULT_PATH, |(_, v)| v.as_slice());
        let paths = launch::candidate_paths(argv0, path_var);
        let env = env.map(|e| {
            let c = env_cstrings(&e);
            let p = launch::pointers(&c);
            (c, p)
        });
        let cwd = match &req.cwd {
            Some(c) => Some(CString::new(c.as_slice()).map_err(|_| "NUL byte in cwd")?),
            None => None,
        };
        Ok(Prepared {
            paths,
            argv,
            env,
            cwd,
        })
    }

    fn pipe_readable(&mut self, exec_id: u64, stream: usize, mask: u32) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        let Some(fd) = exec.pipes.get(stream).and_then(Option::as_ref) else {
            return;
        };
        // EPOLLHUP on a pipe: no writer is left. Without EPOLLIN nothing is
        // buffered either, so it is the end without a read(2) returning 0.
        let hup = mask & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0;
        if hup && mask & libc::EPOLLIN as u32 == 0 {
            if let Some(p) = exec.pipes.get_mut(stream) {
                *p = None;
            }
            self.check_done(exec_id);
            return;
        }
        let mut data = std::mem::take(&mut self.scratch);
        data.clear();
        match os::read_append(os::fd_ref(fd), &mut data, MAX_PAYLOAD, false) {
            Ok(0) => {
                if let Some(p) = exec.pipes.get_mut(stream) {
                    *p = None; // close: leaves the epoll set
                }
                self.scratch = data;
                self.check_done(exec_id);
                return;
            }
            Ok(n) => {
                if n >= 64 * 1024 && !exec.grown.get(stream).copied().unwrap_or(true) {
                    let _ = os::set_pipe_size(os::fd_ref(fd), PIPE_GROWN);
                    if let Some(g) = exec.grown.get_mut(stream) {
                        *g = true;
                    }
                }
            }
            Err(Errno(libc::EAGAIN | libc::EINTR)) => {
                self.scratch = data;
                return;
            }
            Err(_) => {
                if let Some(p) = exec.pipes.get_mut(stream) {
                    *p = None;
                }
                self.scratch = data;
                self.check_done(exec_id);
                return;
            }
        }
        let kind = if stream == 0 {
            Kind::Stdout
        } else {
            Kind::Stderr
        };
        self.emit(exec_id, kind, &data);
        // A short read after the last writer went away emptied the pipe.
        let ended = hup && data.len() < MAX_PAYLOAD;
        self.scratch = data;
        if ended {
            if let Some(p) = self
                .execs
                .get_mut(&exec_id)
                .and_then(|e| e.pipes.get_mut(stream))
            {
                *p = None;
            }
            self.check_done(exec_id);
        }
    }

    /// Routes output to the attached connection, or keeps it (bounded).
    fn emit(&mut self, exec_id: u64, kind: Kind, data: &[u8]) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        if let Some((cid, rid)) = exec.attached {
            if let Some(c) = self.conns.get_mut(&cid) {
                put_data(&mut c.out, kind, rid, data);
                let full = c.out_len() >= OUT_HIGH;
                self.mark_dirty(cid);
                if full {
                    self.pause(exec_id, cid);
                }
                return;
            }
        }
        exec.pending.push_back((kind, data.to_vec()));
        exec.pending_bytes += data.len();
        while exec.pending_bytes > DETACHED_OUTPUT_LIMIT {
            let Some((_, old)) = exec.pending.pop_front() else {
                break;
            };
            exec.pending_bytes -= old.len();
            exec.dropped += old.len() as u64;
        }
    }

    /// Stops reading an exec's pipes until its connection drains.
    fn pause(&mut self, exec_id: u64, cid: u32) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        if exec.paused {
            return;
        }
        // Removed rather than set to no events: EPOLLHUP is reported even
        // then, and would spin the loop once the command exits.
        for p in exec.pipes.iter().flatten() {
            let _ = self.ep.delete(p.as_raw_fd());
        }
        exec.paused = true;
        if let Some(c) = self.conns.get_mut(&cid) {
            c.paused_execs.push(exec_id);
        }
    }

    fn resume(&mut self, exec_id: u64) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        if !exec.paused {
            return;
        }
        for (i, p) in exec.pipes.iter().enumerate() {
            if let Some(p) = p {
                let token = pipe_token(exec_id, i as u64);
                let _ = self.ep.add(p.as_raw_fd(), libc::EPOLLIN as u32, token);
            }
        }
        exec.paused = false;
    }

    /// Finishes an exec once it has exited and its pipes are closed.
    fn check_done(&mut self, exec_id: u64) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        let Some(status) = exec.status else {
            return;
        };
        if exec.result.is_some() {
            return;
        }
        if exec.pipes.iter().any(Option::is_some) {
            if exec.linger.is_none() {
                exec.linger = Some(Instant::now() + LINGER);
            }
            return;
        }
        exec.linger = None;
        exec.deadline = None;
        exec.stdin = None;
        exec.stdin_buf = Vec::new();
        let result = ExecResult {
            status,
            timed_out: exec.timed_out,
            dropped_bytes: exec.dropped,
        };
        if let Some(dir) = exec.cgroup.take() {
            if os::rmdir(&dir).is_err() {
                self.stale_cgroups.push(dir);
            }
        }
        let blocking = exec.stdin_blocking.take();
        let attached = exec.attached;
        if let Some(bc) = blocking {
            self.unblock_conn(bc);
        }
        if let Some((cid, rid)) = attached {
            if self.conns.contains_key(&cid) {
                self.reply(cid, rid, &result);
                if let Some(c) = self.conns.get_mut(&cid) {
                    c.execs.remove(&rid);
                }
                self.execs.remove(&exec_id);
                self.resume_listener();
                return;
            }
        }
        if let Some(exec) = self.execs.get_mut(&exec_id) {
            exec.attached = None;
            exec.result = Some(result);
        }
        self.retained.push_back(exec_id);
        while self.retained.len() > MAX_RETAINED {
            if let Some(old) = self.retained.pop_front() {
                self.execs.remove(&old);
            }
        }
        self.resume_listener();
    }

    fn on_sigchld(&mut self) {
        let mut buf = [0u8; 128 * 4];
        let _ = os::read(os::fd_ref(&self.sigfd), &mut buf);
        while let Some((pid, status)) = os::reap_one() {
            let Some(exec_id) = self.by_pid.remove(&pid) else {
                continue; // an orphan (PID 1) or a failed spawn
            };
            let st = if libc::WIFSIGNALED(status) {
                ExitStatus::Signaled(libc::WTERMSIG(status))
            } else {
                ExitStatus::Exited(libc::WEXITSTATUS(status))
            };
            if let Some(exec) = self.execs.get_mut(&exec_id) {
                exec.status = Some(st);
                exec.deadline = None;
            }
            self.check_done(exec_id);
        }
        if !self.stale_cgroups.is_empty() {
            self.stale_cgroups
                .retain(|d| os::rmdir(d).is_err_and(|e| e.0 == libc::EBUSY));
        }
    }

    fn check_timers(&mut self) {
        if !self
            .execs
            .values()
            .any(|e| e.deadline.is_some() || e.linger.is_some())
        {
            return;
        }
        let now = Instant::now();
        let mut done = Vec::new();
        for (&id, exec) in &mut self.execs {
            if exec.deadline.is_some_and(|d| d <= now) {
                exec.deadline = None;
                exec.timed_out = true;
                // The command leads its own session and process group.
                let _ = os::kill(-exec.pid, libc::SIGKILL);
                if let Some(cg) = &exec.cgroup {
                    guest::kill_cgroup(cg);
                }
            }
            if exec.linger.is_some_and(|d| d <= now) {
                if exec.paused {
                    // Output is waiting for the client, not for a
                    // background process: keep it.
                    exec.linger = Some(now + LINGER);
                } else {
                    exec.pipes = [None, None];
                    done.push(id);
                }
            }
        }
        for id in done {
            self.check_done(id);
        }
    }

    fn signal(&mut self, cid: u32, id: u32, req: &SignalRequest) {
        if !(0..=64).contains(&req.signal) {
            let msg = format!("invalid signal {}", req.signal);
            return self.reply_err(cid, id, ErrorCode::InvalidArgument, 0, msg);
        }
        let target = match self.execs.get(&req.exec_id) {
            Some(e) if e.status.is_none() => {
                if req.group {
                    -e.pid
                } else {
                    e.pid
                }
            }
            _ => {
                let msg = format!("no running exec {}", req.exec_id);
                return self.reply_err(cid, id, ErrorCode::NoSuchExec, 0, msg);
            }
        };
        let r = os::kill(target, req.signal);
        self.reply_result(cid, id, "kill", r);
    }

    fn attach(&mut self, cid: u32, id: u32, exec_id: u64) {
        if !self.stream_allowed(cid, id) {
            return;
        }
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            let msg = format!("no exec {exec_id}");
            return self.reply_err(cid, id, ErrorCode::NoSuchExec, 0, msg);
        };
        let previous = exec.attached.replace((cid, id));
        let pid = exec.pid;
        let pending = std::mem::take(&mut exec.pending);
        exec.pending_bytes = 0;
        let result = exec.result.take();
        let paused = exec.paused;
        if let Some((pc, pr)) = previous {
            if let Some(c) = self.conns.get_mut(&pc) {
                c.execs.remove(&pr);
            }
            let msg = format!("exec {exec_id} was attached by another connection");
            self.reply_err(pc, pr, ErrorCode::Detached, 0, msg);
        }
        self.reply(cid, id, &ExecStarted { exec_id, pid });
        if let Some(out) = self.out(cid) {
            for (kind, data) in &pending {
                put_data(out, *kind, id, data);
            }
        }
        if let Some(result) = result {
            self.reply(cid, id, &result);
            self.execs.remove(&exec_id);
            self.retained.retain(|&e| e != exec_id);
            return;
        }
        if let Some(c) = self.conns.get_mut(&cid) {
            c.execs.insert(id, exec_id);
        }
        if paused {
            self.resume(exec_id);
        }
    }

    fn stdin_data(&mut self, cid: u32, id: u32, data: &[u8]) {
        let Some(&exec_id) = self.conns.get(&cid).and_then(|c| c.execs.get(&id)) else {
            return; // finished, or no such stream: dropped (documented)
        };
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        let Some(fd) = &exec.stdin else {
            return;
        };
        if exec.stdin_close {
            return;
        }
        if exec.stdin_buf.is_empty() {
            let n = match os::write(os::fd_ref(fd), data) {
                Ok(n) => n,
                Err(Errno(libc::EAGAIN | libc::EINTR)) => 0,
                Err(_) => {
                    // EPIPE: the command closed its stdin.
                    exec.stdin = None;
                    return;
                }
            };
            let rest = data.get(n..).unwrap_or_default();
            if rest.is_empty() {
                return;
            }
            exec.stdin_buf.extend_from_slice(rest);
            let token = pipe_token(exec_id, 2);
            exec.stdin_watch = self
                .ep
                .add(fd.as_raw_fd(), libc::EPOLLOUT as u32, token)
                .is_ok();
        } else {
            exec.stdin_buf.extend_from_slice(data);
        }
        if exec.stdin_buf.len() > STDIN_LIMIT && exec.stdin_blocking.is_none() {
            exec.stdin_blocking = Some(cid);
            if let Some(c) = self.conns.get_mut(&cid) {
                c.stdin_blocked += 1;
            }
            self.update_events(cid);
        }
    }

    fn unblock_conn(&mut self, cid: u32) {
        if let Some(c) = self.conns.get_mut(&cid) {
            c.stdin_blocked = c.stdin_blocked.saturating_sub(1);
        }
        self.update_events(cid);
    }

    fn stdin_writable(&mut self, exec_id: u64) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        let Some(fd) = &exec.stdin else {
            return;
        };
        match os::write(os::fd_ref(fd), &exec.stdin_buf) {
            Ok(n) => {
                exec.stdin_buf.drain(..n.min(exec.stdin_buf.len()));
            }
            Err(Errno(libc::EAGAIN | libc::EINTR)) => return,
            Err(_) => {
                exec.stdin = None;
                exec.stdin_buf = Vec::new();
            }
        }
        if exec.stdin_buf.is_empty() {
            if exec.stdin_close {
                exec.stdin = None;
            } else if let Some(fd) = &exec.stdin {
                let _ = self.ep.delete(fd.as_raw_fd());
            }
            exec.stdin_watch = false;
            exec.stdin_buf = Vec::new();
        }
        if exec.stdin_buf.len() <= STDIN_LIMIT / 2 {
            if let Some(bc) = exec.stdin_blocking.take() {
                self.unblock_conn(bc);
            }
        }
    }

    fn stdin_close(&mut self, cid: u32, id: u32) {
        let Some(&exec_id) = self.conns.get(&cid).and_then(|c| c.execs.get(&id)) else {
            return;
        };
        if let Some(exec) = self.execs.get_mut(&exec_id) {
            if exec.stdin_buf.is_empty() {
                exec.stdin = None;
            } else {
                exec.stdin_close = true;
            }
        }
    }

    // ----------------------------------------------------------------- files

    fn file_write(&mut self, cid: u32, id: u32, req: &FileWrite) {
        if !self.stream_allowed(cid, id) {
            return;
        }
        match files::open_write(&req.path, req.mode, req.append, req.create_parents) {
            Ok(file) => {
                if let Some(c) = self.conns.get_mut(&cid) {
                    c.uploads.insert(id, Upload { file, bytes: 0 });
                }
            }
            Err(e) => self.reply_errno(cid, id, "open for writing", e),
        }
    }

    fn file_data(&mut self, cid: u32, id: u32, data: &[u8]) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let Some(up) = c.uploads.get_mut(&id) else {
            return; // failed or unknown upload: dropped (documented)
        };
        match os::write_all(os::fd_ref(&up.file), data) {
            Ok(()) => up.bytes += data.len() as u64,
            Err(e) => {
                c.uploads.remove(&id);
                self.reply_errno(cid, id, "write", e);
            }
        }
    }

    fn file_read(&mut self, cid: u32, id: u32, req: &FileRead) {
        if !self.stream_allowed(cid, id) {
            return;
        }
        match files::open_read(&req.path, req.offset, req.limit) {
            Ok((file, left)) => {
                if let Some(c) = self.conns.get_mut(&cid) {
                    c.downloads.push_back(Download {
                        id,
                        file,
                        left,
                        sent: 0,
                    });
                }
                self.mark_dirty(cid);
            }
            Err(e) => self.reply_errno(cid, id, "open for reading", e),
        }
    }

    /// Reads the next chunk of the first download straight into the output
    /// buffer.
    fn pump_download(&mut self, cid: u32) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let Some(mut d) = c.downloads.pop_front() else {
            return;
        };
        let max = MAX_PAYLOAD as u64;
        let want = usize::try_from(d.left.unwrap_or(max).min(max)).unwrap_or(MAX_PAYLOAD);
        if want == 0 {
            put_message(&mut c.out, d.id, &FileDone { bytes: d.sent });
            return;
        }
        let at = begin_frame(&mut c.out, Kind::FileChunk, d.id);
        match os::read_append(os::fd_ref(&d.file), &mut c.out, want, false) {
            Ok(0) => {
                c.out.truncate(at);
                put_message(&mut c.out, d.id, &FileDone { bytes: d.sent });
            }
            Ok(n) => {
                end_frame(&mut c.out, at);
                d.sent += n as u64;
                d.left = d.left.map(|l| l.saturating_sub(n as u64));
                if d.left == Some(0) {
                    put_message(&mut c.out, d.id, &FileDone { bytes: d.sent });
                } else {
                    c.downloads.push_back(d);
                }
            }
            Err(e) => {
                c.out.truncate(at);
                let id = d.id;
                self.reply_errno(cid, id, "read", e);
            }
        }
    }

    // ---------------------------------------------------------------- output

    fn flush(&mut self) {
        self.more_work = false;
        let dirty = std::mem::take(&mut self.dirty);
        for cid in dirty {
            if let Some(c) = self.conns.get_mut(&cid) {
                c.dirty = false;
            }
            self.service_output(cid);
            if self.conns.get(&cid).is_some_and(|c| c.dead) {
                self.close_conn(cid);
            }
        }
    }

    fn service_output(&mut self, cid: u32) {
        let mut budget = DOWNLOAD_BUDGET;
        loop {
            while budget > 0
                && self
                    .conns
                    .get(&cid)
                    .is_some_and(|c| !c.dead && !c.downloads.is_empty() && c.out_len() < OUT_HIGH)
            {
                self.pump_download(cid);
                budget -= 1;
            }
            let Some(c) = self.conns.get_mut(&cid) else {
                return;
            };
            if c.dead {
                return;
            }
            if c.out_len() == 0 {
                c.blocked = false;
                break;
            }
            let pending = c.out.get(c.out_pos..).unwrap_or_default();
            match os::send(os::fd_ref(&c.fd), pending) {
                Ok(n) => {
                    c.out_pos += n;
                    if c.out_pos >= c.out.len() {
                        c.out.clear();
                        c.out_pos = 0;
                        c.blocked = false;
                    } else {
                        c.blocked = true; // socket buffer full
                        break;
                    }
                }
                Err(Errno(libc::EAGAIN)) => {
                    c.blocked = true;
                    break;
                }
                Err(Errno(libc::EINTR)) => continue,
                Err(_) => {
                    c.dead = true;
                    return;
                }
            }
            if c.downloads.is_empty() {
                break;
            }
            if budget == 0 {
                // Let other connections and events in; come back at once.
                self.more_work = true;
                c.dirty = true;
                self.dirty.push(cid);
                break;
            }
        }
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        if c.out_pos > 0 && c.out_pos * 2 >= c.out.len() {
            c.out.drain(..c.out_pos);
            c.out_pos = 0;
        }
        if c.closing && c.out_len() == 0 {
            c.dead = true;
            return;
        }
        if c.out_len() < OUT_LOW && !c.paused_execs.is_empty() {
            for e in std::mem::take(&mut c.paused_execs) {
                self.resume(e);
            }
        }
        self.update_events(cid);
    }

    fn close_conn(&mut self, cid: u32) {
        let Some(c) = self.conns.remove(&cid) else {
            return;
        };
        for (_, exec_id) in c.execs {
            if let Some(exec) = self.execs.get_mut(&exec_id) {
                if exec.attached.is_some_and(|(ac, _)| ac == cid) {
                    exec.attached = None;
                }
                if exec.stdin_blocking == Some(cid) {
                    exec.stdin_blocking = None;
                }
            }
            // Detached output is kept (bounded), so reading resumes.
            self.resume(exec_id);
        }
        self.resume_listener();
    }
}

/// What an exec request turns into before the spawn.
struct Prepared {
    paths: Vec<CString>,
    argv: Vec<CString>,
    /// A changed environment (C strings and the pointer array over them).
    env: Option<(Vec<CString>, Vec<*const libc::c_char>)>,
    cwd: Option<CString>,
}

/// `NAME=value` C strings (entries with a NUL byte are skipped).
fn env_cstrings(env: &[(Vec<u8>, Vec<u8>)]) -> Vec<CString> {
    env.iter()
        .filter_map(|(k, v)| {
            let mut e = Vec::with_capacity(k.len() + 1 + v.len());
            e.extend_from_slice(k);
            e.push(b'=');
            e.extend_from_slice(v);
            CString::new(e).ok()
        })
        .collect()
}

fn count<T>(it: impl Iterator<Item = T>) -> u32 {
    u32::try_from(it.count()).unwrap_or(u32::MAX)
}
