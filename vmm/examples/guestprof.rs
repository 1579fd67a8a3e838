//! A sampling profiler for a running guest: asks a `shoal-vmm` control
//! socket where the vCPUs are (`sample`), N times, and prints the hottest
//! functions of the guest kernel by its System.map.
//!
//! `cargo run -p vmm --example guestprof -- API_SOCK SYSTEM_MAP [SAMPLES] [INTERVAL_MS]`

use std::collections::BTreeMap;
use std::time::Duration;
use vmm_api::Client;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() >= 3,
        "usage: guestprof API_SOCK SYSTEM_MAP [SAMPLES] [INTERVAL_MS]"
    );
    let n: usize = args.get(3).map_or(Ok(200), |s| s.parse())?;
    let every = Duration::from_millis(args.get(4).map_or(Ok(20), |s| s.parse())?);
    let mut syms: Vec<(u64, String)> = std::fs::read_to_string(&args[2])?
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let addr = u64::from_str_radix(w.next()?, 16).ok()?;
            let kind = w.next()?;
            let name = w.next()?;
            matches!(kind, "t" | "T" | "w" | "W").then(|| (addr, name.to_string()))
        })
        .collect();
    syms.sort();
    let mut hist: BTreeMap<String, usize> = BTreeMap::new();
    let mut taken = 0;
    let api = Client::new(&args[1], Duration::from_secs(5));
    for _ in 0..n {
        let Ok(rips) = api.sample() else {
            break; // the VM ended
        };
        for rip in rips {
            let i = syms.partition_point(|(a, _)| *a <= rip);
            let name = if rip < 0xffff_8000_0000_0000 {
                "(user)".to_string()
            } else if i == 0 {
                format!("{rip:#x}")
            } else {
                syms[i - 1].1.clone()
            };
            *hist.entry(name).or_default() += 1;
            taken += 1;
        }
        std::thread::sleep(every);
    }
    let mut v: Vec<_> = hist.into_iter().collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    println!("{taken} samples");
    for (name, c) in v.iter().take(40) {
        println!(
            "{:6.1}%  {c:5}  {name}",
            *c as f64 * 100.0 / f64::from(taken.max(1))
        );
    }
    Ok(())
}
