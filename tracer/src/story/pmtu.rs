//! PMTU end to end: a traced packet too big for its path, and the ICMP
//! "fragmentation needed" the kernel sent its sender about it (ICMPv6's
//! "packet too big" is read here too, but the kernel side traces only
//! IPv4's for now). The error is a packet of its own, from the node's
//! address to the sender, traced because it quotes the pair's header
//! (`match_kind::ABOUT`); its story says where it went. This step pairs
//! the two: whether the error reached the sender's pod, or where and by
//! which rule it died, which is what makes a PMTU black hole.
//!
//! Pure: fed with journeys and the error's story.

use std::net::IpAddr;

use super::{
    journey::Journey,
    pmtu_verdict::{PmtuOutcome, PmtuVerdict},
    Outcome, Story,
};
use crate::{
    decode::{
        hop::{Direction, Hop},
        Decoded, Transport,
    },
    node::interfaces::Role,
};

/// The ICMP type and code of "fragmentation needed".
const DEST_UNREACHABLE: u8 = 3;
const FRAG_NEEDED: u8 = 4;
/// ICMPv6's "packet too big".
const PACKET_TOO_BIG: u8 = 2;
/// The kernel's drop reason for a packet too big for the route's MTU.
pub const PKT_TOO_BIG: &str = "PKT_TOO_BIG";

/// The drop that made the kernel send an error: a packet too big for its
/// route's MTU.
pub fn too_big(journey: &Journey) -> Option<&Hop> {
    let last = journey.hops.last()?;
    dropped_too_big(last).then_some(last)
}

/// Whether `hop` is the kernel dropping a packet too big for its route.
pub fn dropped_too_big(hop: &Hop) -> bool {
    hop.drop.as_ref().is_some_and(|d| d.reason == PKT_TOO_BIG)
}

/// The MTU a "fragmentation needed" or "packet too big" packet carries;
/// `None` for any other packet.
pub fn reported_mtu(packet: &Decoded) -> Option<u32> {
    match packet.packet.transport {
        // The second half of the unused word is the next hop's MTU.
        Transport::Icmp {
            icmp_type: DEST_UNREACHABLE,
            code: FRAG_NEEDED,
            seq,
            ..
        } => Some(u32::from(seq)),
        Transport::Icmpv6 {
            icmp_type: PACKET_TOO_BIG,
            id,
            seq,
            ..
        } => Some(u32::from(id) << 16 | u32::from(seq)),
        _ => None,
    }
}

/// Whether `error` is the error the kernel sent about `subject`'s drop:
/// a PMTU error quoting the subject's own header, first seen on the node
/// that dropped it, from an address that is not a pod sending it (a pod
/// that forges one sends it in by its veth, and tells no story of
/// another pair's packet).
pub fn is_about(error: &Journey, subject: &Journey) -> bool {
    let (Some(drop), Some(first)) = (too_big(subject), error.hops.first()) else {
        return false;
    };
    let Some(quoted) = &first.packet.quoted else {
        return false;
    };
    let sent = &subject.hops[0].packet.packet;
    let same_packet = quoted.src == sent.src
        && quoted.dst == sent.dst
        && quoted.ip_id.is_none_or(|id| id == sent.ip_id)
        && quoted.transport.is_of(&sent.transport);
    let sent_by_a_pod = first.role == Role::PodVeth && first.direction == Direction::Ingress;
    let made_by_the_node = first.node == drop.node && !sent_by_a_pod;
    reported_mtu(&first.packet).is_some() && same_packet && made_by_the_node
}

/// Pairs each too-big drop in `journeys` with the error about it, if
/// one is among them: (subject, error) indices.
pub fn pair(journeys: &[Journey]) -> Vec<(usize, Option<usize>)> {
    (journeys.iter().enumerate())
        .filter(|(_, j)| too_big(j).is_some())
        .map(|(s, subject)| {
            let error = (journeys.iter()).position(|e| is_about(e, subject));
            (s, error)
        })
        .collect()
}

/// Adds to the too-big packet's story what became of the error about it
/// (`error`: its journey and story, if one was seen); `label` names an
/// address as stories do.
pub fn attach(
    story: &mut Story,
    error: Option<(&Journey, &Story)>,
    label: impl Fn(IpAddr) -> String,
) {
    let verdict = judge(error, &label);
    let words = verdict.words(&label(story.src));
    story.verdict.summary = format!("{}; {words}", story.verdict.summary);
    story.verdict.pmtu = Some(verdict);
}

