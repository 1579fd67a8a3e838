//! The agent protocol served on the host for a `vm` guest that does not
//! run Shoal's agent: a Unix socket ([`super::Transport::Unix`]) whose
//! requests are carried out through the guest's serial console
//! ([`Console`]), so that the daemon's exec and file paths are the same
//! for every guest.
//!
//! What a console can do: `Exec` (stdout and stderr come back together,
//! as `Stdout`, once the command ends; stdin is taken whole before the
//! command starts), `FileWrite`/`FileRead` (through `base64`, at most
//! [`MAX_FILE`] bytes), `Stat`, `Mkdir`, `Remove`, `Rename`, `Chmod`,
//! `Health`, `Version` and `PostRestore` (the guest's clock is set; its
//! entropy is not credited). The rest (`Signal`, `Attach`, PTYs, TCP,
//! listings, power, network) is answered with an error that says so.
//! Requests are carried out one at a time (one console).

use super::qemu_console::{quote, Console, ConsoleError, Ran, MAX_STDIN};
use agent_proto::{
    decode, put_data, put_message, AgentMode, ChmodRequest, Command, ErrorCode, ErrorReply,
    ExecRequest, ExecResult, ExecStarted, ExitStatus, FileDone, FileRead, FileStat, FileType,
    FileWrite, FrameDecoder, HealthReply, HelloOk, Kind, MkdirRequest, PathRequest, PostRestore,
    PostRestoreReply, RemoveRequest, RenameRequest, VersionReply, PROTOCOL_VERSION,
};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest file read or written through the console (base64 over a
/// serial line is slow).
pub const MAX_FILE: usize = 1 << 20;
/// Most output kept of one exec (the rest is counted as dropped).
pub const MAX_OUTPUT: usize = 1 << 20;
/// Time allowed for a file operation or a request without its own limit.
const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// Time allowed past a command's own limit for its end marker to arrive.
const SLACK: Duration = Duration::from_secs(30);
/// Default limit of a command that names none.
const DEFAULT_LIMIT: Duration = Duration::from_secs(300);
/// Most open client connections.
const MAX_CONNS: u32 = 64;

#[derive(Debug)]
struct Shared {
    console: Console,
    stop: AtomicBool,
    conns: AtomicU32,
    next_exec: AtomicU64,
}

/// A running server; dropping it stops it and removes its socket.
#[derive(Debug)]
pub struct ConsoleAgent {
    shared: Arc<Shared>,
    sock: PathBuf,
}

impl ConsoleAgent {
    /// Serves the agent protocol on `sock` (replaced) over the console
    /// behind QEMU's chardev socket `console_sock`.
    pub fn start(sock: &Path, console_sock: &Path) -> std::io::Result<ConsoleAgent> {
        let _ = std::fs::remove_file(sock);
        let listener = UnixListener::bind(sock)?;
        let shared = Arc::new(Shared {
            console: Console::new(console_sock),
            stop: AtomicBool::new(false),
            conns: AtomicU32::new(0),
            next_exec: AtomicU64::new(1),
        });
        let sh = shared.clone();
        std::thread::Builder::new()
            .name("qemu-console-accept".into())
            .spawn(move || {
                for c in listener.incoming() {
                    if sh.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(c) = c else { continue };
                    if sh.conns.fetch_add(1, Ordering::AcqRel) >= MAX_CONNS {
                        sh.conns.fetch_sub(1, Ordering::AcqRel);
                        continue;
                    }
                    let sh2 = sh.clone();
                    let spawned = std::thread::Builder::new()
                        .name("qemu-console-conn".into())
                        .spawn(move || {
                            serve(&sh2, c);
                            sh2.conns.fetch_sub(1, Ordering::AcqRel);
                        });
                    if spawned.is_err() {
                        sh.conns.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            })?;
        Ok(ConsoleAgent {
            shared,
            sock: sock.to_path_buf(),
        })
    }

    /// The console it drives.
    pub fn console(&self) -> &Console {
        &self.shared.console
    }
}

impl Drop for ConsoleAgent {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _ = UnixStream::connect(&self.sock);
        let _ = std::fs::remove_file(&self.sock);
    }
}

/// How the host reaches a `vm` guest: Shoal's agent over its
/// virtio-serial port, or this server over its serial console.
#[derive(Debug)]
pub enum Link {
    /// The agent's port, bridged ([`super::qemu_bridge::Bridge`]).
    Agent(super::qemu_bridge::Bridge),
    /// The console shell, served as an agent.
    Console(ConsoleAgent),
}

impl Link {
    /// Serves `sock` for the QEMU whose directory is `qdir`.
    pub fn start(qdir: &Path, sock: &Path, serial_console: bool) -> std::io::Result<Link> {
        Ok(match serial_console {
            true => Link::Console(ConsoleAgent::start(
                sock,
                &qdir.join(super::qemu_console::CONSOLE_SOCK),
            )?),
            false => Link::Agent(super::qemu_bridge::Bridge::start(
                sock,
                &qdir.join(super::qemu_launch::PORT_SOCK),
            )?),
        })
    }

    /// The console, for a console-shell guest.
    pub fn console(&self) -> Option<&Console> {
        match self {
            Link::Console(c) => Some(c.console()),
            Link::Agent(_) => None,
        }
    }
}

/// An upload or an exec waiting for its stdin to close.
enum Pending {
    Upload(FileWrite, Vec<u8>, bool),
    Exec(ExecRequest, Vec<u8>, bool),
}

struct Conn<'a> {
    sh: &'a Shared,
    out: UnixStream,
    pending: std::collections::HashMap<u32, Pending>,
}

fn err_frame(code: ErrorCode, errno: i32, message: impl Into<String>) -> ErrorReply {
    ErrorReply {
        code,
        errno,
        message: message.into(),
    }
}

/// One client connection: `Hello`, then requests in turn.
fn serve(sh: &Shared, c: UnixStream) {
    let Ok(out) = c.try_clone() else { return };
    let _ = out.set_write_timeout(Some(Duration::from_secs(10)));
    let mut conn = Conn {
        sh,
        out,
        pending: Default::default(),
    };
    let mut c = c;
    let mut dec = FrameDecoder::new();
    let mut hello = false;
    loop {
        if sh.stop.load(Ordering::Relaxed) {
            return;
        }
        let buf = dec.spare(64 << 10);
        let n = match c.read(buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        dec.commit(n);
        loop {
            let f = match dec.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    conn.error(0, err_frame(ErrorCode::TooLarge, 0, e.to_string()));
                    return;
                }
            };
            let (id, kind) = (f.header.id, Kind::from_u8(f.header.kind));
            if !hello {
                if kind != Some(Kind::Hello) {
                    conn.error(
                        id,
                        err_frame(ErrorCode::HandshakeRequired, 0, "Hello first"),
                    );
                    return;
                }
                match decode::<agent_proto::Hello>(&f.payload) {
                    Ok(h) if h.version == PROTOCOL_VERSION => {
                        hello = true;
                        conn.reply(id, &hello_ok());
                    }
                    _ => {
                        conn.error(
                            id,
                            err_frame(ErrorCode::VersionMismatch, 0, "protocol version"),
                        );
                        return;
                    }
                }
                continue;
            }
            if !conn.frame(id, kind, &f.payload) {
                return;
            }
        }
    }
}

