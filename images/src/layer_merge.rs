//! Several read-only erofs layers flattened into one, for roots with more
//! layers than a guest takes as pmem devices ([`crate::layers::MAX_LAYERS`]).
//!
//! The layers are stacked by the host kernel's own overlayfs, exactly as
//! the guest would stack them (each erofs image mounted read-only from a
//! loop device, then one read-only overlay of them, highest first), and the
//! merged tree is packed the way every Shoal layer is packed
//! ([`crate::image::pack_erofs`]). So the result is what the guest would see
//! through those layers: a whiteout (a 0:0 character device) or an opaque
//! directory (`trusted.overlay.opaque=y`) of a merged layer hides what the
//! merged layers below it hold and is itself gone (overlayfs shows neither),
//! which is right because the merged layer is the lowest of the root: there
//! is nothing under it left to hide. Layers stacked over the merged one keep
//! their own whiteouts and opaque directories, which act on it as on any
//! lower layer. Needs root (loop and overlay mounts), as layer builds do.

use crate::deb_layer::Mounts;
use crate::image::{self, ImageError, ImageInfo, Stage};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Flattens `layers` (erofs layer files, lowest first; at least two) into
/// the new layer `out` (written beside it first, renamed into place only
/// when checked; nothing is left behind on failure).
pub fn merge_layers(layers: &[PathBuf], out: &Path) -> Result<ImageInfo, ImageError> {
    if layers.len() < 2 {
        return Err(ImageError::Source {
            path: out.into(),
            why: format!("merging {} layers: give at least two", layers.len()),
        });
    }
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(ImageError::NeedsRoot(
            "merging layers (loop and overlay mounts)",
        ));
    }
    // Declared before the mounts: dropped (removed) after they are gone.
    let stage = Stage::for_overlay(out)?;
    let s = stage.dir.as_path();
    let mut m = Mounts::default();
    let mut lowers = Vec::with_capacity(layers.len());
    for (i, l) in layers.iter().enumerate() {
        let at = s.join(format!("l{i}"));
        std::fs::create_dir(&at).map_err(image::io("cannot create", &at))?;
        m.mount(
            Command::new("mount")
                .args(["-t", "erofs", "-o", "loop,ro"])
                .arg(l)
                .arg(&at),
            &at,
        )?;
        lowers.push(at);
    }
    let merged = s.join("merged");
    std::fs::create_dir(&merged).map_err(image::io("cannot create", &merged))?;
    // Highest first; no upper directory: a read-only overlay.
    let lowerdir: Vec<String> = lowers
        .iter()
        .rev()
        .map(|p| p.display().to_string())
        .collect();
    m.mount(
        Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o"])
            .arg(format!("ro,lowerdir={}", lowerdir.join(":")))
            .arg(&merged),
        &merged,
    )?;
    let raw = s.join("merged.erofs.raw");
    let tmp = s.join("merged.erofs");
    image::pack_erofs(&merged, &raw, &tmp)?;
    m.unmount_all()?;
    std::fs::rename(&tmp, out).map_err(image::io("cannot rename into", out))?;
    drop(stage);
    image::check_built(out, false)
}

#[cfg(test)]
#[path = "layer_merge_tests.rs"]
mod tests;
