//! After a packet too big for its path: what its sender sent next on the
//! same flow (JSON summary `pmtu_after`). The error tells the sender's
//! kernel the path MTU; a sender that learnt it sends smaller packets (TCP
//! lowers its segments, a datagram is fragmented at the source), one that
//! did not (the error never came, PMTU discovery off) sends the same size
//! again. Pure: fed with each journey as its story is told, in order.

use std::net::IpAddr;

use super::{pmtu::too_big, Story};
use crate::{
    decode::{IpPacket, Transport},
    model::summary::{NextPacket, SenderAfterPmtu},
};

/// ICMP's and ICMPv6's echo requests: a ping's flow is its echo ID.
const ECHO_REQUEST: u8 = 8;
const ECHO_REQUEST_V6: u8 = 128;

/// A packet's flow, as its sender keeps one path MTU for it: addresses,
/// protocol, and ports or echo ID. None for a later fragment (it carries
/// no transport header) or a packet of no flow (an ICMP error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Flow {
    src: IpAddr,
    dst: IpAddr,
    protocol: u8,
    ports: (u16, u16),
}

impl Flow {
    fn of(packet: &IpPacket) -> Option<Self> {
        let (protocol, ports) = match packet.transport {
            Transport::Tcp { sport, dport, .. } => (6, (sport, dport)),
            Transport::Udp { sport, dport } => (17, (sport, dport)),
            Transport::Icmp {
                icmp_type: ECHO_REQUEST,
                id,
                ..
            } => (1, (id, 0)),
            Transport::Icmpv6 {
                icmp_type: ECHO_REQUEST_V6,
                id,
                ..
            } => (58, (id, 0)),
            _ => return None,
        };
        Some(Self {
            src: packet.src,
            dst: packet.dst,
            protocol,
            ports,
        })
    }

    fn words(&self) -> String {
        let (a, b) = self.ports;
        match self.protocol {
            6 => format!("{} → {} TCP {a} → {b}", self.src, self.dst),
            17 => format!("{} → {} UDP {a} → {b}", self.src, self.dst),
            _ => format!("{} → {} echo id {a}", self.src, self.dst),
        }
    }
}

/// A packet too big whose sender's next packet is awaited.
struct Awaited {
    flow: Flow,
    story: u64,
    /// When the sender sent it (its first hop).
    sent_ns: u64,
    size: u16,
    mtu: Option<u32>,
    error_reached_sender: bool,
}

/// The flows whose sender was told a path MTU, and what each sent next.
#[derive(Default)]
pub struct PmtuFollowups {
    awaited: Vec<Awaited>,
    settled: Vec<SenderAfterPmtu>,
}

impl PmtuFollowups {
    /// Story `number` was told of `journey`: a packet too big starts a
    /// wait for its flow's next packet (one per flow: the latest); a later
    /// packet of a flow waited on settles it, by its size on leaving the
    /// sender against the MTU the error told (else the size that was too
    /// big).
    pub fn told(&mut self, journey: &super::journey::Journey, story: &Story, number: u64) {
        let Some(first) = journey.hops.first() else {
            return;
        };
        let packet = &first.packet.packet;
        let Some(flow) = Flow::of(packet) else {
            return;
        };
        if let Some(at) =
            (self.awaited.iter()).position(|a| a.flow == flow && a.sent_ns < first.ktime_ns)
        {
            let awaited = self.awaited.remove(at);
            let size = packet.total_len;
            let fits = match awaited.mtu {
                Some(mtu) => u32::from(size) <= mtu,
                None => size < awaited.size,
            };
            let next = if fits {
                NextPacket::Lowered {
                    next_size: size,
                    next_story: number,
                }
            } else {
                NextPacket::KeptTooBig {
                    next_size: size,
                    next_story: number,
                }
            };
            self.settled.push(awaited.settled(next));
        }
        if too_big(journey).is_some() {
            let pmtu = story.verdict.pmtu.as_ref();
            self.awaited.retain(|a| a.flow != flow);
            self.awaited.push(Awaited {
                flow,
                story: number,
                sent_ns: first.ktime_ns,
                size: packet.total_len,
                mtu: pmtu.and_then(|p| p.mtu),
                error_reached_sender: pmtu.is_some_and(|p| {
                    matches!(
                        p.outcome,
                        super::pmtu_verdict::PmtuOutcome::ReachedSender { .. }
                    )
                }),
            });
        }
    }

