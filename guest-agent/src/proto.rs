//! The Shoal agent wire protocol, version [`PROTOCOL_VERSION`].
//!
//! This module is the single definition of the protocol: the agent
//! (`shoal-agent`) and the host client ([`crate::client`]) both encode and
//! decode through it. `guest-agent/PROTOCOL.md` describes the same format
//! for readers who do not read Rust.
//!
//! # Frames
//! Everything on the stream is a frame: a 9-byte header then `len` bytes of
//! payload.
//!
//! | offset | size | field                                   |
//! |--------|------|-----------------------------------------|
//! | 0      | 4    | `len`: payload length, u32 little-endian |
//! | 4      | 1    | `kind`: [`Kind`]                         |
//! | 5      | 4    | `id`: request id, u32 little-endian      |
//!
//! `len` may not exceed [`MAX_PAYLOAD`] (1 MiB); a reader rejects a larger
//! one before reading the payload. The request id is chosen by the client,
//! must be unique among its requests in flight on that connection, and every
//! frame belonging to that request (replies, streamed output, stdin, file
//! chunks) carries it, so any number of calls share one connection. Id 0 is
//! reserved for messages that belong to no request.
//!
//! # Payloads
//! Data frames ([`Kind::Stdin`], [`Kind::Stdout`], [`Kind::Stderr`],
//! [`Kind::FileData`], [`Kind::FileChunk`]) carry raw bytes: bulk data is
//! never re-encoded. Control frames carry one message struct encoded with
//! the small codec below ([`Wire`]).
//!
//! The codec is hand-written rather than serde + postcard/bincode: the
//! format is then fixed by this file alone (no codec-crate version can change
//! it), it is simple enough to write down byte for byte in PROTOCOL.md,
//! every length read from the wire is checked against the bytes actually
//! present before anything is allocated, and the static musl agent carries
//! no extra crates. Rules: integers are fixed-width little-endian; `bool` is
//! one byte, 0 or 1 (anything else is an error); byte strings and strings
//! are a u32 length then the bytes (strings must be UTF-8); `Option<T>` is a
//! tag byte 0 (None) or 1 followed by `T`; a list is a u32 count then the
//! items; structs are their fields in declaration order; enums a tag byte
//! then the variant's fields. A message must use its payload exactly:
//! trailing bytes are an error.
//!
//! # Versioning
//! The first frame on a connection must be [`Hello`] from the client; the
//! agent answers [`HelloOk`] or, if the versions differ, an [`ErrorReply`]
//! with [`ErrorCode::VersionMismatch`] and closes the connection. The header
//! layout and the first two fields of `Hello` (magic and version) never
//! change; any other incompatible change bumps [`PROTOCOL_VERSION`].

use thiserror::Error;

/// Protocol version spoken by this build (client and agent).
pub const PROTOCOL_VERSION: u16 = 1;
/// First bytes of a [`Hello`] payload.
pub const HELLO_MAGIC: [u8; 4] = *b"SHOL";
/// Size of a frame header.
pub const HEADER_LEN: usize = 9;
/// Largest payload a frame may carry (1 MiB).
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Vsock port the agent listens on inside the guest.
pub const VSOCK_PORT: u32 = 5000;
/// Most bytes of output the agent keeps for an exec nobody is attached to.
pub const DETACHED_OUTPUT_LIMIT: usize = 1 << 20;

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Payload length in bytes.
    pub len: u32,
    /// Raw kind byte (see [`Kind`]).
    pub kind: u8,
    /// Request id.
    pub id: u32,
}

impl Header {
    /// Parses a header; does not validate `len` or `kind`.
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        let [l0, l1, l2, l3, kind, i0, i1, i2, i3] = *b;
        Header {
            len: u32::from_le_bytes([l0, l1, l2, l3]),
            kind,
            id: u32::from_le_bytes([i0, i1, i2, i3]),
        }
    }

    /// Parses the header at the start of `buf`, if it holds one.
    pub fn parse_prefix(buf: &[u8]) -> Option<Header> {
        let b: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Header::parse(b))
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let l = self.len.to_le_bytes();
        let i = self.id.to_le_bytes();
        [l[0], l[1], l[2], l[3], self.kind, i[0], i[1], i[2], i[3]]
    }

    /// Payload length as usize, or an error if it exceeds [`MAX_PAYLOAD`].
    pub fn checked_len(&self) -> Result<usize, FrameError> {
        let len = usize::try_from(self.len).unwrap_or(usize::MAX);
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLarge(self.len));
        }
        Ok(len)
    }
}

