//! Which traced address pair a packet carries: its own IPv4 or IPv6 pair,
//! or the inner pair of a VXLAN, Geneve or IPIP packet over either family.
//!
//! Written once over [`Bytes`] so that the tc programs (reading the skb),
//! the drop program (reading its header snapshot) and the host tests all
//! run this very code. Every read is bounds-checked by the source and
//! offsets only grow by bounded header lengths, which the verifier can
//! follow.

use crate::headers::*;
use crate::packet6::{fold6, is_ipv6, pair6_at, FlowKey6};
use crate::profile::PacketId;
use crate::sighting::match_kind;
use crate::transport::L4;
use crate::{FlowKey, TunnelKey, TunnelPorts, UdpTunnel, ANY_VNI};

/// What the classifier asks of the node's maps, for either family:
/// whether a pair is traced, and whether an outer header and tunnel are
/// one the node's kernel would decapsulate.
pub trait Flows {
    /// Whether another program reads IPv6 pairs (the tc hooks' IPv6
    /// twins): an IPv4 tunnel packet with an IPv6 packet inside is then
    /// matched as [`match_kind::HAND_TO_IPV6`], its inner pair unread,
    /// for that program to judge ([`classify6_in4`]). A constant, so a
    /// program that reads both families itself has no such path.
    const IPV6_ELSEWHERE: bool = false;
    fn traced(&self, key: &FlowKey) -> bool;
    fn traced6(&self, key: &FlowKey6) -> bool;
    fn trusted(&self, outer: &FlowKey, tunnel: &TunnelKey) -> bool;
    fn trusted6(&self, outer: &FlowKey6, tunnel: &TunnelKey) -> bool;
}

/// [`Flows`] of an IPv4-only trace, from two closures: no IPv6 pair is
/// traced and no IPv6 underlay trusted.
pub struct Ipv4Flows<T, U>(pub T, pub U);

impl<T, U> Flows for Ipv4Flows<T, U>
where
    T: Fn(&FlowKey) -> bool,
    U: Fn(&FlowKey, &TunnelKey) -> bool,
{
    #[inline(always)]
    fn traced(&self, key: &FlowKey) -> bool {
        (self.0)(key)
    }
    #[inline(always)]
    fn traced6(&self, _: &FlowKey6) -> bool {
        false
    }
    #[inline(always)]
    fn trusted(&self, outer: &FlowKey, tunnel: &TunnelKey) -> bool {
        (self.1)(outer, tunnel)
    }
    #[inline(always)]
    fn trusted6(&self, _: &FlowKey6, _: &TunnelKey) -> bool {
        false
    }
}

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
        // The byte too: LLVM otherwise carried the Option of a read as
        // its pointer and masked that into the byte, and the verifier
        // refuses arithmetic on a pointer.
        self.get(core::hint::black_box(at))
            .map(|byte| core::hint::black_box(*byte))
    }
}

/// Offset of the IPv4 or IPv6 header behind an Ethernet header at `at`,
/// if any (one 802.1Q tag is skipped); [`ip_version`] tells which.
#[inline(always)]
pub fn ethernet_payload<B: Bytes + ?Sized>(b: &B, at: usize) -> Option<usize> {
    let mut proto = b.u16_at(at + ETH_TYPE)?;
    let mut l3 = at + ETH_HLEN;
    if proto == ETH_P_8021Q {
        proto = b.u16_at(at + ETH_TYPE + VLAN_HLEN)?;
        l3 += VLAN_HLEN;
    }
    (proto == ETH_P_IP || proto == ETH_P_IPV6).then_some(l3)
}

/// The IP version of the header at `l3` (4 or 6; anything else is no
/// packet podtrace reads).
#[inline(always)]
pub fn ip_version<B: Bytes + ?Sized>(b: &B, l3: usize) -> Option<u8> {
    Some(b.u8_at(l3)? >> 4)
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

/// Offset of the inner IP header of a VXLAN, Geneve or IPIP packet whose
/// outer IPv4 or IPv6 header is at `l3`, and the tunnel its outer header
/// names; `ports` says which UDP ports carry which framing.
#[inline(always)]
pub fn tunnel_inner_ip<B: Bytes + ?Sized>(
    b: &B,
    l3: usize,
    ports: &TunnelPorts,
) -> Option<(usize, TunnelKey)> {
    match ip_version(b, l3)? {
        IPV4_VERSION => tunnel_inner4(b, l3, ports),
        IPV6_VERSION => tunnel_inner6(b, l3, ports),
        _ => None,
    }
}

/// [`tunnel_inner_ip`] under an IPv4 header (options allowed).
#[inline(always)]
fn tunnel_inner4<B: Bytes + ?Sized>(
    b: &B,
    l3: usize,
    ports: &TunnelPorts,
) -> Option<(usize, TunnelKey)> {
    let l4 = l3 + ipv4_header_len(b, l3)?;
    tunnel_payload(b, l4, b.u8_at(l3 + IPV4_PROTOCOL)?, ports)
}

/// [`tunnel_inner_ip`] under an IPv6 header. The kernel's tunnels send
/// no extension headers, so a packet with any is not read as one.
#[inline(always)]
fn tunnel_inner6<B: Bytes + ?Sized>(
    b: &B,
    l3: usize,
    ports: &TunnelPorts,
) -> Option<(usize, TunnelKey)> {
    tunnel_payload(b, l3 + IPV6_HLEN, b.u8_at(l3 + IPV6_NEXT_HEADER)?, ports)
}

/// The inner IP header of the tunnel whose outer transport header (of IP
/// protocol `protocol`) is at `l4` (Geneve options allowed).
#[inline(always)]
fn tunnel_payload<B: Bytes + ?Sized>(
    b: &B,
    l4: usize,
    protocol: u8,
    ports: &TunnelPorts,
) -> Option<(usize, TunnelKey)> {
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
                        ETH_P_IP | ETH_P_IPV6 => inner,
                        _ => return None,
                    };
                    Some((inner, key(port, vni_at(b, payload)?)))
                }
            }
        }
        _ => None,
    }
}

