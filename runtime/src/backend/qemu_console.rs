//! A shell on a `vm` guest's serial console, for guests that do not run
//! Shoal's agent: commands are written to QEMU's console chardev socket
//! and their output and exit status read back between markers.
//!
//! The guest's console shell is made non-interactive and its terminal raw
//! ([`SETUP`]) once, when its template is built: no echo, no line editing,
//! no line-length limit, `\n` kept as is. Each call is one line:
//!
//! ```text
//! printf '%s-%s\n' NONCE b; [base64 -d <<'NONCE-in' |] timeout -s KILL T sh -c 'SCRIPT' [</dev/null] 2>&1; printf '%s-%s %d\n' NONCE e $?
//! ```
//!
//! with `SCRIPT` single-quoted (so that nothing in it can change the
//! console shell: a syntax error or `exit` ends the child `sh` only) and,
//! for stdin, the data as a base64 here-document. The markers are written
//! split (`NONCE' 'b`) so that even an echo of the command never contains
//! them, and `NONCE` is 96 fresh random bits per call: output that merely
//! looks like a marker (an earlier call's, a made-up one) is output.
//! Everything from the guest is bounded: the output kept ([`Ran::output`]
//! up to the caller's cap, the rest counted and dropped), the bytes
//! scanned for a marker, and the time (a deadline per call). Calls are
//! serialized per console. A call that passed its deadline leaves the
//! console busy: the next call first waits (within its own deadline) for
//! an answer to a probe, so that it never reads the end of an earlier
//! command as its own.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What the console's first (interactive) shell runs when the guest is up:
/// the mounts an agent would make, a raw terminal, and non-interactive
/// shells (stderr to /dev/null: ash is interactive only with a terminal on
/// stdin and stderr) reading commands from the console, one after another
/// (a non-interactive shell ends at a syntax error, which bytes lost at
/// the switch could make; PID 1 must not end).
pub const SETUP: &str = "mount -t proc proc /proc; mount -t sysfs sysfs /sys; \
    mount -t tmpfs -o mode=1777 tmpfs /tmp; mount -t tmpfs tmpfs /run; \
    busybox stty raw -echo; exec sh -c 'while :; do sh 2>/dev/null; done'";

/// QEMU's console chardev socket in a sandbox's QEMU directory (guests
/// without the agent; one per QEMU process).
pub const CONSOLE_SOCK: &str = "console.sock";

/// The `-chardev` of a console-shell guest's serial port: a socket the
/// host's [`Console`] connects to, logged to `log` (the console log) as
/// the file chardev of other guests is.
pub fn chardev(qdir: &Path, log: &Path) -> String {
    format!(
        "socket,id=console,path={},server=on,wait=off,logfile={},logappend=on",
        qdir.join(CONSOLE_SOCK).display(),
        log.display()
    )
}

/// The kernel command line of a console-shell guest: `agent_line` (the
/// agent guest's, `qemu::vm_cmdline`) with `/bin/sh` as init and
/// the kernel's own messages kept off the console (they would land in the
/// middle of command output).
pub fn cmdline(agent_line: &str) -> String {
    agent_line.replace("init=/sbin/shoal-agent", "loglevel=1 init=/bin/sh")
}

/// Waits (up to `timeout`, while `alive`) until the freshly booted guest's
/// console shell answers, then makes it the shell [`Console::run`] expects
/// ([`SETUP`]) and waits for that one to answer.
pub fn wait_shell(
    c: &Console,
    timeout: Duration,
    alive: &dyn Fn() -> bool,
) -> Result<(), ConsoleError> {
    let end = Instant::now() + timeout;
    let mut up = false;
    while Instant::now() < end {
        if !alive() {
            return Err(ConsoleError::Closed);
        }
        let left = end.saturating_duration_since(Instant::now());
        match c.probe(left.min(Duration::from_secs(2))) {
            Ok(true) if up => return Ok(()),
            Ok(true) => {
                c.send_raw(&format!("{SETUP}\n"))?;
                up = true;
            }
            Ok(false) => {}
            // QEMU has not made its socket yet, or dropped us.
            Err(ConsoleError::Io { .. } | ConsoleError::Closed) => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
    Err(ConsoleError::Timeout(timeout))
}

/// Longest script (or argv, quoted) a call takes.
pub const MAX_SCRIPT: usize = 64 << 10;
/// Most stdin a call takes (sent base64 over the console).
pub const MAX_STDIN: usize = 1 << 20;

/// Errors of the console.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// QEMU's console socket could not be reached or written.
    #[error("serial console {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// No answer (end marker) within the call's deadline.
    #[error("the guest's serial console did not answer within {0:?}")]
    Timeout(Duration),
    /// The guest closed the console.
    #[error("the guest's serial console closed")]
    Closed,
    /// The request cannot be sent over a console.
    #[error("{0}")]
    Invalid(String),
    /// The guest's answer is not what a shell prints.
    #[error("serial console: {0}")]
    Garbled(String),
}

/// A finished call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    /// Its stdout and stderr, interleaved as written, up to the cap.
    pub output: Vec<u8>,
    /// Output bytes over the cap (dropped).
    pub dropped: u64,
    /// `$?` of the command (128 + N: ended by signal N).
    pub code: i32,
    /// Killed by the guest-side `timeout` at its time limit.
    pub timed_out: bool,
}

