//! This process's mappings as `/proc/self/maps` lists them: which host
//! ranges are anonymous and which map a given file (the eviction file),
//! for diff snapshots and eviction.

use super::VmError;

/// A file as `/proc/self/maps` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileId {
    pub dev: String,
    pub ino: u64,
}

/// Host address ranges `[start, end)`, sorted.
pub(crate) type Spans = Vec<(u64, u64)>;

/// Spans of this process's mappings (sorted): anonymous ones, and those
/// of the file `id`.
pub(crate) fn mapping_spans(id: Option<&FileId>) -> Result<(Spans, Spans), VmError> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|source| VmError::Io {
        what: "/proc/self/maps".into(),
        source,
    })?;
    let (mut anon, mut file) = (Vec::new(), Vec::new());
    for l in maps.lines() {
        let mut f = l.split_whitespace();
        let Some((s, e)) = f.next().and_then(|r| r.split_once('-')) else {
            continue;
        };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else {
            continue;
        };
        let (Some(dev), Some(ino)) = (f.nth(2), f.next()) else {
            continue;
        };
        if ino == "0" && f.next().is_none_or(|p| p.starts_with("[anon")) {
            anon.push((s, e));
        } else if id.is_some_and(|id| id.dev == dev && id.ino.to_string() == ino) {
            file.push((s, e));
        }
    }
    anon.sort_unstable();
    file.sort_unstable();
    Ok((anon, file))
}

/// Whether host address `a` lies in one of the sorted `spans`.
pub(crate) fn in_spans(spans: &[(u64, u64)], a: u64) -> bool {
    let i = spans.partition_point(|&(s, _)| s <= a);
    i > 0 && a < spans[i - 1].1
}
