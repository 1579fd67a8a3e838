//! `shoal image pull|ls|inspect|rm`: OCI images in the host's image store
//! (by default the daemon's state directory's `images/`), worked on
//! directly; the daemon's `POST /v1/images` is a later slice.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use image_store::registry::{pull, PullOptions};
use image_store::Store;
use std::path::PathBuf;

/// Where the store is.
#[derive(Args)]
pub struct StoreArg {
    /// The image store's directory (default: the daemon's state
    /// directory's `images/`).
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

/// Runs one.
pub fn run(cmd: OciCmd, json: bool) -> Result<i32> {
    match cmd {
        OciCmd::Pull {
            reference,
            insecure,
            store,
        } => {
            let t = std::time::Instant::now();
            let got = pull(&store.open(), &reference, &PullOptions { insecure })
                .with_context(|| format!("pulling {reference}"))?;
            let img = &got.image;
            println!(
                "{} {} ({} layers, {} MiB, {:.1} s)",
                img.refs.first().map_or(reference.as_str(), String::as_str),
                img.id,
                img.layers.len(),
                img.disk_bytes >> 20,
                t.elapsed().as_secs_f64()
            );
        }
        OciCmd::Ls { store } => {
            let images = store.open().list()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&images)?);
            } else {
                println!("{:<19} {:>6} {:>9}  REFS", "ID", "LAYERS", "DISK MiB");
                for i in images {
                    println!(
                        "{:<19} {:>6} {:>9}  {}",
                        &i.id[..i.id.len().min(19)],
                        i.layers.len(),
                        i.disk_bytes >> 20,
                        i.refs.join(", ")
                    );
                }
            }
        }
        OciCmd::Inspect { reference, store } => {
            let got = store.open().resolve(&reference)?;
            println!("{}", serde_json::to_string_pretty(&got.image)?);
        }
        OciCmd::Rm { reference, store } => {
            let img = store.open().remove(&reference)?;
            println!("removed {reference} ({})", img.id);
        }
    }
    Ok(0)
}