fn hello_ok() -> HelloOk {
    HelloOk {
        version: PROTOCOL_VERSION,
        agent: format!("serial-console/{}", env!("CARGO_PKG_VERSION")),
        mode: AgentMode::Guest,
    }
}

/// An error reply for a failed console call.
fn console_err(e: &ConsoleError) -> ErrorReply {
    let code = match e {
        ConsoleError::Invalid(_) => ErrorCode::InvalidArgument,
        _ => ErrorCode::Io,
    };
    let errno = match e {
        ConsoleError::Timeout(_) => libc::ETIMEDOUT,
        ConsoleError::Invalid(_) => libc::EINVAL,
        _ => libc::EIO,
    };
    err_frame(code, errno, e.to_string())
}

/// An error reply for a guest command that failed (its output says why).
fn command_err(r: &Ran) -> ErrorReply {
    let text = String::from_utf8_lossy(&r.output);
    let text = text.trim();
    let errno = if text.contains("No such file") {
        libc::ENOENT
    } else if text.contains("Permission denied") {
        libc::EACCES
    } else if text.contains("exists") {
        libc::EEXIST
    } else if text.contains("Not a directory") {
        libc::ENOTDIR
    } else if text.contains("Is a directory") {
        libc::EISDIR
    } else {
        libc::EIO
    };
    let msg: String = text.chars().take(500).collect();
    err_frame(
        ErrorCode::Io,
        errno,
        format!("guest: {msg} (exit {})", r.code),
    )
}

