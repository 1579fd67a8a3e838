//! Where Shoal keeps its cache and where its source checkout is.

use std::path::{Path, PathBuf};

/// `${SHOAL_CACHE:-~/.cache/shoal}`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("SHOAL_CACHE")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/shoal")
        })
}

/// The repository root this was built from (`SHOAL_REPO` overrides); it
/// may not exist where the binaries run ([`crate::artifacts::build::Checkout::find`]).
pub fn repo_root() -> PathBuf {
    if let Some(p) = std::env::var_os("SHOAL_REPO") {
        return p.into();
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}
