//! virtio-balloon with the real Linux driver, on /dev/kvm: a `tiny`
//! template booted with `--balloon on,stats_s=1` and 256 MiB (its boot
//! reports the free memory of an anonymously mapped guest), then restored
//! sandboxes (guest RAM `MAP_PRIVATE` over the snapshot's memory file):
//! the guest's statistics arrive; an inflate to 128 MiB is reached and the
//! VMM's resident memory falls by about that much; the guest still execs;
//! a deflate to 0 is reached; memory the guest touched and freed is
//! reported and leaves the host; and two clones of a snapshot of that
//! sandbox each answer stats, inflate, report, and read zeros (never the
//! snapshot's bytes) wherever the VMM gave a page back, and so does a VM
//! restored from a diff snapshot of one of them.
//!
//! One template boot (cached across runs), then restores only.

use shoal_runtime::sandbox::{self, TemplateSpec};
use shoal_runtime::vmm_balloon::BalloonOptions;
use shoal_test_support::{kvm_serial, sh, RunningSandbox};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};
use vmm_api::BalloonInfo;

const MIB: u64 = 1 << 20;
const PAGE: usize = 4096;
/// Guest memory of the template.
const MEM_MIB: u64 = 256;
/// The emulated guest kernel is slow (PVM hosts): every deadline is
/// generous.
const DEADLINE: Duration = Duration::from_secs(240);

fn template() -> std::path::PathBuf {
    let spec = TemplateSpec {
        balloon: Some(BalloonOptions {
            stats_interval_s: 1,
            ..BalloonOptions::default()
        }),
        ..TemplateSpec::new("tiny", 1, u32::try_from(MEM_MIB).unwrap())
    };
    sandbox::template(&spec, &mut |l| eprintln!("{l}"))
        .unwrap_or_else(|e| panic!("the tiny template with a balloon: {e}"))
}

fn api(r: &RunningSandbox) -> vmm_api::Client {
    vmm_api::Client::new(&r.sb.api_sock, Duration::from_secs(30))
}

/// Asks for the balloon's state (and new stats) until `ok` holds.
fn balloon_until(
    r: &RunningSandbox,
    what: &str,
    ok: impl Fn(&BalloonInfo) -> bool,
) -> (BalloonInfo, Duration) {
    let t = Instant::now();
    loop {
        let b = api(r).balloon(None).expect("balloon request");
        if ok(&b) {
            return (b, t.elapsed());
        }
        assert!(
            t.elapsed() < DEADLINE,
            "{what}: not within {DEADLINE:?}; last reply {b:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Sets the target and waits until the guest's balloon holds it.
fn inflate_to(r: &RunningSandbox, mib: u64) -> (BalloonInfo, Duration) {
    let b = api(r).balloon(Some(mib)).expect("balloon target");
    assert_eq!(b.target_mib, mib, "{b:?}");
    balloon_until(r, &format!("balloon actual {mib} MiB"), |b| {
        b.actual_mib == mib
    })
}

/// A field of /proc/PID/smaps_rollup, in KiB.
fn rollup_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in smaps_rollup: {s}"))
}

/// Where the VMM maps guest RAM (restored: `MAP_PRIVATE` over `memory`,
/// one region at guest address 0 for this size), and the spans inside it
/// the VMM replaced by fresh anonymous memory (pages it gave back).
struct GuestRam {
    base: u64,
    replaced: Vec<(u64, u64)>,
}

fn guest_ram(pid: u32, memory: &Path) -> GuestRam {
    let memory = memory.canonicalize().unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let rows: Vec<(u64, u64, u64, &str)> = maps
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (s, e) = f.next()?.split_once('-')?;
            let off = u64::from_str_radix(f.nth(1)?, 16).ok()?;
            let path = f.nth(2).unwrap_or("");
            Some((
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
                off,
                path,
            ))
        })
        .collect();
    let base = rows
        .iter()
        .find(|r| r.2 == 0 && Path::new(r.3) == memory)
        .map(|r| r.0)
        .unwrap_or_else(|| panic!("{} is not mapped at offset 0: {maps}", memory.display()));
    let end = base + MEM_MIB * MIB;
    // A fresh anonymous mapping at either end of guest RAM may have merged
    // with the VMM's own anonymous memory beside it: clipped.
    let replaced = rows
        .iter()
        .filter(|r| r.0 < end && r.1 > base && r.3.is_empty())
        .map(|r| (r.0.max(base) - base, r.1.min(end) - r.0.max(base)))
        .collect();
    GuestRam { base, replaced }
}

