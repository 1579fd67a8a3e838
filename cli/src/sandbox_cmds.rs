//! `shoal run --direct` and `shoal vm ...` (without the daemon:
//! each sandbox is a `shoal-vmm` process restored from a template).

use crate::progress::Live;
use crate::{ExecArgs, SandboxArgs};
use agent_client::{Client, ExecEvent, ExecRequest, ExitStatus, UploadOptions};
use anyhow::{bail, Context, Result};
use shoal_images::layers::{self, Upper};
use shoal_runtime::sandbox::{self, Sandbox, TemplateSpec};
use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

fn template(a: &SandboxArgs) -> Result<std::path::PathBuf> {
    let layers = a
        .root
        .layers()?
        .iter()
        .map(|l| {
            if shoal_images::artifacts::is_named_layer(l) {
                crate::image_path(l)
            } else {
                Ok(l.into())
            }
        })
        .collect::<Result<_>>()?;
    let spec = TemplateSpec {
        layers,
        upper: Upper::from_request(a.root.upper_size, a.root.upper_disk, a.memory)?,
        ..TemplateSpec::new(&a.image, a.cpus, a.memory)
    };
    Ok(sandbox::template(&spec, &mut |l| eprintln!("{l}"))?)
}

fn request(e: &ExecArgs) -> Result<ExecRequest> {
    if e.command.is_empty() {
        bail!("give the command after `--`");
    }
    let mut r = ExecRequest::argv(e.command.iter().map(|s| s.as_bytes().to_vec()));
    for kv in &e.env {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--env {kv:?}: expected NAME=VALUE");
        };
        r = r.with_env(k, v);
    }
    if let Some(c) = &e.cwd {
        r = r.with_cwd(c);
    }
    if let Some(t) = e.timeout {
        r = r.with_timeout(Duration::try_from_secs_f64(t).context("--timeout")?);
    }
    Ok(r.with_stdin())
}

