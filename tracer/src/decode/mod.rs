//! Decoding of the header snapshots the kernel copies: outer headers, the
//! tunnel (VXLAN, Geneve, IPIP) if any, and the traced packet inside it,
//! IPv4 or IPv6 at each layer.
//! `hop` places a whole kernel record on its node and interface.

pub mod hop;
pub mod quote;
pub mod sighting;
mod transport;
pub mod wireguard_leg;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{EtherType, Ethernet2Header, IpNumber, Ipv4Header, TcpHeader, UdpHeader};
use podtrace_common::{packet6::transport6, GENEVE_PORT};
use serde::{Deserialize, Serialize};

use quote::Quoted;
pub use transport::{Transport, TCP_ACK, TCP_RST, TCP_SYN};

/// An IPv4 or IPv6 header and what follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct IpPacket {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IPv4's TTL, IPv6's hop limit.
    pub ttl: u8,
    /// IPv4's ID; IPv6's fragment ID (low 16 bits) for a fragment, else 0.
    pub ip_id: u16,
    /// The whole IP packet's length (IPv6: its payload length plus 40).
    pub total_len: u16,
    /// IPv4's DF; always set for IPv6, which routers never fragment.
    pub dont_fragment: bool,
    /// More fragments follow (MF), or this is not the first (offset > 0):
    /// a piece of a larger packet.
    pub fragment: bool,
    pub transport: Transport,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TunnelKind {
    Vxlan,
    Geneve,
    Ipip,
    /// Encrypted by WireGuard into UDP: the packet inside is the one the
    /// WireGuard device took, known by the kernel's flow hash, not read
    /// from the ciphertext (`wireguard_leg`).
    Wireguard,
}

/// The outer layer of an encapsulated packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct Tunnel {
    pub kind: TunnelKind,
    /// VXLAN / Geneve network identifier.
    pub vni: Option<u32>,
    pub outer: IpPacket,
    /// WireGuard's data message header: which session the receiving peer
    /// decrypts it with, and its counter (unique per packet in a session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wireguard: Option<WireguardData>,
}

/// A WireGuard transport data message's clear header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct WireguardData {
    /// The receiver's session index (as WireGuard writes it, host order
    /// of its little-endian field).
    pub receiver: u32,
    /// The message counter (nonce): one per packet sent in a session.
    pub counter: u64,
    /// How the kernel's sighting of this UDP packet is known to carry
    /// the traced one.
    #[serde(default)]
    pub known_by: KnownBy,
}

/// What pairs an encrypted leg with the traced packet inside it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum KnownBy {
    /// The tag the sending node's kernel wrote into the traced packet's
    /// flow hash, which WireGuard keeps (the sending node).
    #[default]
    FlowHashTag,
    /// Its receiver index and counter, and outer addresses, the same as
    /// those of a leg the sending node's kernel saw leave (another node,
    /// where the wire lost the tag). A counter is used once per session.
    ReceiverAndCounter,
}

/// A decoded sighting: the traced packet, the tunnel around it if any,
/// and, for an ICMP error, the header of the packet it is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decoded {
    pub packet: IpPacket,
    pub tunnel: Option<Tunnel>,
    /// Not part of the packet's key: NAT rewrites it on the way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quoted: Option<Quoted>,
}

impl Decoded {
    /// The IP header the packet travels under: the tunnel's outer one if
    /// encapsulated, else the packet's own.
    pub fn outermost(&self) -> &IpPacket {
        self.tunnel.as_ref().map_or(&self.packet, |t| &t.outer)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    NotIp,
    Truncated(&'static str),
    /// Tagged as WireGuard's, but not a data message over UDP.
    NotWireguard,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotIp => write!(f, "not an IPv4 or IPv6 packet"),
            Self::Truncated(what) => write!(f, "snapshot ends inside the {what} header"),
            Self::NotWireguard => write!(f, "not a WireGuard data message over UDP"),
        }
    }
}

/// Decodes a snapshot that starts at an Ethernet header (`has_l2`) or
/// directly at the IP header (L3 devices such as tunl0), as the packet it
/// is: whatever its payload looks like, it is not read as a tunnel.
pub fn decode(snapshot: &[u8], has_l2: bool) -> Result<Decoded, DecodeError> {
    let (packet, l4) = ip(l3_of(snapshot, has_l2)?)?;
    Ok(decoded(packet, l4, None))
}

