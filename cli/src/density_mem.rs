//! `shoal bench density`'s host memory readings: the VMMs of a private
//! daemon sampled over time (PSS, anonymous memory) beside the host's used
//! memory (MemTotal − MemAvailable), and the guest RAM a VMM holds
//! privately (what its template's shared pages do not cover).

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One reading of host memory.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct Sample {
    /// Seconds since the configuration's start.
    pub t_s: f64,
    /// VMMs read.
    pub vmms: usize,
    /// Sum of the VMMs' PSS (MiB): shared template pages split between
    /// the VMMs mapping them, each page counted once in the sum.
    pub pss_mib: f64,
    /// Sum of the VMMs' anonymous memory (MiB): what is theirs alone.
    pub anon_mib: f64,
    /// MemTotal − MemAvailable (MiB): the whole host, others' use included.
    pub host_used_mib: f64,
}

/// A `Field:` of smaps_rollup text, KiB.
fn field_kib(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// (PSS, anonymous) KiB of process `pid` (0s when it is gone).
pub fn rollup_kib(pid: i32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    (field_kib(&s, "Pss"), field_kib(&s, "Anonymous"))
}

/// Reads the VMMs under `dir` and the host once.
pub fn read(dir: &Path, t_s: f64) -> Sample {
    let (mut pss, mut anon, mut vmms) = (0u64, 0u64, 0usize);
    for p in shoal_runtime::vm::vmms_under(dir) {
        let (a, b) = rollup_kib(p.pid);
        if a > 0 {
            pss += a;
            anon += b;
            vmms += 1;
        }
    }
    let kib = shoal_bench::hostmem::meminfo_kib;
    let used = kib("MemTotal:") - kib("MemAvailable:");
    Sample {
        t_s,
        vmms,
        pss_mib: pss as f64 / 1024.0,
        anon_mib: anon as f64 / 1024.0,
        host_used_mib: used as f64 / 1024.0,
    }
}

/// A thread reading [`read`] every interval until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    /// Starts sampling the VMMs under `dir` every `every`, times taken
    /// from `t0`.
    pub fn start(dir: PathBuf, every: Duration, t0: Instant) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut v = vec![];
            let mut next = Instant::now();
            while !s.load(Ordering::Relaxed) {
                v.push(read(&dir, t0.elapsed().as_secs_f64()));
                next += every;
                // Never more than a sample per interval, even when late.
                let now = Instant::now();
                if next < now {
                    next = now;
                }
                while Instant::now() < next && !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50).min(next - Instant::now()));
                }
            }
            v.push(read(&dir, t0.elapsed().as_secs_f64()));
            v
        });
        Sampler { stop, thread }
    }

    /// Stops it; the samples, in time order.
    pub fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Guest RAM (KiB) resident in the VMM `pid` that is not its template's
/// shared page cache: anonymous memory (copy-on-write copies, pages the
/// balloon replaced) plus resident pages of the eviction file, inside the
/// mappings of guest RAM (`memory_mib` from the start of the template's
/// memory file's mapping at offset 0, or of the eviction file's there).
/// None when the guest RAM mapping is not found.
pub fn guest_private_kib(pid: i32, memory_mib: u64) -> Option<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    guest_private_in(&smaps, memory_mib)
}

/// [`guest_private_kib`] over smaps text.
fn guest_private_in(smaps: &str, memory_mib: u64) -> Option<u64> {
    let size = memory_mib << 20;
    // A VMA's header: "start-end perms offset dev inode [path]".
    let header = |l: &str| -> Option<(u64, u64, u64, String)> {
        let mut f = l.split_whitespace();
        let (s, e) = f.next()?.split_once('-')?;
        let (s, e) = (
            u64::from_str_radix(s, 16).ok()?,
            u64::from_str_radix(e, 16).ok()?,
        );
        let off = u64::from_str_radix(f.nth(1)?, 16).ok()?;
        let path = f.skip(2).collect::<Vec<_>>().join(" ");
        Some((s, e, off, path))
    };
    let evict_file = |p: &str| p.contains("/#") && p.ends_with("(deleted)");
    let base = smaps
        .lines()
        .filter_map(header)
        .find_map(|(s, _, off, p)| {
            let memory = Path::new(&p).file_name().is_some_and(|n| n == "memory");
            (off == 0 && (memory || evict_file(&p))).then_some(s)
        })?;
    let end = base + size;
    let (mut inside, mut evicted, mut kib) = (false, false, 0);
    for l in smaps.lines() {
        if let Some((s, e, _, p)) = header(l) {
            inside = s >= base && e <= end;
            evicted = evict_file(&p);
            continue;
        }
        if !inside {
            continue;
        }
        let v = |k: &str| {
            l.strip_prefix(k).map(|v| {
                v.split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            })
        };
        if let Some(a) = v("Anonymous:") {
            kib += a;
        } else if evicted {
            if let Some(r) = v("Rss:") {
                kib += r;
            }
        }
    }
    Some(kib)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0-55e0 r-xp 00000000 fd:01 1 /usr/bin/shoal-vmm
Rss:                  64 kB
Anonymous:             0 kB
7f0000000000-7f0000100000 rw-p 00000000 fd:01 9 /sandbox/memory
Rss:                 100 kB
Anonymous:            12 kB
7f0000100000-7f0000200000 rw-p 00100000 fd:01 10 /sandbox/#12 (deleted)
Rss:                   8 kB
Anonymous:             0 kB
7f0000200000-7f0000400000 rw-p 00000000 00:00 0
Rss:                  40 kB
Anonymous:            40 kB
7f0000400000-7f0000500000 rw-p 00000000 00:00 0 [heap]
Rss:                 500 kB
Anonymous:           500 kB
";

    #[test]
    fn private_guest_ram_is_anonymous_and_evicted_pages_back_in_ram() {
        // 4 MiB of guest RAM from 7f0000000000: 12 + 8 + 40; the heap after it is not.
        assert_eq!(guest_private_in(SMAPS, 4), Some(60));
        assert_eq!(guest_private_in(SMAPS, 1), Some(12));
        assert_eq!(guest_private_in("", 4), None);
        let r = "Rss: 10 kB\nPss:   7 kB\nAnonymous:  3 kB\n";
        assert_eq!((field_kib(r, "Pss"), field_kib(r, "Anonymous")), (7, 3));
        assert_eq!(field_kib(r, "Missing"), 0);
    }
}
