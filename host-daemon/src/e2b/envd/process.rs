//! `process.Process`: commands as envd runs them, over the daemon's
//! background commands ([`crate::commands`]): a process outlives the
//! stream that started it (`Connect` finds it again by pid or tag) and is
//! killed at the call's deadline (`Connect-Timeout-Ms`, the SDK's command
//! `timeout`).

use super::connect::{self, Code, RpcError};
use super::{b64, unb64, users, Guest};
use crate::command_output::Stream;
use crate::commands::{self, Cmd, Event, Label};
use crate::exec::Prepared;
use crate::ApiError;
use agent_client::ExecRequest;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::Response;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The most a process may run when the call has no deadline.
const NO_DEADLINE: Duration = Duration::from_secs(86_400);
/// The largest unary request body.
const MAX_UNARY: usize = 16 << 20;

/// Serves `process.Process/<method>`.
pub(super) async fn serve(g: &Guest, method: &str, req: Request) -> Response {
    match method {
        "Start" => start(g, req)
            .await
            .unwrap_or_else(|e| connect::stream_error(&e)),
        "Connect" => connect_to(g, req)
            .await
            .unwrap_or_else(|e| connect::stream_error(&e)),
        "StreamInput" => stream_input(g, req)
            .await
            .unwrap_or_else(|e| connect::stream_error(&e)),
        _ => unary(g, method, req)
            .await
            .unwrap_or_else(|e| e.unary_response()),
    }
}

async fn unary(g: &Guest, method: &str, req: Request) -> Result<Response, RpcError> {
    let deadline = connect::timeout(req.headers())?.unwrap_or(Duration::from_secs(60));
    let body = connect::read_body(req.into_body(), MAX_UNARY, deadline).await?;
    let m = connect::parse_json(&body)?;
    let out = match method {
        "List" => list(g),
        "SendInput" => send_input(g, &m).await?,
        "SendSignal" => send_signal(g, &m).await?,
        "CloseStdin" => {
            let cmd = find(g, &m["process"])?;
            commands::stdin(&g.d, cmd, Body::empty(), true).await?;
            json!({})
        }
        "Update" => update(g, &m).await?,
        m => {
            return Err(RpcError::new(
                Code::Unimplemented,
                format!("process.Process/{m} is not a method"),
            ))
        }
    };
    Ok(connect::unary_ok(&out))
}

/// What `Start` asks for, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StartRequest {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub tag: Option<String>,
    pub stdin: bool,
    /// On a terminal of (cols, rows).
    pub pty: Option<(u16, u16)>,
}

fn string_field(v: &Value, what: &str) -> Result<Option<String>, RpcError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if !s.contains('\0') => Ok(Some(s.clone())),
        _ => Err(RpcError::invalid(format!("{what}: expected a string"))),
    }
}

/// Parses a `StartRequest` message.
pub(crate) fn parse_start(m: &Value) -> Result<StartRequest, RpcError> {
    let p = &m["process"];
    let cmd = string_field(&p["cmd"], "process.cmd")?
        .filter(|c| !c.is_empty())
        .ok_or_else(|| RpcError::invalid("process.cmd is empty"))?;
    let args = match &p["args"] {
        Value::Null => Vec::new(),
        Value::Array(a) => a
            .iter()
            .map(|x| string_field(x, "process.args").map(Option::unwrap_or_default))
            .collect::<Result<_, _>>()?,
        _ => return Err(RpcError::invalid("process.args: expected a list")),
    };
    let envs = match &p["envs"] {
        Value::Null => Vec::new(),
        Value::Object(o) => {
            let mut v = Vec::new();
            for (k, x) in o {
                if k.is_empty() || k.contains('=') || k.contains('\0') {
                    return Err(RpcError::invalid(format!("bad environment name {k:?}")));
                }
                v.push((
                    k.clone(),
                    string_field(x, "process.envs")?.unwrap_or_default(),
                ));
            }
            v
        }
        _ => return Err(RpcError::invalid("process.envs: expected a map")),
    };
    let stdin = match &m["stdin"] {
        Value::Null => true,
        Value::Bool(b) => *b,
        _ => return Err(RpcError::invalid("stdin: expected a bool")),
    };
    let pty = match &m["pty"] {
        Value::Null => None,
        p => Some(pty_size(&p["size"])?),
    };
    Ok(StartRequest {
        cmd,
        args,
        envs,
        cwd: string_field(&p["cwd"], "process.cwd")?.filter(|c| !c.is_empty()),
        tag: string_field(&m["tag"], "tag")?,
        stdin: stdin || pty.is_some(),
        pty,
    })
}

