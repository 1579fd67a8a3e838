//! Templates (an image booted once and snapshotted, or a sandbox's
//! snapshot) and warm pools per template. Where their files live:
//! [`crate::template_dirs`].

use super::db::{self, State, TemplateRow};
use super::ops::{self, check_name};
use super::template_dirs::build_from_layout;
use super::{ApiError, ApiResult, Daemon};
use serde::{Deserialize, Serialize};
use shoal_images::layers::{self, Upper};
use shoal_runtime::sandbox::{self, TemplateSpec};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

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
    /// Further read-only layers over the image ([`RootRequest::layers`]).
    #[serde(default)]
    pub layers: Vec<String>,
    /// A tmpfs upper layer of this many MiB (default: half the memory).
    #[serde(default)]
    pub upper_size_mib: Option<u32>,
    /// Or a scratch disk of this many MiB per sandbox as the upper layer.
    #[serde(default)]
    pub upper_disk_mib: Option<u32>,
}

impl CreateTemplate {
    /// The root it asks for.
    pub fn root(&self) -> RootRequest {
        RootRequest {
            layers: self.layers.clone(),
            upper_size_mib: self.upper_size_mib,
            upper_disk_mib: self.upper_disk_mib,
        }
    }
}

/// What a template's root has beyond its image, as asked for in
/// `POST /v1/templates` and `POST /v1/sandboxes` (with `image`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct RootRequest {
    /// Further read-only layers over the image, lowest first: absolute
    /// paths of erofs images (`shoal image build DIR -o OUT --no-agent`),
    /// or image names (`tiny`, `base`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    /// A tmpfs upper layer of this many MiB (default: half the memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper_size_mib: Option<u32>,
    /// Or an ext4 scratch disk of this many MiB per sandbox as the upper
    /// layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper_disk_mib: Option<u32>,
}

impl RootRequest {
    /// Whether anything differs from the plain image.
    pub fn is_default(&self) -> bool {
        self == &RootRequest::default()
    }

