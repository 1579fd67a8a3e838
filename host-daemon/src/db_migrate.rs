//! Schema migrations, one step per version: each brings a database of the
//! version before it up to its own, inside the caller's transaction.

use super::Result;
use rusqlite::{params, Transaction};
use shoal_runtime::backend::microvm::MicroVm;
use std::path::PathBuf;

/// Brings a database at `from` (0: new) to [`super::SCHEMA_VERSION`].
pub(super) fn run(tx: &Transaction<'_>, from: i64) -> Result<()> {
    if from < 1 {
        v1(tx)?;
    }
    if from < 2 {
        v2(tx)?;
    }
    if from < 3 {
        v3(tx)?;
    }
    if from < 4 {
        v4(tx)?;
    }
    if from < 5 {
        v5(tx)?;
    }
    if from < 6 {
        v6(tx)?;
    }
    if from < 7 {
        v7(tx)?;
    }
    if from < 8 {
        v8(tx)?;
    }
    if from < 9 {
        v9(tx)?;
    }
    if from < 10 {
        v10(tx)?;
    }
    Ok(())
}

/// Sandboxes, templates, pools, events.
fn v1(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch(
        "CREATE TABLE sandboxes (
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
            subject TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);",
    )?;
    Ok(())
}

/// Templates' layers and upper layer.
fn v2(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch(
        "ALTER TABLE templates ADD COLUMN layers TEXT NOT NULL DEFAULT '[]';
         ALTER TABLE templates ADD COLUMN upper_size_mib INTEGER;
         ALTER TABLE templates ADD COLUMN upper_disk_mib INTEGER;",
    )?;
    Ok(())
}

/// Kinds: every sandbox and template so far is a microVM. Each sandbox's
/// backend state replaces its pid start time: what the microVM backend
/// needs to reattach its VMM (or resume it, when paused) is written from
/// the pid, start time and directory the row has.
fn v3(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch(
        "ALTER TABLE sandboxes ADD COLUMN kind TEXT NOT NULL DEFAULT 'microvm';
         ALTER TABLE sandboxes ADD COLUMN backend_state TEXT;
         ALTER TABLE templates ADD COLUMN kind TEXT NOT NULL DEFAULT 'microvm';",
    )?;
    /// id, state, pid, pid start time, directory.
    type V2Row = (String, String, Option<i32>, Option<i64>, String);
    let rows: Vec<V2Row> = {
        let mut st = tx.prepare("SELECT id, state, pid, pid_start, dir FROM sandboxes")?;
        let rows = st.query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (id, state, pid, start, dir) in rows {
        let has_vmm = matches!(
            state.as_str(),
            "pooled" | "starting" | "running" | "pausing"
        );
        let paused = state == "paused";
        let start = start.and_then(|s| u64::try_from(s).ok());
        let s = if has_vmm || paused {
            MicroVm::state_before_v3(&PathBuf::from(dir), paused, pid, start)
        } else {
            None
        };
        tx.execute(
            "UPDATE sandboxes SET backend_state = ?2 WHERE id = ?1",
            params![id, s.as_ref().map(|s| s.as_str())],
        )?;
    }
    tx.execute_batch("ALTER TABLE sandboxes DROP COLUMN pid_start;")?;
    Ok(())
}

/// Templates' owners. Rows of older daemons that are what the daemon
/// itself makes for `{"image": ...}` creates (named `IMAGE-Nc-Mm`, or that
/// and a 12-character hash of the root, for their own image and shape)
/// are the daemon's; every other row keeps no owner (admins only may
/// change it), so a derived name squatted before this version is not
/// taken for the daemon's (and is made again on its next use).
fn v4(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch(
        "ALTER TABLE templates ADD COLUMN owner TEXT;
         UPDATE templates SET owner = 'daemon'
         WHERE source LIKE 'image:%' AND (
            name = substr(source, 7) || '-' || vcpus || 'c-' || memory_mib || 'm'
            OR (substr(name, 1, length(name) - 13)
                    = substr(source, 7) || '-' || vcpus || 'c-' || memory_mib || 'm'
                AND substr(name, length(name) - 12, 1) = '-'));",
    )?;
    Ok(())
}

/// Sandboxes paused, not killed, at their TTL (E2B's `autoPause`).
fn v5(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch("ALTER TABLE sandboxes ADD COLUMN pause_at_ttl INTEGER NOT NULL DEFAULT 0;")?;
    Ok(())
}

/// The OCI image of a template, named by its source for a container's
/// (a snapshot of a container sandbox made before this keeps none).
fn v6(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch(
        "ALTER TABLE templates ADD COLUMN image TEXT;
         UPDATE templates SET image = substr(source, 5) WHERE source LIKE 'oci:sha256:%';",
    )?;
    Ok(())
}

/// Sandboxes' networks: slot index, guest address and egress policy as
/// JSON (NULL: no network device, as every sandbox before this had).
fn v7(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch("ALTER TABLE sandboxes ADD COLUMN net TEXT;")?;
    Ok(())
}

/// Templates booted with a network device (0 for every earlier one).
fn v8(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch("ALTER TABLE templates ADD COLUMN net INTEGER NOT NULL DEFAULT 0;")?;
    Ok(())
}

/// Sandboxes' CPU classes (`latency` for every earlier one).
fn v9(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch("ALTER TABLE sandboxes ADD COLUMN priority TEXT NOT NULL DEFAULT 'latency';")?;
    Ok(())
}

/// `vm` templates' own disks, as JSON (NULL for every earlier template).
fn v10(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch("ALTER TABLE templates ADD COLUMN disk TEXT;")?;
    Ok(())
}
