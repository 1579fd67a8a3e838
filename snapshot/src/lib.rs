//! Shoal's snapshot format and the save/restore contract.
//!
//! A snapshot is a directory: `state` (this crate's container around the
//! serialized state of the VM, its vCPUs and devices) and `memory` (guest
//! RAM, raw, mapped copy-on-write on restore). The container is simple on
//! purpose: magic, one format version, length, CRC32, body. Any incompatible
//! change to any state struct bumps [`FORMAT_VERSION`]; older files are
//! refused with a clear error instead of being half-understood.

mod container;
mod persist;

pub use container::{
    load, read_from, save, write_to, SnapshotError, FORMAT_VERSION, MAGIC, MAX_STATE_BYTES,
};
pub use persist::{pod_from_bytes, pod_to_bytes, Persist, PodError};
