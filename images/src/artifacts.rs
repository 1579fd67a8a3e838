//! Guest kernel and images.
//!
//! shoald reads them only from an installed directory, a [`Layout`]:
//!
//! ```text
//! DIR/vmlinux            the guest kernel (uncompressed ELF)
//! DIR/cmdline            its base command line (one line)
//! DIR/images/tiny.erofs  busybox and the agent: read-only root
//! DIR/images/tiny.cpio   the same as an initramfs
//! DIR/images/base.erofs  Debian bookworm and the agent
//! ```
//!
//! `DIR` is `SHOAL_ARTIFACTS` (shoald's `--artifacts`), else
//! `<binaries>/../share/shoal` when that holds a `vmlinux` (an installed
//! package), else `${SHOAL_CACHE:-~/.cache/shoal}/artifacts`. A source
//! checkout builds them with its scripts (`scripts/build-kernel.sh`,
//! `scripts/build-images.sh`, which cache by content hash so a second call
//! is instant) and installs them into a layout ([`build`]; `shoal artifacts
//! build`); the CLI run from a checkout does that on demand.
//!
//! The daemon-less helpers [`kernel`], [`image`] and [`base_cmdline`] build
//! from the checkout when there is one, and read the default layout
//! otherwise.

pub mod build;

pub use crate::paths::{cache_dir, repo_root};
use std::path::{Path, PathBuf};

/// Errors finding, building or installing artifacts.
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
    /// An installed file is missing.
    #[error(
        "{what} is not installed: {} is missing (kernel and images are read from {} ({}); \
         install them with `shoal artifacts build` from a Shoal checkout, or point \
         --artifacts / SHOAL_ARTIFACTS at a directory holding vmlinux, cmdline and \
         images/{{tiny,base}}.erofs)",
        path.display(), dir.display(), origin.describe()
    )]
    Missing {
        /// What it is ("the guest kernel", "the 'base' image").
        what: String,
        /// The file.
        path: PathBuf,
        /// The layout's directory.
        dir: PathBuf,
        /// Where that directory came from.
        origin: Origin,
    },
    /// An unknown image name.
    #[error("unknown image {0:?} (expected tiny or base, or a built-in layer: {layers})", layers = crate::lang_layers::names().join(", "))]
    UnknownImage(String),
    /// A built-in layer could not be built.
    #[error("the '{name}' layer: {detail}")]
    Layer {
        /// The layer.
        name: String,
        /// Why.
        detail: String,
    },
    /// No source checkout to build from.
    #[error("no Shoal source checkout here to build from ({0} has no scripts/build-kernel.sh; set SHOAL_REPO)")]
    NoCheckout(PathBuf),
    /// Installing or reading a file.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// Where a layout's directory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Given explicitly (`--artifacts`).
    Explicit,
    /// `SHOAL_ARTIFACTS`.
    Env,
    /// `<binaries>/../share/shoal`.
    NextToBinaries,
    /// `${SHOAL_CACHE:-~/.cache/shoal}/artifacts`.
    Cache,
}

impl Origin {
    /// In a few words.
    pub fn describe(self) -> &'static str {
        match self {
            Origin::Explicit => "given with --artifacts",
            Origin::Env => "SHOAL_ARTIFACTS",
            Origin::NextToBinaries => "installed next to the binaries",
            Origin::Cache => "the cache: no SHOAL_ARTIFACTS, no <binaries>/../share/shoal",
        }
    }
}

/// Image names: the images a template boots (its root on `/dev/pmem0`).
pub const IMAGES: [&str; 2] = ["tiny", "base"];

/// Whether `name` names an image or a built-in layer
/// ([`crate::lang_layers::LAYERS`]): what a request's `layers` may name
/// instead of a file.
pub fn is_named_layer(name: &str) -> bool {
    IMAGES.contains(&name) || crate::lang_layers::recipe(name).is_some()
}

/// Where a layout keeps file `key` (relative) and what it is: the
/// [`ITEMS`], and `NAME_erofs` = `images/NAME.erofs` for each built-in
/// layer.
pub fn key_path(key: &str) -> Option<(String, String)> {
    if let Some(it) = item(key) {
        return Some((it.rel.to_string(), it.what.to_string()));
    }
    let name = key.strip_suffix("_erofs")?;
    crate::lang_layers::recipe(name).map(|r| {
        (
            format!("images/{}.erofs", r.name),
            format!("the '{}' layer", r.name),
        )
    })
}

/// One file of a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The build scripts' key (`vmlinux`, `cmdline`, `tiny_erofs`,
    /// `tiny_cpio`, `base_erofs`).
    pub key: &'static str,
    /// Its path in the layout, relative to the directory.
    pub rel: &'static str,
    /// What it is, for messages.
    pub what: &'static str,
}

/// Every file a complete layout has.
pub const ITEMS: [Item; 6] = [
    Item {
        key: "vmlinux",
        rel: "vmlinux",
        what: "the guest kernel",
    },
    Item {
        key: "cmdline",
        rel: "cmdline",
        what: "the guest kernel command line",
    },
    Item {
        key: "tiny_erofs",
        rel: "images/tiny.erofs",
        what: "the 'tiny' image",
    },
    Item {
        key: "tiny_cpio",
        rel: "images/tiny.cpio",
        what: "the 'tiny' initramfs",
    },
    Item {
        key: "base_erofs",
        rel: "images/base.erofs",
        what: "the 'base' image",
    },
    Item {
        key: CONTAINER_ROOT,
        rel: "images/agent.erofs",
        what: "the agent layer of container sandboxes (built with 'tiny')",
    },
];

