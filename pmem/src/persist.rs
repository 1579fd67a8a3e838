//! Save and restore of a pmem device.
//!
//! The image is not copied into snapshots: the state names it (path, guest
//! address, size) and fingerprints it, and restore reopens the same path and
//! refuses an image that changed (see [`crate::fingerprint`]). The queue's
//! position and the acked features are saved by the transport
//! (`devices::virtio::persist::MmioState`, via `queue_states`).
//!
//! Restore order in the VMM: [`PmemMapping::restore`] (checks and maps the
//! image at the saved address), register its KVM slot, then a device over
//! the mapping (`Pmem::restore(mapping.backing(), &state)` checks that the
//! two match) and the transport's `Persist::restore`, which re-activates it.

use crate::device::Pmem;
use crate::fingerprint::{fingerprint, ImageChange, ImageFingerprint};
use crate::image::{io_err, ImageError};
use crate::layout::{GuestRange, IMAGE_ALIGN};
use crate::mapping::{MappingError, PmemBacking, PmemMapping};
use serde::{Deserialize, Serialize};
use snapshot::Persist;
use std::path::PathBuf;

/// Saved state of a pmem device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PmemState {
    /// Image path, reopened on restore (must be valid UTF-8 to serialize).
    pub path: PathBuf,
    /// Guest-physical start the guest was told.
    pub guest_addr: u64,
    /// Size the guest was told.
    pub len: u64,
    /// The image as it was when saved.
    pub image: ImageFingerprint,
}

impl PmemState {
    /// The guest range, for `crate::check_placement` against the restored
    /// VM's RAM layout.
    pub fn range(&self) -> GuestRange {
        GuestRange {
            start: self.guest_addr,
            len: self.len,
        }
    }
}

/// Why a pmem device could not be saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum PmemPersistError {
    /// The image could not be opened or read.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The image changed since the snapshot.
    #[error(
        "pmem image {path} changed since the snapshot: {change}; restore needs the exact \
         image the snapshot was taken with"
    )]
    Changed {
        /// The image.
        path: PathBuf,
        /// What changed.
        change: ImageChange,
    },
    /// The saved state is inconsistent (corrupt or hand-edited).
    #[error("saved pmem state for {path} is invalid: {why}")]
    BadState {
        /// The image.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The mapping handed to restore is not the one the state describes.
    #[error(
        "pmem mapping {got_path} at {got_addr:#x} (+{got_len:#x}) does not match the saved \
         {path} at {guest_addr:#x} (+{len:#x})"
    )]
    Mismatch {
        /// Saved path.
        path: PathBuf,
        /// Saved address.
        guest_addr: u64,
        /// Saved size.
        len: u64,
        /// Given path.
        got_path: PathBuf,
        /// Given address.
        got_addr: u64,
        /// Given size.
        got_len: u64,
    },
    /// Mapping the verified image failed.
    #[error(transparent)]
    Mapping(#[from] MappingError),
}

impl Persist for Pmem {
    type State = PmemState;
    /// The restored mapping's [`PmemMapping::backing`].
    type ConstructorArgs = PmemBacking;
    type Error = PmemPersistError;

    fn save(&self) -> Result<PmemState, PmemPersistError> {
        let b = self.backing();
        Ok(PmemState {
            path: b.path.clone(),
            guest_addr: b.guest_addr,
            len: b.len,
            image: b.fingerprint()?,
        })
    }

    fn restore(args: PmemBacking, state: &PmemState) -> Result<Self, PmemPersistError> {
        if (&args.path, args.guest_addr, args.len) != (&state.path, state.guest_addr, state.len) {
            return Err(PmemPersistError::Mismatch {
                path: state.path.clone(),
                guest_addr: state.guest_addr,
                len: state.len,
                got_path: args.path,
                got_addr: args.guest_addr,
                got_len: args.len,
            });
        }
        Ok(Pmem::new(args))
    }
}

impl PmemMapping {
    /// Reopens the image `state` names, refuses it if it changed since the
    /// snapshot, and maps that same open file at the saved guest address.
    pub fn restore(state: &PmemState) -> Result<Self, PmemPersistError> {
        let bad = |why: &str| PmemPersistError::BadState {
            path: state.path.clone(),
            why: why.to_string(),
        };
        if state.len == 0 || !state.len.is_multiple_of(IMAGE_ALIGN) || state.image.len != state.len
        {
            return Err(bad("size is not a consistent non-zero multiple of 2 MiB"));
        }
        if !state.guest_addr.is_multiple_of(IMAGE_ALIGN)
            || state.guest_addr.checked_add(state.len).is_none()
        {
            return Err(bad("guest address is not 2 MiB-aligned or the range wraps"));
        }
        let file = crate::mapping::open_nofollow(&state.path)
            .map_err(io_err(&state.path, "cannot open"))?;
        let meta = file
            .metadata()
            .map_err(io_err(&state.path, "cannot stat"))?;
        // The very file the snapshot saw, never modified since (same
        // device, inode, size and mtime): no need to read and hash samples,
        // which would cost a restore milliseconds.
        if !state.image.same_file_unmodified(&meta) {
            let now = fingerprint(&file).map_err(io_err(&state.path, "cannot fingerprint"))?;
            state
                .image
                .compare(&now)
                .map_err(|change| PmemPersistError::Changed {
                    path: state.path.clone(),
                    change,
                })?;
        }
        Ok(PmemMapping::from_file(file, &state.path, state.guest_addr)?)
    }
}

#[cfg(test)]
#[path = "persist_tests.rs"]
mod tests;
