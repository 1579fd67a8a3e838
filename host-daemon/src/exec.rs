//! Exec (one-shot JSON, or streamed newline-delimited JSON events) and
//! files (streamed upload and download, stat, list, remove) through the
//! sandbox's agent. The agent client is blocking: each call runs on the
//! blocking pool or its own thread, always under a deadline.

use super::ops::{agent, ensure_running};
use super::{blocking, ApiError, ApiResult, Daemon};
use api::Encoding;
use axum::body::{Body, Bytes};
use guest_agent::client::{
    ExecEvent, ExecHandle, ExecRequest, ExitStatus, FileStat, FileType, UploadOptions,
};
use shoal_api as api;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Default limit on a command's run time (s).
pub const DEFAULT_EXEC_TIMEOUT_S: f64 = 300.0;
/// Most output a one-shot exec returns per stream.
pub const ONESHOT_OUTPUT_LIMIT: usize = 16 << 20;

struct Prepared {
    req: ExecRequest,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
}

fn prepare(env: &BTreeMap<String, String>, b: api::ExecRequest) -> ApiResult<Prepared> {
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
    if stdin.is_some() {
        req = req.with_stdin();
    }
    Ok(Prepared {
        req,
        stdin,
        timeout,
    })
}

fn feed(h: &ExecHandle, stdin: Option<Vec<u8>>) -> Result<(), guest_agent::client::ClientError> {
    if let Some(data) = stdin {
        for c in data.chunks(256 * 1024) {
            h.write_stdin(c)?;
        }
        h.close_stdin()?;
    }
    Ok(())
}

fn status_fields(s: ExitStatus) -> (Option<i32>, Option<i32>) {
    match s {
        ExitStatus::Exited(c) => (Some(c), None),
        ExitStatus::Signaled(s) => (None, Some(s)),
    }
}

/// Slack over the command's own timeout before the daemon gives up on a
/// stuck guest.
const SLACK: Duration = Duration::from_secs(30);

/// One-shot exec: waits for the exit and returns all output.
pub async fn exec(d: &Arc<Daemon>, id: &str, b: api::ExecRequest) -> ApiResult<api::ExecResult> {
    let t0 = Instant::now();
    let (row, live, _busy) = ensure_running(d, id).await?;
    let p = prepare(&row.env, b)?;
    let c = agent(d, &live).await?;
    let out = blocking("exec", p.timeout + SLACK, move || {
        let mut h = c.exec(&p.req)?;
        feed(&h, p.stdin)?;
        let (mut out, mut err, mut truncated) = (Vec::new(), Vec::new(), false);
        loop {
            match h.next_event()? {
                Some(ExecEvent::Stdout(x)) | Some(ExecEvent::Stderr(x))
                    if out.len() + err.len() + x.len() > 2 * ONESHOT_OUTPUT_LIMIT =>
                {
                    truncated = true;
                }
                Some(ExecEvent::Stdout(x)) => out.extend_from_slice(&x),
                Some(ExecEvent::Stderr(x)) => err.extend_from_slice(&x),
                Some(ExecEvent::Exit(r)) => return Ok((out, err, r, truncated)),
                None => {
                    return Err(ApiError::Sandbox(
                        "the sandbox ended the command's stream early".into(),
                    ))
                }
            }
        }
    })
    .await;
    let (out, err, r, truncated) = out?;
    let (exit_code, signal) = status_fields(r.status);
    let encoding = match (Encoding::encode(&out).1, Encoding::encode(&err).1) {
        (Encoding::Utf8, Encoding::Utf8) => Encoding::Utf8,
        _ => Encoding::Base64,
    };
    let secs = t0.elapsed().as_secs_f64();
    d.metrics.exec.observe(secs);
    Ok(api::ExecResult {
        exit_code,
        signal,
        timed_out: r.timed_out,
        stdout: encoding.encode_as(&out),
        stderr: encoding.encode_as(&err),
        encoding,
        truncated,
        duration_ms: secs * 1e3,
    })
}

fn line(e: api::ExecEvent) -> Bytes {
    Bytes::from(e.to_line())
}

fn error_line(message: impl Into<String>) -> Bytes {
    line(api::ExecEvent::Error {
        message: message.into(),
    })
}

