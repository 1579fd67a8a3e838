//! Checksum and segmentation offloads: which the device offers, what the
//! TAP is told to hand over (TUNSETOFFLOAD, from what the driver took),
//! and the checks on the `virtio_net_hdr` fields in both directions.
//!
//! Offered: VIRTIO_NET_F_CSUM and HOST_TSO4/6 (the guest may send frames
//! with a partial checksum and TCP segments of up to 64 KiB, which the
//! host kernel finishes and segments), GUEST_CSUM and GUEST_TSO4/6 (the
//! TAP may hand the guest the same). Not offered: ECN, UFO/USO, merged rx
//! buffers (a driver that takes GUEST_TSO posts 64 KiB buffers itself, as
//! Linux does in its "big packets" mode).
//!
//! What the guest writes in a header is checked against what it took:
//! flags other than NEEDS_CSUM, a GSO type it did not take, a GSO frame
//! without NEEDS_CSUM or without a segment size, and a checksum position
//! outside the frame are refused (the frame is dropped as malformed); the
//! host kernel checks the rest when the frame is written to the TAP. Frames
//! from the TAP whose header asks for more than the driver took (left
//! queued on a TAP reused from a driver that took more) are dropped.

use super::VNET_HDR_LEN;

/// The driver handles packets with a partial checksum (guest → host).
pub const VIRTIO_NET_F_CSUM: u32 = 0;
/// The driver takes packets with a partial checksum (host → guest).
pub const VIRTIO_NET_F_GUEST_CSUM: u32 = 1;
/// The driver takes TCPv4 segments of up to 64 KiB.
pub const VIRTIO_NET_F_GUEST_TSO4: u32 = 7;
/// The driver takes TCPv6 segments of up to 64 KiB.
pub const VIRTIO_NET_F_GUEST_TSO6: u32 = 8;
/// The device takes TCPv4 segments of up to 64 KiB.
pub const VIRTIO_NET_F_HOST_TSO4: u32 = 11;
/// The device takes TCPv6 segments of up to 64 KiB.
pub const VIRTIO_NET_F_HOST_TSO6: u32 = 12;

/// The offload features the device offers.
pub const OFFLOAD_FEATURES: u64 = (1 << VIRTIO_NET_F_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6)
    | (1 << VIRTIO_NET_F_HOST_TSO4)
    | (1 << VIRTIO_NET_F_HOST_TSO6);

/// `virtio_net_hdr.flags`: the checksum at `csum_start + csum_offset` is
/// to be filled in.
pub const NEEDS_CSUM: u8 = 1;
/// `virtio_net_hdr.flags` (host → guest only): the checksum was checked.
pub const DATA_VALID: u8 = 2;
/// `gso_type` values.
pub const GSO_NONE: u8 = 0;
/// TCP over IPv4.
pub const GSO_TCPV4: u8 = 1;
/// TCP over IPv6.
pub const GSO_TCPV6: u8 = 4;

/// TUNSETOFFLOAD: `_IOW('T', 208, unsigned int)`.
pub const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
/// TUNSETOFFLOAD flags.
pub const TUN_F_CSUM: u32 = 0x01;
/// TCPv4 segmentation.
pub const TUN_F_TSO4: u32 = 0x02;
/// TCPv6 segmentation.
pub const TUN_F_TSO6: u32 = 0x04;

fn has(acked: u64, bit: u32) -> bool {
    acked & (1 << bit) != 0
}

/// What the TAP may hand a driver that took `acked`: partial checksums
/// with GUEST_CSUM, and TCP segments with GUEST_TSO4/6 (which need
/// GUEST_CSUM too).
pub fn tun_offload(acked: u64) -> u32 {
    if !has(acked, VIRTIO_NET_F_GUEST_CSUM) {
        return 0;
    }
    let mut f = TUN_F_CSUM;
    if has(acked, VIRTIO_NET_F_GUEST_TSO4) {
        f |= TUN_F_TSO4;
    }
    if has(acked, VIRTIO_NET_F_GUEST_TSO6) {
        f |= TUN_F_TSO6;
    }
    f
}

fn u16_at(h: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([h[at], h[at + 1]])
}

/// Whether `gso` is a segment type the side holding `csum`, `tso4` and
/// `tso6` took.
fn gso_allowed(gso: u8, tso4: bool, tso6: bool) -> bool {
    match gso {
        GSO_NONE => true,
        GSO_TCPV4 => tso4,
        GSO_TCPV6 => tso6,
        _ => false,
    }
}

