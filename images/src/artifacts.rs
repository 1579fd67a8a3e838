//! Guest kernel and images: found in the cache, or built by the repo's
//! scripts (`scripts/build-kernel.sh`, `scripts/build-images.sh`), which
//! cache by content hash so a second call is instant.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Errors finding or building artifacts.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// A build script could not be run.
    #[error("cannot run {script}: {source}")]
    Spawn {
        /// The script.
        script: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A build script failed.
    #[error("{script} failed ({status}); its messages are above")]
    Failed {
        /// The script.
        script: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
    /// A build script's output lacked the expected line.
    #[error("{script} did not report {what}")]
    NoOutput {
        /// The script.
        script: PathBuf,
        /// The missing item.
        what: String,
    },
    /// The `shoal-vmm` binary is missing.
    #[error("shoal-vmm not found next to {0} (build the workspace: cargo build --release)")]
    NoVmm(PathBuf),
}

/// The repository root (scripts and kernel configs live there).
pub fn repo_root() -> PathBuf {
    if let Some(p) = std::env::var_os("SHOAL_REPO") {
        return p.into();
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs a build script; its progress (stderr) is shown only if it takes
/// more than a moment (a real build) or fails, so cache hits stay quiet.
fn run_script(args: &[&str]) -> Result<String, ArtifactError> {
    use std::io::{BufRead, BufReader, Read};
    let script = repo_root().join(args[0]);
    let mut child = Command::new("bash")
        .arg(&script)
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ArtifactError::Spawn {
            script: script.clone(),
            source,
        })?;
    let err = child.stderr.take();
    let start = std::time::Instant::now();
    let relay = std::thread::spawn(move || {
        let mut held = Vec::new();
        let mut live = false;
        if let Some(e) = err {
            for line in BufReader::new(e).lines().map_while(Result::ok) {
                if live {
                    eprintln!("{line}");
                } else if start.elapsed() > std::time::Duration::from_secs(3) {
                    live = true;
                    for h in held.drain(..) {
                        eprintln!("{h}");
                    }
                    eprintln!("{line}");
                } else {
                    held.push(line);
                }
            }
        }
        held
    });
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    let status = child.wait().map_err(|source| ArtifactError::Spawn {
        script: script.clone(),
        source,
    })?;
    let held = relay.join().unwrap_or_default();
    if !status.success() {
        for h in held {
            eprintln!("{h}");
        }
        return Err(ArtifactError::Failed { script, status });
    }
    Ok(out)
}

/// The guest kernel (built if missing). `SHOAL_KERNEL` overrides.
pub fn kernel() -> Result<PathBuf, ArtifactError> {
    let out = run_script(&["scripts/build-kernel.sh"])?;
    out.lines()
        .last()
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| ArtifactError::NoOutput {
            script: "scripts/build-kernel.sh".into(),
            what: "the vmlinux path".into(),
        })
}

/// The base kernel command line (`kernel-configs/cmdline`).
pub fn base_cmdline() -> String {
    std::fs::read_to_string(repo_root().join("kernel-configs/cmdline"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "console=ttyS0 reboot=k panic=-1".into())
}

/// A guest image file: `tiny_erofs`, `tiny_cpio` or `base_erofs`.
pub fn image(key: &str) -> Result<PathBuf, ArtifactError> {
    let which = key.split('_').next().unwrap_or(key);
    let out = run_script(&["scripts/build-images.sh", which])?;
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(PathBuf::from))
        .ok_or_else(|| ArtifactError::NoOutput {
            script: "scripts/build-images.sh".into(),
            what: key.into(),
        })
}

/// The `shoal-vmm` binary next to the running executable.
pub fn vmm_binary() -> Result<PathBuf, ArtifactError> {
    if let Some(p) = std::env::var_os("SHOAL_VMM") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().unwrap_or(Path::new("."));
    // Test binaries live one level down, in target/*/deps.
    for d in [dir, dir.parent().unwrap_or(dir)] {
        let p = d.join("shoal-vmm");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(ArtifactError::NoVmm(exe))
}