impl Conn<'_> {
    fn send(&mut self, buf: &[u8]) -> bool {
        self.out.write_all(buf).is_ok()
    }

    fn reply<M: agent_proto::Message>(&mut self, id: u32, m: &M) -> bool {
        let mut b = Vec::new();
        put_message(&mut b, id, m);
        self.send(&b)
    }

    fn error(&mut self, id: u32, e: ErrorReply) -> bool {
        self.reply(id, &e)
    }

    fn ok(&mut self, id: u32) -> bool {
        let mut b = Vec::new();
        put_data(&mut b, Kind::Ok, id, &[]);
        self.send(&b)
    }

    /// Runs `script` with the file-operation limits.
    fn op(&self, script: &str, stdin: Option<&[u8]>, cap: usize) -> Result<Ran, ConsoleError> {
        self.sh
            .console
            .run(script, stdin, OP_TIMEOUT, OP_TIMEOUT + SLACK, cap)
    }

    /// Runs a file operation that prints nothing on success: `Ok`.
    fn simple(&mut self, id: u32, script: Result<String, ConsoleError>) -> bool {
        match script.and_then(|s| self.op(&s, None, 4096)) {
            Ok(r) if r.code == 0 => self.ok(id),
            Ok(r) => self.error(id, command_err(&r)),
            Err(e) => self.error(id, console_err(&e)),
        }
    }

    /// Handles one frame after the hand-shake; false ends the connection.
    fn frame(&mut self, id: u32, kind: Option<Kind>, p: &[u8]) -> bool {
        let bad = |e: agent_proto::DecodeError| err_frame(ErrorCode::BadPayload, 0, e.to_string());
        macro_rules! req {
            ($t:ty) => {
                match decode::<$t>(p) {
                    Ok(r) => r,
                    Err(e) => return self.error(id, bad(e)),
                }
            };
        }
        match kind {
            Some(Kind::Health) => self.reply(
                id,
                &HealthReply {
                    running_execs: 0,
                    execs: 0,
                    connections: self.sh.conns.load(Ordering::Relaxed),
                    mode: AgentMode::Guest,
                },
            ),
            Some(Kind::Version) => self.reply(
                id,
                &VersionReply {
                    protocol: PROTOCOL_VERSION,
                    agent: hello_ok().agent,
                    mode: AgentMode::Guest,
                },
            ),
            Some(Kind::PostRestore) => {
                let r = req!(PostRestore);
                let secs = r.unix_time_ns / 1_000_000_000;
                let set = self
                    .op(&format!("date -u -s @{secs} >/dev/null"), None, 4096)
                    .is_ok_and(|r| r.code == 0);
                self.reply(
                    id,
                    &PostRestoreReply {
                        entropy_credited: false,
                        clock_set: set,
                    },
                )
            }
            Some(Kind::Exec) => {
                let r = req!(ExecRequest);
                let exec_id = self.sh.next_exec.fetch_add(1, Ordering::Relaxed);
                // The command's own pid is not known here: the console shell's.
                if !self.reply(id, &ExecStarted { exec_id, pid: 1 }) {
                    return false;
                }
                if r.stdin {
                    self.pending.insert(id, Pending::Exec(r, Vec::new(), false));
                    return true;
                }
                self.exec(id, &r, None)
            }
            Some(Kind::Stdin) | Some(Kind::FileData) => {
                let max = if kind == Some(Kind::Stdin) {
                    MAX_STDIN
                } else {
                    MAX_FILE
                };
                match self.pending.get_mut(&id) {
                    Some(Pending::Exec(_, buf, over)) | Some(Pending::Upload(_, buf, over)) => {
                        if buf.len() + p.len() > max {
                            *over = true;
                        } else {
                            buf.extend_from_slice(p);
                        }
                    }
                    None => {}
                }
                true
            }
            Some(Kind::StdinClose) => match self.pending.remove(&id) {
                Some(Pending::Exec(r, data, over)) => {
                    if over {
                        return self.error(
                            id,
                            err_frame(
                                ErrorCode::InvalidArgument,
                                libc::EFBIG,
                                format!("stdin over {MAX_STDIN} bytes through a serial console"),
                            ),
                        );
                    }
                    self.exec(id, &r, Some(&data))
                }
                Some(other) => {
                    self.pending.insert(id, other);
                    true
                }
                None => true,
            },
            Some(Kind::FileWrite) => {
                let r = req!(FileWrite);
                self.pending
                    .insert(id, Pending::Upload(r, Vec::new(), false));
                true
            }
            Some(Kind::FileEnd) => match self.pending.remove(&id) {
                Some(Pending::Upload(w, data, over)) => self.upload(id, &w, &data, over),
                Some(other) => {
                    self.pending.insert(id, other);
                    true
                }
                None => true,
            },
            Some(Kind::FileRead) => {
                let r = req!(FileRead);
                self.download(id, &r)
            }
            Some(Kind::Stat) => {
                let r = req!(PathRequest);
                self.stat(id, &r)
            }
            Some(Kind::Mkdir) => {
                let r = req!(MkdirRequest);
                let s = quote(&r.path).map(|q| {
                    let p = if r.parents { "-p " } else { "" };
                    format!("mkdir {p}-m {:o} {q}", r.mode & 0o7777)
                });
                self.simple(id, s)
            }
            Some(Kind::Remove) => {
                let r = req!(RemoveRequest);
                let s = quote(&r.path).map(|q| {
                    if r.recursive {
                        format!("rm -rf {q}")
                    } else {
                        format!("if [ -d {q} ] && [ ! -L {q} ]; then rmdir {q}; else rm {q}; fi")
                    }
                });
                self.simple(id, s)
            }
            Some(Kind::Rename) => {
                let r = req!(RenameRequest);
                let s = quote(&r.from).and_then(|f| Ok(format!("mv -f {f} {}", quote(&r.to)?)));
                self.simple(id, s)
            }
            Some(Kind::Chmod) => {
                let r = req!(ChmodRequest);
                let s = quote(&r.path).map(|q| format!("chmod {:o} {q}", r.mode & 0o7777));
                self.simple(id, s)
            }
            Some(Kind::Signal) | Some(Kind::Attach) | Some(Kind::PtyResize) => self.error(
                id,
                err_frame(
                    ErrorCode::NoSuchExec,
                    0,
                    "no running exec: commands through a serial console run one at a time, \
                     to their end",
                ),
            ),
            _ => self.error(
                id,
                err_frame(
                    ErrorCode::UnknownKind,
                    0,
                    "this guest runs no Shoal agent: its serial console takes exec and \
                     file requests only",
                ),
            ),
        }
    }

    /// Runs an exec to its end; sends its output and exit.
    fn exec(&mut self, id: u32, r: &ExecRequest, stdin: Option<&[u8]>) -> bool {
        let script = match exec_script(r) {
            Ok(s) => s,
            Err(e) => return self.error(id, console_err(&e)),
        };
        let limit = r.timeout().unwrap_or(DEFAULT_LIMIT);
        let ran = self
            .sh
            .console
            .run(&script, stdin, limit, limit + SLACK, MAX_OUTPUT);
        let ran = match ran {
            Ok(r) => r,
            Err(e) => return self.error(id, console_err(&e)),
        };
        let mut b = Vec::new();
        for chunk in ran.output.chunks(256 << 10) {
            put_data(&mut b, Kind::Stdout, id, chunk);
        }
        let status = if ran.timed_out {
            ExitStatus::Signaled(libc::SIGKILL)
        } else {
            ExitStatus::Exited(ran.code)
        };
        put_message(
            &mut b,
            id,
            &ExecResult {
                status,
                timed_out: ran.timed_out,
                dropped_bytes: ran.dropped,
            },
        );
        self.send(&b)
    }

    fn upload(&mut self, id: u32, w: &FileWrite, data: &[u8], over: bool) -> bool {
        if over {
            return self.error(
                id,
                err_frame(
                    ErrorCode::InvalidArgument,
                    libc::EFBIG,
                    format!("a file over {MAX_FILE} bytes through a serial console"),
                ),
            );
        }
        let script = quote(&w.path).map(|q| {
            let mut s = String::new();
            if w.create_parents {
                s.push_str(&format!("mkdir -p \"$(dirname {q})\" && "));
            }
            let redir = if w.append { ">>" } else { ">" };
            s.push_str(&format!(
                "cat {redir} {q} && chmod {:o} {q}",
                w.mode & 0o7777
            ));
            s
        });
        match script.and_then(|s| self.op(&s, Some(data), 4096)) {
            Ok(r) if r.code == 0 => self.reply(
                id,
                &FileDone {
                    bytes: u64::try_from(data.len()).unwrap_or(u64::MAX),
                },
            ),
            Ok(r) => self.error(id, command_err(&r)),
            Err(e) => self.error(id, console_err(&e)),
        }
    }

    fn download(&mut self, id: u32, r: &FileRead) -> bool {
        use base64::Engine;
        let q = match quote(&r.path) {
            Ok(q) => q,
            Err(e) => return self.error(id, console_err(&e)),
        };
        // Refuse before reading what would be cut anyway.
        let script = format!(
            "[ -f {q} ] || {{ echo {q}: Not a regular file or No such file; exit 1; }}; \
             [ $(wc -c < {q}) -le {MAX_FILE} ] || {{ echo file too large; exit 3; }}; \
             busybox base64 {q}"
        );
        let ran = match self.op(&script, None, MAX_FILE * 4 / 3 + (MAX_FILE >> 5) + 64) {
            Ok(r) if r.code == 0 && r.dropped == 0 => r,
            Ok(r) if r.code == 3 => {
                return self.error(
                    id,
                    err_frame(
                        ErrorCode::InvalidArgument,
                        libc::EFBIG,
                        format!("a file over {MAX_FILE} bytes through a serial console"),
                    ),
                )
            }
            Ok(r) => return self.error(id, command_err(&r)),
            Err(e) => return self.error(id, console_err(&e)),
        };
        let text: Vec<u8> = ran
            .output
            .into_iter()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        let data = match base64::engine::general_purpose::STANDARD.decode(&text) {
            Ok(d) if d.len() <= MAX_FILE => d,
            _ => {
                return self.error(
                    id,
                    err_frame(ErrorCode::Io, libc::EIO, "the guest's base64 is not valid"),
                )
            }
        };
        let from = usize::try_from(r.offset)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let len = r
            .limit
            .map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
        let part = &data[from..from + len.min(data.len() - from)];
        let mut b = Vec::new();
        for chunk in part.chunks(256 << 10) {
            put_data(&mut b, Kind::FileChunk, id, chunk);
        }
        put_message(
            &mut b,
            id,
            &FileDone {
                bytes: u64::try_from(part.len()).unwrap_or(u64::MAX),
            },
        );
        self.send(&b)
    }

    fn stat(&mut self, id: u32, r: &PathRequest) -> bool {
        let q = match quote(&r.path) {
            Ok(q) => q,
            Err(e) => return self.error(id, console_err(&e)),
        };
        let l = if r.nofollow { "" } else { "-L " };
        let script = format!("stat {l}-c '%f %s %Y %u %g %h %i' {q}");
        match self.op(&script, None, 4096) {
            Ok(ran) if ran.code == 0 => match parse_stat(&ran.output) {
                Some(s) => self.reply(id, &s),
                None => self.error(
                    id,
                    err_frame(
                        ErrorCode::Io,
                        libc::EIO,
                        "the guest's stat output is garbled",
                    ),
                ),
            },
            Ok(ran) => self.error(id, command_err(&ran)),
            Err(e) => self.error(id, console_err(&e)),
        }
    }
}