/// A `PTY.Size` (`{"cols","rows"}`; 80 x 24 where not given).
pub(crate) fn pty_size(v: &Value) -> Result<(u16, u16), RpcError> {
    let get = |k: &str, default: u16| -> Result<u16, RpcError> {
        match &v[k] {
            Value::Null => Ok(default),
            x => connect::int64(x)
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| (1..=4096).contains(n))
                .ok_or_else(|| RpcError::invalid(format!("pty.size.{k}: expected 1..=4096"))),
        }
    };
    Ok((get("cols", 80)?, get("rows", 24)?))
}

/// An agent without PTYs (older than the `PtyExec` frame) answers so.
fn no_pty(e: ApiError) -> RpcError {
    match &e {
        ApiError::Agent(agent_client::ClientError::Remote {
            code: agent_proto::ErrorCode::UnknownKind,
            ..
        }) => RpcError::new(
            Code::Unimplemented,
            "this sandbox's agent has no PTYs (rebuild its image with a newer agent)",
        ),
        _ => e.into(),
    }
}

/// `Update`: a PTY's new size.
async fn update(g: &Guest, m: &Value) -> Result<Value, RpcError> {
    let cmd = find(g, &m["process"])?;
    if !cmd.label().is_some_and(|l| l.pty) {
        return Err(RpcError::invalid(format!(
            "process {} has no PTY",
            cmd.pid()
        )));
    }
    let (cols, rows) = pty_size(&m["pty"]["size"])?;
    let (c, _busy) = g.client().await?;
    crate::within("resizing the PTY", g.op_timeout(), async {
        Ok(c.resize_pty(cmd.exec_id(), cols, rows).await?)
    })
    .await
    .map_err(no_pty)?;
    Ok(json!({}))
}

/// The process as `List` shows it.
fn config_json(s: &StartRequest, cwd: &str) -> Value {
    let envs: serde_json::Map<String, Value> = s
        .envs
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    json!({"cmd": s.cmd, "args": s.args, "envs": envs, "cwd": cwd})
}

async fn start(g: &Guest, req: Request) -> Result<Response, RpcError> {
    let arrived = tokio::time::Instant::now();
    let headers = req.headers().clone();
    let timeout = connect::timeout(&headers)?;
    let body = connect::read_body(req.into_body(), MAX_UNARY, g.op_timeout()).await?;
    let s = parse_start(&connect::single_message(&body)?)?;
    let asked = users::basic_user(&headers)?;
    let (c, _busy) = g.client().await?;
    let user = g.user(&c, asked.as_deref()).await?;
    let cwd = match &s.cwd {
        Some(p) => users::absolute(p, &user)?,
        None => user.home.clone(),
    };
    let mut argv = vec![s.cmd.clone()];
    argv.extend(s.args.iter().cloned());
    let limit = timeout.unwrap_or(NO_DEADLINE).min(NO_DEADLINE);
    let label = Label {
        tag: s.tag.clone(),
        config: config_json(&s, &cwd),
        pty: s.pty.is_some(),
    };
    let (envs, stdin, pty) = (s.envs.clone(), s.stdin, s.pty);
    let cmd = commands::start_with(&g.d, &g.id, stdin, Some(label), move |row| {
        // The deadline runs from the call's arrival, as envd's does.
        let left = limit
            .saturating_sub(arrived.elapsed())
            .max(Duration::from_millis(1));
        let mut r = ExecRequest::argv(argv).with_cwd(&cwd).with_timeout(left);
        for (k, v) in row.env.iter() {
            r = r.with_env(k, v);
        }
        for (k, v) in user.env() {
            r = r.with_env(k, v);
        }
        if pty.is_some() {
            r = r.with_env("TERM", "xterm-256color");
        }
        for (k, v) in &envs {
            r = r.with_env(k, v);
        }
        if user.uid != 0 {
            r = r.with_user(user.uid, user.gid);
        }
        if stdin {
            r = r.with_stdin();
        }
        Ok(Prepared {
            req: r,
            stdin: None,
            timeout: left,
            pty,
        })
    })
    .await
    .map_err(|e| match pty {
        Some(_) => no_pty(e),
        None => g.unavailable(e),
    })?;
    let until = timeout.map(|t| arrived + t);
    stream(g, cmd, &headers, true, until).await
}

