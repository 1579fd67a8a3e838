//! Per-sandbox user ids: leased, not stored.
//!
//! A jailed VMM runs as `UID_BASE + slot` (group the same), slot 1..SLOTS.
//! A slot is taken by holding an exclusive `flock` on the file
//! `<dir>/<slot>`; the lease's descriptor is handed to the jailer, whose
//! supervisor holds it until the VMM has ended. So a slot is busy exactly
//! while a VMM runs as it, a daemon restart cannot hand out the uid of a
//! VMM that outlived it (its jailer still holds the lock), and a crash
//! frees it (the kernel drops the lock with the last descriptor).
//!
//! Slot 0's id is the group every jailed VMM also has ([`SHARED_GID`]):
//! the group of the files all of them may read (templates, images).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// The first id of the range (`0x5300_0000`: far above login users and
/// the ids of ordinary user namespaces' subuid ranges).
pub const UID_BASE: u32 = 0x5300_0000;
/// Slots in the range (slot 0 is the shared group).
pub const SLOTS: u32 = 1 << 16;
/// The group of what every jailed VMM may read.
pub const SHARED_GID: u32 = UID_BASE;

/// Why no id could be leased.
#[derive(Debug, thiserror::Error)]
pub enum UidError {
    /// The lease directory or a lock file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Every slot is held.
    #[error("all {0} jail user ids are in use")]
    Exhausted(u32),
}

/// A held slot; the lock lasts while this (or a copy of its descriptor in
/// a jailer) is open.
#[derive(Debug)]
pub struct Lease {
    slot: u32,
    fd: OwnedFd,
}

impl Lease {
    /// The slot.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The user (and group) id.
    pub fn uid(&self) -> u32 {
        UID_BASE + self.slot
    }

    /// The locked descriptor (above 9, close-on-exec).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A new descriptor for the same lock (the same open file
    /// description), to hand to a jailer.
    pub fn file(&self) -> std::io::Result<File> {
        Ok(File::from(self.fd.try_clone()?))
    }
}

/// The slot of a jail user id, if it is one.
pub fn slot_of(uid: u32) -> Option<u32> {
    uid.checked_sub(UID_BASE).filter(|s| (1..SLOTS).contains(s))
}

/// Where the next search starts: successive leases take successive slots,
/// so a slot just freed is not handed out again at once.
static NEXT: AtomicU32 = AtomicU32::new(1);

/// Leases a free slot from the lock files in `dir` (created 0700).
pub fn lease(dir: &Path) -> Result<Lease, UidError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| UidError::Io { path, source }
    };
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).map_err(err(dir))?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(err(dir))?;
    }
    let start = NEXT.fetch_add(1, Ordering::Relaxed);
    for i in 0..SLOTS - 1 {
        let slot = (start + i - 1) % (SLOTS - 1) + 1;
        let path = dir.join(slot.to_string());
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(err(&path))?;
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        NEXT.store(slot % (SLOTS - 1) + 1, Ordering::Relaxed);
        return Ok(Lease {
            slot,
            fd: high_fd(f).map_err(err(&path))?,
        });
    }
    Err(UidError::Exhausted(SLOTS - 1))
}

/// The descriptor moved above 9 (so that a starter placing descriptors at
/// small fixed numbers, e.g. a readiness pipe at 3, cannot overwrite it).
fn high_fd(f: File) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new one.
    let n = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns; `f` (same open file
    // description, so the lock stays) is closed when it drops.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_exclusive_until_dropped_and_ids_are_in_range() {
        let d = tempfile::tempdir().unwrap();
        let a = lease(d.path()).unwrap();
        let b = lease(d.path()).unwrap();
        assert_ne!(a.slot(), b.slot());
        for l in [&a, &b] {
            assert_eq!(slot_of(l.uid()), Some(l.slot()));
            assert!(l.fd() >= 10);
        }
        assert_eq!(slot_of(SHARED_GID), None, "slot 0 is the shared group");
        assert_eq!(slot_of(0), None);
        assert_eq!(slot_of(UID_BASE + SLOTS), None);
        // Another open file description (as another daemon process would
        // have) cannot take a held slot.
        let f = File::open(d.path().join(a.slot().to_string())).unwrap();
        // SAFETY: flock on a descriptor we own.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_ne!(r, 0, "a held slot is locked");
        let slot = a.slot();
        drop(a);
        // SAFETY: as above.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(r, 0, "dropping the lease frees slot {slot}");
    }

    #[test]
    fn a_lease_held_by_a_child_process_outlives_the_parents_copy() {
        use std::os::unix::process::CommandExt;
        let d = tempfile::tempdir().unwrap();
        let l = lease(d.path()).unwrap();
        let (slot, fd) = (l.slot(), l.fd());
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: fcntl (async-signal-safe) clears close-on-exec on the
        // lease so the child inherits it.
        unsafe {
            cmd.pre_exec(move || {
                libc::fcntl(fd, libc::F_SETFD, 0);
                Ok(())
            })
        };
        let mut child = cmd.spawn().unwrap();
        drop(l);
        let f = File::open(d.path().join(slot.to_string())).unwrap();
        // SAFETY: flock on a descriptor we own.
        let held = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0;
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(held, "the child's copy keeps the slot");
        // SAFETY: as above.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(r, 0, "freed when the child ends");
    }
}