/// Frame kinds. Client-to-agent kinds are below 0x80, agent-to-client kinds
/// 0x80 and above.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// [`Hello`]: first frame of a connection.
    Hello = 0x01,
    /// Empty payload; answered by [`HealthReply`].
    Health = 0x02,
    /// Empty payload; answered by [`VersionReply`].
    Version = 0x03,
    /// [`PostRestore`]; answered by [`PostRestoreReply`].
    PostRestore = 0x04,
    /// [`PowerRequest`]; answered by `Ok`, then the guest goes down.
    Power = 0x05,
    /// [`ExecRequest`]; answered by [`ExecStarted`], output, [`ExecResult`].
    Exec = 0x10,
    /// Raw bytes for the stdin of the exec started (or attached) by `id`.
    Stdin = 0x11,
    /// Empty payload: close that exec's stdin.
    StdinClose = 0x12,
    /// [`SignalRequest`]; answered by `Ok`.
    Signal = 0x13,
    /// [`AttachRequest`]; answered like `Exec`, from the buffered output on.
    Attach = 0x14,
    /// [`FileWrite`]: opens a file for a streamed upload.
    FileWrite = 0x20,
    /// Raw bytes appended to the upload `id`.
    FileData = 0x21,
    /// Empty payload: end of upload `id`; answered by [`FileDone`].
    FileEnd = 0x22,
    /// [`FileRead`]: answered by `FileChunk` frames then [`FileDone`].
    FileRead = 0x23,
    /// [`PathRequest`]; answered by [`FileStat`].
    Stat = 0x24,
    /// [`PathRequest`]; answered by one or more [`DirEntries`].
    ListDir = 0x25,
    /// [`MkdirRequest`]; answered by `Ok`.
    Mkdir = 0x26,
    /// [`RemoveRequest`]; answered by `Ok`.
    Remove = 0x27,
    /// [`RenameRequest`]; answered by `Ok`.
    Rename = 0x28,
    /// [`ChmodRequest`]; answered by `Ok`.
    Chmod = 0x29,

    /// [`HelloOk`].
    HelloOk = 0x81,
    /// Empty payload: the request succeeded.
    Ok = 0x82,
    /// [`ErrorReply`]: the request failed (or the frame was refused).
    Error = 0x83,
    /// [`HealthReply`].
    HealthOk = 0x84,
    /// [`VersionReply`].
    VersionOk = 0x85,
    /// [`PostRestoreReply`].
    PostRestoreOk = 0x86,
    /// [`ExecStarted`].
    ExecStarted = 0x90,
    /// Raw bytes the command wrote to stdout.
    Stdout = 0x91,
    /// Raw bytes the command wrote to stderr.
    Stderr = 0x92,
    /// [`ExecResult`]: last frame of an exec.
    ExecExit = 0x93,
    /// Raw bytes of a file being read.
    FileChunk = 0xA1,
    /// [`FileDone`]: end of a read or upload.
    FileDone = 0xA2,
    /// [`FileStat`].
    StatOk = 0xA3,
    /// [`DirEntries`].
    DirEntries = 0xA4,
}

impl Kind {
    /// Every kind, for lookups.
    pub const ALL: [Kind; 34] = [
        Kind::Hello,
        Kind::Health,
        Kind::Version,
        Kind::PostRestore,
        Kind::Power,
        Kind::Exec,
        Kind::Stdin,
        Kind::StdinClose,
        Kind::Signal,
        Kind::Attach,
        Kind::FileWrite,
        Kind::FileData,
        Kind::FileEnd,
        Kind::FileRead,
        Kind::Stat,
        Kind::ListDir,
        Kind::Mkdir,
        Kind::Remove,
        Kind::Rename,
        Kind::Chmod,
        Kind::HelloOk,
        Kind::Ok,
        Kind::Error,
        Kind::HealthOk,
        Kind::VersionOk,
        Kind::PostRestoreOk,
        Kind::ExecStarted,
        Kind::Stdout,
        Kind::Stderr,
        Kind::ExecExit,
        Kind::FileChunk,
        Kind::FileDone,
        Kind::StatOk,
        Kind::DirEntries,
    ];

