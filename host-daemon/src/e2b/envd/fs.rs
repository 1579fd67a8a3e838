//! `filesystem.Filesystem`: Stat, ListDir (with depth), MakeDir, Move,
//! Remove, through the guest agent's file calls.

use super::connect::{self, Code, RpcError};
use super::{users, Guest};
use agent_client::{AsyncClient, FileStat, FileType};
use axum::extract::Request;
use axum::response::Response;
use serde_json::{json, Value};
use std::time::Duration;

/// The most entries a `ListDir` returns.
const MAX_ENTRIES: usize = 10_000;
/// The deepest `ListDir` walks.
const MAX_DEPTH: u64 = 32;

/// Serves `filesystem.Filesystem/<method>`.
pub(super) async fn serve(g: &Guest, method: &str, req: Request) -> Response {
    if method == "WatchDir" {
        return super::watch::watch_dir(g, req)
            .await
            .unwrap_or_else(|e| connect::stream_error(&e));
    }
    unary(g, method, req)
        .await
        .unwrap_or_else(|e| e.unary_response())
}

async fn unary(g: &Guest, method: &str, req: Request) -> Result<Response, RpcError> {
    let headers = req.headers().clone();
    let asked = users::basic_user(&headers)?;
    let deadline = connect::timeout(&headers)?.unwrap_or(Duration::from_secs(60));
    let body = connect::read_body(req.into_body(), 1 << 20, deadline).await?;
    let m = connect::parse_json(&body)?;
    if matches!(
        method,
        "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher"
    ) {
        let work = super::watch::polling(g, method, &m, &headers);
        return match tokio::time::timeout(deadline.max(g.op_timeout()), work).await {
            Ok(r) => Ok(connect::unary_ok(&r?)),
            Err(_) => Err(RpcError::new(
                Code::DeadlineExceeded,
                "the sandbox did not answer in time",
            )),
        };
    }
    let (c, _busy) = g.client().await?;
    let user = g.user(&c, asked.as_deref()).await?;
    let ctx = Ctx {
        g,
        c: &c,
        passwd: g.user_db(&c, "/etc/passwd").await?,
        group: g.user_db(&c, "/etc/group").await?,
    };
    let path = |k: &str| -> Result<String, RpcError> {
        let p = m[k]
            .as_str()
            .ok_or_else(|| RpcError::invalid(format!("{k}: expected a path")))?;
        users::absolute(p, &user)
    };
    let work = async {
        let out = match method {
            "Stat" => json!({"entry": ctx.entry(&path("path")?).await?}),
            "ListDir" => {
                let depth = match &m["depth"] {
                    Value::Null => 1,
                    v => connect::int64(v)
                        .and_then(|d| u64::try_from(d).ok())
                        .ok_or_else(|| RpcError::invalid("depth: expected a count"))?,
                };
                if depth == 0 || depth > MAX_DEPTH {
                    return Err(RpcError::invalid(format!(
                        "depth {depth}: expected 1..={MAX_DEPTH}"
                    )));
                }
                json!({"entries": ctx.list(&path("path")?, depth).await?})
            }
            "MakeDir" => {
                let p = path("path")?;
                match ctx.c.lstat(&p).await {
                    Ok(_) => {
                        return Err(RpcError::new(
                            Code::AlreadyExists,
                            format!("directory {p} already exists"),
                        ))
                    }
                    Err(e) if e.errno() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(crate::ApiError::from(e).into()),
                }
                ctx.c.mkdir(&p, 0o755, true).await.map_err(api)?;
                if user.uid != 0 {
                    chown(g, &p, &user).await?;
                }
                json!({"entry": ctx.entry(&p).await?})
            }
            "Move" => {
                let (from, to) = (path("source")?, path("destination")?);
                ctx.c.rename(&from, &to).await.map_err(api)?;
                json!({"entry": ctx.entry(&to).await?})
            }
            "Remove" => {
                let p = path("path")?;
                match ctx.c.remove(&p, true).await {
                    Ok(()) => {}
                    // As envd's os.RemoveAll: nothing there is fine.
                    Err(e) if e.errno() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(api(e)),
                }
                json!({})
            }
            m => {
                return Err(RpcError::new(
                    Code::Unimplemented,
                    format!("filesystem.Filesystem/{m} is not a method"),
                ))
            }
        };
        Ok(out)
    };
    let out = match tokio::time::timeout(deadline.max(g.op_timeout()), work).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(RpcError::new(
                Code::DeadlineExceeded,
                "the sandbox did not answer in time",
            ))
        }
    };
    Ok(connect::unary_ok(&out))
}

fn api(e: agent_client::ClientError) -> RpcError {
    crate::ApiError::from(e).into()
}

