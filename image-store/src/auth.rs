//! Registry credentials from a Docker `config.json`
//! (`{"auths": {"HOST[:PORT]": {"auth": "base64(user:password)"}}}`, or
//! `username` and `password` instead of `auth`): sent as Basic auth to a
//! registry that answers 401 `WWW-Authenticate: Basic`, and to the token
//! endpoint a `Bearer` challenge names.
//!
//! The file is `--auth-file` (`REGISTRY_AUTH_FILE`, as skopeo and podman
//! take it) when given, which must then exist; else
//! `$DOCKER_CONFIG/config.json` or `~/.docker/config.json` when there.
//! Credential helpers (`credsStore`, `credHelpers`) are not run.

use base64::Engine;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most bytes of a credentials file read.
const FILE_CAP: u64 = 1 << 20;

/// A credentials file that cannot be read or does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {why}")]
pub struct AuthFileError {
    /// `registry credentials file PATH`.
    pub what: String,
    /// What is wrong.
    pub why: String,
}

fn malformed(what: &str, why: impl std::fmt::Display) -> AuthFileError {
    AuthFileError {
        what: what.to_string(),
        why: why.to_string(),
    }
}

/// Credentials by registry host (`host[:port]`), base64 `user:password`.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// The file they came from (for error messages).
    pub file: Option<PathBuf>,
    auths: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

/// The credentials file read when none is named:
/// `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`.
pub fn default_auth_file() -> Option<PathBuf> {
    default_from(std::env::var_os("DOCKER_CONFIG"), std::env::var_os("HOME"))
}

fn default_from(
    docker_config: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    if let Some(d) = docker_config.filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("config.json"));
    }
    home.filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// `host[:port]` of a config.json key (`https://host/v1/` → `host`);
/// Docker Hub's names all become `docker.io`.
fn host_key(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let k = k.split('/').next().unwrap_or(k).to_ascii_lowercase();
    match k.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_string()
        }
        _ => k,
    }
}

impl Credentials {
    /// Reads `file`, which must exist, or the default file when `None`
    /// (none there: no credentials).
    pub fn load(file: Option<&Path>) -> Result<Credentials, AuthFileError> {
        let (path, must) = match file {
            Some(f) => (f.to_path_buf(), true),
            None => match default_auth_file() {
                Some(f) => (f, false),
                None => return Ok(Credentials::default()),
            },
        };
        let what = format!("registry credentials file {}", path.display());
        let body = match std::fs::File::open(&path) {
            Ok(f) => {
                use std::io::Read;
                let mut b = Vec::new();
                f.take(FILE_CAP + 1)
                    .read_to_end(&mut b)
                    .map_err(|e| malformed(&what, e))?;
                if b.len() as u64 > FILE_CAP {
                    return Err(malformed(&what, format!("larger than {FILE_CAP} bytes")));
                }
                b
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must => {
                return Ok(Credentials::default())
            }
            Err(e) => return Err(malformed(&what, e)),
        };
        Credentials::parse(&body, &path)
    }

    /// Parses a config.json's bytes (`path` names it in errors).
    pub fn parse(body: &[u8], path: &Path) -> Result<Credentials, AuthFileError> {
        let what = format!("registry credentials file {}", path.display());
        let cfg: ConfigFile = serde_json::from_slice(body).map_err(|e| malformed(&what, e))?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut auths = BTreeMap::new();
        for (key, e) in cfg.auths {
            let auth = match (e.auth.filter(|a| !a.is_empty()), e.username, e.password) {
                (Some(a), _, _) => {
                    let plain = b64.decode(a.trim()).map_err(|err| {
                        malformed(&what, format!("{key}: auth is not base64: {err}"))
                    })?;
                    if !plain.contains(&b':') {
                        return Err(malformed(
                            &what,
                            format!("{key}: auth is not base64 of user:password"),
                        ));
                    }
                    b64.encode(plain)
                }
                (None, Some(u), Some(p)) => b64.encode(format!("{u}:{p}")),
                // An entry a credential helper fills in: nothing here.
                _ => continue,
            };
            auths.insert(host_key(&key), auth);
        }
        Ok(Credentials {
            file: Some(path.to_path_buf()),
            auths,
        })
    }

    /// The base64 `user:password` for a registry (`host[:port]`).
    pub fn for_host(&self, registry: &str) -> Option<&str> {
        self.auths.get(&host_key(registry)).map(String::as_str)
    }

    /// Where credentials for `registry` would come from, for an error.
    pub fn hint(&self, registry: &str) -> String {
        match &self.file {
            Some(f) if self.for_host(registry).is_some() => {
                format!(
                    "the credentials for {registry} in {} were refused",
                    f.display()
                )
            }
            Some(f) => format!("{} has no credentials for {registry}", f.display()),
            None => format!(
                "no credentials file (--auth-file, REGISTRY_AUTH_FILE, $DOCKER_CONFIG/config.json \
                 or ~/.docker/config.json) for {registry}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_json_entries_are_found_by_host() {
        let body = br#"{"auths": {
            "127.0.0.1:5000": {"auth": "dXNlcjpwYXNz"},
            "https://index.docker.io/v1/": {"username": "u", "password": "p"},
            "helper.example": {}
        }, "credsStore": "desktop"}"#;
        let c = Credentials::parse(body, Path::new("/x/config.json")).unwrap();
        assert_eq!(c.for_host("127.0.0.1:5000"), Some("dXNlcjpwYXNz"));
        assert_eq!(c.for_host("docker.io"), Some("dTpw"));
        assert_eq!(c.for_host("registry-1.docker.io"), Some("dTpw"));
        assert_eq!(c.for_host("helper.example"), None);
        assert_eq!(c.for_host("127.0.0.1:5001"), None);
        assert!(c.hint("127.0.0.1:5001").contains("has no credentials"));
        let e =
            Credentials::parse(br#"{"auths":{"h":{"auth":"!!"}}}"#, Path::new("/c")).unwrap_err();
        assert!(e.to_string().contains("not base64"), "{e}");
        let e = Credentials::parse(br#"{"auths":{"h":{"auth":"dXNlcg=="}}}"#, Path::new("/c"))
            .unwrap_err();
        assert!(e.to_string().contains("user:password"), "{e}");
        let e = Credentials::load(Some(Path::new("/nonexistent/config.json"))).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/config.json"), "{e}");
        // The default: $DOCKER_CONFIG/config.json, else ~/.docker/config.json.
        assert_eq!(
            default_from(Some("/d".into()), Some("/h".into())),
            Some(PathBuf::from("/d/config.json"))
        );
        assert_eq!(
            default_from(Some("".into()), Some("/h".into())),
            Some(PathBuf::from("/h/.docker/config.json"))
        );
        assert_eq!(default_from(None, None), None);
    }
}
