//! The control messages, one struct or enum per payload.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use crate::codec::{DecodeError, Message, Reader, Wire};
use crate::frame::{begin_frame, end_frame, Kind};
use crate::{HELLO_MAGIC, PROTOCOL_VERSION};

/// First frame of every connection (client to agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Always [`HELLO_MAGIC`].
    pub magic: [u8; 4],
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u16,
    /// Free-form client name, for logs.
    pub client: String,
}
message!(
    Hello = Hello {
        magic,
        version,
        client
    }
);

impl Hello {
    /// The Hello of this build's protocol, with `client` as the name.
    pub fn new(client: impl Into<String>) -> Hello {
        Hello {
            magic: HELLO_MAGIC,
            version: PROTOCOL_VERSION,
            client: client.into(),
        }
    }
}

/// How the agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentMode {
    /// An ordinary process on the host (`--listen`): no mounts, no cgroups,
    /// no clock setting.
    Host,
    /// PID 1 of a guest.
    Guest,
}

impl Wire for AgentMode {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Vec<u8>) {
        w.push(match self {
            AgentMode::Host => 0,
            AgentMode::Guest => 1,
        });
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(AgentMode::Host),
            1 => Ok(AgentMode::Guest),
            tag => Err(DecodeError::InvalidTag { what: "mode", tag }),
        }
    }
}

/// Accepted handshake (agent to client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloOk {
    /// The agent's [`PROTOCOL_VERSION`] (equal to the client's).
    pub version: u16,
    /// The agent's crate version.
    pub agent: String,
    /// How the agent runs.
    pub mode: AgentMode,
}
message!(
    HelloOk = HelloOk {
        version,
        agent,
        mode
    }
);

/// Error codes of [`ErrorReply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// A frame whose payload could not be decoded.
    BadPayload,
    /// A frame kind the agent does not know or does not accept.
    UnknownKind,
    /// A frame larger than [`MAX_PAYLOAD`](crate::MAX_PAYLOAD); the connection is closed.
    TooLarge,
    /// The protocol versions differ; the connection is closed.
    VersionMismatch,
    /// The first frame was not a valid [`Hello`]; the connection is closed.
    HandshakeRequired,
    /// A system call failed; `errno` says why.
    Io,
    /// No exec with that id (never existed, finished and collected, or
    /// dropped).
    NoSuchExec,
    /// A limit was reached (connections, execs, streams).
    Busy,
    /// A request field is invalid (e.g. a NUL byte in a path).
    InvalidArgument,
    /// The command could not be started; `errno` says why.
    SpawnFailed,
    /// Another connection attached to this exec.
    Detached,
    /// A request id already in use for a stream on this connection.
    IdInUse,
    /// A code this build does not know.
    Other(u16),
}

impl ErrorCode {
    /// The code's number on the wire.
    pub fn to_u16(self) -> u16 {
        match self {
            ErrorCode::BadPayload => 1,
            ErrorCode::UnknownKind => 2,
            ErrorCode::TooLarge => 3,
            ErrorCode::VersionMismatch => 4,
            ErrorCode::HandshakeRequired => 5,
            ErrorCode::Io => 6,
            ErrorCode::NoSuchExec => 7,
            ErrorCode::Busy => 8,
            ErrorCode::InvalidArgument => 9,
            ErrorCode::SpawnFailed => 10,
            ErrorCode::Detached => 11,
            ErrorCode::IdInUse => 12,
            ErrorCode::Other(n) => n,
        }
    }

    /// The code for a number on the wire.
    pub fn from_u16(n: u16) -> ErrorCode {
        match n {
            1 => ErrorCode::BadPayload,
            2 => ErrorCode::UnknownKind,
            3 => ErrorCode::TooLarge,
            4 => ErrorCode::VersionMismatch,
            5 => ErrorCode::HandshakeRequired,
            6 => ErrorCode::Io,
            7 => ErrorCode::NoSuchExec,
            8 => ErrorCode::Busy,
            9 => ErrorCode::InvalidArgument,
            10 => ErrorCode::SpawnFailed,
            11 => ErrorCode::Detached,
            12 => ErrorCode::IdInUse,
            n => ErrorCode::Other(n),
        }
    }
}

impl Wire for ErrorCode {
    const MIN_LEN: usize = 2;
    fn put(&self, w: &mut Vec<u8>) {
        self.to_u16().put(w);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(ErrorCode::from_u16(u16::get(r)?))
    }
}

