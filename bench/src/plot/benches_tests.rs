//! Each bench's figures from a report made by hand: the files named after
//! the JSON, valid PNGs, and no figure for data the run did not produce.

use super::*;
use crate::jail_ab::{AbRate, JailAb};
use crate::load::{Burst, Level};
use crate::pmem_report::{MemoryRow, WriteRow};
use crate::prewarm::PrewarmReport;
use crate::restore::Rate;
use crate::stats::summarize;

fn out(d: &tempfile::TempDir, json: &str) -> Out {
    Out {
        dir: d.path().into(),
        stem: json.trim_end_matches(".json").into(),
        host: "pvm".into(),
    }
}

/// The file names written, and each is a PNG of the figure size.
fn names(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|f| {
            let data = std::fs::read(f).unwrap();
            assert_eq!(&data[..8], b"\x89PNG\r\n\x1a\n", "{}", f.display());
            // IHDR: width and height, big-endian, at bytes 16..24.
            let w = u32::from_be_bytes(data[16..20].try_into().unwrap());
            let h = u32::from_be_bytes(data[20..24].try_into().unwrap());
            assert_eq!((w, h), (super::super::WIDTH, super::super::HEIGHT));
            f.file_name().unwrap().to_string_lossy().into_owned()
        })
        .collect()
}

/// The legend labels (or bar labels) of planned figure `name`.
fn labels(f: &Figs, name: &str) -> Vec<String> {
    let p = f
        .planned
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no figure {name}: {:?}", f.planned));
    match &p.kind {
        Kind::Cdf(s) => s.iter().map(|s| s.label.clone()).collect(),
        Kind::Xy(s) => s
            .iter()
            .map(|s| format!("{} x{}", s.label, s.points.len()))
            .collect(),
        Kind::Bars(b) => b.iter().map(|b| b.label.clone()).collect(),
    }
}

fn ramp(n: u32, base: f64) -> Vec<f64> {
    (0..n).map(|i| base + f64::from(i) * 0.5).collect()
}

#[test]
fn boot_figures() {
    let d = tempfile::tempdir().unwrap();
    let r = BootReport {
        bench: "boot",
        host_kvm: "pvm",
        unit: "ms",
        rows: vec![],
        ratio_peer_over_shoal: vec![("init_marker".into(), 1.8)],
        own_memory_kib: vec![("shoal".into(), 3000), ("qemu-microvm".into(), 40000)],
        failures: vec![],
        samples: vec![
            Samples::new("shoal", "init_marker", ramp(5, 100.0)),
            Samples::new("qemu-microvm", "init_marker", ramp(5, 180.0)),
            Samples::new("shoal", "vmm_exit", ramp(5, 120.0)),
        ],
    };
    let o = out(&d, "bench-boot.json");
    let f = boot_figs(&r, &o);
    assert_eq!(labels(&f, "cdf-init-marker"), ["shoal", "qemu-microvm"]);
    assert_eq!(labels(&f, "cdf-vmm-exit"), ["shoal"]);
    assert_eq!(labels(&f, "memory"), ["shoal", "qemu-microvm"]);
    assert!(
        f.planned[0].fig.subtitle.contains("1.80x"),
        "{:?}",
        f.planned[0]
    );
    let files = boot(&r, &o).unwrap();
    assert_eq!(
        names(&files),
        [
            "bench-boot-cdf-init-marker.png",
            "bench-boot-cdf-vmm-exit.png",
            "bench-boot-memory.png"
        ]
    );
}

