//! Background commands: started in a sandbox and left running, then
//! listed, streamed from any connection, waited for, signalled and fed
//! stdin by id.
//!
//! The daemon stays attached to each running command (one task per
//! command reads its events from the sandbox's agent connection and never
//! waits for anyone), keeping a bounded record of its output
//! ([`crate::command_output`]); any number of HTTP clients read that
//! record, each at its own pace, and none of them holds anything of the
//! guest's. When the agent connection goes away (the sandbox was paused
//! to disk), the command is re-attached on the next request that needs
//! it: the guest agent kept what the command wrote meanwhile (at most
//! [`agent_proto::DETACHED_OUTPUT_LIMIT`] bytes). A sandbox remembers at
//! most [`crate::agent_limits::AgentLimits::max_commands`] commands,
//! running or finished (the oldest finished one is forgotten first; with
//! all of them running a new one is refused: 429 `sandbox_busy`), in
//! memory only: after a daemon restart its commands are not known.
//!
//! Every call into the guest has a deadline, and a command whose guest
//! does not end it by its own timeout (and the agent slack) is given up
//! on (`lost`) and killed.

use super::command_output::{Output, Stream};
use super::exec::{error_line, line, prepare, status_fields, write_all, Prepared};
use super::freeze::Busy;
use super::lifecycle::ensure_running;
use super::ops::agent;
use super::{db, within, ApiError, ApiResult, Daemon};
use agent_client::{AsyncExecHandle, AsyncExecStdin, ClientError, ExecEvent};
use agent_proto::ErrorCode as AgentCode;
use axum::body::{Body, Bytes};
use shoal_api as api;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const RESTARTED: &str = "the sandbox's agent was restarted (the command is gone with it)";

/// How a command ended (or that it has not).
#[derive(Debug, Clone, PartialEq)]
enum End {
    Running,
    Exited {
        exit_code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
    },
    Lost(String),
}

/// The daemon's link to a running command: which attach it is and the
/// command's stdin through it.
struct Link {
    generation: u64,
    stdin: AsyncExecStdin,
}

struct Inner {
    out: Output,
    end: End,
    link: Option<Link>,
    generation: u64,
    stdin_closed: bool,
}

/// What a caller other than the plain API (the E2B data plane) keeps
/// with a command: its tag and the configuration it was started with.
#[derive(Debug, Clone)]
pub struct Label {
    /// A name the command is found by besides its pid.
    pub tag: Option<String>,
    /// The command as asked for (shown back by listings).
    pub config: serde_json::Value,
    /// It runs on a terminal (its output is the terminal's).
    pub pty: bool,
}

/// One background command.
pub struct Cmd {
    exec_id: u64,
    label: Option<Label>,
    pid: i32,
    sandbox_id: String,
    started_at: f64,
    t0: Instant,
    /// When the guest must have ended it (its timeout and the slack).
    deadline: tokio::time::Instant,
    stdin_open: bool,
    inner: Mutex<Inner>,
    /// Bumped on every change (output, end, link).
    changed: watch::Sender<u64>,
    /// Serializes re-attaches.
    attaching: tokio::sync::Mutex<()>,
    /// Serializes stdin writers.
    stdin: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Cmd {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn push(&self, stream: Stream, data: Vec<u8>) {
        self.inner().out.push(stream, Bytes::from(data));
        self.bump();
    }

    fn finish(&self, end: End) {
        {
            let mut i = self.inner();
            if i.end == End::Running {
                i.end = end;
            }
            i.link = None;
        }
        self.bump();
    }

    /// The attach `generation` ended without the command's end.
    fn unlink(&self, generation: u64) {
        {
            let mut i = self.inner();
            if i.link.as_ref().is_some_and(|l| l.generation == generation) {
                i.link = None;
            }
        }
        self.bump();
    }

    fn running(&self) -> bool {
        self.inner().end == End::Running
    }

    /// Whether the command has not ended (as far as the daemon knows).
    pub fn is_running(&self) -> bool {
        self.running()
    }

    /// Its id in the guest agent.
    pub fn exec_id(&self) -> u64 {
        self.exec_id
    }

    /// Its pid in the guest.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// What its starter labelled it with.
    pub fn label(&self) -> Option<&Label> {
        self.label.as_ref()
    }

    /// The command as the API shows it.
    pub fn view(&self) -> api::Command {
        let i = self.inner();
        let (state, exit_code, signal, timed_out) = match &i.end {
            End::Running => (api::CommandState::Running, None, None, false),
            End::Exited {
                exit_code,
                signal,
                timed_out,
            } => (api::CommandState::Exited, *exit_code, *signal, *timed_out),
            End::Lost(_) => (api::CommandState::Lost, None, None, false),
        };
        api::Command {
            id: self.exec_id.to_string(),
            pid: self.pid,
            sandbox_id: self.sandbox_id.clone(),
            state,
            exit_code,
            signal,
            timed_out,
            started_at: self.started_at,
        }
    }
}

/// The commands a sandbox remembers.
#[derive(Default)]
pub struct Registry {
    cmds: Mutex<VecDeque<Arc<Cmd>>>,
    /// Slots taken by commands being started.
    starting: Mutex<usize>,
}

/// A slot for a command being started (given back when dropped).
struct Slot<'a>(&'a Registry);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut n = lock(&self.0.starting);
        *n = n.saturating_sub(1);
    }
}

