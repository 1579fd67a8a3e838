//! Restores into pre-warmed VMs (`shoal-vmm --prewarm`): the KVM VM, its
//! memory slots and vCPUs already exist, so a restore only maps the
//! snapshot's memory over the slot and loads device and vCPU state. A pool
//! of such VMs also recycles each one for the next sandbox instead of
//! tearing it down.

use crate::stats::{summarize, Summary};
use serde::Serialize;
use shoal_runtime::launch::monotonic_ns;
use shoal_runtime::template::{self, TemplateError};
use shoal_runtime::vmm_process::{Io, Serial, VmmProcess};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmm_api::Client;

/// Results.
#[derive(Debug, Serialize)]
pub struct PrewarmReport {
    /// `restore` request sent to vCPUs running (the VMM's own timing), ms.
    pub restore_ms: Option<Summary>,
    /// `restore` request round trip seen by the caller, ms.
    pub request_rtt_ms: Option<Summary>,
    /// Restores per second with `workers` pre-warmed VMs each reloading in
    /// a loop.
    pub rate_per_second: f64,
    /// Pre-warmed VMs used for the rate.
    pub workers: usize,
    /// Failed requests.
    pub errors: usize,
    /// The samples behind `restore_ms` (figures only).
    #[serde(skip)]
    pub restore_samples: Vec<f64>,
}

struct Warm {
    child: Child,
    sock: PathBuf,
}

fn spawn(vmm: &Path, dir: &Path, i: usize, memory_mib: u32) -> std::io::Result<Warm> {
    let sock = dir.join(format!("warm-{i}.sock"));
    let _ = std::fs::remove_file(&sock);
    let child = VmmProcess::prewarm(vmm)
        .memory_mib(memory_mib)
        .serial(Serial::Null)
        .api_sock(&sock)
        .vsock_uds(dir.join(format!("warm-{i}.vsock")))
        .stdin(Io::Null)
        .stdout(Io::Null)
        .stderr(Io::Null)
        .spawn()
        .map_err(std::io::Error::other)?
        .child;
    let end = Instant::now() + Duration::from_secs(30);
    while Client::new(&sock, Duration::from_secs(5)).stats().is_err() {
        if Instant::now() > end {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(Warm { child, sock })
}

impl Warm {
    fn restore(&self, tpl: &Path) -> Result<(f64, f64), String> {
        let t0 = Instant::now();
        let r = Client::new(&self.sock, Duration::from_secs(60))
            .restore(tpl, &[])
            .map_err(|e| e.to_string())?;
        let rtt = t0.elapsed().as_secs_f64() * 1e3;
        Ok((r.restore_ms, rtt))
    }

    fn stop(mut self) {
        let _ = Client::new(&self.sock, Duration::from_secs(10)).shutdown();
        let _ = self.child.wait();
    }
}

/// Times `n` restores into one pre-warmed VM, then the rate of `workers`
/// pre-warmed VMs restoring `per_worker` times each.
pub fn run(
    vmm: &Path,
    tpl: &Path,
    dir: &Path,
    memory_mib: u32,
    n: usize,
    workers: usize,
    per_worker: usize,
) -> std::io::Result<PrewarmReport> {
    let w = spawn(vmm, dir, 0, memory_mib)?;
    let (mut own, mut rtt, mut errors) = (vec![], vec![], 0);
    for _ in 0..n {
        match w.restore(tpl) {
            Ok((a, b)) => {
                own.push(a);
                rtt.push(b);
            }
            Err(_) => errors += 1,
        }
    }
    w.stop();
    let warms: Vec<Warm> = (0..workers)
        .map(|i| spawn(vmm, dir, i + 1, memory_mib))
        .collect::<std::io::Result<_>>()?;
    let errs = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for w in &warms {
            let errs = errs.clone();
            s.spawn(move || {
                for _ in 0..per_worker {
                    if w.restore(tpl).is_err() {
                        errs.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    for w in warms {
        w.stop();
    }
    Ok(PrewarmReport {
        restore_ms: summarize(&own),
        restore_samples: own.clone(),
        request_rtt_ms: summarize(&rtt),
        rate_per_second: (workers * per_worker) as f64 / secs,
        workers,
        errors: errors + errs.load(Ordering::Relaxed),
    })
}

/// How long a pre-warmed VMM is left alone between its start and the
/// restore timed into it (a stocked VMM waits seconds; one restored at
/// once still competes with its own start-up: its threads' first runs,
/// seccomp filters, the jailer's supervisor).
pub const SETTLE: Duration = Duration::from_millis(SETTLE_MS);
const SETTLE_MS: u64 = 50;

/// One restore into a VMM pre-warmed for it (`--prewarm --once`, jailed in
/// `jail`'s sandbox directory, `sock`'s, when given: a stocked VMM as the
/// daemon keeps them), timed from the `restore` request: (to vCPUs
/// running, to the request's reply, to the guest's first output), ms. The
/// VMM's start (and its jail's set-up) is not in the time: it happened
/// before the sandbox was asked for.
pub fn one_prewarmed_latency(
    vmm: &Path,
    tpl: &Path,
    sock: &Path,
    memory_mib: u32,
    jail: Option<shoal_runtime::jail::Jail>,
) -> Result<(f64, f64, f64), TemplateError> {
    let mut p = VmmProcess::prewarm_once(vmm)
        .memory_mib(memory_mib)
        .api_sock(sock)
        .stdout(Io::Piped)
        .timings(true);
    if let Some(j) = jail {
        p = p.jail(j);
    }
    let mut r = template::spawn_restore(p)?;
    // Pre-warmed, ready means the control socket serves.
    if let Err(e) = r.wait_ready(Duration::from_secs(30)) {
        r.shutdown();
        return Err(e);
    }
    // A stocked VMM waits a while before a create takes it.
    std::thread::sleep(SETTLE);
    let t0 = monotonic_ns();
    let reply = Client::new(sock, Duration::from_secs(30)).restore(tpl, &[]);
    let t_reply = monotonic_ns();
    let mut out = r.child.stdout.take();
    let mut b = [0u8; 1];
    let got = match &reply {
        Ok(_) => out.as_mut().map(|o| o.read(&mut b)).transpose(),
        Err(_) => Ok(None),
    };
    let t_out = monotonic_ns();
    drop(out);
    let err = r.shutdown();
    if let Err(e) = reply {
        return Err(TemplateError::NotReady(format!("restore request: {e}")));
    }
    if !matches!(got, Ok(Some(1))) {
        return Err(TemplateError::NotReady("no output after restore".into()));
    }
    let run = template::first_run_ns(&err)
        .ok_or_else(|| TemplateError::NotReady("timing line".into()))?;
    let ms = |t: u128| t.saturating_sub(t0) as f64 / 1e6;
    Ok((ms(run), ms(t_reply), ms(t_out)))
}
