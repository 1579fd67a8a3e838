//! virtio-balloon driven from the guest's side by the test driver, over
//! guest memory with a hole: the queue layout that shifts with the
//! negotiated features, config space, inflate/deflate with hostile PFN
//! lists, the stats queue, free page reporting with hostile ranges,
//! descriptor loops, the per-notification cap, and save/restore.

use devices::virtio::balloon::{
    Balloon, BalloonArgs, BalloonConfig, BalloonError, BalloonHandle, BalloonState, GiveBack,
    GiveBackError, PageRange, MAX_PFNS_PER_CHAIN, MAX_STATS_ENTRIES, QUEUE_SIZE, TYPE_BALLOON,
    VIRTIO_BALLOON_F_DEFLATE_ON_OOM, VIRTIO_BALLOON_F_FREE_PAGE_REPORTING,
    VIRTIO_BALLOON_F_STATS_VQ,
};
use devices::virtio::mmio::{status, MmioTransport};
use devices::virtio::persist::MmioArgs;
use devices::virtio::testing::{Driver, DATA};
use devices::virtio::{VirtioDevice, VirtioInterrupt, INT_CONFIG, VIRTIO_F_VERSION_1};
use devices::{BusDevice, IrqLine};
use snapshot::Persist;
use std::sync::{Arc, Mutex};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const MIB: u64 = 1 << 20;
/// Guest memory: 1 MiB at 0, a 1 MiB hole, 1 MiB at 2 MiB.
const HOLE: u64 = MIB;
const HIGH: u64 = 2 * MIB;
const MEM_PAGES: u64 = 512;

const V1: u64 = 1 << VIRTIO_F_VERSION_1;
const STATS: u64 = 1 << VIRTIO_BALLOON_F_STATS_VQ;
const REPORTING: u64 = 1 << VIRTIO_BALLOON_F_FREE_PAGE_REPORTING;
const OOM: u64 = 1 << VIRTIO_BALLOON_F_DEFLATE_ON_OOM;

fn us(v: u64) -> usize {
    usize::try_from(v).unwrap()
}

fn u32_<T: TryInto<u32>>(v: T) -> u32 {
    v.try_into().ok().unwrap()
}

fn holey_mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), us(MIB)), (GuestAddress(HIGH), us(MIB))])
        .unwrap()
}

/// Records what the device gives back; fails on demand.
#[derive(Clone, Default)]
struct Recorder {
    ranges: Arc<Mutex<Vec<PageRange>>>,
    fail: Arc<Mutex<bool>>,
}

impl GiveBack for Recorder {
    fn give_back(&mut self, _: &GuestMemoryMmap, r: PageRange) -> Result<(), GiveBackError> {
        if *self.fail.lock().unwrap() {
            return Err(GiveBackError::NoRegion {
                addr: r.addr,
                len: r.len,
            });
        }
        self.ranges.lock().unwrap().push(r);
        Ok(())
    }
}

impl Recorder {
    fn take(&self) -> Vec<PageRange> {
        std::mem::take(&mut *self.ranges.lock().unwrap())
    }
}

struct Guest {
    d: Driver,
    h: BalloonHandle,
    rec: Recorder,
}

fn device(cfg: &BalloonConfig) -> (Balloon, Recorder) {
    let rec = Recorder::default();
    (Balloon::new(cfg, &holey_mem(), Box::new(rec.clone())), rec)
}

/// A guest that negotiated `features` and set up `queues` queues.
fn guest(cfg: &BalloonConfig, features: u64, queues: usize) -> Guest {
    let (dev, rec) = device(cfg);
    let h = dev.handle();
    let mut d = Driver::with_mem(Box::new(dev), holey_mem());
    let st = d.bring_up_queues(features, &vec![16; queues]);
    assert_ne!(st & status::DRIVER_OK, 0, "status {st:#x}");
    Guest { d, h, rec }
}

fn full() -> Guest {
    guest(&BalloonConfig::new(), V1 | STATS | REPORTING, 4)
}

fn pfns(list: &[u32]) -> Vec<u8> {
    list.iter().flat_map(|p| p.to_le_bytes()).collect()
}

fn page(addr: u64, pages: u64) -> PageRange {
    PageRange {
        addr,
        len: pages * 4096,
    }
}

#[test]
fn handles_can_move_between_threads() {
    fn send<T: Send>() {}
    fn sync<T: Send + Sync>() {}
    send::<Balloon>();
    sync::<BalloonHandle>();
}

