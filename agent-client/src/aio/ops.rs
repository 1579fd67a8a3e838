//! The operations of the tokio client: exec, files, system. Each one is
//! the blocking client's, with the same requests and the same checks
//! (both come from [`crate::session`]), and a deadline on every wait.

use std::path::Path;

use agent_proto::{
    AttachRequest, ChmodRequest, DirEntry, ExecRequest, FileRead, FileStat, HealthReply, Kind,
    Message, MkdirRequest, NetConfigure, NetConfigured, PostRestore, PostRestoreReply, PowerAction,
    PowerRequest, PtyExec, PtyResize, RemoveRequest, RenameRequest, SignalRequest, VersionReply,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::time::Instant;

use super::streams::empty_frame;
use super::{AsyncClient, AsyncDownload, AsyncExecHandle, AsyncUpload};
use crate::error::{ClientError, Result};
use crate::session::{
    self, exec_started, path_bytes, Download, ExecOutput, ExecStream, Frame, Listing, UploadOptions,
};

impl AsyncClient {
    /// Sends a control request and returns the first answer frame, within
    /// the call timeout.
    async fn call<M: Message>(&self, m: &M) -> Result<Frame> {
        let deadline = self.call_deadline();
        let mut route = self.register()?;
        self.send_message(route.id, m, deadline).await?;
        self.recv(&mut route, Some(deadline)).await
    }

    async fn call_empty(&self, kind: Kind) -> Result<Frame> {
        let deadline = self.call_deadline();
        let mut route = self.register()?;
        self.send_empty(kind, route.id, deadline).await?;
        self.recv(&mut route, Some(deadline)).await
    }

    async fn call_path(&self, kind: Kind, path: &Path, nofollow: bool) -> Result<Frame> {
        let deadline = self.call_deadline();
        let mut route = self.register()?;
        let req = session::path_request(kind, route.id, path, nofollow);
        self.send(req, deadline).await?;
        self.recv(&mut route, Some(deadline)).await
    }

    // ---------------------------------------------------------------- exec

    /// Starts a command; the handle streams its output and result. Its
    /// deadline is the command's timeout plus
    /// [`super::Config::exec_slack`] (none without a timeout).
    pub async fn exec(&self, req: &ExecRequest) -> Result<AsyncExecHandle> {
        let slack = self.inner.config.exec_slack;
        let deadline = req.timeout().map(|t| Instant::now() + t + slack);
        self.start(|id| session::message(id, req), deadline).await
    }

    /// Starts a command on a new terminal of `cols` x `rows` (its stdin,
    /// stdout and stderr): the terminal's output comes as stdout, stdin
    /// writes are typed into it. An agent without PTYs answers
    /// `UnknownKind`.
    pub async fn exec_pty(
        &self,
        req: &ExecRequest,
        cols: u16,
        rows: u16,
    ) -> Result<AsyncExecHandle> {
        let slack = self.inner.config.exec_slack;
        let deadline = req.timeout().map(|t| Instant::now() + t + slack);
        let m = PtyExec {
            exec: req.clone(),
            cols,
            rows,
        };
        self.start(|id| session::message(id, &m), deadline).await
    }

    /// Sets the terminal size of PTY exec `exec_id`.
    pub async fn resize_pty(&self, exec_id: u64, cols: u16, rows: u16) -> Result<()> {
        self.call(&PtyResize {
            exec_id,
            cols,
            rows,
        })
        .await?
        .expect_ok()
    }

    /// Runs a command to completion and collects its output (at most
    /// [`crate::Limits::max_collected_output`] bytes).
    pub async fn exec_simple(&self, req: &ExecRequest) -> Result<ExecOutput> {
        self.exec(req).await?.wait().await
    }

    /// Re-attaches to an exec by id (e.g. from a new connection after the
    /// old one was lost): the output kept since is delivered first. The
    /// handle has no deadline until one is set.
    pub async fn attach(&self, exec_id: u64) -> Result<AsyncExecHandle> {
        self.start(|id| session::message(id, &AttachRequest { exec_id }), None)
            .await
    }

    /// Sends the request `encode` makes for the new id and waits for
    /// `ExecStarted`.
    async fn start(
        &self,
        encode: impl FnOnce(u32) -> Vec<u8>,
        deadline: Option<Instant>,
    ) -> Result<AsyncExecHandle> {
        let call = self.call_deadline();
        let mut route = self.register()?;
        self.send(encode(route.id), call).await?;
        let started = exec_started(self.recv(&mut route, Some(call)).await?)?;
        Ok(AsyncExecHandle {
            client: self.clone(),
            route,
            exec_id: started.exec_id,
            pid: started.pid,
            stream: ExecStream::default(),
            deadline,
        })
    }

    /// Sends `signal` to a running exec (its process group with `group`).
    pub async fn signal(&self, exec_id: u64, signal: i32, group: bool) -> Result<()> {
        self.call(&SignalRequest {
            exec_id,
            signal,
            group,
        })
        .await?
        .expect_ok()
    }

    // --------------------------------------------------------------- files

    /// Opens the file at `path` for an upload (created or truncated, or
    /// appended to); the handle takes the bytes.
    pub async fn open_upload(
        &self,
        path: impl AsRef<Path>,
        opts: UploadOptions,
    ) -> Result<AsyncUpload> {
        let route = self.register()?;
        let open = session::upload_open(route.id, path.as_ref(), opts);
        self.send(open, self.call_deadline()).await?;
        Ok(AsyncUpload {
            client: self.clone(),
            route,
            frame: empty_frame(),
            sent: 0,
            ended: false,
        })
    }

    /// Streams `src` into the file at `path` (created or truncated, or
    /// appended to); returns the bytes written. Each frame must be taken by
    /// the connection, and the agent's answer must come, within the call
    /// timeout; reading `src` has no deadline here (wrap the call in one).
    pub async fn upload<R: AsyncRead + Unpin + ?Sized>(
        &self,
        src: &mut R,
        path: impl AsRef<Path>,
        opts: UploadOptions,
    ) -> Result<u64> {
        let mut up = self.open_upload(path, opts).await?;
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = src.read(&mut buf).await?;
            if n == 0 {
                return up.finish().await;
            }
            up.write(buf.get(..n).unwrap_or_default()).await?;
        }
    }

    /// Uploads a byte slice.
    pub async fn write_file(&self, path: impl AsRef<Path>, data: &[u8], mode: u32) -> Result<u64> {
        let opts = UploadOptions {
            mode,
            ..UploadOptions::default()
        };
        self.upload(&mut &data[..], path, opts).await
    }

    /// Opens a download of at most `limit` bytes from `offset` of the file
    /// at `path`; the handle yields its chunks.
    pub async fn open_download(
        &self,
        path: impl AsRef<Path>,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<AsyncDownload> {
        self.open_download_capped(path.as_ref(), offset, limit, None)
            .await
    }

    async fn open_download_capped(
        &self,
        path: &Path,
        offset: u64,
        limit: Option<u64>,
        cap: Option<usize>,
    ) -> Result<AsyncDownload> {
        let route = self.register()?;
        let req = FileRead {
            path: path_bytes(path),
            offset,
            limit,
        };
        self.send_message(route.id, &req, self.call_deadline())
            .await?;
        Ok(AsyncDownload {
            client: self.clone(),
            route,
            state: Download::new(limit, cap),
            done: None,
        })
    }

    /// Streams the file at `path` into `dst`; returns the bytes read.
    pub async fn download<W: AsyncWrite + Unpin + ?Sized>(
        &self,
        path: impl AsRef<Path>,
        dst: &mut W,
    ) -> Result<u64> {
        self.open_download(path, 0, None).await?.copy_to(dst).await
    }

    /// Reads a whole file (at most [`crate::Limits::max_read_file`] bytes).
    pub async fn read_file(&self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let cap = Some(self.inner.config.limits.max_read_file);
        let mut d = self
            .open_download_capped(path.as_ref(), 0, None, cap)
            .await?;
        let mut v = Vec::new();
        while let Some(c) = d.next_chunk().await? {
            v.extend_from_slice(&c);
        }
        Ok(v)
    }

    /// stat(2) (symlinks followed).
    pub async fn stat(&self, path: impl AsRef<Path>) -> Result<FileStat> {
        self.call_path(Kind::Stat, path.as_ref(), false)
            .await?
            .expect()
    }

    /// lstat(2) (a final symlink is described itself).
    pub async fn lstat(&self, path: impl AsRef<Path>) -> Result<FileStat> {
        self.call_path(Kind::Stat, path.as_ref(), true)
            .await?
            .expect()
    }

    /// Lists a directory (without `.` and `..`), in directory order; each
    /// part must come within the call timeout.
    pub async fn list_dir(&self, path: impl AsRef<Path>) -> Result<Vec<DirEntry>> {
        let mut route = self.register()?;
        let req = session::path_request(Kind::ListDir, route.id, path.as_ref(), false);
        self.send(req, self.call_deadline()).await?;
        let mut listing = Listing::new(&self.inner.config.limits);
        loop {
            let f = self.recv(&mut route, Some(self.call_deadline())).await?;
            if let Some(all) = listing.on_frame(f)? {
                return Ok(all);
            }
        }
    }

    /// mkdir(2), or `mkdir -p` with `parents`.
    pub async fn mkdir(&self, path: impl AsRef<Path>, mode: u32, parents: bool) -> Result<()> {
        self.call(&MkdirRequest {
            path: path_bytes(path.as_ref()),
            mode,
            parents,
        })
        .await?
        .expect_ok()
    }

    /// Removes a file, symlink or empty directory (any tree with
    /// `recursive`).
    pub async fn remove(&self, path: impl AsRef<Path>, recursive: bool) -> Result<()> {
        self.call(&RemoveRequest {
            path: path_bytes(path.as_ref()),
            recursive,
        })
        .await?
        .expect_ok()
    }

    /// rename(2).
    pub async fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        self.call(&RenameRequest {
            from: path_bytes(from.as_ref()),
            to: path_bytes(to.as_ref()),
        })
        .await?
        .expect_ok()
    }

    /// chmod(2).
    pub async fn chmod(&self, path: impl AsRef<Path>, mode: u32) -> Result<()> {
        self.call(&ChmodRequest {
            path: path_bytes(path.as_ref()),
            mode,
        })
        .await?
        .expect_ok()
    }

    // -------------------------------------------------------------- system

    /// Liveness and counters.
    pub async fn health(&self) -> Result<HealthReply> {
        self.call_empty(Kind::Health).await?.expect()
    }

    /// Protocol and agent version.
    pub async fn version(&self) -> Result<VersionReply> {
        self.call_empty(Kind::Version).await?.expect()
    }

    /// After a snapshot restore: reseed the guest RNG with `entropy` and
    /// set its clock to `unix_time_ns` (0: leave the clock).
    pub async fn post_restore(
        &self,
        entropy: [u8; 64],
        unix_time_ns: u64,
    ) -> Result<PostRestoreReply> {
        self.call(&PostRestore {
            entropy,
            unix_time_ns,
        })
        .await?
        .expect()
    }

    /// Configures the guest's network interface (after `post_restore`, on
    /// the first connection after a restore of a networked sandbox): MAC,
    /// IPv4 address, default route, MTU and resolv.conf; a second call
    /// replaces the first. A host-mode agent refuses (`Io`, EPERM).
    pub async fn net_configure(&self, req: &NetConfigure) -> Result<NetConfigured> {
        self.call(req).await?.expect()
    }

    /// Powers the guest off (a host-mode agent exits). The connection
    /// closing instead of the `Ok` (the VM went down first) counts as
    /// success.
    pub async fn poweroff(&self) -> Result<()> {
        self.power(PowerAction::Poweroff).await
    }

    /// Reboots the guest (a host-mode agent exits); as
    /// [`AsyncClient::poweroff`].
    pub async fn reboot(&self) -> Result<()> {
        self.power(PowerAction::Reboot).await
    }

    async fn power(&self, action: PowerAction) -> Result<()> {
        match self.call(&PowerRequest { action }).await {
            Ok(f) => f.expect_ok(),
            Err(ClientError::Disconnected) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
