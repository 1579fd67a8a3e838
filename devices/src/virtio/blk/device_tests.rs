use super::*;
use crate::virtio::blk::request::{STATUS_IOERR, STATUS_OK, STATUS_UNSUPP};
use crate::virtio::blk::{VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO};
use crate::virtio::mmio::{status, MmioTransport};
use crate::virtio::persist::{MmioArgs, MmioState};
use crate::virtio::testing::{Driver, DATA};
use snapshot::Persist;
use std::io::Write;
use vm_memory::{Bytes, GuestAddress};

const F: u64 = 1 << 32;
const HDR: u64 = DATA;
const BUF: u64 = DATA + 0x1000;
const ST: u64 = DATA + 0x100;

fn disk(sectors: u64) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let bytes: Vec<u8> = (0..sectors * 512).map(|i| (i % 251) as u8).collect();
    f.write_all(&bytes).unwrap();
    f
}

fn dev(path: &std::path::Path, ro: bool) -> Driver {
    let b = Block::new(&BlockConfig {
        path: path.into(),
        read_only: ro,
        id: "shoal-test-disk".into(),
    })
    .unwrap();
    let mut d = Driver::new(Box::new(b));
    assert_ne!(
        d.bring_up(F | (1 << VIRTIO_BLK_F_FLUSH), 16) & status::DRIVER_OK,
        0
    );
    d
}

fn header(d: &Driver, ty: u32, sector: u64) {
    d.mem.write_obj(ty, GuestAddress(HDR)).unwrap();
    d.mem.write_obj(0u32, GuestAddress(HDR + 4)).unwrap();
    d.mem.write_obj(sector, GuestAddress(HDR + 8)).unwrap();
    d.mem.write_obj(0xffu8, GuestAddress(ST)).unwrap();
}

fn status_byte(d: &Driver) -> u8 {
    d.mem.read_obj(GuestAddress(ST)).unwrap()
}

#[test]
fn capacity_and_ro_feature() {
    let f = disk(8);
    let b = Block::new(&BlockConfig {
        path: f.path().into(),
        read_only: true,
        id: String::new(),
    })
    .unwrap();
    assert_eq!(b.sectors(), 8);
    assert_ne!(b.avail_features() & (1 << VIRTIO_BLK_F_RO), 0);
    let mut cap = [0u8; 8];
    b.read_config(0, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 8);
}

#[test]
fn read_sectors() {
    let f = disk(8);
    let mut d = dev(f.path(), true);
    header(&d, 0, 2);
    let head = d.push_chain(&[(HDR, 16, false), (BUF, 1024, true), (ST, 1, true)]);
    d.notify();
    assert_eq!(d.take_used(), vec![(u32::from(head), 1025)]);
    assert_eq!(status_byte(&d), STATUS_OK);
    let mut got = vec![0u8; 1024];
    d.mem.read_slice(&mut got, GuestAddress(BUF)).unwrap();
    let want: Vec<u8> = (1024..2048u64).map(|i| (i % 251) as u8).collect();
    assert_eq!(got, want);
    assert_eq!(d.irq.eventfd().read().unwrap(), 1, "interrupt raised");
}

#[test]
fn write_then_flush_reaches_file() {
    let f = disk(4);
    let mut d = dev(f.path(), false);
    d.mem.write_slice(&[0xab; 512], GuestAddress(BUF)).unwrap();
    header(&d, 1, 3);
    d.push_chain(&[(HDR, 16, false), (BUF, 512, false), (ST, 1, true)]);
    d.notify();
    assert_eq!(d.take_used()[0].1, 1);
    assert_eq!(status_byte(&d), STATUS_OK);
    header(&d, 4, 0);
    d.push_chain(&[(HDR, 16, false), (ST, 1, true)]);
    d.notify();
    assert_eq!(status_byte(&d), STATUS_OK);
    let content = std::fs::read(f.path()).unwrap();
    assert!(content[3 * 512..].iter().all(|&b| b == 0xab));
    assert_eq!(content[0], 0);
}