/// The `sh -c` script of an exec: its environment, directory and command.
pub fn exec_script(r: &ExecRequest) -> Result<String, ConsoleError> {
    let mut s = String::new();
    if r.clear_env {
        return Err(ConsoleError::Invalid(
            "clear_env is not available through a serial console".into(),
        ));
    }
    if r.user.is_some() {
        return Err(ConsoleError::Invalid(
            "a user is not available through a serial console".into(),
        ));
    }
    for (k, v) in &r.env {
        let name_ok = !k.is_empty()
            && !k[0].is_ascii_digit()
            && k.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
        if !name_ok {
            return Err(ConsoleError::Invalid(format!(
                "environment name {:?}: letters, digits and '_' through a serial console",
                String::from_utf8_lossy(k)
            )));
        }
        s.push_str(&format!(
            "export {}={}; ",
            String::from_utf8_lossy(k),
            quote(v)?
        ));
    }
    if let Some(c) = &r.cwd {
        s.push_str(&format!("cd {} || exit 1; ", quote(c)?));
    }
    match &r.command {
        Command::Shell(script) => {
            s.push_str(
                std::str::from_utf8(script)
                    .map_err(|_| ConsoleError::Invalid("the script is not UTF-8".into()))?,
            );
            if script.contains(&0) {
                return Err(ConsoleError::Invalid("a NUL byte cannot be sent".into()));
            }
        }
        Command::Argv(argv) => {
            s.push_str("exec");
            for a in argv {
                s.push(' ');
                s.push_str(&quote(a)?);
            }
        }
    }
    Ok(s)
}