/// Whether the IP header at `inner` (of either family) carries a traced
/// pair.
#[inline(always)]
fn inner_traced<B: Bytes + ?Sized, F: Flows>(b: &B, inner: usize, flows: &F) -> Option<bool> {
    if ip_version(b, inner)? == IPV6_VERSION {
        Some(flows.traced6(&pair6_at(b, inner)?))
    } else {
        Some(flows.traced(&b.pair_at(inner)?))
    }
}

/// How the IPv4 or IPv6 packet at `l3` belongs to the traced flow (one of
/// [`match_kind`]), directly or through a tunnel's inner header of either
/// family; `None` if it does not. `flows` says which pairs are traced,
/// and whether this node's kernel would treat a packet with an outer pair
/// and tunnel as encapsulated at all (else its inner bytes are only a
/// payload, which a pod could have forged).
#[inline(always)]
pub fn classify_ip<B: Bytes + ?Sized, F: Flows>(
    b: &B,
    l3: usize,
    ports: &TunnelPorts,
    flows: &F,
) -> Option<u8> {
    match ip_version(b, l3)? {
        IPV4_VERSION => classify4(b, l3, ports, flows),
        IPV6_VERSION => classify6(b, l3, ports, flows),
        _ => None,
    }
}

/// [`classify_ip`] of an IPv4-only trace: `traced` asks the flow filter
/// about one pair; `trusted` whether a tunnel packet is the node's.
#[inline(always)]
pub fn classify<B: Bytes + ?Sized>(
    b: &B,
    l3: usize,
    ports: &TunnelPorts,
    traced: impl Fn(&FlowKey) -> bool,
    trusted: impl Fn(&FlowKey, &TunnelKey) -> bool,
) -> Option<u8> {
    classify_ip(b, l3, ports, &Ipv4Flows(traced, trusted))
}

/// [`classify_ip`] of an IPv4 packet (`None` for any other).
#[inline(always)]
pub fn classify4<B: Bytes + ?Sized, F: Flows>(
    b: &B,
    l3: usize,
    ports: &TunnelPorts,
    flows: &F,
) -> Option<u8> {
    ipv4_header_len(b, l3)?;
    let outer = b.pair_at(l3)?;
    if flows.traced(&outer) {
        // Traced between two nodes' own addresses, one of the node's
        // tunnel packets is the carrier of the pair inside it.
        return match tunnel_inner4(b, l3, ports) {
            Some((inner, tunnel)) if flows.trusted(&outer, &tunnel) => {
                if F::IPV6_ELSEWHERE && is_ipv6(b, inner) {
                    return Some(match_kind::HAND_TO_IPV6);
                }
                Some(carried_kind(inner_traced(b, inner, flows)?))
            }
            _ => Some(match_kind::PLAIN),
        };
    }
    let Some((inner, tunnel)) = tunnel_inner4(b, l3, ports) else {
        return crate::pmtu::too_big_about4(b, l3, flows);
    };
    if F::IPV6_ELSEWHERE && is_ipv6(b, inner) {
        return Some(match_kind::HAND_TO_IPV6);
    }
    // The inner pair first: an untraced packet then costs one lookup per
    // header, and only a traced one pays for the trust checks.
    if !inner_traced(b, inner, flows)? {
        return None;
    }
    flows.trusted(&outer, &tunnel).then_some(match_kind::INNER)
}

