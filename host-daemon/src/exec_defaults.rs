//! The exec defaults of container sandboxes ([`crate::containers`]), from
//! their image's config, as `docker exec` has them: `WorkingDir` is the
//! cwd and `User` the user of an exec that names neither, and an exec
//! with an empty `cmd` runs the image's `Entrypoint` + `Cmd` (`shoal run
//! --image REF` with no command). The image's `Env` is already the
//! sandbox's environment (merged at create, [`crate::containers::merged_env`]).
//!
//! `User` is `uid`, `uid:gid`, `name`, `name:group` (or mixed); names are
//! looked up in the sandbox's own `/etc/passwd` and `/etc/group` (read
//! through its agent, capped), as the container runtime does at each exec;
//! a uid without a group gets the primary group its passwd entry has, else
//! 0. The user's home from passwd is `HOME` unless the exec sets one.

use crate::containers::config_of;
use crate::db::SandboxRow;
use crate::{within, ApiError, ApiResult, Daemon};
use agent_client::{AsyncClient, ClientError};
use shoal_api as api;
use shoal_api::images::ImageConfig;
use std::sync::Arc;

/// The largest `/etc/passwd` or `/etc/group` read from a guest.
const MAX_USER_DB: u64 = 1 << 20;

/// The image config of sandbox `row`, when it is a container sandbox.
pub(crate) async fn config(d: &Daemon, row: &SandboxRow) -> ApiResult<Option<Arc<ImageConfig>>> {
    config_of(d, &row.template).await
}

/// Applies the cwd and user defaults of sandbox `row`'s image (if it is a
/// container sandbox) to an agent request that does not set them.
pub(crate) async fn apply_for(
    d: &Daemon,
    row: &SandboxRow,
    req: &mut agent_client::ExecRequest,
    c: &AsyncClient,
) -> ApiResult<()> {
    match config_of(d, &row.template).await? {
        Some(cfg) => apply(d, &cfg, req, c).await,
        None => Ok(()),
    }
}

/// An empty `cmd` made the image's `Entrypoint` + `Cmd`.
pub(crate) fn default_command(
    cfg: &ImageConfig,
    mut b: api::ExecRequest,
) -> ApiResult<api::ExecRequest> {
    if b.shell.is_none() && b.cmd.as_ref().is_some_and(Vec::is_empty) {
        let argv: Vec<String> = cfg
            .entrypoint
            .iter()
            .chain(cfg.cmd.iter())
            .flatten()
            .cloned()
            .collect();
        if argv.is_empty() {
            return Err(ApiError::BadRequest(
                "'cmd' is empty and the image has no Entrypoint or Cmd: give a command".into(),
            ));
        }
        b.cmd = Some(argv);
    }
    Ok(b)
}

pub(crate) async fn apply(
    d: &Daemon,
    cfg: &ImageConfig,
    req: &mut agent_client::ExecRequest,
    c: &AsyncClient,
) -> ApiResult<()> {
    if req.cwd.is_none() {
        if let Some(w) = cfg.working_dir.as_deref().filter(|w| !w.is_empty()) {
            req.cwd = Some(w.as_bytes().to_vec());
        }
    }
    let Some(user) = cfg.user.as_deref().filter(|u| !u.is_empty()) else {
        return Ok(());
    };
    if req.user.is_some() {
        return Ok(());
    }
    let (u, g) = split_user(user);
    let passwd = match (numeric(u), g.map(numeric)) {
        (Some(_), Some(Some(_))) => String::new(),
        _ => user_db(d, c, "/etc/passwd").await?,
    };
    let group = match g {
        Some(g) if numeric(g).is_none() => user_db(d, c, "/etc/group").await?,
        _ => String::new(),
    };
    let (uid, gid, entry) = resolve_user(user, &passwd, &group)?;
    req.user = Some(agent_client::User { uid, gid });
    let has_home = req.env.iter().any(|(k, _)| k == b"HOME");
    if let (false, Some(e)) = (has_home, entry) {
        req.env.push((b"HOME".to_vec(), e.home.into_bytes()));
    }
    Ok(())
}

fn numeric(s: &str) -> Option<u32> {
    s.parse().ok()
}

/// `user` or `group` of a `User` value.
fn split_user(user: &str) -> (&str, Option<&str>) {
    user.split_once(':')
        .map_or((user, None), |(u, g)| (u, Some(g)))
}

/// The uid and gid a `User` value names, given the guest's passwd and
/// group text (read only where a name needs them), and its passwd entry.
fn resolve_user(user: &str, passwd: &str, group: &str) -> ApiResult<(u32, u32, Option<Entry>)> {
    let (u, g) = split_user(user);
    let entry = match numeric(u) {
        Some(uid) => find(passwd, |f| f.get(2) == Some(&uid.to_string().as_str())),
        None => find(passwd, |f| f.first() == Some(&u)),
    };
    let uid = match (numeric(u), &entry) {
        (Some(uid), _) => uid,
        (None, Some(e)) => e.uid,
        (None, None) => return Err(unknown("user", u, user)),
    };
    let gid = match g {
        None => entry.as_ref().map_or(0, |e| e.gid),
        Some(g) => match numeric(g) {
            Some(gid) => gid,
            None => find(group, |f| f.first() == Some(&g))
                .map(|e| e.uid)
                .ok_or_else(|| unknown("group", g, user))?,
        },
    };
    Ok((uid, gid, entry))
}

