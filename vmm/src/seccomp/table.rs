//! A role's allow-list while it is declared: syscalls, each allowed
//! always or only when its arguments match one of its rules.

use super::SeccompError;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// A system call: its number and name.
#[derive(Debug, Clone, Copy)]
pub struct Sys(pub i64, pub &'static str);

/// `sys!(SYS_read)` is [`Sys`] for `read`.
macro_rules! sys {
    ($name:ident) => {
        $crate::seccomp::table::Sys(libc::$name, stringify!($name))
    };
}
pub(crate) use sys;

/// The allow-list of one role.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// `None`: allowed with any arguments; `Some(rules)`: allowed when one
    /// of the rules matches.
    calls: BTreeMap<i64, (&'static str, Option<Vec<SeccompRule>>)>,
}

impl Table {
    /// Allows `s` with any arguments.
    pub fn allow(&mut self, s: Sys) -> &mut Self {
        self.calls.insert(s.0, (s.1, None));
        self
    }

    /// Allows each of `calls` with any arguments.
    pub fn allow_all(&mut self, calls: &[Sys]) -> &mut Self {
        for s in calls {
            self.allow(*s);
        }
        self
    }

    /// Allows `s` when one of `rules` matches (adding to rules it has).
    pub fn allow_when(&mut self, s: Sys, rules: Vec<SeccompRule>) -> &mut Self {
        let e = self.calls.entry(s.0).or_insert((s.1, Some(Vec::new())));
        if let Some(have) = &mut e.1 {
            have.extend(rules);
        }
        self
    }

    /// Adds everything `other` allows.
    pub fn merge(&mut self, other: &Table) -> &mut Self {
        for (nr, (name, rules)) in &other.calls {
            match rules {
                None => {
                    self.calls.insert(*nr, (name, None));
                }
                Some(r) => {
                    self.allow_when(Sys(*nr, name), r.clone());
                }
            }
        }
        self
    }

    /// Names of the allowed syscalls, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self
            .calls
            .values()
            .map(|(n, _)| n.trim_start_matches("SYS_"))
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether syscall `nr` is allowed (with some arguments).
    #[cfg(test)]
    pub fn allows(&self, nr: i64) -> bool {
        self.calls.contains_key(&nr)
    }

    /// The BPF program: allowed calls pass, everything else gets `action`.
    pub fn compile(&self, action: SeccompAction) -> Result<BpfProgram, SeccompError> {
        let rules = self
            .calls
            .iter()
            .map(|(nr, (_, r))| (*nr, r.clone().unwrap_or_default()))
            .collect();
        let f = SeccompFilter::new(rules, action, SeccompAction::Allow, TargetArch::x86_64)
            .map_err(SeccompError::Build)?;
        BpfProgram::try_from(f).map_err(SeccompError::Build)
    }
}

/// One condition on argument `arg` (a 32-bit value: ints, flags, ioctl
/// numbers).
fn cond(arg: u8, op: SeccompCmpOp, v: u64) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, v).map_err(SeccompError::Build)
}

/// A rule: all of `conds` hold.
fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conds).map_err(SeccompError::Build)
}

/// Rules: argument `arg` equals one of `values`.
pub fn arg_in(arg: u8, values: &[u64]) -> Result<Vec<SeccompRule>, SeccompError> {
    values
        .iter()
        .map(|v| rule(vec![cond(arg, SeccompCmpOp::Eq, *v)?]))
        .collect()
}

/// Rules: argument `arg` masked with `mask` equals one of `values`.
pub fn arg_masked_in(arg: u8, mask: u64, values: &[u64]) -> Result<Vec<SeccompRule>, SeccompError> {
    values
        .iter()
        .map(|v| rule(vec![cond(arg, SeccompCmpOp::MaskedEq(mask), *v)?]))
        .collect()
}

/// Rules: argument `a` equals `va` and argument `b` equals `vb`.
pub fn args_eq(a: u8, va: u64, b: u8, vb: u64) -> Result<Vec<SeccompRule>, SeccompError> {
    Ok(vec![rule(vec![
        cond(a, SeccompCmpOp::Eq, va)?,
        cond(b, SeccompCmpOp::Eq, vb)?,
    ])?])
}

/// A non-negative C `int` constant as a filter value (a negative one,
/// which no constant here is, becomes a value no argument matches).
pub fn int(v: libc::c_int) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}
