//! Which traced address pair a packet carries: its own IPv4 pair, or the
//! inner pair of a VXLAN, Geneve or IPIP packet.
//!
//! Written once over [`Bytes`] so that the tc programs (reading the skb),
//! the drop program (reading its header snapshot) and the host tests all
//! run this very code. Every read is bounds-checked by the source and
//! offsets only grow by bounded header lengths, which the verifier can
//! follow.

use crate::headers::*;
use crate::{match_kind, FlowKey, PacketId, TunnelKey, TunnelPorts, UdpTunnel, ANY_VNI};

/// Packet bytes at offsets from where parsing starts; `None` past the end
/// (or when the read fails).
pub trait Bytes {
    fn u8_at(&self, at: usize) -> Option<u8>;

    /// Big-endian, as header fields are on the wire.
    #[inline(always)]
    fn u16_at(&self, at: usize) -> Option<u16> {
        Some(u16::from_be_bytes([self.u8_at(at)?, self.u8_at(at + 1)?]))
    }

    /// `N` bytes at `at`; a reader that can check the whole span at once
    /// does (one bounds check where a byte-wise read makes `N`).
    #[inline(always)]
    fn bytes_at<const N: usize>(&self, at: usize) -> Option<[u8; N]> {
        let mut out = [0u8; N];
        let mut i = 0;
        while i < N {
            out[i] = self.u8_at(at + i)?;
            i += 1;
        }
        Some(out)
    }

    /// The IPv4 (source, destination) pair of the header at `l3`.
    #[inline(always)]
    fn pair_at(&self, l3: usize) -> Option<FlowKey> {
        // One byte at a time: each read carries its own bounds check.
        let at = l3 + IPV4_SADDR;
        Some(FlowKey {
            src: [
                self.u8_at(at)?,
                self.u8_at(at + 1)?,
                self.u8_at(at + 2)?,
                self.u8_at(at + 3)?,
            ],
            dst: [
                self.u8_at(at + 4)?,
                self.u8_at(at + 5)?,
                self.u8_at(at + 6)?,
                self.u8_at(at + 7)?,
            ],
        })
    }
}

/// A header snapshot, as the drop program parses it in map memory.
impl Bytes for [u8] {
    #[inline(always)]
    fn u8_at(&self, at: usize) -> Option<u8> {
        // The offset is hidden from the optimizer so that every read keeps
        // its own bounds check: LLVM otherwise merges neighbouring checks
        // by what it knows of the offset (e.g. a multiple of 4), which the
        // verifier does not track, and rejects the program.
        self.get(core::hint::black_box(at)).copied()
    }
}

/// Offset of the IPv4 header behind an Ethernet header at `at`, if any
/// (one 802.1Q tag is skipped).
#[inline(always)]
pub fn ethernet_payload<B: Bytes + ?Sized>(b: &B, at: usize) -> Option<usize> {
    let mut proto = b.u16_at(at + ETH_TYPE)?;
    let mut l3 = at + ETH_HLEN;
    if proto == ETH_P_8021Q {
        proto = b.u16_at(at + ETH_TYPE + VLAN_HLEN)?;
        l3 += VLAN_HLEN;
    }
    (proto == ETH_P_IP).then_some(l3)
}

/// Length of the IPv4 header at `l3`, if it is one.
#[inline(always)]
pub fn ipv4_header_len<B: Bytes + ?Sized>(b: &B, l3: usize) -> Option<usize> {
    ipv4_len(b.u8_at(l3 + IPV4_VER_IHL)?)
}

/// The header length an IPv4 header's first byte (version and IHL) says,
/// if it is an IPv4 header's.
#[inline(always)]
pub fn ipv4_len(ver_ihl: u8) -> Option<usize> {
    let len = ((ver_ihl & IPV4_IHL_MASK) as usize) * 4;
    (ver_ihl >> 4 == IPV4_VERSION && len >= IPV4_HLEN).then_some(len)
}