    /// Every flow's outcome, those still waiting as having sent nothing
    /// more that was seen.
    pub fn finish(self) -> Vec<SenderAfterPmtu> {
        let unanswered = (self.awaited.into_iter()).map(|a| a.settled(NextPacket::NoneSeen));
        let mut all: Vec<SenderAfterPmtu> = self.settled.into_iter().chain(unanswered).collect();
        all.sort_by_key(|s| s.story);
        all
    }
}

impl Awaited {
    fn settled(self, next: NextPacket) -> SenderAfterPmtu {
        SenderAfterPmtu {
            flow: self.flow.words(),
            story: self.story,
            size: self.size,
            mtu: self.mtu,
            error_reached_sender: self.error_reached_sender,
            next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decode::{
            hop::tests::{drop_hop, hop},
            tests::icmp_echo,
        },
        node::interfaces::Role,
        story::{journey::Journey, pmtu::PKT_TOO_BIG, tell, Context},
    };

    const WEB: [u8; 4] = [10, 244, 1, 2];
    const DB: [u8; 4] = [10, 244, 2, 2];

    /// An echo (ID `id`) of `len` IP bytes sent at `t`: dropped too big at cni0, or
    /// delivered.
    fn echo(t: u64, id: u16, len: u16, dropped: bool) -> Journey {
        let mut frame = icmp_echo(WEB, DB, 64, 1);
        // The IP header's total length (the frame's payload stays short),
        // and the echo ID.
        frame[16..18].copy_from_slice(&len.to_be_bytes());
        frame[38..40].copy_from_slice(&id.to_be_bytes());
        let sent = hop(
            t,
            "node-1",
            "vethA",
            Role::PodVeth,
            crate::decode::hop::Direction::Ingress,
            &frame,
        );
        let last = if dropped {
            drop_hop(t + 1, "node-1", "cni0", Role::Bridge, &frame, PKT_TOO_BIG)
        } else {
            hop(
                t + 1,
                "node-2",
                "vethB",
                Role::PodVeth,
                crate::decode::hop::Direction::Egress,
                &frame,
            )
        };
        Journey::new(vec![sent, last])
    }

    fn run(journeys: &[Journey]) -> Vec<SenderAfterPmtu> {
        let mut followups = PmtuFollowups::default();
        for (n, journey) in journeys.iter().enumerate() {
            let story = tell(journey, &Context::default());
            followups.told(journey, &story, n as u64 + 1);
        }
        followups.finish()
    }

    #[test]
    fn a_sender_that_sends_smaller_after_the_drop_lowered_its_size() {
        let said = run(&[echo(100, 1, 1500, true), echo(200, 1, 1444, false)]);
        assert_eq!(said.len(), 1);
        assert_eq!(said[0].story, 1);
        assert_eq!(said[0].size, 1500);
        assert_eq!(
            said[0].next,
            NextPacket::Lowered {
                next_size: 1444,
                next_story: 2
            }
        );
    }

    #[test]
    fn a_sender_that_sends_as_big_again_kept_its_size_and_a_silent_one_is_said_so() {
        let said = run(&[echo(100, 1, 1500, true), echo(200, 1, 1500, true)]);
        assert_eq!(said.len(), 2);
        assert_eq!(
            said[0].next,
            NextPacket::KeptTooBig {
                next_size: 1500,
                next_story: 2
            }
        );
        // The second drop waits in turn, and nothing followed it.
        assert_eq!(said[1].story, 2);
        assert_eq!(said[1].next, NextPacket::NoneSeen);
    }

    #[test]
    fn another_flows_packet_or_an_earlier_one_settles_nothing() {
        // Another echo ID, then a packet of the flow sent before the drop
        // (told after it).
        let said = run(&[
            echo(100, 1, 1500, true),
            echo(200, 2, 84, false),
            echo(50, 1, 84, false),
        ]);
        assert_eq!(said.len(), 1);
        assert_eq!(said[0].next, NextPacket::NoneSeen);
    }
}
