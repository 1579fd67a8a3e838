//! Shared pieces of Shoal's fuzz targets (`tests/targets/*.rs`): the time
//! budget of one target, an allocator that measures what one input
//! allocates, and [`queue`]: virtqueues a hostile driver fills, over real
//! guest memory, with the checks every device must pass.
//!
//! Every target is a `bolero` test: under `cargo test` it replays its
//! corpus (`tests/targets/__fuzz__/<target>/corpus`, checked in) and then
//! runs random inputs for [`budget`]; `scripts/fuzz.sh` runs one for longer
//! (with libFuzzer through `cargo bolero` where it is installed).

pub mod queue;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

/// How long each target runs random inputs: `SHOAL_FUZZ_MS`, else 1 s.
pub fn budget() -> Duration {
    let ms = std::env::var("SHOAL_FUZZ_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    Duration::from_millis(ms)
}

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// The system allocator, counting this thread's live bytes and their peak
/// (see [`peak_alloc`]). A test binary installs it with
/// `#[global_allocator]`.
pub struct CountingAlloc;

fn note(delta: isize) {
    // `try_with`: the counters may be gone while a thread exits.
    let _ = LIVE.try_with(|l| {
        let v = l.get() + delta;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

fn signed(n: usize) -> isize {
    isize::try_from(n).unwrap_or(isize::MAX)
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the counting touches only thread-local integers (const
// initialised, no destructor, so no allocation and no re-entry).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is (the caller upholds `alloc`'s contract).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(signed(layout.size()));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-signed(layout.size()));
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(signed(layout.size()));
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(signed(new_size) - signed(layout.size()));
        }
        p
    }
}

/// Runs `f` and returns its result with the most bytes it had allocated
/// (and not yet freed) at once on this thread, above what was live before.
/// Only meaningful where [`CountingAlloc`] is the global allocator.
pub fn peak_alloc<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    let peak = PEAK.with(Cell::get);
    (r, usize::try_from(peak - base).unwrap_or(0))
}
