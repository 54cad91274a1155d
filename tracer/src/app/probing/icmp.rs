//! ICMP echo for `--probe icmp`, on a raw socket: the request, and which
//! received packet is about it (its reply, or an ICMP error quoting it).

use std::net::Ipv4Addr;

use super::about::{is_about, Sent};
use crate::decode::quote::quoted;

const ECHO_REPLY: u8 = 0;
const DESTINATION_UNREACHABLE: u8 = 3;
const ECHO_REQUEST: u8 = 8;
const TIME_EXCEEDED: u8 = 11;
/// What the request carries after its header, so that it is recognisable
/// in a capture.
const PAYLOAD: &[u8] = b"podtrace probe";

/// What a received packet says about our echo request.
#[derive(Debug, PartialEq)]
pub(super) enum Reply {
    Echo,
    /// An ICMP error quoting it, in words (`ICMP host unreachable from
    /// 10.244.1.1`).
    Error(String),
}

pub(super) fn echo_request(id: u16, seq: u16) -> Vec<u8> {
    let mut packet = vec![ECHO_REQUEST, 0, 0, 0];
    packet.extend_from_slice(&id.to_be_bytes());
    packet.extend_from_slice(&seq.to_be_bytes());
    packet.extend_from_slice(PAYLOAD);
    let sum = checksum(&packet);
    packet[2..4].copy_from_slice(&sum.to_be_bytes());
    packet
}

/// `packet` (an IPv4 packet, as a raw socket reads it) as an answer to
/// the echo request `sent`, or `None` when it is about something else.
pub(super) fn about_our_echo(packet: &[u8], sent: &Sent) -> Option<Reply> {
    let (from, icmp) = ipv4_payload(packet)?;
    about_icmp(from, icmp, sent)
}

/// An ICMP message from `from` as an answer to the echo request `sent`:
/// its reply, or an error that quotes it.
pub(super) fn about_icmp(from: Ipv4Addr, icmp: &[u8], sent: &Sent) -> Option<Reply> {
    let echo = [sent.flow.to_be_bytes(), sent.seq.to_be_bytes()].concat();
    match *icmp.first()? {
        ECHO_REPLY if icmp.get(4..8) == Some(&echo[..]) => Some(Reply::Echo),
        kind @ (DESTINATION_UNREACHABLE | TIME_EXCEEDED)
            if quoted(icmp).is_some_and(|q| is_about(&q, sent)) =>
        {
            Some(Reply::Error(format!(
                "ICMP {} from {from}",
                error_words(kind, icmp[1])
            )))
        }
        _ => None,
    }
}

/// The sender and the payload of an IPv4 packet.
fn ipv4_payload(packet: &[u8]) -> Option<(Ipv4Addr, &[u8])> {
    let header_len = usize::from(packet.first()? & 0x0f) * 4;
    let from: [u8; 4] = packet.get(12..16)?.try_into().ok()?;
    Some((Ipv4Addr::from(from), packet.get(header_len..)?))
}

fn error_words(kind: u8, code: u8) -> String {
    match (kind, code) {
        (TIME_EXCEEDED, _) => "time exceeded (TTL ran out: a routing loop?)".into(),
        (_, 0) => "network unreachable".into(),
        (_, 1) => "host unreachable".into(),
        (_, 3) => "port unreachable".into(),
        (_, 4) => "fragmentation needed".into(),
        (_, 9 | 10 | 13) => {
            "destination unreachable: administratively prohibited (a firewall's REJECT)".into()
        }
        (_, code) => format!("destination unreachable (code {code})"),
    }
}

/// The Internet checksum (RFC 1071).
fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::ProbeKind;

    /// An ICMP packet from `from` to `to`.
    fn ipv4(from: [u8; 4], to: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let mut packet = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0];
        packet.extend_from_slice(&from);
        packet.extend_from_slice(&to);
        packet.extend_from_slice(payload);
        packet
    }

    /// Echo request (0x1234, `seq`) from 10.0.0.1 to 10.0.0.2.
    fn echo(seq: u16) -> Sent {
        Sent {
            src: [10, 0, 0, 1].into(),
            dst: [10, 0, 0, 2].into(),
            kind: ProbeKind::Icmp,
            flow: 0x1234,
            seq,
        }
    }

    #[test]
    fn the_request_checksums_to_zero() {
        assert_eq!(checksum(&echo_request(0x1234, 7)), 0);
    }

    #[test]
    fn its_reply_and_errors_quoting_it_are_recognised_and_others_are_not() {
        let mut reply = echo_request(0x1234, 7);
        reply[0] = ECHO_REPLY;
        let reply = ipv4([10, 0, 0, 2], [10, 0, 0, 1], &reply);
        assert_eq!(about_our_echo(&reply, &echo(7)), Some(Reply::Echo));
        assert_eq!(about_our_echo(&reply, &echo(8)), None);
        let request = ipv4([10, 0, 0, 1], [10, 0, 0, 2], &echo_request(0x1234, 7));
        let unreachable = |quoting: &[u8]| {
            let mut icmp = vec![DESTINATION_UNREACHABLE, 1, 0, 0, 0, 0, 0, 0];
            icmp.extend_from_slice(quoting);
            ipv4([10, 0, 0, 254], [10, 0, 0, 1], &icmp)
        };
        assert_eq!(
            about_our_echo(&unreachable(&request), &echo(7)),
            Some(Reply::Error("ICMP host unreachable from 10.0.0.254".into()))
        );
        // About the same echo to another address: another ping's.
        let elsewhere = ipv4([10, 0, 0, 1], [10, 0, 0, 3], &echo_request(0x1234, 7));
        assert_eq!(about_our_echo(&unreachable(&elsewhere), &echo(7)), None);
        // Our own request, read back on the raw socket, is no answer.
        assert_eq!(about_our_echo(&request, &echo(7)), None);
    }
}
