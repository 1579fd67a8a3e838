//! Many agent connections over one virtio-serial port, for hosts without
//! vhost-vsock (the `vm` kind on QEMU): the host side bridges a
//! hybrid-vsock style Unix socket (`CONNECT <port>\n` → `OK <n>\n`) to
//! streams on the port; the guest agent demultiplexes them into local
//! connections to its server.
//!
//! Each frame is a 9-byte header (kind u8, stream u32 LE, payload length
//! u32 LE) and at most [`MAX_PAYLOAD`] bytes. The host starts every
//! session on the port with [`FrameKind::Reset`] (the guest drops every
//! stream it has and answers [`FrameKind::ResetAck`]); until the host has
//! seen that exact header it skips bytes, so a frame the guest was half
//! way through writing before a reconnect is never misread.

/// Name of the virtio-serial port (`-device virtserialport,name=...`).
pub const PORT_NAME: &str = "org.shoal.agent";
/// Largest payload of one frame.
pub const MAX_PAYLOAD: usize = 32 << 10;
/// Header size.
pub const HEADER: usize = 9;
/// Most streams open at once on one port.
pub const MAX_STREAMS: usize = 256;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Host → guest: open `stream` to the port in the payload (u32 LE).
    Open = 1,
    /// Either way: bytes of `stream`.
    Data = 2,
    /// Either way: `stream` is closed.
    Close = 3,
    /// Host → guest: drop every stream (a new host session).
    Reset = 4,
    /// Guest → host: every stream is dropped.
    ResetAck = 5,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<FrameKind> {
        Some(match b {
            1 => FrameKind::Open,
            2 => FrameKind::Data,
            3 => FrameKind::Close,
            4 => FrameKind::Reset,
            5 => FrameKind::ResetAck,
            _ => return None,
        })
    }
}

/// A bad frame (the session on the port is then reset).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    /// Unknown frame kind.
    #[error("serial mux: unknown frame kind {0}")]
    Kind(u8),
    /// Payload over [`MAX_PAYLOAD`], or wrong for its kind.
    #[error("serial mux: frame kind {kind:?} with a {len}-byte payload")]
    Length {
        /// The kind.
        kind: FrameKind,
        /// The length announced.
        len: u32,
    },
}

