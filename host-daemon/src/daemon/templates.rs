//! Templates (an image booted once and snapshotted, or a sandbox's
//! snapshot) and warm pools per template.

use super::db::{self, State, TemplateRow};
use super::ops::{self, check_name};
use super::{ApiError, ApiResult, Daemon};
use crate::sandbox::{self, TemplateSpec};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Images the daemon can boot templates from.
pub const IMAGES: [&str; 2] = ["tiny", "base"];

/// `POST /v1/templates`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTemplate {
    /// Name.
    pub name: String,
    /// Image (`tiny` or `base`).
    pub image: String,
    /// vCPUs (default 1).
    #[serde(default)]
    pub vcpus: Option<u32>,
    /// Guest memory in MiB (default 128).
    #[serde(default)]
    pub memory_mib: Option<u32>,
}

fn check_shape(image: &str, vcpus: u32, mem: u32) -> ApiResult<()> {
    if !IMAGES.contains(&image) {
        return Err(ApiError::BadRequest(format!(
            "unknown image {image:?} (expected one of {IMAGES:?})"
        )));
    }
    if vcpus == 0 || vcpus > ops::MAX_VCPUS {
        return Err(ApiError::BadRequest(format!(
            "vcpus {vcpus}: expected 1..={}",
            ops::MAX_VCPUS
        )));
    }
    if !(32..=ops::MAX_MEMORY_MIB).contains(&mem) {
        return Err(ApiError::BadRequest(format!(
            "memory_mib {mem}: expected 32..={}",
            ops::MAX_MEMORY_MIB
        )));
    }
    Ok(())
}

/// Registers a template and builds it in the background (booting the
/// image once; cached by content, so usually instant after the first).
pub fn create_template(d: &Arc<Daemon>, req: CreateTemplate) -> ApiResult<TemplateRow> {
    check_name("template", &req.name)?;
    let (vcpus, mem) = (req.vcpus.unwrap_or(1), req.memory_mib.unwrap_or(128));
    check_shape(&req.image, vcpus, mem)?;
    let t = TemplateRow {
        name: req.name.clone(),
        source: format!("image:{}", req.image),
        vcpus,
        memory_mib: mem,
        dir: Default::default(),
        state: "building".into(),
        error: None,
        created_at: db::now(),
        owned: false,
    };
    let inserted = d.db(|db| {
        if db.template(&t.name)?.is_some() {
            return Ok(false);
        }
        db.put_template(&t)?;
        Ok(true)
    })?;
    if !inserted {
        return Err(ApiError::Conflict(format!("template '{}' exists", t.name)));
    }
    d.event(&t.name, "template_building", &t.source);
    let d2 = d.clone();
    let (name, image) = (t.name.clone(), req.image.clone());
    tokio::spawn(async move { build(d2, name, image, vcpus, mem).await });
    Ok(t)
}

