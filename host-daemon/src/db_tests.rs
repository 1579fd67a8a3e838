//! Tests of the state database.

use super::*;
use shoal_runtime::backend::{BackendState, Kind};

fn row(id: &str, state: State) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        template: "tiny".into(),
        kind: Kind::MicroVm,
        state,
        vcpus: 1,
        memory_mib: 128,
        pid: Some(42),
        backend_state: Some(BackendState::from_stored(r#"{"state":"running","pid":42}"#)),
        dir: format!("/tmp/{id}").into(),
        created_at: now(),
        last_active: now(),
        ttl_s: 0,
        idle_timeout_s: 0,
        metadata: [("run".to_string(), "a".to_string())].into(),
        env: BTreeMap::new(),
        needs_post_restore: true,
        keep_running: false,
        pause_at_ttl: false,
        error: None,
        net: None,
        priority: shoal_api::Priority::Latency,
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
            t.root.layers,
            t.root.upper_size_mib,
            t.root.upper_disk_mib,
            t.state.as_str()
        ),
        (vec![], None, None, "ready")
    );
}

/// The schema as version 2 of the daemon wrote it (db.rs on main before
/// kinds), with rows in every state.
const V2: &str = "
    CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY, template TEXT NOT NULL, state TEXT NOT NULL,
        vcpus INTEGER NOT NULL, memory_mib INTEGER NOT NULL,
        pid INTEGER, pid_start INTEGER, dir TEXT NOT NULL,
        created_at REAL NOT NULL, last_active REAL NOT NULL,
        ttl_s INTEGER NOT NULL, idle_timeout_s INTEGER NOT NULL,
        metadata TEXT NOT NULL, env TEXT NOT NULL,
        needs_post_restore INTEGER NOT NULL, error TEXT,
        keep_running INTEGER NOT NULL DEFAULT 0);
    CREATE INDEX sandboxes_state ON sandboxes(state, template);
    CREATE TABLE templates (
        name TEXT PRIMARY KEY, source TEXT NOT NULL, vcpus INTEGER NOT NULL,
        memory_mib INTEGER NOT NULL, dir TEXT NOT NULL, state TEXT NOT NULL,
        error TEXT, created_at REAL NOT NULL, owned INTEGER NOT NULL);
    CREATE TABLE pools (template TEXT PRIMARY KEY, target INTEGER NOT NULL);
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL,
        subject TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
    ALTER TABLE templates ADD COLUMN layers TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE templates ADD COLUMN upper_size_mib INTEGER;
    ALTER TABLE templates ADD COLUMN upper_disk_mib INTEGER;
    PRAGMA user_version = 2;";