/// Checks a header and frame position: a checksum to fill lies inside the
/// frame (`frame_len` bytes after the header), and a segment has a size.
fn fields_ok(h: &[u8], frame_len: usize) -> bool {
    let flags = h[0];
    let gso = h[1];
    if flags & NEEDS_CSUM != 0 {
        let start = usize::from(u16_at(h, 6));
        let off = usize::from(u16_at(h, 8));
        if start + off + 2 > frame_len {
            return false;
        }
    }
    if gso != GSO_NONE && (flags & NEEDS_CSUM == 0 || u16_at(h, 4) == 0) {
        return false;
    }
    true
}

/// Makes the header of a guest frame (`frame`: header + Ethernet frame)
/// fit for the TAP: without VIRTIO_NET_F_CSUM it is zeroed (the driver
/// promised nothing in it); with it, its flags and GSO fields are checked
/// against what the driver took and `num_buffers` is zeroed. False: drop
/// the frame as malformed.
pub fn tx_header(acked: u64, frame: &mut [u8]) -> bool {
    if frame.len() < VNET_HDR_LEN {
        return false;
    }
    let (h, rest) = frame.split_at_mut(VNET_HDR_LEN);
    if !has(acked, VIRTIO_NET_F_CSUM) {
        h.fill(0);
        return true;
    }
    let ok = h[0] & !NEEDS_CSUM == 0
        && gso_allowed(
            h[1],
            has(acked, VIRTIO_NET_F_HOST_TSO4),
            has(acked, VIRTIO_NET_F_HOST_TSO6),
        )
        && fields_ok(h, rest.len());
    h[10..12].fill(0);
    ok
}

/// Checks the header of a frame read from the TAP (`frame`: header +
/// Ethernet frame) against what the driver took and sets `num_buffers` to
/// one. False: drop it (it asks for an offload the driver did not take,
/// or its fields are out of the frame).
pub fn rx_header(acked: u64, frame: &mut [u8]) -> bool {
    if frame.len() < VNET_HDR_LEN {
        return false;
    }
    let (h, rest) = frame.split_at_mut(VNET_HDR_LEN);
    let csum = has(acked, VIRTIO_NET_F_GUEST_CSUM);
    let ok = if csum {
        h[0] & !(NEEDS_CSUM | DATA_VALID) == 0
            && gso_allowed(
                h[1],
                has(acked, VIRTIO_NET_F_GUEST_TSO4),
                has(acked, VIRTIO_NET_F_GUEST_TSO6),
            )
            && fields_ok(h, rest.len())
    } else {
        // Nothing was asked of the TAP: a frame it checksummed fully.
        h[0] & NEEDS_CSUM == 0 && h[1] == GSO_NONE
    };
    if !csum {
        h[..10].fill(0);
    }
    h[10..12].copy_from_slice(&1u16.to_le_bytes());
    ok
}

