//! The `vm` kind's network (issue 18): a virtio-net PCI device on a TAP
//! of a network slot, as microVMs have. QEMU inherits the TAP's
//! descriptor (opened by the daemon inside the slot's netns, with
//! `IFF_VNET_HDR`) as `-netdev tap,fd=N` (QEMU 7.2 refuses `vnet_hdr=`
//! with `fd=`: it reads the flag from the descriptor); it sets the header
//! size and the TAP's offloads itself. A networked
//! template boots with a TAP lent for the boot (its slot denies
//! everything); each restore gets its own slot's TAP and MAC, and the
//! agent's `NetConfigure` then gives the guest that MAC (the migration
//! stream carries the template's) and its address, as for a microVM.
//!
//! QEMU has no token bucket on a tap netdev: a daemon with net limits
//! refuses networked `vm` sandboxes rather than run them unlimited.

use super::{BackendError, NetAttach};
use crate::vmm_net::{mac_string, NetLimits};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Arc;

/// The id of the netdev and of the NIC on QEMU's command line.
const NETDEV: &str = "net0";

/// A `vm`'s NIC: the TAP QEMU inherits and the MAC it shows the guest.
#[derive(Debug, Clone)]
pub struct Nic {
    /// The TAP, opened inside its slot's netns.
    pub tap: Arc<File>,
    /// The guest's MAC.
    pub mac: [u8; 6],
}

impl Nic {
    /// The NIC of a restore onto `n`'s slot; refused where `n` has limits
    /// (QEMU would not enforce them).
    pub fn of_attach(n: &NetAttach) -> Result<Nic, BackendError> {
        if n.limits != NetLimits::default() {
            return Err(BackendError::Reply(format!(
                "the vm kind cannot enforce network rate limits ({:?}): QEMU's tap has no \
                 token bucket",
                n.limits
            )));
        }
        Ok(Nic {
            tap: n.tap.clone(),
            mac: n.mac,
        })
    }

    /// QEMU's arguments for this NIC (the TAP as descriptor `fd`).
    pub fn args(&self, fd: i32) -> [String; 4] {
        [
            "-netdev".into(),
            format!("tap,id={NETDEV},fd={fd}"),
            "-device".into(),
            format!(
                "virtio-net-pci,netdev={NETDEV},id=nic0,mac={}",
                mac_string(self.mac)
            ),
        ]
    }

    /// Adds the NIC to `c`: its arguments, and the TAP's descriptor left
    /// open across the exec (in the child only).
    pub fn add_to(&self, c: &mut Command) {
        let tap = self.tap.clone();
        let fd = tap.as_raw_fd();
        c.args(self.args(fd));
        // SAFETY: between fork and exec the closure only calls fcntl on a
        // descriptor the captured `tap` keeps open; clearing close-on-exec
        // there changes the child's descriptor table only.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(c, move || {
                let fd = tap.as_raw_fd();
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// Checks that a VM with a net device (`has_net`, from its spec) is
/// restored onto a slot, and one without is not.
pub fn check_restore(has_net: bool, net: Option<&NetAttach>) -> Result<Option<Nic>, BackendError> {
    match (has_net, net) {
        (true, Some(n)) => Nic::of_attach(n).map(Some),
        (false, None) => Ok(None),
        (true, None) => Err(BackendError::Reply(
            "this vm has a network device: restore it with a network".into(),
        )),
        (false, Some(_)) => Err(BackendError::Reply(
            "this vm has no network device: its template was made without a network".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attach(limits: NetLimits) -> NetAttach {
        NetAttach {
            netns: "/run/netns/x".into(),
            tap: Arc::new(File::open("/dev/null").unwrap()),
            mac: [0x02, 0x5a, 10, 213, 0, 30],
            limits,
        }
    }

    #[test]
    fn the_nic_is_the_slots_tap_with_its_mac() {
        let n = Nic::of_attach(&attach(NetLimits::default())).unwrap();
        assert_eq!(
            n.args(7),
            [
                "-netdev",
                "tap,id=net0,fd=7",
                "-device",
                "virtio-net-pci,netdev=net0,id=nic0,mac=02:5a:0a:d5:00:1e"
            ]
        );
    }

    #[test]
    fn limits_and_mismatched_restores_are_refused() {
        let limited = attach(NetLimits {
            tx_pps: Some(10),
            ..Default::default()
        });
        let e = Nic::of_attach(&limited).unwrap_err();
        assert!(e.to_string().contains("rate limits"), "{e}");
        let plain = attach(NetLimits::default());
        assert!(check_restore(true, None).is_err());
        assert!(check_restore(false, Some(&plain)).is_err());
        assert!(check_restore(false, None).unwrap().is_none());
        assert!(check_restore(true, Some(&plain)).unwrap().is_some());
    }
}
