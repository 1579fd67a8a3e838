//! Host side of Shoal: locating and building guest artifacts, launching
//! `shoal-vmm` processes, and the benchmarks. (The `shoald` daemon will live
//! here too.)

pub mod artifacts;
pub mod bench;
pub mod image;
pub mod launch;
pub mod sandbox;
pub mod stats;
pub mod template;