/// Decodes a snapshot the kernel matched by its inner header: one it
/// treats as encapsulated (on the underlay, between nodes, on a tunnel
/// the node has). Only then is the payload a packet of its own.
pub fn decode_tunnel(snapshot: &[u8], has_l2: bool) -> Result<Decoded, DecodeError> {
    let (outer, l4) = ip(l3_of(snapshot, has_l2)?)?;
    match tunnel_payload(&outer, l4)? {
        Some(TunnelPayload { kind, vni, inner }) => {
            let (packet, l4) = ip(inner)?;
            Ok(decoded(
                packet,
                l4,
                Some(Tunnel {
                    kind,
                    vni,
                    outer,
                    wireguard: None,
                }),
            ))
        }
        None => Ok(decoded(outer, l4, None)),
    }
}

/// Decodes the UDP packet WireGuard sent with `inside` encrypted in it
/// (the kernel knew it by the tag in its hash): `inside` in a WireGuard
/// tunnel whose outer header and data message header are the snapshot's.
/// Anything but a data message to UDP is refused: the tag named it, the
/// bytes must agree.
pub fn decode_encrypted(
    snapshot: &[u8],
    has_l2: bool,
    inside: &Decoded,
) -> Result<Decoded, DecodeError> {
    let (outer, data) = wireguard_message(snapshot, has_l2)?;
    Ok(in_wireguard(inside, outer, data))
}

/// The clear part of a WireGuard data message over UDP: its outer IP
/// header and its data message header (known by the flow hash's tag, as
/// read here; the caller says otherwise).
pub fn wireguard_message(
    snapshot: &[u8],
    has_l2: bool,
) -> Result<(IpPacket, WireguardData), DecodeError> {
    use podtrace_common::wireguard::{COUNTER_AT, DATA_HEADER_LEN, DATA_MESSAGE, RECEIVER_AT};
    let (outer, l4) = ip(l3_of(snapshot, has_l2)?)?;
    let Transport::Udp { .. } = outer.transport else {
        return Err(DecodeError::NotWireguard);
    };
    let message = l4
        .get(UdpHeader::LEN..UdpHeader::LEN + DATA_HEADER_LEN)
        .ok_or(DecodeError::Truncated("WireGuard"))?;
    if message[0] != DATA_MESSAGE {
        return Err(DecodeError::NotWireguard);
    }
    let receiver = u32::from_le_bytes(message[RECEIVER_AT..RECEIVER_AT + 4].try_into().unwrap());
    let counter = u64::from_le_bytes(message[COUNTER_AT..COUNTER_AT + 8].try_into().unwrap());
    let data = WireguardData {
        receiver,
        counter,
        known_by: KnownBy::FlowHashTag,
    };
    Ok((outer, data))
}

/// `inside`, carried by WireGuard's UDP packet `outer` with data message
/// header `data`.
pub fn in_wireguard(inside: &Decoded, outer: IpPacket, data: WireguardData) -> Decoded {
    Decoded {
        packet: inside.packet,
        tunnel: Some(Tunnel {
            kind: TunnelKind::Wireguard,
            vni: None,
            outer,
            wireguard: Some(data),
        }),
        quoted: inside.quoted,
    }
}

/// `packet` (its transport header and payload `l4`) in `tunnel`.
fn decoded(packet: IpPacket, l4: &[u8], tunnel: Option<Tunnel>) -> Decoded {
    let quoted = match packet.transport {
        Transport::Icmp { .. } if !packet.fragment => quote::quoted(l4),
        Transport::Icmpv6 { .. } if !packet.fragment => quote::quoted6(l4),
        _ => None,
    };
    Decoded {
        packet,
        tunnel,
        quoted,
    }
}

fn l3_of(snapshot: &[u8], has_l2: bool) -> Result<&[u8], DecodeError> {
    if has_l2 {
        ethernet_payload(snapshot)
    } else {
        Ok(snapshot)
    }
}

fn ethernet_payload(frame: &[u8]) -> Result<&[u8], DecodeError> {
    let (eth, mut rest) =
        Ethernet2Header::from_slice(frame).map_err(|_| DecodeError::Truncated("Ethernet"))?;
    let mut ether_type = eth.ether_type;
    if ether_type == EtherType::VLAN_TAGGED_FRAME {
        let tag = rest.get(..4).ok_or(DecodeError::Truncated("802.1Q"))?;
        ether_type = EtherType(u16::from_be_bytes([tag[2], tag[3]]));
        rest = &rest[4..];
    }
    if ether_type == EtherType::IPV4 || ether_type == EtherType::IPV6 {
        Ok(rest)
    } else {
        Err(DecodeError::NotIp)
    }
}

