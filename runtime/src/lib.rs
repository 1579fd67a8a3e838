//! How a Shoal sandbox runs: launching VMM processes that boot a kernel
//! ([`launch`]), booting a template and snapshotting it ([`template`]),
//! restoring VMM processes in their own session and watching them ([`vm`]),
//! their readiness pipe ([`ready`]), fresh entropy and clock for restored
//! guests ([`fresh`]), and daemon-less sandboxes for the CLI and tests
//! ([`sandbox`]).

pub mod backend;
pub mod fresh;
pub mod launch;
pub mod ready;
pub mod sandbox;
pub mod template;
pub mod vm;
pub mod vmm_process;
