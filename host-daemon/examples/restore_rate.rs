//! Restore rate from an existing template, without booting one first:
//! K workers restore and shut down N VMs in all (a template with a vsock
//! device gets a fresh socket path per worker).
//!
//! `cargo run --release -p host-daemon --example restore_rate -- VMM TEMPLATE_DIR K N`

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(a.len() == 5, "usage: restore_rate VMM TEMPLATE_DIR K N");
    let (vmm, tpl) = (PathBuf::from(&a[1]), PathBuf::from(&a[2]));
    let (k, n): (usize, usize) = (a[3].parse()?, a[4].parse()?);
    let dir = tempfile::tempdir()?;
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let workers: Vec<_> = (0..k)
        .map(|w| {
            let (next, errors, vmm, tpl) = (next.clone(), errors.clone(), vmm.clone(), tpl.clone());
            let sock = dir.path().join(format!("w{w}.sock"));
            let vsock = dir.path().join(format!("w{w}.vsock"));
            std::thread::spawn(move || {
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    let vsock = vsock.to_string_lossy();
                    let extra = ["--vsock-uds", vsock.as_ref()];
                    let ok = shoal_host::template::spawn_restore(
                        &vmm,
                        &tpl,
                        &sock,
                        Stdio::null(),
                        &extra,
                    )
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
    for w in workers {
        let _ = w.join();
    }
    let s = t0.elapsed().as_secs_f64();
    println!(
        "{n} restores, K={k}: {:.1}/s, {} errors",
        n as f64 / s,
        errors.load(Ordering::Relaxed)
    );
    Ok(())
}