/// A failed request or a refused frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    /// What went wrong.
    pub code: ErrorCode,
    /// The Linux errno for `Io`/`SpawnFailed` (0 otherwise).
    pub errno: i32,
    /// Human-readable detail.
    pub message: String,
}
message!(
    ErrorReply = Error {
        code,
        errno,
        message
    }
);

/// Answer to [`Kind::Health`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReply {
    /// Execs whose command is still running.
    pub running_execs: u32,
    /// Execs known to the agent (running or holding output for re-attach).
    pub execs: u32,
    /// Open client connections.
    pub connections: u32,
    /// How the agent runs.
    pub mode: AgentMode,
}
message!(
    HealthReply = HealthOk {
        running_execs,
        execs,
        connections,
        mode
    }
);

/// Answer to [`Kind::Version`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionReply {
    /// [`PROTOCOL_VERSION`] of the agent.
    pub protocol: u16,
    /// The agent's crate version.
    pub agent: String,
    /// How the agent runs.
    pub mode: AgentMode,
}
message!(
    VersionReply = VersionOk {
        protocol,
        agent,
        mode
    }
);

/// Sent after a snapshot restore so clones differ (client to agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostRestore {
    /// Fresh random bytes from the host, credited to the guest RNG.
    pub entropy: [u8; 64],
    /// Wall-clock time to set, in ns since the Unix epoch (0: leave it).
    pub unix_time_ns: u64,
}
message!(
    PostRestore = PostRestore {
        entropy,
        unix_time_ns
    }
);

/// What [`PostRestore`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostRestoreReply {
    /// The entropy was added and credited (RNDADDENTROPY); false if it was
    /// only mixed in (host mode or no privilege).
    pub entropy_credited: bool,
    /// CLOCK_REALTIME was set (never in host mode).
    pub clock_set: bool,
}
message!(
    PostRestoreReply = PostRestoreOk {
        entropy_credited,
        clock_set
    }
);

/// What [`PowerRequest`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerAction {
    /// Sync and power off (host mode: the agent exits).
    Poweroff,
    /// Sync and reboot (host mode: the agent exits).
    Reboot,
}

impl Wire for PowerAction {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Vec<u8>) {
        w.push(match self {
            PowerAction::Poweroff => 0,
            PowerAction::Reboot => 1,
        });
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(PowerAction::Poweroff),
            1 => Ok(PowerAction::Reboot),
            tag => Err(DecodeError::InvalidTag { what: "power", tag }),
        }
    }
}

/// Power off or reboot the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowerRequest {
    /// Which.
    pub action: PowerAction,
}
message!(PowerRequest = Power { action });

/// The program an exec runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// argv\[0\] is looked up in PATH if it has no `/`.
    Argv(Vec<Vec<u8>>),
    /// Run by `/bin/sh -c`.
    Shell(Vec<u8>),
}

impl Wire for Command {
    const MIN_LEN: usize = 5;
    fn put(&self, w: &mut Vec<u8>) {
        match self {
            Command::Argv(a) => {
                w.push(0);
                a.put(w);
            }
            Command::Shell(s) => {
                w.push(1);
                s.put(w);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(Command::Argv(Wire::get(r)?)),
            1 => Ok(Command::Shell(Wire::get(r)?)),
            tag => Err(DecodeError::InvalidTag {
                what: "command",
                tag,
            }),
        }
    }
}

/// Starts a command on a new pseudo-terminal of `cols` x `rows` (an
/// agent older than this message answers `UnknownKind`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtyExec {
    /// The command (its `stdin` flag is ignored: a terminal always has
    /// input).
    pub exec: ExecRequest,
    /// Terminal columns.
    pub cols: u16,
    /// Terminal rows.
    pub rows: u16,
}
message!(PtyExec = PtyExec { exec, cols, rows });

/// Sets the terminal size of PTY exec `exec_id` (its foreground process
/// group gets SIGWINCH).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtyResize {
    /// The exec.
    pub exec_id: u64,
    /// Terminal columns.
    pub cols: u16,
    /// Terminal rows.
    pub rows: u16,
}
message!(
    PtyResize = PtyResize {
        exec_id,
        cols,
        rows
    }
);

/// User and group to run a command as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct User {
    /// User id.
    pub uid: u32,
    /// Group id (supplementary groups are cleared).
    pub gid: u32,
}
wire_struct!(User { uid, gid });