#[test]
fn version_2_migrates_every_row_to_microvm_kinds_and_backend_states() {
    use shoal_runtime::backend::microvm::MicroVm;
    use shoal_runtime::backend::{BackendError, SandboxBackend};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("state.db");
    let sb = |id: &str| dir.path().join("sandboxes").join(id);
    // A pid that has ended: the migrated state must name it, and the
    // backend must find it gone (not take some other process for it).
    let mut c = std::process::Command::new("/bin/true").spawn().unwrap();
    let dead = i32::try_from(c.id()).unwrap();
    c.wait().unwrap();
    {
        let c = Connection::open(&p).unwrap();
        c.execute_batch(V2).unwrap();
        type V2Row<'a> = (&'a str, &'a str, Option<i32>, Option<i64>, Option<&'a str>);
        let rows: [V2Row; 6] = [
            ("run", "running", Some(dead), Some(123), None),
            ("pool", "pooled", Some(dead), Some(124), None),
            ("start", "starting", None, None, None),
            ("pausing", "pausing", Some(dead), Some(125), None),
            ("paused", "paused", None, None, None),
            ("fail", "failed", None, None, Some("boom")),
        ];
        for (i, (id, state, pid, start, err)) in rows.iter().enumerate() {
            c.execute(
                "INSERT INTO sandboxes VALUES (?1, 'tpl', ?2, 2, 256, ?3, ?4, ?5, ?6, ?7, 60, 5,
                 '{\"run\":\"a\"}', '{\"K\":\"v\"}', 1, ?8, ?9)",
                params![
                    id,
                    state,
                    pid,
                    start,
                    sb(id).to_string_lossy(),
                    1000.0 + i as f64,
                    2000.0 + i as f64,
                    err,
                    i % 2 == 0
                ],
            )
            .unwrap();
        }
        c.execute_batch(
            "INSERT INTO templates VALUES ('tpl', 'image:tiny', 2, 256, '/t', 'ready', NULL,
                 1.0, 0, '[\"/l/kit.img\"]', NULL, 64);
             INSERT INTO templates VALUES ('bad', 'image:base', 1, 128, '', 'failed', 'no',
                 2.0, 1, '[]', 64, NULL);
             INSERT INTO pools VALUES ('tpl', 3);
             INSERT INTO events (ts, subject, kind, detail) VALUES (5.0, 'run', 'created', 'x');",
        )
        .unwrap();
    }
    let db = Db::open(&p).unwrap();
    assert_eq!(db.version().unwrap(), SCHEMA_VERSION);
    let all = db
        .list_sandboxes(&Filter {
            include_pooled: true,
            ..Default::default()
        })
        .unwrap();
    let ids: Vec<&str> = all.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["run", "pool", "start", "pausing", "paused", "fail"]);
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.kind, Kind::MicroVm, "{}", r.id);
        assert_eq!(
            (
                r.template.as_str(),
                r.vcpus,
                r.memory_mib,
                r.ttl_s,
                r.idle_timeout_s
            ),
            ("tpl", 2, 256, 60, 5),
            "{}",
            r.id
        );
        assert_eq!(
            (r.created_at, r.last_active),
            (1000.0 + i as f64, 2000.0 + i as f64)
        );
        assert_eq!(r.dir, sb(&r.id));
        assert_eq!(r.metadata.get("run").map(String::as_str), Some("a"));
        assert_eq!(r.env.get("K").map(String::as_str), Some("v"));
        assert!(r.needs_post_restore);
        assert_eq!(r.keep_running, i % 2 == 0);
    }
    let by = |id: &str| all.iter().find(|r| r.id == id).unwrap();
    assert_eq!(by("run").state, State::Running);
    assert_eq!(by("run").pid, Some(dead));
    assert_eq!(by("fail").error.as_deref(), Some("boom"));
    assert_eq!(by("fail").backend_state, None);
    assert_eq!(by("start").backend_state, None, "no pid: nothing to find");
    // The states are the microVM backend's: it decodes them, finds the
    // (ended) VMMs gone, and resumes the paused one from its snapshot.
    let b = MicroVm::new(
        "/nonexistent/shoal-vmm",
        shoal_images::artifacts::Layout::at(dir.path().join("artifacts")),
    );
    for id in ["run", "pool", "pausing"] {
        let s = by(id).backend_state.clone().expect(id);
        assert!(
            s.as_str()
                .contains(&format!("{}/api.sock", sb(id).display())),
            "{s:?}"
        );
        assert!(
            matches!(b.reattach(&sb(id), &s), Err(BackendError::Gone(p)) if p == dead),
            "{id}"
        );
    }
    let paused = by("paused").backend_state.clone().expect("paused state");
    assert!(!b.can_resume(&sb("paused"), &paused), "no snapshot yet");
    let snap = sb("paused").join("snap-0000000000000001");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("state"), b"s").unwrap();
    assert!(b.can_resume(&sb("paused"), &paused));
    // Templates, pools and events survive, templates as microVM ones.
    let t = db.templates().unwrap();
    assert_eq!(t.len(), 2);
    assert!(t.iter().all(|t| t.kind == Kind::MicroVm));
    let tpl = db.template("tpl").unwrap().unwrap();
    assert_eq!(
        (
            tpl.state,
            tpl.root.layers,
            tpl.root.upper_disk_mib,
            tpl.vcpus
        ),
        (
            TemplateState::Ready,
            vec!["/l/kit.img".to_string()],
            Some(64),
            2
        )
    );
    let bad = db.template("bad").unwrap().unwrap();
    assert_eq!(
        (bad.state, bad.error.as_deref(), bad.owned),
        (TemplateState::Failed, Some("no"), true)
    );
    assert_eq!(db.pools().unwrap(), vec![("tpl".to_string(), 3)]);
    assert_eq!(db.events(0, Some("run"), 10).unwrap().len(), 1);
    // The old pid column is gone; writing a row works in the new schema.
    let cols: Vec<String> = db
        .conn
        .prepare("SELECT name FROM pragma_table_info('sandboxes')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(!cols.iter().any(|c| c == "pid_start"), "{cols:?}");
    db.put_sandbox(&row("new", State::Running)).unwrap();
    assert_eq!(db.sandbox("new").unwrap().unwrap().kind, Kind::MicroVm);
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
    // The pooled VM's identity goes with it, not the request's.
    assert_eq!(got.backend_state, row("p", State::Pooled).backend_state);
    assert_eq!(got.kind, Kind::MicroVm);
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
        kind: Kind::Fake,
        vcpus: 1,
        memory_mib: 128,
        dir: "/x".into(),
        state: TemplateState::Ready,
        error: None,
        created_at: 1.0,
        owned: false,
        owner: Some("token:t".into()),
        image: Some("sha256:ab".into()),
        net: false,
        disk: None,
        root: shoal_api::RootRequest {
            layers: vec!["/l/kit.img".into(), "tiny".into()],
            upper_size_mib: None,
            upper_disk_mib: Some(64),
        },
    };
    db.put_template(&t).unwrap();
    assert_eq!(db.template("t").unwrap(), Some(t.clone()));
    assert_eq!(db.templates().unwrap(), vec![t.clone()]);
    // A networked template keeps its flag (schema 8).
    let n = TemplateRow {
        name: "n".into(),
        net: true,
        ..t
    };
    db.put_template(&n).unwrap();
    assert!(db.template("n").unwrap().unwrap().net);
    assert!(db.delete_template("n").unwrap());
    // A vm template's own disk is kept (schema 10).
    let v = TemplateRow {
        name: "v".into(),
        disk: Some(shoal_api::TemplateDisk {
            path: "/l/d.qcow2".into(),
            format: "qcow2".into(),
            kernel: "shoal".into(),
            root: Some("/dev/vda".into()),
            init: Some("/sbin/shoal-agent".into()),
        }),
        ..n.clone()
    };
    db.put_template(&v).unwrap();
    assert_eq!(db.template("v").unwrap(), Some(v));
    assert!(db.delete_template("v").unwrap());
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

