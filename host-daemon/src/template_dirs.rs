//! Where the daemon's templates live: every template it builds or
//! snapshots is in its state directory (`templates/NAME.ID`,
//! [`crate::Config::new_template_dir`]), never in the daemon-less cache,
//! whose pruning of unused templates knows nothing of the daemon's. An
//! image template's directory holds its own links (or copies) of the image
//! and of the image-name layers it was booted with, so that reinstalling
//! the artifacts does not change a template under its snapshot.
//! Directories are removed only by the daemon: with their template when no
//! sandbox still names it, else by [`sweep_dirs`] once none does.

use super::db::{self, TemplateRow};
use super::{ApiResult, Daemon};
use shoal_api::TemplateState;
use shoal_runtime::backend::microvm_template::{pin, BuildError};
use std::path::{Path, PathBuf};

/// Between a template's name and the id of its directory.
pub const DIR_ID_SEP: char = '.';

/// The template name a directory under `templates/` is for
/// (`NAME.ID`, or `NAME` for directories of older daemons).
fn dir_template_name(file_name: &str) -> &str {
    match file_name.rsplit_once(DIR_ID_SEP) {
        Some((n, id)) if id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit()) => n,
        _ => file_name,
    }
}

/// Removes the template directories under the state directory that
/// nothing refers to any more: no template row has it, and no sandbox
/// names the template it was made for. Returns those removed.
pub fn sweep_dirs(d: &Daemon) -> ApiResult<Vec<PathBuf>> {
    let (dirs, names) = d.db(|db| {
        let dirs: std::collections::HashSet<PathBuf> =
            db.templates()?.into_iter().map(|t| t.dir).collect();
        let f = db::Filter {
            include_pooled: true,
            ..Default::default()
        };
        let names: std::collections::HashSet<String> = db
            .list_sandboxes(&f)?
            .into_iter()
            .map(|s| s.template)
            .collect();
        Ok((dirs, names))
    })?;
    let mut removed = vec![];
    for e in std::fs::read_dir(d.cfg.templates_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = e.path();
        let file_name = e.file_name();
        let name = dir_template_name(&file_name.to_string_lossy()).to_string();
        if dirs.contains(&path) || names.contains(&name) {
            continue;
        }
        let gone = match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        if gone.is_ok() {
            removed.push(path);
        }
    }
    Ok(removed)
}

/// Links (else copies) every file of directory `from` into a new
/// directory `to`.
fn link_dir(from: &Path, to: &Path) -> Result<(), BuildError> {
    std::fs::create_dir_all(to).map_err(|e| BuildError::Dir(to.into(), e))?;
    let entries = std::fs::read_dir(from).map_err(|e| BuildError::Dir(from.into(), e))?;
    for e in entries {
        let e = e.map_err(|e| BuildError::Dir(from.into(), e))?;
        if e.file_type().is_ok_and(|t| t.is_file()) {
            pin(&e.path(), &to.join(e.file_name()))?;
        }
    }
    Ok(())
}

/// A ready image template of an older daemon, whose directory is in the
/// daemon-less cache (where it may be pruned), is taken into the state
/// directory: its files linked (else copied) into a new directory of its
/// own. One whose files are gone already is failed (made again on its
/// next use).
fn adopt(d: &Daemon, t: &mut TemplateRow) {
    if t.owned || t.state != TemplateState::Ready || t.dir.starts_with(d.cfg.templates_dir()) {
        return;
    }
    let to = d.cfg.new_template_dir(&t.name);
    let res = match t.dir.join("state").is_file() && t.dir.join("memory").is_file() {
        true => link_dir(&t.dir, &to).map_err(|e| e.to_string()),
        false => Err(format!("its snapshot in {} is gone", t.dir.display())),
    };
    match res {
        Ok(()) => {
            tracing::info!(template = %t.name, from = %t.dir.display(), to = %to.display(),
                "template taken into the state directory");
            t.dir = to;
            t.owned = true;
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&to);
            tracing::warn!(template = %t.name, "{e}");
            t.state = TemplateState::Failed;
            t.error = Some(e);
        }
    }
}

/// On start: templates left `building` by a daemon that stopped are
/// failed (an image template is rebuilt on its next use) and their
/// directories removed, templates of older daemons still in the
/// daemon-less cache are taken into the state directory ([`adopt`]), and
/// template directories nothing refers to are removed.
pub fn recover(d: &Daemon) {
    let r = d.db(|db| {
        for mut t in db.templates()? {
            if !t.owned && t.state == TemplateState::Ready {
                adopt(d, &mut t);
                db.put_template(&t)?;
            }
            if t.state == TemplateState::Building {
                t.state = TemplateState::Failed;
                t.error = Some("the daemon stopped while it was being built".into());
                db.put_template(&t)?;
                // Half written.
                if t.owned && t.dir.starts_with(d.cfg.templates_dir()) {
                    let _ = std::fs::remove_dir_all(&t.dir);
                }
            }
        }
        Ok(())
    });
    if let Err(e) = r {
        tracing::warn!("recovering templates: {e}");
    }
    match sweep_dirs(d) {
        Ok(gone) if !gone.is_empty() => {
            tracing::info!(
                removed = gone.len(),
                "removed template directories no one uses"
            )
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("sweeping template directories: {e}"),
    }
}

#[cfg(test)]
#[path = "template_dirs_tests.rs"]
pub(crate) mod tests;