impl Registry {
    /// Takes a slot, forgetting the oldest finished command if that makes
    /// room; 429 when `max` commands are running or starting.
    fn reserve(&self, max: usize) -> ApiResult<Slot<'_>> {
        let mut cmds = lock(&self.cmds);
        let mut starting = lock(&self.starting);
        while cmds.len() + *starting >= max.max(1) {
            match cmds.iter().position(|c| !c.running()) {
                Some(i) => {
                    cmds.remove(i);
                }
                None => {
                    return Err(ApiError::Busy(format!(
                        "at most {max} background commands per sandbox are running"
                    )))
                }
            }
        }
        *starting += 1;
        Ok(Slot(self))
    }

    fn insert(&self, _slot: Slot<'_>, c: Arc<Cmd>) {
        let mut cmds = lock(&self.cmds);
        // The agent gave out this id again: it was restarted, and the
        // command that had it is gone with it.
        if let Some(i) = cmds.iter().position(|o| o.exec_id == c.exec_id) {
            if let Some(old) = cmds.remove(i) {
                old.finish(End::Lost(RESTARTED.into()));
            }
        }
        cmds.push_back(c);
    }

    /// Every command remembered, oldest first.
    pub fn all(&self) -> Vec<Arc<Cmd>> {
        lock(&self.cmds).iter().cloned().collect()
    }

    /// Command `exec_id`.
    pub fn get(&self, exec_id: u64) -> Option<Arc<Cmd>> {
        lock(&self.cmds)
            .iter()
            .find(|c| c.exec_id == exec_id)
            .cloned()
    }
}

/// Reads a command's events into its record until it ends or the
/// connection does; holds the sandbox busy meanwhile (a sandbox with a
/// command running is not frozen).
async fn pump(d: Arc<Daemon>, cmd: Arc<Cmd>, mut h: AsyncExecHandle, generation: u64, busy: Busy) {
    let _busy = busy;
    h.set_deadline(Some(cmd.deadline));
    loop {
        match h.next_event().await {
            Ok(Some(ExecEvent::Stdout(x))) => cmd.push(Stream::Stdout, x),
            Ok(Some(ExecEvent::Stderr(x))) => cmd.push(Stream::Stderr, x),
            Ok(Some(ExecEvent::Exit(r))) => {
                let (exit_code, signal) = status_fields(r.status);
                cmd.finish(End::Exited {
                    exit_code,
                    signal,
                    timed_out: r.timed_out,
                });
                return;
            }
            Err(ClientError::Timeout) => {
                cmd.finish(End::Lost(
                    "the sandbox did not end the command by its deadline".into(),
                ));
                let kill = h.signal(libc::SIGKILL, true);
                let _ = tokio::time::timeout(d.cfg.agent.call_timeout, kill).await;
                return;
            }
            Ok(None) | Err(_) => {
                // The connection went (the sandbox paused, or its agent
                // restarted): re-attached when next needed.
                cmd.unlink(generation);
                return;
            }
        }
    }
}

