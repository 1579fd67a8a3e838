//! Exec (one-shot JSON, or streamed newline-delimited JSON events) and
//! files (streamed upload and download, stat, list, remove, mkdir,
//! rename) through the
//! sandbox's agent, over its one tokio connection (no thread per request
//! or per stream), always under a deadline.

use super::lifecycle::ensure_running;
use super::ops::agent;
use super::{exec_defaults, within, ApiError, ApiResult, Daemon};
use agent_client::{
    AsyncClient, AsyncDownload, AsyncExecHandle, ClientError, ExecEvent, ExecRequest, ExitStatus,
    FileStat, FileType, UploadOptions,
};
use api::Encoding;
use axum::body::{Body, Bytes};
use shoal_api as api;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Default limit on a command's run time (s).
pub const DEFAULT_EXEC_TIMEOUT_S: f64 = 300.0;

/// An exec request made the agent's: the request, its initial stdin and
/// its timeout.
pub(crate) struct Prepared {
    pub(crate) req: ExecRequest,
    pub(crate) stdin: Option<Vec<u8>>,
    pub(crate) timeout: Duration,
    /// Run on a new terminal of (cols, rows).
    pub(crate) pty: Option<(u16, u16)>,
}

/// The agent's request for `b` in a sandbox whose environment is `env`
/// (`stdin_open` only for a background command).
pub(crate) fn prepare(
    env: &BTreeMap<String, String>,
    b: api::ExecRequest,
    background: bool,
) -> ApiResult<Prepared> {
    if b.stdin_open && !background {
        return Err(ApiError::BadRequest(
            "'stdin_open' is for background commands (POST /v1/sandboxes/{id}/commands)".into(),
        ));
    }
    let stdin_open = b.stdin_open;
    let mut req = match (b.cmd, b.shell) {
        (Some(c), None) if !c.is_empty() && !c[0].is_empty() => ExecRequest::argv(c),
        (None, Some(s)) => ExecRequest::shell(s),
        (Some(_), None) => return Err(ApiError::BadRequest("'cmd' is empty".into())),
        _ => {
            return Err(ApiError::BadRequest(
                "give exactly one of 'cmd' (argv array) or 'shell' (script)".into(),
            ))
        }
    };
    for (k, v) in env.iter().chain(b.env.iter()) {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(ApiError::BadRequest(format!("bad environment name {k:?}")));
        }
        req = req.with_env(k, v);
    }
    if let Some(c) = &b.cwd {
        req = req.with_cwd(c);
    }
    let t = b.timeout_s.unwrap_or(DEFAULT_EXEC_TIMEOUT_S);
    if !(t > 0.0 && t <= 86_400.0) {
        return Err(ApiError::BadRequest(format!(
            "timeout_s {t}: expected 0 < timeout_s <= 86400"
        )));
    }
    let timeout = Duration::from_secs_f64(t);
    req = req.with_timeout(timeout);
    let stdin = match (b.stdin, b.stdin_b64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::BadRequest(
                "give 'stdin' or 'stdin_b64', not both".into(),
            ))
        }
        (Some(s), None) => Some(s.into_bytes()),
        (None, Some(s)) => Some(
            Encoding::Base64
                .decode(&s)
                .map_err(|e| ApiError::BadRequest(format!("stdin_b64: {e}")))?,
        ),
        (None, None) => None,
    };
    if stdin.is_some() || stdin_open {
        req = req.with_stdin();
    }
    Ok(Prepared {
        req,
        stdin,
        timeout,
        pty: None,
    })
}

/// [`prepare`] for sandbox `row`, with its image's exec defaults when it
/// is a container sandbox ([`crate::exec_defaults`]).
pub(crate) async fn prepare_for(
    d: &Daemon,
    row: &crate::db::SandboxRow,
    b: api::ExecRequest,
    background: bool,
    c: &AsyncClient,
) -> ApiResult<Prepared> {
    let Some(cfg) = exec_defaults::config(d, row).await? else {
        return prepare(&row.env, b, background);
    };
    let b = exec_defaults::default_command(&cfg, b)?;
    let mut p = prepare(&row.env, b, background)?;
    exec_defaults::apply(d, &cfg, &mut p.req, c).await?;
    Ok(p)
}

async fn feed(h: &AsyncExecHandle, stdin: Option<Vec<u8>>) -> Result<(), ClientError> {
    if let Some(data) = stdin {
        write_all(h, &data).await?;
        h.close_stdin().await?;
    }
    Ok(())
}

