//! virtio-balloon: the host asks the guest for memory back (inflate), the
//! guest reports the pages it freed (free page reporting), and posts its
//! memory statistics.
//!
//! Queues, in the spec's order (virtio 1.2, 5.5.2): inflate, deflate, then
//! stats if VIRTIO_BALLOON_F_STATS_VQ was negotiated, then reporting if
//! VIRTIO_BALLOON_F_FREE_PAGE_REPORTING was; a queue not negotiated takes
//! no index, so the ones after it shift down ([`QueueLayout`]). Free page
//! hinting (VIRTIO_BALLOON_F_FREE_PAGE_HINT) and page poisoning are not
//! offered; their config fields read as zero.
//!
//! Giving memory back is the VMM's business ([`GiveBack`]): it knows how
//! each guest region is mapped (anonymous, `MAP_PRIVATE` over a snapshot's
//! memory file, or shared) and so how to drop its pages
//! ([`release::MappedRegions`] does it for all three).
//!
//! Everything the guest hands in is checked: each PFN and reported range
//! lies inside one guest memory region (never over a hole), reported
//! ranges are page aligned, descriptors go the way the spec wants
//! (inflate, deflate and stats device-readable; reporting device-writable),
//! a chain holds at most [`MAX_PFNS_PER_CHAIN`] PFNs, a notification
//! serves at most [`MAX_PAGES_PER_NOTIFY`] pages (the rest waits for the
//! next one), a stats buffer is parsed for at most [`MAX_STATS_ENTRIES`]
//! entries, and `actual` is never above guest memory. What is refused is
//! counted ([`BalloonCounters`]) and its buffer returned.

mod device;
mod events;
mod parse;
mod persist;
mod queues;
pub mod release;

pub use device::{Balloon, BalloonError, BalloonHandle};
pub use events::BalloonEvents;
pub use parse::{BalloonStats, PageRange, RangeError, StatsParse};
pub use persist::{BalloonArgs, BalloonState};
pub use queues::{BalloonCounters, QueueLayout};
pub use release::{GiveBack, GiveBackError};

use serde::{Deserialize, Serialize};

/// Virtio device type of a memory balloon.
pub const TYPE_BALLOON: u32 = 5;
/// Size offered for each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Feature: the host must be told before deflated pages are used (not
/// offered: deflating needs nothing from the host).
pub const VIRTIO_BALLOON_F_MUST_TELL_HOST: u32 = 0;
/// Feature: the stats queue.
pub const VIRTIO_BALLOON_F_STATS_VQ: u32 = 1;
/// Feature: the guest deflates when it runs out of memory.
pub const VIRTIO_BALLOON_F_DEFLATE_ON_OOM: u32 = 2;
/// Feature: free page hinting (not offered).
pub const VIRTIO_BALLOON_F_FREE_PAGE_HINT: u32 = 3;
/// Feature: page poisoning (not offered).
pub const VIRTIO_BALLOON_F_PAGE_POISON: u32 = 4;
/// Feature: free page reporting (the reporting queue).
pub const VIRTIO_BALLOON_F_FREE_PAGE_REPORTING: u32 = 5;
/// The balloon's page: PFNs count 4 KiB pages whatever the guest's page size.
pub const PAGE_SIZE: u64 = 4096;
/// Most PFNs one inflate or deflate chain may carry (Linux sends 256).
pub const MAX_PFNS_PER_CHAIN: usize = 4096;
/// Most pages (inflated, deflated or reported) one notification serves;
/// chains past it wait in the ring for the guest's next notification.
pub const MAX_PAGES_PER_NOTIFY: u64 = 1 << 18;
/// Most stats entries parsed from one buffer (Linux sends at most 16).
pub const MAX_STATS_ENTRIES: usize = 64;
/// Bytes of config space: num_pages, actual, free_page_hint_cmd_id,
/// poison_val (each le32).
pub const CONFIG_LEN: usize = 16;

/// How to build a balloon device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonConfig {
    /// Offer VIRTIO_BALLOON_F_DEFLATE_ON_OOM: the guest may take pages
    /// back from the balloon when it runs out of memory.
    #[serde(default)]
    pub deflate_on_oom: bool,
    /// Offer VIRTIO_BALLOON_F_STATS_VQ.
    #[serde(default = "yes")]
    pub stats: bool,
    /// Offer VIRTIO_BALLOON_F_FREE_PAGE_REPORTING.
    #[serde(default = "yes")]
    pub free_page_reporting: bool,
    /// Ask the guest for new stats every this many seconds (the VMM's
    /// event thread does it); 0: only when the host asks.
    #[serde(default)]
    pub stats_interval_s: u32,
}

fn yes() -> bool {
    true
}

impl BalloonConfig {
    /// Stats and free page reporting on, deflate-on-OOM off.
    pub fn new() -> Self {
        Self {
            deflate_on_oom: false,
            stats: true,
            free_page_reporting: true,
            stats_interval_s: 0,
        }
    }

    /// The feature bits this configuration offers.
    pub fn features(&self) -> u64 {
        let mut f = 1u64 << crate::virtio::VIRTIO_F_VERSION_1;
        if self.stats {
            f |= 1 << VIRTIO_BALLOON_F_STATS_VQ;
        }
        if self.deflate_on_oom {
            f |= 1 << VIRTIO_BALLOON_F_DEFLATE_ON_OOM;
        }
        if self.free_page_reporting {
            f |= 1 << VIRTIO_BALLOON_F_FREE_PAGE_REPORTING;
        }
        f
    }
}

impl std::str::FromStr for BalloonConfig {
    type Err = String;

    /// `on` (stats and reporting), or a comma list of `deflate_on_oom`,
    /// `no_stats`, `no_reporting`, `stats_s=N`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut c = BalloonConfig::new();
        for word in s.split(',').filter(|w| !w.is_empty()) {
            match word {
                "on" => {}
                "deflate_on_oom" => c.deflate_on_oom = true,
                "no_stats" => c.stats = false,
                "no_reporting" => c.free_page_reporting = false,
                w => match w.strip_prefix("stats_s=").map(str::parse) {
                    Some(Ok(n)) => c.stats_interval_s = n,
                    _ => {
                        return Err(format!(
                            "unknown balloon option {w:?} (on, deflate_on_oom, no_stats, \
                             no_reporting, stats_s=SECONDS)"
                        ))
                    }
                },
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_words_and_features() {
        let c: BalloonConfig = "on".parse().unwrap();
        assert_eq!(c, BalloonConfig::new());
        assert_eq!(
            c.features(),
            (1 << 32)
                | (1 << VIRTIO_BALLOON_F_STATS_VQ)
                | (1 << VIRTIO_BALLOON_F_FREE_PAGE_REPORTING)
        );
        let c: BalloonConfig = "deflate_on_oom,no_stats,no_reporting".parse().unwrap();
        assert_eq!(
            c.features(),
            (1 << 32) | (1 << VIRTIO_BALLOON_F_DEFLATE_ON_OOM)
        );
        assert!("bogus".parse::<BalloonConfig>().is_err());
        assert_eq!(
            "stats_s=5"
                .parse::<BalloonConfig>()
                .unwrap()
                .stats_interval_s,
            5
        );
        assert!("stats_s=-1".parse::<BalloonConfig>().is_err());
        assert!("stats_s=".parse::<BalloonConfig>().is_err());
    }
}
