//! Building root images for Shoal guests (the library side of
//! `shoal image build`): a directory, a tar archive or the project's base
//! image becomes an erofs file system that a guest can mount from
//! virtio-pmem with DAX (`root=/dev/pmem0 rootfstype=erofs ro
//! rootflags=dax`), and from virtio-blk as well.
//!
//! What makes an image DAX-ready (see the `pmem` crate's docs):
//!
//! * erofs, uncompressed (no `-z`): Linux maps only plain files with DAX;
//! * 4 KiB blocks (the guest page size; mkfs.erofs's default);
//! * `-E noinline_data`: no tail-packed last blocks, so every regular file
//!   is `EROFS_INODE_FLAT_PLAIN`, the only layout Linux 6.1 reads with DAX
//!   (others silently go through the guest page cache);
//! * a size that is a multiple of 2 MiB (zero padding,
//!   [`pmem::pad_image_to`]), or the guest refuses the device.
//!
//! A directory or tar source is staged in a temporary directory next to the
//! output, gets the guest agent as `/sbin/shoal-agent` (the init Shoal boots
//! with `init=/sbin/shoal-agent`) and the mount points the agent needs
//! (`/dev`, `/proc`, `/sys`, `/tmp`, `/run`), then goes through
//! `mkfs.erofs` (erofs-utils; 1.5 or later). The result replaces `out`
//! atomically and is checked with [`pmem::check_image`]. Building from a tar
//! archive that holds device nodes or files owned by other users needs root
//! (as unpacking it would).

use root_fs::{Dir, Kind};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the image's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// A root file system tree.
    Dir(PathBuf),
    /// A tar archive of one (plain or compressed, as GNU tar detects).
    Tar(PathBuf),
    /// An erofs image that is already a Shoal image with its agent (the
    /// project's base image, `shoal_images::artifacts::image("base_erofs")`,
    /// built by `scripts/build-images.sh base`): copied as it is, padded
    /// and checked.
    Image(PathBuf),
}

/// Which guest agent goes into a directory or tar image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AgentSource {
    /// `SHOAL_AGENT`, else the musl release build in the workspace's
    /// target directory, built with cargo if missing.
    #[default]
    Auto,
    /// This binary.
    Path(PathBuf),
    /// Install none (the source must bring its own init).
    None,
}

/// Options for [`build_image_with`].
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// The agent to install as `/sbin/shoal-agent`.
    pub agent: AgentSource,
}

/// A built image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// The image file.
    pub path: PathBuf,
    /// Its size: the file system padded to a multiple of 2 MiB.
    pub len: u64,
    /// Bytes the erofs file system itself spans.
    pub fs_bytes: u64,
    /// Whether the guest can mount it with DAX (4 KiB blocks).
    pub dax: bool,
    /// Whether the guest agent was installed as `/sbin/shoal-agent`.
    pub agent_installed: bool,
}

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The source does not exist or is not what it claims to be.
    #[error("image source {path}: {why}")]
    Source {
        /// The source.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A file-system operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An external tool could not be run or failed.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The tool.
        tool: String,
        /// Its exit status and last words.
        detail: String,
    },
    /// The guest agent binary could not be found or built.
    #[error(
        "no guest agent binary: {0} (build it with `cargo build --release -p guest-agent \
         --target x86_64-unknown-linux-musl`, or set SHOAL_AGENT)"
    )]
    NoAgent(String),
    /// Padding or checking the result failed.
    #[error(transparent)]
    Pmem(#[from] pmem::ImageError),
    /// The source's tree has a link where the build writes (`/dev`).
    #[error(
        "the image's /{name} is a symbolic link (or not a directory); the build writes into it, \
         so it must be a directory"
    )]
    LinkInRoot {
        /// The name in the root.
        name: String,
    },
    /// A package list that is not a list of Debian package names.
    #[error("packages: {0}")]
    Packages(String),
    /// The build needs root.
    #[error("{0}: run it as root")]
    NeedsRoot(&'static str),
    /// The result is not a DAX-capable erofs image.
    #[error("built image {path} is not a DAX-capable erofs file system: {why}")]
    NotDax {
        /// The image.
        path: PathBuf,
        /// What the check found.
        why: String,
    },
}

pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ImageError {
    let path = path.to_path_buf();
    move |source| ImageError::Io { what, path, source }
}

/// Builds a DAX-ready erofs image at `out` from `src`, installing the guest
/// agent found the default way ([`AgentSource::Auto`]).
pub fn build_image(src: ImageSource, out: &Path) -> Result<ImageInfo, ImageError> {
    build_image_with(src, out, &BuildOptions::default())
}

