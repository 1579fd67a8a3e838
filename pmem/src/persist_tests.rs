use super::*;
use crate::device::tests::{driver, image, put_req, resp, GPA, MIB, REQ, RESP};
use crate::fingerprint::ImageChange;
use crate::request::RESP_OK;
use devices::virtio::mmio::MmioTransport;
use devices::virtio::persist::MmioArgs;
use devices::virtio::VirtioDevice;
use devices::BusDevice;
use std::os::unix::fs::FileExt;
use std::path::Path;

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
    std::fs::write(&tmp, &bytes[..usize::try_from(6 * MIB).unwrap()]).unwrap();
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
    let saved_transport = d.t.save().unwrap();
    let saved_dev = save(&m);

    // Rebuild as a restore would: fresh mapping, device and transport over
    // the same guest memory.
    let m2 = PmemMapping::restore(&saved_dev).unwrap();
    let dev = Pmem::restore(m2.backing(), &saved_dev).unwrap();
    let args = MmioArgs {
        device: Box::new(dev),
        mem: d.mem.clone(),
        irq: d.irq.clone(),
    };
    d.t = MmioTransport::restore(args, &saved_transport).unwrap();
    assert_eq!(d.t.save().unwrap(), saved_transport);

    put_req(&d, 0);
    let head = d.push_chain(&[(REQ, 4, false), (RESP, 4, true)]);
    d.notify();
    assert_eq!(d.take_used(), vec![(u32::from(head), 4)]);
    assert_eq!(resp(&d), RESP_OK);
    let mut b = [0u8; 4];
    d.t.read(0x108, &mut b);
    assert_eq!(u64::from(u32::from_le_bytes(b)), 2 * MIB);
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