/// Writes `data` to an exec's stdin in frames of at most 256 KiB.
pub(crate) async fn write_all(h: &AsyncExecHandle, data: &[u8]) -> Result<(), ClientError> {
    for c in data.chunks(256 * 1024) {
        h.write_stdin(c).await?;
    }
    Ok(())
}

pub(crate) fn status_fields(s: ExitStatus) -> (Option<i32>, Option<i32>) {
    match s {
        ExitStatus::Exited(c) => (Some(c), None),
        ExitStatus::Signaled(s) => (None, Some(s)),
    }
}

/// Output of one stream (a one-shot exec's, a FnCall's), kept up to a
/// limit; the rest is read (the command goes on to its exit) and dropped.
pub(crate) struct Capped {
    pub(crate) bytes: Vec<u8>,
    limit: usize,
    pub(crate) truncated: bool,
}

impl Capped {
    pub(crate) fn new(limit: usize) -> Capped {
        Capped {
            bytes: Vec::new(),
            limit,
            truncated: false,
        }
    }

    pub(crate) fn push(&mut self, x: &[u8]) {
        let room = self.limit.saturating_sub(self.bytes.len());
        if x.len() > room {
            self.truncated = true;
        }
        self.bytes
            .extend_from_slice(x.get(..room.min(x.len())).unwrap_or_default());
    }

