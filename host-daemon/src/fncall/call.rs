//! One call in its clone: made from the language's template, fed, waited
//! for under the call's deadlines, read back, destroyed.
//!
//! Every failure of the sandbox (no clone, an agent that errs or goes
//! away, a guest that crashes) is a `sandbox_error` result with the
//! reason, never a hang: every step into the guest has a deadline, the
//! run's is the call's timeout, after which the clone is killed.

use super::registry::{Spec, WORKDIR};
use super::template::{self, Ready};
use super::validate::{Call, MAX_FETCH_BYTES};
use crate::exec::{write_all, Capped};
use crate::{lifecycle, ops, within, ApiError, ApiResult, Daemon};
use agent_client::{
    AsyncClient, AsyncExecHandle, ExecEvent, ExecRequest, ExitStatus, UploadOptions,
};
use shoal_api::fncall::{CompileResult, FnCallResult, FnCallStatus};
use shoal_api::{CreateSandbox, Encoding};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a call may wait for the host to admit its clone.
const QUEUE_WAIT: Duration = Duration::from_secs(120);
/// Deadline of each step that is not the program's run (uploads, fetches,
/// the compile's own steps).
const STEP: Duration = Duration::from_secs(60);
/// Sets the exec's cgroup `memory.max` to `$1` (the memory controller
/// enabled below the user cgroup first: the agent's exec cgroups have none
/// of their own), then runs the rest (dash builtins only: no process is
/// started for it).
const MEMORY_WRAPPER: &str = "m=$1; shift; read -r c </proc/self/cgroup; \
    c=/sys/fs/cgroup${c#0::}; echo +memory >\"${c%/*}/cgroup.subtree_control\" 2>/dev/null; \
    echo \"$m\" >\"$c/memory.max\" || exit 125; exec \"$@\"";

/// A warm runner's stream: its output up to the end marker the runner
/// writes once the program is done (`MARK`, then on stdout `:STATUS`, then
/// a newline), which is not output. The last bytes are held back until
/// they cannot be the start of the marker.
struct Marked {
    out: Capped,
    mark: Vec<u8>,
    hold: Vec<u8>,
    /// What followed the marker, once its line was complete.
    end: Option<Vec<u8>>,
}

impl Marked {
    fn new(limit: usize, nonce: &str) -> Marked {
        Marked {
            out: Capped::new(limit),
            mark: format!("\0SHOAL-FNCALL-END:{nonce}").into_bytes(),
            hold: Vec::new(),
            end: None,
        }
    }

    fn push(&mut self, x: &[u8]) {
        if self.end.is_some() {
            return;
        }
        self.hold.extend_from_slice(x);
        let m = self.mark.len();
        if let Some(i) = self.hold.windows(m).position(|w| w == self.mark) {
            let rest = self.hold.get(i + m..).unwrap_or_default();
            if let Some(nl) = rest.iter().position(|b| *b == b'\n') {
                self.end = Some(rest.get(..nl).unwrap_or_default().to_vec());
                self.out.push(self.hold.get(..i).unwrap_or_default());
                self.hold.clear();
                return;
            }
            if rest.len() <= 16 {
                self.out.push(self.hold.get(..i).unwrap_or_default());
                self.hold.drain(..i);
                return;
            }
        }
        let keep = m + 16;
        if self.hold.len() > keep {
            let n = self.hold.len() - keep;
            self.out.push(self.hold.get(..n).unwrap_or_default());
            self.hold.drain(..n);
        }
    }

    fn finish(&mut self) {
        let h = std::mem::take(&mut self.hold);
        self.out.push(&h);
    }
}

