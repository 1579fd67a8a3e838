//! `shoal create --net allow=pypi.org,10.1.2.0/24:443,deny=10.1.2.3,dns=off`:
//! a sandbox's network as one argument. Entries follow the `allow=` or
//! `deny=` before them; the daemon checks each entry's syntax.

use anyhow::{bail, Result};
use shoal_client::api::NetworkSpec;

/// Which list the entries go to.
enum List {
    None,
    Allow,
    Deny,
}

/// Parses `--net`'s value (`""`: a network that lets nothing out).
pub fn parse_net(s: &str) -> Result<NetworkSpec> {
    let mut spec = NetworkSpec {
        allow_dns: true,
        ..Default::default()
    };
    let mut list = List::None;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let entry = if let Some(v) = part.strip_prefix("allow=") {
            list = List::Allow;
            v
        } else if let Some(v) = part.strip_prefix("deny=") {
            list = List::Deny;
            v
        } else if let Some(v) = part.strip_prefix("dns=") {
            spec.allow_dns = match v {
                "on" => true,
                "off" => false,
                _ => bail!("--net: dns={v:?}: expected dns=on or dns=off"),
            };
            list = List::None;
            continue;
        } else {
            part
        };
        if entry.is_empty() {
            continue;
        }
        match list {
            List::Allow => spec.allow_out.push(entry.to_string()),
            List::Deny => spec.deny_out.push(entry.to_string()),
            List::None => bail!(
                "--net: {entry:?}: expected allow=ENTRY[,ENTRY..], deny=ENTRY[,ENTRY..] or dns=on|off"
            ),
        }
    }
    Ok(spec)
}

/// `shoal doctor`'s network section: what the host lacks for sandboxes
/// created with a network (`shoal_hostnet::probe`'s messages).
pub fn doctor_text(missing: &[String]) -> String {
    if missing.is_empty() {
        return "network: ok (sandboxes may ask for one: --net)\n".into();
    }
    let mut s = "network: unavailable; sandboxes created with --net are refused:\n".to_string();
    for m in missing {
        s.push_str(&format!("  - {m}\n"));
    }
    s
}

/// How `shoal ls/get` show a sandbox's network.
#[allow(dead_code)] // shown by `shoal get` once it exists
pub fn describe(spec: Option<&NetworkSpec>) -> String {
    let Some(n) = spec else {
        return "none".into();
    };
    let mut parts = Vec::new();
    if !n.allow_out.is_empty() {
        parts.push(format!("allow={}", n.allow_out.join(",")));
    }
    if !n.deny_out.is_empty() {
        parts.push(format!("deny={}", n.deny_out.join(",")));
    }
    if !n.allow_dns {
        parts.push("dns=off".into());
    }
    if parts.is_empty() {
        "nothing out".into()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_follow_their_key() {
        let n =
            parse_net("allow=pypi.org,10.1.2.0/24:443,deny=10.1.2.3,*.evil.com,dns=off").unwrap();
        assert_eq!(n.allow_out, ["pypi.org", "10.1.2.0/24:443"]);
        assert_eq!(n.deny_out, ["10.1.2.3", "*.evil.com"]);
        assert!(!n.allow_dns);
        assert_eq!(
            describe(Some(&n)),
            "allow=pypi.org,10.1.2.0/24:443,deny=10.1.2.3,*.evil.com,dns=off"
        );
        let n = parse_net("dns=on,allow=a.b").unwrap();
        assert_eq!(n, NetworkSpec::allowing(["a.b"]));
        assert_eq!(describe(Some(&n)), "allow=a.b");
    }

    #[test]
    fn empty_means_nothing_out() {
        let n = parse_net("").unwrap();
        assert!(n.allow_out.is_empty() && n.deny_out.is_empty() && n.allow_dns);
        assert_eq!(describe(Some(&n)), "nothing out");
        assert_eq!(describe(None), "none");
    }

    #[test]
    fn doctor_lists_what_is_missing() {
        assert!(doctor_text(&[]).starts_with("network: ok"));
        let t = doctor_text(&["the `nft` tool is missing".into()]);
        assert!(
            t.contains("unavailable") && t.contains("  - the `nft` tool is missing\n"),
            "{t}"
        );
    }

    #[test]
    fn bad_values_say_what_is_expected() {
        let e = parse_net("pypi.org").unwrap_err().to_string();
        assert!(e.contains("expected allow="), "{e}");
        let e = parse_net("allow=a,dns=maybe").unwrap_err().to_string();
        assert!(e.contains("dns=on or dns=off"), "{e}");
        let e = parse_net("dns=off,b.c").unwrap_err().to_string();
        assert!(e.contains("\"b.c\""), "{e}");
    }
}