/// The 24-bit VNI of a VXLAN or Geneve header at `at`.
#[inline(always)]
fn vni_at<B: Bytes + ?Sized>(b: &B, at: usize) -> Option<u32> {
    let at = at + TUNNEL_VNI;
    Some(u32::from_be_bytes([
        0,
        b.u8_at(at)?,
        b.u8_at(at + 1)?,
        b.u8_at(at + 2)?,
    ]))
}

/// Offset of the inner IPv4 header of a VXLAN, Geneve or IPIP packet whose
/// outer IPv4 header is at `l3` (options and Geneve options allowed), and
/// the tunnel its outer header names; `ports` says which UDP ports carry
/// which framing.
#[inline(always)]
pub fn tunnel_inner_ip<B: Bytes + ?Sized>(
    b: &B,
    l3: usize,
    ports: &TunnelPorts,
) -> Option<(usize, TunnelKey)> {
    let l4 = l3 + ipv4_header_len(b, l3)?;
    let protocol = b.u8_at(l3 + IPV4_PROTOCOL)?;
    let key = |port, vni| TunnelKey {
        port,
        protocol,
        _pad: 0,
        vni,
    };
    match protocol {
        IPPROTO_IPIP => Some((l4, key(0, ANY_VNI))),
        IPPROTO_UDP => {
            let payload = l4 + UDP_HLEN;
            let port = b.u16_at(l4 + L4_DPORT)?;
            match ports.udp_tunnel(port)? {
                UdpTunnel::Vxlan => {
                    let inner = ethernet_payload(b, payload + VXLAN_HLEN)?;
                    Some((inner, key(port, vni_at(b, payload)?)))
                }
                UdpTunnel::Geneve => {
                    let opt_words = b.u8_at(payload + GENEVE_VER_OPT_LEN)? & GENEVE_OPT_LEN_MASK;
                    let inner = payload + GENEVE_HLEN + (opt_words as usize) * 4;
                    let inner = match b.u16_at(payload + GENEVE_PROTOCOL)? {
                        ETH_P_TEB => ethernet_payload(b, inner)?,
                        ETH_P_IP => inner,
                        _ => return None,
                    };
                    Some((inner, key(port, vni_at(b, payload)?)))
                }
            }
        }
        _ => None,
    }
}

/// How the IPv4 packet at `l3` belongs to the traced flow (one of
/// [`match_kind`]), directly or through a tunnel's inner header; `None` if
/// it does not. `traced` asks the flow filter about one pair; `trusted`
/// whether this node's kernel would treat a packet with this outer pair
/// and tunnel as encapsulated at all (else its inner bytes are only a
/// payload, which a pod could have forged).
#[inline(always)]
pub fn classify<B: Bytes + ?Sized>(
    b: &B,
    l3: usize,
    ports: &TunnelPorts,
    traced: impl Fn(&FlowKey) -> bool,
    trusted: impl Fn(&FlowKey, &TunnelKey) -> bool,
) -> Option<u8> {
    ipv4_header_len(b, l3)?;
    let outer = b.pair_at(l3)?;
    if traced(&outer) {
        // Traced between two nodes' own addresses, one of the node's
        // tunnel packets is the carrier of the pair inside it.
        return match tunnel_inner_ip(b, l3, ports) {
            Some((inner, tunnel)) if trusted(&outer, &tunnel) => {
                Some(if traced(&b.pair_at(inner)?) {
                    match_kind::INNER
                } else {
                    match_kind::CARRIER
                })
            }
            _ => Some(match_kind::PLAIN),
        };
    }
    let (inner, tunnel) = tunnel_inner_ip(b, l3, ports)?;
    // The inner pair first: an untraced packet then costs one lookup per
    // header, and only a traced one pays for the trust checks.
    if !traced(&b.pair_at(inner)?) {
        return None;
    }
    trusted(&outer, &tunnel).then_some(match_kind::INNER)
}

