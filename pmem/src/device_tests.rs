use super::*;
use crate::fingerprint::ImageChange;
use crate::persist::{PmemPersistError, PmemState};
use crate::request::{RESP_EIO, RESP_OK};
use devices::virtio::mmio::{status, MmioTransport};
use devices::virtio::testing::{Driver, DATA};
use devices::BusDevice;
use snapshot::Persist;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use vm_memory::{Bytes, GuestAddress};

const MIB: u64 = 1 << 20;
const GPA: u64 = 0x1_0000_0000;
const F_VERSION_1: u64 = 1 << 32;
const REQ: u64 = DATA;
const RESP: u64 = DATA + 0x100;

fn image(len: u64) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    f.write_all(&bytes).unwrap();
    f.flush().unwrap();
    f
}

fn driver(m: &PmemMapping) -> (Driver, Arc<PmemMetrics>) {
    let dev = Pmem::from_mapping(m);
    let metrics = dev.metrics();
    let mut d = Driver::new(Box::new(dev));
    assert_ne!(d.bring_up(F_VERSION_1, 16) & status::DRIVER_OK, 0);
    (d, metrics)
}

fn put_req(d: &Driver, ty: u32) {
    d.mem.write_obj(ty, GuestAddress(REQ)).unwrap();
    d.mem.write_obj(0xdead_beefu32, GuestAddress(RESP)).unwrap();
}

