//! The operations of the blocking client: exec, files, system.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::mpsc::TryRecvError;

use agent_proto::{
    AttachRequest, ChmodRequest, DirEntry, ExecRequest, FileRead, FileStat, Header, HealthReply,
    Kind, Message, MkdirRequest, NetConfigure, NetConfigured, PostRestore, PostRestoreReply,
    PowerAction, PowerRequest, RemoveRequest, RenameRequest, SignalRequest, VersionReply,
    HEADER_LEN, MAX_PAYLOAD,
};

use super::{Client, ExecHandle};
use crate::error::{ClientError, Result};
use crate::session::{
    self, exec_started, path_bytes, Download, DownloadStep, ExecOutput, ExecStream, Frame, Listing,
    UploadOptions,
};

impl Client {
    /// Sends a control request and returns the first answer frame.
    fn call<M: Message>(&self, m: &M) -> Result<Frame> {
        let route = self.register()?;
        self.send_message(route.id, m)?;
        self.recv(&route.rx, true)
    }

    fn call_empty(&self, kind: Kind) -> Result<Frame> {
        let route = self.register()?;
        self.send_empty(kind, route.id)?;
        self.recv(&route.rx, true)
    }

    fn call_path(&self, kind: Kind, path: &Path, nofollow: bool) -> Result<Frame> {
        let route = self.register()?;
        self.send_raw(&session::path_request(kind, route.id, path, nofollow))?;
        self.recv(&route.rx, true)
    }

    // ---------------------------------------------------------------- exec

    /// Starts a command; the handle streams its output and result.
    pub fn exec(&self, req: &ExecRequest) -> Result<ExecHandle> {
        self.start(|id| self.send_message(id, req))
    }

    /// Runs a command to completion and collects its output (at most
    /// [`crate::Limits::max_collected_output`] bytes).
    pub fn exec_simple(&self, req: &ExecRequest) -> Result<ExecOutput> {
        self.exec(req)?.wait()
    }

    /// Re-attaches to an exec by id (e.g. from a new connection after the
    /// old one was lost): the output kept since is delivered first.
    pub fn attach(&self, exec_id: u64) -> Result<ExecHandle> {
        self.start(|id| self.send_message(id, &AttachRequest { exec_id }))
    }

    fn start(&self, send: impl FnOnce(u32) -> Result<()>) -> Result<ExecHandle> {
        let route = self.register()?;
        send(route.id)?;
        let started = exec_started(self.recv(&route.rx, true)?)?;
        // Hand the route over to the handle (it unregisters on drop).
        let id = route.id;
        let rx = route.keep();
        Ok(ExecHandle {
            client: self.clone(),
            id,
            exec_id: started.exec_id,
            pid: started.pid,
            rx,
            stream: ExecStream::default(),
        })
    }

    /// Sends `signal` to a running exec (its process group with `group`).
    pub fn signal(&self, exec_id: u64, signal: i32, group: bool) -> Result<()> {
        self.call(&SignalRequest {
            exec_id,
            signal,
            group,
        })?
        .expect_ok()
    }

    // --------------------------------------------------------------- files