    /// The kind for a raw byte, if known.
    pub fn from_u8(b: u8) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| *k as u8 == b)
    }
}

/// Errors reading or decoding frames.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    /// The header announces a payload above [`MAX_PAYLOAD`].
    #[error("frame payload of {0} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    TooLarge(u32),
    /// The kind byte is not a known [`Kind`].
    #[error("unknown frame kind {0:#04x}")]
    UnknownKind(u8),
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame")]
    Truncated,
}

/// Errors decoding a control message.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The payload ended before the message did.
    #[error("payload truncated: needed {needed} more bytes, {left} left")]
    Truncated {
        /// Bytes the next field needed.
        needed: usize,
        /// Bytes that were left.
        left: usize,
    },
    /// The message ended before the payload did.
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// A bool byte other than 0 or 1.
    #[error("invalid bool byte {0}")]
    InvalidBool(u8),
    /// An enum or option tag that is not defined.
    #[error("invalid {what} tag {tag}")]
    InvalidTag {
        /// Which type.
        what: &'static str,
        /// The tag found.
        tag: u8,
    },
    /// A string that is not UTF-8.
    #[error("string is not UTF-8")]
    InvalidUtf8,
}

/// A cursor over a payload being decoded.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// Bytes not consumed yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Takes the next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated {
                needed: n,
                left: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// Takes exactly `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// Errors if bytes are left.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.buf.len()))
        }
    }

    /// Reads a u32 length prefix and checks that at least `len * min_item`
    /// bytes follow, so a bogus length cannot make us allocate.
    fn len_prefix(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let n = u32::get(self)?;
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let need = n.saturating_mul(min_item.max(1));
        if need > self.buf.len() {
            return Err(DecodeError::Truncated {
                needed: need,
                left: self.buf.len(),
            });
        }
        Ok(n)
    }
}

/// A value with a wire encoding (see the module docs for the rules).
pub trait Wire: Sized {
    /// Smallest encoded size, used to bound list allocations.
    const MIN_LEN: usize;
    /// Appends the encoding of `self`.
    fn put(&self, w: &mut Vec<u8>);
    /// Decodes one value.
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError>;

    /// Appends a slice of values (without the count). Overridden for bytes.
    fn put_slice(items: &[Self], w: &mut Vec<u8>) {
        for i in items {
            i.put(w);
        }
    }

    /// Decodes `n` values. Overridden for bytes.
    fn get_vec(r: &mut Reader<'_>, n: usize) -> Result<Vec<Self>, DecodeError> {
        let mut v = Vec::with_capacity(n.min(r.remaining()));
        for _ in 0..n {
            v.push(Self::get(r)?);
        }
        Ok(v)
    }
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const MIN_LEN: usize = std::mem::size_of::<$t>();
            fn put(&self, w: &mut Vec<u8>) {
                w.extend_from_slice(&self.to_le_bytes());
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
        }
    )*};
}
wire_int!(u16, u32, u64, i32, i64);

impl Wire for u8 {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Vec<u8>) {
        w.push(*self);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let [b] = r.array()?;
        Ok(b)
    }
    fn put_slice(items: &[Self], w: &mut Vec<u8>) {
        w.extend_from_slice(items);
    }
    fn get_vec(r: &mut Reader<'_>, n: usize) -> Result<Vec<Self>, DecodeError> {
        Ok(r.take(n)?.to_vec())
    }
}

impl Wire for bool {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Vec<u8>) {
        w.push(u8::from(*self));
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(DecodeError::InvalidBool(b)),
        }
    }
}

impl<const N: usize> Wire for [u8; N] {
    const MIN_LEN: usize = N;
    fn put(&self, w: &mut Vec<u8>) {
        w.extend_from_slice(self);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.array()
    }
}

impl<T: Wire> Wire for Vec<T> {
    const MIN_LEN: usize = 4;
    fn put(&self, w: &mut Vec<u8>) {
        // Lengths are bounded by MAX_PAYLOAD in practice; saturate rather
        // than wrap for the impossible case.
        u32::try_from(self.len()).unwrap_or(u32::MAX).put(w);
        T::put_slice(self, w);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.len_prefix(T::MIN_LEN)?;
        T::get_vec(r, n)
    }
}

