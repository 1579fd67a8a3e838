use super::*;
use crate::request::{RESP_EIO, RESP_OK};
use devices::virtio::mmio::status;
use devices::virtio::testing::{Driver, DATA};
use std::io::Write;
use vm_memory::{Bytes, GuestAddress};

pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const GPA: u64 = 0x1_0000_0000;
const F_VERSION_1: u64 = 1 << 32;
pub(crate) const REQ: u64 = DATA;
pub(crate) const RESP: u64 = DATA + 0x100;

pub(crate) fn image(len: u64) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    f.write_all(&bytes).unwrap();
    f.flush().unwrap();
    f
}

pub(crate) fn driver(m: &PmemMapping) -> (Driver, Arc<PmemMetrics>) {
    let dev = Pmem::from_mapping(m);
    let metrics = dev.metrics();
    let mut d = Driver::new(Box::new(dev));
    assert_ne!(d.bring_up(F_VERSION_1, 16) & status::DRIVER_OK, 0);
    (d, metrics)
}

pub(crate) fn put_req(d: &Driver, ty: u32) {
    d.mem.write_obj(ty, GuestAddress(REQ)).unwrap();
    d.mem.write_obj(0xdead_beefu32, GuestAddress(RESP)).unwrap();
}

pub(crate) fn resp(d: &Driver) -> u32 {
    d.mem.read_obj(GuestAddress(RESP)).unwrap()
}