#[test]
fn features_follow_the_config_and_the_queues_shift_with_what_was_negotiated() {
    let (dev, _) = device(&BalloonConfig::new());
    assert_eq!(dev.device_type(), TYPE_BALLOON);
    assert_eq!(dev.avail_features(), V1 | STATS | REPORTING);
    let cfg = BalloonConfig {
        deflate_on_oom: true,
        stats: false,
        free_page_reporting: false,
        stats_interval_s: 0,
    };
    assert_eq!(device(&cfg).0.avail_features(), V1 | OOM);
    for (f, n) in [
        (V1, 2),
        (V1 | STATS, 3),
        (V1 | REPORTING, 3),
        (V1 | STATS | REPORTING, 4),
    ] {
        assert_eq!(dev.queue_count(f), n, "{f:#x}");
    }

    // Without stats, reporting is queue 2, and queue 3 does not exist.
    let mut g = guest(&BalloonConfig::new(), V1 | REPORTING, 3);
    g.d.wr(0x30, 3);
    assert_eq!(g.d.rd(0x34), 0, "QueueNumMax of a queue not negotiated");
    g.d.wr(0x30, 2);
    assert_eq!(g.d.rd(0x34), u32::from(QUEUE_SIZE));
    g.d.mem.write_obj(0u64, GuestAddress(DATA)).unwrap();
    let h = g.d.push_chain_on(2, &[(HIGH, 4096, true)]);
    g.d.notify_queue(2);
    assert_eq!(g.d.take_used_on(2), vec![(u32::from(h), 0)]);
    assert_eq!(g.rec.take(), vec![page(HIGH, 1)]);
    g.d.notify_queue(3);
    g.d.notify_queue(u32::MAX);
    assert_eq!(g.h.counters().reported_bytes, 4096);

    // A driver that readies 4 queues but negotiated 2: the extra queue
    // registers are not writable; it activates with 2.
    let g = guest(&BalloonConfig::new(), V1, 4);
    assert!(g.d.t.is_activated());
    assert_eq!(g.d.t.save().unwrap().queues.len(), 2);
    // Features not offered are not accepted.
    let g = guest(&BalloonConfig::new(), V1 | OOM | STATS, 3);
    assert_eq!(g.d.t.save().unwrap().acked_features, V1 | STATS);
}

fn read_u32(d: &mut Driver, off: u64) -> u32 {
    let mut b = [0u8; 4];
    d.t.read(0x100 + off, &mut b);
    u32::from_le_bytes(b)
}

#[test]
fn config_space_target_and_actual_are_checked() {
    let mut g = full();
    assert!(matches!(
        g.h.set_target(MEM_PAGES + 1),
        Err(BalloonError::Target { .. })
    ));
    assert!(g.h.set_target(u64::MAX).is_err());
    g.d.t.write(0x64, &u32::MAX.to_le_bytes());
    g.h.set_target(100).unwrap();
    assert_eq!(read_u32(&mut g.d, 0), 100);
    assert_ne!(g.d.rd(0x60) & INT_CONFIG, 0, "config interrupt");
    assert_eq!(g.h.target(), 100);

    g.d.t.write(0x104, &60u32.to_le_bytes());
    assert_eq!((g.h.actual(), read_u32(&mut g.d, 4)), (60, 60));
    // Above guest memory: ignored, counted.
    g.d.t.write(0x104, &(u32_(MEM_PAGES) + 1).to_le_bytes());
    g.d.t.write(0x104, &u32::MAX.to_le_bytes());
    assert_eq!(g.h.actual(), 60);
    assert_eq!(g.h.counters().refused_actual, 2);
    // A byte write merges into the value; writes beyond actual are ignored.
    g.d.t.write(0x105, &[1]);
    assert_eq!(g.h.actual(), 60 + 256);
    g.d.t.write(0x100, &7u32.to_le_bytes());
    g.d.t.write(0x103, &[1, 2]);
    g.d.t.write(0x108, &1u32.to_le_bytes());
    g.d.t.write(0x10c, &1u32.to_le_bytes());
    g.d.t.write(u64::MAX, &[1]);
    assert_eq!(read_u32(&mut g.d, 0), 100);
    assert_eq!(g.h.actual(), 316);
    assert_eq!((read_u32(&mut g.d, 8), read_u32(&mut g.d, 12)), (0, 0));
    let mut past = [0xffu8; 8];
    g.d.t.read(0x10c, &mut past);
    assert_eq!(past, [0; 8]);

    // A driver reset forgets actual, not the host's target.
    g.d.wr(0x70, 0);
    assert_eq!((g.h.actual(), g.h.target()), (0, 100));
}