/// Parses an IPv4 or IPv6 header (as its version says) and its transport
/// header; returns the packet and the bytes after the IP headers.
fn ip(bytes: &[u8]) -> Result<(IpPacket, &[u8]), DecodeError> {
    match bytes.first().map(|b| b >> 4) {
        None => Err(DecodeError::Truncated("IP")),
        Some(4) => ipv4(bytes),
        Some(6) => ipv6(bytes),
        Some(_) => Err(DecodeError::NotIp),
    }
}

/// Parses an IPv6 header, walks its extension headers (the kernel
/// programs' own walk), and parses the transport header past them.
fn ipv6(bytes: &[u8]) -> Result<(IpPacket, &[u8]), DecodeError> {
    let (ip, _) =
        etherparse::Ipv6Header::from_slice(bytes).map_err(|_| DecodeError::Truncated("IPv6"))?;
    let walked = transport6(bytes, 0).ok_or(DecodeError::Truncated("IPv6 extension"))?;
    let l4 = bytes
        .get(walked.at..)
        .ok_or(DecodeError::Truncated("IPv6 extension"))?;
    let transport = match walked.fragment {
        Some(f) if f.offset > 0 => Transport::Fragment {
            number: walked.protocol,
            offset: f.offset * 8,
        },
        _ => transport(IpNumber(walked.protocol), l4)?,
    };
    Ok((
        IpPacket {
            src: IpAddr::V6(Ipv6Addr::from(ip.source)),
            dst: IpAddr::V6(Ipv6Addr::from(ip.destination)),
            ttl: ip.hop_limit,
            ip_id: walked.fragment.map_or(0, |f| f.id as u16),
            total_len: ip.payload_length.saturating_add(40),
            dont_fragment: true,
            fragment: walked.fragment.is_some(),
            transport,
        },
        l4,
    ))
}

/// Parses an IPv4 header and its transport header.
fn ipv4(bytes: &[u8]) -> Result<(IpPacket, &[u8]), DecodeError> {
    let (ip, l4) = Ipv4Header::from_slice(bytes).map_err(|_| DecodeError::Truncated("IPv4"))?;
    let offset = ip.fragment_offset.value() * 8;
    // Only the first fragment has a transport header; reading one from a
    // later fragment would invent ports and ICMP types from payload bytes.
    let transport = if offset > 0 {
        Transport::Fragment {
            number: ip.protocol.0,
            offset,
        }
    } else {
        transport(ip.protocol, l4)?
    };
    Ok((
        IpPacket {
            src: IpAddr::V4(Ipv4Addr::from(ip.source)),
            dst: IpAddr::V4(Ipv4Addr::from(ip.destination)),
            ttl: ip.time_to_live,
            ip_id: ip.identification,
            total_len: ip.total_len,
            dont_fragment: ip.dont_fragment,
            fragment: ip.more_fragments || offset > 0,
            transport,
        },
        l4,
    ))
}

fn transport(protocol: IpNumber, l4: &[u8]) -> Result<Transport, DecodeError> {
    Ok(match protocol {
        IpNumber::ICMP => {
            let h = l4.get(..8).ok_or(DecodeError::Truncated("ICMP"))?;
            Transport::Icmp {
                icmp_type: h[0],
                code: h[1],
                id: u16::from_be_bytes([h[4], h[5]]),
                seq: u16::from_be_bytes([h[6], h[7]]),
            }
        }
        IpNumber::IPV6_ICMP => {
            let h = l4.get(..8).ok_or(DecodeError::Truncated("ICMPv6"))?;
            Transport::Icmpv6 {
                icmp_type: h[0],
                code: h[1],
                id: u16::from_be_bytes([h[4], h[5]]),
                seq: u16::from_be_bytes([h[6], h[7]]),
            }
        }
        IpNumber::TCP => {
            // Only the fixed part is needed; options may be cut off.
            let fixed = l4.get(..20).ok_or(DecodeError::Truncated("TCP"))?;
            let mut header = [0u8; 20];
            header.copy_from_slice(fixed);
            header[12] = 5 << 4 | (header[12] & 0x0f);
            let (tcp, _) =
                TcpHeader::from_slice(&header).map_err(|_| DecodeError::Truncated("TCP"))?;
            Transport::Tcp {
                sport: tcp.source_port,
                dport: tcp.destination_port,
                seq: tcp.sequence_number,
                flags: fixed[13],
            }
        }
        IpNumber::UDP => {
            let (udp, _) = UdpHeader::from_slice(l4).map_err(|_| DecodeError::Truncated("UDP"))?;
            Transport::Udp {
                sport: udp.source_port,
                dport: udp.destination_port,
            }
        }
        other => Transport::Other { number: other.0 },
    })
}

