//! The restores the restore benchmark times: one restore's latency and the
//! sustained rate of K concurrent restores, each plain or jailed.

use serde::Serialize;
use shoal_runtime::jail::{Jail, JailConfig};
use shoal_runtime::launch::monotonic_ns;
use shoal_runtime::template::{self, first_run_ns, TemplateError};
use shoal_runtime::vmm_process::{Io, VmmProcess};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sustained rate at one concurrency.
#[derive(Debug, Serialize)]
pub struct Rate {
    /// Concurrent restores in flight.
    pub concurrency: usize,
    /// Restores tried.
    pub restores: usize,
    /// Failures.
    pub errors: usize,
    /// Successful restores per second.
    pub per_second: f64,
}

/// One restore's times from its start (ms).
#[derive(Debug, Clone, Copy)]
pub struct RestoreTimes {
    /// To the VMM's `main` (the process start; jailed: the jail's set-up).
    pub vmm_start: f64,
    /// To vCPUs running.
    pub vcpu_run: f64,
    /// To the guest's first output.
    pub first_output: f64,
}

/// One restore of `tpl` timed from the start (jailed: in `jail`, whose
/// sandbox directory holds `sock`; the jail's set-up is in the time, as in
/// the daemon).
pub fn one_restore_latency(
    vmm: &Path,
    tpl: &Path,
    sock: &Path,
    jail: Option<&JailConfig>,
) -> Result<RestoreTimes, TemplateError> {
    let t0 = monotonic_ns();
    let mut p = VmmProcess::restore(vmm, tpl)
        .api_sock(sock)
        .stdout(Io::Piped)
        .timings(true);
    if let Some(j) = jail {
        p = p.jail(jail_of(j, sock, tpl)?);
    }
    let mut r = template::spawn_restore(p)?;
    let mut out = r.child.stdout.take();
    let mut b = [0u8; 1];
    let got = out.as_mut().map(|o| o.read(&mut b)).transpose();
    let t_out = monotonic_ns();
    drop(out);
    let err = r.shutdown();
    if !matches!(got, Ok(Some(1))) {
        let last: Vec<&str> = err.lines().rev().take(3).collect();
        return Err(TemplateError::NotReady(format!(
            "output after restore (VMM said: {})",
            last.join(" | ")
        )));
    }
    let timing =
        |key| timing_ns(&err, key).ok_or_else(|| TemplateError::NotReady("timing line".into()));
    let ms = |t: u128| t.saturating_sub(t0) as f64 / 1e6;
    Ok(RestoreTimes {
        vmm_start: ms(timing("start_ns")?),
        vcpu_run: ms(timing("first_run_ns")?),
        first_output: ms(t_out),
    })
}

/// A `SHOAL-TIMING` value (ns, on the monotonic clock).
fn timing_ns(stderr: &str, key: &str) -> Option<u128> {
    if key == "first_run_ns" {
        return first_run_ns(stderr);
    }
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("SHOAL-TIMING "))?
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
        .parse()
        .ok()
}

/// The jail of a bench VMM whose sockets are in `sock`'s directory,
/// restoring template `tpl`.
pub fn jail_of(j: &JailConfig, sock: &Path, tpl: &Path) -> Result<Jail, TemplateError> {
    let dir = sock.parent().unwrap_or(Path::new("/"));
    let mem = std::fs::metadata(tpl.join("memory")).map_or(0, |m| m.len());
    j.jail_for(dir, &shoal_runtime::jail::template_files(tpl), mem)
        .map_err(|e| TemplateError::NotReady(format!("jail: {e}")))
}

/// `total` restore + shutdown cycles of `tpl` by `k` workers, each with
/// its own control and vsock socket paths in `dir`.
pub fn rate(vmm: &Path, tpl: &Path, dir: &Path, k: usize, total: usize) -> Rate {
    rate_with(vmm, tpl, dir, k, total, None)
}

/// [`rate`], jailed when `jail` is given (each worker's sockets in a
/// directory of its own, the jail's sandbox directory).
pub fn rate_with(
    vmm: &Path,
    tpl: &Path,
    dir: &Path,
    k: usize,
    total: usize,
    jail: Option<&JailConfig>,
) -> Rate {
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let threads: Vec<_> = (0..k)
        .map(|w| {
            let (next, errors) = (next.clone(), errors.clone());
            let wdir = match jail {
                Some(_) => dir.join(format!("jail-rate-{w}")),
                None => dir.to_path_buf(),
            };
            let _ = std::fs::create_dir_all(&wdir);
            let (vmm, tpl, sock) = (
                vmm.to_path_buf(),
                tpl.to_path_buf(),
                wdir.join(format!("rate-{w}.sock")),
            );
            let vsock = wdir.join(format!("rate-{w}.vsock"));
            let jail = jail.cloned();
            std::thread::spawn(move || {
                // The vsock socket is ignored by the VMM for a template
                // without vsock.
                let p = VmmProcess::restore(&vmm, &tpl)
                    .api_sock(&sock)
                    .vsock_uds(&vsock)
                    .stdout(Io::Null);
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    let p = match &jail {
                        Some(j) => match jail_of(j, &sock, &tpl) {
                            Ok(jl) => p.clone().jail(jl),
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                        },
                        None => p.clone(),
                    };
                    let ok = template::spawn_restore(p)
                        .and_then(|mut r| {
                            let res = r.wait_ready(Duration::from_secs(30));
                            r.shutdown();
                            res
                        })
                        .is_ok();
                    if !ok {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let secs = t0.elapsed().as_secs_f64();
    let errors = errors.load(Ordering::Relaxed);
    Rate {
        concurrency: k,
        restores: total,
        errors,
        // Restores that worked: failed ones end early and must not
        // count as speed.
        per_second: total.saturating_sub(errors) as f64 / secs,
    }
}
