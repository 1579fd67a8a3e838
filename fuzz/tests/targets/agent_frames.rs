//! The agent protocol's frame decoder (`agent_proto::FrameDecoder`, which
//! the host clients read every agent stream with; the agent cuts frames by
//! the same `Header` rules): a stream of frames (well-formed, empty,
//! oversized, or plain bytes) fed in arbitrary pieces, through `spare`/
//! `commit` with short reads and through `push`. Checks: the frames and the
//! error are exactly those of the stream fed whole, the frames are the
//! ones encoded, the decoder never holds more than one largest frame plus
//! one read, allocates accordingly, and `at_boundary` tells a stream cut
//! inside a frame.

use agent_proto::{FrameDecoder, Header, RawFrame, HEADER_LEN, MAX_PAYLOAD};
use bolero::{check, TypeGenerator};

#[derive(Debug, Clone, TypeGenerator)]
enum Piece {
    /// A frame with a payload of `len % 300` bytes (or `big` bytes
    /// announced, for `big` above the limit: nothing follows).
    Frame {
        kind: u8,
        id: u32,
        len: u16,
        big: u32,
    },
    /// Raw bytes.
    Bytes(Vec<u8>),
}

#[derive(Debug, Clone, TypeGenerator)]
struct Input {
    pieces: Vec<Piece>,
    /// Read sizes (and whether each read comes short).
    reads: Vec<(u16, u8, bool)>,
}

#[test]
fn agent_frame_decoder() {
    check!()
        .with_type::<Input>()
        .with_test_time(shoal_fuzz::budget())
        .for_each(run);
}

/// Frames of `stream` fed at once, and the error that stopped it.
fn whole(stream: &[u8]) -> (Vec<RawFrame>, bool, bool) {
    let mut d = FrameDecoder::new();
    d.push(stream);
    let mut frames = vec![];
    loop {
        match d.next_frame() {
            Ok(Some(f)) => frames.push(f),
            Ok(None) => return (frames, false, d.at_boundary()),
            Err(_) => return (frames, true, false),
        }
    }
}

fn run(input: &Input) {
    let mut stream = Vec::new();
    let mut encoded = Vec::new();
    let mut complete = true;
    for p in input.pieces.iter().take(32) {
        match p {
            Piece::Frame { kind, id, len, big } => {
                let oversized = *big as usize > MAX_PAYLOAD;
                let len = if oversized {
                    *big
                } else {
                    u32::from(*len % 300)
                };
                let h = Header {
                    len,
                    kind: *kind,
                    id: *id,
                };
                stream.extend_from_slice(&h.encode());
                if oversized {
                    complete = false;
                    break;
                }
                let payload: Vec<u8> = (0..len).map(|i| i.to_le_bytes()[0] ^ *kind).collect();
                stream.extend_from_slice(&payload);
                encoded.push(RawFrame { header: h, payload });
            }
            Piece::Bytes(b) => {
                stream.extend_from_slice(b);
                complete = false;
                break;
            }
        }
    }
    let (want, want_err, boundary) = whole(&stream);
    if complete {
        assert_eq!(want, encoded, "decoded frames differ from the encoded ones");
        assert!(!want_err && boundary);
    }
    // The same stream in pieces.
    let ((got, got_err), peak) = shoal_fuzz::peak_alloc(|| pieces(&stream, &input.reads));
    assert_eq!(got, want, "frames depend on how the stream was cut");
    assert_eq!(
        got_err, want_err,
        "the error depends on how the stream was cut"
    );
    let payload_bytes: usize = got.iter().map(|f| f.payload.len() + 64).sum();
    let limit = 2 * (HEADER_LEN + MAX_PAYLOAD + 0x1_0000) + payload_bytes + 4096;
    assert!(
        peak <= limit,
        "decoding {} bytes peaked at {peak} bytes",
        stream.len()
    );
}

fn pieces(stream: &[u8], reads: &[(u16, u8, bool)]) -> (Vec<RawFrame>, bool) {
    let mut d = FrameDecoder::new();
    let mut frames = vec![];
    let mut pos = 0;
    let mut i = 0;
    while pos < stream.len() {
        let (want, short, push) = reads
            .get(i % reads.len().max(1))
            .copied()
            .unwrap_or((4096, 0, false));
        i += 1;
        let want = usize::from(want.max(1));
        let n = if push {
            let n = want.min(stream.len() - pos);
            d.push(&stream[pos..pos + n]);
            n
        } else {
            let spare = d.spare(want);
            assert!(
                spare.len() >= want,
                "spare gave {} of {want} bytes",
                spare.len()
            );
            // A short read: fewer bytes than asked for.
            let n = (want - usize::from(short) % want).min(stream.len() - pos);
            spare[..n].copy_from_slice(&stream[pos..pos + n]);
            d.commit(n);
            n
        };
        pos += n;
        let held = d.buffered();
        assert!(
            held <= HEADER_LEN + MAX_PAYLOAD + want,
            "the decoder holds {held} bytes"
        );
        loop {
            match d.next_frame() {
                Ok(Some(f)) => {
                    assert_eq!(f.header.len as usize, f.payload.len());
                    frames.push(f);
                }
                Ok(None) => break,
                Err(_) => return (frames, true),
            }
        }
    }
    (frames, false)
}
