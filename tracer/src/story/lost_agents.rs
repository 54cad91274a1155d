//! Cluster mode: traced nodes whose agent was lost mid-trace (it died, or
//! its log broke off). A packet that went on to such a node after the
//! agent's last progress mark was not seen there because nobody was
//! looking, not because it vanished: its story is told incomplete, with
//! what happened to the agent.

use super::{
    context::{Context, LostAgent},
    journey::Journey,
};
use crate::{decode::hop::Direction, node::interfaces::Role};

/// The lost agent that explains why `journey` was not seen further: the
/// packet was last seen after the agent's last progress mark, on the
/// agent's own node, or leaving another node by its underlay toward it.
pub(super) fn behind<'c>(journey: &Journey, ctx: &'c Context) -> Option<&'c LostAgent> {
    let last = journey.hops.last()?;
    let dst = journey.hops[0].packet.packet.dst;
    let toward = last.packet.tunnel.map_or(dst, |t| t.outer.dst);
    let crossing = last.role == Role::Underlay && last.direction == Direction::Egress;
    ctx.lost_agents.iter().find(|lost| {
        if last.ktime_ns < lost.since_ns {
            return false;
        }
        if *last.node == *lost.node {
            return true;
        }
        crossing && leads_to(ctx, &lost.node, toward, dst)
    })
}

/// A packet for `dst`, sent to `toward` (the tunnel's far end, or `dst`
/// itself when routed), goes to `node`: one of its addresses, or a pod
/// subnet it delivers. A node whose facts never came (its agent died
/// before it said them) is taken to be where the packet went.
fn leads_to(ctx: &Context, node: &str, toward: std::net::IpAddr, dst: std::net::IpAddr) -> bool {
    let Some(facts) = ctx.nodes.get(node) else {
        return true;
    };
    facts.view.holds(toward) || facts.local_pod_subnets.iter().any(|net| net.contains(&dst))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decode::{hop::tests::hop, tests as frames},
        node::NodeFacts,
    };

    /// web-0 on n1 pings db-0 on n2, seen on n1 as far as its eth0.
    fn ping_leaving_n1(at_ns: u64) -> Journey {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let hops = [
            (at_ns, "veth1", Role::PodVeth, Direction::Ingress),
            (at_ns + 10_000, "eth0", Role::Underlay, Direction::Egress),
        ]
        .map(|(t, iface, role, direction)| hop(t, "n1", iface, role, direction, &frame));
        Journey::new(hops.into())
    }

    fn ctx_with_n2_lost(since_ns: u64) -> Context {
        let mut ctx = Context::default();
        let n2 = NodeFacts {
            local_pod_subnets: vec!["10.244.2.0/24".parse().unwrap()],
            ..Default::default()
        };
        ctx.nodes.insert("n2".into(), n2);
        ctx.nodes.insert("n1".into(), NodeFacts::default());
        ctx.lost_agents.push(LostAgent {
            node: "n2".into(),
            since_ns,
            what: "n2's agent died".into(),
        });
        ctx
    }

    #[test]
    fn a_packet_sent_toward_the_lost_node_after_its_last_mark_is_explained() {
        let ctx = ctx_with_n2_lost(5_000);
        let lost = behind(&ping_leaving_n1(6_000), &ctx).expect("explained");
        assert_eq!(lost.node, "n2");
    }

    #[test]
    fn a_packet_sent_before_the_last_mark_is_not() {
        // Its hops on n2 would have come: their absence means something.
        let ctx = ctx_with_n2_lost(1_000_000);
        assert_eq!(behind(&ping_leaving_n1(6_000), &ctx), None);
    }

    #[test]
    fn a_packet_toward_another_node_is_not() {
        let mut ctx = ctx_with_n2_lost(5_000);
        ctx.nodes.get_mut("n2").unwrap().local_pod_subnets = vec!["10.244.3.0/24".parse().unwrap()];
        assert_eq!(behind(&ping_leaving_n1(6_000), &ctx), None);
    }

    #[test]
    fn a_packet_last_seen_inside_the_node_it_left_is_not() {
        let ctx = ctx_with_n2_lost(5_000);
        let mut journey = ping_leaving_n1(6_000);
        journey.hops.truncate(1);
        assert_eq!(behind(&journey, &ctx), None);
    }
}
