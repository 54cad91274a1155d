//! Which stories are the probes': the teller tells only those, counts the
//! pair's other traffic as skipped, and keeps the verdict of each probe
//! packet that failed, for the probe's result.

use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
};

use super::about::{is_about, Sent};
use crate::{
    decode::Transport,
    model::{ProbeKind, ProbeResult},
    story::{journey::Journey, Outcome, Story},
};

/// A probe's packet that was not delivered: the probe's own, or its
/// answer's (a SYN-ACK, an echo reply) on the way back.
struct Failed {
    summary: String,
    /// The answer's description, when it was the answer that failed.
    answer: Option<String>,
    /// How much it says of the probe's fate: the probe's own packet seen
    /// failing (2) over its answer failing (1) over the probe's packet
    /// leaving what is traced (0), which an answer shows it outlived.
    weight: u8,
}

/// The probes' flows, as they are sent.
pub(in crate::app) struct ProbeWatch {
    kind: ProbeKind,
    /// The source pod's address and the destination's: the probes' ends.
    ends: (Ipv4Addr, Ipv4Addr),
    /// The probes' packets, in the order sent.
    sent: Vec<Sent>,
    /// The verdict of each probe's last packet that was not delivered, by
    /// its flow and ICMP sequence number (0 for TCP, UDP): a raw socket's
    /// echoes share one identifier.
    failed: HashMap<(u16, u16), Failed>,
    /// Probes a packet of which was delivered (by flow and sequence, as
    /// `failed`).
    delivered: HashSet<(u16, u16)>,
    /// Stories of the pair that were not the probes'.
    pub skipped: u64,
}

impl ProbeWatch {
    /// The probes of `kind` from `ends.0` to `ends.1`.
    pub fn new(kind: ProbeKind, ends: (Ipv4Addr, Ipv4Addr)) -> Self {
        Self {
            kind,
            ends,
            sent: Vec::new(),
            failed: HashMap::new(),
            delivered: HashSet::new(),
            skipped: 0,
        }
    }

    /// The next probe is about to be sent on `flow` (its echo sequence
    /// number is its place in the run).
    pub fn sending(&mut self, flow: u16) {
        self.sent.push(Sent {
            src: self.ends.0,
            dst: self.ends.1,
            kind: self.kind,
            flow,
            seq: self.sent.len() as u16 + 1,
        });
    }

    /// The probe `journey`'s packet belongs to (its flow, and ICMP's
    /// sequence number): either way, and an ICMP error that quotes a
    /// probe's own packet too.
    pub fn flow_of(&self, journey: &Journey) -> Option<(u16, u16)> {
        let transport = journey.hops.first()?.packet.packet.transport;
        let ours = |flow: u16| self.sent.iter().any(|s| s.flow == flow);
        match (self.kind, transport) {
            (
                _,
                Transport::Icmp {
                    icmp_type: 3 | 11 | 12,
                    ..
                },
            ) => self.quoted_probe(journey),
            (ProbeKind::Tcp(_), Transport::Tcp { sport, dport, .. })
            | (ProbeKind::Udp(_), Transport::Udp { sport, dport }) => [sport, dport]
                .into_iter()
                .find(|p| ours(*p))
                .map(|flow| (flow, 0)),
            (
                ProbeKind::Icmp,
                Transport::Icmp {
                    id,
                    seq,
                    icmp_type: 0 | 8,
                    ..
                },
            ) => ours(id).then_some((id, seq)),
            _ => None,
        }
    }

    /// The probe whose packet an ICMP error quotes, on any of its hops (on
    /// its way back through a Service, conntrack translates the quote to
    /// what the probe sent).
    fn quoted_probe(&self, journey: &Journey) -> Option<(u16, u16)> {
        let sent = journey
            .hops
            .iter()
            .filter_map(|hop| hop.packet.quoted)
            .find_map(|quoted| self.sent.iter().find(|s| is_about(&quoted, s)))?;
        let seq = match self.kind {
            ProbeKind::Icmp => sent.seq,
            _ => 0,
        };
        Some((sent.flow, seq))
    }

