//! The virtio-mmio transport driven from the guest's side (register
//! writes, rings in guest memory) by the test driver, with a probe device
//! that records what the transport does to it.

use devices::virtio::mmio::status;
use devices::virtio::testing::Driver;
use devices::virtio::{
    read_config_bytes, ActivateError, VirtioDevice, VirtioInterrupt, INT_USED_RING,
    VIRTIO_F_VERSION_1,
};
use devices::BusDevice;
use std::sync::{Arc, Mutex};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

/// The magic value of register 0: "virt".
const MAGIC: u32 = 0x7472_6976;

/// A device that records what the transport does to it.
#[derive(Default)]
struct Probe {
    log: Arc<Mutex<Vec<String>>>,
}

impl VirtioDevice for Probe {
    fn device_type(&self) -> u32 {
        42
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[16]
    }
    fn avail_features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1) | 0b101
    }
    fn set_acked_features(&mut self, f: u64) {
        self.log.lock().unwrap().push(format!("ack {f:#x}"));
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&[1, 2, 3, 4], offset, data);
    }
    fn write_config(&mut self, _o: u64, _d: &[u8]) {}
    fn activate(
        &mut self,
        _m: GuestMemoryMmap,
        irq: Arc<VirtioInterrupt>,
        q: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("activate {} size {}", q.len(), q[0].size()));
        irq.signal(INT_USED_RING).unwrap();
        Ok(())
    }
    fn queue_notify(&mut self, i: u32) {
        self.log.lock().unwrap().push(format!("notify {i}"));
    }
    fn reset(&mut self) {
        self.log.lock().unwrap().push("reset".into());
    }
    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        vec![]
    }
}

fn probe() -> (Driver, Arc<Mutex<Vec<String>>>) {
    let p = Probe::default();
    let log = p.log.clone();
    (Driver::new(Box::new(p)), log)
}

#[test]
fn identity_registers() {
    let (mut d, _) = probe();
    assert_eq!(d.rd(0x0), MAGIC);
    assert_eq!(d.rd(0x4), 2);
    assert_eq!(d.rd(0x8), 42);
    assert_eq!(d.rd(0x34), 16);
    d.wr(0x14, 1);
    assert_eq!(d.rd(0x10), 1, "VERSION_1 is bit 32");
    d.wr(0x14, 0);
    assert_eq!(d.rd(0x10), 0b101);
    let mut cfg = [0u8; 8];
    d.t.read(0x102, &mut cfg);
    assert_eq!(cfg, [3, 4, 0, 0, 0, 0, 0, 0]);
    // Misaligned or odd-sized register reads return zero.
    let mut b = [0xffu8; 2];
    d.t.read(0x0, &mut b);
    assert_eq!(b, [0, 0]);
}

#[test]
fn full_bring_up_activates_with_acked_subset() {
    let (mut d, log) = probe();
    // Driver asks for more than offered: only the offered subset sticks.
    let st = d.bring_up((1 << 32) | 0xff, 8);
    assert_eq!(st & status::DRIVER_OK, status::DRIVER_OK);
    assert!(d.t.is_activated());
    assert_eq!(
        *log.lock().unwrap(),
        vec!["ack 0x100000005".to_string(), "activate 1 size 8".into()]
    );
    assert_eq!(d.rd(0x60), INT_USED_RING);
    d.wr(0x64, INT_USED_RING);
    assert_eq!(d.rd(0x60), 0);
    assert_eq!(d.irq.eventfd().read().unwrap(), 1);
    d.notify();
    assert_eq!(log.lock().unwrap().last().unwrap(), "notify 0");
}

#[test]
fn features_ok_refused_without_version_1() {
    let (mut d, _) = probe();
    let st = d.bring_up(0b1, 8);
    assert_eq!(st & status::FEATURES_OK, 0);
    assert!(!d.t.is_activated());
}

#[test]
fn status_bits_must_come_in_order() {
    let (mut d, _) = probe();
    d.wr(0x70, status::DRIVER_OK);
    assert_eq!(d.rd(0x70), 0);
    d.wr(
        0x70,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
    );
    assert_eq!(d.rd(0x70), 0);
    d.wr(0x70, status::ACKNOWLEDGE);
    assert_eq!(d.rd(0x70), status::ACKNOWLEDGE);
}

#[test]
fn queue_config_frozen_after_driver_ok() {
    let (mut d, log) = probe();
    d.bring_up(1 << 32, 8);
    d.wr(0x38, 4);
    d.wr(0x80, 0xdead_0000);
    d.wr(0x44, 0);
    assert_eq!(d.rd(0x44), 1, "queue stays ready");
    assert_eq!(log.lock().unwrap().len(), 2, "no further device calls");
}

#[test]
fn invalid_queue_size_is_ignored() {
    let (mut d, log) = probe();
    d.bring_up(1 << 32, 3); // not a power of two: the write is dropped
    assert_eq!(log.lock().unwrap().last().unwrap(), "activate 1 size 16");
}

#[test]
fn queue_outside_memory_fails_activation() {
    let (mut d, log) = probe();
    d.wr(0x70, status::ACKNOWLEDGE);
    d.wr(0x70, status::ACKNOWLEDGE | status::DRIVER);
    d.wr(0x24, 1);
    d.wr(0x20, 1);
    d.wr(
        0x70,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
    );
    d.wr(0x80, 0xffff_0000); // far beyond the 1 MiB of guest memory
    d.wr(0x44, 1);
    d.wr(
        0x70,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
    );
    let st = d.rd(0x70);
    assert_eq!(st & status::DRIVER_OK, 0);
    assert_ne!(st & status::DEVICE_NEEDS_RESET, 0);
    assert!(!d.t.is_activated());
    d.notify(); // ignored, must not reach the device
    assert!(!log.lock().unwrap().iter().any(|l| l.starts_with("notify")));
}

#[test]
fn reset_returns_device_to_inactive() {
    let (mut d, log) = probe();
    d.bring_up(1 << 32, 8);
    d.wr(0x70, 0);
    assert_eq!(d.rd(0x70), 0);
    assert!(!d.t.is_activated());
    assert_eq!(log.lock().unwrap().last().unwrap(), "reset");
    assert_eq!(d.rd(0x44), 0, "queues are fresh after reset");
    // Can be brought up again.
    assert_ne!(d.bring_up(1 << 32, 8) & status::DRIVER_OK, 0);
}
