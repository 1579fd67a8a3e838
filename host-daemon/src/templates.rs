//! Templates (an image booted once and snapshotted, or a sandbox's
//! snapshot) and warm pools per template.

use super::db::{self, State, TemplateRow};
use super::ops::{self, check_name};
use super::{ApiError, ApiResult, Daemon};
use shoal_api::{CreateTemplate, Pool, RootRequest, SetPool, Template, TemplateState};
use shoal_images::layers::{self, Upper};
use shoal_runtime::sandbox::{self, TemplateSpec};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Images the daemon can boot templates from.
pub const IMAGES: [&str; 2] = ["tiny", "base"];

impl From<TemplateRow> for Template {
    fn from(t: TemplateRow) -> Self {
        Template {
            name: t.name,
            source: t.source,
            vcpus: t.vcpus,
            memory_mib: t.memory_mib,
            dir: t.dir,
            state: t.state,
            error: t.error,
            created_at: t.created_at,
            owned: t.owned,
            layers: t.layers,
            upper_size_mib: t.upper_size_mib,
            upper_disk_mib: t.upper_disk_mib,
        }
    }
}

/// Checks a root request's layers and sizes for a guest of `memory_mib`;
/// returns the upper layer.
pub fn check_root(root: &RootRequest, memory_mib: u32) -> ApiResult<Upper> {
    layers::check_layers(&root.layers, &IMAGES).map_err(ApiError::Layers)?;
    Upper::from_request(root.upper_size_mib, root.upper_disk_mib, memory_mib)
        .map_err(ApiError::Layers)
}