/// Reads all of guest RAM through /proc/PID/mem (which faults every page
/// of the VMM's mapping in, as a guest using all its memory would).
fn touch_guest_ram(pid: u32, ram: &GuestRam) {
    let mut f = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    f.seek(SeekFrom::Start(ram.base)).unwrap();
    let mut buf = vec![0u8; 4 << 20];
    let mut left = MEM_MIB * MIB;
    while left > 0 {
        let n = usize::try_from(left.min(buf.len() as u64)).unwrap();
        f.read_exact(&mut buf[..n]).expect("read guest RAM");
        left -= n as u64;
    }
}

/// What the pages the VMM gave back (its replaced spans) read as, against
/// the snapshot's memory file.
#[derive(Debug, Default)]
struct GivenBack {
    pages: u64,
    zero: u64,
    /// Pages holding data in the snapshot (so a stale read would show).
    had_data: u64,
    /// Pages reading the snapshot's (non-zero) bytes.
    stale: u64,
}

fn given_back(pid: u32, ram: &GuestRam, snapshot_memory: &Path) -> GivenBack {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let file = std::fs::File::open(snapshot_memory).unwrap();
    let (mut a, mut b) = (vec![0u8; PAGE], vec![0u8; PAGE]);
    let mut g = GivenBack::default();
    for &(off, len) in &ram.replaced {
        for p in (off..off + len).step_by(PAGE) {
            mem.read_exact_at(&mut a, ram.base + p).unwrap();
            file.read_exact_at(&mut b, p).unwrap();
            let data = b.iter().any(|&x| x != 0);
            g.pages += 1;
            g.zero += u64::from(a.iter().all(|&x| x == 0));
            g.had_data += u64::from(data);
            g.stale += u64::from(data && a == b);
        }
    }
    g
}