/// Runs `e` on `client`, streaming stdio; returns the shell-style exit code.
fn run_on(client: &Client, e: &ExecArgs) -> Result<i32> {
    let mut h = client.exec(&request(e)?)?;
    // Forward our stdin unless it is a terminal (no interactive sessions yet).
    let mut stdin = h.stdin();
    let feeder = if std::io::stdin().is_terminal() {
        let _ = stdin.close();
        None
    } else {
        Some(std::thread::spawn(move || {
            let mut buf = vec![0u8; 256 * 1024];
            let mut input = std::io::stdin().lock();
            loop {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if stdin.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = stdin.close();
        }))
    };
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    let code = loop {
        match h.next_event()? {
            Some(ExecEvent::Stdout(d)) => {
                out.write_all(&d)?;
                out.flush()?;
            }
            Some(ExecEvent::Stderr(d)) => {
                err.write_all(&d)?;
            }
            Some(ExecEvent::Exit(r)) => {
                if r.timed_out {
                    eprintln!("shoal: command timed out; its processes were killed");
                }
                break match r.status {
                    ExitStatus::Exited(c) => c,
                    ExitStatus::Signaled(s) => 128 + s,
                };
            }
            None => bail!("the sandbox closed the connection before the command ended"),
        }
    };
    drop(feeder);
    Ok(code)
}

/// `shoal run`.
pub fn run(a: &SandboxArgs, e: &ExecArgs) -> Result<i32> {
    let tpl = template(a)?;
    let (sb, mut child) = Sandbox::start(&tpl, false)?;
    let res = (|| {
        let client = sb
            .connect(CONNECT_TIMEOUT, true)
            .with_context(|| format!("sandbox did not come up; VMM log: {}", sb.vmm_log_tail()))?;
        run_on(&client, e)
    })();
    sb.stop(child.as_mut());
    res
}

/// `shoal vm start`.
pub fn start(a: &SandboxArgs) -> Result<i32> {
    let tpl = template(a)?;
    let (sb, _child) = Sandbox::start(&tpl, true)?;
    // Make sure it is up (and give it fresh entropy and time) before we say so.
    if let Err(e) = sb.connect(CONNECT_TIMEOUT, true) {
        let log = sb.vmm_log_tail();
        sb.stop(None);
        return Err(e).context(format!("sandbox did not come up; VMM log: {log}"));
    }
    println!("{}", sb.id);
    Ok(0)
}

/// `shoal vm ls`.
pub fn ls() -> Result<i32> {
    for id in Sandbox::list() {
        let st = Sandbox::open(&id).ok().and_then(|s| {
            vmm_api::Client::new(&s.api_sock, Duration::from_secs(5))
                .stats()
                .ok()
        });
        match st {
            Some(s) => println!(
                "{id}  {:<8} {} vCPU  {} MiB  up {} s  pid {}",
                s.state,
                s.vcpus,
                s.memory_mib,
                s.uptime_ms / 1000,
                s.pid
            ),
            None => println!("{id}  unreachable (stale; `shoal vm stop {id}` removes it)"),
        }
    }
    Ok(0)
}

/// `shoal vm stop`.
pub fn stop(id: &str) -> Result<i32> {
    Sandbox::open(id)?.stop(None);
    Ok(0)
}

/// `shoal vm pause|resume|stats`, `shoal snapshot`.
pub fn control(id: &str, req: vmm_api::Request) -> Result<i32> {
    let sb = Sandbox::open(id)?;
    let r = vmm_api::Client::new(&sb.api_sock, Duration::from_secs(300)).call(&req)?;
    if let (vmm_api::Request::Snapshot { dir, .. }, Some(disk)) =
        (&req, layers::scratch_disk(&sb.dir))
    {
        // The VM stays paused after a snapshot: its scratch disk as it is
        // now belongs with the snapshot (restores copy it in turn).
        let to = dir.join(layers::SCRATCH_DISK);
        let _ = std::fs::remove_file(&to);
        layers::clone_file(&disk, &to)?;
    }
    println!("{}", serde_json::to_string_pretty(&r)?);
    Ok(0)
}

/// `shoal exec`.
pub fn exec(id: &str, e: &ExecArgs) -> Result<i32> {
    let sb = Sandbox::open(id)?;
    let client = sb.connect(Duration::from_secs(10), false)?;
    run_on(&client, e)
}

/// `shoal cp`.
pub fn cp(src: &str, dst: &str) -> Result<i32> {
    let remote = |s: &str| {
        s.split_once(':')
            .filter(|(id, _)| !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(|(id, p)| (id.to_string(), p.to_string()))
    };
    match (remote(src), remote(dst)) {
        (None, Some((id, path))) => {
            let c = Sandbox::open(&id)?.connect(Duration::from_secs(10), false)?;
            let mut f = std::fs::File::open(src).with_context(|| format!("cannot open {src}"))?;
            let mode = f
                .metadata()
                .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
                .unwrap_or(0o644);
            let opts = UploadOptions {
                mode,
                ..Default::default()
            };
            let len = f.metadata().ok().map(|m| m.len());
            let live = Live::start_quiet(&format!("copying {src} to {id}:{path}"));
            let n = c.upload(&mut live.counted(&mut f, len), &path, opts)?;
            drop(live);
            eprintln!("copied {n} bytes to {id}:{path}");
        }
        (Some((id, path)), None) => {
            let c = Sandbox::open(&id)?.connect(Duration::from_secs(10), false)?;
            let tmp = format!("{dst}.shoal-partial");
            let mut f =
                std::fs::File::create(&tmp).with_context(|| format!("cannot create {tmp}"))?;
            let live = Live::start_quiet(&format!("copying {id}:{path} to {dst}"));
            let r = c.download(&path, &mut live.counted(&mut f, None));
            drop(live);
            match r {
                Ok(n) => {
                    std::fs::rename(&tmp, dst)?;
                    eprintln!("copied {n} bytes from {id}:{path}");
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e.into());
                }
            }
        }
        _ => bail!("exactly one of SRC and DST must be ID:PATH (a sandbox path)"),
    }
    Ok(0)
}
