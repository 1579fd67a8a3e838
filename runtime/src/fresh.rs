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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_differs_and_clock_moves() {
        assert_ne!(entropy(), entropy());
        let a = unix_nanos();
        assert!(a > 1_700_000_000_000_000_000, "clock after 2023");
        assert!(unix_nanos() >= a);
    }
}