/// Reads a warm runner's output until both streams' end markers came
/// (the program's status is the stdout marker's, and whether it failed at
/// its memory limit) or the exec ends.
async fn collect_marked(
    h: &mut AsyncExecHandle,
    out: &mut Marked,
    err: &mut Marked,
    deadline: Duration,
) -> ApiResult<(Ended, bool)> {
    h.set_deadline(None);
    let work = async {
        loop {
            match h.next_event().await? {
                Some(ExecEvent::Stdout(x)) => out.push(&x),
                Some(ExecEvent::Stderr(x)) => err.push(&x),
                Some(ExecEvent::Exit(r)) => return Ok::<_, ApiError>((r.status, false)),
                None => {
                    return Err(ApiError::Sandbox(
                        "the sandbox ended the program's stream early".into(),
                    ))
                }
            }
            if let (Some(status), Some(_)) = (&out.end, &err.end) {
                let s = std::str::from_utf8(status).unwrap_or_default();
                let (s, oom) = match s.strip_suffix(":oom") {
                    Some(s) => (s, true),
                    None => (s, false),
                };
                let code = s
                    .strip_prefix(':')
                    .and_then(|s| s.parse::<i32>().ok())
                    .ok_or_else(|| {
                        ApiError::Sandbox("the runner's end marker has no status".into())
                    })?;
                return Ok((ExitStatus::Exited(code), oom));
            }
        }
    };
    match tokio::time::timeout(deadline, work).await {
        Ok(Ok((s, oom))) => Ok((Ended::Exit(s), oom)),
        Ok(Err(e)) => Err(e),
        Err(_) => Ok((Ended::TimedOut, false)),
    }
}

/// How a run ended, as the daemon saw it.
enum Ended {
    /// The program exited (or was killed by a signal).
    Exit(ExitStatus),
    /// Its deadline passed.
    TimedOut,
}

/// A result for a call that could not run.
pub fn sandbox_error(t0: Instant, why: impl Into<String>) -> FnCallResult {
    FnCallResult {
        status: FnCallStatus::SandboxError,
        stdout: String::new(),
        stderr: String::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        exit_code: None,
        signal: None,
        duration_ms: 0.0,
        total_ms: t0.elapsed().as_secs_f64() * 1e3,
        files: BTreeMap::new(),
        compile: None,
        error: Some(why.into()),
    }
}

/// Runs `call` (checked) to its result.
pub async fn run(d: &Arc<Daemon>, call: Call) -> FnCallResult {
    let t0 = Instant::now();
    let spec = call.spec;
    let ready = match template::ensure(d, spec).await {
        Ok(r) => r,
        Err(e) => {
            return sandbox_error(t0, format!("no template for language '{}': {e}", spec.name))
        }
    };
    let id = match clone(d, &ready, &call).await {
        Ok(id) => id,
        Err(e) => {
            if matches!(e, ApiError::NotFound(_) | ApiError::Backend { .. }) {
                // The template may be gone or broken: found again next time.
                template::forget(d, spec);
            }
            return sandbox_error(t0, format!("no sandbox for the call: {e}"));
        }
    };
    let res = in_clone(d, &id, &ready, call, t0).await;
    let d2 = d.clone();
    tokio::spawn(async move {
        if let Err(e) = ops::kill(&d2, &id, "fncall done").await {
            tracing::warn!(sandbox = %id, "removing a fncall clone: {e}");
        }
    });
    match res {
        Ok(r) => r,
        Err(e) => sandbox_error(t0, e.to_string()),
    }
}

/// A new clone of `ready`'s template (from its pool when it has one),
/// waiting while the host admits no more.
async fn clone(d: &Arc<Daemon>, ready: &Ready, call: &Call) -> ApiResult<String> {
    let until = Instant::now() + QUEUE_WAIT;
    let mut pause = Duration::from_millis(10);
    loop {
        let mut req = CreateSandbox::from_template(ready.template.clone());
        // A safety net only: the clone is killed as soon as it answers.
        req.ttl_s = (call.timeout + call.compile_timeout).as_secs() + 600;
        req.metadata
            .insert("shoal.fncall".into(), call.spec.name.into());
        match lifecycle::create(d, req).await {
            Ok(v) => return Ok(v.id),
            Err(ApiError::Refused(_)) if Instant::now() + pause < until => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(250));
            }
            Err(e) => return Err(e),
        }
    }
}

async fn upload(c: &AsyncClient, path: &str, data: &[u8], mode: u32) -> ApiResult<()> {
    let opts = UploadOptions {
        mode,
        append: false,
        create_parents: true,
    };
    within(&format!("writing {path}"), STEP, async {
        let mut up = c.open_upload(path, opts).await?;
        up.write(data).await?;
        up.finish().await?;
        Ok(())
    })
    .await
}