    /// What was kept, as (lossy) UTF-8.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// One-shot exec: waits for the exit and returns the output, at most
/// [`crate::agent_limits::AgentLimits::exec_output_limit`] bytes per stream
/// (the result says which were truncated).
pub async fn exec(d: &Arc<Daemon>, id: &str, b: api::ExecRequest) -> ApiResult<api::ExecResult> {
    let t0 = Instant::now();
    let (row, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    let p = prepare_for(d, &row, b, false, &c).await?;
    let limit = d.cfg.agent.exec_output_limit;
    let work = async {
        let mut h = c.exec(&p.req).await?;
        // The request's own deadline below governs (same error as before).
        h.set_deadline(None);
        feed(&h, p.stdin).await?;
        let (mut out, mut err) = (Capped::new(limit), Capped::new(limit));
        loop {
            match h.next_event().await? {
                Some(ExecEvent::Stdout(x)) => out.push(&x),
                Some(ExecEvent::Stderr(x)) => err.push(&x),
                Some(ExecEvent::Exit(r)) => return Ok((out, err, r)),
                None => {
                    return Err(ApiError::Sandbox(
                        "the sandbox ended the command's stream early".into(),
                    ))
                }
            }
        }
    };
    let out = within("exec", p.timeout + d.cfg.agent.exec_slack, work).await;
    let (out, err, r) = out?;
    let (exit_code, signal) = status_fields(r.status);
    let encoding = match (
        Encoding::encode(&out.bytes).1,
        Encoding::encode(&err.bytes).1,
    ) {
        (Encoding::Utf8, Encoding::Utf8) => Encoding::Utf8,
        _ => Encoding::Base64,
    };
    let secs = t0.elapsed().as_secs_f64();
    d.metrics.exec.observe(secs);
    Ok(api::ExecResult {
        exit_code,
        signal,
        timed_out: r.timed_out,
        stdout: encoding.encode_as(&out.bytes),
        stderr: encoding.encode_as(&err.bytes),
        encoding,
        truncated: out.truncated || err.truncated,
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        duration_ms: secs * 1e3,
    })
}

pub(crate) fn line(e: api::ExecEvent) -> Bytes {
    Bytes::from(e.to_line())
}

pub(crate) fn error_line(message: impl Into<String>) -> Bytes {
    line(api::ExecEvent::Error {
        message: message.into(),
    })
}

/// Runs a streamed exec into `tx`, noting its id in `started`. Returns
/// whether the command must be killed (its client left or stopped
/// reading).
async fn stream_exec(
    c: &AsyncClient,
    p: Prepared,
    tx: &mpsc::Sender<Bytes>,
    d: &Daemon,
    t0: Instant,
    stall: Duration,
    started: &std::sync::Mutex<Option<u64>>,
) -> bool {
    // A client that takes no event for `stall` is gone as far as the
    // sandbox is concerned: its stream must not hold the agent connection.
    let send = |b: Bytes| async move {
        matches!(tokio::time::timeout(stall, tx.send(b)).await, Ok(Ok(())))
    };
    let mut h = match c.exec(&p.req).await {
        Ok(h) => h,
        Err(e) => {
            send(error_line(e.to_string())).await;
            return false;
        }
    };
    let exec_id = h.exec_id();
    *started.lock().unwrap_or_else(|e| e.into_inner()) = Some(exec_id);
    // The stream's own deadline governs.
    h.set_deadline(None);
    if !send(line(api::ExecEvent::Start {
        pid: h.pid(),
        exec_id,
    }))
    .await
    {
        return true;
    }
    if let Err(e) = feed(&h, p.stdin).await {
        send(error_line(e.to_string())).await;
        return false;
    }
    loop {
        let ok = match h.next_event().await {
            Ok(Some(ExecEvent::Stdout(x))) => send(line(api::ExecEvent::stdout(&x))).await,
            Ok(Some(ExecEvent::Stderr(x))) => send(line(api::ExecEvent::stderr(&x))).await,
            Ok(Some(ExecEvent::Exit(r))) => {
                let (code, sig) = status_fields(r.status);
                d.metrics.exec.observe(t0.elapsed().as_secs_f64());
                send(line(api::ExecEvent::Exit {
                    exit_code: code,
                    signal: sig,
                    timed_out: r.timed_out,
                }))
                .await;
                return false;
            }
            Ok(None) => return false,
            Err(e) => {
                send(error_line(format!("sandbox agent: {e}"))).await;
                return false;
            }
        };
        if !ok {
            // The client went away: end the command.
            return true;
        }
    }
}

/// Streamed exec: newline-delimited JSON events (`start`, `stdout`,
/// `stderr`, then `exit` or `error`).
pub async fn exec_stream(d: &Arc<Daemon>, id: &str, b: api::ExecRequest) -> ApiResult<Body> {
    let t0 = Instant::now();
    let (row, live, busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    let p = prepare_for(d, &row, b, false, &c).await?;
    let deadline = tokio::time::Instant::now() + p.timeout + d.cfg.agent.exec_slack;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let d2 = d.clone();
    let agent_limits = d.cfg.agent;
    // Ends with the exec, when its HTTP client leaves or stops reading, or
    // at the deadline (a second after the body's, which says why): never
    // later, whatever the guest does, and with it the agent route and the
    // sandbox's busy mark.
    tokio::spawn(async move {
        let _busy = busy;
        let started = std::sync::Mutex::new(None);
        let run = stream_exec(&c, p, &tx, &d2, t0, agent_limits.stall_timeout, &started);
        let end = deadline + Duration::from_secs(1);
        let kill = tokio::select! {
            kill = run => kill,
            () = tx.closed() => true,
            () = tokio::time::sleep_until(end) => true,
        };
        // Gone, stalled or past its deadline: end the command, within a
        // call's deadline (a silent guest does not hold the task).
        let exec_id = *started.lock().unwrap_or_else(|e| e.into_inner());
        if let (true, Some(exec_id)) = (kill, exec_id) {
            let signal = c.signal(exec_id, libc::SIGKILL, true);
            let _ = tokio::time::timeout(agent_limits.call_timeout, signal).await;
        }
    });
    let stream = futures_util::stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(b)) => Some((Ok::<_, std::convert::Infallible>(b), Some(rx))),
            Ok(None) => None,
            Err(_) => Some((
                Ok(error_line(
                    "deadline exceeded: the sandbox did not finish the command",
                )),
                None,
            )),
        }
    });
    Ok(Body::from_stream(stream))
}

fn file_type(t: FileType) -> api::FileType {
    match t {
        FileType::File => api::FileType::File,
        FileType::Dir => api::FileType::Dir,
        FileType::Symlink => api::FileType::Symlink,
        FileType::Other => api::FileType::Other,
    }
}

fn stat_view(s: FileStat) -> api::FileStat {
    api::FileStat {
        r#type: file_type(s.file_type),
        mode: s.mode,
        size: s.size,
        mtime_ns: s.mtime_ns,
    }
}

pub(crate) fn check_path(p: &str) -> ApiResult<()> {
    if !p.starts_with('/') || p.contains('\0') {
        return Err(ApiError::BadRequest(format!(
            "path {p:?}: give an absolute guest path (?path=/...)"
        )));
    }
    Ok(())
}

