//! What a guest restored from a snapshot gets so that clones never share
//! randomness or a stale clock: fresh entropy and the current time, handed
//! to the agent's post-restore step.

use std::time::SystemTime;

/// Nanoseconds since the Unix epoch (the host's clock).
pub fn unix_nanos() -> u64 {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    // u64 nanoseconds last until the year 2554.
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// 64 bytes from the host's getrandom, for the guest to reseed its CRNG.
pub fn entropy() -> [u8; 64] {
    let mut b = [0u8; 64];
    // SAFETY: getrandom writes at most 64 bytes into b.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    b
}

/// A random 12-hex-digit id (sandboxes, pool members): 48 bits from
/// getrandom, or the clock if getrandom fails.
pub fn random_id() -> String {
    let mut b = [0u8; 6];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if usize::try_from(n).ok() != Some(b.len()) {
        b.copy_from_slice(&unix_nanos().to_le_bytes()[..6]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_differs_and_clock_moves() {
        assert_ne!(entropy(), entropy());
        let a = unix_nanos();
        assert!(a > 1_700_000_000_000_000_000, "clock after 2023");
        assert!(unix_nanos() >= a);
        let id = random_id();
        assert_eq!(id.len(), 12);
        assert!(id.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(id, random_id());
    }
}
