//! `shoal image pull|import|ls|inspect|rm`: OCI images in the host's image
//! store. `import` (an OCI layout directory or a `docker save` tarball)
//! writes the store directly.
//! Through the daemon (`/v1/images`) when one answers (`--daemon`,
//! `SHOAL_DAEMON`, else the local one; not started for this), so that a
//! removal is refused while a template or sandbox of the image exists;
//! else, or with `--store DIR`, on the store's directory directly (by
//! default the daemon's state directory's `images/`).

use crate::daemon_cmds::Global;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use image_store::import::{import, ImportOptions};
use image_store::layer::{LayerLimits, DEFAULT_MAX_LAYER_BYTES};
use image_store::registry::{pull, PullOptions};
use image_store::Store;
use shoal_client::api::images::{Image, ImageList, PullImage};
use shoal_client::DaemonClient;
use std::path::PathBuf;

/// Where the store is.
#[derive(Args)]
pub struct StoreArg {
    /// Work on this image store directory directly, not through the
    /// daemon (default: through the daemon when one answers, else the
    /// daemon's state directory's `images/`).
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
}

impl StoreArg {
    fn open(&self) -> Store {
        Store::new(
            &self
                .store
                .clone()
                .unwrap_or_else(|| shoald::default_state_dir().join("images")),
        )
    }
}

