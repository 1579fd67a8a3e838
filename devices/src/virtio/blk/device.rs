//! The virtio-blk device: features, config space, and queue servicing.

use super::request::{self, Backing, SECTOR_SIZE};
use super::{QUEUE_SIZE, TYPE_BLOCK, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX};
use crate::virtio::{
    ActivateError, VirtioDevice, VirtioInterrupt, INT_USED_RING, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX,
};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

/// Set-up errors of a block device.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The backing file could not be opened.
    #[error("cannot open disk image {path}: {source}")]
    Open {
        /// The image path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The backing file is smaller than one sector.
    #[error("disk image {0} is smaller than one 512-byte sector")]
    TooSmall(PathBuf),
}

/// How to build a block device.
#[derive(Debug, Clone)]
pub struct BlockConfig {
    /// Backing file.
    pub path: PathBuf,
    /// Refuse guest writes.
    pub read_only: bool,
    /// Device id the guest sees (at most 20 bytes are used).
    pub id: String,
}

struct Active {
    mem: GuestMemoryMmap,
    irq: Arc<VirtioInterrupt>,
    queue: Queue,
}

/// A virtio-blk device.
pub struct Block {
    backing: Backing,
    acked: u64,
    active: Option<Active>,
    config: [u8; 24],
}

impl Block {
    /// Opens the backing file.
    pub fn new(cfg: &BlockConfig) -> Result<Self, BlockError> {
        let file = open(&cfg.path, cfg.read_only)?;
        let len = file
            .metadata()
            .map_err(|source| BlockError::Open {
                path: cfg.path.clone(),
                source,
            })?
            .len();
        let sectors = len / SECTOR_SIZE;
        if sectors == 0 {
            return Err(BlockError::TooSmall(cfg.path.clone()));
        }
        let mut id = [0u8; 20];
        let n = cfg.id.len().min(20);
        id[..n].copy_from_slice(&cfg.id.as_bytes()[..n]);
        let mut config = [0u8; 24];
        config[0..8].copy_from_slice(&sectors.to_le_bytes());
        // seg_max: at most queue-size minus header and status descriptors.
        config[12..16].copy_from_slice(&u32::from(QUEUE_SIZE - 2).to_le_bytes());
        Ok(Self {
            backing: Backing {
                file,
                read_only: cfg.read_only,
                sectors,
                id,
            },
            acked: 0,
            active: None,
            config,
        })
    }

    /// Capacity in 512-byte sectors.
    pub fn sectors(&self) -> u64 {
        self.backing.sectors
    }

    fn process(&mut self) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let mut used_any = false;
        loop {
            let mut progressed = false;
            // The chain iterator follows `next` links at most queue-size times
            // (and rejects loops), so a hostile ring cannot spin us.
            while let Some(chain) = a.queue.pop_descriptor_chain(&a.mem) {
                let head = chain.head_index();
                let descs: Vec<_> = chain.take(usize::from(QUEUE_SIZE)).collect();
                let len = request::execute(&a.mem, &self.backing, &descs);
                if a.queue.add_used(&a.mem, head, len).is_err() {
                    break;
                }
                used_any = true;
                progressed = true;
            }
            // With EVENT_IDX, re-check after re-enabling notifications so a
            // request added in between is not missed.
            match a.queue.enable_notification(&a.mem) {
                Ok(true) if progressed => continue,
                _ => break,
            }
        }
        if used_any && a.queue.needs_notification(&a.mem).unwrap_or(true) {
            let _ = a.irq.signal(INT_USED_RING);
        }
    }
}

fn open(path: &Path, read_only: bool) -> Result<File, BlockError> {
    use std::os::unix::fs::OpenOptionsExt;
    // A final symbolic link is refused: the path was chosen by whoever
    // started the VMM, and a link swapped in since must not redirect it.
    OpenOptions::new()
        .read(true)
        .write(!read_only)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| BlockError::Open {
            path: path.to_owned(),
            source,
        })
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        TYPE_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn avail_features(&self) -> u64 {
        let mut f = (1u64 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_BLK_F_FLUSH)
            | (1 << VIRTIO_BLK_F_SEG_MAX);
        if self.backing.read_only {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        f
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked = features;
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::virtio::read_config_bytes(&self.config, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        irq: Arc<VirtioInterrupt>,
        mut queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if queues.len() != 1 {
            return Err(ActivateError::QueueCount {
                expected: 1,
                got: queues.len(),
            });
        }
        let mut queue = queues.remove(0);
        queue.set_event_idx(self.acked & (1 << VIRTIO_RING_F_EVENT_IDX) != 0);
        self.active = Some(Active { mem, irq, queue });
        Ok(())
    }

    fn queue_notify(&mut self, index: u32) {
        if index == 0 {
            self.process();
        }
    }

    fn reset(&mut self) {
        self.active = None;
        self.acked = 0;
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        self.active.iter().map(|a| a.queue.state()).collect()
    }
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
