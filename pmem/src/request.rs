//! Parsing and answering one virtio-pmem request (virtio 1.2, 5.19.6).
//!
//! A request is a chain of a device-readable `struct virtio_pmem_req
//! { le32 type; }` followed by a device-writable `struct virtio_pmem_resp
//! { le32 ret; }`. The only type is FLUSH (0). The image is mapped
//! read-only into every guest, so no guest write can be pending and a flush
//! has nothing to persist: a well-formed flush succeeds at once.
//!
//! Both parts may be split over several descriptors. Every address comes
//! from the guest and is reached only through checked guest-memory
//! accessors; at most 4 bytes are read and 4 written, and the chain was
//! already bounded by the queue size.

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestMemoryMmap};

/// Request type: flush.
pub const VIRTIO_PMEM_REQ_TYPE_FLUSH: u32 = 0;
/// Response: success.
pub const RESP_OK: u32 = 0;
/// Response: failure (the Linux driver turns any non-zero value into EIO).
pub const RESP_EIO: u32 = 1;

const REQ_LEN: usize = 4;
const RESP_LEN: u32 = 4;

/// What was wrong with a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A device-readable descriptor after a device-writable one.
    #[error("device-readable descriptor after a device-writable one")]
    Order,
    /// Fewer than 4 device-readable bytes.
    #[error("request is {0} bytes, need 4")]
    ShortRequest(u64),
    /// Fewer than 4 device-writable bytes: no way to answer.
    #[error("response buffer is {0} bytes, need 4")]
    ShortResponse(u64),
    /// Not FLUSH.
    #[error("unknown request type {0}")]
    UnknownType(u32),
    /// A buffer lies outside guest RAM.
    #[error("request buffer outside guest memory")]
    Memory,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// Bytes written into the chain (the used length): 4, or 0 when no
    /// response could be written.
    pub used_len: u32,
    /// `None` for a successful flush; the error otherwise (answered with
    /// [`RESP_EIO`] when `used_len` is 4).
    pub error: Option<RequestError>,
}

/// Handles the chain `descs`.
pub fn handle(mem: &GuestMemoryMmap, descs: &[Descriptor]) -> Completion {
    let split = descs
        .iter()
        .position(|d| d.is_write_only())
        .unwrap_or(descs.len());
    let (readable, writable) = descs.split_at(split);
    let ordered = writable.iter().all(|d| d.is_write_only());
    let status = if ordered {
        parse(mem, readable)
    } else {
        Err(RequestError::Order)
    };
    let ret = if status.is_ok() { RESP_OK } else { RESP_EIO };
    // Answer into the device-writable descriptors only.
    let out: Vec<&Descriptor> = writable.iter().filter(|d| d.is_write_only()).collect();
    let room: u64 = out.iter().map(|d| u64::from(d.len())).sum();
    if room < u64::from(RESP_LEN) {
        return Completion {
            used_len: 0,
            error: Some(RequestError::ShortResponse(room)),
        };
    }
    if scatter(mem, &out, &ret.to_le_bytes()).is_err() {
        return Completion {
            used_len: 0,
            error: Some(RequestError::Memory),
        };
    }
    Completion {
        used_len: RESP_LEN,
        error: status.err(),
    }
}

fn parse(mem: &GuestMemoryMmap, readable: &[Descriptor]) -> Result<(), RequestError> {
    let have: u64 = readable.iter().map(|d| u64::from(d.len())).sum();
    if have < REQ_LEN as u64 {
        return Err(RequestError::ShortRequest(have));
    }
    let mut req = [0u8; REQ_LEN];
    gather(mem, readable, &mut req)?;
    match u32::from_le_bytes(req) {
        VIRTIO_PMEM_REQ_TYPE_FLUSH => Ok(()),
        other => Err(RequestError::UnknownType(other)),
    }
}

/// Fills `buf` from the start of the chain part `descs`.
fn gather(mem: &GuestMemoryMmap, descs: &[Descriptor], buf: &mut [u8]) -> Result<(), RequestError> {
    let mut done = 0;
    for d in descs {
        if done == buf.len() {
            break;
        }
        let n = (d.len() as usize).min(buf.len() - done);
        mem.read_slice(&mut buf[done..done + n], d.addr())
            .map_err(|_| RequestError::Memory)?;
        done += n;
    }
    Ok(())
}

/// Writes `data` to the start of the chain part `descs`.
fn scatter(mem: &GuestMemoryMmap, descs: &[&Descriptor], data: &[u8]) -> Result<(), RequestError> {
    let mut done = 0;
    for d in descs {
        if done == data.len() {
            break;
        }
        let n = (d.len() as usize).min(data.len() - done);
        mem.write_slice(&data[done..done + n], d.addr())
            .map_err(|_| RequestError::Memory)?;
        done += n;
    }
    Ok(())
}