/// [`build_image`] with options.
pub fn build_image_with(
    src: ImageSource,
    out: &Path,
    opts: &BuildOptions,
) -> Result<ImageInfo, ImageError> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io("cannot create", &parent))?;
    let stage = Stage::new(&parent, out)?;
    let root = stage.dir.join("root");
    std::fs::create_dir(&root).map_err(io("cannot create", &root))?;
    match &src {
        ImageSource::Dir(d) => {
            if !d.is_dir() {
                return Err(ImageError::Source {
                    path: d.clone(),
                    why: "not a directory".into(),
                });
            }
            // `cp -a` keeps owners (as root), modes, links, times, xattrs.
            let mut from = d.clone().into_os_string();
            from.push("/.");
            run(Command::new("cp").arg("-a").arg(from).arg(&root))?;
        }
        ImageSource::Tar(t) => {
            if !t.is_file() {
                return Err(ImageError::Source {
                    path: t.clone(),
                    why: "not a file".into(),
                });
            }
            run(Command::new("tar")
                .arg("-C")
                .arg(&root)
                .args(["--numeric-owner", "-xpf"])
                .arg(t))?;
        }
        ImageSource::Image(base) => {
            // Built DAX-ready (and cached) by the script, with the agent;
            // copy it.
            pmem::pad_image_to(base, out, pmem::IMAGE_ALIGN)?;
            return verify(out, true);
        }
    }
    let agent = match &opts.agent {
        AgentSource::Auto => Some(find_agent()?),
        AgentSource::Path(p) => Some(p.clone()),
        AgentSource::None => None,
    };
    prepare_root(&root, agent.as_deref())?;
    let raw = stage.dir.join("image.erofs");
    let info = pack_erofs(&root, &raw, out)?;
    drop(stage);
    Ok(ImageInfo {
        agent_installed: agent.is_some(),
        ..info
    })
}

/// Packs the tree `root` as it is (nothing added) into a DAX-ready erofs
/// image at `out`, the way every Shoal image and `--no-agent` layer is
/// packed: `mkfs.erofs -E noinline_data --preserve-mtime` into `raw` (a
/// scratch file the caller removes), padded to 2 MiB into `out`
/// atomically, then checked. Xattrs (overlayfs whiteout metadata included)
/// and owners are kept.
pub fn pack_erofs(root: &Path, raw: &Path, out: &Path) -> Result<ImageInfo, ImageError> {
    run(Command::new("mkfs.erofs")
        .args(["--quiet", "-E", "noinline_data", "--preserve-mtime"])
        .arg(raw)
        .arg(root))?;
    pmem::pad_image_to(raw, out, pmem::IMAGE_ALIGN)?;
    verify(out, false)
}

/// Checks a built image or layer the way the VMM will, and that it is
/// DAX-capable (`agent_installed` is reported as given).
pub fn check_built(out: &Path, agent_installed: bool) -> Result<ImageInfo, ImageError> {
    verify(out, agent_installed)
}

/// Checks the result the way the VMM will, and that it is DAX-capable.
pub(crate) fn verify(out: &Path, agent_installed: bool) -> Result<ImageInfo, ImageError> {
    let info = pmem::check_image(out)?;
    let not_dax = |why: String| ImageError::NotDax {
        path: out.to_path_buf(),
        why,
    };
    let fs = info
        .filesystem
        .ok_or_else(|| not_dax("no erofs superblock".into()))?;
    if fs.kind != pmem::FsKind::Erofs {
        return Err(not_dax(format!("{} file system", fs.kind)));
    }
    if info.dax_capable() != Some(true) {
        return Err(not_dax(format!("{}-byte blocks", fs.block_size)));
    }
    Ok(ImageInfo {
        path: out.to_path_buf(),
        len: info.len,
        fs_bytes: fs.fs_bytes,
        dax: true,
        agent_installed,
    })
}

/// A temporary directory next to the output, removed on drop.
pub(crate) struct Stage {
    pub(crate) dir: PathBuf,
}

impl Stage {
    pub(crate) fn new(parent: &Path, out: &Path) -> Result<Stage, ImageError> {
        let name = out
            .file_name()
            .map_or_else(|| "image".into(), |n| n.to_string_lossy().into_owned());
        for n in 0..100u32 {
            let dir = parent.join(format!(".{name}.build-{}-{n}", std::process::id()));
            // Ours alone: the tree unpacked in it keeps its modes (setuid
            // files, device nodes), which no other local user may reach.
            let made =
                std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
                    .create(&dir);
            match made {
                Ok(()) => return Ok(Stage { dir }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io("cannot create", &dir)(e)),
            }
        }
        Err(ImageError::Io {
            what: "cannot create a staging directory in",
            path: parent.to_path_buf(),
            source: std::io::ErrorKind::AlreadyExists.into(),
        })
    }