/// Starts a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// What to run.
    pub command: Command,
    /// Variables set for the command (`NAME`, `value`), over the agent's
    /// base environment unless `clear_env`.
    pub env: Vec<(Vec<u8>, Vec<u8>)>,
    /// Start from an empty environment.
    pub clear_env: bool,
    /// Working directory (default: the agent's, `/` in the guest).
    pub cwd: Option<Vec<u8>>,
    /// Run as this user (default: the agent's user, root in the guest).
    pub user: Option<User>,
    /// Give the command a stdin pipe fed by `Stdin` frames; otherwise its
    /// stdin is /dev/null.
    pub stdin: bool,
    /// Kill the command's whole process tree after this many ms (0: never).
    pub timeout_ms: u64,
}
message!(
    ExecRequest = Exec {
        command,
        env,
        clear_env,
        cwd,
        user,
        stdin,
        timeout_ms
    }
);

impl ExecRequest {
    /// Runs `argv` (argv\[0\] looked up in PATH), stdin from /dev/null.
    pub fn argv<I, S>(argv: I) -> ExecRequest
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        Self::new(Command::Argv(
            argv.into_iter().map(|s| s.as_ref().to_vec()).collect(),
        ))
    }

    /// Runs `/bin/sh -c script`, stdin from /dev/null.
    pub fn shell(script: impl AsRef<[u8]>) -> ExecRequest {
        Self::new(Command::Shell(script.as_ref().to_vec()))
    }

    fn new(command: Command) -> ExecRequest {
        ExecRequest {
            command,
            env: Vec::new(),
            clear_env: false,
            cwd: None,
            user: None,
            stdin: false,
            timeout_ms: 0,
        }
    }

    /// Gives the command a stdin pipe (fed by `Stdin` frames).
    pub fn with_stdin(mut self) -> Self {
        self.stdin = true;
        self
    }

    /// Kills the process tree after `t` (at least 1 ms; saturates).
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout_ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1);
        self
    }

    /// The timeout asked for, if any.
    pub fn timeout(&self) -> Option<Duration> {
        (self.timeout_ms > 0).then(|| Duration::from_millis(self.timeout_ms))
    }

    /// Sets an environment variable.
    pub fn with_env(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        self.env
            .push((name.as_ref().to_vec(), value.as_ref().to_vec()));
        self
    }

    /// Sets the working directory.
    pub fn with_cwd(mut self, dir: impl AsRef<Path>) -> Self {
        self.cwd = Some(dir.as_ref().as_os_str().as_bytes().to_vec());
        self
    }

    /// Runs as `uid`/`gid`.
    pub fn with_user(mut self, uid: u32, gid: u32) -> Self {
        self.user = Some(User { uid, gid });
        self
    }
}

/// The exec is running (answer to `Exec` and `Attach`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecStarted {
    /// Agent-wide exec id, for `Attach` and `Signal` from any connection.
    pub exec_id: u64,
    /// Process id of the command (also its process group and session id).
    pub pid: i32,
}
message!(ExecStarted = ExecStarted { exec_id, pid });

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Exited(i32),
    /// It was killed by this signal.
    Signaled(i32),
}

impl Wire for ExitStatus {
    const MIN_LEN: usize = 5;
    fn put(&self, w: &mut Vec<u8>) {
        match self {
            ExitStatus::Exited(c) => {
                w.push(0);
                c.put(w);
            }
            ExitStatus::Signaled(s) => {
                w.push(1);
                s.put(w);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(ExitStatus::Exited(i32::get(r)?)),
            1 => Ok(ExitStatus::Signaled(i32::get(r)?)),
            tag => Err(DecodeError::InvalidTag {
                what: "exit status",
                tag,
            }),
        }
    }
}

/// Last frame of an exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecResult {
    /// Exit code or signal.
    pub status: ExitStatus,
    /// The timeout fired and the process tree was killed.
    pub timed_out: bool,
    /// Output bytes dropped while no client was attached (the agent keeps
    /// the last [`DETACHED_OUTPUT_LIMIT`](crate::DETACHED_OUTPUT_LIMIT) bytes).
    pub dropped_bytes: u64,
}
message!(
    ExecResult = ExecExit {
        status,
        timed_out,
        dropped_bytes
    }
);

impl ExecResult {
    /// The exit code, if the command exited.
    pub fn exit_code(&self) -> Option<i32> {
        match self.status {
            ExitStatus::Exited(c) => Some(c),
            ExitStatus::Signaled(_) => None,
        }
    }

    /// The signal, if the command was killed by one.
    pub fn signal(&self) -> Option<i32> {
        match self.status {
            ExitStatus::Exited(_) => None,
            ExitStatus::Signaled(s) => Some(s),
        }
    }

    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.status == ExitStatus::Exited(0)
    }
}

/// Sends a signal to a running exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalRequest {
    /// Which exec.
    pub exec_id: u64,
    /// Signal number.
    pub signal: i32,
    /// To the whole process group, not only the command's process.
    pub group: bool,
}
message!(
    SignalRequest = Signal {
        exec_id,
        signal,
        group
    }
);

