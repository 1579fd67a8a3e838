//! Image templates of the microVM kind: the image and the image-name
//! layers are pinned into the template's directory (so that reinstalling
//! the artifacts does not change a template under its snapshot), then the
//! guest is booted from the installed kernel and snapshotted there. A
//! container's template ([`artifacts::CONTAINER_IMAGE`]) boots the agent
//! layer as its root with the OCI image's layers over it.

use crate::sandbox::{self, GuestFiles, SandboxError, TemplateSpec};
use shoal_images::artifacts::{self, ArtifactError, Layout};
use shoal_images::layer_files::{Layer, LayerFile};
use shoal_images::layers;
use std::fs::File;
use std::os::fd::AsRawFd;
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

/// Links the open file `file` (a caller's layer, `src` in errors) into
/// `dst`: the very inode that was checked, whatever its path names now (a
/// copy of it where a hard link cannot be made).
pub fn pin_open(file: &File, src: &Path, dst: &Path) -> Result<PathBuf, BuildError> {
    let from = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|_| BuildError::Dir(dst.into(), std::io::ErrorKind::InvalidInput.into()))?;
    let to = std::ffi::CString::new(dst.as_os_str().as_encoded_bytes())
        .map_err(|_| BuildError::Dir(dst.into(), std::io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: two NUL-terminated paths alive for the call; AT_SYMLINK_FOLLOW
    // makes the magic link /proc/self/fd/N resolve to the open file itself.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if rc != 0 {
        let _ = std::fs::remove_file(dst);
        layers::clone_open(file, src, dst)?;
    }
    Ok(dst.into())
}

/// Where a layer comes from before it is pinned.
enum Source<'a> {
    /// An installed image.
    Image(PathBuf),
    /// A caller's open file.
    File(&'a LayerFile),
}

/// Boots image template `spec` into `dir` from the installed `artifacts`:
/// the image and every layer are pinned into `dir` first: image-name
/// layers (`tiny`, `base`) from the installed images, the caller's files
/// from their open descriptors (so the template, and every snapshot of it,
/// names files in its own directory only).
pub fn build_from_layout(
    artifacts: &Layout,
    vmm: &Path,
    dir: &Path,
    mut spec: TemplateSpec,
    layers: &[Layer],
    jail: Option<&crate::jail::JailConfig>,
) -> Result<(), BuildError> {
    // Everything is checked before anything is written.
    let kernel = artifacts.kernel()?;
    let mut cmdline = artifacts.cmdline()?;
    // A container: the agent layer as the root, left out of the overlay of
    // the image's layers (guest-agent/src/overlay.rs).
    let image = if spec.image == artifacts::CONTAINER_IMAGE {
        cmdline.push_str(" shoal.container=1");
        artifacts.file(artifacts::CONTAINER_ROOT)?
    } else {
        artifacts.image(&spec.image)?
    };
    let layer_src: Vec<Source> = layers
        .iter()
        .map(|l| match l {
            Layer::Image(name) => artifacts.image(name).map(Source::Image),
            Layer::File(f) => Ok(Source::File(f)),
        })
        .collect::<Result<_, _>>()?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| BuildError::Dir(dir.into(), e))?;
    let pinned = (|| {
        let root = pin(&image, &dir.join("root.erofs"))?;
        spec.layers = layer_src
            .iter()
            .enumerate()
            .map(|(i, src)| {
                let dst = dir.join(format!("layer{}.erofs", i + 1));
                match src {
                    Source::Image(p) => pin(p, &dst),
                    Source::File(f) => pin_open(&f.file, &f.path, &dst),
                }
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
            &[Layer::Image("base".into())],
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("the 'tiny' image is not installed"), "{e}");
        assert!(!dir.exists());
    }

    #[test]
    fn a_callers_layer_is_pinned_from_its_open_file_not_its_path() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a.img"), tmp.path().join("b.img"));
        std::fs::write(&a, "checked").unwrap();
        std::fs::write(&b, "swapped").unwrap();
        let file = File::open(&a).unwrap();
        let ino = file.metadata().unwrap().ino();
        // The path now names another file (the checked one moved aside).
        std::fs::rename(&a, tmp.path().join("aside")).unwrap();
        std::fs::rename(&b, &a).unwrap();
        let dst = tmp.path().join("layer1.erofs");
        pin_open(&file, &a, &dst).unwrap();
        assert_eq!(
            std::fs::metadata(&dst).unwrap().ino(),
            ino,
            "the same inode"
        );
        assert_eq!(std::fs::read_to_string(&dst).unwrap(), "checked");
        // The checked file unlinked, the path a symbolic link: no hard link
        // can be made to an unlinked file, so a copy of the open file.
        std::fs::remove_file(tmp.path().join("aside")).unwrap();
        std::fs::remove_file(&dst).unwrap();
        std::fs::remove_file(&a).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &a).unwrap();
        let dst2 = tmp.path().join("layer2.erofs");
        pin_open(&file, &a, &dst2).unwrap();
        assert_eq!(std::fs::read_to_string(&dst2).unwrap(), "checked");
    }
}
