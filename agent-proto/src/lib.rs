//! The Shoal agent wire protocol, version [`PROTOCOL_VERSION`], sans I/O.
//!
//! This crate is the single definition of the protocol: the agent
//! (`shoal-agent`, crate `guest-agent`) and the host clients (crate
//! `agent-client`) both encode and decode through it. It holds no sockets,
//! threads or clocks: frames are built into and parsed out of byte buffers
//! ([`put_message`], [`FrameDecoder`], [`decode`]), and each side brings its
//! own I/O. `guest-agent/PROTOCOL.md` describes the same format for readers
//! who do not read Rust.
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

#[macro_use]
mod codec;
mod frame;
mod messages;
mod net;
pub mod serial_mux;
mod tcp;

pub use codec::{decode, put_message, DecodeError, Message, Reader, Wire};
pub use frame::{
    begin_frame, end_frame, put_data, put_empty, FrameDecoder, FrameError, Header, Kind, RawFrame,
};
pub use messages::*;
pub use net::*;
pub use tcp::*;

/// Protocol version spoken by this build (client and agent).
pub const PROTOCOL_VERSION: u16 = 1;
/// First bytes of a [`Hello`] payload.
pub const HELLO_MAGIC: [u8; 4] = *b"SHOL";
/// Size of a frame header.
pub const HEADER_LEN: usize = 9;
/// Largest payload a frame may carry (1 MiB).
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Vsock port the agent listens on inside the guest: the one definition,
/// used by the agent, the clients and the host daemon.
pub const VSOCK_PORT: u32 = 5000;
/// Most bytes of output the agent keeps for an exec nobody is attached to.
pub const DETACHED_OUTPUT_LIMIT: usize = 1 << 20;

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
