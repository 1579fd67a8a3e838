//! Template directories without KVM: where they go, when they go, and a
//! build that lacks installed artifacts (the daemon's answer to that is
//! tested in `templates`).

use super::*;
use crate::db::{SandboxRow, State, TemplateRow};
use crate::{Config, Daemon};
use shoal_images::artifacts::Layout;
use shoal_runtime::backend::microvm::MicroVm;
use shoal_runtime::backend::Kind;
use std::sync::Arc;

/// A daemon on `state` reading artifacts from `artifacts` (no KVM: its
/// VMM does not exist).
pub(crate) fn daemon(state: &Path, artifacts: &Path) -> Arc<Daemon> {
    let backend = MicroVm::new("/nonexistent/shoal-vmm", Layout::at(artifacts));
    Daemon::open(
        Config::for_tests(state, 1 << 20, 64, 100),
        Arc::new(backend),
    )
    .unwrap()
}

fn template(name: &str, dir: PathBuf, state: &str) -> TemplateRow {
    let state = shoal_api::TemplateState::parse(state).unwrap();
    TemplateRow {
        name: name.into(),
        source: "image:tiny".into(),
        kind: Kind::MicroVm,
        vcpus: 1,
        memory_mib: 128,
        dir,
        state,
        error: None,
        created_at: db::now(),
        owned: true,
        owner: None,
        image: None,
        net: false,
        disk: None,
        root: shoal_api::RootRequest::default(),
    }
}

fn sandbox(id: &str, template: &str) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        template: template.into(),
        kind: Kind::MicroVm,
        state: State::Paused,
        vcpus: 1,
        memory_mib: 128,
        pid: None,
        backend_state: None,
        dir: format!("/nonexistent/{id}").into(),
        created_at: db::now(),
        last_active: db::now(),
        ttl_s: 0,
        idle_timeout_s: 0,
        metadata: Default::default(),
        env: Default::default(),
        needs_post_restore: false,
        keep_running: false,
        pause_at_ttl: false,
        error: None,
        net: None,
        priority: shoal_api::Priority::Latency,
    }
}

fn mkdir(p: &Path) -> PathBuf {
    std::fs::create_dir_all(p).unwrap();
    std::fs::write(p.join("memory"), "m").unwrap();
    p.into()
}

#[test]
fn template_dirs_are_in_the_state_dir_and_go_only_when_unused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(&tmp.path().join("state"), &tmp.path().join("none"));
    let a = d.cfg.new_template_dir("tiny-1c-128m");
    let b = d.cfg.new_template_dir("tiny-1c-128m");
    assert_ne!(a, b, "a directory is never reused");
    assert_eq!(a.parent().unwrap(), tmp.path().join("state/templates"));
    let file_name = a.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(dir_template_name(&file_name), "tiny-1c-128m");
    assert_eq!(dir_template_name("snap.v1"), "snap.v1");
    assert_eq!(dir_template_name("older-daemon"), "older-daemon");

    // In use: a template's own directory, one being built, the directory
    // of a deleted template whose (paused) sandbox still names it.
    let ready = mkdir(&d.cfg.new_template_dir("ready"));
    let building = d.cfg.new_template_dir("building");
    let deleted = mkdir(&d.cfg.new_template_dir("deleted"));
    // Unused: a deleted template's directory no sandbox names, one of an
    // older daemon named after its template, a stray file.
    let orphan = mkdir(&d.cfg.new_template_dir("orphan"));
    let legacy = mkdir(&d.cfg.templates_dir().join("legacy"));
    let stray = d.cfg.templates_dir().join("stray");
    std::fs::write(&stray, "x").unwrap();
    d.db(|db| {
        db.put_template(&template("ready", ready.clone(), "ready"))?;
        db.put_template(&template("building", building.clone(), "building"))?;
        db.put_sandbox(&sandbox("aa01", "deleted"))
    })
    .unwrap();
    mkdir(&building);
    let mut gone = sweep_dirs(&d).unwrap();
    gone.sort();
    let mut want = vec![orphan, legacy, stray];
    want.sort();
    assert_eq!(gone, want);
    assert!(ready.exists() && building.exists() && deleted.exists());

    // The last sandbox of the deleted template is gone: so is its directory.
    d.db(|db| db.delete_sandbox("aa01").map(drop)).unwrap();
    assert_eq!(sweep_dirs(&d).unwrap(), vec![deleted]);
    assert!(sweep_dirs(&d).unwrap().is_empty());

    // A daemon that stopped during a build: the template is failed on the
    // next start, and its half-written directory removed.
    recover(&d);
    let t = d.db(|db| db.template("building")).unwrap().unwrap();
    assert_eq!(t.state.as_str(), "failed");
    assert!(t
        .error
        .unwrap()
        .contains("stopped while it was being built"));
    assert!(!building.exists());
    assert!(ready.exists());
}

#[test]
fn templates_of_older_daemons_in_the_cache_are_taken_into_the_state_dir() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = daemon(&tmp.path().join("state"), &tmp.path().join("none"));
    let cached = tmp.path().join("cache/templates/tiny-0123");
    mkdir(&cached);
    std::fs::write(cached.join("state"), "s").unwrap();
    let mut old = template("tiny-1c-128m", cached.clone(), "ready");
    old.owned = false;
    let mut lost = template(
        "base-1c-256m",
        tmp.path().join("cache/templates/gone"),
        "ready",
    );
    lost.owned = false;
    d.db(|db| {
        db.put_template(&old)?;
        db.put_template(&lost)
    })
    .unwrap();
    recover(&d);
    let t = d.db(|db| db.template("tiny-1c-128m")).unwrap().unwrap();
    assert_eq!((t.state.as_str(), t.owned), ("ready", true));
    assert!(
        t.dir.starts_with(d.cfg.templates_dir()),
        "{}",
        t.dir.display()
    );
    let ino = |p: PathBuf| std::fs::metadata(p).unwrap().ino();
    assert_eq!(ino(t.dir.join("memory")), ino(cached.join("memory")));
    // The cache's pruning takes its copy; the daemon's stays.
    std::fs::remove_dir_all(&cached).unwrap();
    assert!(t.dir.join("memory").is_file() && t.dir.join("state").is_file());
    let t = d.db(|db| db.template("base-1c-256m")).unwrap().unwrap();
    assert_eq!(t.state.as_str(), "failed");
    assert!(t.error.unwrap().contains("is gone"));
    // Nothing else was left in the state directory.
    assert_eq!(std::fs::read_dir(d.cfg.templates_dir()).unwrap().count(), 1);
}
