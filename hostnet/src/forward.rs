//! Other tables' forward chains that drop by default (Docker's and many
//! firewalls' `ip filter FORWARD`, policy drop). nftables drops a packet
//! any base chain drops, whatever the shared `inet shoal` table accepts,
//! so [`crate::HostNet::setup`] inserts two accepts for slot traffic at
//! the top of each such chain (`iifname "shv*"`; `oifname "shv*"` on
//! conntrack state), marked with [`RULE_COMMENT`], and
//! [`crate::HostNet::teardown`] removes them by that mark. IPv4 families
//! (`ip`, `inet`) only: slots are IPv4 only.

use std::time::Duration;

use crate::cmd::{self, CmdError};
use crate::nft::{HOST_LINK_PREFIX, HOST_TABLE};

/// The comment that marks the rules this crate inserts.
pub const RULE_COMMENT: &str = "shoal slots";

/// A forward chain or its rules could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// An `nft` command failed.
    #[error(transparent)]
    Cmd(#[from] CmdError),
    /// `nft -j` printed something else than its JSON.
    #[error("cannot read `nft -j` output: {0}")]
    Json(#[from] serde_json::Error),
}

/// A base chain: family, table, name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// `ip` or `inet`.
    pub family: String,
    /// Its table.
    pub table: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.family, self.table, self.name)
    }
}

fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The IPv4 forward-hook chains with policy drop of `nft -j list chains`
/// (other than the shared table's; names this crate can quote safely).
pub fn dropping_chains(json: &str) -> Result<Vec<Chain>, serde_json::Error> {
    let v: serde_json::Value = serde_json::from_str(json)?;
    let mut out = Vec::new();
    for item in v["nftables"].as_array().into_iter().flatten() {
        let c = &item["chain"];
        let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
        let chain = Chain {
            family: s("family"),
            table: s("table"),
            name: s("name"),
        };
        if c["hook"] == "forward"
            && c["policy"] == "drop"
            && matches!(chain.family.as_str(), "ip" | "inet")
            && chain.table != HOST_TABLE
            && plain_name(&chain.table)
            && plain_name(&chain.name)
        {
            out.push(chain);
        }
    }
    Ok(out)
}

/// The handles of this crate's rules in `nft -j list chain ...`.
pub fn our_rules(json: &str) -> Result<Vec<u64>, serde_json::Error> {
    let v: serde_json::Value = serde_json::from_str(json)?;
    Ok(v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("rule"))
        .filter(|r| r["comment"] == RULE_COMMENT)
        .filter_map(|r| r["handle"].as_u64())
        .collect())
}

/// The script that opens `c` to slot traffic (inserted at the top).
pub fn render_open(c: &Chain) -> String {
    let l = format!("\"{HOST_LINK_PREFIX}*\"");
    let at = format!("insert rule {} {} {}", c.family, c.table, c.name);
    format!(
        "{at} oifname {l} ct state established,related accept comment \"{RULE_COMMENT}\"\n\
         {at} iifname {l} accept comment \"{RULE_COMMENT}\"\n"
    )
}

fn list_chain(c: &Chain, t: Duration) -> Result<Vec<u64>, ForwardError> {
    let args = ["-j", "list", "chain", &c.family, &c.table, &c.name];
    Ok(our_rules(&cmd::run("nft", &args, None, t)?)?)
}

/// The dropping forward chains that do not have this crate's rules yet.
pub fn closed_chains(t: Duration) -> Result<Vec<Chain>, ForwardError> {
    let all = dropping_chains(&cmd::run("nft", &["-j", "list", "chains"], None, t)?)?;
    let mut closed = Vec::new();
    for c in all {
        if list_chain(&c, t)?.is_empty() {
            closed.push(c);
        }
    }
    Ok(closed)
}

/// Opens every dropping forward chain without this crate's rules; returns
/// the ones it changed.
pub fn open_all(t: Duration) -> Result<Vec<Chain>, ForwardError> {
    let closed = closed_chains(t)?;
    for c in &closed {
        cmd::run("nft", &["-f", "-"], Some(&render_open(c)), t)?;
    }
    Ok(closed)
}

/// Removes this crate's rules from every forward chain that drops.
pub fn close_all(t: Duration) -> Result<(), ForwardError> {
    let all = dropping_chains(&cmd::run("nft", &["-j", "list", "chains"], None, t)?)?;
    for c in all {
        for h in list_chain(&c, t)? {
            let h = h.to_string();
            let args = ["delete", "rule", &c.family, &c.table, &c.name, "handle", &h];
            cmd::run("nft", &args, None, t)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_chains_and_our_rules_are_found() {
        let chains = r#"{"nftables": [{"metainfo": {}},
          {"chain": {"family": "ip", "table": "filter", "name": "FORWARD", "hook": "forward", "policy": "drop", "type": "filter"}},
          {"chain": {"family": "ip", "table": "filter", "name": "INPUT", "hook": "input", "policy": "drop"}},
          {"chain": {"family": "inet", "table": "fw", "name": "fwd", "hook": "forward", "policy": "accept"}},
          {"chain": {"family": "ip6", "table": "filter", "name": "FORWARD", "hook": "forward", "policy": "drop"}},
          {"chain": {"family": "inet", "table": "shoal", "name": "forward", "hook": "forward", "policy": "drop"}},
          {"chain": {"family": "inet", "table": "x y", "name": "f", "hook": "forward", "policy": "drop"}},
          {"chain": {"family": "ip", "table": "filter", "name": "DOCKER"}}]}"#;
        let c = dropping_chains(chains).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].to_string(), "ip filter FORWARD");
        let rules = r#"{"nftables": [{"chain": {}},
          {"rule": {"handle": 7, "comment": "shoal slots"}},
          {"rule": {"handle": 8}},
          {"rule": {"handle": 9, "comment": "shoal slots"}}]}"#;
        assert_eq!(our_rules(rules).unwrap(), vec![7, 9]);
        assert_eq!(
            render_open(&c[0]),
            "insert rule ip filter FORWARD oifname \"shv*\" ct state established,related accept comment \"shoal slots\"\n\
             insert rule ip filter FORWARD iifname \"shv*\" accept comment \"shoal slots\"\n"
        );
    }
}
