//! Who is calling: every request carries a [`Principal`], the Unix socket
//! peer's uid (`SO_PEERCRED`, taken when the connection is accepted) or,
//! on TCP, the name of the bearer token it sent ([`Tokens`]). Templates
//! record their maker as owner; only the owner or an admin
//! ([`Principal::is_admin`]) may delete one or change its pool.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;
/// Largest token file read (a few thousand tenants).
const MAX_TOKEN_FILE: u64 = 1 << 20;
/// The name of the token of a one-token file (an admin: the one tenant
/// such a daemon has is its operator).
pub const DEFAULT_TOKEN: &str = "default";
/// A token with this name is an admin.
pub const ADMIN_TOKEN: &str = "admin";

/// The caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A Unix socket peer, by uid.
    Uid(u32),
    /// A TCP caller, by the name of its token.
    Token(String),
    /// The daemon itself (templates of `{"image": ...}` creates).
    Daemon,
}

impl Principal {
    /// As stored (`uid:N`, `token:NAME`, `daemon`).
    pub fn id(&self) -> String {
        match self {
            Principal::Uid(u) => format!("uid:{u}"),
            Principal::Token(n) => format!("token:{n}"),
            Principal::Daemon => "daemon".into(),
        }
    }

    /// May act on anything: root or the daemon's own user on the Unix
    /// socket (the daemon's files are theirs anyway), the `admin` token,
    /// the token of a one-token file, the daemon itself.
    pub fn is_admin(&self) -> bool {
        match self {
            // SAFETY: geteuid has no preconditions and cannot fail.
            Principal::Uid(u) => *u == 0 || *u == unsafe { libc::geteuid() },
            Principal::Token(n) => n == ADMIN_TOKEN || n == DEFAULT_TOKEN,
            Principal::Daemon => true,
        }
    }

    /// Whether this caller may change or delete what `owner` made
    /// (`None`: made before owners were recorded; admins only).
    pub fn may_change(&self, owner: Option<&str>) -> bool {
        self.is_admin() || owner == Some(self.id().as_str())
    }
}

/// Why a token file is refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// It cannot be read.
    #[error("cannot read the token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Others may read or write it.
    #[error(
        "the token file {path} has mode {mode:04o}: group and others must have no access \
         (chmod 600 {path})"
    )]
    Mode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Someone else owns it.
    #[error(
        "the token file {path} is owned by uid {owner}, not by the daemon's user (uid {me}): \
         chown it to the daemon's user"
    )]
    Owner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The daemon's euid.
        me: u32,
    },
    /// Its content is not tokens.
    #[error("the token file {path}, line {line}: {why}")]
    Format {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        why: String,
    },
}

/// The bearer tokens TCP callers may send, each with its name, and
/// whether SandboxFusion's routes ([`crate::fusion`]) need one.
#[derive(Clone)]
pub struct Tokens {
    tokens: Vec<(String, String)>,
    open_fusion: bool,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.tokens.iter().map(|(n, _)| n.as_str()).collect();
        write!(f, "Tokens({names:?})")?;
        if self.open_fusion {
            write!(f, " (/run_code open)")?;
        }
        Ok(())
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

impl Tokens {
    /// One token, named [`DEFAULT_TOKEN`].
    pub fn single(token: impl Into<String>) -> Tokens {
        Tokens::named([(DEFAULT_TOKEN.into(), token.into())])
    }

    /// Named tokens.
    pub fn named(tokens: impl IntoIterator<Item = (String, String)>) -> Tokens {
        Tokens {
            tokens: tokens.into_iter().collect(),
            open_fusion: false,
        }
    }

    /// Lets TCP callers use SandboxFusion's routes (`/run_code`,
    /// `/v1/ping`) without a token (`shoald --run-code-without-token`).
    pub fn with_open_fusion(mut self, open: bool) -> Tokens {
        self.open_fusion = open;
        self
    }

    /// Whether SandboxFusion's routes need no token.
    pub fn open_fusion(&self) -> bool {
        self.open_fusion
    }

