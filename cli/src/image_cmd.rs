//! `shoal image build`: DAX-ready root images.

use anyhow::{bail, Context, Result};
use shoal_images::artifacts;
use shoal_images::image::{self, AgentSource, BuildOptions, ImageInfo, ImageSource};
use shoal_images::{deb_layer, lang_layers};
use std::path::{Path, PathBuf};

/// Where the files come from: `base` (built from the checkout, cached), a
/// directory, or a tar archive.
pub fn source(s: &str) -> Result<ImageSource> {
    if s == "base" {
        return Ok(ImageSource::Image(artifacts::image("base_erofs")?));
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

/// The packages of `--packages` (comma or space separated, repeatable).
pub fn package_list(args: &[String]) -> Vec<String> {
    args.iter()
        .flat_map(|a| a.split([',', ' ']))
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// Builds the image and prints what it is.
pub fn build(
    src: &str,
    out: &Path,
    agent: Option<PathBuf>,
    no_agent: bool,
    packages: &[String],
) -> Result<i32> {
    let packages = package_list(packages);
    if !packages.is_empty() {
        return build_packages(src, out, &packages);
    }
    if let Some(r) = lang_layers::recipe(src) {
        return build_named(r, out);
    }
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
    print_info(&info?);
    Ok(0)
}

/// `shoal image build SRC --packages P,Q -o OUT`: a layer of Debian
/// packages over `base` or an erofs image file.
fn build_packages(src: &str, out: &Path, packages: &[String]) -> Result<i32> {
    let over = if src == "base" {
        artifacts::image("base_erofs")?
    } else {
        let p = PathBuf::from(src);
        shoal_images::layers::check_layer(&p)
            .with_context(|| format!("--packages needs `base` or an erofs image, not {src}"))?;
        p
    };
    let live = crate::progress::Live::start_quiet(&format!("building {}", out.display()));
    let info = deb_layer::build_deb_layer(&over, packages, out, &mut |l| live.line(l))
        .with_context(|| format!("cannot build {}", out.display()));
    drop(live);
    let info = info?;
    print_info(&info);
    println!("layer     {} over {}", packages.join(" "), over.display());
    Ok(0)
}

/// `shoal image build fncall-cpp -o OUT`: a built-in layer (cached),
/// copied to OUT.
fn build_named(r: &lang_layers::Recipe, out: &Path) -> Result<i32> {
    let live = crate::progress::Live::start_quiet(&format!("building the '{}' layer", r.name));
    let built = artifacts::image(&format!("{}_erofs", r.name));
    drop(live);
    let file = built?;
    pmem::pad_image_to(&file, out, pmem::IMAGE_ALIGN)
        .with_context(|| format!("cannot copy {} to {}", file.display(), out.display()))?;
    let info = shoal_images::image::check_built(out, false)?;
    print_info(&info);
    println!(
        "layer     {} over base ({})",
        r.packages.join(" "),
        file.display()
    );
    Ok(0)
}

/// `shoal image build base --kind vm -o OUT`: the vm kind's Debian disk
/// (`scripts/build-images.sh vm`: cached by a hash of the debootstrap
/// result, the script and the agent), copied to `out`.
pub fn build_vm(src: &str, out: &Path) -> Result<i32> {
    let cached = vm_disk(src)?;
    shoal_images::layers::clone_file(&cached, out)
        .with_context(|| format!("cannot copy {} to {}", cached.display(), out.display()))?;
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    println!(
        "disk      {} (qcow2, {:.1} MiB)",
        out.display(),
        size as f64 / 1048576.0
    );
    println!("cached    {}", cached.display());
    println!(
        "use       POST /v1/templates {{\"name\":\"NAME\",\"kind\":\"vm\",\"disk\":\"{}\"}} \
         (a path under the daemon's layers directory)",
        out.display()
    );
    Ok(0)
}

/// The cached vm disk built from `src` (only `base`: Debian packages).
fn vm_disk(src: &str) -> Result<PathBuf> {
    if src != "base" {
        bail!(
            "--kind vm builds from `base` (Debian packages, debootstrap) only, not {src:?}; \
             to bring your own disk, give it to the daemon as it is (raw or qcow2)"
        );
    }
    let c = shoal_images::artifacts::build::Checkout::find()
        .context("--kind vm needs a Shoal checkout (scripts/build-images.sh)")?;
    let live = crate::progress::Live::start_quiet("building the vm disk (debootstrap: minutes)");
    let out = c.run_script(
        "build-images.sh",
        &["vm"],
        &mut shoal_images::artifacts::build::quiet_unless_slow(),
    );
    drop(live);
    let out = out?;
    out.lines()
        .find_map(|l| l.strip_prefix("vm_qcow2="))
        .map(PathBuf::from)
        .context("scripts/build-images.sh vm printed no vm_qcow2=PATH")
}

/// `shoal image layers`: the built-in layers.
pub fn layers() -> Result<i32> {
    let layout = artifacts::Layout::default_location();
    println!("{:<18} {:<50} installed", "LAYER", "PACKAGES (over base)");
    for r in lang_layers::LAYERS {
        let installed = layout
            .image(r.name)
            .map_or_else(|_| "no".to_string(), |p| p.display().to_string());
        println!("{:<18} {:<50} {installed}", r.name, r.packages.join(" "));
    }
    println!(
        "(built on first use from a checkout, or with `shoal artifacts build NAME`;          `shoal run --image base --layer NAME -- CMD`)"
    );
    Ok(0)
}

fn print_info(info: &ImageInfo) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources() {
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("root.tar");
        std::fs::write(&tar, b"").unwrap();
        let d = dir.path().to_str().unwrap();
        assert_eq!(source(d).unwrap(), ImageSource::Dir(dir.path().into()));
        let t = tar.to_str().unwrap();
        assert_eq!(source(t).unwrap(), ImageSource::Tar(tar.clone()));
        let missing = dir.path().join("nope");
        let e = source(missing.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("expected `base`"), "{e}");
        let e = build(t, &dir.path().join("x.img"), Some(missing), false, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--agent") && e.contains("no such file"), "{e}");
        let e = build(t, &dir.path().join("x.img"), None, false, &["g++".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs `base` or an erofs image"), "{e}");
    }

    #[test]
    fn a_vm_disk_comes_from_base_only() {
        let e = super::vm_disk("/tmp/rootfs.tar").unwrap_err().to_string();
        assert!(e.contains("from `base`"), "{e}");
    }

    #[test]
    fn package_lists() {
        let args = ["g++,make".to_string(), "nodejs  python3-numpy".into()];
        assert_eq!(
            package_list(&args),
            ["g++", "make", "nodejs", "python3-numpy"]
        );
        assert!(package_list(&[",, ".into()]).is_empty());
    }
}
