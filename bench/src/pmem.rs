//! `shoal bench pmem`: what a shared read-only root on virtio-pmem with DAX
//! saves over virtio-blk, with many VMs restored from one template.
//!
//! * **Host memory.** For each VM count N (50 and 200 by default), N VMs
//!   are restored from a template of the same image booted once with the
//!   root on pmem+DAX and once on virtio-blk; each guest reads the same set
//!   of files from the image (5 MB). With every VM still alive, the host
//!   memory they cost is the sum over the VMM processes of their private
//!   memory (`Pss_Anon` + `Pss_Shmem` of `/proc/PID/smaps_rollup`: guest
//!   RAM pages the guest wrote, VMM heap) plus the growth of the host page
//!   cache, which holds the shared pages once: the pages of the template
//!   memory file and of the image resident in it (counted per file with
//!   `mincore`, so other work on a shared host does not blur the figure;
//!   the growth of `Cached` in `/proc/meminfo` is reported too). File pages
//!   mapped by the VMMs are in the page cache figure, so `Pss_File` is not
//!   added again. On
//!   virtio-blk each guest copies the files into its own page cache (guest
//!   RAM, private to the VM); with DAX the guests read the host's single
//!   copy of the image. The image and the template memory file are evicted
//!   from the host page cache first (`posix_fadvise(DONTNEED)`), so both
//!   modes start cold.
//! * **Guest page metadata.** With pmem the guest kernel keeps a `struct
//!   page` per 4 KiB of the device in its RAM: 1/64 of the image size
//!   ([`pmem::guest_memmap_overhead`]), paid once per VM at boot (it is in
//!   the template's memory, shared until written).
//! * **Host disk writes.** A guest writes 20 MB to its root file system:
//!   with pmem the writes land in the tmpfs upper layer of the overlay
//!   (guest RAM: no host disk bytes); with a writable root on virtio-blk
//!   each VM needs its own copy of the root image (bytes written for the
//!   copy) and its writes reach that file (the VMM's `write_bytes` in
//!   `/proc/PID/io`).
//!
//! Guests are driven through the agent (`agent_client`) of VMs
//! restored with [`shoal_runtime::template`]. Slow on PVM hosts, where each guest
//! read of 5 MB is seconds of emulated kernel work: VM counts are options.

use super::hostmem::{cached_kib, evict, meminfo_kib, pss_kib, write_bytes};
use super::pmem_report::{mib, reduction_pct};
pub use super::pmem_report::{MemoryRow, PmemReport, WriteRow};
use super::Row;
use crate::stats::summarize;
use agent_client::{Client, ClientError, ExecRequest, ExitStatus};
use shoal_images::image::{build_image_with, AgentSource, BuildOptions, ImageError};
use shoal_runtime::launch::{BootSpec, RootKind, INIT_MARKER};
use shoal_runtime::template::{self, Restored, TemplateError};
use shoal_runtime::vmm_process::{Io, Serial, VmmProcess};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The guest port the agent listens on.
const AGENT_PORT: u32 = agent_proto::VSOCK_PORT;
/// Where the read set lives in the benchmark image.
const READ_DIR: &str = "/bench";

/// Options.
#[derive(Debug, Clone)]
pub struct PmemBenchOpts {
    /// Guest kernel.
    pub kernel: PathBuf,
    /// An erofs root image with the agent (the tiny image); its tree plus
    /// the read set becomes the benchmark image.
    pub base_image: PathBuf,
    /// Our VMM.
    pub vmm: PathBuf,
    /// Base kernel command line.
    pub cmdline: String,
    /// Scratch directory (images, templates, sockets); must not be on
    /// tmpfs for the disk-write figures to mean anything.
    pub workdir: PathBuf,
    /// Guest memory of every VM.
    pub memory_mib: u32,
    /// VM counts measured, each for both root kinds.
    pub vm_counts: Vec<usize>,
    /// Bytes of the read set (split over `read_files` files).
    pub read_bytes: u64,
    /// Files in the read set.
    pub read_files: usize,
    /// Guests reading at the same time.
    pub concurrency: usize,
    /// Bytes each guest writes in the disk-write measurement (0: skip it).
    pub write_bytes: u64,
    /// VMs measured for disk writes, per root kind.
    pub write_vms: usize,
    /// Per-guest command time limit.
    pub guest_timeout: Duration,
}