/// A shell on a serial console (one QEMU's console chardev socket).
#[derive(Debug)]
pub struct Console {
    sock: PathBuf,
    conn: Mutex<Conn>,
}

#[derive(Debug, Default)]
struct Conn {
    stream: Option<UnixStream>,
    /// A call ended without its end marker: the shell may still be busy.
    dirty: bool,
}

/// Quotes `s` for `sh` (single quotes; `'` as `'\''`).
pub fn quote(s: &[u8]) -> Result<String, ConsoleError> {
    if s.contains(&0) {
        return Err(ConsoleError::Invalid("a NUL byte cannot be sent".into()));
    }
    let s = std::str::from_utf8(s)
        .map_err(|_| ConsoleError::Invalid("not UTF-8: the console takes text".into()))?;
    Ok(format!("'{}'", s.replace('\'', r"'\''")))
}

/// A fresh marker nonce: 96 random bits as hex.
fn nonce() -> String {
    format!("{}{}", crate::fresh::random_id(), crate::fresh::random_id())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Console {
    /// The console behind QEMU's chardev socket `sock` (connected on
    /// first use, and again after it drops).
    pub fn new(sock: &Path) -> Console {
        Console {
            sock: sock.to_path_buf(),
            conn: Mutex::new(Conn::default()),
        }
    }

    fn io(&self) -> impl FnOnce(std::io::Error) -> ConsoleError + '_ {
        |source| ConsoleError::Io {
            path: self.sock.clone(),
            source,
        }
    }

    /// Writes `line` to the console shell as it is (for the first,
    /// interactive shell: [`SETUP`]); no answer is read.
    pub fn send_raw(&self, line: &str) -> Result<(), ConsoleError> {
        let mut c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let s = self.stream(&mut c)?;
        s.write_all(line.as_bytes()).map_err(self.io())
    }

    /// Whether the shell answers a probe within `wait` (discarding what
    /// came before its answer).
    pub fn probe(&self, wait: Duration) -> Result<bool, ConsoleError> {
        let mut c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        match self.sync(&mut c, Instant::now() + wait) {
            Ok(()) => Ok(true),
            Err(ConsoleError::Timeout(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn stream<'a>(&self, c: &'a mut Conn) -> Result<&'a mut UnixStream, ConsoleError> {
        if c.stream.is_none() {
            let s = UnixStream::connect(&self.sock).map_err(self.io())?;
            s.set_write_timeout(Some(Duration::from_secs(10)))
                .map_err(self.io())?;
            c.stream = Some(s);
            // Whatever the shell was doing is unknown.
            c.dirty = true;
        }
        c.stream.as_mut().ok_or(ConsoleError::Closed)
    }

    /// Sends a probe and reads until its answer (the shell is idle and
    /// everything before is discarded).
    fn sync(&self, c: &mut Conn, end: Instant) -> Result<(), ConsoleError> {
        let n = nonce();
        let line = format!("printf '%s-%s\\n' {n} ok\n");
        self.stream(c)?
            .write_all(line.as_bytes())
            .map_err(self.io())?;
        let want = format!("{n}-ok");
        let mut scan = Scan::new(want.as_bytes(), 0);
        self.read_until(c, end, &mut scan)?;
        c.dirty = false;
        Ok(())
    }

    fn read_until(&self, c: &mut Conn, end: Instant, scan: &mut Scan) -> Result<(), ConsoleError> {
        let mut buf = [0u8; 8192];
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ConsoleError::Timeout(scan.started.elapsed()));
            }
            let s = self.stream(c)?;
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(self.io())?;
            let n = match s.read(&mut buf) {
                Ok(0) => {
                    c.stream = None;
                    return Err(ConsoleError::Closed);
                }
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    c.stream = None;
                    return Err(self.io()(e));
                }
            };
            if scan.push(&buf[..n]) {
                return Ok(());
            }
        }
    }

    /// Runs `script` (a `sh -c` script) in the guest with `stdin` (else
    /// /dev/null), killed there after `limit`; waits at most `deadline`
    /// for its end and keeps at most `cap` bytes of its output.
    pub fn run(
        &self,
        script: &str,
        stdin: Option<&[u8]>,
        limit: Duration,
        deadline: Duration,
        cap: usize,
    ) -> Result<Ran, ConsoleError> {
        if script.len() > MAX_SCRIPT {
            return Err(ConsoleError::Invalid(format!(
                "a script of {} bytes: the console takes at most {MAX_SCRIPT}",
                script.len()
            )));
        }
        if stdin.is_some_and(|s| s.len() > MAX_STDIN) {
            return Err(ConsoleError::Invalid(format!(
                "stdin over {MAX_STDIN} bytes: the console takes at most that"
            )));
        }
        let q = quote(script.as_bytes())?;
        let secs = limit.as_secs().clamp(1, 86_400);
        let n = nonce();
        let mut line = format!("printf '%s-%s\\n' {n} b; ");
        let input = match stdin {
            Some(data) => {
                use base64::Engine;
                line.push_str(&format!("busybox base64 -d <<'{n}-in' | "));
                let b64 = base64::engine::general_purpose::STANDARD.encode(data);
                let mut body = String::with_capacity(b64.len() + b64.len() / 76 + 32);
                for chunk in b64.as_bytes().chunks(76) {
                    body.push_str(std::str::from_utf8(chunk).unwrap_or_default());
                    body.push('\n');
                }
                body.push_str(&format!("{n}-in\n"));
                Some(body)
            }
            None => None,
        };
        line.push_str(&format!("timeout -s KILL {secs} sh -c {q}"));
        if input.is_none() {
            line.push_str(" </dev/null");
        }
        line.push_str(&format!(" 2>&1; printf '%s-%s %d\\n' {n} e $?\n"));
        if let Some(body) = input {
            line.push_str(&body);
        }

        let t0 = Instant::now();
        let end = t0 + deadline;
        let mut c = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        self.stream(&mut c)?;
        if c.dirty {
            // An earlier command may still hold the shell: wait for it.
            self.sync(&mut c, end)?;
        }
        // From here on, until the end marker, the shell is ours.
        c.dirty = true;
        self.stream(&mut c)?
            .write_all(line.as_bytes())
            .map_err(self.io())?;
        let begin = format!("{n}-b\n");
        let mut scan = Scan::new(begin.as_bytes(), 0);
        self.read_until(&mut c, end, &mut scan)?;
        let ending = format!("{n}-e ");
        let mut out = Scan::new(ending.as_bytes(), cap);
        out.buf = std::mem::take(&mut scan.rest);
        if !out.check() {
            self.read_until(&mut c, end, &mut out)?;
        }
        // The code and its newline follow the end marker.
        let mut code = Scan::new(b"\n", 16);
        code.buf = std::mem::take(&mut out.rest);
        if !code.check() {
            self.read_until(&mut c, end, &mut code)?;
        }
        c.dirty = false;
        let text = String::from_utf8_lossy(&code.kept);
        let code: i32 = text
            .trim()
            .parse()
            .ok()
            .filter(|c| (0..=255).contains(c) && code.dropped == 0)
            .ok_or_else(|| ConsoleError::Garbled(format!("exit status {text:?}")))?;
        Ok(Ran {
            output: out.kept,
            dropped: out.dropped,
            code,
            timed_out: code == 137 && t0.elapsed() >= limit,
        })
    }
}

