//! Giving guest pages back to the host: the [`GiveBack`] seam the VMM
//! implements, and [`MappedRegions`], an implementation for guest memory
//! whose regions are each anonymous, `MAP_PRIVATE` over a file, or shared.
//!
//! How a page is dropped depends on its mapping:
//! - private anonymous: `madvise(MADV_DONTNEED)`; the next touch faults in
//!   a zero page;
//! - `MAP_PRIVATE` over a file (a clone over its template's memory file):
//!   `MADV_DONTNEED` would drop the private copy and the page would read
//!   the file's (the template's) content again, so the range is replaced by
//!   fresh anonymous memory (`mmap(MAP_FIXED | MAP_ANONYMOUS |
//!   MAP_PRIVATE)`): nothing until touched, zeros then. KVM follows the
//!   new mapping (its slots hold host virtual addresses; the MMU notifier
//!   drops the old translations);
//! - shared (memfd, shared file): `madvise(MADV_REMOVE)` frees the backing
//!   store itself (a hole punched in the file).

use super::PageRange;
use std::sync::{Arc, Mutex, PoisonError};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Why a range could not be given back.
#[derive(Debug, thiserror::Error)]
pub enum GiveBackError {
    /// The range is not inside one region this implementation knows.
    #[error("guest range {addr:#x}+{len:#x} is not in a known memory region")]
    NoRegion {
        /// Start.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// The host refused (`madvise`, `mmap`).
    #[error("giving back guest range {addr:#x}+{len:#x} with {what}: {source}")]
    Host {
        /// Start.
        addr: u64,
        /// Length.
        len: u64,
        /// Which call.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Releases the host memory behind guest ranges. The device calls it with
/// page-aligned ranges it has checked lie inside one region of `mem`;
/// afterwards the guest must read zeros there (never stale content).
pub trait GiveBack: Send {
    /// Gives back `range` of `mem`.
    fn give_back(&mut self, mem: &GuestMemoryMmap, range: PageRange) -> Result<(), GiveBackError>;
}

/// How one guest memory region is mapped in the VMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// `MAP_PRIVATE | MAP_ANONYMOUS`.
    Anonymous,
    /// `MAP_PRIVATE` over a file (a snapshot's memory file).
    PrivateFile,
    /// `MAP_SHARED` (memfd or file).
    Shared,
}

/// [`GiveBack`] over guest memory whose mappings are known: spans of
/// guest addresses, each with its [`Backing`] (a span set later overrides
/// what it overlaps, so a file mapped over part of an anonymous region is
/// one more [`MappedRegions::add`]). A range over several spans is given
/// back piece by piece, each its own way; one not wholly covered is
/// refused before anything is done.
///
/// Each replacement of a private file range can split its mapping in two
/// more VMAs, and a process has at most `vm.max_map_count` (65530 by
/// default) of them; a guest giving back every other page would exhaust
/// that and with it every later `mmap` of the VMM. So replacements are
/// budgeted ([`MappedRegions::with_replace_budget`]); past the budget a
/// private file range is dropped with `MADV_DONTNEED` (its pages then read
/// the file's bytes again: no host memory, but not zeros) and counted
/// ([`MappedRegions::fallbacks`]).
#[derive(Debug, Clone)]
pub struct MappedRegions {
    /// (start, end, backing), sorted, not overlapping.
    spans: Vec<(u64, u64, Backing)>,
    /// Replacements left before falling back to `MADV_DONTNEED`.
    replace_budget: u64,
    fallbacks: u64,
}

impl Default for MappedRegions {
    fn default() -> Self {
        Self {
            spans: Vec::new(),
            replace_budget: DEFAULT_REPLACE_BUDGET,
            fallbacks: 0,
        }
    }
}

/// Replacements of private file ranges allowed by default (each can add
/// two VMAs; well under the default `vm.max_map_count` of 65530).
pub const DEFAULT_REPLACE_BUDGET: u64 = 16384;

impl MappedRegions {
    /// No spans (everything is refused) until [`MappedRegions::add`].
    pub fn new() -> Self {
        Self::default()
    }

    /// At most `n` private file ranges are replaced by fresh anonymous
    /// memory; later ones fall back to `MADV_DONTNEED`.
    pub fn with_replace_budget(mut self, n: u64) -> Self {
        self.replace_budget = n;
        self
    }

    /// Private file ranges dropped with `MADV_DONTNEED` for want of budget.
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks
    }

    /// Guest range `[start, start + len)` is mapped as `backing` (over
    /// whatever was said of it before).
    pub fn add(&mut self, start: GuestAddress, len: u64, backing: Backing) -> &mut Self {
        let (ns, ne) = (start.0, start.0.saturating_add(len));
        if ns >= ne {
            return self;
        }
        let mut out = Vec::with_capacity(self.spans.len() + 2);
        for &(s, e, b) in &self.spans {
            if e <= ns || s >= ne {
                out.push((s, e, b));
                continue;
            }
            if s < ns {
                out.push((s, ns, b));
            }
            if e > ne {
                out.push((ne, e, b));
            }
        }
        out.push((ns, ne, backing));
        out.sort_by_key(|&(s, _, _)| s);
        self.spans = out;
        self
    }

    /// Forgets every span.
    pub fn clear(&mut self) {
        self.spans.clear();
    }

    /// The pieces of `r`, each with its backing; `None` unless the spans
    /// cover all of it.
    fn pieces(&self, r: PageRange) -> Option<Vec<(PageRange, Backing)>> {
        let end = r.addr.checked_add(r.len)?;
        let mut pos = r.addr;
        let mut out = Vec::new();
        for &(s, e, b) in &self.spans {
            if pos >= end {
                break;
            }
            if e <= pos {
                continue;
            }
            if s > pos {
                return None;
            }
            let stop = e.min(end);
            out.push((
                PageRange {
                    addr: pos,
                    len: stop - pos,
                },
                b,
            ));
            pos = stop;
        }
        (pos >= end).then_some(out)
    }
}

/// Drops the pages of `r` (inside one mapping of `mem`) as `backing` needs.
fn release(mem: &GuestMemoryMmap, r: PageRange, backing: Backing) -> Result<(), GiveBackError> {
    let no_region = || GiveBackError::NoRegion {
        addr: r.addr,
        len: r.len,
    };
    let slice = mem
        .get_slice(
            GuestAddress(r.addr),
            usize::try_from(r.len).map_err(|_| no_region())?,
        )
        .map_err(|_| no_region())?;
    let host = slice.ptr_guard_mut().as_ptr();
    let len = slice.len();
    let host_err = |what| GiveBackError::Host {
        addr: r.addr,
        len: r.len,
        what,
        source: std::io::Error::last_os_error(),
    };
    match backing {
        // (Anonymous also serves a private file range past the budget.)
        Backing::Anonymous | Backing::Shared => {
            let (advice, what) = if backing == Backing::Shared {
                (libc::MADV_REMOVE, "madvise(MADV_REMOVE)")
            } else {
                (libc::MADV_DONTNEED, "madvise(MADV_DONTNEED)")
            };
            // SAFETY: `host..host + len` is guest memory mapped by `mem`
            // (get_slice checked it lies in one region); dropping its pages
            // changes what the guest reads there to zeros, which is what
            // the guest asked for, and nothing in the VMM holds references
            // into it.
            if unsafe { libc::madvise(host.cast(), len, advice) } != 0 {
                return Err(host_err(what));
            }
        }
        Backing::PrivateFile => {
            // SAFETY: as above, the range is inside one mapping `mem` owns;
            // MAP_FIXED replaces exactly those pages with fresh anonymous
            // memory of the same protection, so the mapping stays valid for
            // `mem` (which unmaps the whole region, whatever backs its
            // pages, when dropped).
            let p = unsafe {
                libc::mmap(
                    host.cast(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(host_err("mmap(MAP_FIXED|MAP_ANONYMOUS)"));
            }
        }
    }
    Ok(())
}

impl GiveBack for MappedRegions {
    fn give_back(&mut self, mem: &GuestMemoryMmap, r: PageRange) -> Result<(), GiveBackError> {
        let pieces = self.pieces(r).ok_or(GiveBackError::NoRegion {
            addr: r.addr,
            len: r.len,
        })?;
        for (p, mut b) in pieces {
            if b == Backing::PrivateFile {
                if self.replace_budget == 0 {
                    b = Backing::Anonymous;
                    self.fallbacks += 1;
                } else {
                    self.replace_budget -= 1;
                }
            }
            release(mem, p, b)?;
        }
        Ok(())
    }
}

/// The VMM's form: spans it updates when it maps guest memory anew (a
/// restore into a pre-warmed VM), shared with the device.
impl GiveBack for Arc<Mutex<MappedRegions>> {
    fn give_back(&mut self, mem: &GuestMemoryMmap, r: PageRange) -> Result<(), GiveBackError> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .give_back(mem, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_outside_known_regions_are_refused() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x4000)]).unwrap();
        let mut m = MappedRegions::new();
        m.add(GuestAddress(0), 0x2000, Backing::Anonymous);
        let r = |addr, len| PageRange { addr, len };
        assert!(m.give_back(&mem, r(0, 0x2000)).is_ok());
        for (a, l) in [
            (0x1000, 0x2000),
            (0x2000, 0x1000),
            (u64::MAX - 0xfff, 0x1000),
        ] {
            assert!(matches!(
                m.give_back(&mem, r(a, l)),
                Err(GiveBackError::NoRegion { .. })
            ));
        }
        // Spans override what they overlap and split a range.
        m.add(GuestAddress(0x1000), 0x2000, Backing::PrivateFile);
        assert_eq!(
            m.pieces(r(0, 0x3000)).unwrap(),
            vec![
                (r(0, 0x1000), Backing::Anonymous),
                (r(0x1000, 0x2000), Backing::PrivateFile)
            ]
        );
        assert!(m.give_back(&mem, r(0, 0x3000)).is_ok());
        assert!(m.pieces(r(0x2000, 0x2000)).is_none(), "past the spans");
        m.clear();
        assert!(m.give_back(&mem, r(0, 0x1000)).is_err());
        m.add(GuestAddress(0), 0x2000, Backing::Anonymous);
        // Known to the implementation but not mapped by `mem`.
        m.add(GuestAddress(0x10000), 0x1000, Backing::Anonymous);
        assert!(matches!(
            m.give_back(&mem, r(0x10000, 0x1000)),
            Err(GiveBackError::NoRegion { .. })
        ));
    }
}