/// Gives `path` to `user` (one exec of chown in the guest).
pub(super) async fn chown(g: &Guest, path: &str, user: &users::GuestUser) -> Result<(), RpcError> {
    let (c, _busy) = g.client().await?;
    let owner = format!("{}:{}", user.uid, user.gid);
    let req = agent_client::ExecRequest::argv(["chown", "--", owner.as_str(), path])
        .with_timeout(g.op_timeout());
    let out = crate::within("chown", g.op_timeout(), async {
        Ok(c.exec_simple(&req).await?)
    })
    .await?;
    match out.result.status {
        agent_client::ExitStatus::Exited(0) => Ok(()),
        _ => Err(RpcError::new(
            Code::Internal,
            format!(
                "chown {owner} {path}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        )),
    }
}

/// What building entries needs.
struct Ctx<'a> {
    g: &'a Guest,
    c: &'a AsyncClient,
    passwd: String,
    group: String,
}

impl Ctx<'_> {
    /// The `EntryInfo` of `path` (not following a last symlink).
    async fn entry(&self, path: &str) -> Result<Value, RpcError> {
        let _ = self.g;
        let st = self.c.lstat(path).await.map_err(api)?;
        Ok(entry_info(path, &st, &self.passwd, &self.group))
    }

    /// Entries under `dir`, `depth` levels deep, sorted by path.
    async fn list(&self, dir: &str, depth: u64) -> Result<Vec<Value>, RpcError> {
        let st = self.c.stat(dir).await.map_err(api)?;
        if st.file_type != FileType::Dir {
            return Err(RpcError::invalid(format!("path {dir} is not a directory")));
        }
        let mut out = Vec::new();
        let mut todo = vec![(dir.to_string(), 1u64)];
        while let Some((d, level)) = todo.pop() {
            let names = match self.c.list_dir(&d).await {
                Ok(v) => v,
                // A subdirectory that went (or cannot be read) meanwhile.
                Err(_) if d != dir => continue,
                Err(e) => return Err(api(e)),
            };
            for e in names {
                let name = String::from_utf8_lossy(&e.name).into_owned();
                if name == "." || name == ".." {
                    continue;
                }
                if out.len() >= MAX_ENTRIES {
                    return Err(RpcError::new(
                        Code::ResourceExhausted,
                        format!("more than {MAX_ENTRIES} entries under {dir}"),
                    ));
                }
                let p = if d == "/" {
                    format!("/{name}")
                } else {
                    format!("{d}/{name}")
                };
                let Ok(st) = self.c.lstat(&p).await else {
                    continue;
                };
                if st.file_type == FileType::Dir && level < depth {
                    todo.push((p.clone(), level + 1));
                }
                out.push(entry_info(&p, &st, &self.passwd, &self.group));
            }
        }
        out.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
        Ok(out)
    }
}

/// The ProtoJSON `EntryInfo` of `path`.
pub(crate) fn entry_info(path: &str, st: &FileStat, passwd: &str, group: &str) -> Value {
    let name = path
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("/");
    let t = match st.file_type {
        FileType::Dir => "FILE_TYPE_DIRECTORY",
        FileType::Symlink => "FILE_TYPE_SYMLINK",
        FileType::File | FileType::Other => "FILE_TYPE_FILE",
    };
    let owner = users::name_of(passwd, st.uid).unwrap_or_else(|| st.uid.to_string());
    let grp = users::name_of(group, st.gid).unwrap_or_else(|| st.gid.to_string());
    json!({
        "name": name,
        "type": t,
        "path": path,
        "size": st.size.to_string(),
        "mode": st.mode & 0o777,
        "permissions": permissions(st.file_type, st.mode),
        "owner": owner,
        "group": grp,
        "modifiedTime": rfc3339(st.mtime_ns),
    })
}

/// Permissions as Go's `os.FileMode.String` writes them (`drwxr-xr-x`).
pub(crate) fn permissions(t: FileType, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match t {
        FileType::Dir => 'd',
        FileType::Symlink => 'L',
        _ => '-',
    });
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// ns since the epoch as RFC 3339 (UTC, nanoseconds where there are).
pub(crate) fn rfc3339(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let frac = ns.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (y, m, d) = shoal_api::time::civil_from_days(days);
    let (h, mi, s) = (tod / 3600, tod % 3600 / 60, tod % 60);
    if frac == 0 {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
    } else {
        let f = format!("{frac:09}");
        format!(
            "{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{}Z",
            f.trim_end_matches('0')
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_764_604_800_500_000_000), "2025-12-01T16:00:00.5Z");
        assert_eq!(rfc3339(951_782_400 * 1_000_000_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(-1_000_000_000), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn permissions_as_go_writes_them() {
        assert_eq!(permissions(FileType::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(FileType::File, 0o640), "-rw-r-----");
        assert_eq!(permissions(FileType::Symlink, 0o777), "Lrwxrwxrwx");
    }

    #[test]
    fn entries_carry_what_the_sdk_reads() {
        let st = FileStat {
            file_type: FileType::File,
            mode: 0o644,
            size: 12,
            uid: 1000,
            gid: 1000,
            mtime_ns: 0,
            nlink: 1,
            ino: 5,
        };
        let e = entry_info(
            "/home/user/a.txt",
            &st,
            "user:x:1000:1000::/home/user:/bin/sh",
            "user:x:1000:",
        );
        assert_eq!(e["name"], "a.txt");
        assert_eq!(e["type"], "FILE_TYPE_FILE");
        assert_eq!(e["size"], "12");
        assert_eq!(e["mode"], 0o644);
        assert_eq!(e["owner"], "user");
        assert_eq!(e["group"], "user");
        assert_eq!(e["permissions"], "-rw-r--r--");
        assert_eq!(e["modifiedTime"], "1970-01-01T00:00:00Z");
        assert_eq!(entry_info("/", &st, "", "")["name"], "/");
    }
}