fn unknown(what: &str, name: &str, user: &str) -> ApiError {
    ApiError::BadRequest(format!(
        "the image's User {user:?}: no {what} {name:?} in the sandbox's /etc/{}",
        if what == "user" { "passwd" } else { "group" }
    ))
}

/// One entry of passwd or group text: its id (field 3), its group (field
/// 4 of passwd) and home (field 6 of passwd).
struct Entry {
    uid: u32,
    gid: u32,
    home: String,
}

fn find(db: &str, pick: impl Fn(&[&str]) -> bool) -> Option<Entry> {
    db.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 3 || !pick(&f) {
            return None;
        }
        Some(Entry {
            uid: f.get(2)?.parse().ok()?,
            gid: f.get(3).and_then(|g| g.parse().ok()).unwrap_or(0),
            home: f.get(5).map_or_else(|| "/".into(), |h| h.to_string()),
        })
    })
}

/// A user database of the guest; empty when it has none.
async fn user_db(d: &Daemon, c: &AsyncClient, path: &str) -> ApiResult<String> {
    let work = async {
        let mut dl = match c.open_download(path, 0, Some(MAX_USER_DB + 1)).await {
            Ok(dl) => dl,
            Err(ClientError::Remote { errno, .. }) if errno == libc::ENOENT => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e.into()),
        };
        let mut v = Vec::new();
        while let Some(chunk) = dl.next_chunk().await? {
            v.extend_from_slice(&chunk);
            if v.len() as u64 > MAX_USER_DB {
                return Err(ApiError::Sandbox(format!(
                    "{path} in the guest is over {MAX_USER_DB} bytes"
                )));
            }
        }
        Ok(v)
    };
    let v = within("reading a guest file", d.cfg.agent.file_op_timeout, work).await?;
    Ok(String::from_utf8_lossy(&v).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_cmd_is_the_images_entrypoint_and_cmd() {
        let cfg = ImageConfig {
            entrypoint: Some(vec!["/bin/app".into()]),
            cmd: Some(vec!["--flag".into()]),
            ..Default::default()
        };
        let b = api::ExecRequest {
            cmd: Some(vec![]),
            ..api::ExecRequest::argv(["x"])
        };
        let b = default_command(&cfg, b).unwrap();
        assert_eq!(b.cmd.unwrap(), ["/bin/app", "--flag"]);
        let kept = default_command(&cfg, api::ExecRequest::argv(["ls"])).unwrap();
        assert_eq!(kept.cmd.unwrap(), ["ls"], "a command is run as given");
        let none = api::ExecRequest {
            cmd: Some(vec![]),
            ..api::ExecRequest::argv(["x"])
        };
        let e = default_command(&ImageConfig::default(), none).unwrap_err();
        assert!(e.to_string().contains("no Entrypoint or Cmd"), "{e}");
    }

    #[test]
    fn passwd_entries_by_name_and_id() {
        let db = "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\nbad\n";
        let e = find(db, |f| f.first() == Some(&"app")).unwrap();
        assert_eq!((e.uid, e.gid, e.home.as_str()), (1000, 1001, "/home/app"));
        let e = find(db, |f| f.get(2) == Some(&"0")).unwrap();
        assert_eq!((e.uid, e.gid), (0, 0));
        assert!(find(db, |f| f.first() == Some(&"nobody")).is_none());
        let groups = "root:x:0:\nstaff:x:50:app\n";
        assert_eq!(
            find(groups, |f| f.first() == Some(&"staff")).unwrap().uid,
            50
        );
        let ids = |u: &str| resolve_user(u, db, groups).map(|(u, g, _)| (u, g));
        assert_eq!(ids("app").unwrap(), (1000, 1001));
        assert_eq!(ids("1000").unwrap(), (1000, 1001), "its passwd group");
        assert_eq!(ids("app:staff").unwrap(), (1000, 50));
        assert_eq!(ids("app:7").unwrap(), (1000, 7));
        assert_eq!(ids("0:staff").unwrap(), (0, 50));
        // A uid the image has no entry for (USER 1000 without passwd): gid 0.
        let none = |u: &str| resolve_user(u, "", "").map(|(u, g, _)| (u, g));
        assert_eq!(none("1234").unwrap(), (1234, 0));
        assert_eq!(none("5:6").unwrap(), (5, 6));
        for bad in ["nobody", "app:nogroup"] {
            let e = ids(bad).unwrap_err();
            assert_eq!(e.status(), 400, "{e}");
            assert!(e.to_string().contains("no "), "{e}");
        }
    }
}