    /// Streams `src` into the file at `path` (created or truncated);
    /// returns the bytes written.
    pub fn upload(
        &self,
        src: &mut dyn Read,
        path: impl AsRef<Path>,
        opts: UploadOptions,
    ) -> Result<u64> {
        let route = self.register()?;
        self.send_raw(&session::upload_open(route.id, path.as_ref(), opts))?;
        let mut buf = vec![0u8; HEADER_LEN + MAX_PAYLOAD];
        let mut sent = 0u64;
        loop {
            // Fill a whole frame unless the source ends.
            let mut n = 0;
            while n < MAX_PAYLOAD {
                let dst = buf.get_mut(HEADER_LEN + n..).unwrap_or_default();
                match src.read(dst) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if n == 0 {
                break;
            }
            let hdr = Header {
                len: u32::try_from(n).map_err(|_| ClientError::Protocol("chunk size".into()))?,
                kind: Kind::FileData as u8,
                id: route.id,
            };
            let frame = buf.get_mut(..HEADER_LEN + n).unwrap_or_default();
            if let Some(h) = frame.get_mut(..HEADER_LEN) {
                h.copy_from_slice(&hdr.encode());
            }
            self.send_raw(frame)?;
            sent += u64::from(hdr.len);
            // An early error (e.g. the open failed) ends the upload.
            match route.rx.try_recv() {
                Ok(f) => return Err(session::early_upload_reply(f)),
                Err(TryRecvError::Disconnected) => return Err(self.ended()),
                Err(TryRecvError::Empty) => {}
            }
            if n < MAX_PAYLOAD {
                break;
            }
        }
        self.send_empty(Kind::FileEnd, route.id)?;
        session::upload_done(self.recv(&route.rx, false)?, sent)
    }

    /// Uploads a byte slice.
    pub fn write_file(&self, path: impl AsRef<Path>, data: &[u8], mode: u32) -> Result<u64> {
        let opts = UploadOptions {
            mode,
            ..UploadOptions::default()
        };
        self.upload(&mut &data[..], path, opts)
    }

    /// Streams the file at `path` into `dst`; returns the bytes read.
    pub fn download(&self, path: impl AsRef<Path>, dst: &mut dyn Write) -> Result<u64> {
        self.download_range(path, 0, None, dst)
    }

    /// Streams at most `limit` bytes from `offset` of the file into `dst`.
    pub fn download_range(
        &self,
        path: impl AsRef<Path>,
        offset: u64,
        limit: Option<u64>,
        dst: &mut dyn Write,
    ) -> Result<u64> {
        self.download_capped(path.as_ref(), offset, limit, None, dst)
    }

    fn download_capped(
        &self,
        path: &Path,
        offset: u64,
        limit: Option<u64>,
        cap: Option<usize>,
        dst: &mut dyn Write,
    ) -> Result<u64> {
        let route = self.register()?;
        self.send_message(
            route.id,
            &FileRead {
                path: path_bytes(path),
                offset,
                limit,
            },
        )?;
        let mut d = Download::new(limit, cap);
        loop {
            match d.on_frame(self.recv(&route.rx, false)?)? {
                DownloadStep::Chunk(c) => dst.write_all(&c)?,
                DownloadStep::Done(total) => return Ok(total),
            }
        }
    }

    /// Reads a whole file (at most [`crate::Limits::max_read_file`] bytes).
    pub fn read_file(&self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        let cap = Some(self.inner.limits.max_read_file);
        self.download_capped(path.as_ref(), 0, None, cap, &mut v)?;
        Ok(v)
    }

    /// stat(2) (symlinks followed).
    pub fn stat(&self, path: impl AsRef<Path>) -> Result<FileStat> {
        self.call_path(Kind::Stat, path.as_ref(), false)?.expect()
    }

    /// lstat(2) (a final symlink is described itself).
    pub fn lstat(&self, path: impl AsRef<Path>) -> Result<FileStat> {
        self.call_path(Kind::Stat, path.as_ref(), true)?.expect()
    }

    /// Lists a directory (without `.` and `..`), in directory order.
    pub fn list_dir(&self, path: impl AsRef<Path>) -> Result<Vec<DirEntry>> {
        let route = self.register()?;
        self.send_raw(&session::path_request(
            Kind::ListDir,
            route.id,
            path.as_ref(),
            false,
        ))?;
        let mut listing = Listing::new(&self.inner.limits);
        loop {
            if let Some(all) = listing.on_frame(self.recv(&route.rx, true)?)? {
                return Ok(all);
            }
        }
    }

    /// mkdir(2), or `mkdir -p` with `parents`.
    pub fn mkdir(&self, path: impl AsRef<Path>, mode: u32, parents: bool) -> Result<()> {
        self.call(&MkdirRequest {
            path: path_bytes(path.as_ref()),
            mode,
            parents,
        })?
        .expect_ok()
    }

    /// Removes a file, symlink or empty directory (any tree with
    /// `recursive`).
    pub fn remove(&self, path: impl AsRef<Path>, recursive: bool) -> Result<()> {
        self.call(&RemoveRequest {
            path: path_bytes(path.as_ref()),
            recursive,
        })?
        .expect_ok()
    }

    /// rename(2).
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        self.call(&RenameRequest {
            from: path_bytes(from.as_ref()),
            to: path_bytes(to.as_ref()),
        })?
        .expect_ok()
    }

    /// chmod(2).
    pub fn chmod(&self, path: impl AsRef<Path>, mode: u32) -> Result<()> {
        self.call(&ChmodRequest {
            path: path_bytes(path.as_ref()),
            mode,
        })?
        .expect_ok()
    }

    // -------------------------------------------------------------- system

    /// Liveness and counters.
    pub fn health(&self) -> Result<HealthReply> {
        self.call_empty(Kind::Health)?.expect()
    }

    /// Protocol and agent version.
    pub fn version(&self) -> Result<VersionReply> {
        self.call_empty(Kind::Version)?.expect()
    }

    /// After a snapshot restore: reseed the guest RNG with `entropy` and
    /// set its clock to `unix_time_ns` (0: leave the clock).
    pub fn post_restore(&self, entropy: [u8; 64], unix_time_ns: u64) -> Result<PostRestoreReply> {
        self.call(&PostRestore {
            entropy,
            unix_time_ns,
        })?
        .expect()
    }

    /// Configures the guest's network interface (after `post_restore`, on
    /// the first connection after a restore of a networked sandbox): MAC,
    /// IPv4 address, default route, MTU and resolv.conf; a second call
    /// replaces the first. A host-mode agent refuses (`Io`, EPERM).
    pub fn net_configure(&self, req: &NetConfigure) -> Result<NetConfigured> {
        self.call(req)?.expect()
    }

    /// Powers the guest off (a host-mode agent exits). The connection
    /// closing instead of the `Ok` (the VM went down first) counts as
    /// success.
    pub fn poweroff(&self) -> Result<()> {
        self.power(PowerAction::Poweroff)
    }

    /// Reboots the guest (a host-mode agent exits); as [`Client::poweroff`].
    pub fn reboot(&self) -> Result<()> {
        self.power(PowerAction::Reboot)
    }

    fn power(&self, action: PowerAction) -> Result<()> {
        match self.call(&PowerRequest { action }) {
            Ok(f) => f.expect_ok(),
            Err(ClientError::Disconnected) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
