//! Users in the guest: who a request runs as (`Authorization: Basic
//! base64("user:")` on RPCs, `?username=` on `/files`), looked up in the
//! guest's own `/etc/passwd`, and paths relative to that user's home.

use super::connect::{Code, RpcError};
use axum::http::HeaderMap;
use base64::Engine;

/// The user the SDK runs as when it names none (E2B's default user); a
/// guest without that account runs the request as root.
pub const DEFAULT_USER: &str = "user";

/// A user of the guest, from its `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestUser {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory.
    pub home: String,
}

impl GuestUser {
    /// root, as every guest has it.
    pub fn root() -> GuestUser {
        GuestUser {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
        }
    }

    /// The environment a login of this user has (`HOME`, `USER`,
    /// `LOGNAME`).
    pub fn env(&self) -> [(&'static str, String); 3] {
        [
            ("HOME", self.home.clone()),
            ("USER", self.name.clone()),
            ("LOGNAME", self.name.clone()),
        ]
    }
}

/// The user named in `Authorization: Basic base64("NAME:")`, if any.
pub fn basic_user(h: &HeaderMap) -> Result<Option<String>, RpcError> {
    let Some(v) = h.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = || RpcError::new(Code::Unauthenticated, "invalid Authorization header");
    let v = v.to_str().map_err(|_| bad())?;
    let Some(b64) = v.strip_prefix("Basic ") else {
        return Err(bad());
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| bad())?;
    let s = String::from_utf8(raw).map_err(|_| bad())?;
    let name = s.split(':').next().unwrap_or_default();
    Ok((!name.is_empty()).then(|| name.to_string()))
}

/// Whether `name` can be a user name (what passwd lines can hold).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$'))
}

/// User `name` in passwd text `passwd`.
pub fn lookup(passwd: &str, name: &str) -> Option<GuestUser> {
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 7 || f[0] != name {
            return None;
        }
        Some(GuestUser {
            name: name.to_string(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: if f[5].starts_with('/') {
                f[5].to_string()
            } else {
                "/".to_string()
            },
        })
    })
}

/// The name of id `id` in passwd or group text (`name:x:id:...`).
pub fn name_of(db: &str, id: u32) -> Option<String> {
    db.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let _ = f.next()?;
        (f.next()?.parse::<u32>().ok()? == id).then(|| name.to_string())
    })
}

/// The user a request runs as: `asked`, else [`DEFAULT_USER`] where the
/// guest has it, else root. An asked-for user the guest lacks is an
/// error (as envd answers it).
pub fn resolve(passwd: &str, asked: Option<&str>) -> Result<GuestUser, RpcError> {
    match asked {
        Some(n) => {
            if !valid_name(n) {
                return Err(RpcError::new(
                    Code::InvalidArgument,
                    format!("invalid user name {n:?}"),
                ));
            }
            if n == "root" {
                return Ok(lookup(passwd, "root").unwrap_or_else(GuestUser::root));
            }
            lookup(passwd, n).ok_or_else(|| {
                RpcError::new(
                    Code::Unauthenticated,
                    format!("error looking up user '{n}': unknown user"),
                )
            })
        }
        None => Ok(lookup(passwd, DEFAULT_USER)
            .or_else(|| lookup(passwd, "root"))
            .unwrap_or_else(GuestUser::root)),
    }
}

/// `path` made absolute for `user`: `~` and `~/x` and relative paths are
/// in the user's home. Empty paths, NUL bytes and over-long ones are
/// refused.
pub fn absolute(path: &str, user: &GuestUser) -> Result<String, RpcError> {
    if path.is_empty() {
        return Err(RpcError::invalid("empty path"));
    }
    if path.contains('\0') || path.len() > 4096 {
        return Err(RpcError::invalid(format!("invalid path {path:?}")));
    }
    let home = user.home.trim_end_matches('/');
    let p = if path == "~" {
        user.home.clone()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    };
    Ok(normalize(&p))
}

/// Removes `.`, `..` and repeated slashes from an absolute path.
pub fn normalize(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
                          daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
                          user:x:1000:1000::/home/user:/bin/bash\n\
                          broken:x:zz:1::/x:/bin/sh\n";

    #[test]
    fn users_are_looked_up_by_name_and_default_to_user_then_root() {
        let u = resolve(PASSWD, None).unwrap();
        assert_eq!((u.uid, u.gid, u.home.as_str()), (1000, 1000, "/home/user"));
        assert_eq!(resolve(PASSWD, Some("root")).unwrap().uid, 0);
        assert_eq!(resolve("root:x:0:0::/root:/bin/sh\n", None).unwrap().uid, 0);
        assert_eq!(resolve("", None).unwrap(), GuestUser::root());
        assert_eq!(resolve("", Some("root")).unwrap(), GuestUser::root());
        let e = resolve(PASSWD, Some("nobody")).unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated);
        assert!(resolve(PASSWD, Some("broken")).is_err());
        assert_eq!(
            resolve(PASSWD, Some("a:b")).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn ids_have_names() {
        assert_eq!(name_of(PASSWD, 1000).as_deref(), Some("user"));
        assert_eq!(name_of(PASSWD, 0).as_deref(), Some("root"));
        assert_eq!(name_of(PASSWD, 7), None);
    }

    #[test]
    fn basic_auth_names_the_user() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h).unwrap(), None);
        // base64("root:")
        h.insert("authorization", "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(basic_user(&h).unwrap().as_deref(), Some("root"));
        h.insert("authorization", "Bearer x".parse().unwrap());
        assert!(basic_user(&h).is_err());
        h.insert("authorization", "Basic !!!".parse().unwrap());
        assert!(basic_user(&h).is_err());
    }

    #[test]
    fn relative_paths_are_in_the_home() {
        let u = lookup(PASSWD, "user").unwrap();
        assert_eq!(absolute("a.txt", &u).unwrap(), "/home/user/a.txt");
        assert_eq!(absolute("~/d/../b", &u).unwrap(), "/home/user/b");
        assert_eq!(absolute("~", &u).unwrap(), "/home/user");
        assert_eq!(absolute("/tmp//x/./y", &u).unwrap(), "/tmp/x/y");
        assert_eq!(absolute("/../..", &u).unwrap(), "/");
        assert!(absolute("", &u).is_err());
        assert!(absolute("a\0b", &u).is_err());
    }
}