/// How many packets a frame (header + Ethernet frame) stands for on the
/// wire, as rate limits count them: one, or for a TCP segment the packets
/// it is cut into (what follows the Ethernet header over `gso_size`,
/// rounded up: the guest's `hdr_len` is not trusted, so headers count as
/// payload and the figure errs high).
pub fn wire_packets(frame: &[u8]) -> u64 {
    if frame.len() < VNET_HDR_LEN || frame[1] == GSO_NONE {
        return 1;
    }
    let size = u64::from(u16_at(frame, 4));
    let len = frame
        .len()
        .saturating_sub(VNET_HDR_LEN + super::ETH_HDR_LEN);
    let len = u64::try_from(len).unwrap_or(u64::MAX);
    if size == 0 {
        return 1;
    }
    len.div_ceil(size).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u64 = OFFLOAD_FEATURES;

    fn hdr(flags: u8, gso: u8, gso_size: u16, start: u16, off: u16) -> Vec<u8> {
        let mut h = vec![flags, gso];
        h.extend_from_slice(&54u16.to_le_bytes());
        h.extend_from_slice(&gso_size.to_le_bytes());
        h.extend_from_slice(&start.to_le_bytes());
        h.extend_from_slice(&off.to_le_bytes());
        h.extend_from_slice(&7u16.to_le_bytes());
        h.extend_from_slice(&[0u8; 100]);
        h
    }

    #[test]
    fn a_segment_counts_as_the_packets_it_becomes() {
        let mut f = hdr(NEEDS_CSUM, GSO_TCPV4, 1448, 34, 16);
        f.resize(VNET_HDR_LEN + 14 + 10 * 1448, 0);
        assert_eq!(wire_packets(&f), 10);
        f.push(0);
        assert_eq!(wire_packets(&f), 11);
        // Whatever hdr_len says.
        f[2..4].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(wire_packets(&f), 11);
        let mut one = hdr(NEEDS_CSUM, GSO_NONE, 1448, 34, 16);
        one.resize(4000, 0);
        assert_eq!(wire_packets(&one), 1);
        assert_eq!(wire_packets(&hdr(NEEDS_CSUM, GSO_TCPV4, 0, 34, 16)), 1);
        assert_eq!(wire_packets(&[0u8; 4]), 1);
    }

    #[test]
    fn the_tap_gets_what_the_driver_took() {
        assert_eq!(tun_offload(0), 0);
        assert_eq!(
            tun_offload(1 << VIRTIO_NET_F_GUEST_TSO4),
            0,
            "TSO needs CSUM"
        );
        assert_eq!(tun_offload(1 << VIRTIO_NET_F_GUEST_CSUM), TUN_F_CSUM);
        assert_eq!(tun_offload(ALL), TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6);
    }

    #[test]
    fn guest_headers_are_checked_against_what_it_took() {
        // A TCPv4 segment with its checksum 16 bytes into the TCP header.
        let mut f = hdr(NEEDS_CSUM, GSO_TCPV4, 1448, 34, 16);
        assert!(tx_header(ALL, &mut f));
        assert_eq!(f[..10], hdr(NEEDS_CSUM, GSO_TCPV4, 1448, 34, 16)[..10]);
        assert_eq!(f[10..12], [0, 0], "num_buffers zeroed");
        // Without CSUM the header is zeroed, whatever it said.
        let mut f = hdr(0xff, 0xff, 1, 0xffff, 0xffff);
        assert!(tx_header(0, &mut f));
        assert_eq!(f[..12], [0; 12]);
        let bad = [
            (ALL, hdr(NEEDS_CSUM | DATA_VALID, 0, 0, 34, 16)),
            (ALL, hdr(0x80, 0, 0, 0, 0)),
            (ALL, hdr(NEEDS_CSUM, 3, 1448, 34, 6)),
            (ALL, hdr(NEEDS_CSUM, GSO_TCPV4 | 0x80, 1448, 34, 16)),
            (ALL, hdr(0, GSO_TCPV4, 1448, 34, 16)),
            (ALL, hdr(NEEDS_CSUM, GSO_TCPV4, 0, 34, 16)),
            (ALL, hdr(NEEDS_CSUM, 0, 0, 100, 0)),
            (ALL, hdr(NEEDS_CSUM, 0, 0, 0xffff, 0xffff)),
            (
                ALL & !(1 << VIRTIO_NET_F_HOST_TSO6),
                hdr(NEEDS_CSUM, GSO_TCPV6, 1448, 54, 16),
            ),
        ];
        for (i, (acked, mut f)) in bad.into_iter().enumerate() {
            assert!(!tx_header(acked, &mut f), "case {i}");
        }
        assert!(!tx_header(ALL, &mut [0u8; 4]));
    }

    #[test]
    fn tap_headers_are_checked_against_what_the_driver_took() {
        let mut f = hdr(NEEDS_CSUM, GSO_TCPV6, 1428, 54, 16);
        assert!(rx_header(ALL, &mut f));
        assert_eq!(f[10..12], [1, 0], "num_buffers");
        let mut f = hdr(DATA_VALID, 0, 0, 0, 0);
        assert!(rx_header(ALL, &mut f));
        // A driver that took nothing gets a zero header, and no partial
        // checksums or segments.
        let mut f = hdr(DATA_VALID, 0, 0, 0, 0);
        assert!(rx_header(0, &mut f));
        assert_eq!(f[..12], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
        assert!(!rx_header(0, &mut hdr(NEEDS_CSUM, 0, 0, 34, 16)));
        assert!(!rx_header(0, &mut hdr(0, GSO_TCPV4, 1448, 0, 0)));
        let csum_only = 1 << VIRTIO_NET_F_GUEST_CSUM;
        assert!(rx_header(csum_only, &mut hdr(NEEDS_CSUM, 0, 0, 34, 16)));
        assert!(!rx_header(
            csum_only,
            &mut hdr(NEEDS_CSUM, GSO_TCPV4, 1448, 34, 16)
        ));
        assert!(!rx_header(ALL, &mut hdr(NEEDS_CSUM, 0, 0, 200, 0)));
    }
}