/// What became of the error, from its own story.
fn judge(error: Option<(&Journey, &Story)>, label: impl Fn(IpAddr) -> String) -> PmtuVerdict {
    let Some((journey, story)) = error else {
        return PmtuVerdict {
            mtu: None,
            from: String::new(),
            outcome: PmtuOutcome::NotSeen,
        };
    };
    let first = &journey.hops[0];
    let outcome = match &story.verdict.outcome {
        Outcome::Delivered { node, iface } => PmtuOutcome::ReachedSender {
            node: node.clone(),
            iface: iface.clone(),
        },
        Outcome::Dropped {
            node,
            iface,
            reason,
            ..
        } => PmtuOutcome::Dropped {
            node: node.clone(),
            iface: iface.clone(),
            reason: reason.clone(),
            rule: (story.verdict.netfilter.as_ref())
                .map(|r| format!("table {} chain {}: {}", r.table, r.chain, r.rule)),
        },
        _ => PmtuOutcome::Unsettled {
            story: story.verdict.summary.clone(),
        },
    };
    PmtuVerdict {
        mtu: reported_mtu(&first.packet),
        from: label(first.packet.packet.src),
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decode::{
            hop::tests::{drop_hop, hop},
            quote::tests::{error, icmp_frame},
            tests::icmp_echo,
        },
        story::{tell, Context},
    };

    const WEB: [u8; 4] = [10, 244, 1, 2];
    const DB: [u8; 4] = [10, 244, 2, 2];
    const GATEWAY: [u8; 4] = [10, 244, 1, 1];

    /// web-0's ping, sent in by its veth and dropped too big at cni0.
    fn too_big_ping() -> (Journey, Vec<u8>) {
        let ping = icmp_echo(WEB, DB, 64, 1);
        let journey = Journey::new(vec![
            hop(
                1,
                "node-1",
                "vethA",
                Role::PodVeth,
                Direction::Ingress,
                &ping,
            ),
            drop_hop(2, "node-1", "cni0", Role::Bridge, &ping, PKT_TOO_BIG),
        ]);
        (journey, ping)
    }

    /// The error about `ping` from `from` to web-0, MTU 1450.
    fn frag_needed(ping: &[u8]) -> Vec<u8> {
        let mut icmp = error(3, 4, &ping[14..14 + 28]);
        icmp[6..8].copy_from_slice(&1450u16.to_be_bytes());
        icmp_frame(GATEWAY, WEB, &icmp)
    }

    fn told(journey: &Journey) -> Story {
        tell(journey, &Context::default())
    }

    #[test]
    fn the_nodes_error_handed_to_the_sender_is_said_to_have_reached_it() {
        let (subject, ping) = too_big_ping();
        let icmp = frag_needed(&ping);
        let error = Journey::new(vec![
            hop(3, "node-1", "cni0", Role::Bridge, Direction::Egress, &icmp),
            hop(
                4,
                "node-1",
                "vethA",
                Role::PodVeth,
                Direction::Egress,
                &icmp,
            ),
        ]);
        let journeys = [subject, error];
        assert_eq!(pair(&journeys), [(0, Some(1))]);
        let mut story = told(&journeys[0]);
        attach(
            &mut story,
            Some((&journeys[1], &told(&journeys[1]))),
            |ip| ip.to_string(),
        );
        let pmtu = story.verdict.pmtu.as_ref().unwrap();
        assert_eq!(pmtu.mtu, Some(1450));
        assert_eq!(pmtu.from, "10.244.1.1");
        assert!(
            matches!(pmtu.outcome, PmtuOutcome::ReachedSender { .. }),
            "{pmtu:?}"
        );
        assert!(
            story
                .verdict
                .summary
                .contains("(MTU 1450) from 10.244.1.1 reached 10.244.1.2"),
            "{}",
            story.verdict.summary
        );
    }

    #[test]
    fn an_error_dropped_on_its_way_is_a_pmtu_black_hole() {
        let (subject, ping) = too_big_ping();
        let icmp = frag_needed(&ping);
        let error = Journey::new(vec![drop_hop(
            3,
            "node-1",
            "cni0",
            Role::Bridge,
            &icmp,
            "NETFILTER_DROP",
        )]);
        let mut story = told(&subject);
        attach(&mut story, Some((&error, &told(&error))), |ip| {
            ip.to_string()
        });
        let pmtu = story.verdict.pmtu.unwrap();
        assert!(
            matches!(&pmtu.outcome, PmtuOutcome::Dropped { reason, .. } if reason == "NETFILTER_DROP"),
            "{pmtu:?}"
        );
        assert!(
            story.verdict.summary.contains("a PMTU black hole"),
            "{}",
            story.verdict.summary
        );
    }

    /// An error a pod sends in by its veth, or one about another packet,
    /// is no error the node sent about this one.
    #[test]
    fn only_the_nodes_own_error_about_this_packet_is_paired() {
        let (subject, ping) = too_big_ping();
        let icmp = frag_needed(&ping);
        let forged = Journey::new(vec![hop(
            3,
            "node-1",
            "vethB",
            Role::PodVeth,
            Direction::Ingress,
            &icmp,
        )]);
        let elsewhere = Journey::new(vec![hop(
            3,
            "node-2",
            "cni0",
            Role::Bridge,
            Direction::Egress,
            &icmp,
        )]);
        let other = frag_needed(&icmp_echo(WEB, DB, 64, 2));
        let another = Journey::new(vec![hop(
            3,
            "node-1",
            "cni0",
            Role::Bridge,
            Direction::Egress,
            &other,
        )]);
        let journeys = [subject, forged, elsewhere, another];
        assert_eq!(pair(&journeys), [(0, None)]);
        let mut story = told(&journeys[0]);
        attach(&mut story, None, |ip| ip.to_string());
        assert_eq!(story.verdict.pmtu.unwrap().outcome, PmtuOutcome::NotSeen);
    }
}