/// `stat`.
pub async fn stat(d: &Arc<Daemon>, id: &str, path: String) -> ApiResult<api::FileStat> {
    check_path(&path)?;
    let (_, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    within("stat", d.cfg.agent.file_op_timeout, async {
        Ok(stat_view(c.stat(&path).await?))
    })
    .await
}

/// Directory listing.
pub async fn list(d: &Arc<Daemon>, id: &str, path: String) -> ApiResult<Vec<api::DirEntry>> {
    check_path(&path)?;
    let (_, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    within("list", d.cfg.agent.file_op_timeout, async {
        let mut v: Vec<api::DirEntry> = c
            .list_dir(&path)
            .await?
            .into_iter()
            .map(|e| api::DirEntry {
                name: String::from_utf8_lossy(&e.name).into_owned(),
                r#type: file_type(e.file_type),
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    })
    .await
}

/// Removes a file (or a tree with `recursive`).
pub async fn remove(d: &Arc<Daemon>, id: &str, path: String, recursive: bool) -> ApiResult<()> {
    check_path(&path)?;
    let (_, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    within("remove", d.cfg.agent.file_op_timeout, async {
        Ok(c.remove(&path, recursive).await?)
    })
    .await
}

/// mkdir(2) (`mkdir -p` with `parents`).
pub async fn mkdir(
    d: &Arc<Daemon>,
    id: &str,
    path: String,
    mode: u32,
    parents: bool,
) -> ApiResult<()> {
    check_path(&path)?;
    let (_, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    within("mkdir", d.cfg.agent.file_op_timeout, async {
        Ok(c.mkdir(&path, mode, parents).await?)
    })
    .await
}

/// rename(2).
pub async fn rename(d: &Arc<Daemon>, id: &str, from: String, to: String) -> ApiResult<()> {
    check_path(&from)?;
    check_path(&to)?;
    let (_, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    within("rename", d.cfg.agent.file_op_timeout, async {
        Ok(c.rename(&from, &to).await?)
    })
    .await
}

/// Streams `body` into a guest file; returns the bytes written.
pub async fn upload(
    d: &Arc<Daemon>,
    id: &str,
    path: String,
    opts: UploadOptions,
    body: Body,
) -> ApiResult<u64> {
    use futures_util::StreamExt;
    check_path(&path)?;
    let (_, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    let work = async {
        let mut up = c.open_upload(&path, opts).await?;
        let mut s = body.into_data_stream();
        while let Some(chunk) = s.next().await {
            let chunk = chunk.map_err(|e| {
                ClientError::Io(std::io::Error::other(format!("request body: {e}")))
            })?;
            up.write(&chunk).await?;
        }
        Ok(up.finish().await?)
    };
    within("upload", Duration::from_secs(3600), work).await
}

/// Where a download's body stream is.
enum Download {
    /// Not asked of the agent yet.
    Opening(AsyncClient, String, u64),
    /// Chunks coming.
    Open(AsyncDownload),
    /// Ended by an error.
    Done,
}

fn download_error(e: ClientError) -> std::io::Error {
    match e {
        ClientError::Timeout => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the sandbox stopped sending the file",
        ),
        e => std::io::Error::other(e),
    }
}

/// Streams a guest file out: its size and the body.
pub async fn download(d: &Arc<Daemon>, id: &str, path: String) -> ApiResult<(u64, Body)> {
    check_path(&path)?;
    let st = stat(d, id, path.clone()).await?;
    if st.r#type != api::FileType::File {
        return Err(ApiError::BadRequest(format!(
            "{path} is a {}, not a file",
            st.r#type
        )));
    }
    let (_, live, busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    // Opened when the body is first polled; each chunk within the client's
    // call timeout, and no more bytes than the size the body was announced
    // with (a guest that sends more, or never ends, ends the body with an
    // error). An error after the status went out ends the body with that
    // error, as before.
    let first = Download::Opening(c, path, st.size);
    let stream = futures_util::stream::unfold((first, busy), |(state, busy)| async move {
        let mut dl = match state {
            Download::Done => return None,
            Download::Open(dl) => dl,
            Download::Opening(c, path, size) => match c.open_download(&path, 0, Some(size)).await {
                Ok(dl) => dl,
                Err(e) => return Some((Err(download_error(e)), (Download::Done, busy))),
            },
        };
        match dl.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(Bytes::from(chunk)), (Download::Open(dl), busy))),
            Ok(None) => None,
            Err(e) => Some((Err(download_error(e)), (Download::Done, busy))),
        }
    });
    Ok((st.size, Body::from_stream(stream)))
}
