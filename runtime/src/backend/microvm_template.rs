//! Image templates of the microVM kind: the image and the image-name
//! layers are pinned into the template's directory (so that reinstalling
//! the artifacts does not change a template under its snapshot), then the
//! guest is booted from the installed kernel and snapshotted there.

use crate::sandbox::{self, GuestFiles, SandboxError, TemplateSpec};
use shoal_images::artifacts::{ArtifactError, Layout, IMAGES};
use shoal_images::layers;
use std::path::{Path, PathBuf};

/// Why an image template could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The installed kernel or an image is missing.
    #[error(transparent)]
    Artifacts(#[from] ArtifactError),
    /// Making the template's directory.
    #[error("{0}: {1}")]
    Dir(PathBuf, std::io::Error),
    /// Copying an image into the template's directory.
    #[error(transparent)]
    Copy(#[from] layers::LayerError),
    /// The boot or the snapshot.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// Links `src` into `dst` (a copy where a hard link cannot be made, e.g.
/// across file systems).
pub fn pin(src: &Path, dst: &Path) -> Result<PathBuf, BuildError> {
    if std::fs::hard_link(src, dst).is_err() {
        let _ = std::fs::remove_file(dst);
        layers::clone_file(src, dst)?;
    }
    Ok(dst.into())
}

/// Boots image template `spec` into `dir` from the installed `artifacts`:
/// the image and image-name layers (`tiny`, `base`) are pinned into `dir`
/// first; other layers are the caller's files, used where they are.
pub fn build_from_layout(
    artifacts: &Layout,
    vmm: &Path,
    dir: &Path,
    mut spec: TemplateSpec,
    layer_names: &[String],
    jail: Option<&crate::jail::JailConfig>,
) -> Result<(), BuildError> {
    // Everything is checked before anything is written.
    let kernel = artifacts.kernel()?;
    let cmdline = artifacts.cmdline()?;
    let image = artifacts.image(&spec.image)?;
    let layer_src: Vec<(PathBuf, bool)> = layer_names
        .iter()
        .map(|l| match IMAGES.contains(&l.as_str()) {
            true => artifacts.image(l).map(|p| (p, true)),
            false => Ok((PathBuf::from(l), false)),
        })
        .collect::<Result<_, _>>()?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| BuildError::Dir(dir.into(), e))?;
    let pinned = (|| {
        let root = pin(&image, &dir.join("root.erofs"))?;
        spec.layers = layer_src
            .iter()
            .enumerate()
            .map(|(i, (p, ours))| match ours {
                true => pin(p, &dir.join(format!("layer{}.erofs", i + 1))),
                false => Ok(p.clone()),
            })
            .collect::<Result<_, _>>()?;
        Ok::<_, BuildError>(root)
    })();
    let root = match pinned {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(dir);
            return Err(e);
        }
    };
    let guest = GuestFiles {
        kernel,
        image: root,
        // `quiet`: a sandbox's boot log is read by no one, and every
        // console byte is a VM exit (errors still print).
        cmdline: format!("{cmdline} quiet"),
    };
    sandbox::build_template(dir, &spec, &guest, vmm, jail)?;
    // Layers used where they are must be visible to jailed VMMs too.
    crate::jail::write_files(dir, &spec.layers).map_err(|e| match e {
        crate::jail::JailError::Io(p, e) => BuildError::Dir(p, e),
        other => BuildError::Dir(dir.into(), std::io::Error::other(other.to_string())),
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_installed_artifacts_a_build_fails_at_once_naming_what_is_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let inst = tmp.path().join("artifacts");
        let dir = tmp.path().join("t.0123456789ab");
        let spec = TemplateSpec::new("tiny", 1, 128);
        let e = build_from_layout(
            &Layout::at(&inst),
            Path::new("/x"),
            &dir,
            spec.clone(),
            &[],
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("the guest kernel is not installed"), "{e}");
        assert!(e.contains("shoal artifacts build"), "{e}");
        assert!(!dir.exists(), "nothing is written before the checks pass");
        // The kernel is there, the image is not.
        std::fs::create_dir_all(&inst).unwrap();
        std::fs::write(inst.join("vmlinux"), "k").unwrap();
        std::fs::write(inst.join("cmdline"), "console=ttyS0").unwrap();
        let e = build_from_layout(
            &Layout::at(&inst),
            Path::new("/x"),
            &dir,
            spec,
            &["base".into()],
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("the 'tiny' image is not installed"), "{e}");
        assert!(!dir.exists());
    }
}