/// Streamed exec: newline-delimited JSON events (`start`, `stdout`,
/// `stderr`, then `exit` or `error`).
pub async fn exec_stream(d: &Arc<Daemon>, id: &str, b: api::ExecRequest) -> ApiResult<Body> {
    let t0 = Instant::now();
    let (row, live, busy) = ensure_running(d, id).await?;
    let p = prepare(&row.env, b)?;
    let c = agent(d, &live).await?;
    let deadline = tokio::time::Instant::now() + p.timeout + SLACK;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let d2 = d.clone();
    std::thread::Builder::new()
        .name("exec-stream".into())
        .spawn(move || {
            let _busy = busy;
            let send = |b: Bytes| tx.blocking_send(b).is_ok();
            let mut h = match c.exec(&p.req) {
                Ok(h) => h,
                Err(e) => {
                    send(error_line(e.to_string()));
                    return;
                }
            };
            send(line(api::ExecEvent::Start {
                pid: h.pid(),
                exec_id: h.exec_id(),
            }));
            if let Err(e) = feed(&h, p.stdin) {
                send(error_line(e.to_string()));
                return;
            }
            loop {
                let ok = match h.next_event() {
                    Ok(Some(ExecEvent::Stdout(x))) => send(line(api::ExecEvent::stdout(&x))),
                    Ok(Some(ExecEvent::Stderr(x))) => send(line(api::ExecEvent::stderr(&x))),
                    Ok(Some(ExecEvent::Exit(r))) => {
                        let (code, sig) = status_fields(r.status);
                        d2.metrics.exec.observe(t0.elapsed().as_secs_f64());
                        send(line(api::ExecEvent::Exit {
                            exit_code: code,
                            signal: sig,
                            timed_out: r.timed_out,
                        }));
                        return;
                    }
                    Ok(None) => return,
                    Err(e) => {
                        send(error_line(format!("sandbox agent: {e}")));
                        return;
                    }
                };
                if !ok {
                    // The client went away: end the command.
                    let _ = h.signal(libc::SIGKILL, true);
                    return;
                }
            }
        })
        .map_err(ApiError::Thread)?;
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

fn check_path(p: &str) -> ApiResult<()> {
    if !p.starts_with('/') || p.contains('\0') {
        return Err(ApiError::BadRequest(format!(
            "path {p:?}: give an absolute guest path (?path=/...)"
        )));
    }
    Ok(())
}

const FILE_OP: Duration = Duration::from_secs(120);

/// `stat`.
pub async fn stat(d: &Arc<Daemon>, id: &str, path: String) -> ApiResult<api::FileStat> {
    check_path(&path)?;
    let (_, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    blocking("stat", FILE_OP, move || Ok(stat_view(c.stat(&path)?))).await
}

/// Directory listing.
pub async fn list(d: &Arc<Daemon>, id: &str, path: String) -> ApiResult<Vec<api::DirEntry>> {
    check_path(&path)?;
    let (_, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    blocking("list", FILE_OP, move || {
        let mut v: Vec<api::DirEntry> = c
            .list_dir(&path)?
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
    blocking("remove", FILE_OP, move || Ok(c.remove(&path, recursive)?)).await
}

/// Reads from a channel of body chunks (the blocking side of an upload).
struct ChanReader {
    rx: mpsc::Receiver<Result<Bytes, String>>,
    cur: Bytes,
}

impl Read for ChanReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        self.cur = self.cur.slice(n..);
        Ok(n)
    }
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
    let (tx, rx) = mpsc::channel(16);
    let pump = tokio::spawn(async move {
        let mut s = body.into_data_stream();
        while let Some(chunk) = s.next().await {
            let item = chunk.map_err(|e| format!("request body: {e}"));
            let stop = item.is_err();
            if tx.send(item).await.is_err() || stop {
                break;
            }
        }
    });
    let res = blocking("upload", Duration::from_secs(3600), move || {
        let mut r = ChanReader {
            rx,
            cur: Bytes::new(),
        };
        Ok(c.upload(&mut r, &path, opts)?)
    })
    .await;
    pump.abort();
    res
}

/// Sends written bytes as body chunks (the blocking side of a download).
struct ChanWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl Write for ChanWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= 256 * 1024 {
            self.flush()?;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let b = Bytes::from(std::mem::take(&mut self.buf));
            self.tx
                .blocking_send(Ok(b))
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        }
        Ok(())
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
    let (tx, rx) = mpsc::channel(8);
    std::thread::Builder::new()
        .name("download".into())
        .spawn(move || {
            let _busy = busy;
            let mut w = ChanWriter {
                tx: tx.clone(),
                buf: Vec::new(),
            };
            let r = c.download(&path, &mut w).map_err(std::io::Error::other);
            let r = r.and_then(|_| w.flush());
            if let Err(e) = r {
                let _ = tx.blocking_send(Err(e));
            }
        })
        .map_err(ApiError::Thread)?;
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        match tokio::time::timeout(Duration::from_secs(120), rx.recv()).await {
            Ok(Some(item)) => Some((item, rx)),
            Ok(None) => None,
            Err(_) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the sandbox stopped sending the file",
                )),
                rx,
            )),
        }
    });
    Ok((st.size, Body::from_stream(stream)))
}
