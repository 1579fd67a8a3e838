//! Image references as `docker pull` takes them:
//! `[registry[:port]/]repository[:tag|@sha256:...]`.

/// A parsed reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The registry as written (`docker.io` when none was).
    pub registry: String,
    /// The repository (`library/` added for docker.io's one-part names).
    pub repository: String,
    /// The tag, or the digest (`sha256:...`).
    pub tag_or_digest: String,
}

/// A reference that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("image reference {reference:?}: {why}")]
pub struct BadReference {
    /// As given.
    pub reference: String,
    /// What is wrong.
    pub why: &'static str,
}

impl Reference {
    /// Parses `s`.
    pub fn parse(s: &str) -> Result<Reference, BadReference> {
        let bad = |why| BadReference {
            reference: s.to_string(),
            why,
        };
        if s.is_empty() || s.len() > 512 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("empty, too long or with spaces"));
        }
        let (name, tag_or_digest) = if let Some((n, d)) = s.split_once('@') {
            crate::digest_hex(d).map_err(|_| bad("a digest must be sha256: and 64 hex digits"))?;
            (n, d.to_string())
        } else {
            match s.rsplit_once(':') {
                Some((n, t)) if !t.contains('/') => (n, t.to_string()),
                _ => (s, "latest".to_string()),
            }
        };
        let (registry, repo) = match name.split_once('/') {
            Some((r, rest)) if r.contains('.') || r.contains(':') || r == "localhost" => {
                (r.to_string(), rest.to_string())
            }
            _ => ("docker.io".to_string(), name.to_string()),
        };
        let repository = if registry == "docker.io" && !repo.contains('/') {
            format!("library/{repo}")
        } else {
            repo
        };
        let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c);
        if repository.is_empty()
            || !repository.chars().all(ok)
            || repository.split('/').any(str::is_empty)
        {
            return Err(bad("the repository must be lowercase [a-z0-9._-] parts"));
        }
        if !tag_or_digest.starts_with("sha256:")
            && (tag_or_digest.is_empty()
                || tag_or_digest.len() > 128
                || !tag_or_digest
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)))
        {
            return Err(bad("a tag is [A-Za-z0-9._-], at most 128"));
        }
        Ok(Reference {
            registry,
            repository,
            tag_or_digest,
        })
    }

    /// The host the API is served on (`registry-1.docker.io` for
    /// docker.io).
    pub fn api_host(&self) -> &str {
        if self.registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            &self.registry
        }
    }

    /// Whether the registry is on loopback (plain http allowed).
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => &self.registry,
        };
        host == "localhost" || host == "[::1]" || host.starts_with("127.")
    }

    /// The canonical form (`registry/repository:tag` or `@digest`).
    pub fn canonical(&self) -> String {
        let sep = if self.tag_or_digest.starts_with("sha256:") {
            '@'
        } else {
            ':'
        };
        format!(
            "{}/{}{sep}{}",
            self.registry, self.repository, self.tag_or_digest
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_pull_forms() {
        let r = Reference::parse("python:3.12-slim").unwrap();
        assert_eq!(r.canonical(), "docker.io/library/python:3.12-slim");
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert!(!r.is_loopback());
        let r = Reference::parse("127.0.0.1:5000/test/app").unwrap();
        assert_eq!(r.canonical(), "127.0.0.1:5000/test/app:latest");
        assert!(r.is_loopback());
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("ghcr.io/o/r@{d}")).unwrap();
        assert_eq!(
            (r.registry.as_str(), r.tag_or_digest.as_str()),
            ("ghcr.io", d.as_str())
        );
        assert!(Reference::parse("Upper/Case").is_err());
        assert!(Reference::parse("a@sha256:short").is_err());
        assert!(Reference::parse("").is_err());
    }
}
