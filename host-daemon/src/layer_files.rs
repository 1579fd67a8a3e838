//! The layers of a root request, opened the one way a root daemon may open
//! files its callers name ([`shoal_images::layer_files`]): image names, or
//! files under the daemon's layers directory ([`crate::Config::layers_dir`]),
//! opened once off the async runtime, within [`OPEN_DEADLINE`]; the open
//! files go on to the template build, which pins exactly those files.

use super::{ApiError, ApiResult, Daemon};
use shoal_api::RootRequest;
use shoal_images::layer_files::{open_layer, Layer};
use shoal_images::layers::{LayerError, Upper, MAX_LAYERS};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Longest the daemon waits for a request's layer files to open and be
/// checked (a superblock read each; only a stuck file system takes long).
pub const OPEN_DEADLINE: Duration = Duration::from_secs(10);

/// A root request whose sizes are checked and whose layers are open.
#[derive(Debug, Clone)]
pub struct CheckedRoot {
    /// The upper layer.
    pub upper: Upper,
    /// The layers, in order.
    pub layers: Vec<Layer>,
}

/// Checks `root` for a guest of `memory_mib` and opens its layers (image
/// names: the installed images, [`shoal_images::artifacts::IMAGES`], which
/// `templates::IMAGES` also names, and the built-in layers,
/// [`shoal_images::lang_layers::LAYERS`]).
pub async fn open_root(d: &Daemon, root: &RootRequest, memory_mib: u32) -> ApiResult<CheckedRoot> {
    let upper = Upper::from_request(root.upper_size_mib, root.upper_disk_mib, memory_mib)
        .map_err(ApiError::Layers)?;
    if root.layers.len() > MAX_LAYERS {
        return Err(ApiError::Layers(LayerError::TooMany(root.layers.len())));
    }
    let (dir, names) = (d.cfg.layers_dir(), root.layers.clone());
    let job = tokio::task::spawn_blocking(move || open_layers(&dir, &names));
    let layers = match tokio::time::timeout(OPEN_DEADLINE, job).await {
        Err(_) => {
            return Err(ApiError::Timeout(format!(
                "the layers were not opened within {} s",
                OPEN_DEADLINE.as_secs()
            )))
        }
        Ok(r) => r
            .map_err(|source| ApiError::Task {
                what: "opening the layers".into(),
                source,
            })?
            .map_err(ApiError::Layers)?,
    };
    Ok(CheckedRoot { upper, layers })
}

/// Opens each layer: an image or built-in layer name as it is, a path
/// from under `dir` ([`open_layer`]). Blocking.
pub fn open_layers(dir: &Path, names: &[String]) -> Result<Vec<Layer>, LayerError> {
    names
        .iter()
        .map(|l| {
            if shoal_images::artifacts::is_named_layer(l) {
                Ok(Layer::Image(l.clone()))
            } else {
                open_layer(dir, l).map(Layer::File)
            }
        })
        .collect()
}

/// The default layers directory: `layers` in the state directory.
pub fn default_layers_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("layers")
}
