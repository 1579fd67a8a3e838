//! Streams of the tokio client: a running exec, its stdin, a download.

use agent_proto::{ExecResult, Header, Kind, HEADER_LEN, MAX_PAYLOAD};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::time::Instant;

use super::{AsyncClient, Route};
use crate::error::{ClientError, Result};
use crate::session::{self, Collector, Download, DownloadStep, ExecEvent, ExecOutput, ExecStream};

/// A running (or re-attached) exec. Dropping it stops receiving the exec's
/// output (the command keeps running; see [`AsyncExecHandle::signal`]).
pub struct AsyncExecHandle {
    pub(super) client: AsyncClient,
    pub(super) route: Route,
    pub(super) exec_id: u64,
    pub(super) pid: i32,
    pub(super) stream: ExecStream,
    pub(super) deadline: Option<Instant>,
}

impl std::fmt::Debug for AsyncExecHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncExecHandle")
            .field("exec_id", &self.exec_id)
            .field("pid", &self.pid)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl AsyncExecHandle {
    /// Agent-wide exec id (for [`AsyncClient::attach`] and
    /// [`AsyncClient::signal`]).
    pub fn exec_id(&self) -> u64 {
        self.exec_id
    }

    /// Process id of the command in the guest.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// When waiting for this exec's events gives up with
    /// [`ClientError::Timeout`]: by default the exec's own timeout plus
    /// [`super::Config::exec_slack`] from its start, none for an exec
    /// without a timeout.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Replaces the deadline.
    pub fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// The next output chunk or the result; `Ok(None)` after the result.
    pub async fn next_event(&mut self) -> Result<Option<ExecEvent>> {
        if self.stream.finished() {
            return Ok(None);
        }
        let f = self.client.recv(&mut self.route, self.deadline).await?;
        self.stream.on_frame(f).map(Some)
    }

    /// Writes to the command's stdin (the exec must have been started with
    /// [`agent_proto::ExecRequest::with_stdin`]; otherwise the agent drops
    /// the data).
    pub async fn write_stdin(&self, data: &[u8]) -> Result<()> {
        self.client
            .send_data(Kind::Stdin, self.route.id, data)
            .await
    }

    /// Closes the command's stdin (after what was written).
    pub async fn close_stdin(&self) -> Result<()> {
        let d = self.client.call_deadline();
        self.client
            .send_empty(Kind::StdinClose, self.route.id, d)
            .await
    }

    /// A writer for the command's stdin that can be moved to another task
    /// (while this one reads the output).
    pub fn stdin(&self) -> AsyncExecStdin {
        AsyncExecStdin {
            client: self.client.clone(),
            id: self.route.id,
        }
    }

    /// Sends a signal to the command (its whole process group with
    /// `group`).
    pub async fn signal(&self, signal: i32, group: bool) -> Result<()> {
        self.client.signal(self.exec_id, signal, group).await
    }

    /// Collects all output (at most
    /// [`crate::Limits::max_collected_output`] bytes) and the result.
    pub async fn wait(mut self) -> Result<ExecOutput> {
        let mut c = Collector::new(self.client.inner.config.limits.max_collected_output);
        loop {
            match self.next_event().await? {
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
    pub async fn wait_with<O, E>(&mut self, stdout: &mut O, stderr: &mut E) -> Result<ExecResult>
    where
        O: AsyncWrite + Unpin + ?Sized,
        E: AsyncWrite + Unpin + ?Sized,
    {
        loop {
            match self.next_event().await? {
                Some(ExecEvent::Stdout(d)) => stdout.write_all(&d).await?,
                Some(ExecEvent::Stderr(d)) => stderr.write_all(&d).await?,
                Some(ExecEvent::Exit(r)) => return Ok(r),
                None => return Err(ClientError::Protocol("exec already finished".into())),
            }
        }
    }
}

/// Writes to an exec's stdin; `Clone` and `Send`.
#[derive(Clone)]
pub struct AsyncExecStdin {
    client: AsyncClient,
    id: u32,
}

impl std::fmt::Debug for AsyncExecStdin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncExecStdin")
            .field("id", &self.id)
            .finish()
    }
}

impl AsyncExecStdin {
    /// Sends `data` (in frames of at most [`agent_proto::MAX_PAYLOAD`]).
    pub async fn write(&self, data: &[u8]) -> Result<()> {
        self.client.send_data(Kind::Stdin, self.id, data).await
    }

    /// Closes the command's stdin.
    pub async fn close(&self) -> Result<()> {
        let d = self.client.call_deadline();
        self.client.send_empty(Kind::StdinClose, self.id, d).await
    }
}

/// A file being read: its chunks in order, each within the client's call
/// timeout of the one before.
pub struct AsyncDownload {
    pub(super) client: AsyncClient,
    pub(super) route: Route,
    pub(super) state: Download,
    pub(super) done: Option<u64>,
}

impl std::fmt::Debug for AsyncDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncDownload")
            .field("id", &self.route.id)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl AsyncDownload {
    /// The next chunk; `Ok(None)` at the end (then [`AsyncDownload::total`]
    /// says how many bytes came, as the agent confirmed).
    pub async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>> {
        if self.done.is_some() {
            return Ok(None);
        }
        let d = Some(self.client.call_deadline());
        let f = self.client.recv(&mut self.route, d).await?;
        match self.state.on_frame(f)? {
            DownloadStep::Chunk(c) => Ok(Some(c)),
            DownloadStep::Done(total) => {
                self.done = Some(total);
                Ok(None)
            }
        }
    }

    /// The bytes received, once the end came.
    pub fn total(&self) -> Option<u64> {
        self.done
    }

    /// Streams the rest into `dst`; returns the file's bytes in all.
    pub async fn copy_to<W: AsyncWrite + Unpin + ?Sized>(mut self, dst: &mut W) -> Result<u64> {
        while let Some(c) = self.next_chunk().await? {
            dst.write_all(&c).await?;
        }
        Ok(self.done.unwrap_or_default())
    }
}

/// A file being written: bytes given to [`AsyncUpload::write`] go out in
/// frames of [`MAX_PAYLOAD`] bytes (fewer frames, fewer system calls in the
/// guest), [`AsyncUpload::finish`] sends the rest and waits for the agent's
/// count. Every frame must be taken by the connection within the client's
/// call timeout. Abandoned before `finish` (an error, or the caller's
/// future dropped), it still sends `FileEnd` when there is room, so the
/// agent does not keep the upload open for the connection's life.
pub struct AsyncUpload {
    pub(super) client: AsyncClient,
    pub(super) route: Route,
    /// The next frame: a header's room, then the bytes not sent yet.
    pub(super) frame: Vec<u8>,
    pub(super) sent: u64,
    pub(super) ended: bool,
}

impl std::fmt::Debug for AsyncUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncUpload")
            .field("id", &self.route.id)
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

pub(super) fn empty_frame() -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + MAX_PAYLOAD);
    v.resize(HEADER_LEN, 0);
    v
}

