//! The VM's virtio-net device: its TAP, the identity a restore gives it,
//! and its counters.

use super::{Vm, VmError};
use crate::config::VmConfig;
use crate::net_config::{NetDeviceConfig, TapSource};
use devices::virtio::net::Tap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

/// Opens the TAP `src` names: a duplicate of an inherited descriptor (the
/// original stays with the VMM, so a reload can take another), or a TAP by
/// name in the VMM's network namespace.
pub(super) fn open_tap(src: &TapSource) -> Result<Tap, VmError> {
    let tap = match src {
        TapSource::Fd(fd) => {
            if *fd < 3 {
                return Err(VmError::DeviceState(format!(
                    "net: descriptor {fd} is not an inherited TAP"
                )));
            }
            // SAFETY: the descriptor was handed to this process for the
            // net device (`--net fd:N`); it is only borrowed for the
            // duplicate, which is checked below.
            let b = unsafe { BorrowedFd::borrow_raw(*fd) };
            let dup: OwnedFd = b.try_clone_to_owned().map_err(|source| VmError::Io {
                what: format!("net: descriptor {fd}"),
                source,
            })?;
            Tap::from_fd(dup)
        }
        TapSource::Name(name) => Tap::open(name),
    };
    tap.map_err(|e| VmError::DeviceState(format!("net: {e}")))
}

/// Gives the snapshot's net device (in `cfg`, from `dir`) the TAP and MAC
/// of `given`. A snapshot with a net device needs one, so a clone never
/// sends from its template's TAP or with its MAC; one without a net device
/// refuses it (a device cannot be added to a saved guest).
pub(super) fn apply_restore_net(
    dir: &Path,
    cfg: &mut VmConfig,
    given: Option<&NetDeviceConfig>,
) -> Result<(), VmError> {
    let bad = |reason: String| VmError::Incompatible {
        dir: dir.into(),
        reason,
    };
    match (cfg.net.as_mut(), given) {
        (Some(saved), Some(g)) => {
            *saved = g.clone();
            Ok(())
        }
        (Some(saved), None) => Err(bad(format!(
            "it has a network device (saved MAC {}): give the clone its own TAP and MAC \
             (--restore-net fd:N,mac=...)",
            saved.mac
        ))),
        (None, Some(_)) => Err(bad(
            "it has no network device, but --restore-net was given (a device cannot be added \
             to a saved guest)"
                .into(),
        )),
        (None, None) => Ok(()),
    }
}

impl Vm {
    /// The net device's counters, if it has one.
    pub fn net_counters(&self) -> Option<devices::virtio::net::NetCounters> {
        self.net.as_ref().map(|n| n.counters())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_needs_a_new_identity_for_a_saved_net_device_and_refuses_one_without() {
        let n: NetDeviceConfig = "fd:9,mac=02:00:00:00:00:01".parse().unwrap();
        let clone: NetDeviceConfig = "fd:10,mac=02:00:00:00:00:02".parse().unwrap();
        let dir = Path::new("/snap");
        let mut with = VmConfig::linux("k".into());
        with.net = Some(n);
        let e = apply_restore_net(dir, &mut with.clone(), None).unwrap_err();
        assert!(e.to_string().contains("--restore-net"), "{e}");
        apply_restore_net(dir, &mut with, Some(&clone)).unwrap();
        assert_eq!(with.net.as_ref(), Some(&clone));
        let mut without = VmConfig::linux("k".into());
        let e = apply_restore_net(dir, &mut without, Some(&clone)).unwrap_err();
        assert!(e.to_string().contains("no network device"), "{e}");
        apply_restore_net(dir, &mut without, None).unwrap();
    }

    #[test]
    fn a_descriptor_that_is_not_a_tap_is_refused() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        let e = open_tap(&TapSource::Fd(fd)).unwrap_err().to_string();
        assert!(e.contains("net:"), "{e}");
        let e = open_tap(&TapSource::Fd(1)).unwrap_err().to_string();
        assert!(e.contains("not an inherited TAP"), "{e}");
    }
}
