//! Exec (one-shot JSON, or streamed newline-delimited JSON events) and
//! files (streamed upload and download, stat, list, remove) through the
//! sandbox's agent. The agent client is blocking: each call runs on the
//! blocking pool or its own thread, always under a deadline.

use super::ops::{agent, ensure_running};
use super::{blocking, ApiError, ApiResult, Daemon};
use axum::body::{Body, Bytes};
use base64::Engine;
use guest_agent::client::{
    ExecEvent, ExecHandle, ExecRequest, ExitStatus, FileStat, FileType, UploadOptions,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Default limit on a command's run time (s).
pub const DEFAULT_EXEC_TIMEOUT_S: f64 = 300.0;
/// Most output a one-shot exec returns per stream.
pub const ONESHOT_OUTPUT_LIMIT: usize = 16 << 20;

/// `POST /v1/sandboxes/{id}/exec[/stream]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// argv (argv[0] looked up in PATH).
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// Or a `/bin/sh -c` script.
    #[serde(default)]
    pub shell: Option<String>,
    /// Extra environment (over the sandbox's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Kill the command's process tree after this long (default 300 s).
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Standard input (UTF-8 text).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Standard input (base64), instead of `stdin`.
    #[serde(default)]
    pub stdin_b64: Option<String>,
}

/// Output of a one-shot exec.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecOutput {
    /// Exit code (absent if killed by a signal).
    pub exit_code: Option<i32>,
    /// Signal that killed it.
    pub signal: Option<i32>,
    /// Its timeout fired.
    pub timed_out: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// `utf8` or `base64` (for both streams).
    pub encoding: String,
    /// Output beyond the limit was dropped.
    pub truncated: bool,
    /// Request to exit (ms).
    pub duration_ms: f64,
}

fn encode(d: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(d) {
        Ok(s) => (s.into(), "utf8"),
        Err(_) => (
            base64::engine::general_purpose::STANDARD.encode(d),
            "base64",
        ),
    }
}

struct Prepared {
    req: ExecRequest,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
}

fn prepare(env: &BTreeMap<String, String>, b: ExecBody) -> ApiResult<Prepared> {
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
            base64::engine::general_purpose::STANDARD
                .decode(s)
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
pub async fn exec(d: &Arc<Daemon>, id: &str, b: ExecBody) -> ApiResult<ExecOutput> {
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
    let (o, e1) = encode(&out);
    let (e, e2) = encode(&err);
    let encoding = if e1 == "utf8" && e2 == "utf8" {
        "utf8"
    } else {
        "base64"
    };
    let (stdout, stderr) = if encoding == "utf8" {
        (o, e)
    } else {
        let b = base64::engine::general_purpose::STANDARD;
        (b.encode(&out), b.encode(&err))
    };
    let secs = t0.elapsed().as_secs_f64();
    d.metrics.exec.observe(secs);
    Ok(ExecOutput {
        exit_code,
        signal,
        timed_out: r.timed_out,
        stdout,
        stderr,
        encoding: encoding.into(),
        truncated,
        duration_ms: secs * 1e3,
    })
}

fn line(v: serde_json::Value) -> Bytes {
    let mut b = serde_json::to_vec(&v).unwrap_or_default();
    b.push(b'\n');
    Bytes::from(b)
}

fn output_line(kind: &str, data: &[u8]) -> Bytes {
    let (s, enc) = encode(data);
    line(serde_json::json!({"type": kind, "data": s, "encoding": enc}))
}

/// Streamed exec: newline-delimited JSON events (`start`, `stdout`,
/// `stderr`, then `exit` or `error`).
pub async fn exec_stream(d: &Arc<Daemon>, id: &str, b: ExecBody) -> ApiResult<Body> {
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
                    send(line(
                        serde_json::json!({"type": "error", "message": e.to_string()}),
                    ));
                    return;
                }
            };
            send(line(
                serde_json::json!({"type": "start", "pid": h.pid(), "exec_id": h.exec_id()}),
            ));
            if let Err(e) = feed(&h, p.stdin) {
                send(line(
                    serde_json::json!({"type": "error", "message": e.to_string()}),
                ));
                return;
            }
            loop {
                let ok = match h.next_event() {
                    Ok(Some(ExecEvent::Stdout(x))) => send(output_line("stdout", &x)),
                    Ok(Some(ExecEvent::Stderr(x))) => send(output_line("stderr", &x)),
                    Ok(Some(ExecEvent::Exit(r))) => {
                        let (code, sig) = status_fields(r.status);
                        d2.metrics.exec.observe(t0.elapsed().as_secs_f64());
                        send(line(serde_json::json!({"type": "exit", "exit_code": code,
                            "signal": sig, "timed_out": r.timed_out})));
                        return;
                    }
                    Ok(None) => return,
                    Err(e) => {
                        send(line(serde_json::json!({"type": "error",
                            "message": format!("sandbox agent: {e}")})));
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
        .map_err(|e| ApiError::Internal(format!("cannot start a thread: {e}")))?;
    let stream = futures_util::stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(b)) => Some((Ok::<_, std::convert::Infallible>(b), Some(rx))),
            Ok(None) => None,
            Err(_) => Some((
                Ok(line(serde_json::json!({"type": "error",
                    "message": "deadline exceeded: the sandbox did not finish the command"}))),
                None,
            )),
        }
    });
    Ok(Body::from_stream(stream))
}

/// A file's metadata as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatView {
    /// `file`, `dir`, `symlink` or `other`.
    pub r#type: String,
    /// Permission bits.
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
}

fn type_name(t: FileType) -> &'static str {
    match t {
        FileType::File => "file",
        FileType::Dir => "dir",
        FileType::Symlink => "symlink",
        FileType::Other => "other",
    }
}

impl From<FileStat> for StatView {
    fn from(s: FileStat) -> Self {
        StatView {
            r#type: type_name(s.file_type).into(),
            mode: s.mode,
            size: s.size,
            mtime_ns: s.mtime_ns,
        }
    }
}

/// One directory entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EntryView {
    /// Name.
    pub name: String,
    /// Type.
    pub r#type: String,
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
pub async fn stat(d: &Arc<Daemon>, id: &str, path: String) -> ApiResult<StatView> {
    check_path(&path)?;
    let (_, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    blocking("stat", FILE_OP, move || Ok(c.stat(&path)?.into())).await
}

/// Directory listing.
pub async fn list(d: &Arc<Daemon>, id: &str, path: String) -> ApiResult<Vec<EntryView>> {
    check_path(&path)?;
    let (_, live, _busy) = ensure_running(d, id).await?;
    let c = agent(d, &live).await?;
    blocking("list", FILE_OP, move || {
        let mut v: Vec<EntryView> = c
            .list_dir(&path)?
            .into_iter()
            .map(|e| EntryView {
                name: String::from_utf8_lossy(&e.name).into_owned(),
                r#type: type_name(e.file_type).into(),
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
    if st.r#type != "file" {
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
        .map_err(|e| ApiError::Internal(format!("cannot start a thread: {e}")))?;
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