#[test]
fn identity_features_and_config_space() {
    let f = image(4 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    let dev = Pmem::from_mapping(&m);
    assert_eq!(dev.device_type(), 27);
    assert_eq!(dev.queue_max_sizes(), &[QUEUE_SIZE]);
    assert_eq!(dev.avail_features(), F_VERSION_1, "VERSION_1 only");
    assert_eq!((dev.guest_addr(), dev.len()), (GPA, 4 * MIB));
    let mut cfg = [0u8; 16];
    dev.read_config(0, &mut cfg);
    assert_eq!(u64::from_le_bytes(cfg[..8].try_into().unwrap()), GPA);
    assert_eq!(u64::from_le_bytes(cfg[8..].try_into().unwrap()), 4 * MIB);
    // Partial and out-of-range reads.
    let mut hi = [0u8; 4];
    dev.read_config(12, &mut hi);
    assert_eq!(hi, [0; 4]); // 4 MiB has no bits in the top half
    dev.read_config(8, &mut hi);
    assert_eq!(u64::from(u32::from_le_bytes(hi)), 4 * MIB);
    let mut past = [0xffu8; 8];
    dev.read_config(16, &mut past);
    assert_eq!(past, [0; 8]);
    dev.read_config(u64::MAX, &mut past);
    assert_eq!(past, [0; 8]);

    // Through the transport, as the guest reads it.
    let (mut d, _) = driver(&m);
    assert_eq!(d.rd(0x008), 27);
    let lo = d.rd(0x100);
    let hi = d.rd(0x104);
    assert_eq!(u64::from(lo) | u64::from(hi) << 32, GPA);
    assert_eq!(u64::from(d.rd(0x108)), 4 * MIB);
    // Guest writes to config space change nothing.
    d.wr(0x100, 0);
    assert_eq!(d.rd(0x104), 1);
}

#[test]
fn flush_succeeds_with_interrupt() {
    let f = image(2 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    let (mut d, metrics) = driver(&m);
    put_req(&d, 0);
    let head = d.push_chain(&[(REQ, 4, false), (RESP, 4, true)]);
    d.notify();
    assert_eq!(d.take_used(), vec![(u32::from(head), 4)]);
    assert_eq!(resp(&d), RESP_OK);
    assert_eq!(d.irq.eventfd().read().unwrap(), 1, "interrupt raised");
    assert_ne!(d.rd(0x60) & 1, 0, "used-ring interrupt status");
    assert_eq!(metrics.flushes.load(Ordering::Relaxed), 1);

    // Split over descriptors both ways; several requests in one notify.
    put_req(&d, 0);
    d.push_chain(&[
        (REQ, 2, false),
        (REQ + 2, 2, false),
        (RESP, 1, true),
        (RESP + 1, 3, true),
    ]);
    d.push_chain(&[(REQ, 4, false), (RESP, 4, true)]);
    d.notify();
    let used = d.take_used();
    assert_eq!(used.len(), 2);
    assert!(used.iter().all(|&(_, len)| len == 4));
    assert_eq!(resp(&d), RESP_OK);
    assert_eq!(metrics.flushes.load(Ordering::Relaxed), 3);
    // A flush writes nothing to the image.
    let bytes: Vec<u8> = (0..2 * MIB).map(|i| (i % 251) as u8).collect();
    assert_eq!(std::fs::read(f.path()).unwrap(), bytes);
}

#[test]
fn malformed_requests_get_errors_or_are_dropped() {
    let f = image(2 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    let (mut d, metrics) = driver(&m);
    let expect = |d: &mut Driver, chain: &[(u64, u32, bool)], len: u32, ret: Option<u32>| {
        d.push_chain(chain);
        d.notify();
        let used = d.take_used();
        assert_eq!(used.len(), 1, "{chain:?}");
        assert_eq!(used[0].1, len, "{chain:?}");
        if let Some(r) = ret {
            assert_eq!(resp(d), r, "{chain:?}");
        }
    };
    // Unknown type.
    put_req(&d, 1);
    expect(
        &mut d,
        &[(REQ, 4, false), (RESP, 4, true)],
        4,
        Some(RESP_EIO),
    );
    put_req(&d, u32::MAX);
    expect(
        &mut d,
        &[(REQ, 4, false), (RESP, 4, true)],
        4,
        Some(RESP_EIO),
    );
    // Short request.
    put_req(&d, 0);
    expect(
        &mut d,
        &[(REQ, 2, false), (RESP, 4, true)],
        4,
        Some(RESP_EIO),
    );
    // No request at all (only the response buffer).
    put_req(&d, 0);
    expect(&mut d, &[(RESP, 4, true)], 4, Some(RESP_EIO));
    // Readable after writable.
    put_req(&d, 0);
    expect(
        &mut d,
        &[(RESP, 4, true), (REQ, 4, false)],
        4,
        Some(RESP_EIO),
    );
    // Request outside guest memory.
    put_req(&d, 0);
    expect(
        &mut d,
        &[(0xfff_fff0_0000, 4, false), (RESP, 4, true)],
        4,
        Some(RESP_EIO),
    );
    // Request pointing into the pmem range itself (not guest RAM here).
    put_req(&d, 0);
    expect(
        &mut d,
        &[(GPA, 4, false), (RESP, 4, true)],
        4,
        Some(RESP_EIO),
    );
    assert_eq!(metrics.bad_requests.load(Ordering::Relaxed), 7);

    // No room for the answer: returned with used length 0, untouched.
    put_req(&d, 0);
    expect(
        &mut d,
        &[(REQ, 4, false), (RESP, 4, false)],
        0,
        Some(0xdead_beef),
    );
    put_req(&d, 0);
    expect(
        &mut d,
        &[(REQ, 4, false), (RESP, 3, true)],
        0,
        Some(0xdead_beef),
    );
    put_req(&d, 0);
    expect(&mut d, &[(REQ, 4, false)], 0, Some(0xdead_beef));
    // Response outside guest memory.
    put_req(&d, 0);
    expect(
        &mut d,
        &[(REQ, 4, false), (0xfff_fff0_0000, 4, true)],
        0,
        None,
    );
    assert_eq!(metrics.dropped.load(Ordering::Relaxed), 4);

    // Still serving good requests afterwards.
    put_req(&d, 0);
    expect(
        &mut d,
        &[(REQ, 4, false), (RESP, 4, true)],
        4,
        Some(RESP_OK),
    );
    assert_eq!(metrics.flushes.load(Ordering::Relaxed), 1);
}

#[test]
fn hostile_rings_do_not_hang_or_panic() {
    let f = image(2 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    let (mut d, _) = driver(&m);
    put_req(&d, 0);
    // Two descriptors chained to each other.
    d.write_desc(0, REQ, 4, 1, 1);
    d.write_desc(1, RESP, 4, 1 | 2, 0);
    d.publish(0);
    d.notify();
    assert!(d.take_used().len() <= 1);
    // Head index past the queue, and a huge length.
    d.publish(200);
    d.write_desc(2, REQ, u32::MAX, 0, 0);
    d.publish(2);
    d.notify();
    // Notifying a queue that does not exist.
    d.notify_queue(7);
    d.notify_queue(u32::MAX);
}

#[test]
fn reset_and_reactivation() {
    let f = image(2 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    let (mut d, _) = driver(&m);
    d.wr(0x70, 0);
    assert_eq!(d.rd(0x70), 0);
    assert_ne!(d.bring_up(F_VERSION_1, 8) & status::DRIVER_OK, 0);
    put_req(&d, 0);
    d.push_chain(&[(REQ, 4, false), (RESP, 4, true)]);
    d.notify();
    assert_eq!(d.take_used().len(), 1);
    assert_eq!(resp(&d), RESP_OK);
}

#[test]
fn activate_refuses_wrong_queue_count() {
    let f = image(2 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    let mut dev = Pmem::from_mapping(&m);
    let mem = devices::virtio::testing::mem();
    let irq = Arc::new(VirtioInterrupt::new(devices::IrqLine::new(5).unwrap()));
    let e = dev.activate(mem, irq, vec![]).unwrap_err();
    assert!(matches!(
        e,
        ActivateError::QueueCount {
            expected: 1,
            got: 0
        }
    ));
    assert!(dev.queue_states().is_empty());
}
