//! Whether an ICMP error is a probe's answer: only if the header it quotes
//! is that probe's own packet. An error about anything else (the pair's
//! other traffic, another probe) is not.

use std::net::Ipv4Addr;

use crate::{
    decode::quote::{Quoted, QuotedTransport},
    model::ProbeKind,
};

/// An ICMP echo request's type.
const ECHO_REQUEST: u8 = 8;

/// One probe's packet as it left the source pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sent {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub kind: ProbeKind,
    /// Its source port (TCP, UDP) or echo identifier (ICMP).
    pub flow: u16,
    /// Its echo sequence number (ICMP): which probe of the run, from 1.
    pub seq: u16,
}

/// Whether an ICMP error quoting `quoted` is about the probe packet
/// `sent`: the same addresses and protocol, and the same ports (TCP, UDP)
/// or echo identifier and sequence number (ICMP).
pub(super) fn is_about(quoted: &Quoted, sent: &Sent) -> bool {
    let same_flow = match (sent.kind, quoted.transport) {
        (ProbeKind::Tcp(port), QuotedTransport::Tcp { sport, dport })
        | (ProbeKind::Udp(port), QuotedTransport::Udp { sport, dport }) => {
            sport == sent.flow && dport == port
        }
        (
            ProbeKind::Icmp,
            QuotedTransport::Icmp {
                icmp_type: ECHO_REQUEST,
                id,
                seq,
            },
        ) => id == sent.flow && seq == sent.seq,
        _ => false,
    };
    same_flow && quoted.src == sent.src && quoted.dst == sent.dst
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::quote::{
        quoted,
        tests::{error, udp},
    };

    const WEB: [u8; 4] = [10, 0, 1, 2];
    const DB: [u8; 4] = [10, 0, 2, 2];

    fn sent(kind: ProbeKind, flow: u16, seq: u16) -> Sent {
        Sent {
            src: WEB.into(),
            dst: DB.into(),
            kind,
            flow,
            seq,
        }
    }

    /// Whether a port unreachable quoting `packet` is `probe`'s answer.
    fn answers(packet: &[u8], probe: &Sent) -> bool {
        is_about(&quoted(&error(3, 3, packet)).unwrap(), probe)
    }

    #[test]
    fn only_an_error_quoting_the_probes_own_datagram_is_its_answer() {
        let probe = sent(ProbeKind::Udp(5354), 40000, 1);
        assert!(answers(&udp(WEB, DB, 40000, 5354), &probe));
        // The pair's other UDP traffic, another probe's port, another
        // source port, the pair the other way round, another pair.
        for other in [
            udp(WEB, DB, 40001, 5354),
            udp(WEB, DB, 40000, 5355),
            udp(DB, WEB, 5354, 40000),
            udp(WEB, [10, 0, 3, 3], 40000, 5354),
            udp([10, 0, 1, 3], DB, 40000, 5354),
        ] {
            assert!(
                !answers(&other, &probe),
                "{:?}",
                quoted(&error(3, 3, &other))
            );
        }
        // A TCP probe on the same ports is not answered by a UDP error.
        assert!(!answers(
            &udp(WEB, DB, 40000, 5354),
            &sent(ProbeKind::Tcp(5354), 40000, 1)
        ));
    }

    #[test]
    fn a_tcp_probes_error_quotes_its_syn() {
        let syn = &crate::decode::tests::tcp_syn(WEB, DB, 41000, 8080)[14..];
        let probe = sent(ProbeKind::Tcp(8080), 41000, 1);
        let unreachable = quoted(&error(3, 1, syn)).unwrap();
        assert!(is_about(&unreachable, &probe));
        assert!(!is_about(
            &unreachable,
            &sent(ProbeKind::Tcp(8081), 41000, 1)
        ));
        assert!(!is_about(
            &unreachable,
            &sent(ProbeKind::Tcp(8080), 41001, 1)
        ));
    }

    #[test]
    fn an_echos_error_is_its_answer_by_identifier_and_sequence() {
        // etherparse's echo requests carry identifier 7.
        let request = &crate::decode::tests::icmp_echo(WEB, DB, 64, 2)[14..];
        let unreachable = quoted(&error(3, 1, request)).unwrap();
        assert!(is_about(&unreachable, &sent(ProbeKind::Icmp, 7, 2)));
        // The probe before it, on the same identifier (a raw socket's).
        assert!(!is_about(&unreachable, &sent(ProbeKind::Icmp, 7, 1)));
        assert!(!is_about(&unreachable, &sent(ProbeKind::Icmp, 8, 2)));
        // An error about an echo reply (a pong of the pair) is no probe's.
        let mut reply = request.to_vec();
        reply[20] = 0;
        let about_reply = quoted(&error(3, 1, &reply)).unwrap();
        assert!(!is_about(&about_reply, &sent(ProbeKind::Icmp, 7, 2)));
    }
}