/// The running process a `ProcessSelector` (`{"pid":N}` or `{"tag":T}`)
/// names.
fn find(g: &Guest, sel: &Value) -> Result<Arc<Cmd>, RpcError> {
    let live = g.d.live(&g.id).ok_or_else(|| {
        RpcError::new(
            Code::Unavailable,
            format!("The sandbox {} was not found", g.id),
        )
    })?;
    let running = live.commands.all().into_iter().filter(|c| c.is_running());
    if let Some(pid) = sel.get("pid").and_then(connect::int64) {
        return running
            .filter(|c| i64::from(c.pid()) == pid)
            .last()
            .ok_or_else(|| {
                RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
            });
    }
    if let Some(tag) = sel.get("tag").and_then(Value::as_str) {
        return running
            .filter(|c| c.label().and_then(|l| l.tag.as_deref()) == Some(tag))
            .last()
            .ok_or_else(|| {
                RpcError::new(Code::NotFound, format!("process with tag {tag} not found"))
            });
    }
    Err(RpcError::invalid("process: give 'pid' or 'tag'"))
}

async fn connect_to(g: &Guest, req: Request) -> Result<Response, RpcError> {
    let arrived = tokio::time::Instant::now();
    let headers = req.headers().clone();
    let until = connect::timeout(&headers)?.map(|t| arrived + t);
    let body = connect::read_body(req.into_body(), MAX_UNARY, g.op_timeout()).await?;
    let m = connect::single_message(&body)?;
    let cmd = find(g, &m["process"])?;
    stream(g, cmd, &headers, false, until).await
}

/// A process event message.
fn event(e: Value) -> Bytes {
    connect::message(&json!({ "event": e }))
}

/// The `end` event and the stream's end for a command's last event.
pub(crate) fn last_event(ev: &Event) -> (Option<Value>, Option<RpcError>) {
    match ev {
        Event::Exited {
            exit_code,
            signal,
            timed_out,
        } => {
            let (code, status) = match (exit_code, signal) {
                (Some(c), _) => (*c, format!("exit status {c}")),
                (None, Some(s)) => (-1, format!("signal: {}", signal_name(*s))),
                (None, None) => (-1, "unknown".to_string()),
            };
            let end =
                json!({"end": {"exitCode": code, "exited": exit_code.is_some(), "status": status}});
            let err = timed_out.then(|| {
                RpcError::new(
                    Code::DeadlineExceeded,
                    "the process was killed at the call's deadline",
                )
            });
            (Some(end), err)
        }
        Event::Lost(why) => (None, Some(RpcError::new(Code::Unavailable, why.clone()))),
        Event::Detached => (
            None,
            Some(RpcError::new(
                Code::Unavailable,
                "the connection to the sandbox ended before the stream completed",
            )),
        ),
        Event::Deadline => (
            None,
            Some(RpcError::new(
                Code::DeadlineExceeded,
                "the sandbox did not end the process by its deadline",
            )),
        ),
        Event::Out(..) => (None, None),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        9 => "killed",
        15 => "terminated",
        2 => "interrupt",
        1 => "hangup",
        13 => "broken pipe",
        6 => "aborted",
        11 => "segmentation fault",
        _ => "signal",
    }
}