#[test]
fn inflate_gives_back_coalesced_ranges_and_skips_pfns_outside_memory() {
    let mut g = full();
    // 3 adjacent pages, a page in the hole, pages across the end of the
    // low region and the start of the high one (not joined), one far out.
    let list = [16, 17, 18, 300, 255, 512, 513, u32::MAX, 40];
    g.d.mem
        .write_slice(&pfns(&list), GuestAddress(DATA))
        .unwrap();
    // Split mid-PFN across two descriptors: framing is the driver's.
    let h = g.d.push_chain(&[(DATA, 6, false), (DATA + 6, 30, false)]);
    g.d.notify();
    assert_eq!(g.d.take_used(), vec![(u32::from(h), 0)]);
    assert_eq!(
        g.rec.take(),
        vec![
            page(16 * 4096, 3),
            page(255 * 4096, 1),
            page(HIGH, 2),
            page(40 * 4096, 1)
        ]
    );
    let c = g.h.counters();
    assert_eq!((c.inflated_pages, c.refused_pfns), (7, 2));

    // Deflate counts, gives nothing back.
    let h = g.d.push_chain_on(1, &[(DATA, 36, false)]);
    g.d.notify_queue(1);
    assert_eq!(g.d.take_used_on(1), vec![(u32::from(h), 0)]);
    assert!(g.rec.take().is_empty());
    let c = g.h.counters();
    assert_eq!((c.deflated_pages, c.refused_pfns), (7, 4));

    // The host failing to give back is counted, nothing else changes.
    *g.rec.fail.lock().unwrap() = true;
    g.d.push_chain(&[(DATA, 4, false)]);
    g.d.notify();
    assert_eq!(g.d.take_used().len(), 1);
    assert_eq!(g.h.counters().give_back_errors, 1);
}

#[test]
fn hostile_pfn_chains_are_refused_whole_and_returned() {
    let mut g = full();
    g.d.mem
        .write_slice(&pfns(&[20, 21]), GuestAddress(DATA))
        .unwrap();
    let big = (u32_(MAX_PFNS_PER_CHAIN) + 1) * 4;
    let chains: [&[(u64, u32, bool)]; 6] = [
        // Device-writable: the device only reads PFNs.
        &[(DATA, 8, true)],
        &[(DATA, 4, false), (DATA + 4, 4, true)],
        // Not whole PFNs.
        &[(DATA, 7, false)],
        // Outside guest memory, in the hole, wrapping.
        &[(HOLE, 8, false)],
        &[(u64::MAX - 3, 8, false)],
        // Longer than a chain may be (the bytes are in memory).
        &[(0, big, false)],
    ];
    let mut heads = vec![];
    for c in chains {
        heads.push(u32::from(g.d.push_chain(c)));
    }
    g.d.notify();
    let used: Vec<u32> = g.d.take_used().into_iter().map(|(id, _)| id).collect();
    assert_eq!(used, heads);
    let c = g.h.counters();
    assert_eq!((c.refused_chains, c.inflated_pages), (6, 0));
    assert!(g.rec.take().is_empty());

    // The device still works.
    g.d.push_chain(&[(DATA, 8, false)]);
    g.d.notify();
    assert_eq!(g.rec.take(), vec![page(20 * 4096, 2)]);
}

#[test]
fn descriptor_loops_and_bad_heads_end() {
    let mut g = full();
    g.d.mem
        .write_slice(&pfns(&[5]), GuestAddress(DATA))
        .unwrap();
    // 0 -> 1 -> 0 ... on inflate (NEXT flag, device-readable).
    g.d.write_desc(0, DATA, 4, 1, 1);
    g.d.write_desc(1, DATA, 4, 1, 0);
    g.d.publish(0);
    // A head outside the table.
    g.d.publish(200);
    g.d.notify();
    // The looping chain ends at the queue size: 16 PFNs of page 5 read,
    // one chain refused as too long or served; either way it comes back.
    let used = g.d.take_used();
    assert_eq!(used.first().map(|u| u.0), Some(0));
    // Same on the reporting queue (device-writable loop).
    g.d.write_desc_on(3, 0, HIGH, 4096, 3, 1);
    g.d.write_desc_on(3, 1, HIGH, 4096, 3, 0);
    g.d.publish_on(3, 0);
    g.d.notify_queue(3);
    assert_eq!(g.d.take_used_on(3), vec![(0, 0)]);
    assert!(g.h.counters().reported_bytes <= 16 * 4096);
}