/// Re-attaches to an exec (e.g. after losing the connection that started
/// it): the output buffered since is sent, then live output and the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRequest {
    /// Which exec.
    pub exec_id: u64,
}
message!(AttachRequest = Attach { exec_id });

/// Opens a file for a streamed upload (`FileData`... then `FileEnd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileWrite {
    /// Absolute path (or relative to the agent's cwd).
    pub path: Vec<u8>,
    /// Permission bits for the file (applied even if it existed).
    pub mode: u32,
    /// Append instead of truncating.
    pub append: bool,
    /// Create missing parent directories (mode 0755).
    pub create_parents: bool,
}
message!(
    FileWrite = FileWrite {
        path,
        mode,
        append,
        create_parents
    }
);

/// End of a read or an upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDone {
    /// Bytes transferred.
    pub bytes: u64,
}
message!(FileDone = FileDone { bytes });

/// Streams a file back (`FileChunk`... then `FileDone`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRead {
    /// The file.
    pub path: Vec<u8>,
    /// Start offset.
    pub offset: u64,
    /// Most bytes to send (None: to the end).
    pub limit: Option<u64>,
}
message!(
    FileRead = FileRead {
        path,
        offset,
        limit
    }
);

/// A request naming one path (`Stat` follows symlinks unless `nofollow`;
/// `ListDir` ignores it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRequest {
    /// The path.
    pub path: Vec<u8>,
    /// Do not follow a final symlink.
    pub nofollow: bool,
}
wire_struct!(PathRequest { path, nofollow });

/// File types in [`FileStat`] and [`DirEntry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FileType {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Anything else (device, fifo, socket) or unknown.
    Other,
}

impl Wire for FileType {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Vec<u8>) {
        w.push(match self {
            FileType::File => 0,
            FileType::Dir => 1,
            FileType::Symlink => 2,
            FileType::Other => 3,
        });
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(FileType::File),
            1 => Ok(FileType::Dir),
            2 => Ok(FileType::Symlink),
            3 => Ok(FileType::Other),
            tag => Err(DecodeError::InvalidTag {
                what: "file type",
                tag,
            }),
        }
    }
}

/// Metadata of one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStat {
    /// Type.
    pub file_type: FileType,
    /// Permission bits (st_mode & 0o7777).
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
    /// Hard links.
    pub nlink: u64,
    /// Inode number.
    pub ino: u64,
}
message!(
    FileStat = StatOk {
        file_type,
        mode,
        size,
        uid,
        gid,
        mtime_ns,
        nlink,
        ino
    }
);

/// One directory entry (from getdents: no extra stat per entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// File name (bytes; not UTF-8 necessarily).
    pub name: Vec<u8>,
    /// Type as the directory reports it.
    pub file_type: FileType,
    /// Inode number.
    pub ino: u64,
}
wire_struct!(DirEntry {
    name,
    file_type,
    ino
});

/// Part of a directory listing; the last part has `last` set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntries {
    /// Entries (without `.` and `..`).
    pub entries: Vec<DirEntry>,
    /// No more parts follow.
    pub last: bool,
}
message!(DirEntries = DirEntries { entries, last });

/// Creates a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MkdirRequest {
    /// The directory.
    pub path: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
    /// Create missing parents, and succeed if it already exists (`mkdir -p`).
    pub parents: bool,
}
message!(
    MkdirRequest = Mkdir {
        path,
        mode,
        parents
    }
);

/// Removes a file or directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoveRequest {
    /// What to remove (a symlink is removed, not followed).
    pub path: Vec<u8>,
    /// Remove a directory with everything in it.
    pub recursive: bool,
}
message!(RemoveRequest = Remove { path, recursive });

/// Renames (moves) a path, replacing the target like rename(2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenameRequest {
    /// Old path.
    pub from: Vec<u8>,
    /// New path.
    pub to: Vec<u8>,
}
message!(RenameRequest = Rename { from, to });

/// Changes permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChmodRequest {
    /// The path (symlinks followed).
    pub path: Vec<u8>,
    /// New permission bits.
    pub mode: u32,
}
message!(ChmodRequest = Chmod { path, mode });

/// Marker for request structs carried by more than one kind.
impl PathRequest {
    /// Encodes as a `Stat` or `ListDir` frame.
    pub fn put_as(&self, out: &mut Vec<u8>, kind: Kind, id: u32) {
        let at = begin_frame(out, kind, id);
        self.put(out);
        end_frame(out, at);
    }
}
