//! shoald's logic without KVM: a daemon in this process whose sandboxes
//! are the fake backend's (real `shoal-agent` processes on the host, which
//! freeze, pause to disk, die and get killed as VMs do), driven through
//! its HTTP API. What it checks: operations and lifecycle, fork, pools,
//! supervision, admission, the VMM stock, TTL and idle timeouts, recovery
//! on restart; background commands, mkdir and rename, limits changed after
//! creation; CPU classes; OCI image references of creates; the image API.

#[path = "fake_daemon/commands.rs"]
mod commands;
#[path = "fake_daemon/containers.rs"]
mod containers;
#[path = "fake_daemon/cpu_class.rs"]
mod cpu_class;
#[path = "fake_daemon/e2b_control.rs"]
mod e2b_control;
#[path = "fake_daemon/e2b_proxy.rs"]
mod e2b_proxy;
#[path = "fake_daemon/fork.rs"]
mod fork;
#[path = "fake_daemon/harness.rs"]
mod harness;
#[path = "fake_daemon/images.rs"]
mod images;
#[path = "fake_daemon/layers.rs"]
mod layers;
#[path = "fake_daemon/lifecycle.rs"]
mod lifecycle;
#[path = "fake_daemon/limits.rs"]
mod limits;
#[path = "fake_daemon/network.rs"]
mod network;
#[path = "fake_daemon/stock.rs"]
mod stock;
#[path = "fake_daemon/supervision.rs"]
mod supervision;