#[test]
fn read_only_disk_refuses_writes() {
    let f = disk(4);
    let before = std::fs::read(f.path()).unwrap();
    let mut d = dev(f.path(), true);
    header(&d, 1, 0);
    d.push_chain(&[(HDR, 16, false), (BUF, 512, false), (ST, 1, true)]);
    d.notify();
    assert_eq!(status_byte(&d), STATUS_IOERR);
    assert_eq!(std::fs::read(f.path()).unwrap(), before);
}

#[test]
fn out_of_range_and_malformed_requests_fail_cleanly() {
    let f = disk(4);
    let mut d = dev(f.path(), false);
    // Past the end.
    header(&d, 0, 4);
    d.push_chain(&[(HDR, 16, false), (BUF, 512, true), (ST, 1, true)]);
    // Sector overflow.
    d.notify();
    assert_eq!(status_byte(&d), STATUS_IOERR);
    header(&d, 0, u64::MAX);
    d.push_chain(&[(HDR, 16, false), (BUF, 512, true), (ST, 1, true)]);
    d.notify();
    assert_eq!(status_byte(&d), STATUS_IOERR);
    // Not a sector multiple.
    header(&d, 0, 0);
    d.push_chain(&[(HDR, 16, false), (BUF, 100, true), (ST, 1, true)]);
    d.notify();
    assert_eq!(status_byte(&d), STATUS_IOERR);
    // Data buffer outside guest memory.
    header(&d, 0, 0);
    d.push_chain(&[
        (HDR, 16, false),
        (0xfff_fff0_0000, 512, true),
        (ST, 1, true),
    ]);
    d.notify();
    assert_eq!(status_byte(&d), STATUS_IOERR);
    // Short header.
    header(&d, 0, 0);
    d.push_chain(&[(HDR, 8, false), (BUF, 512, true), (ST, 1, true)]);
    d.notify();
    assert_eq!(status_byte(&d), STATUS_IOERR);
    // Unknown type.
    header(&d, 77, 0);
    d.push_chain(&[(HDR, 16, false), (ST, 1, true)]);
    d.notify();
    assert_eq!(status_byte(&d), STATUS_UNSUPP);
    // Read-only status descriptor: request dropped with used len 0.
    header(&d, 0, 0);
    d.push_chain(&[(HDR, 16, false), (BUF, 512, true), (ST, 1, false)]);
    d.notify();
    let used = d.take_used();
    assert_eq!(used.len(), 7);
    assert_eq!(used.last().unwrap().1, 0);
}

#[test]
fn looping_chain_does_not_hang() {
    let f = disk(4);
    let mut d = dev(f.path(), false);
    header(&d, 0, 0);
    // Two descriptors pointing at each other.
    d.write_desc(0, HDR, 16, 1, 1);
    d.write_desc(1, BUF, 512, 1 | 2, 0);
    d.publish(0);
    d.notify();
    // The device completes (or drops) the request; the point is it returns.
    assert!(d.take_used().len() <= 1);
}

#[test]
fn get_id() {
    let f = disk(1);
    let mut d = dev(f.path(), true);
    header(&d, 8, 0);
    d.push_chain(&[(HDR, 16, false), (BUF, 20, true), (ST, 1, true)]);
    d.notify();
    let mut id = [0u8; 15];
    d.mem.read_slice(&mut id, GuestAddress(BUF)).unwrap();
    assert_eq!(&id, b"shoal-test-disk");
}

#[test]
fn empty_or_tiny_file_is_refused() {
    let f = tempfile::NamedTempFile::new().unwrap();
    let err = Block::new(&BlockConfig {
        path: f.path().into(),
        read_only: true,
        id: String::new(),
    })
    .err()
    .unwrap();
    assert!(err.to_string().contains("smaller than one"));
    let err = Block::new(&BlockConfig {
        path: "/nonexistent/disk.img".into(),
        read_only: true,
        id: String::new(),
    })
    .err()
    .unwrap();
    assert!(err.to_string().contains("/nonexistent/disk.img"));
}