fn resp(d: &Driver) -> u32 {
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
    assert_eq!(u32::from_le_bytes(hi), (4 * MIB) as u32);
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
    assert_eq!(d.rd(0x108), (4 * MIB) as u32);
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

fn save(m: &PmemMapping) -> PmemState {
    Pmem::from_mapping(m).save().unwrap()
}

#[test]
fn state_round_trip_and_restore() {
    let f = image(4 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    let state = save(&m);
    assert_eq!(state.path, f.path());
    assert_eq!((state.guest_addr, state.len), (GPA, 4 * MIB));
    assert_eq!(state.image.len, 4 * MIB);
    assert_eq!(state.range().start, GPA);
    let json = serde_json::to_string(&state).unwrap();
    let back: PmemState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, state);

    let m2 = PmemMapping::restore(&back).unwrap();
    assert_eq!((m2.guest_addr(), m2.len()), (GPA, 4 * MIB));
    let dev = Pmem::restore(m2.backing(), &back).unwrap();
    let mut cfg = [0u8; 16];
    dev.read_config(0, &mut cfg);
    assert_eq!(u64::from_le_bytes(cfg[..8].try_into().unwrap()), GPA);
    assert_eq!(dev.save().unwrap(), state, "same image, same state");

    // A mapping that is not the saved one is refused.
    let other = PmemMapping::open(f.path(), GPA + 128 * MIB).unwrap();
    let e = Pmem::restore(other.backing(), &back).unwrap_err();
    assert!(matches!(e, PmemPersistError::Mismatch { .. }), "{e}");
}

fn restore_err(state: &PmemState) -> PmemPersistError {
    PmemMapping::restore(state).unwrap_err()
}

#[test]
fn restore_refused_when_image_changed() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("root.img");
    let bytes: Vec<u8> = (0..8 * MIB).map(|i| (i % 251) as u8).collect();
    std::fs::write(&p, &bytes).unwrap();
    let m = PmemMapping::open(&p, GPA).unwrap();
    let state = save(&m);
    drop(m);

    // A byte-identical copy renamed into place (new inode): accepted.
    let tmp = d.path().join("copy");
    std::fs::copy(&p, &tmp).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    PmemMapping::restore(&state).unwrap();

    // Different content in a sampled region (rebuilt image).
    let mut changed = bytes.clone();
    changed[100] ^= 1;
    std::fs::write(&tmp, &changed).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    let e = restore_err(&state);
    assert!(
        matches!(
            &e,
            PmemPersistError::Changed {
                change: ImageChange::Content { .. },
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("root.img") && msg.contains("changed since the snapshot"),
        "{msg}"
    );

    // Different size.
    std::fs::write(&tmp, &bytes[..6 * MIB as usize]).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    assert!(matches!(
        restore_err(&state),
        PmemPersistError::Changed {
            change: ImageChange::Size { saved, now },
            ..
        } if saved == 8 * MIB && now == 6 * MIB
    ));

    // Same inode modified in place, outside every sampled block.
    std::fs::write(&p, &bytes).unwrap();
    let m = PmemMapping::open(&p, GPA).unwrap();
    let state = save(&m);
    drop(m);
    let file = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let off = 2 * MIB + 64 * 1024 + 123; // between samples
    std::thread::sleep(std::time::Duration::from_millis(20));
    file.write_all_at(&[0xaa], off).unwrap();
    drop(file);
    assert!(matches!(
        restore_err(&state),
        PmemPersistError::Changed {
            change: ImageChange::ModifiedInPlace { .. },
            ..
        }
    ));

    // Gone.
    std::fs::remove_file(&p).unwrap();
    let e = restore_err(&state);
    assert!(matches!(e, PmemPersistError::Image(_)), "{e}");
    assert!(e.to_string().contains("root.img"));
}

#[test]
fn restore_refuses_inconsistent_state() {
    let f = image(2 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    let good = save(&m);
    for (what, mut s) in [
        ("len", good.clone()),
        ("addr", good.clone()),
        ("wrap", good.clone()),
    ] {
        match what {
            "len" => s.len = 3 * MIB,
            "addr" => s.guest_addr = GPA + 4096,
            _ => s.guest_addr = !(2 * MIB - 1),
        }
        assert!(
            matches!(
                PmemMapping::restore(&s),
                Err(PmemPersistError::BadState { .. })
            ),
            "{what}"
        );
    }
}

#[test]
fn transport_snapshot_keeps_queue_position() {
    let f = image(2 * MIB);
    let m = PmemMapping::open(f.path(), GPA).unwrap();
    let (mut d, _) = driver(&m);
    for _ in 0..3 {
        put_req(&d, 0);
        d.push_chain(&[(REQ, 4, false), (RESP, 4, true)]);
        d.notify();
    }
    assert_eq!(d.take_used().len(), 3);
    let saved_transport = d.t.save_state();
    let saved_dev = save(&m);

    // Rebuild as a restore would: fresh mapping, device and transport over
    // the same guest memory.
    let m2 = PmemMapping::restore(&saved_dev).unwrap();
    let dev = Pmem::restore(m2.backing(), &saved_dev).unwrap();
    let mut t = MmioTransport::new(Box::new(dev), d.mem.clone(), d.irq.clone());
    t.restore_state(&saved_transport).unwrap();
    d.t = t;
    assert_eq!(d.t.save_state(), saved_transport);

    put_req(&d, 0);
    let head = d.push_chain(&[(REQ, 4, false), (RESP, 4, true)]);
    d.notify();
    assert_eq!(d.take_used(), vec![(u32::from(head), 4)]);
    assert_eq!(resp(&d), RESP_OK);
    let mut b = [0u8; 4];
    d.t.read(0x108, &mut b);
    assert_eq!(u32::from_le_bytes(b), (2 * MIB) as u32);
}

#[test]
fn fingerprint_of_small_and_large_images() {
    // Images smaller than the sampling window and larger than it.
    for len in [2 * MIB, 130 * MIB] {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("i.img");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(len).unwrap();
        f.write_all_at(b"x", len / 2).unwrap();
        drop(f);
        let m = PmemMapping::open(Path::new(&p), GPA).unwrap();
        let s = save(&m);
        assert_eq!(s.image.len, len);
        PmemMapping::restore(&s).unwrap();
    }
}

#[test]
fn unmodified_file_is_recognised_without_reading_it() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("i.img");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(2 * MIB).unwrap();
    drop(f);
    let m = PmemMapping::open(Path::new(&p), GPA).unwrap();
    let s = save(&m);
    drop(m);
    let meta = std::fs::metadata(&p).unwrap();
    assert!(s.image.same_file_unmodified(&meta), "same file, untouched");
    // A copy (new inode) and an in-place write (new mtime) are not the
    // same unmodified file: restore then samples the content.
    let copy = d.path().join("copy.img");
    std::fs::copy(&p, &copy).unwrap();
    assert!(!s
        .image
        .same_file_unmodified(&std::fs::metadata(&copy).unwrap()));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(b"y", 4096).unwrap();
    drop(f);
    assert!(!s
        .image
        .same_file_unmodified(&std::fs::metadata(&p).unwrap()));
}
