//! `shoal image build`: DAX-ready root images.

use anyhow::{bail, Context, Result};
use shoal_images::image::{self, AgentSource, BuildOptions, ImageSource};
use std::path::{Path, PathBuf};

/// Where the files come from: `base`, a directory, or a tar archive.
pub fn source(s: &str) -> Result<ImageSource> {
    if s == "base" {
        return Ok(ImageSource::Base);
    }
    let p = Path::new(s);
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(ImageSource::Dir(p.into())),
        Ok(m) if m.is_file() => Ok(ImageSource::Tar(p.into())),
        Ok(_) => bail!("image source {s}: neither a directory nor a tar archive"),
        Err(e) => {
            bail!("image source {s}: {e} (expected `base`, a root directory or a tar archive)")
        }
    }
}

/// Builds the image and prints what it is.
pub fn build(src: &str, out: &Path, agent: Option<PathBuf>, no_agent: bool) -> Result<i32> {
    let src = source(src)?;
    let agent = match (agent, no_agent) {
        (_, true) => AgentSource::None,
        (Some(p), false) => {
            if !p.is_file() {
                bail!("--agent {}: no such file", p.display());
            }
            AgentSource::Path(p)
        }
        (None, false) => AgentSource::Auto,
    };
    let live = crate::progress::Live::start_quiet(&format!("building {}", out.display()));
    let info = image::build_image_with(src, out, &BuildOptions { agent })
        .with_context(|| format!("cannot build {}", out.display()));
    drop(live);
    let info = info?;
    let align = pmem::IMAGE_ALIGN;
    println!("image     {}", info.path.display());
    println!(
        "size      {} bytes ({:.1} MiB; erofs {} bytes, padded to a multiple of {} MiB)",
        info.len,
        info.len as f64 / 1048576.0,
        info.fs_bytes,
        align >> 20
    );
    println!("blocks    4096 bytes (DAX-ready: {})", info.dax);
    println!(
        "agent     {}",
        if info.agent_installed {
            "/sbin/shoal-agent"
        } else {
            "none installed"
        }
    );
    println!(
        "guest     {:.2} MiB of page metadata per VM (1/64 of the image)",
        pmem::guest_memmap_overhead(info.len) as f64 / 1048576.0
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources() {
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("root.tar");
        std::fs::write(&tar, b"").unwrap();
        assert_eq!(source("base").unwrap(), ImageSource::Base);
        let d = dir.path().to_str().unwrap();
        assert_eq!(source(d).unwrap(), ImageSource::Dir(dir.path().into()));
        let t = tar.to_str().unwrap();
        assert_eq!(source(t).unwrap(), ImageSource::Tar(tar.clone()));
        let missing = dir.path().join("nope");
        let e = source(missing.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("expected `base`"), "{e}");
        let e = build(t, &dir.path().join("x.img"), Some(missing), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--agent") && e.contains("no such file"), "{e}");
    }
}
