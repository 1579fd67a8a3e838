//! The daemon's state in SQLite (WAL): sandboxes, templates, pools and an
//! event log. Schema changes bump [`SCHEMA_VERSION`] and add a migration
//! step (`db_migrate.rs`).

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};
use shoal_api::{NetworkSpec, Priority, RootRequest};
use shoal_runtime::backend::{BackendState, Kind};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Current schema version (stored in `PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 10;

/// Errors of the state database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// SQLite.
    #[error("state database: {0}")]
    Sql(#[from] rusqlite::Error),
    /// The file was written by a newer daemon.
    #[error("state database schema {0} is newer than this daemon's ({SCHEMA_VERSION})")]
    TooNew(i64),
}

type Result<T> = std::result::Result<T, DbError>;

/// Lifecycle states of a sandbox (the API's type: one enum for the
/// wire, the database and the daemon).
pub use shoal_api::SandboxState as State;
pub use shoal_api::{Event, TemplateState, Usage};

/// A sandbox row.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SandboxRow {
    /// Id.
    pub id: String,
    /// Template name.
    pub template: String,
    /// Its kind (the backend that runs it).
    pub kind: Kind,
    /// State.
    pub state: State,
    /// vCPUs.
    pub vcpus: u32,
    /// Guest memory (MiB).
    pub memory_mib: u32,
    /// VM process id (while one runs; shown, never acted on: the backend
    /// state identifies the process).
    pub pid: Option<i32>,
    /// What its backend needs to find its VM again: the running process
    /// (pid, start time, sockets) or the paused state on disk. Opaque here.
    pub backend_state: Option<BackendState>,
    /// Directory (sockets, logs, pause snapshot).
    pub dir: PathBuf,
    /// Seconds since the epoch.
    pub created_at: f64,
    /// Last API activity, seconds since the epoch.
    pub last_active: f64,
    /// Killed this many seconds after creation (0: never).
    pub ttl_s: u64,
    /// Paused after this many idle seconds (0: never).
    pub idle_timeout_s: u64,
    /// User metadata.
    pub metadata: BTreeMap<String, String>,
    /// Environment for every exec.
    pub env: BTreeMap<String, String>,
    /// The next agent connection must send fresh entropy and time.
    pub needs_post_restore: bool,
    /// Never frozen while idle (background work keeps running).
    pub keep_running: bool,
    /// Paused, not killed, when its TTL is reached (its TTL then cleared).
    pub pause_at_ttl: bool,
    /// Why it failed.
    pub error: Option<String>,
    /// Its network (None: it has no network device).
    pub net: Option<SandboxNet>,
    /// Its CPU class.
    pub priority: Priority,
}

/// A networked sandbox's slot and egress policy, stored as JSON in its
/// row (`net`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SandboxNet {
    /// Its slot's index in the address pool (`shoal_hostnet::Slot::index`).
    pub slot: u32,
    /// The guest's address in that slot.
    pub guest_addr: Ipv4Addr,
    /// Its egress policy as last asked for.
    pub policy: NetworkSpec,
}

/// A template row.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TemplateRow {
    /// Name.
    pub name: String,
    /// Image it was booted from (or the sandbox it was snapshotted from).
    pub source: String,
    /// Its kind (the backend that restores it).
    pub kind: Kind,
    /// vCPUs.
    pub vcpus: u32,
    /// Guest memory (MiB).
    pub memory_mib: u32,
    /// Snapshot directory (being written while building; empty for rows of
    /// older daemons that were building).
    pub dir: PathBuf,
    /// Building, ready or failed.
    pub state: TemplateState,
    /// Why it failed.
    pub error: Option<String>,
    /// Seconds since the epoch.
    pub created_at: f64,
    /// The daemon owns `dir` (under its state directory, removed with the
    /// template; rows of older daemons may name a directory elsewhere).
    pub owned: bool,
    /// Who made it ([`crate::auth::Principal::id`]; None: made before
    /// owners were recorded, changed by admins only).
    #[serde(default)]
    pub owner: Option<String>,
    /// The OCI image (`sha256:...`) whose layers its root is, for a
    /// container sandbox's template and every snapshot of one (their
    /// sandboxes' exec defaults come from its config).
    #[serde(default)]
    pub image: Option<String>,
    /// Its layers and upper layer (`upper_size_mib` holds the tmpfs size
    /// actually used, `upper_disk_mib` the scratch disk's).
    #[serde(flatten)]
    pub root: RootRequest,
    /// Booted with a virtio-net device: its sandboxes are the networked
    /// ones, each restored onto its own slot (issue 18).
    #[serde(default)]
    pub net: bool,
    /// A `vm` template's own disk (stored as JSON; NULL: it boots its
    /// image).
    #[serde(default)]
    pub disk: Option<shoal_api::TemplateDisk>,
}

/// Seconds since the epoch.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The database.
pub struct Db {
    conn: Connection,
}

const SANDBOX_COLS: &str = "id, template, state, vcpus, memory_mib, pid, backend_state, dir, \
     created_at, last_active, ttl_s, idle_timeout_s, metadata, env, needs_post_restore, error, \
     keep_running, kind, pause_at_ttl, net, priority";

const TEMPLATE_COLS: &str = "name, source, vcpus, memory_mib, dir, state, error, created_at, \
     owned, layers, upper_size_mib, upper_disk_mib, kind, owner, image, net, disk";

/// A stored count or duration (never negative; SQLite has only i64).
fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A stored kind name.
fn kind(r: &Row<'_>, i: usize) -> rusqlite::Result<Kind> {
    let s: String = r.get(i)?;
    Kind::parse(&s).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            format!("unknown sandbox kind {s:?}").into(),
        )
    })
}

fn sandbox_row(r: &Row<'_>) -> rusqlite::Result<SandboxRow> {
    let state: String = r.get(2)?;
    let json = |i: usize| -> rusqlite::Result<BTreeMap<String, String>> {
        let s: String = r.get(i)?;
        Ok(serde_json::from_str(&s).unwrap_or_default())
    };
    Ok(SandboxRow {
        id: r.get(0)?,
        template: r.get(1)?,
        state: State::parse(&state).unwrap_or(State::Failed),
        vcpus: r.get(3)?,
        memory_mib: r.get(4)?,
        pid: r.get(5)?,
        backend_state: r
            .get::<_, Option<String>>(6)?
            .map(BackendState::from_stored),
        dir: PathBuf::from(r.get::<_, String>(7)?),
        created_at: r.get(8)?,
        last_active: r.get(9)?,
        ttl_s: count(r.get(10)?),
        idle_timeout_s: count(r.get(11)?),
        metadata: json(12)?,
        env: json(13)?,
        needs_post_restore: r.get(14)?,
        error: r.get(15)?,
        keep_running: r.get(16)?,
        kind: kind(r, 17)?,
        pause_at_ttl: r.get(18)?,
        net: r
            .get::<_, Option<String>>(19)?
            .map(|s| {
                serde_json::from_str(&s).map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        19,
                        rusqlite::types::Type::Text,
                        e.into(),
                    )
                })
            })
            .transpose()?,
        priority: {
            let p: String = r.get(20)?;
            Priority::parse(&p).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    20,
                    rusqlite::types::Type::Text,
                    format!("unknown priority {p:?}").into(),
                )
            })?
        },
    })
}

fn template_row(r: &Row<'_>) -> rusqlite::Result<TemplateRow> {
    let layers: String = r.get(9)?;
    Ok(TemplateRow {
        name: r.get(0)?,
        source: r.get(1)?,
        vcpus: r.get(2)?,
        memory_mib: r.get(3)?,
        dir: PathBuf::from(r.get::<_, String>(4)?),
        state: TemplateState::parse(&r.get::<_, String>(5)?).unwrap_or(TemplateState::Failed),
        error: r.get(6)?,
        created_at: r.get(7)?,
        owned: r.get(8)?,
        root: RootRequest {
            layers: serde_json::from_str(&layers).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(
                    9,
                    rusqlite::types::Type::Text,
                    Box::new(e),
                )
            })?,
            upper_size_mib: r.get(10)?,
            upper_disk_mib: r.get(11)?,
        },
        kind: kind(r, 12)?,
        owner: r.get(13)?,
        image: r.get(14)?,
        net: r.get(15)?,
        disk: r
            .get::<_, Option<String>>(16)?
            .map(|s| {
                serde_json::from_str(&s).map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        16,
                        rusqlite::types::Type::Text,
                        e.into(),
                    )
                })
            })
            .transpose()?,
    })
}

fn put(conn: &Connection, s: &SandboxRow) -> Result<()> {
    conn.prepare_cached(&format!(
        "INSERT OR REPLACE INTO sandboxes ({SANDBOX_COLS}) \
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21)"
    ))?
    .execute(params![
        s.id,
        s.template,
        s.state.as_str(),
        s.vcpus,
        s.memory_mib,
        s.pid,
        s.backend_state.as_ref().map(BackendState::as_str),
        s.dir.to_string_lossy(),
        s.created_at,
        s.last_active,
        i64::try_from(s.ttl_s).unwrap_or(i64::MAX),
        i64::try_from(s.idle_timeout_s).unwrap_or(i64::MAX),
        serde_json::to_string(&s.metadata).unwrap_or_default(),
        serde_json::to_string(&s.env).unwrap_or_default(),
        s.needs_post_restore,
        s.error,
        s.keep_running,
        s.kind.as_str(),
        s.pause_at_ttl,
        s.net
            .as_ref()
            .map(|n| serde_json::to_string(n).unwrap_or_default()),
        s.priority.as_str(),
    ])?;
    Ok(())
}

/// Filters for [`Db::list_sandboxes`].
#[derive(Debug, Default, Clone)]
pub struct Filter {
    /// Only this state.
    pub state: Option<State>,
    /// Only this template.
    pub template: Option<String>,
    /// Only sandboxes whose metadata has all these pairs.
    pub metadata: Vec<(String, String)>,
    /// Include pooled sandboxes.
    pub include_pooled: bool,
}

impl Db {
    /// Opens (creating and migrating) the database at `path`.
    pub fn open(path: &Path) -> Result<Db> {
        let conn = Connection::open(path)?;
        Self::init(conn)
    }

    /// An in-memory database (tests).
    pub fn in_memory() -> Result<Db> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<Db> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let mut db = Db { conn };
        db.migrate()?;
        Ok(db)
    }

    /// The schema version on disk.
    pub fn version(&self) -> Result<i64> {
        Ok(self
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))?)
    }

    fn migrate(&mut self) -> Result<()> {
        let v = self.version()?;
        if v > SCHEMA_VERSION {
            return Err(DbError::TooNew(v));
        }
        let tx = self.conn.transaction()?;
        migrate::run(&tx, v)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        tx.commit()?;
        Ok(())
    }

    /// Inserts or replaces a sandbox.
    pub fn put_sandbox(&self, s: &SandboxRow) -> Result<()> {
        put(&self.conn, s)
    }

    /// A sandbox by id.
    pub fn sandbox(&self, id: &str) -> Result<Option<SandboxRow>> {
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {SANDBOX_COLS} FROM sandboxes WHERE id = ?1"),
                [id],
                sandbox_row,
            )
            .optional()?)
    }

    /// Sandboxes matching `f`, oldest first.
    pub fn list_sandboxes(&self, f: &Filter) -> Result<Vec<SandboxRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes ORDER BY created_at"
        ))?;
        let rows = st.query_map([], sandbox_row)?;
        let mut out = Vec::new();
        for r in rows {
            let r = r?;
            if (r.state == State::Pooled && !f.include_pooled && f.state != Some(State::Pooled))
                || f.state.is_some_and(|s| s != r.state)
                || f.template.as_ref().is_some_and(|t| *t != r.template)
                || !f.metadata.iter().all(|(k, v)| r.metadata.get(k) == Some(v))
            {
                continue;
            }
            out.push(r);
        }
        Ok(out)
    }

    /// Deletes a sandbox row.
    pub fn delete_sandbox(&self, id: &str) -> Result<bool> {
        Ok(self
            .conn
            .execute("DELETE FROM sandboxes WHERE id = ?1", [id])?
            > 0)
    }

    /// Sets a sandbox's state (and clears or keeps its pid; the backend
    /// state is kept: a paused sandbox's names its state on disk).
    pub fn set_state(&self, id: &str, state: State, error: Option<&str>) -> Result<()> {
        let clear_pid = !state.has_vmm();
        self.conn.execute(
            "UPDATE sandboxes SET state = ?2, error = COALESCE(?3, error),
                pid = CASE WHEN ?4 THEN NULL ELSE pid END
             WHERE id = ?1",
            params![id, state.as_str(), error, clear_pid],
        )?;
        Ok(())
    }

    /// Records a sandbox paused to disk: no process, `state` to resume it.
    pub fn set_paused(&self, id: &str, state: &BackendState) -> Result<()> {
        self.conn.execute(
            "UPDATE sandboxes SET state = 'paused', pid = NULL, backend_state = ?2 WHERE id = ?1",
            params![id, state.as_str()],
        )?;
        Ok(())
    }

    /// Sets a sandbox's TTL (s from its creation; 0 none) and idle
    /// timeout (s; 0 none), each only if given.
    pub fn set_limits(&self, id: &str, ttl_s: Option<u64>, idle_s: Option<u64>) -> Result<()> {
        let int = |v: Option<u64>| v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        self.conn.execute(
            "UPDATE sandboxes SET ttl_s = COALESCE(?2, ttl_s),
                idle_timeout_s = COALESCE(?3, idle_timeout_s)
             WHERE id = ?1",
            params![id, int(ttl_s), int(idle_s)],
        )?;
        Ok(())
    }

    /// Sets a sandbox's CPU class.
    pub fn set_priority(&self, id: &str, p: Priority) -> Result<()> {
        self.conn.execute(
            "UPDATE sandboxes SET priority = ?2 WHERE id = ?1",
            params![id, p.as_str()],
        )?;
        Ok(())
    }

    /// Sandboxes holding a VMM, per CPU class (for the metrics).
    pub fn by_priority(&self) -> Result<Vec<(String, u64)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT priority, COUNT(*) FROM sandboxes
             WHERE state IN ('pooled', 'starting', 'running', 'pausing') GROUP BY priority",
        )?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, count(r.get(1)?))))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Records activity on a sandbox.
    pub fn touch(&self, id: &str, t: f64) -> Result<()> {
        self.conn.execute(
            "UPDATE sandboxes SET last_active = ?2 WHERE id = ?1",
            params![id, t],
        )?;
        Ok(())
    }

    /// Hands a pooled sandbox out: the oldest pooled one of `template`
    /// keeps its id, VMM and directory and takes `s`'s settings (metadata,
    /// limits, environment), atomically.
    pub fn take_pooled(&mut self, template: &str, s: &SandboxRow) -> Result<Option<SandboxRow>> {
        let tx = self.conn.transaction()?;
        let found = tx
            .query_row(
                &format!(
                    "SELECT {SANDBOX_COLS} FROM sandboxes WHERE state = 'pooled' AND template = ?1 \
                     ORDER BY created_at LIMIT 1"
                ),
                [template],
                sandbox_row,
            )
            .optional()?;
        let Some(p) = found else {
            return Ok(None);
        };
        let row = SandboxRow {
            id: p.id,
            state: State::Running,
            kind: p.kind,
            pid: p.pid,
            backend_state: p.backend_state,
            dir: p.dir,
            needs_post_restore: p.needs_post_restore,
            ..s.clone()
        };
        put(&tx, &row)?;
        tx.commit()?;
        Ok(Some(row))
    }

    /// Counts per (template, state) of sandboxes holding a VMM, and the
    /// reserved vCPUs and memory (for admission).
    pub fn usage(&self) -> Result<Usage> {
        let mut u = Usage::default();
        let mut st = self.conn.prepare_cached(
            "SELECT state, COUNT(*), SUM(vcpus), SUM(memory_mib) FROM sandboxes GROUP BY state",
        )?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Option<i64>>(2)?.unwrap_or(0),
                r.get::<_, Option<i64>>(3)?.unwrap_or(0),
            ))
        })?;
        for r in rows {
            let (state, n, cpus, mem) = r?;
            let state = State::parse(&state).unwrap_or(State::Failed);
            u.by_state.insert(state.as_str().into(), count(n));
            if state.has_vmm() {
                u.vms += count(n);
                u.vcpus += count(cpus);
                u.memory_mib += count(mem);
            }
        }
        u.disk_mib = self.reserved_disk_mib(None)?;
        Ok(u)
    }

    /// Disk reserved by every sandbox but failed ones (and but the sandbox
    /// `except`): its memory (written when paused) and its template's
    /// scratch disk ([`crate::admission::disk_need_mib`]; a sandbox whose
    /// template was deleted counts its memory only); and by every template
    /// but failed ones: its memory file and scratch disk.
    pub fn reserved_disk_mib(&self, except: Option<&str>) -> Result<u64> {
        let mut st = self.conn.prepare_cached(
            "SELECT
               (SELECT COALESCE(SUM(s.memory_mib + COALESCE(t.upper_disk_mib, 0)), 0)
                FROM sandboxes s LEFT JOIN templates t ON t.name = s.template
                WHERE s.state != 'failed' AND (?1 IS NULL OR s.id != ?1))
             + (SELECT COALESCE(SUM(memory_mib + COALESCE(upper_disk_mib, 0)), 0)
                FROM templates WHERE state != 'failed')",
        )?;
        Ok(count(st.query_row([except], |r| r.get(0))?))
    }

    /// Pooled sandboxes per template.
    pub fn pooled_counts(&self) -> Result<BTreeMap<String, u64>> {
        let mut st = self.conn.prepare_cached(
            "SELECT template, COUNT(*) FROM sandboxes WHERE state = 'pooled' GROUP BY template",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, count(r.get(1)?))))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Inserts or replaces a template.
    pub fn put_template(&self, t: &TemplateRow) -> Result<()> {
        self.conn.execute(
            &format!(
                "INSERT OR REPLACE INTO templates ({TEMPLATE_COLS})
                 VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17)"
            ),
            params![
                t.name,
                t.source,
                t.vcpus,
                t.memory_mib,
                t.dir.to_string_lossy(),
                t.state.as_str(),
                t.error,
                t.created_at,
                t.owned,
                serde_json::to_string(&t.root.layers).unwrap_or_else(|_| "[]".into()),
                t.root.upper_size_mib,
                t.root.upper_disk_mib,
                t.kind.as_str(),
                t.owner,
                t.image,
                t.net,
                t.disk
                    .as_ref()
                    .map(|d| serde_json::to_string(d).unwrap_or_default()),
            ],
        )?;
        Ok(())
    }

    /// A template by name.
    pub fn template(&self, name: &str) -> Result<Option<TemplateRow>> {
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {TEMPLATE_COLS} FROM templates WHERE name = ?1"),
                [name],
                template_row,
            )
            .optional()?)
    }

    /// All templates.
    pub fn templates(&self) -> Result<Vec<TemplateRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {TEMPLATE_COLS} FROM templates ORDER BY name"
        ))?;
        let rows = st.query_map([], template_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Deletes a template (and its pool).
    pub fn delete_template(&self, name: &str) -> Result<bool> {
        self.conn
            .execute("DELETE FROM pools WHERE template = ?1", [name])?;
        Ok(self
            .conn
            .execute("DELETE FROM templates WHERE name = ?1", [name])?
            > 0)
    }

    /// Sets a pool's target size (0 removes the pool).
    pub fn set_pool(&self, template: &str, target: u32) -> Result<()> {
        if target == 0 {
            self.conn
                .execute("DELETE FROM pools WHERE template = ?1", [template])?;
        } else {
            self.conn.execute(
                "INSERT OR REPLACE INTO pools (template, target) VALUES (?1, ?2)",
                params![template, target],
            )?;
        }
        Ok(())
    }

    /// Pools: template and target size.
    pub fn pools(&self) -> Result<Vec<(String, u32)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT template, target FROM pools ORDER BY template")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Appends an event (the log keeps the last 100,000).
    pub fn event(&self, subject: &str, kind: &str, detail: &str) -> Result<()> {
        let mut st = self.conn.prepare_cached(
            "INSERT INTO events (ts, subject, kind, detail) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let seq = st.insert(params![now(), subject, kind, detail])?;
        if seq % 10_000 == 0 {
            self.conn
                .execute("DELETE FROM events WHERE seq <= ?1", [seq - 100_000])?;
        }
        Ok(())
    }

    /// Events after `since`, optionally for one subject, at most `limit`.
    pub fn events(&self, since: i64, subject: Option<&str>, limit: u32) -> Result<Vec<Event>> {
        let mut st = self.conn.prepare_cached(
            "SELECT seq, ts, subject, kind, detail FROM events
             WHERE seq > ?1 AND (?2 IS NULL OR subject = ?2) ORDER BY seq LIMIT ?3",
        )?;
        let rows = st.query_map(params![since, subject, limit], |r| {
            Ok(Event {
                seq: r.get(0)?,
                ts: r.get(1)?,
                subject: r.get(2)?,
                kind: r.get(3)?,
                detail: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

#[path = "db_migrate.rs"]
mod migrate;

#[cfg(test)]
#[path = "db_tests.rs"]
mod tests;