async fn build(d: Arc<Daemon>, name: String, image: String, vcpus: u32, mem: u32) {
    let _g = d.building.lock().await;
    let spec = TemplateSpec {
        image: image.clone(),
        vcpus: vcpus as u8,
        memory_mib: mem,
    };
    let t0 = Instant::now();
    let n2 = name.clone();
    let res = tokio::task::spawn_blocking(move || {
        sandbox::template(&spec, &mut |l| tracing::info!(template = %n2, "{l}"))
    })
    .await;
    let res = match res {
        Ok(Ok(dir)) => Ok(dir),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let r = d.db(|db| {
        if let Some(mut t) = db.template(&name)? {
            match &res {
                Ok(dir) => {
                    t.dir = dir.clone();
                    t.state = "ready".into();
                }
                Err(e) => {
                    t.state = "failed".into();
                    t.error = Some(e.clone());
                }
            }
            db.put_template(&t)?;
        }
        Ok(())
    });
    if let Err(e) = r {
        tracing::error!(template = %name, "recording the template: {e}");
    }
    match res {
        Ok(_) => d.event(
            &name,
            "template_ready",
            &format!("in {:.1} s", t0.elapsed().as_secs_f64()),
        ),
        Err(e) => d.event(&name, "template_failed", &e),
    }
    d.pool_wake.notify_one();
}

/// The template of `image` at this shape (`IMAGE-Nc-Mm`), built on first
/// use; waits for it (the first boot takes ~20-60 s on PVM hosts).
pub async fn image_template(
    d: &Arc<Daemon>,
    image: &str,
    vcpus: u32,
    mem: u32,
) -> ApiResult<TemplateRow> {
    check_shape(image, vcpus, mem)?;
    let name = format!("{image}-{vcpus}c-{mem}m");
    match create_template(
        d,
        CreateTemplate {
            name: name.clone(),
            image: image.into(),
            vcpus: Some(vcpus),
            memory_mib: Some(mem),
        },
    ) {
        Ok(_) | Err(ApiError::Conflict(_)) => {}
        Err(e) => return Err(e),
    }
    let end = Instant::now() + Duration::from_secs(900);
    loop {
        match ops::ready_template(d, &name) {
            Err(ApiError::Conflict(m)) if m.contains("still being built") => {}
            other => return other,
        }
        if Instant::now() > end {
            return Err(ApiError::Timeout(format!(
                "template '{name}' was not built within 900 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes a template, its pool and the pool's sandboxes (sandboxes
/// already created from it keep running).
pub async fn delete_template(d: &Arc<Daemon>, name: &str) -> ApiResult<()> {
    let t = d
        .db(|db| db.template(name))?
        .ok_or_else(|| ApiError::NotFound(format!("no template '{name}'")))?;
    drain_pool(d, name).await?;
    d.db(|db| db.delete_template(name))?;
    if t.owned {
        let dir = t.dir.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    }
    d.event(name, "template_deleted", "");
    Ok(())
}

/// A pool as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolView {
    /// Template.
    pub template: String,
    /// Target size.
    pub target: u32,
    /// Sandboxes ready now.
    pub ready: u64,
}

/// `PUT /v1/pools/{template}`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SetPool {
    /// Target size (0 removes the pool).
    pub target: u32,
}

/// Most sandboxes one pool may hold.
pub const MAX_POOL: u32 = 10_000;

/// Sets a pool's target; the filler does the rest in the background.
pub async fn set_pool(d: &Arc<Daemon>, template: &str, req: SetPool) -> ApiResult<PoolView> {
    if req.target > MAX_POOL {
        return Err(ApiError::BadRequest(format!(
            "target {}: at most {MAX_POOL}",
            req.target
        )));
    }
    let t = d
        .db(|db| db.template(template))?
        .ok_or_else(|| ApiError::NotFound(format!("no template '{template}'")))?;
    if t.state == "failed" {
        return Err(ApiError::Conflict(format!("template '{template}' failed")));
    }
    d.db(|db| db.set_pool(template, req.target))?;
    if req.target == 0 {
        drain_pool(d, template).await?;
    }
    d.event(template, "pool_target", &req.target.to_string());
    d.pool_wake.notify_one();
    Ok(pools(d)?
        .into_iter()
        .find(|p| p.template == template)
        .unwrap_or(PoolView {
            template: template.into(),
            target: 0,
            ready: 0,
        }))
}

/// Kills every pooled sandbox of `template`.
pub async fn drain_pool(d: &Arc<Daemon>, template: &str) -> ApiResult<()> {
    d.db(|db| db.set_pool(template, 0))?;
    let f = db::Filter {
        state: Some(State::Pooled),
        template: Some(template.into()),
        ..Default::default()
    };
    for r in d.db(|db| db.list_sandboxes(&f))? {
        let _ = ops::kill(d, &r.id, "pool drained").await;
    }
    Ok(())
}

/// Every pool.
pub fn pools(d: &Daemon) -> ApiResult<Vec<PoolView>> {
    d.db(|db| {
        let counts = db.pooled_counts()?;
        Ok(db
            .pools()?
            .into_iter()
            .map(|(t, target)| PoolView {
                ready: counts.get(&t).copied().unwrap_or(0),
                template: t,
                target,
            })
            .collect())
    })
}
