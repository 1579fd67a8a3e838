//! Packet headers: parsing and validating what the guest sends (TX) and
//! writing what the device sends (RX), on top of `virtio_vsock::packet`,
//! which checks descriptor directions, the header size, `len` against the
//! descriptor and a payload cap, and copies the header once (no TOCTOU).

use super::{HOST_CID, MAX_PKT_DATA};
use virtio_queue::DescriptorChain;
use virtio_vsock::packet::{VsockPacket, PKT_HEADER_SIZE};
use vm_memory::{GuestMemoryMmap, VolatileSlice};

/// Header size on the wire.
#[allow(clippy::cast_possible_truncation)] // 44 bytes
pub const HDR_LEN: u32 = PKT_HEADER_SIZE as u32;
/// Stream sockets, the only type served.
pub const TYPE_STREAM: u16 = 1;
/// SHUTDOWN flag: the sender will receive no more.
pub const SHUTDOWN_RCV: u32 = 1;
/// SHUTDOWN flag: the sender will send no more.
pub const SHUTDOWN_SEND: u32 = 2;

/// Packet operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Connection request.
    Request = 1,
    /// Connection accepted.
    Response = 2,
    /// Reset: connection refused or torn down.
    Rst = 3,
    /// Half or full close, see the `SHUTDOWN_*` flags.
    Shutdown = 4,
    /// Data.
    Rw = 5,
    /// The sender's buffer space changed.
    CreditUpdate = 6,
    /// Asks the peer for a credit update.
    CreditRequest = 7,
}

impl Op {
    fn from_code(v: u16) -> Option<Self> {
        Some(match v {
            1 => Self::Request,
            2 => Self::Response,
            3 => Self::Rst,
            4 => Self::Shutdown,
            5 => Self::Rw,
            6 => Self::CreditUpdate,
            7 => Self::CreditRequest,
            _ => return None,
        })
    }
}

/// Why a TX packet was dropped without an answer.
#[derive(Debug, thiserror::Error)]
pub enum PacketError {
    /// The descriptor chain does not hold a well-formed packet.
    #[error("malformed packet: {0}")]
    Malformed(#[from] virtio_vsock::packet::Error),
    /// The source is not the guest.
    #[error("source cid {0} is not the guest's")]
    SrcCid(u64),
    /// The destination is not the host.
    #[error("destination cid {0} is not the host")]
    DstCid(u64),
}

/// A guest packet whose header passed validation. `op` is `None` for an
/// unknown op code; `stream` is false for a socket type other than stream.
pub struct TxPacket<'a> {
    /// Guest's port.
    pub src_port: u32,
    /// Host port it is sent to.
    pub dst_port: u32,
    /// Operation, if known.
    pub op: Option<Op>,
    /// Whether the socket type is stream.
    pub stream: bool,
    /// SHUTDOWN flags.
    pub flags: u32,
    /// Guest's receive buffer size.
    pub buf_alloc: u32,
    /// Bytes the guest has consumed so far.
    pub fwd_cnt: u32,
    /// Payload (exactly the header's `len` bytes), if any.
    pub data: Option<VolatileSlice<'a, ()>>,
}

/// Parses one TX chain. Packets not from `guest_cid` to the host are
/// rejected; the payload is capped at [`MAX_PKT_DATA`].
pub fn parse_tx<'a>(
    mem: &'a GuestMemoryMmap,
    chain: &mut DescriptorChain<&'a GuestMemoryMmap>,
    guest_cid: u64,
) -> Result<TxPacket<'a>, PacketError> {
    let pkt = VsockPacket::from_tx_virtq_chain(mem, chain, MAX_PKT_DATA)?;
    if pkt.src_cid() != guest_cid {
        return Err(PacketError::SrcCid(pkt.src_cid()));
    }
    if pkt.dst_cid() != HOST_CID {
        return Err(PacketError::DstCid(pkt.dst_cid()));
    }
    Ok(TxPacket {
        src_port: pkt.src_port(),
        dst_port: pkt.dst_port(),
        op: Op::from_code(pkt.op()),
        stream: pkt.type_() == TYPE_STREAM,
        flags: pkt.flags(),
        buf_alloc: pkt.buf_alloc(),
        fwd_cnt: pkt.fwd_cnt(),
        // Present exactly when len > 0, and then len bytes long.
        data: pkt.data_slice().copied(),
    })
}

/// Header of a packet the device sends to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxHeader {
    /// Guest cid (destination).
    pub dst_cid: u64,
    /// Host-side port.
    pub src_port: u32,
    /// Guest-side port.
    pub dst_port: u32,
    /// Payload length.
    pub len: u32,
    /// Operation.
    pub op: Op,
    /// SHUTDOWN flags.
    pub flags: u32,
    /// Device's receive buffer for this connection.
    pub buf_alloc: u32,
    /// Bytes the device has forwarded to the host so far.
    pub fwd_cnt: u32,
}

impl RxHeader {
    /// The little-endian wire form.
    pub fn to_bytes(self) -> [u8; PKT_HEADER_SIZE] {
        let mut b = [0u8; PKT_HEADER_SIZE];
        b[0..8].copy_from_slice(&HOST_CID.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&TYPE_STREAM.to_le_bytes());
        b[30..32].copy_from_slice(&(self.op as u16).to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

/// An RX buffer the device fills: the header area and the payload area.
pub type RxPacket<'a> = VsockPacket<'a, ()>;

/// Writes `hdr` into `pkt` and returns the used length to report.
pub fn write_rx(pkt: &mut RxPacket<'_>, hdr: &RxHeader) -> u32 {
    // The header slice is exactly PKT_HEADER_SIZE bytes, so this cannot fail;
    // if it somehow did, the guest gets a zero-length (ignored) buffer.
    match pkt.set_header_from_raw(&hdr.to_bytes()) {
        Ok(()) => HDR_LEN.saturating_add(hdr.len),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_codes_round_trip() {
        for code in 1..=7u16 {
            assert_eq!(Op::from_code(code).map(|o| o as u16), Some(code));
        }
        assert_eq!(Op::from_code(0), None);
        assert_eq!(Op::from_code(8), None);
    }

    #[test]
    fn header_layout() {
        let h = RxHeader {
            dst_cid: 3,
            src_port: 0x4000_0000,
            dst_port: 52,
            len: 7,
            op: Op::Rw,
            flags: 0,
            buf_alloc: 0x1000,
            fwd_cnt: 9,
        };
        let b = h.to_bytes();
        assert_eq!(b.len(), 44);
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 2);
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 3);
        assert_eq!(u32::from_le_bytes(b[16..20].try_into().unwrap()), 1 << 30);
        assert_eq!(u16::from_le_bytes(b[30..32].try_into().unwrap()), 5);
        assert_eq!(u32::from_le_bytes(b[40..44].try_into().unwrap()), 9);
    }
}
