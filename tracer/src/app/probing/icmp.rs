//! ICMP echo for `--probe icmp`, on a raw socket: the request, and which
//! received packet is about it (its reply, or an ICMP error quoting it).

use std::net::Ipv4Addr;

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
/// echo (`id`, `seq`), or `None` when it is about something else.
pub(super) fn about_our_echo(packet: &[u8], echo: (u16, u16)) -> Option<Reply> {
    let (from, icmp) = ipv4_payload(packet)?;
    about_icmp(from, icmp, echo)
}

/// An ICMP message from `from` as an answer to echo (`id`, `seq`).
pub(super) fn about_icmp(from: Ipv4Addr, icmp: &[u8], (id, seq): (u16, u16)) -> Option<Reply> {
    let ours =
        |echo: &[u8]| echo.get(4..8) == Some(&[id.to_be_bytes(), seq.to_be_bytes()].concat()[..]);
    match *icmp.first()? {
        ECHO_REPLY if ours(icmp) => Some(Reply::Echo),
        kind @ (DESTINATION_UNREACHABLE | TIME_EXCEEDED) => {
            let (_, quoted) = ipv4_payload(icmp.get(8..)?)?;
            if quoted.first() != Some(&ECHO_REQUEST) || !ours(quoted) {
                return None;
            }
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

    fn ipv4(from: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let mut packet = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0];
        packet.extend_from_slice(&from);
        packet.extend_from_slice(&[10, 0, 0, 1]);
        packet.extend_from_slice(payload);
        packet
    }

    #[test]
    fn the_request_checksums_to_zero() {
        assert_eq!(checksum(&echo_request(0x1234, 7)), 0);
    }

    #[test]
    fn its_reply_and_errors_quoting_it_are_recognised_and_others_are_not() {
        let mut reply = echo_request(0x1234, 7);
        reply[0] = ECHO_REPLY;
        assert_eq!(
            about_our_echo(&ipv4([10, 0, 0, 2], &reply), (0x1234, 7)),
            Some(Reply::Echo)
        );
        assert_eq!(
            about_our_echo(&ipv4([10, 0, 0, 2], &reply), (0x1234, 8)),
            None
        );
        let request = ipv4([10, 0, 0, 1], &echo_request(0x1234, 7));
        let mut unreachable = vec![DESTINATION_UNREACHABLE, 1, 0, 0, 0, 0, 0, 0];
        unreachable.extend_from_slice(&request);
        assert_eq!(
            about_our_echo(&ipv4([10, 0, 0, 254], &unreachable), (0x1234, 7)),
            Some(Reply::Error("ICMP host unreachable from 10.0.0.254".into()))
        );
        // Our own request, read back on the raw socket, is no answer.
        assert_eq!(about_our_echo(&request, (0x1234, 7)), None);
    }
}