#[test]
fn snapshot_round_trip_continues_the_queue() {
    let f = disk(8);
    let mut d = dev(f.path(), false);
    header(&d, 0, 1);
    d.push_chain(&[(HDR, 16, false), (BUF, 512, true), (ST, 1, true)]);
    d.notify();
    assert_eq!(d.take_used().len(), 1);
    let saved = d.t.save().unwrap();
    assert!(saved.activated);
    assert_eq!(saved.queues[0].next_avail, 1);
    // A new transport over the same memory with a fresh device, restored.
    let b = Block::new(&BlockConfig {
        path: f.path().into(),
        read_only: false,
        id: "x".into(),
    })
    .unwrap();
    let args = MmioArgs {
        device: Box::new(b),
        mem: d.mem.clone(),
        irq: d.irq.clone(),
    };
    let t2 = MmioTransport::restore(args, &saved).unwrap();
    assert_eq!(t2.save().unwrap(), saved);
    d.t = t2;
    header(&d, 0, 2);
    d.push_chain(&[(HDR, 16, false), (BUF, 512, true), (ST, 1, true)]);
    d.notify();
    assert_eq!(
        d.take_used().len(),
        1,
        "restored device serves the next request"
    );
    assert_eq!(status_byte(&d), STATUS_OK);
}

#[test]
fn restore_refuses_mismatched_state() {
    let f = disk(8);
    let d = dev(f.path(), false);
    let mut saved = d.t.save().unwrap();
    let restore = |saved: &_| {
        let b = Block::new(&BlockConfig {
            path: f.path().into(),
            read_only: false,
            id: "x".into(),
        })
        .unwrap();
        let args = MmioArgs {
            device: Box::new(b),
            mem: d.mem.clone(),
            irq: d.irq.clone(),
        };
        MmioTransport::restore(args, saved).map(drop)
    };
    saved.device_type = 19;
    assert!(restore(&saved)
        .unwrap_err()
        .to_string()
        .contains("does not match"));
    saved.device_type = 2;
    saved.queues.push(saved.queues[0]);
    assert!(restore(&saved).is_err());
    saved.queues.pop();
    saved.queues[0].size = 3; // not a power of two
    assert!(restore(&saved).unwrap_err().to_string().contains("invalid"));
}

/// Snapshot state is data from disk: queue sizes and ring
/// addresses are rechecked against the device and guest memory, and
/// registers against what a driver can reach, before anything uses them.
#[test]
fn restore_rechecks_queue_limits_and_registers() {
    let f = disk(8);
    let mut d = dev(f.path(), false);
    header(&d, 0, 1);
    d.push_chain(&[(HDR, 16, false), (BUF, 512, true), (ST, 1, true)]);
    d.notify();
    let good = d.t.save().unwrap();
    assert!(good.activated);
    let restore = |saved: &MmioState| {
        let b = Block::new(&BlockConfig {
            path: f.path().into(),
            read_only: false,
            id: "x".into(),
        })
        .unwrap();
        let args = MmioArgs {
            device: Box::new(b),
            mem: d.mem.clone(),
            irq: d.irq.clone(),
        };
        MmioTransport::restore(args, saved)
            .map(drop)
            .map_err(|e| e.to_string())
    };
    restore(&good).unwrap();
    type Edit = fn(&mut MmioState);
    let cases: [(Edit, &str); 8] = [
        // A queue larger than the device's (virtio-queue takes the saved
        // maximum as given).
        (
            |s| {
                s.queues[0].max_size = 32768;
                s.queues[0].size = 32768;
            },
            "maximum size 32768",
        ),
        (|s| s.queues[0].size = 512, "size 512 is invalid"),
        (|s| s.queues[0].used_ring = 1 << 40, "inside guest memory"),
        (
            |s| s.queues[0].desc_table = (1 << 20) - 16,
            "inside guest memory",
        ),
        (|s| s.status = 7, "status 0x7"),
        (|s| s.status &= !4, "activated is true"),
        (|s| s.acked_features |= 1 << 40, "does not offer"),
        (|s| s.interrupt_status = 0x80, "interrupt status"),
    ];
    for (edit, want) in cases {
        let mut s = good.clone();
        edit(&mut s);
        let e = restore(&s).expect_err(want);
        assert!(e.contains(want), "{want:?} not in {e:?}");
    }
}
