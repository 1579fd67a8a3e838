//! Every fuzz target in one test binary (one link for all of them). Each
//! target replays its corpus, then runs random inputs for
//! `shoal_fuzz::budget()` (1 s unless `SHOAL_FUZZ_MS` says otherwise); see
//! `scripts/fuzz.sh` for longer runs and CONTRIBUTING.md for the layout.

#[global_allocator]
static ALLOC: shoal_fuzz::CountingAlloc = shoal_fuzz::CountingAlloc;

mod targets;