/// Reads up to a marker: what came before it is kept (up to `cap`; the
/// rest counted), what came after is `rest`. Bounded: only the marker's
/// length is held beyond `cap`.
struct Scan {
    marker: Vec<u8>,
    cap: usize,
    /// Not yet decided (could be the start of the marker).
    buf: Vec<u8>,
    kept: Vec<u8>,
    dropped: u64,
    rest: Vec<u8>,
    started: Instant,
}

impl Scan {
    fn new(marker: &[u8], cap: usize) -> Scan {
        Scan {
            marker: marker.to_vec(),
            cap,
            buf: vec![],
            kept: vec![],
            dropped: 0,
            rest: vec![],
            started: Instant::now(),
        }
    }

    fn keep(&mut self, b: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len()).min(b.len());
        self.kept.extend_from_slice(&b[..room]);
        self.dropped += u64::try_from(b.len() - room).unwrap_or(u64::MAX);
    }

    /// Adds `b`; whether the marker was found.
    fn push(&mut self, b: &[u8]) -> bool {
        self.buf.extend_from_slice(b);
        self.check()
    }

    fn check(&mut self) -> bool {
        if let Some(i) = find(&self.buf, &self.marker) {
            let buf = std::mem::take(&mut self.buf);
            self.keep(&buf[..i]);
            self.rest = buf[i + self.marker.len()..].to_vec();
            return true;
        }
        // All but a possible marker prefix at the end is decided.
        let hold = self.marker.len().saturating_sub(1).min(self.buf.len());
        let cut = self.buf.len() - hold;
        let decided: Vec<u8> = self.buf.drain(..cut).collect();
        self.keep(&decided);
        false
    }
}

#[cfg(test)]
#[path = "qemu_console_tests.rs"]
mod tests;