/// Parses `stat -c '%f %s %Y %u %g %h %i'`.
fn parse_stat(out: &[u8]) -> Option<FileStat> {
    let text = std::str::from_utf8(out).ok()?;
    let f: Vec<&str> = text.split_whitespace().collect();
    if f.len() != 7 {
        return None;
    }
    let raw = u32::from_str_radix(f[0], 16).ok()?;
    let file_type = match raw & 0o170_000 {
        0o100_000 => FileType::File,
        0o040_000 => FileType::Dir,
        0o120_000 => FileType::Symlink,
        _ => FileType::Other,
    };
    let mtime: i64 = f[2].parse().ok()?;
    Some(FileStat {
        file_type,
        mode: raw & 0o7777,
        size: f[1].parse().ok()?,
        uid: f[3].parse().ok()?,
        gid: f[4].parse().ok()?,
        mtime_ns: mtime.checked_mul(1_000_000_000)?,
        nlink: f[5].parse().ok()?,
        ino: f[6].parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_output_is_parsed_and_checked() {
        let s = parse_stat(b"81a4 5 1700000000 0 0 1 42\n").unwrap();
        assert_eq!(
            (s.file_type, s.mode, s.size, s.ino),
            (FileType::File, 0o644, 5, 42)
        );
        assert_eq!(
            parse_stat(b"41ed 0 1 0 0 2 1").unwrap().file_type,
            FileType::Dir
        );
        assert!(parse_stat(b"81a4 5 x 0 0 1 42").is_none());
        assert!(parse_stat(b"81a4 5 1 0 0 1 42 extra").is_none());
    }

    #[test]
    fn exec_scripts_quote_what_they_pass() {
        let r = ExecRequest::argv(["echo", "it's"])
            .with_env("A_1", "x y")
            .with_cwd("/tmp");
        assert_eq!(
            exec_script(&r).unwrap(),
            r"export A_1='x y'; cd '/tmp' || exit 1; exec 'echo' 'it'\''s'"
        );
        let r = ExecRequest::shell("true").with_env("A;B", "x");
        assert!(exec_script(&r).is_err());
        assert!(exec_script(&ExecRequest::shell("a\0b")).is_err());
    }
}
