//! The header an ICMP or ICMPv6 error quotes (destination unreachable,
//! time exceeded, parameter problem, packet too big): which packet the
//! error is about.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use podtrace_common::packet6::{pair6_at, transport6};

use serde::{Deserialize, Serialize};

use super::transport::Transport;

/// The ICMP types whose message quotes the packet it is about.
const ERRORS: [u8; 3] = [3, 11, 12];
/// ICMPv6's: destination unreachable, packet too big, time exceeded,
/// parameter problem.
const ERRORS6: [u8; 4] = [1, 2, 3, 4];
/// What an error quotes past the quoted IPv4 header, at least (RFC 792):
/// the ports, or an echo's identifier and sequence.
const QUOTED_L4: usize = 8;

/// The start of the packet an ICMP error is about, as the error quotes it:
/// as its maker saw the packet, and as conntrack translates it back on the
/// error's way to the sender (what the sender sent, behind a Service).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quoted {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The quoted IPv4 header's ID (IPv6 has none outside a fragment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_id: Option<u16>,
    pub transport: QuotedTransport,
}

/// What tells the quoted packet's flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "proto", rename_all = "lowercase")]
pub enum QuotedTransport {
    Tcp {
        sport: u16,
        dport: u16,
    },
    Udp {
        sport: u16,
        dport: u16,
    },
    Icmp {
        icmp_type: u8,
        id: u16,
        seq: u16,
    },
    /// Another protocol, or a fragment past the first (no ports).
    Other {
        number: u8,
    },
}

/// What the ICMP message `icmp` (from its type byte on) quotes: nothing
/// unless it is an error that quotes an IPv4 header and the 8 bytes after
/// it.
pub fn quoted(icmp: &[u8]) -> Option<Quoted> {
    if !ERRORS.contains(icmp.first()?) {
        return None;
    }
    let ip = icmp.get(8..)?;
    let header = ip.get(..20)?;
    let header_len = usize::from(header[0] & 0x0f) * 4;
    if header[0] >> 4 != 4 || header_len < 20 {
        return None;
    }
    let l4 = ip.get(header_len..header_len + QUOTED_L4)?;
    let u16_at = |at: usize| u16::from_be_bytes([l4[at], l4[at + 1]]);
    let fragment_offset = u16::from_be_bytes([header[6], header[7]]) & 0x1fff;
    let transport = match (header[9], fragment_offset) {
        (number, 1..) => QuotedTransport::Other { number },
        (6, 0) => QuotedTransport::Tcp {
            sport: u16_at(0),
            dport: u16_at(2),
        },
        (17, 0) => QuotedTransport::Udp {
            sport: u16_at(0),
            dport: u16_at(2),
        },
        (1, 0) => QuotedTransport::Icmp {
            icmp_type: l4[0],
            id: u16_at(4),
            seq: u16_at(6),
        },
        (number, _) => QuotedTransport::Other { number },
    };
    let address = |at: usize| {
        IpAddr::V4(Ipv4Addr::new(
            header[at],
            header[at + 1],
            header[at + 2],
            header[at + 3],
        ))
    };
    Some(Quoted {
        src: address(12),
        dst: address(16),
        ip_id: Some(u16::from_be_bytes([header[4], header[5]])),
        transport,
    })
}

/// What the ICMPv6 message `icmp` (from its type byte on) quotes: nothing
/// unless it is an error that quotes an IPv6 header, its extension
/// headers and 8 bytes after them.
pub fn quoted6(icmp: &[u8]) -> Option<Quoted> {
    if !ERRORS6.contains(icmp.first()?) {
        return None;
    }
    let ip = icmp.get(8..)?;
    let pair = pair6_at(ip, 0)?;
    let t = transport6(ip, 0)?;
    let l4 = ip.get(t.at..t.at + QUOTED_L4)?;
    let u16_at = |at: usize| u16::from_be_bytes([l4[at], l4[at + 1]]);
    let transport = match t.protocol {
        number if !t.is_present() => QuotedTransport::Other { number },
        6 => QuotedTransport::Tcp {
            sport: u16_at(0),
            dport: u16_at(2),
        },
        17 => QuotedTransport::Udp {
            sport: u16_at(0),
            dport: u16_at(2),
        },
        58 => QuotedTransport::Icmp {
            icmp_type: l4[0],
            id: u16_at(4),
            seq: u16_at(6),
        },
        number => QuotedTransport::Other { number },
    };
    Some(Quoted {
        src: IpAddr::V6(Ipv6Addr::from(pair.src)),
        dst: IpAddr::V6(Ipv6Addr::from(pair.dst)),
        ip_id: None,
        transport,
    })
}

