//! The sandboxes' virtio-balloon devices as the daemon sees them: new
//! templates get one ([`crate::Config::balloon`]: free page reporting and
//! deflate-on-OOM by default, so pages a guest frees go back to the host at
//! once; `shoald --no-balloon` turns it off; templates built before keep
//! what they have), and their state is sampled every [`INTERVAL`] (one
//! control request per sandbox, each with [`CALL_DEADLINE`]) for
//! `/metrics` (`shoal_balloon_*`).

use super::{blocking, Daemon, Live};
use shoal_runtime::vmm_balloon::BalloonOptions;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How often each sandbox's balloon is asked for its state.
pub const INTERVAL: Duration = Duration::from_secs(30);
/// Deadline of one balloon request.
pub const CALL_DEADLINE: Duration = Duration::from_secs(3);

/// The balloon new templates get unless turned off: statistics, free page
/// reporting, deflate-on-OOM (a guest short of memory takes pages back
/// from its balloon rather than killing a process).
pub fn default_options() -> BalloonOptions {
    BalloonOptions {
        deflate_on_oom: true,
        ..BalloonOptions::default()
    }
}

/// Asks every live sandbox's balloon for its state, forever.
pub async fn run(d: Arc<Daemon>) {
    loop {
        tokio::time::sleep(INTERVAL).await;
        let lives: Vec<Arc<Live>> = d
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|l| !l.no_balloon.load(Ordering::Acquire))
            .cloned()
            .collect();
        for l in lives {
            sample(&l).await;
        }
    }
}

/// Asks `l`'s balloon for its state and keeps it.
pub async fn sample(l: &Live) {
    let Some(vm) = l.vm() else {
        return;
    };
    let res = blocking("balloon", CALL_DEADLINE, move || {
        Ok(vm.balloon(None).map(|r| r.map_err(|e| e.to_string())))
    })
    .await;
    let info = match res {
        Ok(Some(Ok(b))) => Some(b),
        // This kind has none, or the VM has none (an older template).
        Ok(None) | Ok(Some(Err(_))) => {
            l.no_balloon.store(true, Ordering::Release);
            None
        }
        Err(e) => {
            tracing::debug!(sandbox = %l.id, "balloon: {e}");
            return;
        }
    };
    *l.balloon.lock().unwrap_or_else(|e| e.into_inner()) = info;
}

/// Sums over the sandboxes whose balloon answered last time.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub sandboxes: u64,
    pub reported_bytes: u64,
    pub inflated_bytes: u64,
    pub guest_free_bytes: u64,
    pub refused: u64,
}

/// [`Totals`] of `infos`.
pub fn totals<'a>(infos: impl Iterator<Item = &'a vmm_api::BalloonInfo>) -> Totals {
    let mut t = Totals::default();
    for b in infos {
        t.sandboxes += 1;
        t.reported_bytes += b.reported_bytes;
        t.inflated_bytes += b.actual_mib << 20;
        t.guest_free_bytes += b.stats.free_memory.unwrap_or(0);
        t.refused += b.refused;
    }
    t
}

/// The `shoal_balloon_*` lines of `/metrics`.
pub fn render_metrics(d: &Daemon) -> String {
    let lives: Vec<Arc<Live>> = d
        .live
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .cloned()
        .collect();
    let infos: Vec<vmm_api::BalloonInfo> = lives
        .iter()
        .filter_map(|l| *l.balloon.lock().unwrap_or_else(|e| e.into_inner()))
        .collect();
    render(&totals(infos.iter()), d.cfg.balloon.is_some())
}

fn render(t: &Totals, on: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# HELP shoal_balloon_new_templates Whether new templates get a virtio-balloon \
         (free page reporting).\n# TYPE shoal_balloon_new_templates gauge\n\
         shoal_balloon_new_templates {}",
        u64::from(on)
    );
    for (name, help, v) in [
        (
            "sandboxes",
            "Live sandboxes whose balloon answered.",
            t.sandboxes,
        ),
        (
            "reported_bytes",
            "Bytes their guests reported free (given back to the host) since they booted.",
            t.reported_bytes,
        ),
        (
            "inflated_bytes",
            "Guest memory their balloons hold.",
            t.inflated_bytes,
        ),
        (
            "guest_free_bytes",
            "Free memory their guests last reported.",
            t.guest_free_bytes,
        ),
        (
            "refused",
            "Guest balloon input refused (bad PFNs, ranges, stats).",
            t.refused,
        ),
    ] {
        let _ = writeln!(
            o,
            "# HELP shoal_balloon_{name} {help}\n# TYPE shoal_balloon_{name} gauge\n\
             shoal_balloon_{name} {v}"
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_exposition() {
        let a = vmm_api::BalloonInfo {
            actual_mib: 2,
            reported_bytes: 4096,
            stats: vmm_api::GuestMemoryStats {
                free_memory: Some(100),
                ..Default::default()
            },
            ..Default::default()
        };
        let b = vmm_api::BalloonInfo {
            reported_bytes: 1,
            refused: 3,
            ..Default::default()
        };
        let t = totals([a, b].iter());
        assert_eq!(
            t,
            Totals {
                sandboxes: 2,
                reported_bytes: 4097,
                inflated_bytes: 2 << 20,
                guest_free_bytes: 100,
                refused: 3
            }
        );
        let text = render(&t, true);
        assert!(
            text.contains("\nshoal_balloon_reported_bytes 4097\n"),
            "{text}"
        );
        assert!(text.contains("\nshoal_balloon_new_templates 1\n"), "{text}");
        assert!(render(&Totals::default(), false).contains("\nshoal_balloon_new_templates 0\n"));
        assert!(default_options().deflate_on_oom && default_options().free_page_reporting);
    }
}