/// Streams a process's events: `start`, output, keepalives, then `end`
/// and the stream's end (`deadline_exceeded` at `until`, the call's
/// deadline).
async fn stream(
    g: &Guest,
    cmd: Arc<Cmd>,
    headers: &axum::http::HeaderMap,
    replay: bool,
    until: Option<tokio::time::Instant>,
) -> Result<Response, RpcError> {
    use futures_util::StreamExt;
    let every = connect::keepalive(headers);
    let pid = cmd.pid();
    let pty = cmd.label().is_some_and(|l| l.pty);
    let evs = commands::events(&g.d, cmd, replay)
        .await
        .map_err(|e| g.unavailable(e))?
        .boxed();
    let first = event(json!({"start": {"pid": pid}}));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let state = Some((evs, tick));
    let rest = futures_util::stream::unfold(state, move |st| async move {
        let (mut evs, mut tick) = st?;
        let past = async {
            match until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let ev = tokio::select! {
            ev = evs.next() => ev,
            () = past => {
                let e = RpcError::new(Code::DeadlineExceeded, "the call's deadline passed");
                return Some((vec![connect::end_of_stream(Some(&e))], None));
            }
            _ = tick.tick() => {
                return Some((vec![event(json!({"keepalive": {}}))], Some((evs, tick))));
            }
        };
        match ev {
            Some(Event::Out(s, data)) => {
                let k = match s {
                    _ if pty => "pty",
                    Stream::Stdout => "stdout",
                    Stream::Stderr => "stderr",
                };
                let m = event(json!({"data": { k: b64(&data) }}));
                Some((vec![m], Some((evs, tick))))
            }
            Some(last) => {
                let (end, err) = last_event(&last);
                let mut v: Vec<Bytes> = end.into_iter().map(event).collect();
                v.push(connect::end_of_stream(err.as_ref()));
                Some((v, None))
            }
            None => Some((vec![connect::end_of_stream(None)], None)),
        }
    });
    let all = futures_util::stream::once(async move { vec![first] })
        .chain(rest)
        .map(|v| Ok::<_, std::convert::Infallible>(Bytes::from(v.concat())));
    Ok(connect::stream_response(Body::from_stream(all)))
}

fn list(g: &Guest) -> Value {
    let cmds =
        g.d.live(&g.id)
            .map(|l| l.commands.all())
            .unwrap_or_default();
    let procs: Vec<Value> = cmds
        .iter()
        .filter(|c| c.is_running())
        .filter_map(|c| {
            let l = c.label()?;
            let mut p = json!({"config": l.config, "pid": c.pid()});
            if let Some(t) = &l.tag {
                p["tag"] = json!(t);
            }
            Some(p)
        })
        .collect();
    json!({ "processes": procs })
}

/// The bytes of a `ProcessInput` (`{"stdin": b64}` or `{"pty": b64}`).
fn input_bytes(v: &Value) -> Result<Bytes, RpcError> {
    if let Some(s) = v.get("stdin").and_then(Value::as_str) {
        return unb64(s);
    }
    if let Some(s) = v.get("pty").and_then(Value::as_str) {
        return unb64(s);
    }
    Ok(Bytes::new())
}

async fn send_input(g: &Guest, m: &Value) -> Result<Value, RpcError> {
    let cmd = find(g, &m["process"])?;
    let data = input_bytes(&m["input"])?;
    commands::stdin(&g.d, cmd, Body::from(data), false).await?;
    Ok(json!({}))
}

/// A `Signal` enum value by name or number.
pub(crate) fn parse_signal(v: &Value) -> Result<i32, RpcError> {
    match v {
        Value::String(s) => match s.as_str() {
            "SIGNAL_SIGKILL" => Ok(9),
            "SIGNAL_SIGTERM" => Ok(15),
            s => Err(RpcError::invalid(format!("unknown signal {s}"))),
        },
        Value::Number(n) => match n.as_i64() {
            Some(9) => Ok(9),
            Some(15) => Ok(15),
            _ => Err(RpcError::invalid(format!("unknown signal {n}"))),
        },
        _ => Err(RpcError::invalid(
            "signal: give SIGNAL_SIGKILL or SIGNAL_SIGTERM",
        )),
    }
}

async fn send_signal(g: &Guest, m: &Value) -> Result<Value, RpcError> {
    let sig = parse_signal(&m["signal"])?;
    let cmd = find(g, &m["process"])?;
    let cmd2 = cmd.clone();
    let r = commands::signal(
        &g.d,
        cmd,
        shoal_api::SignalCommand {
            signal: sig,
            group: true,
        },
    )
    .await;
    match r {
        Ok(()) => {
            // A killed process is gone when the call returns (as envd's
            // are): a second kill, or a listing, no longer finds it.
            if sig == 9 {
                let _ = tokio::time::timeout(Duration::from_secs(2), ended(&g.d, cmd2)).await;
            }
            Ok(json!({}))
        }
        // Ended meanwhile: as envd, a process it no longer has.
        Err(ApiError::Conflict(m)) => Err(RpcError::new(Code::NotFound, m)),
        Err(e) => Err(e.into()),
    }
}

/// Waits for `cmd`'s end.
async fn ended(d: &Arc<crate::Daemon>, cmd: Arc<Cmd>) {
    use futures_util::StreamExt;
    if let Ok(evs) = commands::events(d, cmd, false).await {
        let mut evs = std::pin::pin!(evs);
        while evs.next().await.is_some() {}
    }
}

/// `StreamInput`: a client stream of `start{process}`, then `data{input}`
/// and `keepalive` messages, written to the process's stdin as they come.
async fn stream_input(g: &Guest, req: Request) -> Result<Response, RpcError> {
    use futures_util::StreamExt;
    let limit = connect::timeout(req.headers())?.unwrap_or(NO_DEADLINE);
    let mut body = req.into_body().into_data_stream();
    let mut dec = connect::Decoder::default();
    let mut cmd: Option<Arc<Cmd>> = None;
    let work = async {
        loop {
            while let Some((flags, payload)) = dec
                .next_envelope()
                .map_err(|e| RpcError::invalid(e.to_string()))?
            {
                if flags & connect::FLAG_END != 0 {
                    return Ok(());
                }
                let m = connect::parse_json(&payload)?;
                if let Some(start) = m.get("start") {
                    cmd = Some(find(g, &start["process"])?);
                } else if let Some(data) = m.get("data") {
                    let c = cmd
                        .clone()
                        .ok_or_else(|| RpcError::invalid("data before start"))?;
                    let bytes = input_bytes(&data["input"])?;
                    commands::stdin(&g.d, c, Body::from(bytes), false).await?;
                }
            }
            match body.next().await {
                Some(Ok(chunk)) => dec.push(&chunk),
                Some(Err(e)) => return Err(RpcError::invalid(format!("request body: {e}"))),
                None => {
                    dec.finish().map_err(|e| RpcError::invalid(e.to_string()))?;
                    return Ok(());
                }
            }
        }
    };
    let r = match tokio::time::timeout(limit, work).await {
        Ok(r) => r,
        Err(_) => Err(RpcError::new(
            Code::DeadlineExceeded,
            "the input stream's deadline passed",
        )),
    };
    let mut out = connect::message(&json!({})).to_vec();
    match r {
        Ok(()) => out.extend_from_slice(&connect::end_of_stream(None)),
        Err(e) => out = connect::end_of_stream(Some(&e)).to_vec(),
    }
    Ok(connect::stream_response(Body::from(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_requests_are_parsed_as_the_sdk_sends_them() {
        let m = json!({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],
            "envs":{"A":"1"},"cwd":"/tmp"},"tag":"t","stdin":false});
        let s = parse_start(&m).unwrap();
        assert_eq!(s.cmd, "/bin/bash");
        assert_eq!(s.args, ["-l", "-c", "echo hi"]);
        assert_eq!(s.envs, [("A".to_string(), "1".to_string())]);
        assert_eq!(s.cwd.as_deref(), Some("/tmp"));
        assert_eq!(s.tag.as_deref(), Some("t"));
        assert!(!s.stdin);
        // stdin defaults to open (the proto's comment), args and envs to none.
        let s = parse_start(&json!({"process":{"cmd":"ls"}})).unwrap();
        assert!(s.stdin && s.args.is_empty() && s.envs.is_empty());
        assert!(parse_start(&json!({"process":{"cmd":""}})).is_err());
        assert!(parse_start(&json!({"process":{"cmd":"x","args":"y"}})).is_err());
        assert!(parse_start(&json!({"process":{"cmd":"x","envs":{"A=B":"1"}}})).is_err());
        let s = parse_start(&json!({"process":{"cmd":"x"},"stdin":false,
            "pty":{"size":{"cols":100,"rows":30}}}))
        .unwrap();
        assert_eq!(s.pty, Some((100, 30)));
        assert!(s.stdin, "a terminal always has input");
        assert_eq!(pty_size(&json!({})).unwrap(), (80, 24));
        assert!(pty_size(&json!({"cols": 0})).is_err());
        assert!(pty_size(&json!({"rows": 70000})).is_err());
    }

    #[test]
    fn ends_say_how_the_process_ended() {
        let (end, err) = last_event(&Event::Exited {
            exit_code: Some(3),
            signal: None,
            timed_out: false,
        });
        assert_eq!(
            end.unwrap(),
            json!({"end":{"exitCode":3,"exited":true,"status":"exit status 3"}})
        );
        assert!(err.is_none());
        let (end, err) = last_event(&Event::Exited {
            exit_code: None,
            signal: Some(9),
            timed_out: true,
        });
        let end = end.unwrap();
        assert_eq!(end["end"]["exited"], false);
        assert_eq!(end["end"]["status"], "signal: killed");
        assert_eq!(err.unwrap().code, Code::DeadlineExceeded);
        let (end, err) = last_event(&Event::Detached);
        assert!(end.is_none());
        assert_eq!(err.unwrap().code, Code::Unavailable);
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal(&json!("SIGNAL_SIGKILL")).unwrap(), 9);
        assert_eq!(parse_signal(&json!(15)).unwrap(), 15);
        assert!(parse_signal(&json!("SIGNAL_UNSPECIFIED")).is_err());
        assert!(parse_signal(&json!(null)).is_err());
    }
}
