//! Host memory and I/O figures of processes and files, for benchmarks.

use std::os::fd::AsRawFd;
use std::path::Path;

/// `key:` of /proc/meminfo, KiB.
pub fn meminfo_kib(key: &str) -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// (Pss_Anon + Pss_Shmem, Pss) of a process, KiB.
pub fn pss_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |k: &str| -> u64 {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Pss_Anon:") + field("Pss_Shmem:"), field("Pss:"))
}

/// `write_bytes` of /proc/PID/io.
pub fn write_bytes(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("write_bytes:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// KiB of `path` resident in the host page cache (`mincore` over a
/// read-only shared mapping of it; 0 if it cannot be mapped).
pub fn cached_kib(path: &Path) -> u64 {
    let Ok(f) = std::fs::File::open(path) else {
        return 0;
    };
    let len = f
        .metadata()
        .ok()
        .and_then(|m| usize::try_from(m.len()).ok())
        .unwrap_or(0);
    if len == 0 {
        return 0;
    }
    // SAFETY: a fresh read-only shared mapping of an open file; only
    // passed to mincore and unmapped below, never dereferenced.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return 0;
    }
    let page = 4096usize;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `p` maps `len` bytes; `vec` has one byte per page of it.
    let rc = unsafe { libc::mincore(p, len, vec.as_mut_ptr()) };
    // SAFETY: unmaps exactly the mapping made above.
    unsafe { libc::munmap(p, len) };
    if rc != 0 {
        return 0;
    }
    vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * (page as u64 / 1024)
}

/// Drops the clean page-cache pages of `path` (advisory).
pub fn evict(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        // SAFETY: an advisory call on an fd we own.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_cache_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
        std::fs::File::open(&p).unwrap().sync_all().unwrap();
        let _ = std::fs::read(&p).unwrap();
        assert_eq!(cached_kib(&p), 1024, "a file just read is cached");
        evict(&p);
        assert!(cached_kib(&p) < 1024, "evicted: {}", cached_kib(&p));
        assert_eq!(cached_kib(&dir.path().join("missing")), 0);
        assert!(pss_kib(std::process::id()).1 > 0);
        assert!(meminfo_kib("MemTotal:") > 0);
    }
}
