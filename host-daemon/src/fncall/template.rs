//! The template each call of a language is restored from.
//!
//! - A cold language (no warm mode) uses the daemon's image template of
//!   its image, shape and layers ([`crate::templates::image_template`]:
//!   booted once, cached by content); each call execs its compiler and
//!   program in a clone of it.
//! - A warm language gets a template of its own, `fncall-LANG-HASH`
//!   (`HASH`: of the image template's name, the runner and its command
//!   line, so a new runner or layer makes a new template): a sandbox of the
//!   image template gets the runner, starts it as a detached exec, waits
//!   for its ready marker (interpreter started, modules imported, blocked
//!   reading its call on stdin), and is snapshotted right then into the
//!   template (the daemon's own, so its pool is everyone's), then killed.
//!   The runner's exec id is kept beside the snapshot (`fncall.json` in
//!   the template's directory): a clone attaches to it and writes the call
//!   to its stdin. Built on first use, once at a time per language; a
//!   daemon restart finds it again in the database.

use super::registry::{Spec, READY};
use crate::auth::Principal;
use crate::db::TemplateRow;
use crate::{lifecycle, ops, templates, within, ApiError, ApiResult, Daemon};
use agent_client::{ExecEvent, ExecRequest, UploadOptions};
use shoal_api::{CreateSandbox, RootRequest, SnapshotRequest, TemplateState};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The file beside a warm template's snapshot that names its runner.
const META_FILE: &str = "fncall.json";
/// How long a warm runner may take to get ready.
const READY_WAIT: Duration = Duration::from_secs(180);

/// A template calls of one language are restored from.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The template.
    pub template: String,
    /// Its directory (the cache is keyed by it: a rebuilt template has
    /// another).
    pub dir: PathBuf,
    /// The warm runner's exec id (warm languages only).
    pub runner: Option<u64>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Meta {
    runner_exec_id: u64,
}

/// Ready templates by (state directory, language): the database lookup
/// is skipped on the hot path.
fn cache() -> &'static Mutex<HashMap<(PathBuf, &'static str), Ready>> {
    static C: OnceLock<Mutex<HashMap<(PathBuf, &'static str), Ready>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// A language's build lock.
type BuildLock = Arc<tokio::sync::Mutex<()>>;

/// One build at a time per language.
fn build_lock(lang: &'static str) -> BuildLock {
    static L: OnceLock<Mutex<HashMap<&'static str, BuildLock>>> = OnceLock::new();
    L.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(lang)
        .or_default()
        .clone()
}

fn key(d: &Daemon, spec: &Spec) -> (PathBuf, &'static str) {
    (d.cfg.state_dir.clone(), spec.name)
}

/// Forgets the cached template of `spec` (a restore from it failed: it
/// may have been deleted).
pub fn forget(d: &Daemon, spec: &Spec) {
    cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&key(d, spec));
}

/// The cached template of `spec`, if one is ready.
pub fn cached(d: &Daemon, spec: &Spec) -> Option<Ready> {
    cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key(d, spec))
        .cloned()
}

/// The root of `spec`'s template.
fn root(spec: &Spec) -> ApiResult<RootRequest> {
    Ok(RootRequest {
        layers: spec.layers_here().map_err(ApiError::Conflict)?,
        ..Default::default()
    })
}

/// The name of `spec`'s warm template over the image template `base`.
pub fn warm_name(spec: &Spec, base: &str) -> String {
    let w = spec.warm.map(|w| (w.script, w.start.join("\0")));
    let (script, start) = w.unwrap_or_default();
    let parts: [&[u8]; 4] = [
        base.as_bytes(),
        spec.name.as_bytes(),
        script.as_bytes(),
        start.as_bytes(),
    ];
    format!(
        "fncall-{}-{}",
        spec.name,
        &shoal_runtime::sandbox::hash_hex(&parts)[..12]
    )
}

/// The template calls of `spec` are restored from, built if need be.
pub async fn ensure(d: &Arc<Daemon>, spec: &'static Spec) -> ApiResult<Ready> {
    if let Some(r) = cached(d, spec) {
        return Ok(r);
    }
    let lock = build_lock(spec.name);
    let _g = lock.lock().await;
    if let Some(r) = cached(d, spec) {
        return Ok(r);
    }
    let base =
        templates::image_template(d, spec.image, 1, spec.memory_mib, &root(spec)?, false).await?;
    let ready = match spec.warm {
        None => Ready {
            template: base.name.clone(),
            dir: base.dir.clone(),
            runner: None,
        },
        Some(_) => warm(d, spec, &base).await?,
    };
    cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key(d, spec), ready.clone());
    Ok(ready)
}

fn read_meta(t: &TemplateRow) -> Option<Meta> {
    let b = std::fs::read(t.dir.join(META_FILE)).ok()?;
    serde_json::from_slice(&b).ok()
}