#[test]
fn restore_figures() {
    let d = tempfile::tempdir().unwrap();
    let rate = |k: usize, s: f64| Rate {
        concurrency: k,
        restores: 10,
        errors: 0,
        per_second: s,
    };
    let r = RestoreReport {
        bench: "restore",
        host_kvm: "pvm",
        unit: "ms",
        rows: vec![],
        snapshot_create_ms: 400.0,
        snapshot_state_bytes: 12000,
        snapshot_memory_bytes: 128 << 20,
        rates: vec![rate(1, 30.0), rate(2, 50.0)],
        pss_kib_mean: 1800.0,
        pss_kib_max: 1900.0,
        pss_vms: 4,
        latency_errors: 0,
        prewarmed: Some(PrewarmReport {
            restore_ms: None,
            request_rtt_ms: None,
            rate_per_second: 1100.0,
            workers: 2,
            errors: 0,
            restore_samples: ramp(10, 5.0),
        }),
        jail_ab: Some(JailAb {
            rows: vec![],
            rates: vec![AbRate {
                concurrency: 1,
                plain_per_second: 30.0,
                jailed_per_second: 25.0,
                errors: (0, 0),
            }],
            errors: (0, 0),
            stock_rows: vec![],
            stock_errors: [0; 4],
            samples: vec![
                Samples::new("shoal jailed", "restore_to_vcpu_run", ramp(10, 9.0)),
                Samples::new("shoal unjailed", "restore_to_vmm_start", ramp(10, 0.5)),
                Samples::new("shoal jailed", "restore_to_vmm_start", ramp(10, 2.0)),
            ],
        }),
        memory_mib: 128,
        samples: vec![
            Samples::new("shoal", "restore_to_vcpu_run", ramp(10, 4.0)),
            Samples::new("shoal", "restore_to_first_output", ramp(10, 8.0)),
        ],
    };
    let o = out(&d, "r.json");
    let f = restore_figs(&r, &o);
    assert_eq!(
        labels(&f, "cdf-vcpu-run"),
        [
            "shoal: new VMM process",
            "shoal: into a pre-warmed VM (request to vCPUs running)",
            "shoal jailed, A/B run"
        ]
    );
    assert_eq!(labels(&f, "cdf-first-output"), ["shoal: new VMM process"]);
    assert_eq!(
        labels(&f, "cdf-vmm-start"),
        ["shoal unjailed, A/B run", "shoal jailed, A/B run"]
    );
    assert_eq!(
        labels(&f, "rate"),
        [
            "shoal: new VMM per restore x2",
            "shoal, A/B run: plain x1",
            "shoal, A/B run: jailed x1",
            "shoal: pre-warmed VMs (one per worker) x1"
        ]
    );
    let files = restore(&r, &o).unwrap();
    assert_eq!(
        names(&files),
        [
            "r-cdf-vcpu-run.png",
            "r-cdf-first-output.png",
            "r-cdf-vmm-start.png",
            "r-rate.png",
            "r-memory.png"
        ]
    );
}

#[test]
fn exec_figures_and_a_run_without_samples() {
    let d = tempfile::tempdir().unwrap();
    let mut r = ExecReport {
        bench: "exec",
        host_kvm: "pvm",
        unit: "ms",
        rows: vec![],
        stdout_mb_s: 100.0,
        upload_mb_s: 50.0,
        download_mb_s: 70.0,
        bytes: 8 << 20,
        agent_syscalls_per_exec: None,
        agent_syscalls_per_mib_upload: None,
        agent_syscalls_per_mib_download: None,
        syscall_note: None,
        samples: vec![
            Samples::new("shoal", "exec_true_rtt", ramp(20, 1.0)),
            Samples::new("shoal", "restore_to_agent_ready", ramp(5, 30.0)),
            Samples::new("shoal", "restore_to_vsock_socket", ramp(5, 3.0)),
        ],
    };
    let files = exec(&r, &out(&d, "e.json")).unwrap();
    assert_eq!(
        names(&files),
        ["e-cdf-exec.png", "e-cdf-restore.png", "e-throughput.png"]
    );
    // No latency samples: only the throughput bars.
    r.samples.clear();
    let d = tempfile::tempdir().unwrap();
    assert_eq!(
        names(&exec(&r, &out(&d, "e.json")).unwrap()),
        ["e-throughput.png"]
    );
    // A value that is not a number is an error, not a panic.
    r.upload_mb_s = f64::NAN;
    let e = exec(&r, &out(&d, "e.json")).unwrap_err();
    assert!(matches!(e, PlotError::NotFinite { .. }), "{e}");
}