/// The key of the agent layer: the root (`/dev/pmem0`) of a container
/// sandbox, holding only the static `/sbin/shoal-agent` (the kernel's
/// init) and empty mount points; the image's layers go over it as
/// `/dev/pmem1..` and the guest's `shoal.container=1` leaves this root out
/// of the overlay. Built with the `tiny` image, from the same agent.
pub const CONTAINER_ROOT: &str = "tiny_agent_erofs";

/// The image name a container sandbox's template boots
/// (`TemplateSpec::image`): its root is [`CONTAINER_ROOT`], its layers are
/// the OCI image's, and its kernel command line gets `shoal.container=1`.
/// Not one of [`IMAGES`]: no request names it.
pub const CONTAINER_IMAGE: &str = "container";

/// The item of a key.
pub fn item(key: &str) -> Option<&'static Item> {
    ITEMS.iter().find(|i| i.key == key)
}

/// An installed directory of guest artifacts (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The directory.
    pub dir: PathBuf,
    /// Where it came from.
    pub origin: Origin,
}

impl Layout {
    /// The layout at `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> Layout {
        Layout {
            dir: dir.into(),
            origin: Origin::Explicit,
        }
    }

    /// `SHOAL_ARTIFACTS`, else `<binaries>/../share/shoal` when it holds a
    /// kernel, else [`Layout::in_cache`].
    pub fn default_location() -> Layout {
        if let Some(d) = std::env::var_os("SHOAL_ARTIFACTS").filter(|d| !d.is_empty()) {
            return Layout {
                dir: d.into(),
                origin: Origin::Env,
            };
        }
        if let Some(d) = std::env::current_exe()
            .ok()
            .and_then(|e| Some(e.parent()?.parent()?.join("share/shoal")))
            .filter(|d| d.join("vmlinux").is_file())
        {
            return Layout {
                dir: d,
                origin: Origin::NextToBinaries,
            };
        }
        Layout::in_cache()
    }

    /// `${SHOAL_CACHE:-~/.cache/shoal}/artifacts`.
    pub fn in_cache() -> Layout {
        Layout {
            dir: cache_dir().join("artifacts"),
            origin: Origin::Cache,
        }
    }

    /// The path of `item` in this layout.
    pub fn path(&self, item: &Item) -> PathBuf {
        self.dir.join(item.rel)
    }

    /// An installed file by key, or a [`ArtifactError::Missing`] naming it
    /// and how to get it.
    pub fn file(&self, key: &str) -> Result<PathBuf, ArtifactError> {
        let (rel, what) = key_path(key).ok_or_else(|| ArtifactError::UnknownImage(key.into()))?;
        let p = self.dir.join(rel);
        if p.is_file() {
            Ok(p)
        } else {
            Err(ArtifactError::Missing {
                what,
                path: p,
                dir: self.dir.clone(),
                origin: self.origin,
            })
        }
    }

    /// The guest kernel.
    pub fn kernel(&self) -> Result<PathBuf, ArtifactError> {
        self.file("vmlinux")
    }

    /// The base kernel command line.
    pub fn cmdline(&self) -> Result<String, ArtifactError> {
        let p = self.file("cmdline")?;
        std::fs::read_to_string(&p)
            .map(|s| s.trim().to_string())
            .map_err(|e| ArtifactError::Io(p, e))
    }

    /// The read-only root of image `name` (`tiny` or `base`), or the
    /// built-in layer `name`.
    pub fn image(&self, name: &str) -> Result<PathBuf, ArtifactError> {
        if !is_named_layer(name) {
            return Err(ArtifactError::UnknownImage(name.into()));
        }
        self.file(&format!("{name}_erofs"))
    }

    /// Each item and whether it is there.
    pub fn status(&self) -> Vec<(&'static Item, PathBuf, bool)> {
        ITEMS
            .iter()
            .map(|i| {
                let p = self.path(i);
                let ok = p.is_file();
                (i, p, ok)
            })
            .collect()
    }
}

/// The guest kernel: built by the checkout's script (cached; `SHOAL_KERNEL`
/// overrides), or the default layout's without a checkout.
pub fn kernel() -> Result<PathBuf, ArtifactError> {
    match build::Checkout::find() {
        Some(c) => c.kernel(&mut build::quiet_unless_slow()),
        None => Layout::default_location().kernel(),
    }
}

/// The base kernel command line: the checkout's
/// `kernel-configs/cmdline`, or the default layout's.
pub fn base_cmdline() -> String {
    let from = match build::Checkout::find() {
        Some(c) => c.cmdline(),
        None => Layout::default_location().cmdline(),
    };
    from.unwrap_or_else(|_| "console=ttyS0 reboot=k panic=-1".into())
}

/// A guest image file (`tiny_erofs`, `tiny_cpio`, `base_erofs`, or
/// `NAME_erofs` for a built-in layer): built by the checkout (cached), or
/// the default layout's.
pub fn image(key: &str) -> Result<PathBuf, ArtifactError> {
    match build::Checkout::find() {
        Some(c) => c.image(key, &mut build::quiet_unless_slow()),
        None => Layout::default_location().file(key),
    }
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

#[cfg(test)]
#[path = "artifacts_tests.rs"]
mod tests;