#[test]
fn a_notification_serves_a_bounded_amount_and_the_rest_waits() {
    let mut g = guest(&BalloonConfig::new(), V1, 2);
    // Re-bring-up with a 256-entry inflate queue.
    g.d.wr(0x70, 0);
    g.d.bring_up_queues(V1, &[256, 16]);
    let list: Vec<u32> = (0..u32_(MAX_PFNS_PER_CHAIN)).map(|i| i % 256).collect();
    g.d.mem
        .write_slice(&pfns(&list), GuestAddress(DATA))
        .unwrap();
    let len = u32_(MAX_PFNS_PER_CHAIN * 4);
    for _ in 0..100 {
        g.d.push_chain(&[(DATA, len, false)]);
    }
    g.d.notify();
    let per_notify = (1u64 << 18) / MAX_PFNS_PER_CHAIN as u64;
    assert_eq!(g.d.take_used().len() as u64, per_notify);
    assert_eq!(g.h.counters().capped, 1);
    g.d.notify();
    assert_eq!(g.d.take_used().len() as u64, 100 - per_notify);
    assert_eq!(
        g.h.counters().inflated_pages,
        100 * MAX_PFNS_PER_CHAIN as u64
    );
}

fn stat(tag: u16, v: u64) -> Vec<u8> {
    let mut e = tag.to_le_bytes().to_vec();
    e.extend(v.to_le_bytes());
    e
}

#[test]
fn stats_are_parsed_bounded_and_the_buffer_is_held_until_asked() {
    let mut g = full();
    assert!(!g.h.request_stats(), "no buffer yet");
    let mut buf = stat(4, 1000);
    buf.extend(stat(5, 2000));
    buf.extend(stat(77, 1));
    g.d.mem.write_slice(&buf, GuestAddress(DATA)).unwrap();
    let h = g.d.push_chain_on(2, &[(DATA, 30, false)]);
    g.d.notify_queue(2);
    assert!(g.d.take_used_on(2).is_empty(), "held");
    let s = g.h.stats();
    assert_eq!(
        (s.free_memory, s.total_memory, s.swap_in),
        (Some(1000), Some(2000), None)
    );
    assert_eq!(g.h.counters().stats_unknown_tags, 1);
    g.d.t.write(0x64, &u32::MAX.to_le_bytes());
    assert!(g.h.request_stats());
    assert_eq!(g.d.take_used_on(2), vec![(u32::from(h), 0)]);
    assert_ne!(g.d.rd(0x60), 0, "used-ring interrupt");
    assert!(!g.h.request_stats(), "already returned");

    // Too long: the first MAX_STATS_ENTRIES entries are read, no more.
    let mut long = vec![];
    for i in 0..MAX_STATS_ENTRIES as u64 + 100 {
        long.extend(stat(4, i));
    }
    g.d.mem.write_slice(&long, GuestAddress(DATA)).unwrap();
    let h1 = g.d.push_chain_on(2, &[(DATA, u32_(long.len()), false)]);
    // A second buffer while one is held: the first comes back. This one
    // is short, with a partial entry.
    let h2 = g.d.push_chain_on(2, &[(DATA, 15, false)]);
    g.d.notify_queue(2);
    assert_eq!(g.d.take_used_on(2), vec![(u32::from(h1), 0)]);
    let c = g.h.counters();
    assert_eq!((c.stats_updates, c.stats_malformed), (3, 2));
    assert_eq!(
        g.h.stats().free_memory,
        Some(0),
        "the last buffer's first entry"
    );

    // Device-writable, or outside memory: refused and returned at once;
    // the held one goes back too, as newer buffers came after it.
    let bad1 = g.d.push_chain_on(2, &[(DATA, 10, true)]);
    let bad2 = g.d.push_chain_on(2, &[(HOLE, 10, false)]);
    g.d.notify_queue(2);
    assert_eq!(
        g.d.take_used_on(2),
        vec![
            (u32::from(h2), 0),
            (u32::from(bad1), 0),
            (u32::from(bad2), 0)
        ]
    );
    assert_eq!(g.h.counters().refused_chains, 2);
    assert!(!g.h.request_stats());
    // A notification with nothing new parses nothing again.
    g.d.mem
        .write_slice(&stat(7, 9), GuestAddress(DATA))
        .unwrap();
    g.d.push_chain_on(2, &[(DATA, 10, false)]);
    g.d.notify_queue(2);
    g.d.notify_queue(2);
    assert_eq!(g.h.counters().stats_updates, 4);
    assert_eq!(g.h.stats().disk_caches, Some(9));
    assert!(g.h.request_stats());
    // An empty buffer is a valid (empty) update.
    g.d.push_chain_on(2, &[(DATA, 0, false)]);
    g.d.notify_queue(2);
    assert!(g.h.request_stats());
}

