//! A VMM's virtio-net device as its command line names it (issue 18):
//! `--net SPEC` when booting, `--restore-net SPEC` when restoring (or
//! prewarming), SPEC being `fd:N` or `tap=NAME`, then `mac=..`, then the
//! optional token-bucket limits `rx_bps=`, `rx_pps=`, `tx_bps=`, `tx_pps=`.
//! [`NetAttach`] is what the daemon hands a backend for a networked
//! sandbox: its slot's TAP, opened inside the slot's netns, and MAC.

use std::fs::File;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::Arc;

/// Token-bucket limits of a net device (None: unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetLimits {
    /// Bytes per second the guest may receive.
    pub rx_bps: Option<u64>,
    /// Packets per second the guest may receive.
    pub rx_pps: Option<u64>,
    /// Bytes per second the guest may send.
    pub tx_bps: Option<u64>,
    /// Packets per second the guest may send.
    pub tx_pps: Option<u64>,
}

/// The TAP a net device is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetTap {
    /// A descriptor the VMM inherits (>= 3).
    Fd(RawFd),
    /// Opened by name by the VMM (development and tests only).
    Name(String),
}

/// One virtio-net device of a VMM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetDevice {
    /// Its TAP.
    pub tap: NetTap,
    /// The guest's MAC address.
    pub mac: [u8; 6],
    /// Its limits.
    pub limits: NetLimits,
}

impl NetDevice {
    /// The flag's value: `fd:N,mac=02:5a:..[,rx_bps=N..]`.
    pub fn arg(&self) -> String {
        let mut s = match &self.tap {
            NetTap::Fd(fd) => format!("fd:{fd}"),
            NetTap::Name(n) => format!("tap={n}"),
        };
        s.push_str(",mac=");
        s.push_str(&mac_string(self.mac));
        let l = self.limits;
        for (k, v) in [
            ("rx_bps", l.rx_bps),
            ("rx_pps", l.rx_pps),
            ("tx_bps", l.tx_bps),
            ("tx_pps", l.tx_pps),
        ] {
            if let Some(v) = v {
                s.push_str(&format!(",{k}={v}"));
            }
        }
        s
    }
}

/// `02:5a:0a:d5:00:02`.
pub fn mac_string(mac: [u8; 6]) -> String {
    mac.map(|b| format!("{b:02x}")).join(":")
}

/// A networked sandbox's link, as the daemon hands it to a backend's
/// restore: the VMM gets `tap` as `--restore-net fd:N,mac=..` and its jail
/// joins `netns` (the slot's, where the TAP lives) instead of a fresh one.
#[derive(Debug, Clone)]
pub struct NetAttach {
    /// The slot's network namespace (`/run/netns/shoal-N`).
    pub netns: PathBuf,
    /// The slot's TAP, opened inside that netns
    /// (`shoal_hostnet::Slot::open_tap_fd`).
    pub tap: Arc<File>,
    /// The guest's MAC address (the slot's).
    pub mac: [u8; 6],
    /// The device's limits.
    pub limits: NetLimits,
}

/// The net device a template boots with (issue 18): a TAP the daemon
/// lends for the boot (a slot's, denying everything) and a MAC no sandbox
/// uses. The guest leaves the link down, so nothing is sent; each restore
/// gets its own TAP and MAC.
#[derive(Debug, Clone)]
pub struct BootNet {
    /// The TAP (opened inside its netns).
    pub tap: Arc<File>,
    /// The MAC in the snapshot.
    pub mac: [u8; 6],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_as_the_vmm_takes_them() {
        let mac = [0x02, 0x5a, 0x0a, 0xd5, 0x00, 0x02];
        let d = NetDevice {
            tap: NetTap::Fd(10),
            mac,
            limits: NetLimits::default(),
        };
        assert_eq!(d.arg(), "fd:10,mac=02:5a:0a:d5:00:02");
        let d = NetDevice {
            tap: NetTap::Name("tap7".into()),
            mac,
            limits: NetLimits {
                rx_bps: Some(1_000_000),
                tx_pps: Some(500),
                ..Default::default()
            },
        };
        assert_eq!(
            d.arg(),
            "tap=tap7,mac=02:5a:0a:d5:00:02,rx_bps=1000000,tx_pps=500"
        );
    }
}
