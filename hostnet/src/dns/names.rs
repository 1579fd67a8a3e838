//! Domain names as the egress policy names them, and the matching every
//! [`SlotView::name_allowed`](super::SlotView::name_allowed) must do.
//!
//! A pattern is `d` (exactly the name `d`) or `*.d` (any name strictly
//! below `d`, never `d` itself). Names and patterns compare
//! case-insensitively (ASCII) and a trailing dot is ignored. A name is
//! allowed when some allow pattern matches it and no deny pattern does:
//! deny wins. [`NameRules`] is that rule set; a policy may hold its own
//! representation as long as it answers the same.

use hickory_proto::rr::Name;

/// The longest name in presentation form, without the trailing dot (RFC 1035).
pub const MAX_NAME_LEN: usize = 253;

/// A pattern that does not name a domain.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    /// Empty, too long, an empty label, or a character outside letters,
    /// digits, `-` and `_`; or a `*` anywhere but a leading `*.`.
    #[error("'{0}' is not a domain name or '*.' followed by one")]
    Invalid(String),
}

/// One allow or deny pattern: `d` or `*.d`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamePattern {
    /// Exactly this name (lower case, no trailing dot).
    Exact(String),
    /// Any name strictly below this one (lower case, no trailing dot).
    Below(String),
}

impl NamePattern {
    /// Parses `d` or `*.d` (case and a trailing dot ignored).
    pub fn parse(s: &str) -> Result<NamePattern, NameError> {
        let invalid = || NameError::Invalid(s.to_string());
        match s.strip_prefix("*.") {
            Some(rest) => normal_name(rest)
                .map(NamePattern::Below)
                .ok_or_else(invalid),
            None => normal_name(s).map(NamePattern::Exact).ok_or_else(invalid),
        }
    }

    /// Whether `name` (already in [`normal_name`] form) matches.
    fn matches_normal(&self, name: &str) -> bool {
        match self {
            NamePattern::Exact(d) => name == d,
            NamePattern::Below(d) => name
                .strip_suffix(d.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }
}

/// Allow and deny patterns: a name is allowed when an allow pattern
/// matches it and no deny pattern does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameRules {
    allow: Vec<NamePattern>,
    deny: Vec<NamePattern>,
}

impl NameRules {
    /// Rules from the patterns' text (see [`NamePattern::parse`]).
    pub fn parse<'a>(
        allow: impl IntoIterator<Item = &'a str>,
        deny: impl IntoIterator<Item = &'a str>,
    ) -> Result<NameRules, NameError> {
        Ok(NameRules {
            allow: allow
                .into_iter()
                .map(NamePattern::parse)
                .collect::<Result<_, _>>()?,
            deny: deny
                .into_iter()
                .map(NamePattern::parse)
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether `name` is allowed (case-insensitive, a trailing dot
    /// ignored; a string that is not a domain name never is).
    pub fn allows(&self, name: &str) -> bool {
        let Some(name) = normal_name(name) else {
            return false;
        };
        self.allow.iter().any(|p| p.matches_normal(&name))
            && !self.deny.iter().any(|p| p.matches_normal(&name))
    }
}

/// `s` in lower case without its trailing dot, if it is a domain name:
/// 1 to [`MAX_NAME_LEN`] characters, labels of 1 to 63 letters, digits,
/// `-` or `_` (service labels such as `_https`).
pub fn normal_name(s: &str) -> Option<String> {
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.is_empty() || s.len() > MAX_NAME_LEN {
        return None;
    }
    s.split('.')
        .all(|l| (1..=63).contains(&l.len()) && l.bytes().all(is_name_byte))
        .then(|| s.to_ascii_lowercase())
}

/// The policy's form of a name from a DNS message: lower case, no
/// trailing dot; `None` when a label holds a byte a host name cannot (a
/// dot, a space, a control or non-ASCII byte, `*`) or it is the root.
pub(crate) fn wire_name(name: &Name) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    for label in name.iter() {
        if label.is_empty() || !label.iter().copied().all(is_name_byte) {
            return None;
        }
        if !out.is_empty() {
            out.push('.');
        }
        // Checked above: every byte is ASCII.
        out.extend(label.iter().map(|b| char::from(b.to_ascii_lowercase())));
    }
    (!out.is_empty() && out.len() <= MAX_NAME_LEN).then_some(out)
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> NameRules {
        NameRules::parse(allow.iter().copied(), deny.iter().copied()).unwrap()
    }

    #[test]
    fn exact_matches_only_itself() {
        let r = rules(&["pypi.example.test"], &[]);
        assert!(r.allows("pypi.example.test"));
        assert!(r.allows("PyPI.Example.TEST."));
        assert!(!r.allows("files.pypi.example.test"));
        assert!(!r.allows("example.test"));
        assert!(!r.allows("xpypi.example.test"));
    }

    #[test]
    fn wildcard_matches_strictly_below() {
        let r = rules(&["*.cdn.example.test"], &[]);
        assert!(r.allows("a.cdn.example.test"));
        assert!(r.allows("b.a.CDN.example.test."));
        assert!(!r.allows("cdn.example.test"));
        assert!(!r.allows("xcdn.example.test"));
        assert!(!r.allows(".cdn.example.test"));
    }

    #[test]
    fn deny_wins() {
        let r = rules(
            &["*.example.test", "example.test"],
            &["secret.example.test", "*.internal.example.test"],
        );
        assert!(r.allows("example.test"));
        assert!(r.allows("www.example.test"));
        assert!(!r.allows("SECRET.example.test"));
        assert!(r.allows("internal.example.test"));
        assert!(!r.allows("db.internal.example.test"));
    }

    #[test]
    fn not_names_are_refused() {
        for bad in [
            "",
            ".",
            "*",
            "*.",
            "a..b",
            "a b",
            "a*.b",
            "*.*.b",
            "-\u{e9}.b",
        ] {
            assert!(NamePattern::parse(bad).is_err(), "{bad:?}");
        }
        assert!(NamePattern::parse(&"a".repeat(64)).is_err());
        assert!(NamePattern::parse(&["a"; 128].join(".")).is_err());
        let r = rules(&["*.example.test"], &[]);
        assert!(!r.allows("a b.example.test"));
        assert!(!r.allows("*.example.test"));
        assert!(!r.allows(""));
    }

    #[test]
    fn wire_names_are_checked_and_lowered() {
        let n = Name::from_ascii("PyPI.Example.test.").unwrap();
        assert_eq!(wire_name(&n).as_deref(), Some("pypi.example.test"));
        assert_eq!(wire_name(&Name::root()), None);
        let dotted = Name::from_labels([&b"a.b"[..], b"test"]).unwrap();
        assert_eq!(wire_name(&dotted), None);
        let binary = Name::from_labels([&b"a\0"[..], b"test"]).unwrap();
        assert_eq!(wire_name(&binary), None);
        let star = Name::from_ascii("*.example.test.").unwrap();
        assert_eq!(wire_name(&star), None);
    }
}