/// Links `h` (a new attach of `cmd`) and starts its pump.
fn link(d: &Arc<Daemon>, cmd: &Arc<Cmd>, h: AsyncExecHandle, busy: Busy) {
    let generation = {
        let mut i = cmd.inner();
        i.generation += 1;
        i.link = Some(Link {
            generation: i.generation,
            stdin: h.stdin(),
        });
        i.generation
    };
    cmd.bump();
    tokio::spawn(pump(d.clone(), cmd.clone(), h, generation, busy));
}

/// Starts a background command (a paused sandbox is resumed first).
pub async fn start(d: &Arc<Daemon>, id: &str, b: api::ExecRequest) -> ApiResult<api::Command> {
    let stdin_open = b.stdin_open;
    let cmd = start_with(d, id, stdin_open, None, |row| prepare(&row.env, b, true)).await?;
    Ok(cmd.view())
}

/// Starts a background command whose agent request `make` builds from the
/// sandbox's row (a paused sandbox is resumed first), labelled `label`.
pub(crate) async fn start_with(
    d: &Arc<Daemon>,
    id: &str,
    stdin_open: bool,
    label: Option<Label>,
    make: impl FnOnce(&db::SandboxRow) -> ApiResult<Prepared>,
) -> ApiResult<Arc<Cmd>> {
    let (row, live, busy) = ensure_running(d, id).await?;
    let mut p = make(&row)?;
    let slot = live.commands.reserve(d.cfg.agent.max_commands)?;
    let c = agent(d, &live).await?;
    crate::exec_defaults::apply_for(d, &row, &mut p.req, &c).await?;
    let limits = d.cfg.agent;
    let t0 = Instant::now();
    let deadline = tokio::time::Instant::now() + p.timeout + limits.exec_slack;
    let h = within("starting the command", limits.call_timeout, async {
        Ok(match p.pty {
            Some((cols, rows)) => c.exec_pty(&p.req, cols, rows).await?,
            None => c.exec(&p.req).await?,
        })
    })
    .await?;
    if let Some(data) = p.stdin {
        let fed = within("writing the command's stdin", limits.call_timeout, async {
            write_all(&h, &data).await?;
            if !stdin_open {
                h.close_stdin().await?;
            }
            Ok(())
        })
        .await;
        if let Err(e) = fed {
            let kill = h.signal(libc::SIGKILL, true);
            let _ = tokio::time::timeout(limits.call_timeout, kill).await;
            return Err(e);
        }
    }
    let cmd = Arc::new(Cmd {
        exec_id: h.exec_id(),
        label,
        pid: h.pid(),
        sandbox_id: id.into(),
        started_at: db::now(),
        t0,
        deadline,
        stdin_open,
        inner: Mutex::new(Inner {
            out: Output::new(limits.command_output_limit, limits.command_replay_limit),
            end: End::Running,
            link: None,
            generation: 0,
            stdin_closed: !stdin_open,
        }),
        changed: watch::channel(0).0,
        attaching: tokio::sync::Mutex::new(()),
        stdin: tokio::sync::Mutex::new(()),
    });
    live.commands.insert(slot, cmd.clone());
    link(d, &cmd, h, busy);
    Ok(cmd)
}

/// Command `cid` of sandbox `id`.
pub fn find(d: &Daemon, id: &str, cid: &str) -> ApiResult<Arc<Cmd>> {
    super::ops::row(d, id)?;
    let missing = || ApiError::NotFound(format!("no command '{cid}' in sandbox '{id}'"));
    let exec_id: u64 = cid.parse().map_err(|_| missing())?;
    d.live(id)
        .and_then(|l| l.commands.get(exec_id))
        .ok_or_else(missing)
}

/// The commands sandbox `id` remembers, oldest first.
pub fn list(d: &Daemon, id: &str) -> ApiResult<Vec<api::Command>> {
    super::ops::row(d, id)?;
    Ok(d.live(id)
        .map(|l| l.commands.all())
        .unwrap_or_default()
        .iter()
        .map(|c| c.view())
        .collect())
}