/// [`classify_ip`] of an IPv6 packet: the same questions of its pair, in
/// the same order. (Spelt again rather than shared with IPv4: a shared
/// generic changed the order LLVM computed IPv4's in, and verifiers
/// before 5.19 refused the reordered program's read of a stack slot one
/// path never wrote.)
#[inline(always)]
pub fn classify6<B: Bytes + ?Sized, F: Flows>(
    b: &B,
    l3: usize,
    ports: &TunnelPorts,
    flows: &F,
) -> Option<u8> {
    if !is_ipv6(b, l3) {
        return None;
    }
    let outer = pair6_at(b, l3)?;
    if flows.traced6(&outer) {
        return match tunnel_inner6(b, l3, ports) {
            Some((inner, tunnel)) if flows.trusted6(&outer, &tunnel) => {
                Some(carried_kind(inner_traced(b, inner, flows)?))
            }
            _ => Some(match_kind::PLAIN),
        };
    }
    let (inner, tunnel) = tunnel_inner6(b, l3, ports)?;
    if !inner_traced(b, inner, flows)? {
        return None;
    }
    flows.trusted6(&outer, &tunnel).then_some(match_kind::INNER)
}

/// How an IPv4 tunnel packet at `l3` with an IPv6 packet inside belongs
/// to the traced flow, in the program [`match_kind::HAND_TO_IPV6`] handed
/// it to: INNER where the inner IPv6 pair is traced, CARRIER where the
/// outer IPv4 pair is and the inner one not; either only through a
/// tunnel the node would decapsulate, as for an IPv4 packet inside.
/// `None` for any other packet (an IPv4 one inside is the IPv4
/// program's).
#[inline(always)]
pub fn classify6_in4<B: Bytes + ?Sized, F: Flows>(
    b: &B,
    l3: usize,
    ports: &TunnelPorts,
    flows: &F,
) -> Option<u8> {
    let (inner, tunnel) = tunnel_inner4(b, l3, ports)?;
    if !is_ipv6(b, inner) {
        return None;
    }
    let inner_is_traced = flows.traced6(&pair6_at(b, inner)?);
    let outer = b.pair_at(l3)?;
    if !inner_is_traced && !flows.traced(&outer) {
        return None;
    }
    flows
        .trusted(&outer, &tunnel)
        .then_some(carried_kind(inner_is_traced))
}

/// A trusted tunnel packet of a traced pair: it carries a traced packet
/// (matched by that one), or is the carrier of another pair's.
#[inline(always)]
fn carried_kind(inner_is_traced: bool) -> u8 {
    if inner_is_traced {
        match_kind::INNER
    } else {
        match_kind::CARRIER
    }
}

/// Where the traced pair's IP header is in a packet [`classify`] matched
/// as `kind` at `l3`: the inner header through a tunnel. `V6`: whether
/// IPv6 headers may be met at all (false in a program that reads IPv4
/// only, whose verifier then walks no IPv6 path: see [`judge`]).
///
/// [`judge`]: crate::filter::judge
#[inline(always)]
pub fn traced_header<B: Bytes + ?Sized, const V6: bool>(
    b: &B,
    l3: usize,
    kind: u8,
    ports: &TunnelPorts,
) -> Option<usize> {
    if kind != match_kind::INNER {
        Some(l3)
    } else if V6 {
        Some(tunnel_inner_ip(b, l3, ports)?.0)
    } else {
        Some(tunnel_inner4(b, l3, ports)?.0)
    }
}

/// What tells one packet from another on every hook of its way (profile
/// mode): its traced pair at `ip` (the inner one through a tunnel; an
/// IPv6 pair folded to IPv4's width, a hash key never shown), IP ID and
/// protocol, and a word of L4 (TCP sequence, ICMP id and sequence, UDP
/// ports; the fragment offset for a later fragment). `l4`: the header's
/// transport, as [`l4_of`] read it.
///
/// [`l4_of`]: crate::transport::l4_of
#[inline(always)]
pub fn packet_id<B: Bytes + ?Sized>(b: &B, ip: usize, l4: &L4) -> Option<PacketId> {
    let l4_word = match l4.protocol {
        _ if !l4.present => u32::from(l4.fragment_offset),
        IPPROTO_TCP | IPPROTO_ICMP | IPPROTO_ICMPV6 => word_at(b, l4.at + L4_SEQ)?,
        IPPROTO_UDP => word_at(b, l4.at + L4_SPORT)?,
        _ => 0,
    };
    let pair = if l4.ipv6 {
        fold6(&pair6_at(b, ip)?)
    } else {
        b.pair_at(ip)?
    };
    Some(PacketId {
        pair,
        ip_id: l4.ip_id,
        protocol: l4.protocol,
        _pad: 0,
        l4: l4_word,
    })
}

/// Four bytes at `at`, big-endian.
#[inline(always)]
fn word_at<B: Bytes + ?Sized>(b: &B, at: usize) -> Option<u32> {
    Some(u32::from(b.u16_at(at)?) << 16 | u32::from(b.u16_at(at + 2)?))
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
