//! How a Shoal sandbox runs: the seam the daemon goes through for every
//! sandbox VM, one kind per backend ([`backend`]: the microVM kind and the
//! fake one for tests without KVM); the one builder of `shoal-vmm` command
//! lines ([`vmm_process`]); launching VMM processes that boot a kernel
//! ([`launch`]); booting a template and snapshotting it ([`template`]);
//! VM processes by pid and start time ([`vm`]); the VMM's readiness pipe
//! ([`ready`]); jailed VMMs ([`jail`]); fresh entropy and clock for restored guests ([`fresh`]);
//! and daemon-less sandboxes for the CLI and tests ([`sandbox`]).

pub mod backend;
pub mod console_lines;
pub mod fresh;
pub mod jail;
pub mod jail_prep;
pub mod launch;
pub mod qmp;
pub mod ready;
pub mod sandbox;
pub mod sched;
pub mod template;
pub mod vm;
pub mod vm_disk;
pub mod vmm_balloon;
pub mod vmm_net;
pub mod vmm_process;