    /// A staging directory beside `out` (its parent made if missing) whose
    /// path overlayfs mount options can name.
    pub(crate) fn for_overlay(out: &Path) -> Result<Stage, ImageError> {
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(io("cannot create", &parent))?;
        let stage = Stage::new(&parent, out)?;
        if stage.dir.to_string_lossy().contains([',', ':', '\\']) {
            return Err(ImageError::Source {
                path: stage.dir.clone(),
                why: "the staging directory's path has a ',', ':' or '\\' (overlayfs options \
                      cannot name it)"
                    .into(),
            });
        }
        Ok(stage)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        // Staged trees may hold read-only directories (tar -p): make them
        // writable so that they can be removed.
        let _ = Command::new("chmod")
            .args(["-R", "u+rwX"])
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs a tool; its stderr becomes the error.
pub(crate) fn run(cmd: &mut Command) -> Result<(), ImageError> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| ImageError::Tool {
            tool: tool.clone(),
            detail: format!("cannot run it: {e}"),
        })?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = err.lines().rev().take(5).collect();
    Err(ImageError::Tool {
        tool,
        detail: format!(
            "{}: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("; ")
        ),
    })
}

/// Resolves `rel` inside `root` as if `root` were `/`: symlinks (absolute
/// or relative) are followed without ever leaving `root`.
fn resolve_in_root(root: &Path, rel: &Path) -> PathBuf {
    let mut parts: Vec<PathBuf> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(PathBuf::from(n)),
            _ => None,
        })
        .rev()
        .collect();
    let mut cur = PathBuf::new();
    let mut hops = 0;
    while let Some(part) = parts.pop() {
        let candidate = cur.join(&part);
        match std::fs::read_link(root.join(&candidate)) {
            Ok(target) if hops < 40 => {
                hops += 1;
                if target.is_absolute() {
                    cur = PathBuf::new();
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(n) => parts.push(PathBuf::from(n)),
                        Component::ParentDir => parts.push(PathBuf::from("..")),
                        _ => {}
                    }
                }
            }
            _ if part == Path::new("..") => {
                cur.pop();
            }
            _ => cur = candidate,
        }
    }
    root.join(cur)
}

/// Adds the mount points the agent uses and the agent itself, never
/// following a link of the tree ([`root_fs`]): a `/dev` that is not a
/// directory is refused, the agent goes where `/sbin` leads inside the
/// root.
fn prepare_root(root: &Path, agent: Option<&Path>) -> Result<(), ImageError> {
    let rootdir = Dir::open(root).map_err(io("cannot open", root))?;
    for (dir, mode) in [
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("run", 0o755),
        ("root", 0o700),
    ] {
        let p = root.join(dir);
        match rootdir.kind(dir).map_err(io("cannot inspect", &p))? {
            Kind::Missing => rootdir.mkdir(dir, mode).map_err(io("cannot create", &p))?,
            Kind::Dir => {}
            // The build writes into /dev: it must be the tree's own.
            _ if dir == "dev" => return Err(ImageError::LinkInRoot { name: dir.into() }),
            // Left as the tree has it (the guest's business).
            _ => {}
        }
    }
    // The kernel opens /dev/console for init before anything is mounted;
    // without it the agent reopens the console after mounting devtmpfs.
    let dev = rootdir
        .subdir("dev")
        .map_err(io("cannot open", &root.join("dev")))?;
    if dev
        .kind("console")
        .map_err(io("cannot inspect", &root.join("dev/console")))?
        == Kind::Missing
    {
        // Best effort (needs CAP_MKNOD), as before.
        let _ = dev.mknod_chr("console", 5, 1, 0o600);
    }
    let Some(agent) = agent else {
        return Ok(());
    };
    let sbin = resolve_in_root(root, Path::new("sbin"));
    let rel = sbin.strip_prefix(root).unwrap_or(Path::new("sbin"));
    let sbin_dir = rootdir.subdirs(rel).map_err(io("cannot create", &sbin))?;
    let dest = sbin.join("shoal-agent");
    sbin_dir
        .write_file("shoal-agent", agent, 0o755)
        .map_err(io("cannot copy the guest agent to", &dest))?;
    // Smaller is faster to load on PVM hosts; optional.
    let _ = Command::new("strip")
        .arg(&dest)
        .stderr(Stdio::null())
        .status();
    Ok(())
}

const AGENT_TARGET: &str = "x86_64-unknown-linux-musl";

/// The static guest agent: `SHOAL_AGENT`, else the workspace's musl
/// release build (built now if missing).
pub fn find_agent() -> Result<PathBuf, ImageError> {
    if let Some(p) = std::env::var_os("SHOAL_AGENT") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(ImageError::NoAgent(format!(
                "SHOAL_AGENT={} is not a file",
                p.display()
            )))
        };
    }
    let repo = crate::paths::repo_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { repo.join(t) })
        .unwrap_or_else(|| repo.join("target"));
    let agent = target.join(AGENT_TARGET).join("release/shoal-agent");
    if !agent.is_file() {
        run(Command::new("cargo")
            .current_dir(&repo)
            .args(["build", "--release", "-p", "guest-agent", "--target"])
            .arg(AGENT_TARGET))
        .map_err(|e| ImageError::NoAgent(e.to_string()))?;
    }
    if agent.is_file() {
        Ok(agent)
    } else {
        Err(ImageError::NoAgent(format!(
            "{} is missing after the build",
            agent.display()
        )))
    }
}

#[path = "image_root.rs"]
mod root_fs;

#[cfg(test)]
#[path = "image_tests.rs"]
mod tests;