#[test]
fn reporting_gives_back_valid_ranges_and_refuses_the_rest() {
    let mut g = full();
    let chain: &[(u64, u32, bool)] = &[
        (HIGH, 512 * 1024, true),
        (0x80000, 0x10000, true),
        // Device-readable: the spec's reporting buffers are writable.
        (0x40000, 4096, false),
        // Unaligned start, unaligned length, empty.
        (0x40800, 4096, true),
        (0x40000, 100, true),
        (0x40000, 0, true),
        // Over the hole, in the hole, past the end, wrapping.
        (HOLE - 4096, 8192, true),
        (HOLE, 4096, true),
        (HIGH + MIB - 4096, 8192, true),
        (u64::MAX - 4095, 4096, true),
    ];
    let h = g.d.push_chain_on(3, chain);
    g.d.notify_queue(3);
    assert_eq!(g.d.take_used_on(3), vec![(u32::from(h), 0)]);
    assert_eq!(g.rec.take(), vec![page(HIGH, 128), page(0x80000, 16)]);
    let c = g.h.counters();
    assert_eq!(
        (c.reported_bytes, c.refused_reports),
        (512 * 1024 + 0x10000, 8)
    );
}

#[test]
fn transport_save_restore_and_the_balloon_state_round_trip() {
    let mut g = full();
    g.h.set_target(64).unwrap();
    g.d.t.write(0x104, &32u32.to_le_bytes());
    g.d.mem
        .write_slice(&stat(6, 4242), GuestAddress(DATA))
        .unwrap();
    let held = g.d.push_chain_on(2, &[(DATA, 10, false)]);
    assert!(held < 16);
    g.d.notify_queue(2);
    let mmio = g.d.t.save().unwrap();
    let st = g.h.save();
    assert_eq!(st.queues.len(), 4);

    // Restore through the transport (as the VMM does), then the rest.
    let rec = Recorder::default();
    let dev = Balloon::new(&BalloonConfig::new(), &g.d.mem, Box::new(rec.clone()));
    let h2 = dev.handle();
    let irq = IrqLine::new(5).unwrap();
    let mut t = MmioTransport::restore(
        MmioArgs {
            device: Box::new(dev),
            mem: g.d.mem.clone(),
            irq,
        },
        &mmio,
    )
    .unwrap();
    assert!(t.is_activated());
    h2.load(&st).unwrap();
    assert_eq!(h2.save(), st);
    assert_eq!((h2.target(), h2.actual()), (64, 32));
    assert_eq!(h2.stats().available_memory, Some(4242));
    // The held buffer is still returnable (it is the stats queue's next
    // entry: activation parsed it again), and queues work at their places.
    assert!(h2.request_stats());
    assert!(!h2.request_stats());
    let mut b = [0u8; 4];
    t.read(0x104, &mut b);
    assert_eq!(u32::from_le_bytes(b), 32);

    // A state that does not fit is refused.
    let mut bad = st.clone();
    bad.actual = u32_(MEM_PAGES) + 1;
    assert!(matches!(h2.load(&bad), Err(BalloonError::Config { .. })));
}

fn restore(st: &BalloonState, cfg: BalloonConfig) -> Result<Balloon, BalloonError> {
    let irq = Arc::new(VirtioInterrupt::new(IrqLine::new(5).unwrap()));
    Balloon::restore(
        BalloonArgs {
            config: cfg,
            mem: holey_mem(),
            irq,
            give_back: Box::new(Recorder::default()),
        },
        st,
    )
}