impl Wire for String {
    const MIN_LEN: usize = 4;
    fn put(&self, w: &mut Vec<u8>) {
        u32::try_from(self.len()).unwrap_or(u32::MAX).put(w);
        w.extend_from_slice(self.as_bytes());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.len_prefix(1)?;
        let b = r.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8)
    }
}

impl<T: Wire> Wire for Option<T> {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Vec<u8>) {
        match self {
            None => w.push(0),
            Some(v) => {
                w.push(1);
                v.put(w);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(None),
            1 => Ok(Some(T::get(r)?)),
            tag => Err(DecodeError::InvalidTag {
                what: "option",
                tag,
            }),
        }
    }
}

impl<A: Wire, B: Wire> Wire for (A, B) {
    const MIN_LEN: usize = A::MIN_LEN + B::MIN_LEN;
    fn put(&self, w: &mut Vec<u8>) {
        self.0.put(w);
        self.1.put(w);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok((A::get(r)?, B::get(r)?))
    }
}

/// Implements [`Wire`] for a struct as its fields in order.
macro_rules! wire_struct {
    ($name:ident { $($field:ident),* $(,)? }) => {
        impl Wire for $name {
            const MIN_LEN: usize = 0;
            fn put(&self, w: &mut Vec<u8>) {
                $( self.$field.put(w); )*
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(Self { $( $field: Wire::get(r)?, )* })
            }
        }
    };
}

/// A control message: a [`Wire`] struct bound to its frame kind.
pub trait Message: Wire {
    /// The kind of frame that carries it.
    const KIND: Kind;
}

macro_rules! message {
    ($name:ident = $kind:ident { $($field:ident),* $(,)? }) => {
        wire_struct!($name { $($field),* });
        impl Message for $name {
            const KIND: Kind = Kind::$kind;
        }
    };
}

/// Decodes a whole payload as `M`, rejecting trailing bytes.
pub fn decode<M: Wire>(payload: &[u8]) -> Result<M, DecodeError> {
    let mut r = Reader::new(payload);
    let m = M::get(&mut r)?;
    r.finish()?;
    Ok(m)
}

/// Appends a frame header with a zero length; [`end_frame`] patches it.
/// Returns the header's offset.
pub fn begin_frame(out: &mut Vec<u8>, kind: Kind, id: u32) -> usize {
    let at = out.len();
    out.extend_from_slice(
        &Header {
            len: 0,
            kind: kind as u8,
            id,
        }
        .encode(),
    );
    at
}

/// Patches the length of the frame begun at `at` to cover everything
/// appended since.
pub fn end_frame(out: &mut [u8], at: usize) {
    let len = out.len().saturating_sub(at + HEADER_LEN);
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes();
    if let Some(dst) = out.get_mut(at..at + 4) {
        dst.copy_from_slice(&len);
    }
}

/// Appends a control frame carrying `msg`.
pub fn put_message<M: Message>(out: &mut Vec<u8>, id: u32, msg: &M) {
    let at = begin_frame(out, M::KIND, id);
    msg.put(out);
    end_frame(out, at);
}

/// Appends a frame with a raw payload (at most [`MAX_PAYLOAD`] bytes; the
/// caller splits larger data).
pub fn put_data(out: &mut Vec<u8>, kind: Kind, id: u32, data: &[u8]) {
    let at = begin_frame(out, kind, id);
    out.extend_from_slice(data);
    end_frame(out, at);
}

/// Appends an empty frame.
pub fn put_empty(out: &mut Vec<u8>, kind: Kind, id: u32) {
    put_data(out, kind, id, &[]);
}

// ---------------------------------------------------------------------------
// Messages

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
    /// A frame larger than [`MAX_PAYLOAD`]; the connection is closed.
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
    /// the last [`DETACHED_OUTPUT_LIMIT`] bytes).
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

