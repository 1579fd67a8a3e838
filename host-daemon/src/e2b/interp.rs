//! The `code-interpreter-v1` template: what `e2b_code_interpreter.Sandbox`
//! creates by default. Built by the daemon on first use
//! ([`ensure_template`]): a sandbox of the `base` image with the
//! `code-interpreter` layer (python3-numpy, -pandas, -matplotlib from
//! Debian), into which the daemon writes its own interpreter server
//! ([`SERVER`], `interp_server.py`: Python standard library only, no
//! Jupyter), starts it on port 49999 with numpy, pandas and
//! matplotlib.pyplot imported in the default context, waits until it
//! answers, and snapshots that sandbox into the template. Every sandbox
//! restored from it serves `/execute` at once, warm. The layer is a
//! guest artifact like the images (`shoal artifacts build
//! code-interpreter`); without it the build fails saying so.

use crate::auth::Principal;
use crate::db::TemplateRow;
use crate::{lifecycle, ops, ApiError, ApiResult, Daemon};
use agent_client::{ExecRequest, Transport, UploadOptions};
use shoal_api::{CreateSandbox, SnapshotRequest, TemplateState};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The template's name (the SDK's default `templateID`).
pub const TEMPLATE: &str = "code-interpreter-v1";
/// The interpreter server's source, written into the guest.
pub const SERVER: &str = include_str!("interp_server.py");
/// Where it goes in the guest.
pub const SERVER_PATH: &str = "/opt/shoal/code-interpreter/server.py";
/// The image and layer the template is made of.
pub const IMAGE: &str = "base";
/// The Debian-package layer with numpy, pandas and matplotlib.
pub const LAYER: &str = "code-interpreter";
/// Memory of the template's sandboxes (MiB): pandas and matplotlib
/// loaded take ~120 MiB.
pub const MEMORY_MIB: u32 = 512;
/// Modules imported into the default context before the snapshot.
pub const WARM: &str = "numpy,pandas,matplotlib,matplotlib.pyplot";
/// Longest the build waits for the server to answer (imports of the
/// scientific stack take a while under PVM).
pub const READY_TIMEOUT: Duration = Duration::from_secs(1800);

/// Builds one at a time.
fn build_lock() -> &'static tokio::sync::Mutex<()> {
    static LOCK: std::sync::OnceLock<tokio::sync::Mutex<()>> = std::sync::OnceLock::new();
    LOCK.get_or_init(|| tokio::sync::Mutex::new(()))
}

/// Whether `id` names the code interpreter's template.
pub fn is_template(id: &str) -> bool {
    id == TEMPLATE
}

/// The ready `code-interpreter-v1` template, built first if there is none
/// (or the last build failed). Concurrent callers wait for one build.
pub async fn ensure_template(d: &Arc<Daemon>) -> ApiResult<TemplateRow> {
    if let Some(t) = ready(d)? {
        return Ok(t);
    }
    let _g = build_lock().lock().await;
    if let Some(t) = ready(d)? {
        return Ok(t);
    }
    if d.db(|db| db.template(TEMPLATE))?.is_some() {
        // A failed or half-made one: made again.
        match crate::templates::delete_template(d, TEMPLATE, &Principal::Daemon).await {
            Ok(()) | Err(ApiError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    d.event(TEMPLATE, "template_building", "code interpreter");
    let t0 = Instant::now();
    let res = build(d).await;
    match &res {
        Ok(_) => d.event(
            TEMPLATE,
            "template_ready",
            &format!("code interpreter, in {:.1} s", t0.elapsed().as_secs_f64()),
        ),
        Err(e) => d.event(TEMPLATE, "template_failed", &e.to_string()),
    }
    res
}

fn ready(d: &Daemon) -> ApiResult<Option<TemplateRow>> {
    Ok(d.db(|db| db.template(TEMPLATE))?
        .filter(|t| t.state == TemplateState::Ready && t.kind == d.backend.kind()))
}

async fn build(d: &Arc<Daemon>) -> ApiResult<TemplateRow> {
    let req = CreateSandbox {
        image: Some(IMAGE.into()),
        memory_mib: Some(MEMORY_MIB),
        layers: vec![LAYER.into()],
        ..Default::default()
    };
    let sb = lifecycle::create(d, req).await?;
    let res = prepare_and_snapshot(d, &sb.id).await;
    let _ = ops::kill(d, &sb.id, "code interpreter template built").await;
    res
}

async fn prepare_and_snapshot(d: &Arc<Daemon>, id: &str) -> ApiResult<TemplateRow> {
    let (_, live, _busy) = lifecycle::ensure_running(d, id).await?;
    let c = ops::agent(d, &live).await?;
    let t = d.cfg.agent.call_timeout;
    let write = async {
        let opts = UploadOptions {
            mode: 0o755,
            append: false,
            create_parents: true,
        };
        let mut up = c.open_upload(SERVER_PATH, opts).await?;
        up.write(SERVER.as_bytes()).await?;
        up.finish().await
    };
    tokio::time::timeout(t, write)
        .await
        .map_err(|_| ApiError::Timeout("writing the code interpreter server".into()))??;
    // No timeout: the server runs as long as the sandbox (the exec is left
    // detached; its output is nothing).
    // On TCP 49999 where the guest kernel has IPv4, and on the Unix socket
    // the agent's port relay tries first (the guest kernel has no IPv4).
    let start = ExecRequest::argv([
        "python3",
        SERVER_PATH,
        "--port",
        "49999",
        "--unix",
        "/run/shoal/ports/49999",
    ])
    .with_env("SHOAL_CI_WARM", WARM)
    .with_cwd("/");
    let handle = tokio::time::timeout(t, c.exec(&start))
        .await
        .map_err(|_| ApiError::Timeout("starting the code interpreter server".into()))??;
    let transport = live
        .vm()
        .ok_or_else(|| ApiError::Internal(format!("sandbox '{id}' has no VM")))?
        .agent();
    wait_healthy(&transport, super::CODE_INTERPRETER_PORT, READY_TIMEOUT).await?;
    drop(handle);
    drop(c);
    lifecycle::snapshot(
        d,
        id,
        SnapshotRequest {
            template: Some(TEMPLATE.into()),
        },
        &Principal::Daemon,
    )
    .await
}

/// Polls `GET /health` on the guest's `port` until it answers 200.
pub async fn wait_healthy(t: &Transport, port: u16, within: Duration) -> ApiResult<()> {
    let until = Instant::now() + within;
    let mut last = String::from("no answer");
    while Instant::now() < until {
        match health(t, port).await {
            Ok(200) => return Ok(()),
            Ok(s) => last = format!("status {s}"),
            Err(e) => last = e,
        }
        // Each probe costs the guest a connection; the build takes seconds.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(ApiError::Timeout(format!(
        "the code interpreter did not answer on port {port} within {within:?}: {last}"
    )))
}

/// The status of one `GET /health` (the reply's status line only).
async fn health(t: &Transport, port: u16) -> Result<u16, String> {
    let step = Duration::from_secs(5);
    let mut s = agent_client::tcp_connect(t, port, step)
        .await
        .map_err(|e| e.to_string())?;
    let ask = async {
        s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    };
    let head = tokio::time::timeout(step, ask)
        .await
        .map_err(|_| "no reply".to_string())?
        .map_err(|e| e.to_string())?;
    // "HTTP/1.1 200"
    std::str::from_utf8(head.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP reply: {:?}", String::from_utf8_lossy(&head)))
}
