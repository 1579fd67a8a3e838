//! A VMM's virtio-balloon device as its command line names it: `--balloon
//! SPEC` when booting, SPEC being `on` or a comma list of
//! `deflate_on_oom`, `no_stats`, `no_reporting`, `stats_s=N`. A restored
//! VM has the balloon its snapshot has (the flag is for boots only).

/// The balloon device of a booted VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalloonOptions {
    /// The guest may take pages back from the balloon when it runs out of
    /// memory.
    pub deflate_on_oom: bool,
    /// The guest's memory statistics (the stats queue).
    pub stats: bool,
    /// Free page reporting: the guest reports the pages it freed and the
    /// VMM drops them.
    pub free_page_reporting: bool,
    /// Ask the guest for new statistics every this many seconds (0: only
    /// on a `balloon` request).
    pub stats_interval_s: u32,
}

impl Default for BalloonOptions {
    /// Stats and free page reporting on, deflate-on-OOM off, no timer
    /// (`--balloon on`).
    fn default() -> Self {
        Self {
            deflate_on_oom: false,
            stats: true,
            free_page_reporting: true,
            stats_interval_s: 0,
        }
    }
}

impl BalloonOptions {
    /// The flag's value: `on[,deflate_on_oom][,no_stats][,no_reporting][,stats_s=N]`.
    pub fn arg(&self) -> String {
        let mut s = String::from("on");
        for (on, word) in [
            (self.deflate_on_oom, "deflate_on_oom"),
            (!self.stats, "no_stats"),
            (!self.free_page_reporting, "no_reporting"),
        ] {
            if on {
                s.push(',');
                s.push_str(word);
            }
        }
        if self.stats_interval_s > 0 {
            s.push_str(&format!(",stats_s={}", self.stats_interval_s));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values() {
        assert_eq!(BalloonOptions::default().arg(), "on");
        let b = BalloonOptions {
            deflate_on_oom: true,
            stats: false,
            free_page_reporting: false,
            stats_interval_s: 5,
        };
        assert_eq!(b.arg(), "on,deflate_on_oom,no_stats,no_reporting,stats_s=5");
    }
}
