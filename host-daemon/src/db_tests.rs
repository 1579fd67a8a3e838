//! Tests of the state database.

use super::*;

fn row(id: &str, state: State) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        template: "tiny".into(),
        state,
        vcpus: 1,
        memory_mib: 128,
        pid: Some(42),
        pid_start: Some(7),
        dir: format!("/tmp/{id}").into(),
        created_at: now(),
        last_active: now(),
        ttl_s: 0,
        idle_timeout_s: 0,
        metadata: [("run".to_string(), "a".to_string())].into(),
        env: BTreeMap::new(),
        needs_post_restore: true,
        keep_running: false,
        error: None,
    }
}

#[test]
fn schema_version_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("state.db");
    {
        let db = Db::open(&p).unwrap();
        assert_eq!(db.version().unwrap(), SCHEMA_VERSION);
        db.put_sandbox(&row("a", State::Running)).unwrap();
    }
    let db = Db::open(&p).unwrap();
    assert_eq!(
        db.sandbox("a").unwrap().unwrap(),
        row("a", State::Running).clone_with_times(&db)
    );
    let mode: String = db
        .conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

impl SandboxRow {
    fn clone_with_times(mut self, db: &Db) -> SandboxRow {
        let stored = db.sandbox(&self.id).unwrap().unwrap();
        self.created_at = stored.created_at;
        self.last_active = stored.last_active;
        self
    }
}

#[test]
fn version_1_templates_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("state.db");
    {
        // The version 1 templates table, with a row.
        let c = Connection::open(&p).unwrap();
        c.execute_batch(
            "CREATE TABLE sandboxes (
                id TEXT PRIMARY KEY, template TEXT NOT NULL, state TEXT NOT NULL,
                vcpus INTEGER NOT NULL, memory_mib INTEGER NOT NULL,
                pid INTEGER, pid_start INTEGER, dir TEXT NOT NULL,
                created_at REAL NOT NULL, last_active REAL NOT NULL,
                ttl_s INTEGER NOT NULL, idle_timeout_s INTEGER NOT NULL,
                metadata TEXT NOT NULL, env TEXT NOT NULL,
                needs_post_restore INTEGER NOT NULL, error TEXT,
                keep_running INTEGER NOT NULL DEFAULT 0);
             CREATE TABLE templates (
                name TEXT PRIMARY KEY, source TEXT NOT NULL, vcpus INTEGER NOT NULL,
                memory_mib INTEGER NOT NULL, dir TEXT NOT NULL, state TEXT NOT NULL,
                error TEXT, created_at REAL NOT NULL, owned INTEGER NOT NULL);
             CREATE TABLE pools (template TEXT PRIMARY KEY, target INTEGER NOT NULL);
             CREATE TABLE events (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL,
                subject TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
             INSERT INTO templates VALUES ('old', 'image:tiny', 1, 128, '/d', 'ready', NULL, 1.0, 0);
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let db = Db::open(&p).unwrap();
    assert_eq!(db.version().unwrap(), SCHEMA_VERSION);
    let t = db.template("old").unwrap().unwrap();
    assert_eq!(
        (
            t.layers,
            t.upper_size_mib,
            t.upper_disk_mib,
            t.state.as_str()
        ),
        (vec![], None, None, "ready")
    );
}

#[test]
fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("state.db");
    drop(Db::open(&p).unwrap());
    let c = Connection::open(&p).unwrap();
    c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(c);
    assert!(matches!(Db::open(&p), Err(DbError::TooNew(_))));
}

#[test]
fn filters_usage_and_pool_take() {
    let mut db = Db::in_memory().unwrap();
    db.put_sandbox(&row("a", State::Running)).unwrap();
    db.put_sandbox(&row("b", State::Paused)).unwrap();
    db.put_sandbox(&row("p", State::Pooled)).unwrap();
    let all = db.list_sandboxes(&Filter::default()).unwrap();
    assert_eq!(all.len(), 2, "pooled sandboxes are hidden by default");
    let f = Filter {
        state: Some(State::Paused),
        ..Default::default()
    };
    assert_eq!(db.list_sandboxes(&f).unwrap()[0].id, "b");
    let f = Filter {
        metadata: vec![("run".into(), "b".into())],
        ..Default::default()
    };
    assert!(db.list_sandboxes(&f).unwrap().is_empty());
    let u = db.usage().unwrap();
    assert_eq!((u.vms, u.vcpus, u.memory_mib), (2, 2, 256));
    assert_eq!(db.pooled_counts().unwrap().get("tiny"), Some(&1));
    let got = db.take_pooled("tiny", &row("new", State::Running)).unwrap();
    let got = got.unwrap();
    assert_eq!((got.id.as_str(), got.dir.to_str()), ("p", Some("/tmp/p")));
    assert_eq!(got.state, State::Running);
    assert_eq!(db.sandbox("p").unwrap().unwrap().state, State::Running);
    assert!(db
        .take_pooled("tiny", &row("x", State::Running))
        .unwrap()
        .is_none());
    db.set_state("p", State::Failed, Some("boom")).unwrap();
    let f = db.sandbox("p").unwrap().unwrap();
    assert_eq!(
        (f.state, f.pid, f.error.as_deref()),
        (State::Failed, None, Some("boom"))
    );
}

#[test]
fn templates_pools_events() {
    let db = Db::in_memory().unwrap();
    let t = TemplateRow {
        name: "t".into(),
        source: "image:tiny".into(),
        vcpus: 1,
        memory_mib: 128,
        dir: "/x".into(),
        state: TemplateState::Ready,
        error: None,
        created_at: 1.0,
        owned: false,
        layers: vec!["/l/kit.img".into(), "tiny".into()],
        upper_size_mib: None,
        upper_disk_mib: Some(64),
    };
    db.put_template(&t).unwrap();
    assert_eq!(db.template("t").unwrap(), Some(t.clone()));
    assert_eq!(db.templates().unwrap(), vec![t]);
    db.set_pool("t", 3).unwrap();
    assert_eq!(db.pools().unwrap(), vec![("t".to_string(), 3)]);
    assert!(db.delete_template("t").unwrap());
    assert!(db.pools().unwrap().is_empty());
    db.event("a", "created", "x").unwrap();
    db.event("b", "killed", "y").unwrap();
    let ev = db.events(0, Some("b"), 10).unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].kind, "killed");
}