impl PmemBenchOpts {
    /// The defaults of the issue: 50 and 200 VMs, 5 MB read in 5 files, 2
    /// readers at a time, 20 MB written by one VM per kind.
    pub fn new(
        kernel: PathBuf,
        base_image: PathBuf,
        vmm: PathBuf,
        cmdline: String,
        workdir: PathBuf,
    ) -> Self {
        Self {
            kernel,
            base_image,
            vmm,
            cmdline,
            workdir,
            memory_mib: 128,
            vm_counts: vec![50, 200],
            read_bytes: 5_000_000,
            read_files: 5,
            concurrency: 2,
            write_bytes: 20_000_000,
            write_vms: 1,
            guest_timeout: Duration::from_secs(600),
        }
    }
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum PmemBenchError {
    /// Building the benchmark image.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// Booting or restoring a template.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// Talking to a guest agent.
    #[error("guest agent: {0}")]
    Agent(#[from] ClientError),
    /// A guest command failed.
    #[error("guest command `{cmd}` failed ({status:?}): {output}")]
    Guest {
        /// The command.
        cmd: String,
        /// How it ended.
        status: ExitStatus,
        /// Its output.
        output: String,
    },
    /// A host tool or file operation failed.
    #[error("{0}")]
    Host(String),
}

fn host_err(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> PmemBenchError {
    let what = what.to_string();
    move |e| PmemBenchError::Host(format!("{what}: {e}"))
}

/// A VM restored for the benchmark.
struct Vm {
    restored: Restored,
    vsock: PathBuf,
}

impl Vm {
    fn start(vmm: &Path, tpl: &Path, dir: &Path, name: &str) -> Result<Vm, PmemBenchError> {
        let sock = dir.join(format!("{name}.api"));
        let vsock = dir.join(format!("{name}.vsock"));
        let restored = template::spawn_restore(
            VmmProcess::restore(vmm, tpl)
                .api_sock(&sock)
                .vsock_uds(&vsock)
                .serial(Serial::Null)
                .stdout(Io::Null),
        )?;
        Ok(Vm { restored, vsock })
    }

    fn connect(&self, timeout: Duration) -> Result<Client, PmemBenchError> {
        let c = Client::connect_vsock_retry(&self.vsock, AGENT_PORT, timeout)?;
        c.post_restore(
            shoal_runtime::fresh::entropy(),
            shoal_runtime::fresh::unix_nanos(),
        )?;
        Ok(c)
    }

    fn pid(&self) -> u32 {
        self.restored.child.id()
    }

    fn stop(self) {
        // The VMM's stderr is piped; drain it in `shutdown`.
        let _ = self.restored.shutdown();
        let _ = std::fs::remove_file(&self.vsock);
    }
}

/// Runs `script` with `sh -c` in the guest; returns its stdout.
fn guest_sh(c: &Client, script: &str, timeout: Duration) -> Result<String, PmemBenchError> {
    let mut req = ExecRequest::argv(["/bin/sh", "-c", script]);
    req.timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let out = c.exec_simple(&req)?;
    if out.result.status != ExitStatus::Exited(0) {
        return Err(PmemBenchError::Guest {
            cmd: script.into(),
            status: out.result.status,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run_tool(cmd: &mut Command) -> Result<(), PmemBenchError> {
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(host_err(format!("cannot run {:?}", cmd.get_program())))?;
    if !out.status.success() {
        return Err(PmemBenchError::Host(format!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Builds the benchmark images: the base tree plus the read set, as a
/// DAX-ready erofs (for pmem and read-only virtio-blk) and as a writable
/// ext4 (sized for the write workload).
fn build_images(
    o: &PmemBenchOpts,
    progress: &mut dyn FnMut(&str),
) -> Result<(PathBuf, PathBuf), PmemBenchError> {
    let root = o.workdir.join("root");
    let _ = std::fs::remove_dir_all(&root);
    run_tool(
        Command::new("fsck.erofs")
            .arg(format!("--extract={}", root.display()))
            .arg(&o.base_image),
    )?;
    let dir = root.join(READ_DIR.trim_start_matches('/'));
    std::fs::create_dir_all(&dir).map_err(host_err(dir.display()))?;
    let files = o.read_files.max(1);
    let per = o.read_bytes / files as u64;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..files {
        let len = if i + 1 == files {
            o.read_bytes - per * (files as u64 - 1)
        } else {
            per
        };
        // Incompressible, distinct content.
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect();
        let p = dir.join(format!("f{i}"));
        std::fs::write(&p, data).map_err(host_err(p.display()))?;
    }
    let erofs = o.workdir.join("bench.erofs");
    let info = build_image_with(
        shoal_images::image::ImageSource::Dir(root.clone()),
        &erofs,
        &BuildOptions {
            agent: AgentSource::None,
        },
    )?;
    progress(&format!(
        "benchmark image {} ({} bytes, {} MB to read in {files} files)",
        erofs.display(),
        info.len,
        o.read_bytes as f64 / 1e6
    ));
    let ext4 = o.workdir.join("bench-rw.ext4");
    if o.write_bytes > 0 {
        let size_mib = info.fs_bytes / (1 << 20) + o.write_bytes / (1 << 20) + 64;
        let _ = std::fs::remove_file(&ext4);
        run_tool(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-b", "4096"])
                // Inode tables and journal zeroed here, not by the guest.
                .args(["-E", "lazy_itable_init=0,lazy_journal_init=0", "-d"])
                .arg(&root)
                .arg(&ext4)
                .arg(format!("{size_mib}M")),
        )?;
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok((erofs, ext4))
}

fn spec(o: &PmemBenchOpts, root: &Path, kind: RootKind, vsock: PathBuf) -> BootSpec {
    BootSpec {
        kernel: o.kernel.clone(),
        root: root.to_path_buf(),
        root_kind: kind,
        cmdline: o.cmdline.clone(),
        init_args: vec![],
        memory_mib: o.memory_mib,
        vcpus: 1,
        vsock_uds: Some(vsock),
        extra_pmem: vec![],
        upper_disk: None,
        upper_size_mib: None,
    }
}

/// Boots `root` as `kind` and snapshots it when the agent is ready.
fn make_template(
    o: &PmemBenchOpts,
    root: &Path,
    kind: RootKind,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, PmemBenchError> {
    let dir = o.workdir.join(format!("template-{}", kind.name()));
    let _ = std::fs::remove_dir_all(&dir);
    progress(&format!("booting the {} template...", kind.name()));
    let vsock = o.workdir.join(format!("boot-{}.vsock", kind.name()));
    let t = Instant::now();
    template::make(
        &spec(o, root, kind, vsock.clone()),
        &o.vmm,
        &dir,
        INIT_MARKER,
        Duration::from_secs(900),
    )?;
    let _ = std::fs::remove_file(&vsock);
    progress(&format!(
        "{} template ready in {:.1} s",
        kind.name(),
        t.elapsed().as_secs_f64()
    ));
    Ok(dir)
}

/// One pass over `counts` (ascending) VMs from `tpl`: VMs are restored and
/// read `o.concurrency` at a time, each paused once its read is done, and
/// the host memory of all of them (alive, paused) is measured whenever
/// their number reaches the next count. Pausing changes no memory; it keeps
/// the finished VMs from competing for the CPU with the ones being read (on
/// a 2-core PVM host 200 restored guests running at once starved each
/// other: no read finished in 10 minutes). A count's figures are those of
/// a separate run with that many VMs: the VMs are independent.
fn memory_pass(
    o: &PmemBenchOpts,
    tpl: &Path,
    image: &Path,
    kind: RootKind,
    counts: &[usize],
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<(MemoryRow, Vec<f64>)>, PmemBenchError> {
    let dir = o.workdir.join(format!("run-{}", kind.name()));
    std::fs::create_dir_all(&dir).map_err(host_err(dir.display()))?;
    evict(image);
    evict(&tpl.join("memory"));
    let files =
        || i64::try_from(cached_kib(image) + cached_kib(&tpl.join("memory"))).unwrap_or(i64::MAX);
    let cached0 = meminfo_kib("Cached:");
    let files0 = files();
    let avail0 = meminfo_kib("MemAvailable:");
    let vms: Mutex<Vec<Vm>> = Mutex::new(Vec::new());
    let times = Mutex::new(Vec::new());
    let errors = AtomicUsize::new(0);
    let first_err = Mutex::new(None);
    let next = AtomicUsize::new(0);
    let script = format!("cat {READ_DIR}/* > /dev/null");
    let mut out = Vec::new();
    let t0 = Instant::now();
    for &n in counts {
        std::thread::scope(|s| {
            for _ in 0..o.concurrency.max(1) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        // Not taken: the next checkpoint's workers start here.
                        next.fetch_min(n, Ordering::Relaxed);
                        break;
                    }
                    let vm = match Vm::start(&o.vmm, tpl, &dir, &format!("vm{i}")) {
                        Ok(vm) => vm,
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            lock(&first_err).get_or_insert(e.to_string());
                            continue;
                        }
                    };
                    let r = vm.connect(Duration::from_secs(300)).and_then(|c| {
                        let t = Instant::now();
                        guest_sh(&c, &script, o.guest_timeout)?;
                        Ok(t.elapsed().as_secs_f64() * 1e3)
                    });
                    match r {
                        Ok(ms) => lock(&times).push(ms),
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            lock(&first_err).get_or_insert(e.to_string());
                        }
                    }
                    let _ =
                        vmm_api::Client::new(&vm.restored.sock, Duration::from_secs(30)).pause();
                    lock(&vms).push(vm);
                });
            }
        });
        if let Some(e) = lock(&first_err).take() {
            progress(&format!("{}: a VM failed: {e}", kind.name()));
        }
        // Let the VMMs settle (vsock buffers, freed pages) before sampling.
        std::thread::sleep(Duration::from_millis(500));
        let vms = lock(&vms);
        let (mut private, mut pss) = (0u64, 0u64);
        let mut per_vm = Vec::with_capacity(vms.len());
        for vm in vms.iter() {
            let (p, all) = pss_kib(vm.pid());
            private += p;
            pss += all;
            per_vm.push(all as f64 / 1024.0);
        }
        // One lock: two in one statement (a struct literal) deadlock.
        let read_samples = lock(&times).clone();
        let growth = files() - files0;
        let total = i64::try_from(private).unwrap_or(i64::MAX) + growth;
        let m = MemoryRow {
            root: kind.name().into(),
            vms: vms.len(),
            read_errors: errors.load(Ordering::Relaxed),
            vmm_private_kib: private,
            vmm_pss_kib: pss,
            page_cache_growth_kib: growth,
            host_cached_growth_kib: meminfo_kib("Cached:") - cached0,
            host_total_kib: total,
            host_per_vm_kib: total as f64 / vms.len().max(1) as f64,
            mem_available_drop_kib: avail0 - meminfo_kib("MemAvailable:"),
            read_ms: summarize(&read_samples),
            read_samples,
        };
        progress(&format!(
            "{} x{}: host {:.1} MiB ({:.2} MiB/VM: VMM private {:.1} MiB + page cache {:+.1} MiB), \
             {} errors, {:.0} s so far",
            kind.name(),
            m.vms,
            mib(m.host_total_kib as f64),
            mib(m.host_per_vm_kib),
            mib(m.vmm_private_kib as f64),
            mib(m.page_cache_growth_kib as f64),
            m.read_errors,
            t0.elapsed().as_secs_f64()
        ));
        out.push((m, per_vm));
    }
    for vm in std::mem::take(&mut *lock(&vms)) {
        vm.stop();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Host disk bytes for one VM writing `o.write_bytes` to its root.
fn write_run(
    o: &PmemBenchOpts,
    tpl: &Path,
    kind: RootKind,
    golden: Option<&Path>,
    disk_link: &Path,
) -> Result<WriteRow, PmemBenchError> {
    let dir = o.workdir.join(format!("write-{}", kind.name()));
    std::fs::create_dir_all(&dir).map_err(host_err(dir.display()))?;
    let script = format!(
        "dd if=/dev/zero of=/root/bench-write bs=1000000 count={} 2>/dev/null && sync",
        o.write_bytes / 1_000_000
    );
    let (mut copy, mut vmm, mut ms) = (0u64, 0u64, 0f64);
    for i in 0..o.write_vms.max(1) {
        if let Some(golden) = golden {
            // The VM's own copy of the root, put where the template's
            // configuration points (a symlink, repointed per VM).
            let mine = dir.join(format!("root-{i}.ext4"));
            let before = write_bytes("self");
            std::fs::copy(golden, &mine).map_err(host_err(mine.display()))?;
            let f = std::fs::File::open(&mine).map_err(host_err(mine.display()))?;
            f.sync_all().map_err(host_err(mine.display()))?;
            copy += write_bytes("self").saturating_sub(before);
            let tmp = disk_link.with_extension("link-tmp");
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&mine, &tmp).map_err(host_err(tmp.display()))?;
            std::fs::rename(&tmp, disk_link).map_err(host_err(disk_link.display()))?;
        }
        let vm = Vm::start(&o.vmm, tpl, &dir, &format!("w{i}"))?;
        let pid = vm.pid().to_string();
        let r = vm.connect(Duration::from_secs(120)).and_then(|c| {
            let before = write_bytes(&pid);
            let t = Instant::now();
            guest_sh(&c, &script, o.guest_timeout)?;
            ms += t.elapsed().as_secs_f64() * 1e3;
            Ok(write_bytes(&pid).saturating_sub(before))
        });
        vm.stop();
        vmm += r?;
        if golden.is_some() {
            let _ = std::fs::remove_file(dir.join(format!("root-{i}.ext4")));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let k = o.write_vms.max(1) as f64;
    Ok(WriteRow {
        root: kind.name().into(),
        guest_bytes: o.write_bytes / 1_000_000 * 1_000_000,
        vms: o.write_vms.max(1),
        copy_bytes: copy as f64 / k,
        vmm_write_bytes: vmm as f64 / k,
        host_bytes_per_vm: (copy + vmm) as f64 / k,
        write_ms: ms / k,
    })
}

/// Runs the benchmark.
pub fn run(
    o: &PmemBenchOpts,
    progress: &mut dyn FnMut(&str),
) -> Result<PmemReport, PmemBenchError> {
    std::fs::create_dir_all(&o.workdir).map_err(host_err(o.workdir.display()))?;
    let (erofs, ext4) = build_images(o, progress)?;
    let image_bytes = std::fs::metadata(&erofs)
        .map_err(host_err(erofs.display()))?
        .len();
    let pmem_tpl = make_template(o, &erofs, RootKind::Pmem, progress)?;
    let blk_tpl = make_template(o, &erofs, RootKind::Blk, progress)?;

    let mut memory = Vec::new();
    let mut rows = Vec::new();
    let mut counts = o.vm_counts.clone();
    counts.sort_unstable();
    counts.dedup();
    for (kind, tpl) in [(RootKind::Pmem, &pmem_tpl), (RootKind::Blk, &blk_tpl)] {
        for (m, per_vm) in memory_pass(o, tpl, &erofs, kind, &counts, progress)? {
            let n = m.vms;
            rows.push(Row {
                system: kind.name().into(),
                metric: format!("host_mem_per_vm@{n}"),
                n,
                min: mib(m.host_per_vm_kib),
                median: mib(m.host_per_vm_kib),
                p99: mib(m.host_per_vm_kib),
                max: mib(m.host_per_vm_kib),
            });
            if let Some(s) = summarize(&per_vm) {
                rows.push(Row {
                    system: kind.name().into(),
                    metric: format!("vmm_pss@{n}"),
                    n: s.n,
                    min: s.min,
                    median: s.median,
                    p99: s.p99,
                    max: s.max,
                });
            }
            memory.push(m);
        }
    }

    let mut writes = Vec::new();
    if o.write_bytes > 0 {
        progress(&format!(
            "disk writes: a guest writes {} MB (pmem: tmpfs upper layer)...",
            o.write_bytes / 1_000_000
        ));
        writes.push(write_run(
            o,
            &pmem_tpl,
            RootKind::Pmem,
            None,
            Path::new(""),
        )?);
        // The writable root: the template boots from a symlink to the
        // pristine ext4 image; what the disk holds at the snapshot is the
        // "golden" copy every VM starts from.
        let link = o.workdir.join("rw-root.ext4");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&ext4, &link).map_err(host_err(link.display()))?;
        let rw_tpl = make_template(o, &link, RootKind::BlkExt4Rw, progress)?;
        progress("disk writes: a writable per-VM copy of the root on virtio-blk...");
        writes.push(write_run(
            o,
            &rw_tpl,
            RootKind::BlkExt4Rw,
            Some(&ext4),
            &link,
        )?);
        for w in &writes {
            rows.push(Row {
                system: w.root.clone(),
                metric: "disk_written_per_vm".into(),
                n: w.vms,
                min: w.host_bytes_per_vm / 1048576.0,
                median: w.host_bytes_per_vm / 1048576.0,
                p99: w.host_bytes_per_vm / 1048576.0,
                max: w.host_bytes_per_vm / 1048576.0,
            });
        }
        let _ = std::fs::remove_file(&link);
    }
    let host_memory_reduction_pct = o
        .vm_counts
        .iter()
        .filter_map(|&n| {
            let of = |root: &str| {
                memory
                    .iter()
                    .find(|m| m.vms == n && m.root == root)
                    .map(|m| m.host_total_kib as f64)
            };
            Some((n, reduction_pct(of("pmem")?, of("blk")?)))
        })
        .collect();
    let disk_write_reduction_pct = match writes.as_slice() {
        [p, b] => Some(reduction_pct(p.host_bytes_per_vm, b.host_bytes_per_vm)),
        _ => None,
    };
    Ok(PmemReport {
        bench: "pmem",
        host_kvm: vmm::host::kvm_kind().as_str(),
        unit: "MiB",
        rows,
        image_bytes,
        read_bytes: o.read_bytes,
        read_files: o.read_files.max(1),
        pmem_guest_memmap_bytes: pmem::guest_memmap_overhead(image_bytes),
        memory_mib: o.memory_mib,
        memory,
        writes,
        host_memory_reduction_pct,
        disk_write_reduction_pct,
    })
}
