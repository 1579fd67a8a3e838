//! A running exec of the blocking client.

use std::io::Write;
use std::sync::mpsc::Receiver;

use agent_proto::{ExecResult, Kind};

use super::Client;
use crate::error::{ClientError, Result};
use crate::session::{Collector, ExecEvent, ExecOutput, ExecStream, Frame};

/// A running (or re-attached) exec.
pub struct ExecHandle {
    pub(super) client: Client,
    pub(super) id: u32,
    pub(super) exec_id: u64,
    pub(super) pid: i32,
    pub(super) rx: Receiver<Frame>,
    pub(super) stream: ExecStream,
}

impl std::fmt::Debug for ExecHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecHandle")
            .field("exec_id", &self.exec_id)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Drop for ExecHandle {
    fn drop(&mut self) {
        self.client.unregister(self.id);
    }
}

impl ExecHandle {
    /// Agent-wide exec id (for [`Client::attach`] and [`Client::signal`]).
    pub fn exec_id(&self) -> u64 {
        self.exec_id
    }

    /// Process id of the command in the guest.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The next output chunk or the result; `Ok(None)` after the result.
    pub fn next_event(&mut self) -> Result<Option<ExecEvent>> {
        if self.stream.finished() {
            return Ok(None);
        }
        let f = match self.rx.recv() {
            Ok(f) => f,
            Err(_) => return Err(self.client.ended()),
        };
        self.stream.on_frame(f).map(Some)
    }

    /// Writes to the command's stdin (the exec must have been started with
    /// [`agent_proto::ExecRequest::with_stdin`]; otherwise the data is
    /// dropped).
    pub fn write_stdin(&self, data: &[u8]) -> Result<()> {
        self.client.send_data(Kind::Stdin, self.id, data)
    }

    /// Closes the command's stdin (after what was written has been
    /// delivered).
    pub fn close_stdin(&self) -> Result<()> {
        self.client.send_empty(Kind::StdinClose, self.id)
    }

    /// A writer for the command's stdin that can be moved to another
    /// thread (while this one reads the output).
    pub fn stdin(&self) -> ExecStdin {
        ExecStdin {
            client: self.client.clone(),
            id: self.id,
        }
    }

    /// Sends a signal to the command (its whole process group with
    /// `group`).
    pub fn signal(&self, signal: i32, group: bool) -> Result<()> {
        self.client.signal(self.exec_id, signal, group)
    }

    /// Collects all output (at most
    /// [`crate::Limits::max_collected_output`] bytes) and the result.
    pub fn wait(mut self) -> Result<ExecOutput> {
        let mut c = Collector::new(self.client.inner.limits.max_collected_output);
        loop {
            match self.next_event()? {
                Some(ev) => {
                    if let Some(out) = c.push(ev)? {
                        return Ok(out);
                    }
                }
                None => return Err(ClientError::Protocol("exec already finished".into())),
            }
        }
    }

    /// Streams output into `stdout` and `stderr` until the result.
    pub fn wait_with(
        &mut self,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
    ) -> Result<ExecResult> {
        loop {
            match self.next_event()? {
                Some(ExecEvent::Stdout(d)) => stdout.write_all(&d)?,
                Some(ExecEvent::Stderr(d)) => stderr.write_all(&d)?,
                Some(ExecEvent::Exit(r)) => return Ok(r),
                None => return Err(ClientError::Protocol("exec already finished".into())),
            }
        }
    }
}

/// Writes to an exec's stdin; `Clone` and `Send`. Each `write` sends the
/// whole buffer (in frames of at most [`agent_proto::MAX_PAYLOAD`]).
#[derive(Clone)]
pub struct ExecStdin {
    client: Client,
    id: u32,
}

impl std::fmt::Debug for ExecStdin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStdin").field("id", &self.id).finish()
    }
}

impl ExecStdin {
    /// Closes the command's stdin.
    pub fn close(&self) -> Result<()> {
        self.client.send_empty(Kind::StdinClose, self.id)
    }
}

impl Write for ExecStdin {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.client
            .send_data(Kind::Stdin, self.id, buf)
            .map_err(std::io::Error::other)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