/// The name of the template `POST /v1/sandboxes` with `image` uses:
/// `IMAGE-Nc-Mm`, plus a hash of the layers (each file's identity, so a
/// rebuilt layer gets a new template) and the upper layer when there are
/// any.
pub fn image_template_name(image: &str, vcpus: u32, mem: u32, root: &RootRequest) -> String {
    let base = format!("{image}-{vcpus}c-{mem}m");
    if root.is_default() {
        return base;
    }
    let mut parts: Vec<String> = root
        .layers
        .iter()
        .map(|l| {
            if IMAGES.contains(&l.as_str()) {
                format!("image:{l}")
            } else {
                layers::file_identity(std::path::Path::new(l))
            }
        })
        .collect();
    parts.push(format!(
        "size:{:?} disk:{:?}",
        root.upper_size_mib, root.upper_disk_mib
    ));
    let bytes: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
    format!("{base}-{}", &sandbox::hash_hex(&bytes)[..12])
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
    let root = req.root();
    let upper = check_root(&root, mem)?;
    let t = TemplateRow {
        name: req.name.clone(),
        source: format!("image:{}", req.image),
        kind: d.backend.kind(),
        vcpus,
        memory_mib: mem,
        dir: Default::default(),
        state: TemplateState::Building,
        error: None,
        created_at: db::now(),
        owned: false,
        layers: root.layers.clone(),
        upper_size_mib: upper.disk_mib().is_none().then(|| upper.tmpfs_mib(mem)),
        upper_disk_mib: upper.disk_mib(),
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
    let spec = TemplateSpec {
        upper,
        ..TemplateSpec::new(&req.image, vcpus as u8, mem)
    };
    let (name, layers) = (t.name.clone(), root.layers);
    tokio::spawn(async move { build(d2, name, spec, layers).await });
    Ok(t)
}

/// A layer as the API names it: an image name or an image file.
fn resolve_layer(l: &str) -> Result<std::path::PathBuf, shoal_images::artifacts::ArtifactError> {
    if IMAGES.contains(&l) {
        shoal_images::artifacts::image(&format!("{l}_erofs"))
    } else {
        Ok(l.into())
    }
}

async fn build(d: Arc<Daemon>, name: String, mut spec: TemplateSpec, layers: Vec<String>) {
    let _g = d.building.lock().await;
    let t0 = Instant::now();
    let n2 = name.clone();
    let backend = d.backend.clone();
    let res = tokio::task::spawn_blocking(move || {
        spec.layers = layers
            .iter()
            .map(|l| resolve_layer(l))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        backend
            .build_template(&spec, &mut |l| tracing::info!(template = %n2, "{l}"))
            .map_err(|e| e.to_string())
    })
    .await;
    let res = match res {
        Ok(r) => r,
        Err(e) => Err(e.to_string()),
    };
    let r = d.db(|db| {
        if let Some(mut t) = db.template(&name)? {
            match &res {
                Ok(dir) => {
                    t.dir = dir.clone();
                    t.state = TemplateState::Ready;
                }
                Err(e) => {
                    t.state = TemplateState::Failed;
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

/// The template of `image` at this shape and root
/// ([`image_template_name`]), built on first use; waits for it (the first
/// boot takes ~20-60 s on PVM hosts).
pub async fn image_template(
    d: &Arc<Daemon>,
    image: &str,
    vcpus: u32,
    mem: u32,
    root: &RootRequest,
) -> ApiResult<TemplateRow> {
    check_shape(image, vcpus, mem)?;
    check_root(root, mem)?;
    let name = image_template_name(image, vcpus, mem, root);
    match create_template(
        d,
        CreateTemplate {
            name: name.clone(),
            image: image.into(),
            vcpus: Some(vcpus),
            memory_mib: Some(mem),
            layers: root.layers.clone(),
            upper_size_mib: root.upper_size_mib,
            upper_disk_mib: root.upper_disk_mib,
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

/// Most sandboxes one pool may hold.
pub const MAX_POOL: u32 = 10_000;

/// Sets a pool's target; the filler does the rest in the background.
pub async fn set_pool(d: &Arc<Daemon>, template: &str, req: SetPool) -> ApiResult<Pool> {
    if req.target > MAX_POOL {
        return Err(ApiError::BadRequest(format!(
            "target {}: at most {MAX_POOL}",
            req.target
        )));
    }
    let t = d
        .db(|db| db.template(template))?
        .ok_or_else(|| ApiError::NotFound(format!("no template '{template}'")))?;
    if t.state == TemplateState::Failed {
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
        .unwrap_or(Pool {
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
pub fn pools(d: &Daemon) -> ApiResult<Vec<Pool>> {
    d.db(|db| {
        let counts = db.pooled_counts()?;
        Ok(db
            .pools()?
            .into_iter()
            .map(|(t, target)| Pool {
                ready: counts.get(&t).copied().unwrap_or(0),
                template: t,
                target,
            })
            .collect())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(layers: &[&str], size: Option<u32>, disk: Option<u32>) -> RootRequest {
        RootRequest {
            layers: layers.iter().map(|s| s.to_string()).collect(),
            upper_size_mib: size,
            upper_disk_mib: disk,
        }
    }

    fn message(r: ApiResult<Upper>) -> (u16, String) {
        let e = r.expect_err("refused");
        (e.status(), e.to_string())
    }

    #[test]
    fn root_requests_are_checked_with_clear_400s() {
        assert_eq!(
            check_root(&root(&[], None, None), 128).unwrap(),
            Upper::default()
        );
        assert_eq!(
            check_root(&root(&["tiny"], None, Some(64)), 128).unwrap(),
            Upper::Disk { size_mib: 64 }
        );
        let cases = [
            (root(&[], Some(8), Some(64)), "not both"),
            (root(&[], Some(0), None), "upper_size_mib 0"),
            (root(&[], Some(129), None), "at most the guest's memory"),
            (root(&[], None, Some(4)), "upper_disk_mib 4"),
            (root(&["kit.img"], None, None), "absolute path"),
            (root(&["/nonexistent/kit.img"], None, None), "cannot open"),
            (root(&["/dev/null"], None, None), "not a regular file"),
        ];
        for (r, want) in cases {
            let (status, m) = message(check_root(&r, 128));
            assert_eq!(status, 400, "{m}");
            assert!(m.contains(want), "{want:?} not in {m:?}");
        }
    }

    #[test]
    fn image_template_names_cover_the_root() {
        let plain = RootRequest::default();
        assert_eq!(image_template_name("tiny", 1, 128, &plain), "tiny-1c-128m");
        let a = image_template_name("tiny", 1, 128, &root(&["base"], None, None));
        let b = image_template_name("tiny", 1, 128, &root(&["base"], Some(8), None));
        let c = image_template_name("tiny", 1, 128, &root(&["base"], None, Some(64)));
        let d = image_template_name("tiny", 1, 128, &root(&[], Some(8), None));
        for n in [&a, &b, &c, &d] {
            assert!(n.starts_with("tiny-1c-128m-") && n.len() == 25, "{n}");
            ops::check_name("template", n).unwrap();
        }
        let all = std::collections::BTreeSet::from([&a, &b, &c, &d]);
        assert_eq!(all.len(), 4, "every root its own template: {all:?}");
        assert_eq!(
            a,
            image_template_name("tiny", 1, 128, &root(&["base"], None, None)),
            "stable"
        );
        // A layer file replaced by a rebuilt one gets a new template.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kit.img");
        std::fs::write(&p, "one").unwrap();
        let r = root(&[p.to_str().unwrap()], None, None);
        let before = image_template_name("tiny", 1, 128, &r);
        let tmp = dir.path().join("new");
        std::fs::write(&tmp, "two").unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        assert_ne!(before, image_template_name("tiny", 1, 128, &r));
    }
}
