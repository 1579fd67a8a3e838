//! Which way this host evicts idle guests' memory (`vm::evict`): read by
//! the VMM at each eviction and by `shoal doctor` (`host`).

/// How this host evicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// To a sparse file, re-mapped over guest RAM (no swap).
    File,
    /// `MADV_PAGEOUT` to swap or zswap.
    PageOut,
}

impl Mode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::File => "file",
            Mode::PageOut => "pageout",
        }
    }
}

/// Whether `/proc/swaps` lists a swap area (zswap needs one too).
pub fn swaps_listed(text: &str) -> bool {
    text.lines().skip(1).any(|l| !l.trim().is_empty())
}

/// The way this host gets: pageout with swap, the file otherwise.
pub fn host_mode() -> Mode {
    match std::fs::read_to_string("/proc/swaps") {
        Ok(t) if swaps_listed(&t) => Mode::PageOut,
        _ => Mode::File,
    }
}
