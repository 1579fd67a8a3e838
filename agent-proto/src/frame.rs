//! Frames: the header, the kinds, building frames into a buffer and the
//! incremental [`FrameDecoder`] that cuts a byte stream into frames.

use thiserror::Error;

use crate::{HEADER_LEN, MAX_PAYLOAD};

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
    /// [`NetConfigure`]; answered by [`NetConfigured`].
    NetConfigure = 0x06,
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
    /// [`PtyExec`]: an exec on a new pseudo-terminal (its stdin, stdout
    /// and stderr, and its controlling terminal); answered like `Exec`,
    /// the terminal's output as `Stdout`.
    PtyExec = 0x15,
    /// [`PtyResize`]: sets a PTY exec's terminal size; answered by `Ok`.
    PtyResize = 0x16,
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
    /// [`TcpConnect`]: turns the connection into a byte relay to a guest
    /// TCP port; answered by `Ok` (then raw bytes both ways) or `Error`.
    TcpConnect = 0x30,

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
    /// [`NetConfigured`].
    NetConfigured = 0x87,
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
    pub const ALL: [Kind; 39] = [
        Kind::Hello,
        Kind::Health,
        Kind::Version,
        Kind::PostRestore,
        Kind::Power,
        Kind::NetConfigure,
        Kind::Exec,
        Kind::Stdin,
        Kind::StdinClose,
        Kind::Signal,
        Kind::Attach,
        Kind::PtyExec,
        Kind::PtyResize,
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
        Kind::TcpConnect,
        Kind::HelloOk,
        Kind::Ok,
        Kind::Error,
        Kind::HealthOk,
        Kind::VersionOk,
        Kind::PostRestoreOk,
        Kind::NetConfigured,
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

/// One frame cut from a stream by [`FrameDecoder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// Its header (`len` equals `payload.len()`).
    pub header: Header,
    /// Its payload, at most [`MAX_PAYLOAD`] bytes.
    pub payload: Vec<u8>,
}

/// Cuts a byte stream into frames, without doing any I/O itself: the caller
/// reads into [`FrameDecoder::spare`], reports how much it read with
/// [`FrameDecoder::commit`], then takes frames with
/// [`FrameDecoder::next_frame`] until it returns `None`.
///
/// A header announcing more than [`MAX_PAYLOAD`] is an error as soon as the
/// header is complete, before any of that payload is buffered, so the
/// buffer never holds more than one largest frame plus one read.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Start of the bytes not yet taken.
    start: usize,
    /// End of the bytes read.
    end: usize,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// A writable region of at least `want` bytes (at least one) to read
    /// the stream into; then call [`FrameDecoder::commit`].
    pub fn spare(&mut self, want: usize) -> &mut [u8] {
        let want = want.max(1);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && self.buf.len() - self.end < want {
            // Move the unread bytes to the front before growing.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < want {
            self.buf.resize(self.end + want, 0);
        }
        self.buf.get_mut(self.end..).unwrap_or_default()
    }

    /// Marks `n` bytes of [`FrameDecoder::spare`] as filled (clamped to the
    /// region's size).
    pub fn commit(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Copies `data` in (for callers that already hold the bytes).
    pub fn push(&mut self, data: &[u8]) {
        let dst = self.spare(data.len());
        if let Some(d) = dst.get_mut(..data.len()) {
            d.copy_from_slice(data);
        }
        self.commit(data.len());
    }

    /// Bytes buffered but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Whether the stream may end here: no partial frame is buffered. A
    /// stream that ends otherwise ended inside a frame
    /// ([`FrameError::Truncated`]).
    pub fn at_boundary(&self) -> bool {
        self.start == self.end
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or an
    /// error for a header whose length exceeds [`MAX_PAYLOAD`] (the stream
    /// cannot be resynchronised after that: stop reading it). The kind is
    /// not checked: that is the caller's decision.
    pub fn next_frame(&mut self) -> Result<Option<RawFrame>, FrameError> {
        let avail = self.buf.get(self.start..self.end).unwrap_or_default();
        let Some(header) = Header::parse_prefix(avail) else {
            return Ok(None);
        };
        let len = header.checked_len()?;
        let Some(payload) = avail.get(HEADER_LEN..HEADER_LEN + len) else {
            return Ok(None);
        };
        let payload = payload.to_vec();
        self.start += HEADER_LEN + len;
        Ok(Some(RawFrame { header, payload }))
    }
}