    /// `story` of probe `flow` (and ICMP sequence number) was told.
    pub fn told(&mut self, flow: (u16, u16), story: &Story) {
        if matches!(story.verdict.outcome, Outcome::Delivered { .. }) {
            // The probe's own packet, not an answer to it.
            if story.src == std::net::IpAddr::V4(self.ends.0) {
                self.delivered.insert(flow);
            }
        } else {
            let own = story.src == std::net::IpAddr::V4(self.ends.0);
            let failed = Failed {
                summary: story.verdict.summary.clone(),
                answer: (!own).then(|| story.packet.clone()),
                weight: match story.verdict.outcome {
                    _ if !own => 1,
                    Outcome::LeftNode { .. } => 0,
                    _ => 2,
                },
            };
            // The latest of the weightiest: a retransmission's fate over
            // the first's.
            let kept = self.failed.get(&flow).map_or(0, |f| f.weight);
            if failed.weight >= kept {
                self.failed.insert(flow, failed);
            }
        }
    }

    /// Which of the stories told of `flows` (in the order told) is the
    /// last of `result`'s probe: by its flow, and for ICMP by its echo
    /// sequence too where the probes shared one identifier (a raw socket).
    pub fn last_story_of(&self, flows: &[(u16, u16)], result: &ProbeResult) -> Option<usize> {
        let of_the_probe = |exact: bool| {
            flows.iter().rposition(|&(flow, seq)| {
                flow == result.flow_id
                    && (!exact || self.kind != ProbeKind::Icmp || u32::from(seq) == result.seq)
            })
        };
        of_the_probe(true).or_else(|| of_the_probe(false))
    }

    /// Whether `result` is a UDP probe's silence after its datagram was
    /// delivered: as far as the network goes, it went through.
    pub fn delivered_to_silence(&self, result: &ProbeResult) -> bool {
        matches!(self.kind, ProbeKind::Udp(_))
            && result.silent
            && self.delivered.contains(&(result.flow_id, 0))
    }

    /// The failed packet's verdict, saying so when it was the answer's: the
    /// probe itself may have arrived.
    fn told_failure(&self, failed: &Failed, result: &ProbeResult) -> String {
        let Some(answer) = &failed.answer else {
            return failed.summary.clone();
        };
        let arrived = self.delivered.contains(&self.key_of(result));
        let probe = if arrived {
            "the probe was delivered, but "
        } else {
            ""
        };
        format!("{probe}its answer ({answer}) was not: {}", failed.summary)
    }

    /// `result`'s probe as `failed` and `delivered` key it: its flow, and
    /// for ICMP its echo sequence number.
    fn key_of(&self, result: &ProbeResult) -> (u16, u16) {
        let seq = match self.kind {
            ProbeKind::Icmp => result.seq as u16,
            _ => 0,
        };
        (result.flow_id, seq)
    }

