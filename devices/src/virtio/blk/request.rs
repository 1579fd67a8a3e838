//! Parsing and executing one virtio-blk request. Every address, length and
//! sector the guest supplies is checked before the host touches the file.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Sector size the protocol counts in.
pub const SECTOR_SIZE: u64 = 512;
const HDR_LEN: u32 = 16;
const ID_LEN: usize = 20;

/// Request status values written back to the guest.
pub const STATUS_OK: u8 = 0;
/// I/O error.
pub const STATUS_IOERR: u8 = 1;
/// Unsupported request.
pub const STATUS_UNSUPP: u8 = 2;

/// The request kinds we serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestType {
    /// Read sectors.
    In,
    /// Write sectors.
    Out,
    /// Flush to stable storage.
    Flush,
    /// Device id string.
    GetId,
    /// Anything else.
    Unsupported(u32),
}

impl From<u32> for RequestType {
    fn from(v: u32) -> Self {
        match v {
            0 => Self::In,
            1 => Self::Out,
            4 => Self::Flush,
            8 => Self::GetId,
            other => Self::Unsupported(other),
        }
    }
}

/// The backing file and what the guest may do with it.
pub(super) struct Backing {
    pub file: File,
    pub read_only: bool,
    pub sectors: u64,
    pub id: [u8; ID_LEN],
}

/// Runs the request in `descs` (one descriptor chain, already bounded by the
/// queue size). Returns the number of bytes written into guest memory.
pub(super) fn execute(mem: &GuestMemoryMmap, backing: &Backing, descs: &[Descriptor]) -> u32 {
    let Some((status_desc, body)) = descs.split_last() else {
        return 0;
    };
    if !status_desc.is_write_only() || status_desc.len() < 1 {
        // Nowhere to report status: drop the request (used len 0).
        return 0;
    }
    let status_addr = status_desc.addr();
    let (status, written) = match run(mem, backing, body) {
        Ok(n) => (STATUS_OK, n),
        Err(s) => (s, 0),
    };
    if mem.write_obj(status, status_addr).is_err() {
        return 0;
    }
    written.saturating_add(1)
}

fn run(mem: &GuestMemoryMmap, b: &Backing, body: &[Descriptor]) -> Result<u32, u8> {
    let (hdr, data) = body.split_first().ok_or(STATUS_IOERR)?;
    if hdr.is_write_only() || hdr.len() < HDR_LEN {
        return Err(STATUS_IOERR);
    }
    let ty: u32 = mem.read_obj(hdr.addr()).map_err(|_| STATUS_IOERR)?;
    let sector: u64 = mem
        .read_obj(hdr.addr().unchecked_add(8))
        .map_err(|_| STATUS_IOERR)?;
    match RequestType::from(ty) {
        RequestType::In => transfer(mem, b, data, sector, true),
        RequestType::Out => {
            if b.read_only {
                return Err(STATUS_IOERR);
            }
            transfer(mem, b, data, sector, false)
        }
        RequestType::Flush => {
            if !b.read_only {
                b.file.sync_data().map_err(|_| STATUS_IOERR)?;
            }
            Ok(0)
        }
        RequestType::GetId => {
            let d = data
                .first()
                .filter(|d| d.is_write_only())
                .ok_or(STATUS_IOERR)?;
            let n = usize::try_from(d.len()).unwrap_or(usize::MAX).min(ID_LEN);
            mem.write_slice(&b.id[..n], d.addr())
                .map_err(|_| STATUS_IOERR)?;
            u32::try_from(n).map_err(|_| STATUS_IOERR)
        }
        RequestType::Unsupported(_) => Err(STATUS_UNSUPP),
    }
}

/// Moves data between guest buffers and the file at `sector`.
fn transfer(
    mem: &GuestMemoryMmap,
    b: &Backing,
    data: &[Descriptor],
    sector: u64,
    to_guest: bool,
) -> Result<u32, u8> {
    let total: u64 = data.iter().map(|d| u64::from(d.len())).sum();
    if !total.is_multiple_of(SECTOR_SIZE) {
        return Err(STATUS_IOERR);
    }
    let end = sector
        .checked_add(total / SECTOR_SIZE)
        .ok_or(STATUS_IOERR)?;
    if end > b.sectors {
        return Err(STATUS_IOERR);
    }
    let mut pos = sector * SECTOR_SIZE;
    for d in data {
        if d.is_write_only() != to_guest {
            return Err(STATUS_IOERR);
        }
        io_at(mem, &b.file, d.addr(), d.len() as usize, pos, to_guest)?;
        pos += u64::from(d.len());
    }
    Ok(if to_guest {
        u32::try_from(total).map_err(|_| STATUS_IOERR)?
    } else {
        0
    })
}

/// One positional read or write directly into or out of guest memory.
fn io_at(
    mem: &GuestMemoryMmap,
    file: &File,
    addr: GuestAddress,
    len: usize,
    mut off: u64,
    to_guest: bool,
) -> Result<(), u8> {
    let slice = mem.get_slice(addr, len).map_err(|_| STATUS_IOERR)?;
    let guard = slice.ptr_guard_mut();
    let base = guard.as_ptr();
    let mut done = 0usize;
    while done < len {
        let off_i = i64::try_from(off).map_err(|_| STATUS_IOERR)?;
        // SAFETY: `base..base+len` is a live mapping of guest memory checked by
        // `get_slice`; `done < len`, so the pointer and length stay inside it.
        // The kernel reads or writes those bytes; the guest may race on them,
        // which only affects the guest's own data.
        let n = unsafe {
            let p = base.add(done).cast::<libc::c_void>();
            if to_guest {
                libc::pread(file.as_raw_fd(), p, len - done, off_i)
            } else {
                libc::pwrite(file.as_raw_fd(), p, len - done, off_i)
            }
        };
        match n {
            n if n > 0 => {
                let n = n.unsigned_abs();
                done += n;
                off += n as u64;
            }
            0 if to_guest => {
                // Past the end of a file whose size is not a sector multiple
                // cannot happen (capacity is rounded down); treat as error.
                return Err(STATUS_IOERR);
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(STATUS_IOERR);
                }
            }
        }
    }
    Ok(())
}
