//! virtio-blk backed by a host file, read-only or read-write, with flush.

mod device;
mod request;

pub use device::{Block, BlockConfig, BlockError};
pub use request::{RequestType, SECTOR_SIZE};

/// Virtio device type of a block device.
pub const TYPE_BLOCK: u32 = 2;
/// Feature: device is read-only.
pub const VIRTIO_BLK_F_RO: u32 = 5;
/// Feature: device supports flush.
pub const VIRTIO_BLK_F_FLUSH: u32 = 9;
/// Feature: `seg_max` config field is valid.
pub const VIRTIO_BLK_F_SEG_MAX: u32 = 2;
/// Queue size offered to the driver.
pub const QUEUE_SIZE: u16 = 256;