    /// Checks layers and sizes for a guest of `memory_mib`; returns the
    /// upper layer.
    pub fn check(&self, memory_mib: u32) -> ApiResult<Upper> {
        let bad = |e: layers::LayerError| ApiError::BadRequest(e.to_string());
        layers::check_layers(&self.layers, &IMAGES).map_err(bad)?;
        Upper::from_request(self.upper_size_mib, self.upper_disk_mib, memory_mib).map_err(bad)
    }
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
    let upper = root.check(mem)?;
    let t = TemplateRow {
        name: req.name.clone(),
        source: format!("image:{}", req.image),
        vcpus,
        memory_mib: mem,
        dir: d.cfg.new_template_dir(&req.name),
        state: "building".into(),
        error: None,
        created_at: db::now(),
        owned: true,
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
    let (name, dir, layers) = (t.name.clone(), t.dir.clone(), root.layers);
    tokio::spawn(async move { build(d2, name, dir, spec, layers).await });
    Ok(t)
}

async fn build(
    d: Arc<Daemon>,
    name: String,
    dir: PathBuf,
    spec: TemplateSpec,
    layers: Vec<String>,
) {
    let _g = d.building.lock().await;
    let t0 = Instant::now();
    tracing::info!(template = %name, dir = %dir.display(), "booting the template");
    let (artifacts, vmm, dir2) = (d.cfg.artifacts.clone(), d.cfg.vmm.clone(), dir.clone());
    let res = tokio::task::spawn_blocking(move || {
        build_from_layout(&artifacts, &vmm, &dir2, spec, &layers)
    })
    .await;
    let res = match res {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let r = d.db(|db| {
        // Deleted (or replaced) while it was built: nothing to record.
        let Some(mut t) = db.template(&name)?.filter(|t| t.dir == dir) else {
            return Ok(false);
        };
        match &res {
            Ok(()) => t.state = "ready".into(),
            Err(e) => {
                t.state = "failed".into();
                t.error = Some(e.clone());
            }
        }
        db.put_template(&t)?;
        Ok(true)
    });
    match r {
        Ok(true) => {}
        Ok(false) => {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Err(e) => tracing::error!(template = %name, "recording the template: {e}"),
    }
    match res {
        Ok(()) => d.event(
            &name,
            "template_ready",
            &format!("in {:.1} s", t0.elapsed().as_secs_f64()),
        ),
        Err(e) => d.event(&name, "template_failed", &e),
    }
    d.pool_wake.notify_one();
}

/// The template of `image` at this shape and root
/// ([`image_template_name`]), built on first use (again, if it failed
/// before); waits for it as long as it is being built (a boot and a
/// snapshot: ~20-60 s on PVM hosts; the build's own deadlines bound it).
pub async fn image_template(
    d: &Arc<Daemon>,
    image: &str,
    vcpus: u32,
    mem: u32,
    root: &RootRequest,
) -> ApiResult<TemplateRow> {
    check_shape(image, vcpus, mem)?;
    root.check(mem)?;
    let name = image_template_name(image, vcpus, mem, root);
    // A failed image template is retried: what failed (missing artifacts,
    // a boot on an overloaded host) may be fixed by now.
    if d.db(|db| db.template(&name))?
        .is_some_and(|t| t.state == "failed")
    {
        match delete_template(d, &name).await {
            Ok(()) | Err(ApiError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
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
    loop {
        match ops::ready_template(d, &name) {
            Err(ApiError::Conflict(m)) if m.contains("still being built") => {}
            other => return other,
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
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
    // Its directory goes now unless a sandbox restored from it is left
    // (a pause records the image paths in the template's directory).
    let named = d.db(|db| {
        let f = db::Filter {
            template: Some(name.into()),
            include_pooled: true,
            ..Default::default()
        };
        Ok(!db.list_sandboxes(&f)?.is_empty())
    })?;
    if t.owned && !named {
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
        assert_eq!(root(&[], None, None).check(128).unwrap(), Upper::default());
        assert_eq!(
            root(&["tiny"], None, Some(64)).check(128).unwrap(),
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
            let (status, m) = message(r.check(128));
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_image_template_without_artifacts_fails_clearly_and_is_retried() {
        use crate::template_dirs::tests::daemon;
        use std::time::Duration;
        let tmp = tempfile::tempdir().unwrap();
        let d = daemon(&tmp.path().join("state"), &tmp.path().join("none"));
        let req = CreateTemplate {
            name: "t1".into(),
            image: "tiny".into(),
            vcpus: None,
            memory_mib: None,
            layers: vec![],
            upper_size_mib: None,
            upper_disk_mib: None,
        };
        let t = create_template(&d, req).unwrap();
        assert_eq!(t.state, "building");
        assert!(
            t.dir.starts_with(d.cfg.templates_dir()),
            "{}",
            t.dir.display()
        );
        // No deadline to wait for: the build ends, here at once.
        let t = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let t = d.db(|db| db.template("t1")).unwrap().unwrap();
                if t.state != "building" {
                    return t;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the build ended");
        assert_eq!(t.state, "failed");
        assert!(
            t.error
                .as_deref()
                .unwrap_or("")
                .contains("is not installed"),
            "{t:?}"
        );

        // POST /v1/sandboxes with an image: its failed template is made again
        // (the artifacts may be there by now), and the reason is the answer.
        let root = RootRequest::default();
        let first = image_template(&d, "tiny", 1, 128, &root)
            .await
            .unwrap_err()
            .to_string();
        assert!(first.contains("is not installed"), "{first}");
        let row1 = d.db(|db| db.template("tiny-1c-128m")).unwrap().unwrap();
        let again = image_template(&d, "tiny", 1, 128, &root)
            .await
            .unwrap_err()
            .to_string();
        assert!(again.contains("is not installed"), "{again}");
        let row2 = d.db(|db| db.template("tiny-1c-128m")).unwrap().unwrap();
        assert_ne!(row1.dir, row2.dir, "built again, in a new directory");
        assert!(!row1.dir.exists() && !row2.dir.exists());
    }
}
