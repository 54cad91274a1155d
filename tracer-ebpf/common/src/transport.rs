//! The transport header of the traced pair's IP header, read once: the
//! `--proto`/`--port` filter and a packet's identity (profile mode,
//! `--sample`) both start from it.
//!
//! One walk of IPv6's extension headers per packet, not one per
//! question: each walk multiplies the paths a verifier follows, and
//! 5.10's gave up past a million instructions when the filter and the
//! identity walked them again each.

use crate::headers::*;
use crate::packet::{ip_version, ipv4_len, traced_header, Bytes};
use crate::packet6::transport6;
use crate::TunnelPorts;

/// Where an IP header's transport header is, and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L4 {
    /// IP protocol (IPv4) or the last next header walked (IPv6).
    pub protocol: u8,
    /// Offset of the transport header.
    pub at: usize,
    /// The transport header is in this packet: not a later fragment.
    pub present: bool,
    /// The IP header is IPv6's.
    pub ipv6: bool,
    /// IPv4's ID; the low bits of IPv6's fragment ID (0 when unfragmented:
    /// IPv6 has no per-packet ID).
    pub ip_id: u16,
    /// The fragment offset in 8-byte units (0 if none).
    pub fragment_offset: u16,
}

/// The transport header of the IP header at `ip`, past IPv6's extension
/// headers. `V6`: whether the header may be IPv6 at all (false in a
/// program that reads IPv4 only, whose verifier then walks no IPv6 path).
#[inline(always)]
pub fn l4_of<B: Bytes + ?Sized, const V6: bool>(b: &B, ip: usize) -> Option<L4> {
    if V6 && ip_version(b, ip)? == IPV6_VERSION {
        let t = transport6(b, ip)?;
        return Some(L4 {
            protocol: t.protocol,
            at: t.at,
            present: t.is_present(),
            ipv6: true,
            ip_id: t.fragment.map_or(0, |f| f.id as u16),
            fragment_offset: t.fragment.map_or(0, |f| f.offset),
        });
    }
    // The header's first ten bytes at once: version and length, ID,
    // fragment offset and protocol, for one bounds check.
    let h = b.bytes_at::<{ IPV4_PROTOCOL + 1 }>(ip)?;
    let len = ipv4_len(h[IPV4_VER_IHL])?;
    let offset = u16::from_be_bytes([h[IPV4_FRAG_OFF], h[IPV4_FRAG_OFF + 1]]) & IPV4_OFFSET_MASK;
    Some(L4 {
        protocol: h[IPV4_PROTOCOL],
        at: ip + len,
        present: offset == 0,
        ipv6: false,
        ip_id: u16::from_be_bytes([h[IPV4_ID], h[IPV4_ID + 1]]),
        fragment_offset: offset,
    })
}

/// The traced pair's IP header in a packet matched as `kind` at `l3`
/// (the inner one through a tunnel), and its transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracedL4 {
    pub ip: usize,
    pub l4: L4,
}

/// [`TracedL4`] of the packet at `l3`; `V6` as for [`l4_of`].
#[inline(always)]
pub fn traced_l4<B: Bytes + ?Sized, const V6: bool>(
    b: &B,
    l3: usize,
    kind: u8,
    ports: &TunnelPorts,
) -> Option<TracedL4> {
    let ip = traced_header::<B, V6>(b, l3, kind, ports)?;
    Some(TracedL4 {
        ip,
        l4: l4_of::<B, V6>(b, ip)?,
    })
}
