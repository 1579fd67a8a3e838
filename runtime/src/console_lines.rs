//! A guest's console read as lines within fixed bounds: the guest writes
//! what it likes to its serial port (a line of megabytes without a
//! newline, or an endless stream), so a reader keeps at most
//! [`MAX_CONSOLE_LINE`] bytes of a line (the rest of it is read and
//! dropped), and stops after a total number of bytes where it waits for
//! something.

use std::io::{BufRead, BufReader, Read};

/// Most bytes of one console line kept; the rest of a longer line is
/// dropped.
pub const MAX_CONSOLE_LINE: usize = 4096;

/// Lines of a console stream, each cut to [`MAX_CONSOLE_LINE`] bytes
/// (without its `\n`, and a trailing `\r`), ending at EOF, at a read error,
/// or once `limit` bytes were read.
#[derive(Debug)]
pub struct ConsoleLines<R> {
    r: BufReader<R>,
    read: u64,
    limit: u64,
}

impl<R: Read> ConsoleLines<R> {
    /// Lines of `r`, with no limit on the total read.
    pub fn new(r: R) -> Self {
        Self::with_limit(r, u64::MAX)
    }

    /// Lines of `r` until `limit` bytes were read.
    pub fn with_limit(r: R, limit: u64) -> Self {
        ConsoleLines {
            r: BufReader::with_capacity(64 << 10, r),
            read: 0,
            limit,
        }
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// The next line, `None` at the end (EOF, an error, or the limit).
    pub fn next_line(&mut self) -> Option<Vec<u8>> {
        let mut line = Vec::new();
        let mut any = false;
        loop {
            if self.read >= self.limit {
                return None;
            }
            let buf = match self.r.fill_buf() {
                Ok([]) => return any.then_some(line),
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            };
            any = true;
            let left = usize::try_from(self.limit - self.read).unwrap_or(usize::MAX);
            let avail = &buf[..buf.len().min(left)];
            let (chunk, done) = match avail.iter().position(|&b| b == b'\n') {
                Some(i) => (&avail[..i], Some(i + 1)),
                None => (avail, None),
            };
            let room = MAX_CONSOLE_LINE.saturating_sub(line.len());
            line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            let used = done.unwrap_or(avail.len());
            self.r.consume(used);
            self.read += used as u64;
            if done.is_some() {
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Some(line);
            }
        }
    }

    /// Reads and drops everything left, in fixed-size pieces, until EOF
    /// or an error (ignoring the limit): keeps a writer from blocking or
    /// failing on a full pipe.
    pub fn drain(mut self) {
        let mut buf = [0u8; 16 << 10];
        loop {
            match self.r.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

impl<R: Read> Iterator for ConsoleLines<R> {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        self.next_line()
    }
}
