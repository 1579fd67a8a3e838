//! The state directory is its daemon's alone: the directory and its
//! `sandboxes/`, `templates/` and `forks/` 0700, `state.db` (sandbox environments
//! hold secrets) and its WAL files 0600, whatever the umask; modes of an
//! older daemon's state are narrowed on start. Jailed VMMs reach the files
//! they need through bind mounts, which do not need the parents' modes
//! (their own files' modes: `shoal_runtime::jail`).

use super::Config;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

fn chmod(p: &Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// Makes (or narrows) the state directory of `cfg` and its database file.
pub fn secure(cfg: &Config) -> Result<(), String> {
    for d in [
        &cfg.state_dir,
        &cfg.sandboxes_dir(),
        &cfg.templates_dir(),
        &cfg.forks_dir(),
    ] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        chmod(d, 0o700)?;
    }
    let db = cfg.state_dir.join("state.db");
    // Created 0600 before SQLite opens it: SQLite gives its -wal and -shm
    // files the database file's mode.
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&db)
        .map_err(|e| format!("{}: {e}", db.display()))?;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = db.clone().into_os_string();
        p.push(suffix);
        let p = std::path::PathBuf::from(p);
        if p.exists() {
            chmod(&p, 0o600)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o777
    }

    #[test]
    fn state_is_private_whatever_the_umask_and_old_modes_are_narrowed() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        // An older daemon's state: world-readable.
        std::fs::create_dir_all(state.join("sandboxes")).unwrap();
        std::fs::write(state.join("state.db"), "").unwrap();
        std::fs::set_permissions(&state, PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::set_permissions(state.join("state.db"), PermissionsExt::from_mode(0o644)).unwrap();
        // SAFETY: umask cannot fail; restored below.
        let old = unsafe { libc::umask(0) };
        let d = crate::template_dirs::tests::daemon(&state, &tmp.path().join("none"));
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        for p in [
            state.clone(),
            state.join("sandboxes"),
            state.join("templates"),
        ] {
            assert_eq!(mode(&p), 0o700, "{}", p.display());
        }
        assert_eq!(mode(&state.join("state.db")), 0o600);
        let wal = state.join("state.db-wal");
        assert!(wal.exists(), "WAL mode");
        assert_eq!(mode(&wal), 0o600);
        drop(d);
    }
}
