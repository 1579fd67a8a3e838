//! The virtio-mmio register interface: any sequence of reads and writes
//! (any offset, any width) from a hostile driver, with a proper bring-up
//! mixed in so the activated state is attacked too. After every access:
//! the identity registers read as they must, the status is one a driver
//! can reach, an activated device's queue configuration and features
//! never change until a reset, accepted features are a subset of the
//! offer, and the transport's saved state restores (every state a driver
//! can reach is one restore accepts).

use bolero::{check, TypeGenerator};
use devices::bus::BusDevice;
use devices::virtio::blk::{Block, BlockConfig};
use devices::virtio::mmio::{status, MmioTransport};
use devices::virtio::persist::{MmioArgs, MmioState};
use devices::virtio::testing::Driver;
use devices::virtio::VirtioDevice;
use snapshot::Persist;
use std::io::Write;

#[derive(Debug, Clone, Copy, TypeGenerator)]
enum Offset {
    /// A register (0x000..0x100, 4-byte aligned).
    Reg(u8),
    /// Config space.
    Config(u8),
    /// Anything in the window.
    Any(u16),
}

#[derive(Debug, Clone, TypeGenerator)]
enum Op {
    Read {
        at: Offset,
        width: u8,
    },
    Write {
        at: Offset,
        width: u8,
        value: u32,
    },
    /// The whole spec sequence, so later accesses hit an active device.
    BringUp {
        queue_size: u8,
    },
    /// Snapshot the transport and continue on the restored one.
    SaveRestore,
}

fn offset(o: Offset) -> u64 {
    match o {
        Offset::Reg(r) => u64::from(r & 0x3f) * 4,
        Offset::Config(c) => 0x100 + u64::from(c),
        Offset::Any(a) => u64::from(a) % 0x1000,
    }
}

fn width(w: u8) -> usize {
    [4, 4, 4, 1, 2, 8, 3, 0][usize::from(w % 8)]
}

fn disk() -> &'static tempfile::NamedTempFile {
    static DISK: std::sync::OnceLock<tempfile::NamedTempFile> = std::sync::OnceLock::new();
    DISK.get_or_init(|| {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[0u8; 8192]).unwrap();
        f.flush().unwrap();
        f
    })
}

fn device() -> Box<dyn VirtioDevice> {
    Box::new(
        Block::new(&BlockConfig {
            path: disk().path().into(),
            read_only: true,
            id: "fuzz".into(),
        })
        .unwrap(),
    )
}

#[test]
fn mmio_registers() {
    check!()
        .with_type::<Vec<Op>>()
        .with_test_time(shoal_fuzz::budget())
        .for_each(|ops| run(ops));
}

/// The part of a queue a driver may not change once the device runs.
fn queue_config(s: &MmioState) -> Vec<(u16, bool, u64, u64, u64)> {
    s.queues
        .iter()
        .map(|q| (q.size, q.ready, q.desc_table, q.avail_ring, q.used_ring))
        .collect()
}

fn run(ops: &[Op]) {
    let offered = device().avail_features();
    let mut d = Driver::new(device());
    for op in ops.iter().take(64) {
        let before = d.t.save().unwrap();
        let mut reset = false;
        match *op {
            Op::Read { at, width: w } => {
                let mut buf = vec![0xaau8; width(w)];
                d.t.read(offset(at), &mut buf);
            }
            Op::Write {
                at,
                width: w,
                value,
            } => {
                let off = offset(at);
                let bytes = u64::from(value).to_le_bytes();
                let n = width(w);
                reset = off == 0x70 && n == 4 && value == 0;
                d.t.write(off, &bytes[..n]);
            }
            Op::BringUp { queue_size } => {
                reset = true;
                d.wr(0x70, 0);
                let size = 1u16 << (queue_size % 9);
                let st = d.bring_up(1 << 32, size);
                assert_ne!(
                    st & status::DRIVER_OK,
                    0,
                    "a proper bring-up failed: {st:#x}"
                );
            }
            Op::SaveRestore => {
                let saved = d.t.save().unwrap();
                let args = MmioArgs {
                    device: device(),
                    mem: d.mem.clone(),
                    irq: d.irq.clone(),
                };
                d.t = MmioTransport::restore(args, &saved).unwrap_or_else(|e| {
                    panic!("a state the transport reached does not restore: {e}\n{saved:?}")
                });
                assert_eq!(d.t.save().unwrap(), saved, "restore changed the state");
            }
        }
        check_invariants(&mut d, offered);
        let after = d.t.save().unwrap();
        if before.activated && !reset {
            assert!(
                after.activated,
                "the device left the active state without a reset"
            );
            assert_eq!(
                queue_config(&before),
                queue_config(&after),
                "queue configuration changed under a running device"
            );
            assert_eq!(before.acked_features, after.acked_features);
        }
        // Every reachable state restores.
        let args = MmioArgs {
            device: device(),
            mem: d.mem.clone(),
            irq: d.irq.clone(),
        };
        if let Err(e) = MmioTransport::restore(args, &after) {
            panic!("a state the transport reached does not restore: {e}\n{after:?}");
        }
    }
}

fn check_invariants(d: &mut Driver, offered: u64) {
    assert_eq!(d.rd(0x000), 0x7472_6976, "magic");
    assert_eq!(d.rd(0x004), 2, "version");
    assert_eq!(d.rd(0x008), 2, "device type");
    let st = d.rd(0x070);
    let phase = st & !(status::FAILED | status::DEVICE_NEEDS_RESET);
    assert!(
        [0, 1, 3, 11, 15].contains(&phase),
        "status {st:#x} is not one a driver can reach"
    );
    assert_eq!(
        d.t.is_activated(),
        phase & status::DRIVER_OK != 0 && st & status::DEVICE_NEEDS_RESET == 0,
        "activated, status {st:#x}"
    );
    let s = d.t.save().unwrap();
    assert_eq!(
        s.acked_features & !offered,
        0,
        "features accepted that were not offered"
    );
    assert_eq!(
        s.interrupt_status & !3,
        0,
        "interrupt status {:#x}",
        s.interrupt_status
    );
}