impl QuotedTransport {
    /// Whether a packet of `transport` is of the quoted flow: its ports,
    /// or its echo's type, identifier and sequence.
    pub fn is_of(&self, transport: &Transport) -> bool {
        match (*self, *transport) {
            (
                Self::Tcp { sport, dport },
                Transport::Tcp {
                    sport: s, dport: d, ..
                },
            )
            | (Self::Udp { sport, dport }, Transport::Udp { sport: s, dport: d }) => {
                (sport, dport) == (s, d)
            }
            (
                Self::Icmp { icmp_type, id, seq },
                Transport::Icmp {
                    icmp_type: t,
                    id: i,
                    seq: q,
                    ..
                }
                | Transport::Icmpv6 {
                    icmp_type: t,
                    id: i,
                    seq: q,
                    ..
                },
            ) => (icmp_type, id, seq) == (t, i, q),
            (Self::Other { number }, t) => t.protocol() == number,
            _ => false,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use etherparse::PacketBuilder;

    use super::*;

    /// An IPv4 packet from `src` to `dst` carrying a UDP datagram.
    pub(crate) fn udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut out = Vec::new();
        PacketBuilder::ipv4(src, dst, 64)
            .udp(sport, dport)
            .write(&mut out, b"some payload")
            .unwrap();
        out
    }

    /// An Ethernet frame of an ICMP message (from its type byte on) from
    /// `src` to `dst`.
    pub(crate) fn icmp_frame(src: [u8; 4], dst: [u8; 4], icmp: &[u8]) -> Vec<u8> {
        let mut frame = vec![2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 0x08, 0x00];
        etherparse::Ipv4Header::new(icmp.len() as u16, 64, etherparse::IpNumber::ICMP, src, dst)
            .unwrap()
            .write(&mut frame)
            .unwrap();
        frame.extend_from_slice(icmp);
        frame
    }

    /// An ICMP error of `kind` and `code` (from its type byte on) quoting
    /// `packet` whole, as Linux quotes a short one.
    pub(crate) fn error(kind: u8, code: u8, packet: &[u8]) -> Vec<u8> {
        let mut icmp = vec![kind, code, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(packet);
        icmp
    }

    #[test]
    fn an_error_quotes_its_packets_addresses_and_ports() {
        let datagram = udp([10, 0, 1, 2], [10, 0, 2, 2], 40000, 5354);
        let port_unreachable = error(3, 3, &datagram);
        let udp = QuotedTransport::Udp {
            sport: 40000,
            dport: 5354,
        };
        let expected = Quoted {
            src: Ipv4Addr::new(10, 0, 1, 2).into(),
            dst: Ipv4Addr::new(10, 0, 2, 2).into(),
            ip_id: Some(u16::from_be_bytes([datagram[4], datagram[5]])),
            transport: udp,
        };
        assert_eq!(quoted(&port_unreachable), Some(expected));
        // The IPv4 header and 8 bytes are all an error must quote.
        assert_eq!(quoted(&port_unreachable[..8 + 28]), Some(expected));
        assert_eq!(quoted(&port_unreachable[..8 + 27]), None);
        // Decoded from the frame a hook sees.
        let frame = icmp_frame([10, 0, 2, 2], [10, 0, 1, 2], &port_unreachable);
        assert_eq!(
            super::super::decode(&frame, true).unwrap().quoted,
            Some(expected)
        );
    }

    #[test]
    fn an_echo_reply_or_a_later_fragment_quotes_no_flow() {
        let mut reply = vec![0, 0, 0, 0, 0, 7, 0, 1];
        reply.extend_from_slice(&udp([10, 0, 1, 2], [10, 0, 2, 2], 1, 2));
        assert_eq!(quoted(&reply), None);
        let mut fragment = udp([10, 0, 1, 2], [10, 0, 2, 2], 40000, 5354);
        fragment[6..8].copy_from_slice(&185u16.to_be_bytes());
        assert_eq!(
            quoted(&error(11, 1, &fragment)).map(|q| q.transport),
            Some(QuotedTransport::Other { number: 17 })
        );
    }
}
