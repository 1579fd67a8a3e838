//! This workspace's binaries, built in the running test's profile (a
//! test under `target/debug` gets debug builds) and found beside it.

use std::path::PathBuf;
use std::process::Command;

/// Builds `bins` (`(package, binary)` pairs) with cargo in the test's
/// profile (a no-op when they are up to date: a stale binary would test
/// old code) and returns the profile's directory, where they are.
/// Panics if the build fails.
pub fn build_bins(bins: &[(&str, &str)]) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary lives in target/PROFILE/deps")
        .to_path_buf();
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.args(["build", "-q"]);
    for (package, bin) in bins {
        c.args(["-p", package, "--bin", bin]);
    }
    if dir.file_name().is_none_or(|n| n != "debug") {
        c.arg("--release");
    }
    let st = c.status().expect("running cargo build");
    assert!(st.success(), "cargo build of {bins:?} failed");
    for (_, bin) in bins {
        let p = dir.join(bin);
        assert!(p.is_file(), "{} missing after the build", p.display());
    }
    dir
}

/// The `shoal` CLI, built next to shoald (as an install has them).
pub fn shoal_cli() -> PathBuf {
    build_bins(&[("shoal-cli", "shoal"), ("shoald", "shoald")]).join("shoal")
}