#[test]
fn device_restore_checks_the_state() {
    let mut g = full();
    g.d.mem
        .write_slice(&stat(4, 1), GuestAddress(DATA))
        .unwrap();
    g.d.push_chain_on(2, &[(DATA, 10, false)]);
    g.d.notify_queue(2);
    let st = Persist::save(&Balloon::new(
        &BalloonConfig::new(),
        &holey_mem(),
        Box::new(Recorder::default()),
    ))
    .unwrap();
    assert!(st.queues.is_empty());
    let inactive = restore(&st, BalloonConfig::new()).unwrap();
    assert_eq!(inactive.handle().save(), st);

    let st = g.h.save();
    // Guest memory of the restore is the same layout, but a fresh copy:
    // the queues are only checked against it.
    let dev = restore(&st, BalloonConfig::new()).unwrap();
    assert_eq!(dev.handle().save(), st);

    let no_stats = BalloonConfig {
        stats: false,
        ..BalloonConfig::new()
    };
    assert!(matches!(
        restore(&st, no_stats),
        Err(BalloonError::Features { .. })
    ));
    let mut bad = st.clone();
    bad.queues.pop();
    assert!(matches!(
        restore(&bad, BalloonConfig::new()),
        Err(BalloonError::QueueCount { .. })
    ));
    let mut bad = st.clone();
    bad.queues[1].desc_table = HOLE;
    assert!(matches!(
        restore(&bad, BalloonConfig::new()),
        Err(BalloonError::Activate(_))
    ));
    let mut bad = st.clone();
    bad.queues[0].size = 1024;
    assert!(restore(&bad, BalloonConfig::new()).is_err());
    let mut bad = st.clone();
    bad.num_pages = u32::MAX;
    assert!(matches!(
        restore(&bad, BalloonConfig::new()),
        Err(BalloonError::Config { .. })
    ));
    // Saved inactive: a fresh device with the saved config.
    let mut inactive = st.clone();
    inactive.queues.clear();
    let dev = restore(&inactive, BalloonConfig::new()).unwrap();
    assert!(!dev.handle().request_stats());
}

#[test]
fn the_stats_timer_returns_the_held_buffer_every_interval() {
    use event_manager::{EventManager, SubscriberOps};
    use std::time::Duration;
    let mut g = full();
    g.d.mem
        .write_slice(&stat(4, 1), GuestAddress(DATA))
        .unwrap();
    let h = g.d.push_chain_on(2, &[(DATA, 10, false)]);
    g.d.notify_queue(2);
    let timer = g.h.stats_timer(Duration::from_millis(20)).unwrap();
    let mut em = EventManager::<Box<dyn event_manager::MutEventSubscriber + Send>>::new().unwrap();
    em.add_subscriber(Box::new(timer));
    em.run_with_timeout(2000).unwrap();
    assert_eq!(g.d.take_used_on(2), vec![(u32::from(h), 0)]);
    // Nothing held now: the next tick changes nothing.
    em.run_with_timeout(2000).unwrap();
    assert!(g.d.take_used_on(2).is_empty());
}

#[test]
fn a_transport_saved_between_features_ok_and_driver_ok_restores_the_shifted_layout() {
    let (dev, _) = device(&BalloonConfig::new());
    let mut d = Driver::with_mem(Box::new(dev), holey_mem());
    d.wr(0x70, status::ACKNOWLEDGE);
    d.wr(0x70, status::ACKNOWLEDGE | status::DRIVER);
    d.wr(0x24, 1);
    d.wr(0x20, 1); // VERSION_1
    d.wr(0x24, 0);
    d.wr(0x20, u32_(REPORTING));
    d.wr(
        0x70,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
    );
    let saved = d.t.save().unwrap();
    assert_eq!(saved.queues.len(), 3, "inflate, deflate, reporting");

    let rec = Recorder::default();
    let fresh = Balloon::new(&BalloonConfig::new(), &d.mem, Box::new(rec.clone()));
    let t = MmioTransport::restore(
        MmioArgs {
            device: Box::new(fresh),
            mem: d.mem.clone(),
            irq: IrqLine::new(5).unwrap(),
        },
        &saved,
    )
    .unwrap();
    let mut d2 = Driver::with_mem(Box::new(device(&BalloonConfig::new()).0), d.mem.clone());
    d2.t = t;
    // The driver goes on: its queues, then DRIVER_OK.
    let st = d2.set_up_queues(&[16, 16, 16]);
    assert_ne!(st & status::DRIVER_OK, 0, "status {st:#x}");
    d2.push_chain_on(2, &[(HIGH, 4096, true)]);
    d2.notify_queue(2);
    assert_eq!(rec.take(), vec![page(HIGH, 1)], "reporting is queue 2");
}
