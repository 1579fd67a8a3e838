//! virtio-balloon: hostile descriptor tables and rings over real guest
//! memory (see `shoal_fuzz::queue` for the checks every device passes) on
//! every queue layout the features allow, with PFN lists, stats entries
//! and config writes from the input. Also: the device writes nothing into
//! any buffer (every used length is 0), every range it gives back is page
//! aligned, non-empty and inside guest memory, one notification gives back
//! a bounded amount, `actual` never exceeds guest memory, and after a
//! driver reset a well-formed inflate is served.

use bolero::{check, TypeGenerator};
use devices::virtio::balloon::{
    Balloon, BalloonConfig, GiveBack, GiveBackError, PageRange, MAX_PAGES_PER_NOTIFY,
    MAX_PFNS_PER_CHAIN, QUEUE_SIZE,
};
use devices::virtio::VirtioDevice;
use devices::BusDevice;
use shoal_fuzz::queue::{pick_sizes, Kick, Rig, MEM_BYTES};
use std::sync::{Arc, Mutex};
use vm_memory::{Bytes, GuestAddress};

const F_VERSION_1: u64 = 1 << 32;
const PAGE: u64 = 4096;

#[derive(Debug, Clone, TypeGenerator)]
enum Action {
    /// Write these words at the start of the first descriptor's buffer
    /// (PFNs, or stats entries), then notify.
    Kick { words: Vec<u32>, kick: Kick },
    /// The guest writes config space.
    Config { offset: u8, value: u32, len: u8 },
    /// The host asks for stats.
    RequestStats,
    /// The host sets a target.
    Target(u64),
}

#[derive(Debug, Clone, TypeGenerator)]
struct Input {
    features: u8,
    sizes: [u8; 4],
    actions: Vec<Action>,
}

/// Checks and records every range the device gives back.
#[derive(Clone, Default)]
struct Checker(Arc<Mutex<u64>>);

impl GiveBack for Checker {
    fn give_back(
        &mut self,
        _: &vm_memory::GuestMemoryMmap,
        r: PageRange,
    ) -> Result<(), GiveBackError> {
        assert!(
            r.len > 0 && r.addr.is_multiple_of(PAGE) && r.len.is_multiple_of(PAGE),
            "{r:?}"
        );
        let end = r.addr.checked_add(r.len).expect("range wraps");
        assert!(end <= MEM_BYTES as u64, "{r:?} is outside guest memory");
        *self.0.lock().unwrap() += r.len / PAGE;
        Ok(())
    }
}

#[test]
fn balloon_queues() {
    check!()
        .with_type::<Input>()
        .with_test_time(shoal_fuzz::budget())
        .with_max_len(2048)
        .for_each(run);
}

fn run(input: &Input) {
    let checker = Checker::default();
    let mem = devices::virtio::testing::mem_sized(MEM_BYTES);
    let cfg = BalloonConfig {
        deflate_on_oom: input.features & 1 != 0,
        stats: true,
        free_page_reporting: true,
        stats_interval_s: 0,
    };
    let dev = Balloon::new(&cfg, &mem, Box::new(checker.clone()));
    let h = dev.handle();
    // Features the driver takes: any subset of the offer, VERSION_1 always.
    let features = F_VERSION_1 | (u64::from(input.features) & dev.avail_features() & 0xff);
    let n = dev.queue_count(features);
    let sizes = pick_sizes(&[QUEUE_SIZE; 4][..n], &input.sizes);
    let mut rig = Rig::new(Box::new(dev), features, &sizes);
    let mem_pages = MEM_BYTES as u64 / PAGE;
    for a in input.actions.iter().take(32) {
        match a {
            Action::Kick { words, kick } => {
                let (q, written) = rig.load(kick);
                if let Some(first) = written.first() {
                    for (i, w) in words.iter().take(64).enumerate() {
                        let at = first.addr.wrapping_add(4 * i as u64);
                        let _ = rig.mem().write_obj(*w, GuestAddress(at));
                    }
                }
                *checker.0.lock().unwrap() = 0;
                rig.notify(q, kick);
                for &(_, id, len) in &rig.last_used {
                    assert_eq!(len, 0, "chain {id}: used length {len}");
                }
                let given = *checker.0.lock().unwrap();
                // The cap is checked between chains and between reported
                // ranges: at most one chain of PFNs, or one range (at most
                // guest memory), past it.
                let bound = MAX_PAGES_PER_NOTIFY + (MAX_PFNS_PER_CHAIN as u64).max(mem_pages);
                assert!(given <= bound, "{given} pages in one notification");
            }
            Action::Config { offset, value, len } => {
                let len = usize::from(*len % 5);
                let bytes = value.to_le_bytes();
                rig.act(|d| {
                    d.t.write(0x100 + u64::from(*offset % 20), &bytes[..len]);
                });
            }
            Action::RequestStats => rig.act(|_| {
                h.request_stats();
            }),
            Action::Target(t) => {
                let ok = h.set_target(*t).is_ok();
                assert_eq!(ok, *t <= mem_pages, "target {t}");
            }
        }
        assert!(u64::from(h.actual()) <= mem_pages, "actual {}", h.actual());
        assert!(u64::from(h.target()) <= mem_pages);
    }
    rig.reset_and_reuse();
    if rig.active {
        let before = h.counters().inflated_pages;
        let buf = 0x20000u64;
        rig.mem().write_obj(3u32, GuestAddress(buf)).unwrap();
        rig.d.write_desc(0, buf, 4, 0, 0);
        rig.d.publish(0);
        rig.d.notify();
        assert_eq!(
            h.counters().inflated_pages,
            before + 1,
            "a well-formed inflate after reset was not served"
        );
    }
}