/// Makes sure a running command has a link: re-attaches (resuming the
/// sandbox) when the last one went; a command the guest no longer knows
/// is lost.
async fn attached(d: &Arc<Daemon>, cmd: &Arc<Cmd>) -> ApiResult<()> {
    let linked = |c: &Cmd| {
        let i = c.inner();
        i.end != End::Running || i.link.is_some()
    };
    if linked(cmd) {
        return Ok(());
    }
    let _g = cmd.attaching.lock().await;
    if linked(cmd) {
        return Ok(());
    }
    if tokio::time::Instant::now() >= cmd.deadline {
        cmd.finish(End::Lost(
            "the command passed its deadline while detached".into(),
        ));
        return Ok(());
    }
    let (_, live, busy) = ensure_running(d, &cmd.sandbox_id).await?;
    let c = agent(d, &live).await?;
    let res = within(
        "re-attaching the command",
        d.cfg.agent.call_timeout,
        async { Ok(c.attach(cmd.exec_id).await?) },
    )
    .await;
    match res {
        Ok(h) if h.pid() == cmd.pid => {
            link(d, cmd, h, busy);
            Ok(())
        }
        Ok(_) => {
            // Another process under the id: the agent was restarted and
            // gave the id out again.
            cmd.finish(End::Lost(RESTARTED.into()));
            Ok(())
        }
        Err(ApiError::Agent(ClientError::Remote {
            code: AgentCode::NoSuchExec,
            ..
        })) => {
            cmd.finish(End::Lost(format!(
                "sandbox '{}' no longer knows command {} (paused to disk or restarted)",
                cmd.sandbox_id, cmd.exec_id
            )));
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// One event of a command as [`events`] gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Output.
    Out(Stream, Bytes),
    /// The command exited (or was killed by a signal).
    Exited {
        /// Its exit code.
        exit_code: Option<i32>,
        /// The signal that ended it.
        signal: Option<i32>,
        /// Killed at its timeout.
        timed_out: bool,
    },
    /// The daemon lost the command (why).
    Lost(String),
    /// The daemon's connection to the command went; it may still run.
    Detached,
    /// The command's deadline passed with no end from the guest.
    Deadline,
}

/// The command's events: the output kept so far (with `replay`; else only
/// what comes from now on), live output, then one last event (its exit,
/// or why there is none). Ends at the command's deadline at the latest.
pub async fn events(
    d: &Arc<Daemon>,
    cmd: Arc<Cmd>,
    replay: bool,
) -> ApiResult<impl futures_util::Stream<Item = Event> + Send + 'static> {
    attached(d, &cmd).await?;
    let rx = cmd.changed.subscribe();
    // The last moment anything can still come: the command's deadline.
    let end = cmd.deadline + Duration::from_secs(1);
    let from = if replay {
        0
    } else {
        cmd.inner().out.next_seq()
    };
    let state = Some((cmd, rx, from));
    Ok(futures_util::stream::unfold(state, move |st| async move {
        let (cmd, mut rx, seq) = st?;
        loop {
            // Marked seen before looking, so no change is missed.
            rx.borrow_and_update();
            let (chunk, ended, linked) = {
                let i = cmd.inner();
                (i.out.next_from(seq), i.end.clone(), i.link.is_some())
            };
            if let Some(c) = chunk {
                let ev = Event::Out(c.stream, c.data);
                return Some((ev, Some((cmd, rx, c.seq + 1))));
            }
            let last = match ended {
                End::Exited {
                    exit_code,
                    signal,
                    timed_out,
                } => Event::Exited {
                    exit_code,
                    signal,
                    timed_out,
                },
                End::Lost(why) => Event::Lost(why),
                End::Running if !linked => Event::Detached,
                End::Running => match tokio::time::timeout_at(end, rx.changed()).await {
                    Ok(Ok(())) => continue,
                    _ => Event::Deadline,
                },
            };
            return Some((last, None));
        }
    }))
}

/// The command's events as NDJSON: `start`, the output kept so far, live
/// output, then `exit` (or `error` when it is lost, or its link went).
pub async fn stream(d: &Arc<Daemon>, cmd: Arc<Cmd>) -> ApiResult<Body> {
    let start = line(api::ExecEvent::Start {
        pid: cmd.pid,
        exec_id: cmd.exec_id,
    });
    let evs = events(d, cmd, true).await?;
    let s = futures_util::StreamExt::map(evs, |ev| {
        Ok::<_, std::convert::Infallible>(match ev {
            Event::Out(Stream::Stdout, data) => line(api::ExecEvent::stdout(&data)),
            Event::Out(Stream::Stderr, data) => line(api::ExecEvent::stderr(&data)),
            Event::Exited {
                exit_code,
                signal,
                timed_out,
            } => line(api::ExecEvent::Exit {
                exit_code,
                signal,
                timed_out,
            }),
            Event::Lost(why) => error_line(why),
            Event::Detached => error_line(
                "the daemon's connection to the command went (the sandbox was paused?): \
                 the command may still run; stream it again",
            ),
            Event::Deadline => error_line("deadline exceeded: the sandbox did not end the command"),
        })
    });
    let s = futures_util::StreamExt::chain(futures_util::stream::once(async move { Ok(start) }), s);
    Ok(Body::from_stream(s))
}

/// Waits (at most `timeout`, else until its deadline) for the command's
/// end: its output kept (the head of each stream, as a one-shot exec's).
pub async fn wait(
    d: &Arc<Daemon>,
    cmd: Arc<Cmd>,
    timeout: Option<Duration>,
) -> ApiResult<api::ExecResult> {
    let asked = tokio::time::Instant::now();
    let until = timeout.map_or(cmd.deadline + Duration::from_secs(1), |t| {
        (asked + t).min(cmd.deadline + Duration::from_secs(1))
    });
    let mut rx = cmd.changed.subscribe();
    // Re-attaches after the link went, a few at most (a connection that
    // keeps going is the sandbox's failure).
    let mut relinks = 0;
    loop {
        attached(d, &cmd).await?;
        rx.borrow_and_update();
        let (ended, linked) = {
            let i = cmd.inner();
            (i.end.clone(), i.link.is_some())
        };
        match ended {
            End::Exited {
                exit_code,
                signal,
                timed_out,
            } => return Ok(result(&cmd, exit_code, signal, timed_out)),
            End::Lost(why) => return Err(ApiError::Sandbox(why)),
            End::Running if !linked && relinks < 3 => {
                relinks += 1;
                continue;
            }
            End::Running if !linked => {
                return Err(ApiError::Sandbox(
                    "the daemon's connection to the command keeps going".into(),
                ))
            }
            End::Running => {}
        }
        if tokio::time::timeout_at(until, rx.changed()).await.is_err() {
            return Err(ApiError::Timeout(format!(
                "command {} is still running after {:.3} s (it goes on)",
                cmd.exec_id,
                asked.elapsed().as_secs_f64()
            )));
        }
    }
}

fn result(
    cmd: &Cmd,
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
) -> api::ExecResult {
    use api::Encoding;
    let ((out, out_cut), (err, err_cut)) = {
        let i = cmd.inner();
        (i.out.head(Stream::Stdout), i.out.head(Stream::Stderr))
    };
    let encoding = match (Encoding::encode(&out).1, Encoding::encode(&err).1) {
        (Encoding::Utf8, Encoding::Utf8) => Encoding::Utf8,
        _ => Encoding::Base64,
    };
    api::ExecResult {
        exit_code,
        signal,
        timed_out,
        stdout: encoding.encode_as(&out),
        stderr: encoding.encode_as(&err),
        encoding,
        truncated: out_cut || err_cut,
        stdout_truncated: out_cut,
        stderr_truncated: err_cut,
        duration_ms: cmd.t0.elapsed().as_secs_f64() * 1e3,
    }
}

/// Sends `signal` to a running command (its process group with `group`).
pub async fn signal(d: &Arc<Daemon>, cmd: Arc<Cmd>, req: api::SignalCommand) -> ApiResult<()> {
    if !(1..=64).contains(&req.signal) {
        return Err(ApiError::BadRequest(format!(
            "signal {}: expected 1..=64",
            req.signal
        )));
    }
    let exited = || ApiError::Conflict(format!("command {} is not running", cmd.exec_id));
    if !cmd.running() {
        return Err(exited());
    }
    let (_, live, _busy) = ensure_running(d, &cmd.sandbox_id).await?;
    let c = agent(d, &live).await?;
    let res = within("signalling the command", d.cfg.agent.call_timeout, async {
        Ok(c.signal(cmd.exec_id, req.signal, req.group).await?)
    })
    .await;
    match res {
        Err(ApiError::Agent(ClientError::Remote {
            code: AgentCode::NoSuchExec,
            ..
        })) => Err(exited()),
        r => r,
    }
}

/// Streams `body` into the command's stdin (then closes it with `close`).
pub async fn stdin(d: &Arc<Daemon>, cmd: Arc<Cmd>, body: Body, close: bool) -> ApiResult<()> {
    use futures_util::StreamExt;
    if !cmd.stdin_open {
        return Err(ApiError::Conflict(format!(
            "command {} was started without 'stdin_open'",
            cmd.exec_id
        )));
    }
    let _g = cmd.stdin.lock().await;
    let writer = |cmd: &Cmd| -> ApiResult<Option<AsyncExecStdin>> {
        let i = cmd.inner();
        if i.stdin_closed {
            return Err(ApiError::Conflict(format!(
                "command {}'s stdin is closed",
                cmd.exec_id
            )));
        }
        if i.end != End::Running {
            return Err(ApiError::Conflict(format!(
                "command {} is not running",
                cmd.exec_id
            )));
        }
        Ok(i.link.as_ref().map(|l| l.stdin.clone()))
    };
    writer(&cmd)?;
    attached(d, &cmd).await?;
    let w = writer(&cmd)?
        .ok_or_else(|| ApiError::Sandbox("the daemon's connection to the command went".into()))?;
    let work = async {
        let mut s = body.into_data_stream();
        while let Some(chunk) = s.next().await {
            let chunk = chunk
                .map_err(|e| ApiError::BadRequest(format!("reading the request body: {e}")))?;
            for c in chunk.chunks(256 * 1024) {
                w.write(c).await?;
            }
        }
        if close {
            w.close().await?;
            cmd.inner().stdin_closed = true;
        }
        Ok(())
    };
    within(
        "writing the command's stdin",
        Duration::from_secs(3600),
        work,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_forgets_finished_commands_first_and_refuses_past_its_cap() {
        let r = Registry::default();
        let mk = |id: u64, end: End| {
            Arc::new(Cmd {
                exec_id: id,
                label: None,
                pid: 1,
                sandbox_id: "s".into(),
                started_at: 0.0,
                t0: Instant::now(),
                deadline: tokio::time::Instant::now(),
                stdin_open: false,
                inner: Mutex::new(Inner {
                    out: Output::new(100, 100),
                    end,
                    link: None,
                    generation: 0,
                    stdin_closed: true,
                }),
                changed: watch::channel(0).0,
                attaching: tokio::sync::Mutex::new(()),
                stdin: tokio::sync::Mutex::new(()),
            })
        };
        let done = || End::Exited {
            exit_code: Some(0),
            signal: None,
            timed_out: false,
        };
        let s = r.reserve(2).unwrap();
        r.insert(s, mk(1, done()));
        let s = r.reserve(2).unwrap();
        r.insert(s, mk(2, End::Running));
        // Full: the finished one makes room.
        let s = r.reserve(2).unwrap();
        assert!(r.get(1).is_none() && r.get(2).is_some());
        // A slot being started counts.
        let e = r.reserve(2).err().expect("refused");
        assert_eq!(e.code(), shoal_api::ErrorCode::SandboxBusy, "{e}");
        r.insert(s, mk(3, End::Running));
        assert!(r.reserve(2).is_err());
        let ids: Vec<String> = r.all().iter().map(|c| c.view().id).collect();
        assert_eq!(ids, ["2", "3"]);
        assert_eq!(r.get(3).unwrap().view().state, api::CommandState::Running);
        r.get(2).unwrap().finish(End::Lost("x".into()));
        assert_eq!(r.get(2).unwrap().view().state, api::CommandState::Lost);
        assert!(r.reserve(2).is_ok());
    }
}