    /// `result`, with the verdict of its packet that failed beside it.
    pub fn explained(&self, mut result: ProbeResult) -> ProbeResult {
        if !result.answered {
            let verdict = self
                .failed
                .get(&self.key_of(&result))
                .or_else(|| self.failed.get(&(result.flow_id, 0)));
            let refused = result.result == super::send::REFUSED;
            if let Some(failed) = verdict {
                result.result =
                    format!("{}: {}", result.result, self.told_failure(failed, &result));
            } else if refused && self.delivered.contains(&(result.flow_id, 0)) {
                // The SYN reached the pod: its own stack answered.
                result.result = "refused (RST)".into();
            } else if refused {
                result.result = "refused (an RST or an ICMP port unreachable answered the SYN, whose story was not told)".into();
            } else if result.result == super::send::PORT_UNREACHABLE {
                result.result = format!("{}: nothing listens there", result.result);
            } else if self.delivered_to_silence(&result) {
                // UDP has no answer of its own: the silence is the port's.
                result.result = format!(
                    "{}, but the datagram was delivered to {}: a closed port's ICMP port unreachable is rate-limited by the kernel (net.ipv4.icmp_ratelimit, icmp_msgs_per_sec), and a listening one need not reply",
                    result.result, self.ends.1
                );
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decode::{
            hop::{tests::hop, Direction},
            quote::tests::{error, icmp_frame, udp},
            tests::icmp_echo,
        },
        node::interfaces::Role,
    };

    /// A result of probe `flow_id` to db (10.0.2.2) that got no answer.
    fn unanswered(kind: &str, flow_id: u16, silent: bool, result: &str) -> ProbeResult {
        let port = kind.split_once(':').map_or("", |(_, port)| port);
        ProbeResult {
            kind: kind.into(),
            target: format!("10.0.2.2:{port}"),
            seq: 1,
            answered: false,
            silent,
            rtt_ms: None,
            result: result.into(),
            flow_id,
        }
    }

    const WEB: [u8; 4] = [10, 0, 1, 2];
    const DB: [u8; 4] = [10, 0, 2, 2];

    /// The journey of one ICMP message from `src` to `dst`, seen on the
    /// source pod's veth.
    fn icmp_journey(src: [u8; 4], dst: [u8; 4], icmp: &[u8]) -> Journey {
        let frame = icmp_frame(src, dst, icmp);
        Journey::new(vec![hop(
            1_000,
            "node-1",
            "vethA",
            Role::PodVeth,
            Direction::Egress,
            &frame,
        )])
    }

    #[test]
    fn an_icmp_error_is_a_probes_only_if_it_quotes_the_probes_own_packet() {
        let mut watch = ProbeWatch::new(ProbeKind::Udp(5354), (WEB.into(), DB.into()));
        watch.sending(40000);
        watch.sending(40002);
        let port_unreachable = |quoting: &[u8]| icmp_journey(DB, WEB, &error(3, 3, quoting));
        assert_eq!(
            watch.flow_of(&port_unreachable(&udp(WEB, DB, 40002, 5354))),
            Some((40002, 0))
        );
        // The pair's other UDP traffic gets its own port unreachable: not
        // the probe's answer.
        assert_eq!(
            watch.flow_of(&port_unreachable(&udp(WEB, DB, 40001, 5355))),
            None
        );
        assert_eq!(
            watch.flow_of(&port_unreachable(&udp(WEB, DB, 40000, 5355))),
            None
        );
        // A frag needed about the probe's datagram is its answer.
        let frag_needed = icmp_journey(DB, WEB, &error(3, 4, &udp(WEB, DB, 40000, 5354)));
        assert_eq!(watch.flow_of(&frag_needed), Some((40000, 0)));
    }

    #[test]
    fn an_echos_error_is_the_probe_of_its_sequence_number() {
        // A raw socket's echoes share one identifier (etherparse's: 7).
        let mut watch = ProbeWatch::new(ProbeKind::Icmp, (WEB.into(), DB.into()));
        watch.sending(7);
        watch.sending(7);
        let unreachable = |seq| {
            let request = icmp_echo(WEB, DB, 64, seq);
            icmp_journey([10, 0, 1, 1], WEB, &error(3, 1, &request[14..]))
        };
        assert_eq!(watch.flow_of(&unreachable(2)), Some((7, 2)));
        assert_eq!(watch.flow_of(&unreachable(1)), Some((7, 1)));
        // An echo the probes did not send (a ping of the pod's own).
        assert_eq!(watch.flow_of(&unreachable(3)), None);
        let request = icmp_echo(WEB, DB, 64, 1);
        assert_eq!(
            watch.flow_of(&icmp_journey(WEB, DB, &request[34..])),
            Some((7, 1))
        );
    }

    #[test]
    fn a_udp_probe_without_answer_whose_datagram_was_delivered_says_so() {
        let mut watch = ProbeWatch::new(ProbeKind::Udp(5354), (WEB.into(), DB.into()));
        watch.sending(40000);
        watch.sending(40002);
        // A delivered story of the first probe (its packet's transport
        // does not matter to the watch).
        let frame = icmp_echo(WEB, DB, 64, 1);
        let delivered = crate::story::tell(
            &Journey::new(vec![
                hop(
                    1,
                    "node-1",
                    "vethA",
                    Role::PodVeth,
                    Direction::Ingress,
                    &frame,
                ),
                hop(
                    2,
                    "node-1",
                    "vethB",
                    Role::PodVeth,
                    Direction::Egress,
                    &frame,
                ),
            ]),
            &Default::default(),
        );
        watch.told((40000, 0), &delivered);
        let silent = |flow_id| unanswered("udp:5354", flow_id, true, "no answer in 1s");
        let told = watch.explained(silent(40000)).result;
        assert!(
            told.starts_with("no answer in 1s, but the datagram was delivered to 10.0.2.2: a closed port's ICMP port unreachable is rate-limited"),
            "{told}"
        );
        // Nothing seen of the other: nothing more is claimed.
        assert_eq!(watch.explained(silent(40002)).result, "no answer in 1s");
    }

    #[test]
    fn a_refused_tcp_probe_names_the_rst_only_where_its_syn_reached_the_pod() {
        let mut watch = ProbeWatch::new(ProbeKind::Tcp(8080), (WEB.into(), DB.into()));
        for flow in [40000, 40001, 40002] {
            watch.sending(flow);
        }
        let frame = icmp_echo(WEB, DB, 64, 1);
        let seen =
            |iface: &str, direction| hop(1, "node-1", iface, Role::PodVeth, direction, &frame);
        let delivered = crate::story::tell(
            &Journey::new(vec![
                seen("vethA", Direction::Ingress),
                seen("vethB", Direction::Egress),
            ]),
            &Default::default(),
        );
        watch.told((40000, 0), &delivered);
        let mut rejected = delivered.clone();
        rejected.verdict.outcome = Outcome::Vanished {
            node: "node-1".into(),
            iface: "vethA".into(),
            direction: Direction::Ingress,
        };
        rejected.verdict.summary =
            "rejected by a rule (the client is sent ICMP port unreachable)".into();
        watch.told((40001, 0), &rejected);
        let refused = |flow_id| {
            let result = unanswered("tcp:8080", flow_id, false, super::super::send::REFUSED);
            watch.explained(result).result
        };
        // connect(2) says ECONNREFUSED of an RST and of an ICMP port
        // unreachable alike: only the SYN's story tells which.
        assert_eq!(refused(40000), "refused (RST)");
        assert_eq!(
            refused(40001),
            "refused: rejected by a rule (the client is sent ICMP port unreachable)"
        );
        assert!(refused(40002).starts_with("refused (an RST or an ICMP port unreachable"));
    }

    #[test]
    fn a_probe_whose_answer_failed_says_it_was_the_answer() {
        let mut watch = ProbeWatch::new(ProbeKind::Tcp(8080), (WEB.into(), DB.into()));
        watch.sending(40000);
        watch.sending(40001);
        watch.sending(40002);
        let story = |src, dst, outcome: Option<&str>| {
            let frame = icmp_echo(src, dst, 64, 1);
            let seen = |iface: &str, d| hop(1, "node-1", iface, Role::PodVeth, d, &frame);
            let mut told = crate::story::tell(
                &Journey::new(vec![
                    seen("vethA", Direction::Ingress),
                    seen("vethB", Direction::Egress),
                ]),
                &Default::default(),
            );
            if let Some(summary) = outcome {
                told.verdict.outcome = Outcome::Vanished {
                    node: "node-1".into(),
                    iface: "vethA".into(),
                    direction: Direction::Ingress,
                };
                told.verdict.summary = summary.into();
            }
            told
        };
        // 40000: the SYN arrived, its SYN-ACK was dropped on the way back.
        watch.told((40000, 0), &story(WEB, DB, None));
        watch.told((40000, 0), &story(DB, WEB, Some("dropped on node-1")));
        // 40001: the answer's failure, then the probe's own: the probe's wins.
        watch.told((40001, 0), &story(DB, WEB, Some("dropped on node-1")));
        watch.told((40001, 0), &story(WEB, DB, Some("no route on node-2")));
        // 40002: the probe left the traced node, its answer was dropped:
        // the drop says more.
        let mut left = story(WEB, DB, Some("left node-1 by eth0"));
        left.verdict.outcome = Outcome::LeftNode {
            node: "node-1".into(),
            iface: "eth0".into(),
            toward: "192.0.2.12".parse().unwrap(),
        };
        watch.told((40002, 0), &left);
        watch.told((40002, 0), &story(DB, WEB, Some("dropped on node-1")));
        let no_answer = |flow_id| {
            let result = unanswered("tcp:8080", flow_id, true, "no answer in 1s");
            watch.explained(result).result
        };
        let told = no_answer(40000);
        assert!(
            told.starts_with("no answer in 1s: the probe was delivered, but its answer (")
                && told.ends_with(") was not: dropped on node-1"),
            "{told}"
        );
        assert_eq!(no_answer(40001), "no answer in 1s: no route on node-2");
        assert!(no_answer(40002).ends_with(") was not: dropped on node-1"));
    }
}