#[test]
fn load_figures() {
    let d = tempfile::tempdir().unwrap();
    let level = |k: usize, per_s: f64| {
        let cy = ramp(10, 100.0 * k as f64);
        Level {
            concurrency: k,
            cycles: 10,
            errors: 0,
            error_samples: vec![],
            sandboxes_per_s: per_s,
            create_ms: summarize(&ramp(10, 20.0)),
            exec_ms: None,
            destroy_ms: summarize(&ramp(10, 5.0)),
            cycle_ms: summarize(&cy),
            cycle_samples: cy,
        }
    };
    let r = LoadReport {
        bench: "load",
        host_kvm: "pvm",
        unit: "ms",
        exec: vec!["true".into()],
        levels: vec![level(1, 5.0), level(10, 20.0)],
        create_rate: vec![Burst {
            source: "warm pool".into(),
            n: 10,
            errors: 0,
            per_s: 100.0,
            create_ms: None,
            pool_hits: 10,
            create_samples: ramp(10, 2.0),
        }],
        idle: None,
    };
    let o = out(&d, "l.json");
    let f = load_figs(&r, &o);
    assert_eq!(labels(&f, "throughput"), ["shoald x2"]);
    // No exec step measured: no exec lines.
    assert_eq!(
        labels(&f, "latency"),
        [
            "cycle p50 x2",
            "cycle p99 x2",
            "create p50 x2",
            "create p99 x2",
            "destroy p50 x2",
            "destroy p99 x2"
        ]
    );
    assert_eq!(labels(&f, "cdf-cycle"), ["1 concurrent", "10 concurrent"]);
    assert_eq!(labels(&f, "cdf-create-burst"), ["warm pool (100/s)"]);
    let files = load(&r, &o).unwrap();
    assert_eq!(
        names(&files),
        [
            "l-throughput.png",
            "l-latency.png",
            "l-cdf-cycle.png",
            "l-cdf-create-burst.png"
        ]
    );
    // --no-exec: the exec step's times (all 0) are not drawn.
    let mut r = LoadReport {
        exec: vec![],
        create_rate: vec![],
        ..r
    };
    r.levels[0].exec_ms = summarize(&[0.0, 0.0]);
    let f = load_figs(&r, &o);
    assert!(!labels(&f, "latency").iter().any(|l| l.starts_with("exec")));
    assert!(f.planned.iter().all(|p| p.name != "cdf-create-burst"));
}

#[test]
fn pmem_figures() {
    let d = tempfile::tempdir().unwrap();
    let row = |root: &str, vms: usize, per_vm_kib: i64| MemoryRow {
        root: root.into(),
        vms,
        read_errors: 0,
        vmm_private_kib: 0,
        vmm_pss_kib: 0,
        page_cache_growth_kib: 0,
        host_cached_growth_kib: 0,
        host_total_kib: per_vm_kib * i64::try_from(vms).unwrap(),
        host_per_vm_kib: per_vm_kib as f64,
        mem_available_drop_kib: 0,
        read_ms: None,
        read_samples: ramp(u32::try_from(vms).unwrap(), 500.0),
    };
    let r = PmemReport {
        bench: "pmem",
        host_kvm: "pvm",
        unit: "MiB",
        rows: vec![],
        image_bytes: 64 << 20,
        read_bytes: 5_000_000,
        read_files: 5,
        pmem_guest_memmap_bytes: 1 << 20,
        memory_mib: 128,
        memory: vec![
            // Interleaved, as the bench may list them.
            row("pmem", 2, 3000),
            row("blk", 2, 9000),
            row("pmem", 4, 2800),
            row("blk", 4, 8500),
        ],
        writes: vec![WriteRow {
            root: "pmem".into(),
            guest_bytes: 20_000_000,
            vms: 1,
            copy_bytes: 0.0,
            vmm_write_bytes: 0.0,
            host_bytes_per_vm: 0.0,
            write_ms: 100.0,
        }],
        host_memory_reduction_pct: vec![],
        disk_write_reduction_pct: None,
    };
    let o = out(&d, "p.json");
    let f = pmem_figs(&r, &o);
    let both = [
        "virtio-pmem + DAX (shared) x2",
        "virtio-blk (per-guest page cache) x2",
    ];
    assert_eq!(labels(&f, "memory-per-vm"), both);
    assert_eq!(labels(&f, "memory"), both);
    assert_eq!(labels(&f, "disk"), ["pmem"]);
    let files = pmem(&r, &o).unwrap();
    assert_eq!(
        names(&files),
        [
            "p-memory-per-vm.png",
            "p-memory.png",
            "p-cdf-read.png",
            "p-disk.png"
        ]
    );
}