/// Reads `path` back, at most [`MAX_FETCH_BYTES`]; `None` if it is not
/// there (or is no file).
async fn fetch(c: &AsyncClient, path: &str) -> ApiResult<Option<(Vec<u8>, bool)>> {
    within(&format!("reading {path}"), STEP, async {
        let mut dl = match c.open_download(path, 0, Some(MAX_FETCH_BYTES + 1)).await {
            Ok(dl) => dl,
            Err(e) if e.errno().is_some() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut v = Vec::new();
        loop {
            match dl.next_chunk().await {
                Ok(Some(x)) => v.extend_from_slice(&x),
                Ok(None) => break,
                Err(e) if e.errno().is_some() => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
        let cut = v.len() as u64 > MAX_FETCH_BYTES;
        v.truncate(usize::try_from(MAX_FETCH_BYTES).unwrap_or(usize::MAX));
        Ok(Some((v, cut)))
    })
    .await
}

/// Reads `h`'s output into `out` and `err` until it ends or `deadline`
/// passes.
async fn collect(
    h: &mut AsyncExecHandle,
    out: &mut Capped,
    err: &mut Capped,
    deadline: Duration,
) -> ApiResult<Ended> {
    h.set_deadline(None);
    let work = async {
        loop {
            match h.next_event().await? {
                Some(ExecEvent::Stdout(x)) => out.push(&x),
                Some(ExecEvent::Stderr(x)) => err.push(&x),
                Some(ExecEvent::Exit(r)) => return Ok::<_, ApiError>(r.status),
                None => {
                    return Err(ApiError::Sandbox(
                        "the sandbox ended the program's stream early".into(),
                    ))
                }
            }
        }
    };
    match tokio::time::timeout(deadline, work).await {
        Ok(Ok(s)) => Ok(Ended::Exit(s)),
        Ok(Err(e)) => Err(e),
        Err(_) => Ok(Ended::TimedOut),
    }
}

/// Whether the guest's user cgroup saw an OOM kill (its `memory.events`
/// counts those of every exec's cgroup below it).
async fn oom_killed(c: &AsyncClient) -> bool {
    match fetch(c, "/sys/fs/cgroup/shoal-user/memory.events").await {
        Ok(Some((b, _))) => String::from_utf8_lossy(&b).lines().any(|l| {
            l.strip_prefix("oom_kill ")
                .and_then(|n| n.trim().parse::<u64>().ok())
                .is_some_and(|n| n > 0)
        }),
        _ => false,
    }
}

/// The argv of a cold run of `spec`.
fn cold_argv(spec: &Spec, call: &Call) -> Vec<String> {
    let mut v = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        MEMORY_WRAPPER.into(),
        "fncall".into(),
        call.memory_max.to_string(),
    ];
    v.extend(spec.fill(spec.run));
    v.extend(call.args.iter().cloned());
    v
}

/// The warm runner's request: 10 decimal digits of length, then the JSON.
fn runner_request(call: &Call, nonce: &str) -> ApiResult<Vec<u8>> {
    let j = serde_json::json!({
        "code": call.code,
        "args": call.args,
        "env": call.env,
        "memory_max": call.memory_max,
        "nonce": nonce,
    });
    let body = serde_json::to_vec(&j).map_err(|e| ApiError::Internal(e.to_string()))?;
    let mut v = format!("{:010}", body.len()).into_bytes();
    v.extend_from_slice(&body);
    Ok(v)
}

/// The compile step; `Err(result)` when the call ends there.
async fn compile(
    c: &AsyncClient,
    argv: Vec<String>,
    call: &Call,
) -> ApiResult<(CompileResult, Option<FnCallStatus>)> {
    let t = Instant::now();
    let req = ExecRequest::argv(argv).with_cwd(WORKDIR);
    let mut h = within("starting the compiler", STEP, async {
        Ok(c.exec(&req).await?)
    })
    .await?;
    let (mut out, mut err) = (
        Capped::new(call.output_limit),
        Capped::new(call.output_limit),
    );
    let ended = collect(&mut h, &mut out, &mut err, call.compile_timeout).await?;
    let (exit_code, timed_out) = match ended {
        Ended::Exit(ExitStatus::Exited(c)) => (Some(c), false),
        Ended::Exit(ExitStatus::Signaled(_)) => (None, false),
        Ended::TimedOut => (None, true),
    };
    let status = match (timed_out, exit_code) {
        (true, _) => Some(FnCallStatus::Timeout),
        (false, Some(0)) => None,
        _ => Some(FnCallStatus::CompileError),
    };
    let r = CompileResult {
        exit_code,
        stdout: out.text(),
        stderr: err.text(),
        duration_ms: t.elapsed().as_secs_f64() * 1e3,
        timed_out,
    };
    Ok((r, status))
}

/// The call in clone `id`.
async fn in_clone(
    d: &Arc<Daemon>,
    id: &str,
    ready: &Ready,
    call: Call,
    t0: Instant,
) -> ApiResult<FnCallResult> {
    let spec = call.spec;
    let (_, live, _busy) = lifecycle::ensure_running(d, id).await?;
    let c = ops::agent(d, &live).await?;
    for (p, data) in &call.files {
        upload(&c, p, data, 0o644).await?;
    }
    let mut compiled = None;
    if ready.runner.is_none() {
        let src = format!("{WORKDIR}/{}", spec.source_file);
        upload(&c, &src, call.code.as_bytes(), 0o644).await?;
        if let Some(argv) = spec.compile {
            let (r, end) = compile(&c, spec.fill(argv), &call).await?;
            if let Some(status) = end {
                let mut res = sandbox_error(t0, "");
                res.status = status;
                res.error = None;
                res.compile = Some(r);
                return Ok(res);
            }
            compiled = Some(r);
        }
    }
    let tr = Instant::now();
    let nonce = shoal_runtime::fresh::random_id();
    let (mut mo, mut me) = (
        Marked::new(call.output_limit, &nonce),
        Marked::new(call.output_limit, &nonce),
    );
    let (mut out, mut err) = (
        Capped::new(call.output_limit),
        Capped::new(call.output_limit),
    );
    let mut h = match ready.runner {
        Some(exec_id) => {
            let h = within("attaching to the warm runner", STEP, async {
                Ok(c.attach(exec_id).await?)
            })
            .await?;
            let mut input = runner_request(&call, &nonce)?;
            input.extend_from_slice(&call.stdin);
            within("writing the call", STEP, async {
                write_all(&h, &input).await?;
                h.close_stdin().await?;
                Ok(())
            })
            .await?;
            h
        }
        None => {
            let mut req = ExecRequest::argv(cold_argv(spec, &call))
                .with_cwd(WORKDIR)
                .with_stdin();
            for (k, v) in &call.env {
                req = req.with_env(k, v);
            }
            let h = within("starting the program", STEP, async {
                Ok(c.exec(&req).await?)
            })
            .await?;
            within("writing stdin", STEP, async {
                write_all(&h, &call.stdin).await?;
                h.close_stdin().await?;
                Ok(())
            })
            .await?;
            h
        }
    };
    let fed_ms = tr.elapsed().as_secs_f64() * 1e3;
    let (ended, at_limit) = if ready.runner.is_some() {
        let e = collect_marked(&mut h, &mut mo, &mut me, call.timeout).await?;
        // What was held back (a timeout: the output so far).
        mo.finish();
        me.finish();
        (out, err) = (mo.out, me.out);
        e
    } else {
        (
            collect(&mut h, &mut out, &mut err, call.timeout).await?,
            false,
        )
    };
    let duration_ms = tr.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(
        sandbox = id,
        language = spec.name,
        ready_ms = tr.duration_since(t0).as_secs_f64() * 1e3,
        fed_ms,
        duration_ms,
        "fncall phases"
    );
    let (status, exit_code, signal) = match ended {
        Ended::TimedOut => (FnCallStatus::Timeout, None, None),
        Ended::Exit(ExitStatus::Exited(0)) => (FnCallStatus::Success, Some(0), None),
        Ended::Exit(ExitStatus::Exited(n)) if at_limit => {
            (FnCallStatus::OutOfMemory, Some(n), None)
        }
        Ended::Exit(ExitStatus::Exited(n)) => (FnCallStatus::Failed, Some(n), None),
        Ended::Exit(ExitStatus::Signaled(s)) => {
            let oom = s == libc::SIGKILL && oom_killed(&c).await;
            let st = if oom {
                FnCallStatus::OutOfMemory
            } else {
                FnCallStatus::Failed
            };
            (st, None, Some(s))
        }
    };
    let mut files = BTreeMap::new();
    let mut notes = Vec::new();
    if !matches!(ended, Ended::TimedOut) {
        for (p, name) in &call.fetch {
            if let Some((b, cut)) = fetch(&c, p).await? {
                if cut {
                    notes.push(format!("{name}: cut at {MAX_FETCH_BYTES} bytes"));
                }
                files.insert(name.clone(), Encoding::Base64.encode_as(&b));
            }
        }
    }
    Ok(FnCallResult {
        status,
        stdout: out.text(),
        stderr: err.text(),
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        exit_code,
        signal,
        duration_ms,
        total_ms: t0.elapsed().as_secs_f64() * 1e3,
        files,
        compile: compiled,
        error: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fncall::validate::check;
    use shoal_api::fncall::FnCallRequest;

    #[test]
    fn capped_output_is_cut_and_flagged() {
        let mut c = Capped::new(5);
        c.push(b"abc");
        assert!(!c.truncated);
        c.push(b"defg");
        assert!(c.truncated);
        assert_eq!(c.text(), "abcde");
        let mut z = Capped::new(0);
        z.push(b"");
        assert!(!z.truncated);
    }

    #[test]
    fn the_end_marker_is_found_across_frames_and_is_not_output() {
        let mut m = Marked::new(100, "abc");
        m.push(b"hello\n\0SHOAL-FNCA");
        assert!(m.end.is_none());
        m.push(b"LL-END:abc:");
        m.push(b"7\n");
        assert_eq!(m.end.as_deref(), Some(&b":7"[..]));
        m.push(b"after");
        m.finish();
        assert_eq!(m.out.text(), "hello\n");
        // Another nonce is output; held-back bytes come out at the end.
        let mut m = Marked::new(100, "abc");
        m.push(b"\0SHOAL-FNCALL-END:xyz:0\n");
        m.push(b"tail");
        assert!(m.end.is_none());
        m.finish();
        assert_eq!(m.out.text(), "\0SHOAL-FNCALL-END:xyz:0\ntail");
        // A long output passes through the cap.
        let mut m = Marked::new(10, "abc");
        m.push(&[b'x'; 1000]);
        m.finish();
        assert_eq!((m.out.bytes.len(), m.out.truncated), (10, true));
    }

    #[test]
    fn runner_request_is_length_prefixed_json() {
        let call = check(FnCallRequest {
            language: "python".into(),
            code: "print('hi')".into(),
            args: vec!["a".into()],
            ..Default::default()
        })
        .unwrap();
        let r = runner_request(&call, "n0").unwrap();
        let n: usize = std::str::from_utf8(&r[..10]).unwrap().parse().unwrap();
        assert_eq!(n, r.len() - 10);
        let j: serde_json::Value = serde_json::from_slice(&r[10..]).unwrap();
        assert_eq!(j["code"], "print('hi')");
        assert_eq!(j["args"][0], "a");
        assert_eq!(j["memory_max"], call.memory_max);
        assert_eq!(j["nonce"], "n0");
    }

    #[test]
    fn cold_runs_go_through_the_memory_wrapper() {
        let call = check(FnCallRequest {
            language: "bash".into(),
            code: "echo hi".into(),
            args: vec!["x".into()],
            memory_mib: Some(64),
            ..Default::default()
        })
        .unwrap();
        let v = cold_argv(call.spec, &call);
        assert_eq!(v[..2], ["/bin/sh", "-c"]);
        assert_eq!(v[4], (64u64 << 20).to_string());
        assert_eq!(v[5..], ["bash", "/tmp/fncall/main.sh", "x"]);
    }
}