const OCI: &str = "oci:sha256:abababababababababababababababababababababababababababababababab";

#[test]
fn version_3_templates_get_owners_only_where_the_daemon_made_them() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("state.db");
    {
        let c = Connection::open(&p).unwrap();
        c.execute_batch(V2).unwrap();
        for (name, source, vcpus, mem) in [
            ("tiny-2c-256m", "image:tiny", 2, 256),
            ("tiny-1c-128m-0123456789ab", "image:tiny", 1, 128),
            // Squatted: a snapshot, or another image or shape, under a
            // derived name.
            ("tiny-1c-128m", "sandbox:0123456789ab", 1, 128),
            ("base-1c-128m", "image:tiny", 1, 128),
            ("tiny-4c-128m", "image:tiny", 1, 128),
            ("tiny-1c-128m-0123", "image:tiny", 1, 128),
            ("mine", "image:tiny", 1, 128),
            ("oci-abababababab-1c-128m", OCI, 1, 128),
        ] {
            c.execute(
                "INSERT INTO templates VALUES (?1, ?2, ?3, ?4, '/t', 'ready', NULL, 1.0, 1,
                 '[]', NULL, NULL)",
                params![name, source, vcpus, mem],
            )
            .unwrap();
        }
    }
    let db = Db::open(&p).unwrap();
    assert_eq!(db.version().unwrap(), SCHEMA_VERSION);
    let owners: Vec<(String, Option<String>)> = db
        .templates()
        .unwrap()
        .into_iter()
        .map(|t| (t.name, t.owner))
        .collect();
    let daemon = Some("daemon".to_string());
    assert_eq!(
        owners,
        vec![
            ("base-1c-128m".into(), None),
            ("mine".into(), None),
            ("oci-abababababab-1c-128m".into(), None),
            ("tiny-1c-128m".into(), None),
            ("tiny-1c-128m-0123".into(), None),
            ("tiny-1c-128m-0123456789ab".into(), daemon.clone()),
            ("tiny-2c-256m".into(), daemon),
            ("tiny-4c-128m".into(), None),
        ]
    );
    // Version 6: a container's template names its image.
    let images: Vec<Option<String>> = db
        .templates()
        .unwrap()
        .into_iter()
        .map(|t| t.image)
        .collect();
    let oci = Some(OCI["oci:".len()..].to_string());
    assert_eq!(
        images.iter().filter(|i| i.is_some()).count(),
        1,
        "{images:?}"
    );
    assert!(images.contains(&oci), "{images:?}");
}

