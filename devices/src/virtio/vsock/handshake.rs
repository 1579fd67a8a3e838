//! The host side's `CONNECT <port>\n` line, read before a host socket
//! becomes a connection.

use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// Longest CONNECT line accepted, newline included.
pub const MAX_LINE: usize = 32;

/// A host socket that has not yet sent its full CONNECT line.
pub struct Handshake {
    /// The accepted, non-blocking socket.
    pub stream: UnixStream,
    /// When it was accepted (it has [`super::CONNECT_TIMEOUT`] to finish).
    pub started: Instant,
    line: Vec<u8>,
}

/// What reading a handshake socket produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// Need more bytes.
    Pending,
    /// A complete, valid line asking for this guest port.
    Connect(u32),
    /// Malformed, overlong, closed or failed: drop the socket.
    Failed,
}

impl Handshake {
    /// Wraps a freshly accepted socket.
    pub fn new(stream: UnixStream) -> Self {
        Self {
            stream,
            started: Instant::now(),
            line: Vec::with_capacity(MAX_LINE),
        }
    }

    /// Reads what is available, one byte at a time so nothing after the
    /// newline (the start of the byte stream) is consumed.
    pub fn read(&mut self) -> Progress {
        let mut b = [0u8; 1];
        loop {
            match self.stream.read(&mut b) {
                Ok(0) => return Progress::Failed,
                Ok(_) => {
                    self.line.push(b[0]);
                    if b[0] == b'\n' {
                        return parse_connect(&self.line)
                            .map_or(Progress::Failed, Progress::Connect);
                    }
                    if self.line.len() >= MAX_LINE {
                        return Progress::Failed;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Progress::Pending,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Progress::Failed,
            }
        }
    }
}

/// Parses `CONNECT <port>\n` (an optional `\r` before the newline is
/// allowed): the word, whitespace, a decimal u32 and nothing else.
pub fn parse_connect(line: &[u8]) -> Option<u32> {
    let line = line.strip_suffix(b"\n")?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).ok()?;
    let mut words = text.split_ascii_whitespace();
    if words.next()? != "CONNECT" {
        return None;
    }
    let port = words.next()?;
    if words.next().is_some() || !port.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn parses_valid_lines() {
        assert_eq!(parse_connect(b"CONNECT 52\n"), Some(52));
        assert_eq!(parse_connect(b"CONNECT 4294967295\r\n"), Some(u32::MAX));
        assert_eq!(parse_connect(b"CONNECT  7\n"), Some(7));
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in [
            &b"CONNECT 52"[..],
            b"CONNECT\n",
            b"CONNECT 4294967296\n",
            b"CONNECT -1\n",
            b"CONNECT +1\n",
            b"CONNECT 1 2\n",
            b"connect 1\n",
            b"HELLO 1\n",
            b"CONNECT 0x10\n",
            b"\xffCONNECT 1\n",
            b"\n",
        ] {
            assert_eq!(parse_connect(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn reads_up_to_newline_only() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut h = Handshake::new(b);
        assert_eq!(h.read(), Progress::Pending);
        a.write_all(b"CONNECT 1").unwrap();
        assert_eq!(h.read(), Progress::Pending);
        a.write_all(b"234\npayload").unwrap();
        assert_eq!(h.read(), Progress::Connect(1234));
        let mut rest = [0u8; 7];
        h.stream.read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"payload");
    }

    #[test]
    fn overlong_and_closed_fail() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut h = Handshake::new(b);
        a.write_all(&[b'C'; MAX_LINE]).unwrap();
        assert_eq!(h.read(), Progress::Failed);
        let (a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut h = Handshake::new(b);
        drop(a);
        assert_eq!(h.read(), Progress::Failed);
    }
}