/// The OCI image subcommands.
#[derive(Subcommand)]
pub enum OciCmd {
    /// Pull an OCI image from a registry (`[registry/]repo[:tag|@digest]`)
    /// and convert its layers to DAX-ready erofs (each stored once).
    Pull {
        /// The reference, as `docker pull` takes it.
        reference: String,
        /// Plain http to a registry that is not on loopback.
        #[arg(long)]
        insecure: bool,
        /// Registry credentials: a Docker `config.json` (default:
        /// $REGISTRY_AUTH_FILE, else $DOCKER_CONFIG/config.json or
        /// ~/.docker/config.json when there). Pulling here only: through
        /// the daemon, shoald's `--registry-auth-file` is used.
        #[arg(long, value_name = "FILE")]
        auth_file: Option<PathBuf>,
        /// The most bytes of one layer, compressed and uncompressed
        /// (default 8 GiB). Pulling here only: through the daemon,
        /// shoald's `--max-layer-bytes` is used.
        #[arg(long, value_name = "BYTES")]
        max_layer_bytes: Option<u64>,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Import an OCI image layout directory (`index.json`, `blobs/sha256/`:
    /// what `skopeo copy IMG oci:DIR:TAG` writes) or a `docker save`
    /// tarball (either format), its layers verified by digest and
    /// converted as a pull's (written to the store directly).
    Import {
        /// The layout directory or `docker save` tarball.
        path: PathBuf,
        /// The manifest tagged this (a layout's tag, or a docker save
        /// archive's `REPO:TAG`; default: its only one, or its linux/amd64
        /// one).
        #[arg(long)]
        tag: Option<String>,
        /// The most bytes of one layer, compressed and uncompressed.
        #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_LAYER_BYTES)]
        max_layer_bytes: u64,
        /// Name it this reference (default: the names a docker save
        /// archive gives it, else found by its id only).
        #[arg(long = "ref", value_name = "REF")]
        reference: Option<String>,
        #[command(flatten)]
        store: StoreArg,
    },
    /// List the stored OCI images (`--json`: as JSON).
    Ls {
        #[command(flatten)]
        store: StoreArg,
    },
    /// Show a stored image (JSON: layers, config, disk use).
    Inspect {
        /// A reference or an image id (`sha256:...`).
        reference: String,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Remove a reference (or, by id, the image), and layers no other image
    /// uses.
    Rm {
        /// A reference or an image id.
        reference: String,
        #[command(flatten)]
        store: StoreArg,
    },
}

/// The daemon to go through: a TCP one always (its store is not here),
/// the Unix socket's when it answers; none with `--store`.
fn daemon(g: &Global, store: &StoreArg) -> Option<DaemonClient> {
    if store.store.is_some() {
        return None;
    }
    let spec = g
        .daemon
        .clone()
        .or_else(|| std::env::var("SHOAL_DAEMON").ok())
        .filter(|s| !s.is_empty());
    if let Some(s) = spec.as_deref().filter(|s| s.starts_with("http://")) {
        return Some(DaemonClient::from_spec(s));
    }
    let sock = spec
        .map(PathBuf::from)
        .unwrap_or_else(|| shoald::default_state_dir().join("shoald.sock"));
    let c = DaemonClient::unix(sock);
    c.ping().then_some(c)
}

/// Every stored layer once.
fn total_bytes(images: &[Image]) -> u64 {
    let mut seen = std::collections::BTreeMap::new();
    for l in images.iter().flat_map(|i| &i.layers) {
        seen.insert(l.diff_id.as_str(), l.erofs_bytes);
    }
    seen.values().sum()
}

fn print_list(l: &ImageList, in_use: bool, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(l)?);
        return Ok(());
    }
    println!(
        "{:<19} {:>6} {:>9} {:>6}  REFS",
        "ID", "LAYERS", "DISK MiB", "IN USE"
    );
    for i in &l.images {
        println!(
            "{:<19} {:>6} {:>9} {:>6}  {}",
            &i.id[..i.id.len().min(19)],
            i.layers.len(),
            i.disk_bytes >> 20,
            if in_use {
                i.in_use.to_string()
            } else {
                "-".into()
            },
            i.refs.join(", ")
        );
    }
    println!(
        "{} images, {} MiB of layers (shared layers once)",
        l.images.len(),
        l.disk_bytes >> 20
    );
    Ok(())
}

/// Runs one.
pub fn run(cmd: OciCmd, g: &Global) -> Result<i32> {
    match cmd {
        OciCmd::Pull {
            reference,
            insecure,
            auth_file,
            max_layer_bytes,
            store,
        } => {
            let t = std::time::Instant::now();
            let img = match daemon(g, &store) {
                Some(c) => {
                    if auth_file.is_some() || max_layer_bytes.is_some() {
                        anyhow::bail!(
                            "--auth-file and --max-layer-bytes apply to a pull here (--store DIR); \
                             the daemon pulls with its own (shoald --registry-auth-file, \
                             --max-layer-bytes)"
                        );
                    }
                    c.pull_image(&PullImage {
                        reference: reference.clone(),
                        insecure: Some(insecure),
                    })?
                }
                None => {
                    let opts = PullOptions {
                        insecure,
                        limits: LayerLimits::both(
                            max_layer_bytes.unwrap_or(DEFAULT_MAX_LAYER_BYTES),
                        ),
                        auth_file: auth_file.or_else(|| {
                            std::env::var_os("REGISTRY_AUTH_FILE")
                                .filter(|f| !f.is_empty())
                                .map(PathBuf::from)
                        }),
                    };
                    pull(&store.open(), &reference, &opts)
                        .with_context(|| format!("pulling {reference}"))?
                        .image
                }
            };
            println!(
                "{} {} ({} layers, {} MiB, {:.1} s)",
                img.refs.first().map_or(reference.as_str(), String::as_str),
                img.id,
                img.layers.len(),
                img.disk_bytes >> 20,
                t.elapsed().as_secs_f64()
            );
        }
        OciCmd::Import {
            path,
            tag,
            max_layer_bytes,
            reference,
            store,
        } => {
            let t = std::time::Instant::now();
            let opts = ImportOptions {
                tag,
                reference,
                limits: LayerLimits::both(max_layer_bytes),
            };
            let got = import(&store.open(), &path, &opts)
                .with_context(|| format!("importing {}", path.display()))?;
            let img = &got.image;
            println!(
                "{} ({} layers, {} MiB, {:.1} s){}",
                img.id,
                img.layers.len(),
                img.disk_bytes >> 20,
                t.elapsed().as_secs_f64(),
                img.refs
                    .first()
                    .map(|r| format!(" as {r}"))
                    .unwrap_or_default()
            );
        }
        OciCmd::Ls { store } => match daemon(g, &store) {
            Some(c) => print_list(&c.images()?, true, g.json)?,
            None => {
                let st = store.open();
                let images = st.list()?;
                let disk_bytes = total_bytes(&images);
                print_list(&ImageList { images, disk_bytes }, false, g.json)?;
                if !g.json {
                    let u = st.usage()?;
                    println!(
                        "on disk: {} layers, {} MiB in {}",
                        u.layers,
                        u.layer_bytes >> 20,
                        st.dir().display()
                    );
                }
            }
        },
        OciCmd::Inspect { reference, store } => {
            let img = match daemon(g, &store) {
                Some(c) => c.image(&reference)?,
                None => store.open().resolve(&reference)?.image,
            };
            println!("{}", serde_json::to_string_pretty(&img)?);
        }
        OciCmd::Rm { reference, store } => {
            let img = match daemon(g, &store) {
                Some(c) => c.remove_image(&reference)?,
                None => store.open().remove(&reference)?,
            };
            println!("removed {reference} ({})", img.id);
        }
    }
    Ok(0)
}