/// The warm template of `spec` over `base`: found, or built.
async fn warm(d: &Arc<Daemon>, spec: &'static Spec, base: &TemplateRow) -> ApiResult<Ready> {
    let name = warm_name(spec, &base.name);
    if let Some(t) = d.db(|db| db.template(&name))? {
        let ours = crate::template_names::is_daemons(&t);
        match (t.state, ours, read_meta(&t)) {
            (TemplateState::Ready, true, Some(m)) if t.kind == d.backend.kind() => {
                return Ok(Ready {
                    template: t.name,
                    dir: t.dir,
                    runner: Some(m.runner_exec_id),
                })
            }
            // Failed, half made, or not the daemon's: made again.
            _ => match templates::delete_template(d, &name, &Principal::Daemon).await {
                Ok(()) | Err(ApiError::NotFound(_)) => {}
                Err(e) => return Err(e),
            },
        }
    }
    let sb = lifecycle::create(d, CreateSandbox::from_template(base.name.clone())).await?;
    let res = build(d, spec, &sb.id, &name).await;
    if let Err(e) = ops::kill(d, &sb.id, "fncall template built").await {
        tracing::warn!(sandbox = %sb.id, "removing the fncall build sandbox: {e}");
    }
    let exec_id = match res {
        Ok(x) => x,
        Err(e) => {
            let _ = templates::delete_template(d, &name, &Principal::Daemon).await;
            return Err(e);
        }
    };
    let t = ops::ready_template(d, &name)?;
    d.event(
        &name,
        "fncall_template",
        &format!("language '{}': warm runner exec {exec_id}", spec.name),
    );
    Ok(Ready {
        template: t.name,
        dir: t.dir,
        runner: Some(exec_id),
    })
}

/// In sandbox `id`: the runner written and started, ready, then the
/// snapshot into `name`. Returns the runner's exec id.
async fn build(d: &Arc<Daemon>, spec: &Spec, id: &str, name: &str) -> ApiResult<u64> {
    let w = spec
        .warm
        .ok_or_else(|| ApiError::Internal(format!("'{}' has no warm mode", spec.name)))?;
    let exec_id = {
        let (_, live, _busy) = lifecycle::ensure_running(d, id).await?;
        let c = ops::agent(d, &live).await?;
        let opts = UploadOptions {
            mode: 0o644,
            append: false,
            create_parents: true,
        };
        let mut up = c.open_upload(w.script_path, opts).await?;
        up.write(w.script.as_bytes()).await?;
        up.finish().await?;
        let mut h = c.exec(&ExecRequest::argv(w.start).with_stdin()).await?;
        let exec_id = h.exec_id();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        within("starting the fncall runner", READY_WAIT, async {
            loop {
                match h.next_event().await? {
                    Some(ExecEvent::Stdout(x)) => {
                        out.extend_from_slice(&x);
                        if out.ends_with(READY) {
                            return Ok(());
                        }
                    }
                    Some(ExecEvent::Stderr(x)) => err.extend_from_slice(&x),
                    Some(ExecEvent::Exit(r)) => {
                        return Err(ApiError::Sandbox(format!(
                            "the {} runner ended before it was ready ({:?}): {}",
                            spec.name,
                            r.status,
                            String::from_utf8_lossy(&err)
                        )))
                    }
                    None => {
                        return Err(ApiError::Sandbox("the runner's stream ended early".into()))
                    }
                }
                if out.len() + err.len() > 1 << 20 {
                    return Err(ApiError::Sandbox(format!(
                        "the {} runner wrote too much before it was ready: {}",
                        spec.name,
                        String::from_utf8_lossy(&err)
                    )));
                }
            }
        })
        .await?;
        exec_id
    };
    // Blocked on its stdin now: snapshot (which closes the connection, so
    // the runner is detached in the template).
    let req = SnapshotRequest {
        template: Some(name.to_string()),
    };
    let t = lifecycle::snapshot(d, id, req, &Principal::Daemon).await?;
    let meta = serde_json::to_vec(&Meta {
        runner_exec_id: exec_id,
    })
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    std::fs::write(t.dir.join(META_FILE), meta)
        .map_err(|e| ApiError::Internal(format!("writing {}: {e}", t.dir.display())))?;
    Ok(exec_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fncall::registry::find;

    #[test]
    fn warm_names_change_with_what_they_are_made_of() {
        let py = find("python").unwrap();
        let a = warm_name(py, "base-1c-512m");
        assert!(a.starts_with("fncall-python-") && a.len() == "fncall-python-".len() + 12);
        assert_eq!(a, warm_name(py, "base-1c-512m"));
        assert_ne!(a, warm_name(py, "base-1c-512m-0123456789ab"));
        crate::ops::check_name("template", &a).unwrap();
    }
}