/// Encodes one frame header followed by `payload` (at most
/// [`MAX_PAYLOAD`] bytes: longer data goes in several frames).
pub fn encode(kind: FrameKind, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len().min(MAX_PAYLOAD);
    let mut v = Vec::with_capacity(HEADER + len);
    v.push(kind as u8);
    v.extend_from_slice(&stream.to_le_bytes());
    // len <= MAX_PAYLOAD fits a u32.
    #[allow(clippy::cast_possible_truncation)]
    v.extend_from_slice(&(len as u32).to_le_bytes());
    v.extend_from_slice(&payload[..len]);
    v
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Its kind.
    pub kind: FrameKind,
    /// Its stream.
    pub stream: u32,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// Incremental decoder with a bounded buffer (at most one frame).
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Skipping bytes until a header of this kind (with stream 0 and no
    /// payload).
    syncing: Option<FrameKind>,
}

impl Decoder {
    /// A decoder for the guest's side (frames from the start).
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// A decoder for the host's side of a new session: bytes before the
    /// guest's [`FrameKind::ResetAck`] are skipped.
    pub fn syncing() -> Decoder {
        Decoder::syncing_on(FrameKind::ResetAck)
    }

    /// A decoder that skips bytes until a header of `kind` (stream 0, no
    /// payload), which it returns as the first frame. The guest's side
    /// waits for the host's [`FrameKind::Reset`] this way: the guest
    /// discards what arrives before it opens its port, which may cut a
    /// frame anywhere, and the host sends `Reset` until it is answered.
    pub fn syncing_on(kind: FrameKind) -> Decoder {
        Decoder {
            buf: Vec::new(),
            syncing: Some(kind),
        }
    }

    /// How many more bytes it can take now (feed at most this many).
    pub fn room(&self) -> usize {
        (HEADER + MAX_PAYLOAD).saturating_sub(self.buf.len()).max(1)
    }

    /// Adds `bytes` (at most [`Self::room`]) and returns the next complete
    /// frame, if any; call again with `&[]` until it returns `Ok(None)`.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Option<Frame>, MuxError> {
        self.buf.extend_from_slice(bytes);
        if let Some(kind) = self.syncing {
            let ack = encode(kind, 0, &[]);
            match self.buf.windows(HEADER).position(|w| w == ack.as_slice()) {
                Some(i) => {
                    self.buf.drain(..i + HEADER);
                    self.syncing = None;
                    return Ok(Some(Frame {
                        kind,
                        stream: 0,
                        payload: vec![],
                    }));
                }
                None => {
                    let keep = self.buf.len().saturating_sub(HEADER - 1);
                    self.buf.drain(..keep);
                    return Ok(None);
                }
            }
        }
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let kind = FrameKind::from_u8(self.buf[0]).ok_or(MuxError::Kind(self.buf[0]))?;
        let u32_at = |i: usize| {
            u32::from_le_bytes([
                self.buf[i],
                self.buf[i + 1],
                self.buf[i + 2],
                self.buf[i + 3],
            ])
        };
        let stream = u32_at(1);
        let len = u32_at(5);
        let ok = match kind {
            FrameKind::Data => len as usize <= MAX_PAYLOAD && len > 0,
            FrameKind::Open => len == 4,
            _ => len == 0,
        };
        if !ok {
            return Err(MuxError::Length { kind, len });
        }
        let total = HEADER + len as usize;
        if self.buf.len() < total {
            return Ok(None);
        }
        let payload = self.buf[HEADER..total].to_vec();
        self.buf.drain(..total);
        Ok(Some(Frame {
            kind,
            stream,
            payload,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_in_pieces_and_bad_ones_are_refused() {
        let mut wire = encode(FrameKind::Open, 7, &5000u32.to_le_bytes());
        wire.extend(encode(FrameKind::Data, 7, b"hello"));
        wire.extend(encode(FrameKind::Close, 7, &[]));
        let mut d = Decoder::new();
        let mut got = vec![];
        for b in wire.chunks(2) {
            let mut next = d.push(b).unwrap();
            while let Some(f) = next {
                got.push(f);
                next = d.push(&[]).unwrap();
            }
        }
        assert_eq!(got.len(), 3);
        assert_eq!(got[1].payload, b"hello");
        assert_eq!(got[2].kind, FrameKind::Close);

        let mut bad = encode(FrameKind::Data, 1, b"x");
        bad[5..9].copy_from_slice(&(u32::try_from(MAX_PAYLOAD).unwrap() + 1).to_le_bytes());
        assert!(matches!(
            Decoder::new().push(&bad),
            Err(MuxError::Length { .. })
        ));
        assert_eq!(Decoder::new().push(&[9; 9]), Err(MuxError::Kind(9)));
    }

    #[test]
    fn the_host_skips_to_the_guests_reset_ack() {
        let mut d = Decoder::syncing();
        // The tail of a frame from before the reset, then the ack, then data.
        let mut wire = vec![2, 0, 0, 0, 0, 0x40, 0, 0];
        wire.extend(b"garbage".repeat(100));
        wire.extend(encode(FrameKind::ResetAck, 0, &[]));
        wire.extend(encode(FrameKind::Data, 3, b"ok"));
        let mut got = vec![];
        for b in wire.chunks(5) {
            let mut next = d.push(b).unwrap();
            while let Some(f) = next {
                got.push(f);
                next = d.push(&[]).unwrap();
            }
        }
        assert_eq!(got[0].kind, FrameKind::ResetAck);
        assert_eq!(got[1].payload, b"ok");
        assert!(d.buf.len() < HEADER + MAX_PAYLOAD);
    }

    #[test]
    fn the_guest_skips_cut_resets_to_a_whole_one() {
        // What a guest that opened its port late may see: the tail of a
        // Reset (its head discarded), then whole ones, then an Open.
        let reset = encode(FrameKind::Reset, 0, &[]);
        let mut wire = reset[4..].to_vec();
        wire.extend(&reset[..3]);
        wire.extend(&reset);
        wire.extend(&reset);
        wire.extend(encode(FrameKind::Open, 1, &5000u32.to_le_bytes()));
        let mut d = Decoder::syncing_on(FrameKind::Reset);
        let mut got = vec![];
        let mut next = d.push(&wire).unwrap();
        while let Some(f) = next {
            got.push(f.kind);
            next = d.push(&[]).unwrap();
        }
        assert_eq!(got, [FrameKind::Reset, FrameKind::Reset, FrameKind::Open]);
    }
}
