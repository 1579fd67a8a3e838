//! Templates (an image booted once and snapshotted, or a sandbox's
//! snapshot) and warm pools per template. Where their files live:
//! [`crate::template_dirs`].

use super::db::{self, State, TemplateRow};
use super::layer_files::{open_root, CheckedRoot};
use super::ops::{self, check_name};
use super::{admission, template_names, ApiError, ApiResult, Daemon};
use crate::auth::Principal;
use shoal_api::{CreateTemplate, Pool, RootRequest, SetPool, Template, TemplateState};
use shoal_images::layer_files::Layer;
use shoal_images::layers;
use shoal_runtime::sandbox::{self, TemplateSpec};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Images the daemon can boot templates from.
pub const IMAGES: [&str; 2] = shoal_images::artifacts::IMAGES;

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
            owner: t.owner,
            layers: t.root.layers,
            upper_size_mib: t.root.upper_size_mib,
            upper_disk_mib: t.root.upper_disk_mib,
            image: t.image,
            network: t.net,
            kind: t.kind.as_str().into(),
            disk: t.disk,
        }
    }
}

/// The name of the template `POST /v1/sandboxes` with `image` uses:
/// `IMAGE-Nc-Mm`, plus a hash of the layers (each file's identity, so a
/// rebuilt layer gets a new template) and the upper layer when there are
/// any.
pub fn image_template_name(image: &str, vcpus: u32, mem: u32, root: &RootRequest) -> String {
    let ids = root
        .layers
        .iter()
        .map(|l| layers::file_identity(std::path::Path::new(l)));
    name_from_ids(image, vcpus, mem, root, ids)
}

/// [`image_template_name`] as the daemon makes it: each file's identity
/// taken from the file it opened, not by looking its path up again.
fn opened_template_name(
    image: &str,
    vcpus: u32,
    mem: u32,
    root: &RootRequest,
    checked: &CheckedRoot,
) -> String {
    let ids = checked.layers.iter().map(|l| match l {
        Layer::Image(n) => n.clone(),
        Layer::File(f) => f.identity(),
    });
    name_from_ids(image, vcpus, mem, root, ids)
}