/// Blocking frame reading for clients: reads one frame into `payload`
/// (replacing its contents). `Ok(None)` on a clean end of stream between
/// frames.
pub fn read_frame<R: std::io::Read>(
    r: &mut R,
    payload: &mut Vec<u8>,
) -> Result<Option<Header>, ReadFrameError> {
    let mut hdr = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let dst = hdr.get_mut(got..).unwrap_or_default();
        match r.read(dst) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ReadFrameError::Frame(FrameError::Truncated)),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadFrameError::Io(e)),
        }
    }
    let h = Header::parse(&hdr);
    let len = h.checked_len().map_err(ReadFrameError::Frame)?;
    payload.clear();
    payload.resize(len, 0);
    r.read_exact(payload).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ReadFrameError::Frame(FrameError::Truncated)
        } else {
            ReadFrameError::Io(e)
        }
    })?;
    Ok(Some(h))
}

/// Errors of [`read_frame`].
#[derive(Debug, Error)]
pub enum ReadFrameError {
    /// The stream failed.
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
    /// The stream carried an invalid frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip<M: Message + PartialEq + std::fmt::Debug>(m: M) {
        let mut out = Vec::new();
        put_message(&mut out, 7, &m);
        let h = Header::parse_prefix(&out).unwrap();
        assert_eq!(h.kind, M::KIND as u8);
        assert_eq!(h.id, 7);
        assert_eq!(h.len as usize, out.len() - HEADER_LEN);
        let back: M = decode(&out[HEADER_LEN..]).unwrap();
        assert_eq!(back, m);
        // Every strict prefix fails to decode, and never panics.
        for cut in 0..out.len() - HEADER_LEN {
            assert!(decode::<M>(&out[HEADER_LEN..HEADER_LEN + cut]).is_err());
        }
        // Trailing bytes are refused.
        let mut long = out[HEADER_LEN..].to_vec();
        long.push(0);
        assert_eq!(decode::<M>(&long), Err(DecodeError::TrailingBytes(1)));
    }

    #[test]
    fn messages_roundtrip() {
        roundtrip(Hello {
            magic: HELLO_MAGIC,
            version: PROTOCOL_VERSION,
            client: "test".into(),
        });
        roundtrip(ExecRequest {
            command: Command::Argv(vec![b"echo".to_vec(), b"hi".to_vec()]),
            env: vec![(b"A".to_vec(), b"1".to_vec())],
            clear_env: false,
            cwd: Some(b"/tmp".to_vec()),
            user: Some(User { uid: 1, gid: 2 }),
            stdin: true,
            timeout_ms: 5,
        });
        roundtrip(ExecRequest {
            command: Command::Shell(b"exit 3".to_vec()),
            env: vec![],
            clear_env: true,
            cwd: None,
            user: None,
            stdin: false,
            timeout_ms: 0,
        });
        roundtrip(ExecResult {
            status: ExitStatus::Signaled(9),
            timed_out: true,
            dropped_bytes: 12,
        });
        roundtrip(ErrorReply {
            code: ErrorCode::Other(999),
            errno: 2,
            message: "x".into(),
        });
        roundtrip(DirEntries {
            entries: vec![DirEntry {
                name: b"a\xff".to_vec(),
                file_type: FileType::Symlink,
                ino: 3,
            }],
            last: true,
        });
        roundtrip(PostRestore {
            entropy: [7; 64],
            unix_time_ns: 1,
        });
    }

    #[test]
    fn huge_counts_do_not_allocate() {
        // A list claiming 2^32-1 entries with 4 bytes present.
        let mut p = Vec::new();
        0u8.put(&mut p);
        u32::MAX.put(&mut p);
        p.extend_from_slice(&[0; 4]);
        assert!(matches!(
            decode::<ExecRequest>(&p),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn header_limits() {
        let h = Header {
            len: MAX_PAYLOAD as u32 + 1,
            kind: 1,
            id: 0,
        };
        assert_eq!(Header::parse(&h.encode()), h);
        assert!(h.checked_len().is_err());
        assert_eq!(Kind::from_u8(0x10), Some(Kind::Exec));
        assert_eq!(Kind::from_u8(0x7f), None);
        for k in Kind::ALL {
            assert_eq!(Kind::from_u8(k as u8), Some(k));
        }
    }

    #[test]
    fn bad_bools_and_tags() {
        assert_eq!(decode::<bool>(&[2]), Err(DecodeError::InvalidBool(2)));
        assert!(decode::<Option<u8>>(&[5]).is_err());
        assert_eq!(
            decode::<String>(&[1, 0, 0, 0, 0xff]),
            Err(DecodeError::InvalidUtf8)
        );
    }
}