impl AsyncUpload {
    /// Queues `data` (sent as whole frames fill up).
    pub async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let room = HEADER_LEN + MAX_PAYLOAD - self.frame.len();
            let (now, rest) = data.split_at(room.min(data.len()));
            self.frame.extend_from_slice(now);
            data = rest;
            if self.frame.len() == HEADER_LEN + MAX_PAYLOAD {
                self.flush_frame().await?;
            }
        }
        Ok(())
    }

    /// Bytes handed to the connection so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    async fn flush_frame(&mut self) -> Result<()> {
        let n = self.frame.len() - HEADER_LEN;
        if n == 0 {
            return Ok(());
        }
        let hdr = Header {
            // n <= MAX_PAYLOAD (1 MiB)
            len: u32::try_from(n).map_err(|_| ClientError::Protocol("frame size".into()))?,
            kind: Kind::FileData as u8,
            id: self.route.id,
        };
        let mut frame = std::mem::replace(&mut self.frame, empty_frame());
        if let Some(h) = frame.get_mut(..HEADER_LEN) {
            h.copy_from_slice(&hdr.encode());
        }
        self.client.send(frame, self.client.call_deadline()).await?;
        self.sent += u64::from(hdr.len);
        // An early answer (e.g. the open failed) ends the upload.
        match self.route.rx.try_recv() {
            Ok(f) => {
                self.ended = true; // the agent dropped the upload
                Err(session::early_upload_reply(f))
            }
            Err(TryRecvError::Disconnected) => Err(self.client.ended()),
            Err(TryRecvError::Empty) => Ok(()),
        }
    }

    /// Sends what is left and `FileEnd`; the bytes the agent wrote (checked
    /// against what was sent).
    pub async fn finish(mut self) -> Result<u64> {
        self.flush_frame().await?;
        let deadline = self.client.call_deadline();
        self.client
            .send_empty(Kind::FileEnd, self.route.id, deadline)
            .await?;
        self.ended = true;
        let f = self.client.recv(&mut self.route, Some(deadline)).await?;
        session::upload_done(f, self.sent)
    }
}

impl Drop for AsyncUpload {
    fn drop(&mut self) {
        if !self.ended {
            self.client
                .try_send(session::empty(Kind::FileEnd, self.route.id));
        }
    }
}