/// The name from `root` and one identity per layer (used for the layers
/// that are not image names).
fn name_from_ids(
    image: &str,
    vcpus: u32,
    mem: u32,
    root: &RootRequest,
    ids: impl Iterator<Item = String>,
) -> String {
    let base = format!("{image}-{vcpus}c-{mem}m");
    if root.is_default() {
        return base;
    }
    let mut parts: Vec<String> = root
        .layers
        .iter()
        .zip(ids)
        .map(|(l, id)| {
            if shoal_images::artifacts::is_named_layer(l) {
                format!("image:{l}")
            } else {
                id
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

pub(crate) fn check_shape(image: &str, vcpus: u32, mem: u32) -> ApiResult<()> {
    if !IMAGES.contains(&image) {
        return Err(ApiError::BadRequest(format!(
            "unknown image {image:?} (expected one of {IMAGES:?})"
        )));
    }
    check_size(vcpus, mem)
}

/// 400 unless `vcpus` and `mem` (MiB) are within the daemon's bounds.
pub(crate) fn check_size(vcpus: u32, mem: u32) -> ApiResult<()> {
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

/// Registers a template for `who` (its owner; derived names are the
/// daemon's, [`template_names`]) and builds it in the background (booting
/// the image once; cached by content, so usually instant after the first).
pub async fn create_template(
    d: &Arc<Daemon>,
    req: CreateTemplate,
    who: &Principal,
) -> ApiResult<TemplateRow> {
    check_name("template", &req.name)?;
    if req.agent == Some(false) {
        return Err(ApiError::BadRequest(
            "'agent': false is for templates of kind 'vm' (a serial console instead)".into(),
        ));
    }
    let (vcpus, mem) = (req.vcpus.unwrap_or(1), req.memory_mib.unwrap_or(128));
    check_shape(&req.image, vcpus, mem)?;
    crate::inputs::check_servable(&d.cfg.limits, vcpus, mem)?;
    crate::inputs::check_disk_servable(&d.cfg.limits, mem, req.upper_disk_mib)?;
    let checked = open_root(d, &req.root(), mem).await?;
    create_checked(d, req, checked, who)
}

/// [`create_template`] once the root is checked and its layers are open.
fn create_checked(
    d: &Arc<Daemon>,
    req: CreateTemplate,
    checked: CheckedRoot,
    who: &Principal,
) -> ApiResult<TemplateRow> {
    check_name("template", &req.name)?;
    let (vcpus, mem) = (req.vcpus.unwrap_or(1), req.memory_mib.unwrap_or(128));
    let root = req.root();
    // The name the daemon would give exactly this template.
    let derived = template_names::with_net(
        opened_template_name(&req.image, vcpus, mem, &root, &checked),
        req.network,
    );
    let owner = template_names::owner_for_create(who, &req.name, &derived)?;
    let upper = checked.upper;
    let t = TemplateRow {
        name: req.name.clone(),
        source: format!("image:{}", req.image),
        kind: d.backend.kind(),
        vcpus,
        memory_mib: mem,
        dir: d.cfg.new_template_dir(&req.name),
        state: TemplateState::Building,
        error: None,
        created_at: db::now(),
        owned: true,
        owner: Some(owner),
        image: None,
        root: RootRequest {
            layers: root.layers.clone(),
            upper_size_mib: upper.disk_mib().is_none().then(|| upper.tmpfs_mib(mem)),
            upper_disk_mib: upper.disk_mib(),
        },
        net: req.network,
        disk: None,
    };
    let vcpus8 = u8::try_from(vcpus).map_err(|_| {
        ApiError::BadRequest(format!("vcpus {vcpus}: expected 1..={}", ops::MAX_VCPUS))
    })?;
    let spec = TemplateSpec {
        upper,
        balloon: d.cfg.balloon,
        ..TemplateSpec::new(&req.image, vcpus8, mem)
    };
    register_and_build(d, t, spec, checked.layers)
}

/// Records template `t` ([`insert_template`]) and builds it from `spec`
/// and `layers` in the background.
pub(crate) fn register_and_build(
    d: &Arc<Daemon>,
    t: TemplateRow,
    spec: TemplateSpec,
    layers: Vec<Layer>,
) -> ApiResult<TemplateRow> {
    insert_template(d, &t)?;
    d.event(&t.name, "template_building", &t.source);
    let d2 = d.clone();
    let (name, dir, net, kind) = (t.name.clone(), t.dir.clone(), t.net, t.kind);
    tokio::spawn(async move { build(d2, name, dir, spec, layers, net, kind).await });
    Ok(t)
}

/// Records `t` (being built or written) unless its name is taken (409)
/// or its disk (its memory file and scratch disk) does not fit
/// ([`admission::admit_disk`]: 429 or 503).
pub(crate) fn insert_template(d: &Daemon, t: &TemplateRow) -> ApiResult<()> {
    let free = admission::free_disk_mib(&d.cfg.state_dir);
    let need = admission::disk_need_mib(t.memory_mib, t.root.upper_disk_mib);
    let r = d.db(|db| {
        if db.template(&t.name)?.is_some() {
            return Ok(Err(ApiError::Conflict(format!(
                "template '{}' exists",
                t.name
            ))));
        }
        let u = db::Usage {
            disk_mib: db.reserved_disk_mib(None)?,
            ..Default::default()
        };
        if let Err(e) = admission::admit_disk(&d.cfg.limits, &u, need, free) {
            return Ok(Err(e.into()));
        }
        db.put_template(t)?;
        Ok(Ok(()))
    })?;
    if let Err(ApiError::Refused(e)) = &r {
        d.metrics.refused(e.reason());
        tracing::warn!(template = %t.name, "admission refused: {e}");
    }
    r
}

async fn build(
    d: Arc<Daemon>,
    name: String,
    dir: PathBuf,
    mut spec: TemplateSpec,
    layers: Vec<Layer>,
    net: bool,
    kind: shoal_runtime::backend::Kind,
) {
    let _g = d.building.lock().await;
    let t0 = Instant::now();
    tracing::info!(template = %name, dir = %dir.display(), net, "booting the template");
    // A networked template boots on a slot lent for the boot (it denies
    // everything; the guest leaves its link down anyway).
    let boot = match net {
        true => d.net.boot_slot(&d).await.map(Some),
        false => Ok(None),
    };
    let dir2 = dir.clone();
    let res = match (boot, d.backend_of(kind)) {
        (_, Err(e)) | (Err(e), _) => Err(e.to_string()),
        (Ok(boot), Ok(backend)) => tokio::task::spawn_blocking(move || {
            if let Some(s) = &boot {
                let tap = s.open_tap_fd().map_err(|e| e.to_string())?;
                spec.net = Some(shoal_runtime::vmm_net::BootNet {
                    tap: Arc::new(std::fs::File::from(tap)),
                    mac: s.guest_mac().0,
                });
            }
            let r = backend.build_template(spec, &layers, &dir2);
            drop(boot);
            r.map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string())),
    };
    let r = d.db(|db| {
        // Deleted (or replaced) while it was built: nothing to record.
        let Some(mut t) = db.template(&name)?.filter(|t| t.dir == dir) else {
            return Ok(false);
        };
        match &res {
            Ok(()) => t.state = TemplateState::Ready,
            Err(e) => {
                t.state = TemplateState::Failed;
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

/// Longest a create waits for its image's template to be built (a boot
/// and a snapshot: ~20-60 s on PVM hosts; builds queue one at a time).
pub const IMAGE_TEMPLATE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The template of `image` at this shape and root
/// ([`image_template_name`]), built on first use (again, if it failed
/// before, or if the name holds a template the daemon did not make);
/// waits for it while it is being built, at most [`IMAGE_TEMPLATE_WAIT`]
/// (then 504: the build goes on, a retry finds it).
pub async fn image_template(
    d: &Arc<Daemon>,
    image: &str,
    vcpus: u32,
    mem: u32,
    root: &RootRequest,
    net: bool,
) -> ApiResult<TemplateRow> {
    check_shape(image, vcpus, mem)?;
    crate::inputs::check_servable(&d.cfg.limits, vcpus, mem)?;
    let checked = open_root(d, root, mem).await?;
    let name =
        template_names::with_net(opened_template_name(image, vcpus, mem, root, &checked), net);
    derived_template(d, &name, |d| {
        create_checked(
            d,
            CreateTemplate {
                kind: None,
                vcpus: Some(vcpus),
                memory_mib: Some(mem),
                network: net,
                ..CreateTemplate::new(name.clone(), image)
            }
            .with_root(root.clone()),
            checked,
            &Principal::Daemon,
        )
    })
    .await
}

/// The daemon's template `name` (a derived name, [`template_names`]),
/// registered and built with `make` unless it exists (again, if it failed
/// before, or if the name holds a template the daemon did not make);
/// waits for it while it is being built, at most [`IMAGE_TEMPLATE_WAIT`]
/// (then 504: the build goes on, a retry finds it).
pub(crate) async fn derived_template(
    d: &Arc<Daemon>,
    name: &str,
    make: impl FnOnce(&Arc<Daemon>) -> ApiResult<TemplateRow>,
) -> ApiResult<TemplateRow> {
    // A failed image template is retried: what failed (missing artifacts,
    // a boot on an overloaded host) may be fixed by now. One the daemon
    // did not make (squatted before owners were recorded) is never used.
    if d.db(|db| db.template(name))?.is_some_and(|t| {
        t.state == TemplateState::Failed
            || (!template_names::is_daemons(&t) && t.state != TemplateState::Building)
    }) {
        match delete_template(d, name, &Principal::Daemon).await {
            Ok(()) | Err(ApiError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    match make(d) {
        Ok(_) | Err(ApiError::Conflict(_)) => {}
        Err(e) => return Err(e),
    }
    let until = Instant::now() + IMAGE_TEMPLATE_WAIT;
    loop {
        match ops::ready_template(d, name) {
            Ok(t) if !template_names::is_daemons(&t) => {
                return Err(ApiError::Conflict(format!(
                    "template '{name}' was not made by the daemon; retry"
                )))
            }
            Err(ApiError::Conflict(m)) if m.contains("still being built") => {}
            other => return other,
        }
        if Instant::now() >= until {
            return Err(ApiError::Timeout(format!(
                "template '{name}' is still being built after {IMAGE_TEMPLATE_WAIT:?} \
                 (builds run one at a time); retry later"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Deletes a template, its pool and the pool's sandboxes (sandboxes
/// already created from it keep running), if `who` may.
pub async fn delete_template(d: &Arc<Daemon>, name: &str, who: &Principal) -> ApiResult<()> {
    let t = d
        .db(|db| db.template(name))?
        .ok_or_else(|| ApiError::NotFound(format!("no template '{name}'")))?;
    template_names::check_owner(who, &t, false)?;
    drain_pool(d, name).await?;
    crate::stock::drain_template(d, name).await;
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

/// Most sandboxes one pool may hold.
pub const MAX_POOL: u32 = 10_000;

/// Sets a pool's target, if `who` may (the daemon's templates' pools are
/// everyone's); the filler does the rest in the background.
pub async fn set_pool(
    d: &Arc<Daemon>,
    template: &str,
    req: SetPool,
    who: &Principal,
) -> ApiResult<Pool> {
    if req.target > MAX_POOL {
        return Err(ApiError::BadRequest(format!(
            "target {}: at most {MAX_POOL}",
            req.target
        )));
    }
    let t = d
        .db(|db| db.template(template))?
        .ok_or_else(|| ApiError::NotFound(format!("no template '{template}'")))?;
    template_names::check_owner(who, &t, true)?;
    if t.state == TemplateState::Failed {
        return Err(ApiError::Conflict(format!("template '{template}' failed")));
    }
    if req.target > 0 && t.kind != d.backend.kind() {
        return Err(ApiError::BadRequest(format!(
            "template '{template}' is of kind {}: warm pools are for {} templates only",
            t.kind,
            d.backend.kind()
        )));
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
    use shoal_images::layers::Upper;

    fn root(layers: &[&str], size: Option<u32>, disk: Option<u32>) -> RootRequest {
        RootRequest {
            layers: layers.iter().map(|s| s.to_string()).collect(),
            upper_size_mib: size,
            upper_disk_mib: disk,
        }
    }

    async fn check(d: &Daemon, r: &RootRequest) -> ApiResult<Upper> {
        open_root(d, r, 128).await.map(|c| c.upper)
    }

    #[tokio::test]
    async fn root_requests_are_checked_with_clear_400s() {
        use crate::template_dirs::tests::daemon;
        let tmp = tempfile::tempdir().unwrap();
        let d = daemon(&tmp.path().join("state"), &tmp.path().join("none"));
        assert_eq!(
            check(&d, &root(&[], None, None)).await.unwrap(),
            Upper::default()
        );
        assert_eq!(
            check(&d, &root(&["tiny"], None, Some(64))).await.unwrap(),
            Upper::Disk { size_mib: 64 }
        );
        // The built-in layers are names, resolved from the artifacts later.
        assert_eq!(
            check(&d, &root(&["fncall-cpp", "code-interpreter"], None, None))
                .await
                .unwrap(),
            Upper::default()
        );
        let layers = d.cfg.layers_dir();
        std::fs::create_dir_all(&layers).unwrap();
        let inside = |n: &str| layers.join(n).display().to_string();
        std::fs::write(layers.join("short.img"), "x").unwrap();
        let (missing, short) = (inside("missing.img"), inside("short.img"));
        let cases = [
            (root(&[], Some(8), Some(64)), "not both"),
            (root(&[], Some(0), None), "upper_size_mib 0"),
            (root(&[], Some(129), None), "at most the guest's memory"),
            (root(&[], None, Some(4)), "upper_disk_mib 4"),
            (root(&["kit.img"], None, None), "absolute path"),
            (root(&["fncall-cobol"], None, None), "built-in layer"),
            (
                root(&["/nonexistent/kit.img"], None, None),
                "not an allowed layer",
            ),
            (root(&["/dev/null"], None, None), "not an allowed layer"),
            (root(&[&missing], None, None), "not an allowed layer"),
            (root(&[&short], None, None), "not a multiple of"),
            (root(&["tiny"; 9], None, None), "at most 8"),
        ];
        for (r, want) in cases {
            let e = check(&d, &r).await.expect_err("refused");
            let (status, m) = (e.status(), e.to_string());
            assert_eq!(status, 400, "{m}");
            assert!(m.contains(want), "{want:?} not in {m:?}");
        }
    }

    #[test]
    fn layer_image_names_are_the_templates_images() {
        assert_eq!(shoal_images::artifacts::IMAGES, IMAGES);
    }

    #[test]
    fn image_template_names_cover_the_root() {
        let plain = RootRequest::default();
        assert_eq!(image_template_name("tiny", 1, 128, &plain), "tiny-1c-128m");
        let a = image_template_name("tiny", 1, 128, &root(&["base"], None, None));
        let b = image_template_name("tiny", 1, 128, &root(&["base"], Some(8), None));
        let c = image_template_name("tiny", 1, 128, &root(&["base"], None, Some(64)));
        let named = image_template_name("base", 1, 128, &root(&["fncall-cpp"], None, None));
        assert_eq!(
            named,
            image_template_name("base", 1, 128, &root(&["fncall-cpp"], None, None)),
            "a built-in layer is named, not a file of the daemon's working directory"
        );
        assert_ne!(
            named,
            image_template_name("base", 1, 128, &root(&["fncall-python"], None, None))
        );
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
        let req = CreateTemplate::new("t1", "tiny");
        let t = create_template(&d, req, &Principal::Uid(0)).await.unwrap();
        assert_eq!(t.state, TemplateState::Building);
        assert!(
            t.dir.starts_with(d.cfg.templates_dir()),
            "{}",
            t.dir.display()
        );
        // No deadline to wait for: the build ends, here at once.
        let t = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let t = d.db(|db| db.template("t1")).unwrap().unwrap();
                if t.state != TemplateState::Building {
                    return t;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the build ended");
        assert_eq!(t.state, TemplateState::Failed);
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
        let first = image_template(&d, "tiny", 1, 128, &root, false)
            .await
            .unwrap_err()
            .to_string();
        assert!(first.contains("is not installed"), "{first}");
        let row1 = d.db(|db| db.template("tiny-1c-128m")).unwrap().unwrap();
        let again = image_template(&d, "tiny", 1, 128, &root, false)
            .await
            .unwrap_err()
            .to_string();
        assert!(again.contains("is not installed"), "{again}");
        let row2 = d.db(|db| db.template("tiny-1c-128m")).unwrap().unwrap();
        assert_ne!(row1.dir, row2.dir, "built again, in a new directory");
        assert!(!row1.dir.exists() && !row2.dir.exists());
    }

    /// A derived name squatted before owners were recorded (a snapshot, no
    /// owner) is never handed out for `{"image": ...}` creates: it is made
    /// again, by the daemon.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_squatted_derived_template_is_not_used() {
        use crate::template_dirs::tests::daemon;
        let tmp = tempfile::tempdir().unwrap();
        let d = daemon(&tmp.path().join("state"), &tmp.path().join("none"));
        let squat = TemplateRow {
            name: "tiny-1c-128m".into(),
            source: "sandbox:0123456789ab".into(),
            kind: d.backend.kind(),
            vcpus: 1,
            memory_mib: 128,
            dir: tmp.path().join("backdoor"),
            state: shoal_api::TemplateState::Ready,
            error: None,
            created_at: 1.0,
            owned: false,
            owner: None,
            image: None,
            net: false,
            disk: None,
            root: shoal_api::RootRequest::default(),
        };
        d.db(|db| db.put_template(&squat)).unwrap();
        let r = image_template(
            &d,
            "tiny",
            1,
            128,
            &shoal_api::RootRequest::default(),
            false,
        )
        .await;
        // Made again (here it fails: no artifacts), never the squatter's.
        let e = r.expect_err("the squatted template was handed out");
        assert!(e.to_string().contains("is not installed"), "{e}");
        let t = d.db(|db| db.template("tiny-1c-128m")).unwrap().unwrap();
        assert_eq!(
            (t.source.as_str(), t.owner.as_deref()),
            ("image:tiny", Some(template_names::DAEMON))
        );
    }
}
