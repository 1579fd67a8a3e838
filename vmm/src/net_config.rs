//! The virtio-net device's configuration: where its TAP comes from, the
//! guest's MAC and the rate limits, as `--net` / `--restore-net` give them
//! (`fd:N,mac=02:5a:..[,rx_bps=N][,rx_pps=N][,tx_bps=N][,tx_pps=N]`, or
//! `tap=NAME,...` for development and tests).

use devices::rate_limiter::{BucketConfig, RateLimit};
use devices::virtio::net::{MacAddr, NetConfig};
use serde::{Deserialize, Serialize};

/// Where the TAP comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TapSource {
    /// A descriptor the VMM inherited, already attached to a TAP (opened
    /// by the runtime inside the sandbox's network namespace). Each device
    /// build takes a duplicate, so a pre-warmed VMM can reload.
    Fd(i32),
    /// A TAP opened (or created) by name in the VMM's network namespace.
    Name(String),
}

/// One virtio-net device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetDeviceConfig {
    /// Its TAP. In a snapshot this is only a record: a restore must be
    /// given its own ([`crate::RestoreOptions::net`]).
    pub tap: TapSource,
    /// The guest's MAC (unicast, not zero); the device drops frames the
    /// guest sends from any other.
    pub mac: MacAddr,
    /// Limits on host-to-guest frames.
    #[serde(default)]
    pub rx_rate: RateLimit,
    /// Limits on guest-to-host frames.
    #[serde(default)]
    pub tx_rate: RateLimit,
}

/// Why a `--net` spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetSpecError {
    /// Not `fd:N` or `tap=NAME` first.
    #[error("{0:?}: expected fd:N or tap=NAME first, then mac=..")]
    Source(String),
    /// A descriptor below 3 or not a number.
    #[error("fd:{0}: expected a descriptor number of 3 or above")]
    Fd(String),
    /// A bad MAC.
    #[error("mac: {0}")]
    Mac(String),
    /// No `mac=`.
    #[error("mac=XX:XX:XX:XX:XX:XX is required")]
    NoMac,
    /// An unknown or repeated key, or a bad number.
    #[error("{0}")]
    Option(String),
}

impl std::str::FromStr for NetDeviceConfig {
    type Err = NetSpecError;

    fn from_str(s: &str) -> Result<Self, NetSpecError> {
        let mut parts = s.split(',');
        let first = parts.next().unwrap_or_default();
        let tap = if let Some(n) = first.strip_prefix("fd:") {
            match n.parse::<i32>() {
                Ok(fd) if fd > 2 => TapSource::Fd(fd),
                _ => return Err(NetSpecError::Fd(n.into())),
            }
        } else if let Some(name) = first.strip_prefix("tap=") {
            devices::virtio::net::tap::validate_name(name)
                .map_err(|e| NetSpecError::Source(e.to_string()))?;
            TapSource::Name(name.into())
        } else {
            return Err(NetSpecError::Source(first.into()));
        };
        let mut mac = None;
        let mut rates: [Option<u64>; 4] = [None; 4];
        const KEYS: [&str; 4] = ["rx_bps", "rx_pps", "tx_bps", "tx_pps"];
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| NetSpecError::Option(format!("{p:?}: expected KEY=VALUE")))?;
            if k == "mac" {
                if mac.is_some() {
                    return Err(NetSpecError::Option("mac given twice".into()));
                }
                let m: MacAddr = v.parse().map_err(|e| NetSpecError::Mac(format!("{e}")))?;
                mac = Some(m.validate().map_err(|e| NetSpecError::Mac(e.to_string()))?);
                continue;
            }
            let i = KEYS.iter().position(|&x| x == k).ok_or_else(|| {
                NetSpecError::Option(format!(
                    "unknown key {k:?} (mac, rx_bps, rx_pps, tx_bps, tx_pps)"
                ))
            })?;
            let n: u64 =
                v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    NetSpecError::Option(format!("{k}={v}: expected a number > 0"))
                })?;
            if rates[i].replace(n).is_some() {
                return Err(NetSpecError::Option(format!("{k} given twice")));
            }
        }
        // A bucket holds one second's worth (at least one largest frame's
        // bytes, so a full-size frame can always pass eventually).
        let bucket = |r: Option<u64>, min: u64| {
            r.map(|rate_per_sec| BucketConfig {
                rate_per_sec,
                burst: rate_per_sec.max(min),
            })
        };
        let max_frame = devices::virtio::net::MAX_FRAME_LEN as u64;
        Ok(NetDeviceConfig {
            tap,
            mac: mac.ok_or(NetSpecError::NoMac)?,
            rx_rate: RateLimit {
                bytes: bucket(rates[0], max_frame),
                packets: bucket(rates[1], 1),
            },
            tx_rate: RateLimit {
                bytes: bucket(rates[2], max_frame),
                packets: bucket(rates[3], 1),
            },
        })
    }
}

impl NetDeviceConfig {
    /// The device's build configuration.
    pub fn device_config(&self) -> NetConfig {
        NetConfig {
            mac: self.mac,
            rx_rate: self.rx_rate,
            tx_rate: self.tx_rate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let c: NetDeviceConfig = "fd:7,mac=02:5a:0a:d5:00:02,tx_bps=1000000,rx_pps=500"
            .parse()
            .unwrap();
        assert_eq!(c.tap, TapSource::Fd(7));
        assert_eq!(c.mac, MacAddr([2, 0x5a, 10, 0xd5, 0, 2]));
        assert_eq!(
            c.tx_rate.bytes,
            Some(BucketConfig {
                rate_per_sec: 1_000_000,
                burst: 1_000_000
            })
        );
        assert_eq!(c.rx_rate.packets.unwrap().rate_per_sec, 500);
        assert!(c.rx_rate.bytes.is_none() && c.tx_rate.packets.is_none());
        let c: NetDeviceConfig = "tap=shtap0,mac=02:00:00:00:00:01".parse().unwrap();
        assert_eq!(c.tap, TapSource::Name("shtap0".into()));
        for (bad, why) in [
            ("", "expected fd:N or tap=NAME"),
            ("fd:2,mac=02:00:00:00:00:01", "3 or above"),
            ("fd:x,mac=02:00:00:00:00:01", "3 or above"),
            ("fd:5", "mac=XX"),
            ("fd:5,mac=01:00:00:00:00:01", "unicast"),
            ("fd:5,mac=00:00:00:00:00:00", "unicast"),
            ("fd:5,mac=zz", "MAC"),
            ("fd:5,mac=02:00:00:00:00:01,mac=02:00:00:00:00:02", "twice"),
            ("fd:5,mac=02:00:00:00:00:01,rx_bps=0", "> 0"),
            ("fd:5,mac=02:00:00:00:00:01,speed=9", "unknown key"),
            ("fd:5,mac=02:00:00:00:00:01,tx_pps", "KEY=VALUE"),
            ("tap=,mac=02:00:00:00:00:01", ""),
            ("tap=a/b,mac=02:00:00:00:00:01", ""),
        ] {
            let e = bad.parse::<NetDeviceConfig>().unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
