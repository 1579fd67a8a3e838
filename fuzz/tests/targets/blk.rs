//! virtio-blk descriptor handling: hostile descriptor tables and rings over
//! real guest memory (see `shoal_fuzz::queue` for the checks every device
//! passes), with request headers a driver would send (read, write, flush,
//! get-id, unknown) at sectors in and past the disk. Also: a read-only
//! disk's file never changes, no file grows, and after a driver reset a
//! well-formed read returns the file's bytes.

use bolero::{check, TypeGenerator};
use devices::virtio::blk::{Block, BlockConfig, SECTOR_SIZE};
use shoal_fuzz::queue::{pick_sizes, Kick, Rig, F_NEXT, F_WRITE};
use std::io::Write;
use vm_memory::{Bytes, GuestAddress};

const SECTORS: u64 = 16;
const F_VERSION_1: u64 = 1 << 32;
const F_EVENT_IDX: u64 = 1 << 29;

#[derive(Debug, Clone, TypeGenerator)]
struct Request {
    kind: u8,
    sector: u64,
    kick: Kick,
}

#[derive(Debug, Clone, TypeGenerator)]
struct Input {
    read_only: bool,
    event_idx: bool,
    size: u8,
    requests: Vec<Request>,
}

fn pattern() -> Vec<u8> {
    (0..SECTORS * SECTOR_SIZE)
        .map(|i| (i % 251) as u8)
        .collect()
}

#[test]
fn blk_queue() {
    check!()
        .with_type::<Input>()
        .with_test_time(shoal_fuzz::budget())
        .with_max_len(1024)
        .for_each(run);
}

fn run(input: &Input) {
    // On tmpfs where there is one: a flush is an fsync.
    let shm = std::path::Path::new("/dev/shm");
    let mut f = if shm.is_dir() {
        tempfile::NamedTempFile::new_in(shm).unwrap()
    } else {
        tempfile::NamedTempFile::new().unwrap()
    };
    f.write_all(&pattern()).unwrap();
    f.flush().unwrap();
    let dev = Block::new(&BlockConfig {
        path: f.path().into(),
        read_only: input.read_only,
        id: "fuzz".into(),
    })
    .unwrap();
    let features = F_VERSION_1 | if input.event_idx { F_EVENT_IDX } else { 0 };
    let sizes = pick_sizes(&[256], &[input.size]);
    let mut rig = Rig::new(Box::new(dev), features, &sizes);
    for r in input.requests.iter().take(32) {
        let (q, written) = rig.load(&r.kick);
        // The header goes where the first descriptor points, as a driver
        // puts it.
        if let Some(first) = written.first() {
            let ty: u32 = match r.kind % 6 {
                0 => 0,
                1 => 1,
                2 => 4,
                3 => 8,
                4 => u32::from(r.kind),
                _ => u32::MAX,
            };
            let sector = if r.kind & 0x80 == 0 {
                r.sector % (SECTORS + 2)
            } else {
                r.sector
            };
            let _ = rig.mem().write_obj(ty, GuestAddress(first.addr));
            let _ = rig
                .mem()
                .write_obj(sector, GuestAddress(first.addr.wrapping_add(8)));
        }
        rig.notify(q, &r.kick);
    }
    let len = std::fs::metadata(f.path()).unwrap().len();
    assert_eq!(len, SECTORS * SECTOR_SIZE, "the disk file changed size");
    if input.read_only {
        assert_eq!(
            std::fs::read(f.path()).unwrap(),
            pattern(),
            "a read-only disk was written"
        );
    }
    rig.reset_and_reuse();
    if rig.active && rig.sizes[0] >= 4 {
        well_formed_read(&mut rig, f.path());
    }
}

/// Reads sector 1 with a proper three-descriptor chain and compares with
/// the file.
fn well_formed_read(rig: &mut Rig, path: &std::path::Path) {
    let (hdr, buf, st) = (0x20000u64, 0x21000u64, 0x22000u64);
    let mem = rig.mem().clone();
    mem.write_obj(0u32, GuestAddress(hdr)).unwrap();
    mem.write_obj(1u64, GuestAddress(hdr + 8)).unwrap();
    mem.write_obj(0xffu8, GuestAddress(st)).unwrap();
    rig.d.write_desc(0, hdr, 16, F_NEXT, 1);
    rig.d.write_desc(1, buf, 512, F_NEXT | F_WRITE, 2);
    rig.d.write_desc(2, st, 1, F_WRITE, 0);
    rig.d.publish(0);
    rig.d.notify();
    let status: u8 = mem.read_obj(GuestAddress(st)).unwrap();
    assert_eq!(status, 0, "a well-formed read after reset failed");
    let mut got = vec![0u8; 512];
    mem.read_slice(&mut got, GuestAddress(buf)).unwrap();
    let file = std::fs::read(path).unwrap();
    assert_eq!(
        got,
        file[512..1024],
        "read returned other bytes than the file's"
    );
}
