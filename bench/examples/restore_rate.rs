//! Restore rate from an existing template, without booting one first:
//! K workers restore and shut down N VMs in all (the rate loop of `shoal
//! bench restore`).
//!
//! `cargo run --release -p shoal-bench --example restore_rate -- VMM TEMPLATE_DIR K N`

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(a.len() == 5, "usage: restore_rate VMM TEMPLATE_DIR K N");
    let (vmm, tpl) = (PathBuf::from(&a[1]), PathBuf::from(&a[2]));
    let (k, n): (usize, usize) = (a[3].parse()?, a[4].parse()?);
    let dir = tempfile::tempdir()?;
    let r = shoal_bench::restore::rate(&vmm, &tpl, dir.path(), k, n);
    println!(
        "{} restores, K={}: {:.1}/s, {} errors",
        r.restores, r.concurrency, r.per_second, r.errors
    );
    Ok(())
}
