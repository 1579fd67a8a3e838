//! Guest artifacts for Shoal: where the guest kernel and the built-in images
//! come from ([`artifacts`]: an installed layout shoald reads, built and
//! installed from a source checkout by the CLI), building erofs images from a directory, a tar
//! archive or a built-in recipe ([`image`]), and the read-only layers and
//! upper layer a template stacks over its image ([`layers`]).

pub mod artifacts;
pub mod deb_layer;
pub mod image;
pub mod lang_layers;
pub mod layer_cache;
pub mod layer_files;
pub mod layer_merge;
pub mod layers;
pub mod paths;
