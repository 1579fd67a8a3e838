//! Shared test helpers: an agent running as a host process on a Unix
//! socket in a private temporary directory.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use agent_client::Client;
use agent_proto::{
    put_empty, put_message, ErrorCode, ErrorReply, Header, Hello, Kind, HEADER_LEN, HELLO_MAGIC,
    PROTOCOL_VERSION,
};
use std::os::unix::net::UnixStream;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        Self::new_in(&std::env::temp_dir(), tag)
    }

    /// Under `base` (e.g. outside /tmp, which a guest-mode agent covers
    /// with its own tmpfs).
    pub fn new_in(base: &Path, tag: &str) -> TempDir {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = base.join(format!("shoal-agent-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `shoal-agent --listen unix:...` process.
pub struct Agent {
    pub child: Child,
    pub sock: PathBuf,
    pub dir: TempDir,
}

impl Agent {
    pub fn start() -> Agent {
        Self::start_with(|c| c)
    }

    /// Starts the agent with `wrap` given the command line (e.g. strace).
    pub fn start_with(wrap: impl FnOnce(Vec<String>) -> Vec<String>) -> Agent {
        Self::start_in(TempDir::new("t"), wrap)
    }

    /// As `start_with`, with the socket in `dir`.
    pub fn start_in(dir: TempDir, wrap: impl FnOnce(Vec<String>) -> Vec<String>) -> Agent {
        let sock = dir.path().join("agent.sock");
        let argv = wrap(vec![
            env!("CARGO_BIN_EXE_shoal-agent").to_string(),
            "--listen".to_string(),
            format!("unix:{}", sock.display()),
        ]);
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .spawn()
            .expect("start shoal-agent");
        let agent = Agent { child, sock, dir };
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(&agent.sock).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "agent did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        agent
    }

    pub fn client(&self) -> Client {
        Client::connect_unix(&self.sock).expect("connect to agent")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Open fds of the agent process.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Deterministic pseudo-random bytes (xorshift64*), as a reader.
pub struct PseudoRandom {
    state: u64,
    left: u64,
}

impl PseudoRandom {
    pub fn new(seed: u64, len: u64) -> Self {
        PseudoRandom {
            state: seed | 1,
            left: len,
        }
    }
}

impl Read for PseudoRandom {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = usize::try_from(self.left).unwrap_or(usize::MAX);
        let n = buf.len().min(left) & !7;
        let n = if n == 0 { buf.len().min(left) } else { n };
        for chunk in buf[..n].chunks_mut(8) {
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            let v = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// A writer that only hashes and counts.
#[derive(Default)]
pub struct HashWriter {
    pub hasher: sha2::Sha256,
    pub bytes: u64,
}

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use sha2::Digest;
        self.hasher.update(buf);
        self.bytes += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl HashWriter {
    pub fn hex(self) -> String {
        use sha2::Digest;
        self.hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Whether a process is gone (or a zombie nobody reaped yet).
pub fn process_dead(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// The host path of our cgroup2 directory (the root of a cgroup namespace
/// that `unshare --cgroup` creates from here).
pub fn own_cgroup2_dir() -> Option<PathBuf> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = cg.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mi.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        post.starts_with("cgroup2 ")
            .then(|| pre.split(' ').nth(4).map(str::to_string))
            .flatten()
    })?;
    Some(PathBuf::from(mount).join(rel.trim_start_matches('/')))
}

/// Removes the `shoal-user` cgroup a guest-mode agent in a cgroup namespace
/// created under ours (best effort; it must be empty).
pub fn remove_user_cgroup() {
    let Some(dir) = own_cgroup2_dir() else {
        return;
    };
    let user = dir.join("shoal-user");
    if let Ok(rd) = std::fs::read_dir(&user) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(&user);
}

/// Reads one frame (blocking): `None` on a clean end of stream between
/// frames; panics on a stream that ends inside a frame or a length above
/// the protocol's limit.
pub fn read_frame(s: &mut impl Read) -> Option<(Header, Vec<u8>)> {
    let mut hdr = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match s.read(&mut hdr[got..]).expect("read a frame header") {
            0 if got == 0 => return None,
            0 => panic!("stream ended inside a frame header"),
            n => got += n,
        }
    }
    let h = Header::parse(&hdr);
    let len = h.checked_len().expect("frame length within the limit");
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).expect("read a frame payload");
    Some((h, payload))
}

/// Where a PID-1 agent listens, inside its own mount namespace: on the
/// fresh tmpfs it mounts over /tmp there, so the path exists whatever the
/// host's /tmp holds and wherever the checkout lives.
pub const PID1_SOCK: &str = "/tmp/shoal-agent.sock";

/// `unshare` arguments that make the agent PID 1 of new PID, mount, UTS and
/// cgroup namespaces (mounts private: nothing reaches the host).
pub const UNSHARE: [&str; 8] = [
    "unshare",
    "--pid",
    "--fork",
    "--mount",
    "--uts",
    "--cgroup",
    "--propagation",
    "private",
];

/// The direct children of `pid` (from /proc/*/stat).
fn children(pid: u32) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|st| {
                    let (_, rest) = st.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// The host pid of the `shoal-agent` process among the descendants of
/// `root` (itself included), if it has exec'd yet.
pub fn find_agent(root: u32) -> Option<u32> {
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        if comm.trim_end() == "shoal-agent" {
            return Some(p);
        }
        todo.extend(children(p));
    }
    None
}

/// A PID-1 agent in namespaces (see [`start_pid1`]); killed on drop.
pub struct Pid1Agent {
    /// `unshare` (or what `wrap` put in front of it).
    pub child: Child,
    /// The agent's socket as the host reaches it.
    pub sock: PathBuf,
}

impl Pid1Agent {
    pub fn client(&self) -> Client {
        Client::connect_unix(&self.sock).expect("connect to the PID-1 agent")
    }
}

impl Drop for Pid1Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent as PID 1 in namespaces (`wrap` may put e.g. strace in front
/// of `unshare`), listening on [`PID1_SOCK`] in its mount namespace. The
/// host reaches that socket through `/proc/<agent pid>/root`, the agent's
/// own view of the filesystem. Panics with the reason if the agent cannot
/// be started: these tests need root, `unshare` and namespaces.
pub fn start_pid1(wrap: impl FnOnce(Vec<String>) -> Vec<String>, stdout: Stdio) -> Pid1Agent {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    assert_eq!(
        uid, 0,
        "the PID-1 agent needs root (namespaces, mounts): run the tests as root"
    );
    assert!(
        own_cgroup2_dir().is_some(),
        "the PID-1 agent needs a cgroup2 hierarchy mounted on the host"
    );
    let mut argv: Vec<String> = UNSHARE.iter().map(|s| s.to_string()).collect();
    argv.extend([
        env!("CARGO_BIN_EXE_shoal-agent").to_string(),
        "--listen".to_string(),
        format!("unix:{PID1_SOCK}"),
    ]);
    let argv = wrap(argv);
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(stdout)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {:?} (install util-linux): {e}", argv[0]));
    let t0 = Instant::now();
    loop {
        if let Some(pid) = find_agent(child.id()) {
            let sock = PathBuf::from(format!("/proc/{pid}/root{PID1_SOCK}"));
            if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
                return Pid1Agent { child, sock };
            }
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("{argv:?} exited ({st}) before the agent listened: namespaces not permitted?");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the PID-1 agent did not listen on {PID1_SOCK} within 20 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A raw connection after a good Hello (for tests that write frames by hand).
pub fn raw_connect(agent: &Agent) -> UnixStream {
    let mut s = UnixStream::connect(&agent.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = Vec::new();
    let hello = Hello {
        magic: HELLO_MAGIC,
        version: PROTOCOL_VERSION,
        client: "raw".into(),
    };
    put_message(&mut b, 0, &hello);
    s.write_all(&b).unwrap();
    let (h, _) = read(&mut s).unwrap();
    assert_eq!(h.kind, Kind::HelloOk as u8);
    s
}

pub fn read(s: &mut UnixStream) -> Option<(Header, Vec<u8>)> {
    read_frame(s)
}

pub fn expect_error(s: &mut UnixStream, code: ErrorCode) -> ErrorReply {
    let (h, p) = read(s).expect("an error frame");
    assert_eq!(h.kind, Kind::Error as u8);
    let e: ErrorReply = agent_proto::decode(&p).unwrap();
    assert_eq!(e.code, code, "{e:?}");
    e
}

pub fn expect_usable(s: &mut UnixStream) {
    let mut b = Vec::new();
    put_empty(&mut b, Kind::Health, 99);
    s.write_all(&b).unwrap();
    let (h, _) = read(s).unwrap();
    assert_eq!((h.kind, h.id), (Kind::HealthOk as u8, 99));
}

pub fn expect_closed(s: &mut UnixStream) {
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}