#[test]
fn the_linux_driver_inflates_deflates_reports_and_its_clones_read_zeros() {
    let _one = kvm_serial();
    let tpl = template();
    let (r, c) = RunningSandbox::start(&tpl);
    let pid = r.vmm_pid();

    // Stats arrive (stats_s=1, and every request asks for new ones); the
    // counters came with the snapshot: the template's boot (anonymous RAM)
    // already reported its free memory.
    let (b0, t) = balloon_until(&r, "guest memory stats", |b| {
        b.stats.total_memory.is_some() && b.stats.free_memory.is_some()
    });
    let (total, free) = (
        b0.stats.total_memory.unwrap(),
        b0.stats.free_memory.unwrap(),
    );
    eprintln!(
        "stats after {t:?}: total {} MiB, free {} MiB; the template's boot reported {} MiB",
        total / MIB,
        free / MIB,
        b0.reported_bytes / MIB
    );
    assert!(
        total > (MEM_MIB - 64) * MIB && total <= MEM_MIB * MIB,
        "total memory {total}"
    );
    assert!(free > 128 * MIB && free < total, "free memory {free}");
    assert!(
        b0.reported_bytes > 0,
        "the template's boot reported nothing: {b0:?}"
    );
    assert_eq!((b0.refused, b0.give_back_errors), (0, 0), "{b0:?}");

    // Free page reporting: 32 MiB touched and freed in the guest leave
    // the host again.
    // (The guest reports as soon as its pages are free, before the exec's
    // reply comes back: the VMM's anonymous memory is sampled meanwhile.)
    let anon0 = rollup_kib(pid, "Anonymous");
    let t = Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (peak, (out, err, st)) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rollup_kib(pid, "Anonymous"));
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        });
        let r = sh(
            &c,
            "dd if=/dev/zero of=/dev/null bs=32M count=1 2>&1 && echo touched",
        );
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (sampler.join().unwrap(), r)
    });
    assert!(out.contains("touched"), "dd: {out}{err} {st:?}");
    eprintln!(
        "guest touched and freed 32 MiB in {:?}: VMM anonymous {anon0} KiB, at most {peak} KiB meanwhile",
        t.elapsed()
    );
    let (b1, t) = balloon_until(&r, "32 MiB freed in the guest reported", |b| {
        b.reported_bytes >= b0.reported_bytes + 16 * MIB
    });
    let end = Instant::now() + DEADLINE;
    let mut anon2 = rollup_kib(pid, "Anonymous");
    while peak.saturating_sub(anon2) < 16 * 1024 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(500));
        anon2 = rollup_kib(pid, "Anonymous");
    }
    eprintln!(
        "reported {} MiB more within {t:?} of the reply; VMM anonymous {peak} -> {anon2} KiB",
        (b1.reported_bytes - b0.reported_bytes) / MIB
    );
    assert!(
        peak >= anon0 + 24 * 1024,
        "the guest's 32 MiB did not show in the VMM's anonymous memory ({anon0} -> {peak} KiB)"
    );
    assert!(
        peak.saturating_sub(anon2) >= 16 * 1024,
        "reported memory did not leave the host: anonymous {peak} -> {anon2} KiB"
    );

    // Inflate: with every page of guest RAM resident, the VMM's RSS falls
    // by about what the balloon holds.
    let ram = guest_ram(pid, &tpl.join("memory"));
    touch_guest_ram(pid, &ram);
    let rss0 = rollup_kib(pid, "Rss");
    let (b2, t) = inflate_to(&r, 128);
    let rss1 = rollup_kib(pid, "Rss");
    eprintln!(
        "inflated to 128 MiB in {t:?}: VMM RSS {rss0} -> {rss1} KiB ({} MiB less); \
         guest free {:?} MiB",
        rss0.saturating_sub(rss1) / 1024,
        b2.stats.free_memory.map(|f| f / MIB)
    );
    assert!(b2.inflated_pages - b1.inflated_pages >= 128 * MIB / 4096);
    assert!(
        rss0.saturating_sub(rss1) >= 112 * 1024,
        "RSS fell by only {} KiB for 128 MiB inflated",
        rss0.saturating_sub(rss1)
    );
    let (out, _, _) = sh(&c, "echo still here");
    assert_eq!(out, "still here\n");
    let (b3, _) = balloon_until(&r, "stats of the inflated guest", |b| {
        b.stats.total_memory.is_some_and(|t| t <= total - 120 * MIB)
    });
    assert_eq!((b3.refused, b3.give_back_errors), (0, 0), "{b3:?}");

    // Deflate.
    let (b4, t) = inflate_to(&r, 0);
    eprintln!("deflated to 0 in {t:?}: {b4:?}");
    assert!(b4.deflated_pages - b3.deflated_pages >= 128 * MIB / 4096);

    // 15 MiB of bytes in the snapshot, in the buffer of a process (dd,
    // blocked writing into a pipe no one reads): killed in each clone, its
    // pages are freed, reported and given back there, and must then read
    // zeros, not the bytes the snapshot holds. The snapshot waits until dd
    // holds its buffer (its read is the emulated guest kernel copying 16
    // MiB: seconds on a loaded PVM host).
    let (out, err, _) = sh(
        &c,
        "for i in 1 2 3 4 5 6 7 8; do cat /bin/busybox; done > /tmp/fill; \
         (dd if=/tmp/fill bs=16M count=1 2>/dev/null | sleep 100000) </dev/null >/dev/null 2>&1 & \
         i=0; while [ $i -lt 120 ]; do \
           r=$(grep VmRSS /proc/$(pidof dd)/status 2>/dev/null | tr -cd 0-9); \
           [ \"${r:-0}\" -ge 15000 ] && break; i=$((i+1)); sleep 1; done; \
         rm /tmp/fill; pidof dd; echo rss=${r:-0}",
    );
    assert!(
        out.lines()
            .find_map(|l| l.strip_prefix("rss="))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|kib| kib >= 15000),
        "dd did not come to hold its 16 MiB buffer within 2 minutes: {out}{err}"
    );
    eprintln!("filled: dd {out}{err}");
    drop(c);
    let snap = tempfile::tempdir().unwrap();
    let info = api(&r).snapshot(snap.path(), false).expect("snapshot");
    eprintln!("snapshot: {info:?}");
    drop(r);

    let mut had_data = 0;
    for name in ["first", "second"] {
        let (r, c) = RunningSandbox::start(snap.path());
        let pid = r.vmm_pid();
        let (b, _) = balloon_until(&r, "clone stats", |b| b.stats.free_memory.is_some());
        let free0 = b.stats.free_memory.unwrap();
        let (_, t) = inflate_to(&r, 64);
        let (b, _) = balloon_until(&r, "clone stats after inflating", |x| {
            x.stats.free_memory.is_some_and(|f| f + 48 * MIB <= free0)
        });
        let (out, _, st) = sh(&c, "kill $(pidof dd) && echo killed");
        assert_eq!(out, "killed\n", "{st:?}");
        let (b2, tr) = balloon_until(&r, "the killed process's memory reported", |x| {
            x.reported_bytes >= b.reported_bytes + 8 * MIB
        });
        eprintln!(
            "{name} clone: {} MiB reported within {tr:?} of the kill",
            (b2.reported_bytes - b.reported_bytes) / MIB
        );
        assert_eq!((b2.refused, b2.give_back_errors), (0, 0), "{b2:?}");
        let (out, _, _) = sh(&c, "echo clone");
        assert_eq!(out, "clone\n");
        // Deflated, the pages are free again: the clone reports them (while
        // it deflates), with the rest of the killed process's memory.
        let d = api(&r).balloon(None).expect("balloon request");
        let (_, td) = inflate_to(&r, 0);
        let (d2, tr) = balloon_until(&r, "the clone's deflated pages reported", |x| {
            x.reported_bytes >= d.reported_bytes + 16 * MIB
        });
        eprintln!(
            "{name} clone: deflated in {td:?}; {} MiB reported within {tr:?}",
            (d2.reported_bytes - d.reported_bytes) / MIB
        );
        assert_eq!((d2.refused, d2.give_back_errors), (0, 0), "{d2:?}");
        // Reporting goes through the free lists a part per pass: let it
        // settle (no new report for 6 s, at most a minute).
        let (mut last, mut quiet, end) = (d2.reported_bytes, 0, Instant::now() + DEADLINE / 4);
        while quiet < 6 && Instant::now() < end {
            std::thread::sleep(Duration::from_secs(1));
            let now = api(&r)
                .balloon(None)
                .expect("balloon request")
                .reported_bytes;
            quiet = if now == last { quiet + 1 } else { 0 };
            last = now;
        }

        // Every page the VMM gave back (inflated or reported) reads zeros
        // (or what the guest wrote there since), never the snapshot's bytes.
        // The first clone's diff snapshot is taken before this process
        // reads its memory (a read maps the zero page over a given-back
        // page, which pagemap would then show as written).
        let ram = guest_ram(pid, &snap.path().join("memory"));
        let diff = (name == "first").then(|| diff_snapshot(&r));
        let g = given_back(pid, &ram, &snap.path().join("memory"));
        had_data += g.had_data;
        eprintln!(
            "{name} clone: inflated to 64 MiB in {t:?}, free {} -> {} MiB; given back {g:?} in \
             {} spans",
            free0 / MIB,
            b.stats.free_memory.unwrap() / MIB,
            ram.replaced.len()
        );
        assert!(
            g.pages >= 66 * MIB / 4096,
            "the clone gave back only {} pages by replacing them",
            g.pages
        );
        assert_eq!(
            g.stale, 0,
            "given-back pages read the snapshot's bytes: {g:?}"
        );
        assert!(
            g.zero * 100 >= g.pages * 95,
            "given-back pages do not read zeros: {g:?}"
        );
        if let Some(diff) = diff {
            restored_diff_reads_zeros(&diff, snap.path(), &ram);
        }
    }
    assert!(
        had_data >= MIB / 4096,
        "too few given-back pages held data in the snapshot to tell zeros from stale bytes: \
         {had_data}"
    );
}

