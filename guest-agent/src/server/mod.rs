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

mod conn;
mod exec;
mod files;
pub mod guest;
mod launch;
pub mod listen;
pub mod net;
pub mod os;
mod relay;
pub mod vport;

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use agent_proto::{
    self as proto, begin_frame, decode, end_frame, put_data, put_empty, put_message, AgentMode,
    AttachRequest, ChmodRequest, Command, DirEntries, ErrorCode, ErrorReply, ExecRequest,
    ExecResult, ExecStarted, ExitStatus, FileDone, FileRead, FileWrite, Header, HealthReply, Hello,
    HelloOk, Kind, Message, MkdirRequest, NetConfigure, PathRequest, PostRestore, PowerAction,
    PowerRequest, PtyExec, PtyResize, RemoveRequest, RenameRequest, SignalRequest, TcpConnect,
    VersionReply, DETACHED_OUTPUT_LIMIT, HEADER_LEN, HELLO_MAGIC, MAX_PAYLOAD, PROTOCOL_VERSION,
    TCP_CONNECT_TIMEOUT_MAX_MS,
};

use exec::env_cstrings;
use guest::Guest;
use os::{Epoll, Errno};

const TOKEN_LISTENER: u64 = 0;
const TOKEN_SIGNAL: u64 = 1;
const TAG_CONN: u64 = 1 << 62;
const TAG_PIPE: u64 = 2 << 62;
const TAG_RELAY: u64 = 3 << 62;
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
/// Reads of a pipe whose command's linger ended (what it holds then).
const DRAIN_READS: usize = 16;
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
    /// Set by `TcpConnect`: the connection relays bytes to a guest TCP
    /// connection instead of carrying frames.
    relay: Option<relay::Relay>,
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
    /// The original deadline, kept after the command exits: what it left
    /// running in its cgroup is killed then.
    kill_at: Option<Instant>,
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
    /// Host mode: the one interface `NetConfigure` may change (tests).
    host_netdev: Option<String>,
    conns: HashMap<u32, Conn>,
    next_conn: u32,
    execs: HashMap<u64, Exec>,
    by_pid: HashMap<libc::pid_t, u64>,
    next_exec: u64,
    retained: VecDeque<u64>,
    stale_cgroups: Vec<CString>,
    /// cgroups of finished execs whose background processes are killed at
    /// the exec's deadline.
    doomed: Vec<(Instant, CString)>,
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
        let host_netdev = base_env
            .iter()
            .find(|(k, _)| mode == AgentMode::Host && k == net::HOST_NETDEV_ENV)
            .and_then(|(_, v)| String::from_utf8(v.clone()).ok());
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
            host_netdev,
            conns: HashMap::new(),
            next_conn: 0,
            execs: HashMap::new(),
            by_pid: HashMap::new(),
            next_exec: 1,
            retained: VecDeque::new(),
            stale_cgroups: Vec::new(),
            doomed: Vec::new(),
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
            self.relay_timers();
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
            .chain(self.doomed.iter().map(|(at, _)| *at))
            .chain(
                self.conns
                    .values()
                    .filter_map(|c| c.relay.as_ref()?.deadline()),
            )
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
            TAG_RELAY => self.relay_tcp_event((token & 0xffff_ffff) as u32, mask),
            _ if token == TOKEN_LISTENER => self.accept(),
            _ => self.on_sigchld(),
        }
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
            Kind::NetConfigure => {
                let req = msg!(NetConfigure);
                match net::handle(self.mode, self.host_netdev.as_deref(), &req) {
                    Ok(r) => self.reply(cid, id, &r),
                    Err(e) => self.reply_errno(cid, id, e.what, e.errno),
                }
            }
            Kind::Power => {
                let req = msg!(PowerRequest);
                self.reply_ok(cid, id);
                self.shutdown = Some(req.action);
            }
            Kind::Exec => {
                let req = msg!(ExecRequest);
                self.start_exec(cid, id, req, None);
            }
            Kind::PtyExec => {
                let req = msg!(PtyExec);
                self.start_exec(cid, id, req.exec, Some((req.cols, req.rows)));
            }
            Kind::PtyResize => {
                let req = msg!(PtyResize);
                self.pty_resize(cid, id, &req);
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
            Kind::TcpConnect => {
                let req = msg!(TcpConnect);
                self.tcp_connect(cid, id, &req);
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
}

fn count<T>(it: impl Iterator<Item = T>) -> u32 {
    u32::try_from(it.count()).unwrap_or(u32::MAX)
}