    /// Reads a token file: owned by the daemon's user and inaccessible to
    /// group and others; either one line holding the token (named
    /// [`DEFAULT_TOKEN`]), or `NAME:TOKEN` lines (blank lines and `#`
    /// comments skipped), each token at least [`MIN_TOKEN_LEN`] characters.
    pub fn load(path: &Path) -> Result<Tokens, TokenError> {
        let read = |source| TokenError::Read {
            path: path.into(),
            source,
        };
        let mut f = std::fs::File::open(path).map_err(read)?;
        // The opened file's, not the path's (no swap between check and read).
        let m = f.metadata().map_err(read)?;
        if !m.is_file() {
            return Err(read(std::io::Error::other("not a regular file")));
        }
        let mode = m.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(TokenError::Mode {
                path: path.into(),
                mode,
            });
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if m.uid() != me {
            return Err(TokenError::Owner {
                path: path.into(),
                owner: m.uid(),
                me,
            });
        }
        let mut text = String::new();
        (&mut f)
            .take(MAX_TOKEN_FILE)
            .read_to_string(&mut text)
            .map_err(read)?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Tokens, TokenError> {
        let bad = |line: usize, why: String| TokenError::Format {
            path: path.into(),
            line,
            why,
        };
        let lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
            .collect();
        let short = |line| {
            bad(
                line,
                format!("the token is too short (at least {MIN_TOKEN_LEN} characters)"),
            )
        };
        match lines.as_slice() {
            [] => Err(bad(1, "no token".into())),
            [(line, t)] if !t.contains(':') => {
                if t.len() < MIN_TOKEN_LEN {
                    return Err(short(*line));
                }
                Ok(Tokens::single(*t))
            }
            many => {
                let mut out: Vec<(String, String)> = Vec::new();
                for (line, l) in many {
                    let (n, t) = l.split_once(':').ok_or_else(|| {
                        bad(*line, "expected NAME:TOKEN (one token per tenant)".into())
                    })?;
                    let (n, t) = (n.trim(), t.trim());
                    if !valid_name(n) {
                        return Err(bad(
                            *line,
                            format!("token name {n:?}: use 1-64 letters, digits, '-', '_', '.'"),
                        ));
                    }
                    if t.len() < MIN_TOKEN_LEN {
                        return Err(short(*line));
                    }
                    if out.iter().any(|(on, ot)| on == n || ot == t) {
                        return Err(bad(*line, format!("token {n:?} repeats a name or token")));
                    }
                    out.push((n.into(), t.into()));
                }
                Ok(Tokens::named(out))
            }
        }
    }

    /// The principal whose token `bearer` is (compared in constant time
    /// per token).
    pub fn principal(&self, bearer: &[u8]) -> Option<Principal> {
        let mut found = None;
        for (n, t) in &self.tokens {
            if constant_eq(bearer, t.as_bytes()) && found.is_none() {
                found = Some(Principal::Token(n.clone()));
            }
        }
        found
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn token_files_readable_by_others_or_owned_by_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tok = "0123456789abcdef-secret\n";
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            let p = file(dir.path(), "t", tok, mode);
            let e = Tokens::load(&p).unwrap_err();
            assert!(matches!(e, TokenError::Mode { .. }), "{mode:o}: {e}");
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
        let p = file(dir.path(), "t", tok, 0o600);
        let t = Tokens::load(&p).unwrap();
        assert_eq!(
            t.principal(b"0123456789abcdef-secret"),
            Some(Principal::Token(DEFAULT_TOKEN.into()))
        );
        assert_eq!(t.principal(b"0123456789abcdef-secreT"), None);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&p, Some(4242), None).unwrap();
            let e = Tokens::load(&p).unwrap_err();
            assert!(matches!(e, TokenError::Owner { owner: 4242, .. }), "{e}");
        }
        let e = Tokens::load(&dir.path().join("none")).unwrap_err();
        assert!(matches!(e, TokenError::Read { .. }), "{e}");
    }

    #[test]
    fn token_files_name_their_tenants() {
        let p = Path::new("/t");
        let t = Tokens::parse(
            p,
            "# tenants\nalice:aaaaaaaaaaaaaaaa1\n\nbob: bbbbbbbbbbbbbbbb2\nadmin:cccccccccccccccc3\n",
        )
        .unwrap();
        let alice = t.principal(b"aaaaaaaaaaaaaaaa1").unwrap();
        let bob = t.principal(b"bbbbbbbbbbbbbbbb2").unwrap();
        let admin = t.principal(b"cccccccccccccccc3").unwrap();
        assert_eq!(alice.id(), "token:alice");
        assert!(!alice.is_admin() && !bob.is_admin() && admin.is_admin());
        assert!(alice.may_change(Some("token:alice")));
        assert!(!bob.may_change(Some("token:alice")));
        assert!(!bob.may_change(None) && admin.may_change(None));
        assert!(!alice.may_change(Some("daemon")));
        assert_eq!(t.principal(b"aaaaaaaaaaaaaaaa"), None);
        for (text, want) in [
            ("", "no token"),
            ("short", "too short"),
            ("a:short", "too short"),
            ("a:aaaaaaaaaaaaaaaa\nb", "NAME:TOKEN"),
            ("a b:aaaaaaaaaaaaaaaa", "token name"),
            ("a:aaaaaaaaaaaaaaaa\na:bbbbbbbbbbbbbbbb", "repeats"),
            ("a:aaaaaaaaaaaaaaaa\nb:aaaaaaaaaaaaaaaa", "repeats"),
        ] {
            let e = Tokens::parse(p, text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        assert_eq!(Principal::Uid(0).id(), "uid:0");
        assert!(Principal::Uid(0).is_admin() && Principal::Daemon.is_admin());
    }
}