/// Where the traced pair's IPv4 header is in a packet [`classify`] matched
/// as `kind` at `l3`: the inner header through a tunnel.
#[inline(always)]
pub fn traced_header<B: Bytes + ?Sized>(
    b: &B,
    l3: usize,
    kind: u8,
    ports: &TunnelPorts,
) -> Option<usize> {
    if kind == match_kind::INNER {
        Some(tunnel_inner_ip(b, l3, ports)?.0)
    } else {
        Some(l3)
    }
}

/// What tells one packet from another on every hook of its way (profile
/// mode): its traced pair (the inner one through a tunnel), IP ID and
/// protocol, and a word of L4 (TCP sequence, ICMP id and sequence, UDP
/// ports; the fragment offset for a later fragment).
#[inline(always)]
pub fn packet_id<B: Bytes + ?Sized>(
    b: &B,
    l3: usize,
    kind: u8,
    ports: &TunnelPorts,
) -> Option<PacketId> {
    let ip = traced_header(b, l3, kind, ports)?;
    let l4 = ip + ipv4_header_len(b, ip)?;
    let protocol = b.u8_at(ip + IPV4_PROTOCOL)?;
    let offset = b.u16_at(ip + IPV4_FRAG_OFF)? & IPV4_OFFSET_MASK;
    let word_at = |at: usize| -> Option<u32> {
        Some(u32::from(b.u16_at(at)?) << 16 | u32::from(b.u16_at(at + 2)?))
    };
    let l4_word = match protocol {
        _ if offset != 0 => u32::from(offset),
        IPPROTO_TCP | IPPROTO_ICMP => word_at(l4 + L4_SEQ)?,
        IPPROTO_UDP => word_at(l4 + L4_SPORT)?,
        _ => 0,
    };
    Some(PacketId {
        pair: b.pair_at(ip)?,
        ip_id: b.u16_at(ip + IPV4_ID)?,
        protocol,
        _pad: 0,
        l4: l4_word,
    })
}

/// Writes, at the start of `b`, the IPv4 header plus the first
/// [`TCP_HLEN`] bytes of L4 that a socket's packet would have: for a drop
/// that happened before the kernel built the real one. Returns its length.
#[inline(always)]
pub fn socket_header(
    b: &mut [u8],
    protocol: u8,
    pair: &FlowKey,
    local_port: u16,
    remote_port: [u8; 2],
) -> Option<usize> {
    let b = b.get_mut(..SOCKET_HEADER_LEN)?;
    // A loop, not fill(): no memset call for the eBPF linker to resolve.
    let mut i = 0;
    while i < SOCKET_HEADER_LEN {
        b[i] = 0;
        i += 1;
    }
    b[IPV4_VER_IHL] = IPV4_VER_IHL_PLAIN;
    b[IPV4_TOT_LEN..IPV4_TOT_LEN + 2].copy_from_slice(&(SOCKET_HEADER_LEN as u16).to_be_bytes());
    b[IPV4_PROTOCOL] = protocol;
    b[IPV4_SADDR..IPV4_SADDR + 4].copy_from_slice(&pair.src);
    b[IPV4_DADDR..IPV4_DADDR + 4].copy_from_slice(&pair.dst);
    let l4 = IPV4_HLEN;
    b[l4 + L4_SPORT..l4 + L4_SPORT + 2].copy_from_slice(&local_port.to_be_bytes());
    b[l4 + L4_DPORT..l4 + L4_DPORT + 2].copy_from_slice(&remote_port);
    // So that the header decodes as TCP too.
    b[l4 + TCP_DOFF] = TCP_DOFF_PLAIN;
    Some(SOCKET_HEADER_LEN)
}

/// Length of what [`socket_header`] writes.
pub const SOCKET_HEADER_LEN: usize = IPV4_HLEN + TCP_HLEN;
