//! What Shoal's tests repeat, in one place: checks that a test's
//! prerequisites are there (each fails the test with a clear message, never
//! skips it), console capture, the guest artifacts and the cached test
//! template, the agent binary for host-mode tests without KVM
//! ([`host_agent`], the fake sandbox backend's), restored sandboxes driven
//! through the agent, `ip` for the network tests, and read-only layers and ext4 images inspected on the
//! host; this workspace's binaries built in the test's profile.
//!
//! It must not depend on `vmm` (the VMM's integration tests use it);
//! helpers that need the VMM's types live in `vmm/tests/common`.

mod artifacts;
mod bins;
mod console;
mod layers;
mod netcmd;
mod prereq;
pub mod registry;
mod sandbox;

pub use artifacts::{artifacts, cmdline, host_agent, image, kernel, tiny_template};
pub use bins::{build_bins, shoal_cli};
pub use console::Console;
pub use layers::{debugfs, layer};
pub use netcmd::{ip, PeerNs};
pub use prereq::{kvm, kvm_serial, require_kvm, require_root};
pub use sandbox::{file_data, sh, RunningSandbox};