#[test]
fn networks_round_trip_and_version_6_rows_have_none() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("state.db");
    {
        let db = Db::open(&p).unwrap();
        db.put_sandbox(&row("old", State::Running)).unwrap();
        // Back to what a version-6 daemon wrote: no `net` column.
        db.conn
            .execute_batch(
                "ALTER TABLE sandboxes DROP COLUMN net; ALTER TABLE templates DROP COLUMN net; \
                 ALTER TABLE sandboxes DROP COLUMN priority; \
                 ALTER TABLE templates DROP COLUMN disk; PRAGMA user_version = 6;",
            )
            .unwrap();
    }
    let db = Db::open(&p).unwrap();
    assert_eq!(db.version().unwrap(), SCHEMA_VERSION);
    assert_eq!(db.sandbox("old").unwrap().unwrap().net, None);
    let net = SandboxNet {
        slot: 7,
        guest_addr: Ipv4Addr::new(10, 213, 0, 30),
        policy: shoal_api::NetworkSpec {
            allow_out: vec!["pypi.org".into(), "10.1.2.0/24:443".into()],
            deny_out: vec!["10.1.2.3".into()],
            allow_dns: false,
        },
    };
    let mut r = row("new", State::Paused);
    r.net = Some(net.clone());
    db.put_sandbox(&r).unwrap();
    assert_eq!(db.sandbox("new").unwrap().unwrap().net, Some(net));
    // A row whose `net` is not what this daemon writes fails to load
    // instead of passing for a sandbox without a network.
    db.conn
        .execute(
            "UPDATE sandboxes SET net = '{\"slot\":-1}' WHERE id = 'new'",
            [],
        )
        .unwrap();
    assert!(db.sandbox("new").is_err());
}

#[test]
fn priorities_round_trip_and_version_8_rows_are_latency() {
    use shoal_api::Priority;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("state.db");
    {
        let db = Db::open(&p).unwrap();
        db.put_sandbox(&row("old", State::Running)).unwrap();
        // Back to what a version-8 daemon wrote: no `priority` column.
        db.conn
            .execute_batch(
                "ALTER TABLE sandboxes DROP COLUMN priority; \
                 ALTER TABLE templates DROP COLUMN disk; PRAGMA user_version = 8;",
            )
            .unwrap();
    }
    let db = Db::open(&p).unwrap();
    assert_eq!(db.version().unwrap(), SCHEMA_VERSION);
    assert_eq!(
        db.sandbox("old").unwrap().unwrap().priority,
        Priority::Latency
    );
    let mut r = row("be", State::Running);
    r.priority = Priority::BestEffort;
    db.put_sandbox(&r).unwrap();
    assert_eq!(
        db.sandbox("be").unwrap().unwrap().priority,
        Priority::BestEffort
    );
    db.set_priority("old", Priority::BestEffort).unwrap();
    assert_eq!(
        db.by_priority().unwrap(),
        vec![("best_effort".to_string(), 2)]
    );
    db.set_priority("be", Priority::Latency).unwrap();
    let mut counts = db.by_priority().unwrap();
    counts.sort();
    assert_eq!(
        counts,
        vec![("best_effort".to_string(), 1), ("latency".to_string(), 1)]
    );
    // A priority this daemon does not know fails to load.
    db.conn
        .execute("UPDATE sandboxes SET priority = 'high' WHERE id = 'be'", [])
        .unwrap();
    assert!(db.sandbox("be").is_err());
}
