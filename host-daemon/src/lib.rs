//! Host side of Shoal: locating and building guest artifacts, launching
//! `shoal-vmm` processes, the benchmarks, and the `shoald` daemon
//! ([`daemon`]).

pub mod artifacts;
pub mod bench;
pub mod daemon;
pub mod image;
pub mod launch;
pub mod layers;
pub mod ready;
pub mod sandbox;
pub mod stats;
pub mod template;