/// A diff snapshot of clone `r` (which goes on).
fn diff_snapshot(r: &RunningSandbox) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let info = api(r).snapshot(dir.path(), true).expect("diff snapshot");
    api(r).resume().expect("resume after the diff snapshot");
    eprintln!("diff snapshot: {} MiB of pages", info.memory_bytes / MIB);
    dir
}

/// The diff snapshot in `dir` (over `base`, the snapshot its clone was
/// restored from), restored: the pages the clone gave back (`ram`'s
/// replaced spans) read zeros there too, not the base's bytes.
fn restored_diff_reads_zeros(dir: &tempfile::TempDir, base: &Path, ram: &GuestRam) {
    let (r2, c2) = RunningSandbox::start(dir.path());
    let pid = r2.vmm_pid();
    let ram2 = GuestRam {
        base: guest_ram(pid, &base.join("memory")).base,
        replaced: ram.replaced.clone(),
    };
    let g = given_back(pid, &ram2, &base.join("memory"));
    eprintln!("restored from the diff snapshot: the given-back pages read {g:?}");
    assert_eq!(
        g.stale, 0,
        "a VM restored from the diff reads the base's bytes where the clone gave pages back: {g:?}"
    );
    let (out, _, _) = sh(&c2, "echo diff");
    assert_eq!(out, "diff\n");
}