/// What a tunnel header says, and the inner IP bytes after it.
struct TunnelPayload<'a> {
    kind: TunnelKind,
    vni: Option<u32>,
    inner: &'a [u8],
}

/// If `outer` is a tunnel packet, its kind, VNI and the inner IP bytes.
fn tunnel_payload<'a>(
    outer: &IpPacket,
    l4: &'a [u8],
) -> Result<Option<TunnelPayload<'a>>, DecodeError> {
    if let Transport::Other { number } = outer.transport {
        if IpNumber(number) == IpNumber::IPV4 {
            return Ok(Some(TunnelPayload {
                kind: TunnelKind::Ipip,
                vni: None,
                inner: l4,
            }));
        }
    }
    let Transport::Udp { dport, .. } = outer.transport else {
        return Ok(None);
    };
    let payload = l4.get(8..).ok_or(DecodeError::Truncated("UDP"))?;
    // The kernel matched it as one of this node's tunnels: Geneve on
    // Geneve's port, else VXLAN (on a well-known port, or the node's own
    // VXLAN devices' port: flannel's `Backend.Port`, Calico's `vxlanPort`).
    match dport {
        GENEVE_PORT => {
            let h = payload.get(..8).ok_or(DecodeError::Truncated("Geneve"))?;
            let options = usize::from(h[0] & 0x3f) * 4;
            let protocol = u16::from_be_bytes([h[2], h[3]]);
            let vni = u32::from_be_bytes([0, h[4], h[5], h[6]]);
            let inner = payload
                .get(8 + options..)
                .ok_or(DecodeError::Truncated("Geneve"))?;
            let inner = if EtherType(protocol) == EtherType::IPV4
                || EtherType(protocol) == EtherType::IPV6
            {
                inner
            } else {
                ethernet_payload(inner)?
            };
            Ok(Some(TunnelPayload {
                kind: TunnelKind::Geneve,
                vni: Some(vni),
                inner,
            }))
        }
        _ => {
            let h = payload.get(..8).ok_or(DecodeError::Truncated("VXLAN"))?;
            let vni = u32::from_be_bytes([0, h[4], h[5], h[6]]);
            let inner = ethernet_payload(&payload[8..])?;
            Ok(Some(TunnelPayload {
                kind: TunnelKind::Vxlan,
                vni: Some(vni),
                inner,
            }))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use etherparse::PacketBuilder;
    use podtrace_common::VXLAN_PORT_FLANNEL;

    pub(crate) fn icmp_echo(src: [u8; 4], dst: [u8; 4], ttl: u8, seq: u16) -> Vec<u8> {
        let builder = PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv4(src, dst, ttl)
            .icmpv4_echo_request(7, seq);
        let payload = [0u8; 56];
        let mut out = Vec::new();
        builder.write(&mut out, &payload).unwrap();
        out
    }

    /// A TCP SYN (IP ID 4242), as a client sends it.
    pub(crate) fn tcp_syn(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut out = Vec::new();
        PacketBuilder::ethernet2([2; 6], [4; 6])
            .ip(etherparse::IpHeaders::Ipv4(
                Ipv4Header {
                    identification: 4242,
                    ..Ipv4Header::new(0, 64, IpNumber::TCP, src, dst).unwrap()
                },
                Default::default(),
            ))
            .tcp(sport, dport, 1000, 64240)
            .syn()
            .write(&mut out, &[])
            .unwrap();
        out
    }

    /// A WireGuard data message (receiver 0x0a0b0c0d, counter 5) from
    /// 192.0.2.11:51820 to 192.0.2.12:51820, with `ciphertext` bytes.
    pub(crate) fn wireguard_data(ciphertext: usize) -> Vec<u8> {
        let mut payload = vec![4, 0, 0, 0];
        payload.extend_from_slice(&0x0a0b_0c0du32.to_le_bytes());
        payload.extend_from_slice(&5u64.to_le_bytes());
        payload.resize(payload.len() + ciphertext, 0xee);
        let builder = PacketBuilder::ethernet2([6; 6], [8; 6])
            .ipv4([192, 0, 2, 11], [192, 0, 2, 12], 64)
            .udp(51820, 51820);
        let mut out = Vec::new();
        builder.write(&mut out, &payload).unwrap();
        out
    }

    #[test]
    fn an_encrypted_leg_is_the_tagged_packet_inside_wireguards_header() {
        let inside = decode(&icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 3), true).unwrap();
        let leg = decode_encrypted(&wireguard_data(100), true, &inside).unwrap();
        assert_eq!(leg.packet, inside.packet);
        let tunnel = leg.tunnel.unwrap();
        assert_eq!(tunnel.kind, TunnelKind::Wireguard);
        assert_eq!(tunnel.outer.src, IpAddr::from([192, 0, 2, 11]));
        assert_eq!(
            tunnel.wireguard,
            Some(WireguardData {
                receiver: 0x0a0b_0c0d,
                counter: 5,
                known_by: KnownBy::FlowHashTag,
            })
        );
        // The tag named it WireGuard's; bytes that are not a data
        // message are refused, not told as one.
        let mut handshake = wireguard_data(100);
        handshake[14 + 20 + 8] = 1;
        assert_eq!(
            decode_encrypted(&handshake, true, &inside),
            Err(DecodeError::NotWireguard)
        );
        assert_eq!(
            decode_encrypted(
                &icmp_echo([192, 0, 2, 11], [192, 0, 2, 12], 64, 1),
                true,
                &inside
            ),
            Err(DecodeError::NotWireguard)
        );
    }

    pub(crate) fn vxlan(inner_frame: &[u8], vni: u32) -> Vec<u8> {
        let mut payload = vec![0x08, 0, 0, 0];
        payload.extend_from_slice(&vni.to_be_bytes()[1..]);
        payload.push(0);
        payload.extend_from_slice(inner_frame);
        let builder = PacketBuilder::ethernet2([6; 6], [8; 6])
            .ipv4([192, 0, 2, 11], [192, 0, 2, 12], 64)
            .udp(41000, VXLAN_PORT_FLANNEL);
        let mut out = Vec::new();
        builder.write(&mut out, &payload).unwrap();
        out
    }

    #[test]
    fn plain_icmp_echo() {
        let frame = icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 3);
        let d = decode(&frame[..frame.len().min(128)], true).unwrap();
        assert_eq!(d.packet.src, Ipv4Addr::new(10, 244, 1, 2));
        assert_eq!(d.packet.ttl, 64);
        assert_eq!(
            d.packet.transport,
            Transport::Icmp {
                icmp_type: 8,
                code: 0,
                id: 7,
                seq: 3
            }
        );
        assert!(d.tunnel.is_none());
    }

    #[test]
    fn vxlan_inner_and_outer_from_a_truncated_snapshot() {
        let inner = icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 9);
        let frame = vxlan(&inner, 1);
        // As a plain packet, it is UDP to 8472 and nothing more.
        let plain = decode(&frame[..128], true).unwrap();
        assert!(plain.tunnel.is_none());
        assert_eq!(plain.packet.dst, Ipv4Addr::new(192, 0, 2, 12));
        let d = decode_tunnel(&frame[..128], true).unwrap();
        let tunnel = d.tunnel.unwrap();
        assert_eq!(tunnel.kind, TunnelKind::Vxlan);
        assert_eq!(tunnel.vni, Some(1));
        assert_eq!(tunnel.outer.dst, Ipv4Addr::new(192, 0, 2, 12));
        assert_eq!(d.packet.dst, Ipv4Addr::new(10, 244, 2, 2));
        assert_eq!(d.packet.ttl, 63);
        assert_eq!(tunnel.outer.total_len - d.packet.total_len, 50);
    }

    #[test]
    fn ipip_on_an_l3_device() {
        let inner = icmp_echo([10, 245, 1, 2], [10, 245, 2, 2], 63, 1);
        let mut out = Vec::new();
        let outer = Ipv4Header::new(
            (20 + inner.len() - 14) as u16,
            64,
            IpNumber::IPV4,
            [192, 0, 2, 11],
            [192, 0, 2, 12],
        )
        .unwrap();
        outer.write(&mut out).unwrap();
        out.extend_from_slice(&inner[14..]);
        let d = decode_tunnel(&out, false).unwrap();
        assert_eq!(d.tunnel.unwrap().kind, TunnelKind::Ipip);
        assert_eq!(d.packet.src, Ipv4Addr::new(10, 245, 1, 2));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert_eq!(
            decode(&[0u8; 10], true),
            Err(DecodeError::Truncated("Ethernet"))
        );
        let mut arp = icmp_echo([1, 1, 1, 1], [2, 2, 2, 2], 1, 1);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(decode(&arp, true), Err(DecodeError::NotIp));
        let frame = icmp_echo([1, 1, 1, 1], [2, 2, 2, 2], 1, 1);
        assert!(matches!(
            decode(&frame[..30], true),
            Err(DecodeError::Truncated(_))
        ));
    }
}
