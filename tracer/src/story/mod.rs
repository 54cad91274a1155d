//! From a journey to its story: what happened at each hop, and the
//! verdict. Pure; rendering (text, JSON) is in `output`.
//!
//! - `journey`: one packet's sightings, and the key that finds them;
//! - `correlator`: grouping the sightings of one packet (correlation);
//! - `nat`, `nat_steps`: one packet across translations, and their naming;
//!   `nat_connections`: the connections conntrack reported, indexed;
//! - `notes`: the wording of each hop;
//! - `verdict`: how the packet travelled and where it ended;
//! - `verdict_names`, `rule_text`: the rule that dropped it, read, and the
//!   translations on its way;
//! - `conntrack`: a drop that was conntrack's doing (INVALID, an insert
//!   that failed, a full table, SNAT ports exhausted), told from evidence;
//! - `explain`: why, in the operator's terms (route -n, hints);
//! - `lost_agents`: cluster mode's nodes that stopped being heard;
//! - `profile`: per-step latency over many stories.

pub mod clock;
pub mod conntrack;
pub(crate) mod context;
pub mod correlator;
pub mod explain;
mod findings;
pub mod journey;
pub mod lost_agents;
pub mod nat;
pub mod nat_connections;
pub mod nat_steps;
mod notes;
mod outcome;
pub mod pmtu;
pub mod pmtu_followup;
pub mod pmtu_verdict;
pub mod policy;
mod policy_api;
mod policy_calico;
mod policy_kube_network_policies;
mod policy_kube_router;
mod policy_verdict;
pub mod profile;
mod rule_text;
pub mod steps;
mod traced_subnets;
mod verdict;
mod verdict_names;
pub mod wireguard;

use std::{borrow::Cow, net::IpAddr};

use serde::Serialize;

pub use context::Context;
pub use outcome::{Outcome, PathStep};
pub use verdict::Verdict;

use crate::{
    decode::{
        hop::{Direction, DropInfo, Hop, KernelRoute},
        Transport, Tunnel,
    },
    model::{
        netfilter::{NetfilterRule, QueueFate},
        Name,
    },
    node::interfaces::Role,
};
use clock::micros;
use journey::Journey;
use nat_steps::NatStep;

#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct HopLine {
    /// Microseconds since the journey's first hop.
    pub t_us: f64,
    /// Cluster mode, on a step from one node to another: how far off the
    /// step may be, the nodes' clocks being placed by the traced packets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_uncertainty_us: Option<f64>,
    pub node: Name,
    pub iface: Name,
    pub role: Role,
    pub direction: Direction,
    pub skb_len: u32,
    pub ttl: u8,
    pub mark: u32,
    pub tunnel: Option<Tunnel>,
    /// The kernel's route for the packet, asked at this hook (ingress).
    pub route: Option<KernelRoute>,
    pub note: String,
    /// Address translations since the previous hop (DNAT, un-DNAT, SNAT,
    /// MASQUERADE, un-SNAT), each with both tuples, the rule and the
    /// conntrack state.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nat: Vec<NatStep>,
}

#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Story {
    pub packet: String,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_name: Option<String>,
    pub dst_name: Option<String>,
    pub transport: Transport,
    pub ip_id: u16,
    pub hops: Vec<HopLine>,
    /// Frees after delivery (the pod's own stack, e.g. NO_SOCKET for a ping
    /// reply that only a raw socket wanted): not drops on the path.
    pub freed_after_delivery: Vec<DropInfo>,
    pub verdict: Verdict,
    /// The kernel lost records while this packet was in flight: hops may
    /// be missing.
    pub records_lost: bool,
}

pub fn tell(journey: &Journey, ctx: &Context) -> Story {
    let (journey, freed_after_delivery) = split_after_delivery(journey);
    let journey = journey.as_ref();
    let first = &journey.hops[0];
    let start = first.ktime_ns;
    let packet = first.packet.packet;
    let hops = journey
        .hops
        .iter()
        .enumerate()
        .map(|(i, hop)| {
            let prev = i.checked_sub(1).map(|p| &journey.hops[p]);
            let nat = prev.map_or_else(Vec::new, |p| translations(p, hop, journey, ctx));
            let mut note = notes::note(hop, prev, ctx);
            for step in &nat {
                note.push_str(&format!("; {}", step.text()));
            }
            HopLine {
                t_us: micros(hop.ktime_ns - start),
                clock_uncertainty_us: i
                    .checked_sub(1)
                    .and_then(|p| step_uncertainty(&journey.hops[p].node, &hop.node, ctx)),
                node: hop.node.clone(),
                iface: hop.iface.clone(),
                role: hop.role,
                direction: hop.direction,
                skb_len: hop.skb_len,
                ttl: hop.packet.packet.ttl,
                mark: hop.mark,
                tunnel: hop.packet.tunnel,
                route: hop.route.clone(),
                note,
                nat,
            }
        })
        .collect();
    let mut story = Story {
        packet: notes::describe_packet(&first.packet),
        src: packet.src,
        dst: packet.dst,
        src_name: ctx.names.get(&packet.src).cloned(),
        dst_name: ctx.names.get(&packet.dst).cloned(),
        transport: packet.transport,
        ip_id: packet.ip_id,
        hops,
        freed_after_delivery,
        verdict: verdict::judge(journey, ctx),
        records_lost: journey.records_lost,
    };
    if let Some(origin) = notes::made_by_the_node(first, ctx).filter(|_| !journey.records_lost) {
        let first_note = &mut story.hops[0].note;
        *first_note = format!("{origin}; {first_note}");
    }
    if story.netfilter_drop() {
        name_netfilter_drop(&mut story, journey, ctx);
    }
    story.name_translations();
    if story.hops.iter().all(|h| h.nat.is_empty()) {
        if let Some(translation) = ctx.nat.translated_before_sight(&packet, start) {
            story.verdict.summary.push_str(&format!(
                "; first seen after a translation by conntrack ({translation}): podtrace learnt it only after this packet had passed, so its hops before it were not traced"
            ));
        }
    }
    story
}

/// The translations between two consecutive hops, each placed where it
/// was done and named by the rules that node's tracing can see.
fn translations(prev: &Hop, hop: &Hop, journey: &Journey, ctx: &Context) -> Vec<NatStep> {
    let (before, after) = (&prev.packet.packet, &hop.packet.packet);
    let mut nat = nat_steps::steps(before, after, &journey.nat_rules, &ctx.nat);
    nat_steps::out_of_sight(&mut nat, prev, hop);
    // The rules of the node that translated it: out of sight, the
    // earlier node's.
    let translated_on = nat
        .first()
        .and_then(|s| s.out_of_sight.as_ref()?.node.as_deref())
        .unwrap_or(&hop.node);
    if ctx.rules_unseen.contains_key(translated_on) {
        nat_steps::unseen_by_tracing(&mut nat);
    }
    nat
}

/// A netfilter drop: conntrack's doing when the evidence shows it (its
/// mechanism first, what shows it and the fix after), else the rule.
fn name_netfilter_drop(story: &mut Story, journey: &Journey, ctx: &Context) {
    let rule = dropping_rule(journey, &story.verdict.outcome);
    let failure = conntrack::diagnose(journey, &story.verdict.outcome, ctx);
    match &failure {
        Some(failure) if rule.is_none() => story.name_conntrack_verdict(failure.mechanism),
        _ => story.name_rule(rule, ctx),
    }
    if let Some(failure) = failure {
        let (what, tail) = conntrack::said(&failure);
        story.verdict.summary = format!("{what}; {}{tail}", story.verdict.summary);
        story.verdict.conntrack = Some(failure);
    }
}

/// The rule a netfilter drop is told by. A rule that queued the packet
/// to userspace dropped it only if the kernel freed it in the queueing:
/// a packet the program accepted, then dropped later by something rule
/// tracing did not name (conntrack, a legacy rule), was not that rule's.
fn dropping_rule<'j>(journey: &'j Journey, outcome: &Outcome) -> Option<&'j NetfilterRule> {
    let rule = journey.rule.as_ref()?;
    let freed_in_queueing = matches!(outcome, Outcome::Dropped { location, .. }
        if QueueFate::of(location).is_some());
    (!rule.queued() || freed_in_queueing).then_some(rule)
}

/// A cross-node step's clock uncertainty: both nodes' against the
/// common timeline.
fn step_uncertainty(from: &str, to: &str, ctx: &Context) -> Option<f64> {
    if from == to {
        return None;
    }
    let clock = &ctx.clock_uncertainty_ns;
    Some(micros(clock.get(from)? + clock.get(to)?))
}

/// Moves frees that follow delivery out of the path: the pod's own stack
/// (no socket for a ping reply only a raw socket wanted). A firewall
/// verdict inside the pod stays: that is why the pod never got it.
/// The journey up to its delivery, and the frees after it. Borrowed when
/// there are none, as for nearly every packet: a copy of every hop per
/// story was a good part of what telling a line-rate flow cost.
fn split_after_delivery(journey: &Journey) -> (Cow<'_, Journey>, Vec<DropInfo>) {
    let freed_after = |delivered: usize| {
        (delivered + 1..journey.hops.len()).filter(|&i| is_socket_free(&journey.hops[i]))
    };
    let Some(delivered) = journey.delivered_at() else {
        return (Cow::Borrowed(journey), Vec::new());
    };
    if freed_after(delivered).next().is_none() {
        return (Cow::Borrowed(journey), Vec::new());
    }
    let mut path = journey.clone();
    let freed = freed_after(delivered)
        .rev()
        .filter_map(|i| path.hops.remove(i).drop)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    (Cow::Owned(path), freed)
}

/// A free after delivery that is not the firewall's (the socket's own).
fn is_socket_free(hop: &Hop) -> bool {
    let firewall = hop
        .drop
        .as_ref()
        .is_some_and(|d| d.reason == journey::NETFILTER_DROP);
    hop.direction == Direction::Drop && !firewall
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        decode::hop::{tests::hop, Direction::*, Hop},
        decode::tests as frames,
    };

    fn cross_node_flannel() -> Journey {
        let at_src = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let routed = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
        let delivered = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 62, 1);
        let hops = vec![
            hop(1_000, "node-1", "vethA", Role::PodVeth, Ingress, &at_src),
            hop(2_000, "node-1", "cni0", Role::Bridge, Ingress, &at_src),
            hop(3_000, "node-1", "flannel.1", Role::Tunnel, Egress, &routed),
            hop(
                4_000,
                "node-1",
                "eth0",
                Role::Underlay,
                Egress,
                &frames::vxlan(&routed, 1),
            ),
            hop(
                9_000,
                "node-2",
                "eth0",
                Role::Underlay,
                Ingress,
                &frames::vxlan(&routed, 1),
            ),
            hop(
                10_000,
                "node-2",
                "flannel.1",
                Role::Tunnel,
                Ingress,
                &routed,
            ),
            hop(11_000, "node-2", "cni0", Role::Bridge, Egress, &delivered),
            hop(12_500, "node-2", "vethB", Role::PodVeth, Egress, &delivered),
        ];
        Journey::new(hops)
    }

    pub(crate) fn sample_journey() -> Journey {
        cross_node_flannel()
    }

    pub(crate) fn sample_story() -> Story {
        tell(&cross_node_flannel(), &ctx())
    }

    fn ctx() -> Context {
        let mut ctx = Context::default();
        ctx.names
            .insert("10.244.2.2".parse().unwrap(), "default/db-0".into());
        ctx.nodes.insert(
            "node-2".into(),
            crate::node::NodeFacts {
                local_pod_subnets: vec!["10.244.2.0/24".parse().unwrap()],
                ..Default::default()
            },
        );
        ctx
    }

    #[test]
    fn cross_node_vxlan_is_routed_encapsulated_decapsulated_and_delivered() {
        let story = tell(&cross_node_flannel(), &ctx());
        assert_eq!(
            story.verdict.outcome,
            Outcome::Delivered {
                node: "node-2".into(),
                iface: "vethB".into()
            }
        );
        assert_eq!(
            story.verdict.path,
            [
                PathStep::Routed,
                PathStep::Encapsulated,
                PathStep::Decapsulated
            ]
        );
        assert_eq!(story.verdict.latency_us, 11.5);
        assert_eq!(
            story.hops[2].note,
            "routed (TTL 64→63), into the tunnel device"
        );
        assert_eq!(
            story.hops[3].note,
            "encapsulated VXLAN VNI 1 192.0.2.11:41000 → 192.0.2.12:8472 (+50 B)"
        );
        assert_eq!(story.hops[5].note, "decapsulated");
        assert_eq!(
            story.hops[6].note,
            "routed (TTL 63→62), host stack down to the bridge"
        );
        assert_eq!(story.hops[7].note, "handed to 10.244.2.2 (default/db-0)");
        assert!(story
            .verdict
            .summary
            .starts_with("delivered to 10.244.2.2 (default/db-0) on node-2"));
    }

    #[test]
    fn a_pods_packet_first_seen_past_its_traced_veth_was_made_by_the_node() {
        // node-2's REJECT --reject-with tcp-reset answers web-0 in db-0's
        // name: the packet starts in node-2's stack, not at db-0's veth.
        let mut reset = frames::tcp_syn([10, 244, 2, 2], [10, 244, 1, 2], 8080, 40000);
        reset[14 + 20 + 13] = 0x14; // RST, ACK (a fixed 20-byte IPv4 header)
        let made_here = || {
            Journey::new(vec![
                hop(1_000, "node-2", "flannel.1", Role::Tunnel, Egress, &reset),
                hop(2_000, "node-1", "flannel.1", Role::Tunnel, Ingress, &reset),
            ])
        };
        let mut ctx = ctx();
        ctx.nodes.get_mut("node-2").unwrap().pod_interfaces =
            vec![("10.244.2.2".parse().unwrap(), "vethB".into())];
        let story = tell(&made_here(), &ctx);
        assert!(
            story.hops[0].note.starts_with("made by node-2's own stack in 10.244.2.2 (default/db-0)'s name, not sent by the pod (never seen at its veth vethB's ingress)"),
            "{}",
            story.hops[0].note
        );
        // Sent by the pod: seen at its veth first.
        let mut sent = made_here();
        sent.hops.insert(
            0,
            hop(500, "node-2", "vethB", Role::PodVeth, Ingress, &reset),
        );
        assert!(tell(&sent, &ctx).hops[0].note.starts_with("sent by"));
        // Records lost: its veth hop may be the one missing.
        let mut lost = made_here();
        lost.records_lost = true;
        assert!(!tell(&lost, &ctx).hops[0].note.starts_with("made by"));
        // A pod that is not traced here tells nothing of its origin.
        assert!(!tell(&made_here(), &self::ctx()).hops[0]
            .note
            .starts_with("made by"));
        // Not a reset: it may have come through a Service's DNAT from a
        // pair not traced (web-0 → ClusterIP), first seen after it.
        let syn = frames::tcp_syn([10, 244, 2, 2], [10, 244, 1, 2], 40000, 8080);
        let dnatted = Journey::new(vec![hop(
            1_000,
            "node-2",
            "flannel.1",
            Role::Tunnel,
            Egress,
            &syn,
        )]);
        assert!(!tell(&dnatted, &ctx).hops[0].note.starts_with("made by"));
    }

    #[test]
    fn a_journey_cut_at_the_underlay_left_the_node_or_vanished() {
        let mut journey = cross_node_flannel();
        journey.hops.truncate(4);
        // Only node-1 traced: leaving by eth0 is the end of what it can see.
        let story = tell(&journey, &Context::default());
        assert_eq!(
            story.verdict.outcome,
            Outcome::LeftNode {
                node: "node-1".into(),
                iface: "eth0".into(),
                toward: "192.0.2.12".parse().unwrap()
            }
        );
        // node-2 traced too: the packet should have arrived there.
        let story = tell(&journey, &ctx());
        assert!(matches!(story.verdict.outcome, Outcome::Vanished { .. }));
        assert!(story
            .verdict
            .summary
            .contains("last seen on node-1 eth0 egress"));
    }

    #[test]
    fn a_packet_a_missing_route_sent_to_the_default_gateway_left_the_node_there() {
        // node-1 lost its route to node-2's pods: the packet left by the
        // default route, plain, toward the underlay's gateway, which is no
        // traced node. node-2 expected it, but it never went there.
        let at_src = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let routed = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
        let journey = Journey::new(vec![
            hop(1_000, "node-1", "vethA", Role::PodVeth, Ingress, &at_src),
            hop(2_000, "node-1", "cni0", Role::Bridge, Ingress, &at_src),
            hop(3_000, "node-1", "eth0", Role::Underlay, Egress, &routed),
        ]);
        let mut view = crate::node::fixtures::flannel_node();
        view.routes
            .retain(|r| r.destination.to_string() != "10.244.2.0/24");
        let mut ctx = ctx();
        ctx.nodes.insert(
            "node-1".into(),
            crate::node::NodeFacts {
                view,
                local_pod_subnets: vec!["10.244.1.0/24".parse().unwrap()],
                ..Default::default()
            },
        );
        let story = tell(&journey, &ctx);
        let Outcome::NoRoute { check, then } = &story.verdict.outcome else {
            panic!("{}", story.verdict.summary);
        };
        assert!(check.used.starts_with("default via 192.0.2.1 dev eth0"));
        assert_eq!(
            **then,
            Outcome::LeftNode {
                node: "node-1".into(),
                iface: "eth0".into(),
                toward: "192.0.2.1".parse().unwrap()
            }
        );
        assert!(
            story
                .verdict
                .summary
                .ends_with("(the packet left node-1 by eth0)"),
            "{}",
            story.verdict.summary
        );
    }

    fn drop_hop(t: u64, node: &str, iface: &str, frame: &[u8], reason: &str) -> Hop {
        crate::decode::hop::tests::drop_hop(t, node, iface, Role::Other, frame, reason)
    }

    #[test]
    fn a_drop_that_ends_the_journey_is_the_verdict() {
        let mut journey = cross_node_flannel();
        journey.hops.truncate(2);
        let routed = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
        journey
            .hops
            .push(drop_hop(2_500, "node-1", "cni0", &routed, "NETFILTER_DROP"));
        let story = tell(&journey, &ctx());
        assert_eq!(
            story.verdict.outcome,
            Outcome::Dropped {
                node: "node-1".into(),
                iface: "cni0".into(),
                reason: "NETFILTER_DROP".into(),
                location: "nf_hook_slow+0x9c".into()
            }
        );
        assert_eq!(
            story.hops[2].note,
            "routed (TTL 64→63), dropped: NETFILTER_DROP in nf_hook_slow+0x9c"
        );
        assert!(story.freed_after_delivery.is_empty());
    }

    /// kube-network-policies' rule queued the packet: the drop is that
    /// rule's (its queue unread) only where the kernel freed it in the
    /// queueing; a packet the engine accepted and something else dropped
    /// later (conntrack, a legacy rule) is not blamed on the queue.
    #[test]
    fn a_rule_that_queued_the_packet_is_its_drop_only_if_freed_in_the_queueing() {
        use crate::model::netfilter::PathRule;
        let text = "ip daddr @podips-v4 queue to 98 # handle 9";
        let table = "inet kube-network-policies";
        let queued = NetfilterRule {
            table: table.into(),
            chain: "postrouting".into(),
            hook: "POSTROUTING".into(),
            rule: text.into(),
            path: vec![PathRule {
                table: table.into(),
                chain: "postrouting".into(),
                rule: text.into(),
                verdict: "queue".into(),
                target_head: None,
            }],
        };
        for (location, queues_drop) in [("nf_queue+0x5c", true), ("nf_hook_slow+0x9c", false)] {
            let mut journey = cross_node_flannel();
            journey.hops.truncate(2);
            let routed = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
            let mut hop = drop_hop(2_500, "node-1", "cni0", &routed, "NETFILTER_DROP");
            hop.drop.as_mut().expect("a drop").location = location.into();
            journey.hops.push(hop);
            journey.rule = Some(queued.clone());
            let story = tell(&journey, &ctx());
            let summary = &story.verdict.summary;
            assert_eq!(
                story.verdict.policy.is_some(),
                queues_drop,
                "{location}: {summary}"
            );
            assert_eq!(
                story.verdict.netfilter.is_some(),
                queues_drop,
                "{location}: {summary}"
            );
            assert_eq!(
                summary.contains("queued this packet"),
                queues_drop,
                "{summary}"
            );
        }
    }

    #[test]
    fn a_free_inside_the_pod_after_delivery_is_not_a_drop_on_the_path() {
        let mut journey = cross_node_flannel();
        let delivered = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 62, 1);
        journey.hops.push(drop_hop(
            13_000,
            "netns db-0",
            "eth0",
            &delivered,
            "NO_SOCKET",
        ));
        let story = tell(&journey, &ctx());
        assert!(matches!(story.verdict.outcome, Outcome::Delivered { .. }));
        assert_eq!(story.hops.len(), 8);
        assert_eq!(story.freed_after_delivery[0].reason, "NO_SOCKET");
    }

    const FIN_ACK: u8 = 0x11;

    /// A TCP segment (`flags`) to a node-2 socket, freed by node-2's TCP.
    fn segment_freed_on_node_2(flags: u8, reason: &str, location: &str, by_socket: bool) -> Story {
        let mut fin = frames::tcp_syn([10, 244, 1, 2], [192, 0, 2, 12], 40000, 8080);
        // Ethernet, IPv4, then TCP's flags byte.
        fin[14 + 20 + 13] = flags;
        let mut freed = drop_hop(9_500, "node-2", "eth0", &fin, reason);
        let drop = freed.drop.as_mut().unwrap();
        drop.location = location.into();
        drop.by_socket = by_socket;
        let hops = vec![
            hop(1_000, "node-1", "vethA", Role::PodVeth, Ingress, &fin),
            hop(4_000, "node-1", "eth0", Role::Underlay, Egress, &fin),
            hop(9_000, "node-2", "eth0", Role::Underlay, Ingress, &fin),
            freed,
        ];
        tell(&Journey::new(hops), &ctx())
    }

    #[test]
    fn a_socket_teardown_at_the_receiver_is_no_drop_on_the_path() {
        for (reason, location) in [
            ("NOT_SPECIFIED", "tcp_v4_rcv+0x5d"),
            ("QUEUE_PURGE", "skb_queue_purge_reason+0x40"),
            ("TCP_CLOSE", "tcp_rcv_state_process+0x1c0"),
            ("NO_SOCKET", "tcp_v4_rcv+0x1f2"),
        ] {
            let story = segment_freed_on_node_2(FIN_ACK, reason, location, false);
            assert!(
                matches!(story.verdict.outcome, Outcome::Delivered { ref node, .. } if node == "node-2"),
                "{reason}: {:?}",
                story.verdict
            );
            assert!(
                story.verdict.summary.contains(&format!(
                    "then freed there by the receiving socket layer: {reason} in {location}"
                )),
                "{}",
                story.verdict.summary
            );
        }
    }

    /// ping(8) reads replies on a raw socket: the reply's original is
    /// freed by ping_rcv (no ping socket), after the raw socket's copy.
    #[test]
    fn an_echo_reply_freed_by_ping_rcv_at_its_host_was_delivered() {
        let mut reply = frames::icmp_echo([192, 0, 2, 12], [192, 0, 2, 11], 64, 1);
        // Ethernet, IPv4, then ICMP's type: an echo reply.
        reply[14 + 20] = 0;
        let mut freed = drop_hop(9_500, "node-1", "eth0", &reply, "NO_SOCKET");
        freed.drop.as_mut().unwrap().location = "ping_rcv+0xb3".into();
        let hops = vec![
            hop(1_000, "node-2", "eth0", Role::Underlay, Egress, &reply),
            hop(9_000, "node-1", "eth0", Role::Underlay, Ingress, &reply),
            freed,
        ];
        let story = tell(&Journey::new(hops), &ctx());
        assert!(
            matches!(story.verdict.outcome, Outcome::Delivered { ref node, .. } if node == "node-1"),
            "{:?}",
            story.verdict
        );
        assert!(
            story
                .verdict
                .summary
                .contains("a raw socket, as ping(8) opens"),
            "{}",
            story.verdict.summary
        );
    }

    #[test]
    fn an_encapsulated_packet_no_vxlan_socket_took_is_a_drop_on_the_path() {
        // node-2's VXLAN device is down: nothing listens on its UDP port.
        let inner = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
        let outer = frames::vxlan(&inner, 1);
        let mut journey = cross_node_flannel();
        journey.hops.truncate(5);
        let mut freed = drop_hop(9_500, "node-2", "eth0", &outer, "NO_SOCKET");
        freed.drop.as_mut().unwrap().location = "__udp4_lib_rcv+0x9a".into();
        journey.hops.push(freed);
        let story = tell(&journey, &ctx());
        assert!(
            matches!(story.verdict.outcome, Outcome::Dropped { .. }),
            "{:?}",
            story.verdict
        );
    }

    #[test]
    fn a_drop_on_the_way_or_by_the_sender_stays_a_drop() {
        for (flags, reason, location, by_socket) in [
            (FIN_ACK, "IP_INHDR", "ip_rcv_core+0x1b0", false),
            (FIN_ACK, "NETFILTER_DROP", "nf_hook_slow+0x9c", false),
            (FIN_ACK, "NOT_SPECIFIED", "tcp_v4_rcv+0x5d", true),
            (FIN_ACK, "TCP_CSUM", "tcp_v4_rcv+0x5d", false),
            (FIN_ACK, "SOCKET_RCVBUFF", "tcp_data_queue+0x4c", false),
            // Nothing listens: a refusal, not a teardown.
            (0x02, "NO_SOCKET", "tcp_v4_rcv+0x1f2", false),
        ] {
            let story = segment_freed_on_node_2(flags, reason, location, by_socket);
            assert!(
                matches!(story.verdict.outcome, Outcome::Dropped { .. }),
                "{reason}: {:?}",
                story.verdict
            );
        }
    }

    #[test]
    fn a_packet_sent_to_a_traced_node_did_not_leave_the_traced_nodes() {
        let mut ctx = ctx();
        let node_2 = ctx.nodes.get_mut("node-2").unwrap();
        node_2.view.addresses = vec![(2, "192.0.2.12".parse().unwrap())];
        let at_src = frames::icmp_echo([10, 244, 1, 2], [192, 0, 2, 12], 64, 1);
        let routed = frames::icmp_echo([10, 244, 1, 2], [192, 0, 2, 12], 63, 1);
        let mut hops = vec![
            hop(1_000, "node-1", "vethA", Role::PodVeth, Ingress, &at_src),
            hop(4_000, "node-1", "eth0", Role::Underlay, Egress, &routed),
        ];
        let story = tell(&Journey::new(hops.clone()), &ctx);
        assert!(
            matches!(story.verdict.outcome, Outcome::Vanished { .. }),
            "{:?}",
            story.verdict
        );
        assert!(
            story.verdict.summary.ends_with(
                "; it was sent toward node-2 (192.0.2.12), which is traced and never saw it arrive"
            ),
            "{}",
            story.verdict.summary
        );
        // Seen arriving: node-2's own stack took it.
        hops.push(hop(
            9_000,
            "node-2",
            "eth0",
            Role::Underlay,
            Ingress,
            &routed,
        ));
        let story = tell(&Journey::new(hops), &ctx);
        assert_eq!(
            story.verdict.outcome,
            Outcome::Delivered {
                node: "node-2".into(),
                iface: "eth0".into()
            }
        );
        assert_eq!(
            story.verdict.summary,
            "delivered to node-2's own address 192.0.2.12 via eth0, to its own stack; routed, 8 µs end to end"
        );
    }

    /// web-0's SYN to a ClusterIP and the same SYN DNATed to db-0, with
    /// conntrack's entry for it learnt as db-0's addresses were traced
    /// everywhere from `traced_from_ns`.
    fn dnat_to_db_0_learnt(traced_from_ns: u64) -> (Context, Vec<u8>, Vec<u8>) {
        let mut ctx = ctx();
        let entry = crate::model::conntrack::Entry {
            orig: nat::tests::tuple([10, 244, 1, 2], [10, 96, 7, 8], 40000, 80),
            reply: nat::tests::tuple([10, 244, 2, 2], [10, 244, 1, 2], 8080, 40000),
            status: 1 << 5,
            zone: 0,
            mark: 0,
        };
        ctx.nat.learn_connection(&entry, |_| None, traced_from_ns);
        let sent = frames::tcp_syn([10, 244, 1, 2], [10, 96, 7, 8], 40000, 80);
        let dnatted = frames::tcp_syn([10, 244, 1, 2], [10, 244, 2, 2], 40000, 8080);
        (ctx, sent, dnatted)
    }

    /// web-0's packet to a ClusterIP, DNATed on node-1 to db-0 on
    /// node-2 and last seen leaving node-1, with conntrack's entry for
    /// the connection learnt as db-0's addresses were traced everywhere
    /// from `traced_from_ns`.
    fn translated_toward_node_2(traced_from_ns: u64) -> Story {
        let (ctx, sent, dnatted) = dnat_to_db_0_learnt(traced_from_ns);
        let hops = vec![
            hop(1_000, "node-1", "vethA", Role::PodVeth, Ingress, &sent),
            hop(2_000, "node-1", "cni0", Role::Bridge, Ingress, &dnatted),
            hop(4_000, "node-1", "eth0", Role::Underlay, Egress, &dnatted),
        ];
        tell(&Journey::new(hops), &ctx)
    }

    /// A SYN to a ClusterIP DNATed on node-1 while its connection was
    /// being learnt: node-1's hooks after the DNAT did not trace it, and
    /// node-2's did. `with_node_1_egress` adds node-1's flannel.1 egress.
    fn dnatted_in_flight(with_node_1_egress: bool) -> Story {
        let (ctx, sent, dnatted) = dnat_to_db_0_learnt(3_000);
        let mut hops = vec![
            hop(1_000, "node-1", "vethA", Role::PodVeth, Ingress, &sent),
            hop(1_500, "node-1", "cni0", Role::Bridge, Ingress, &sent),
        ];
        if with_node_1_egress {
            hops.push(hop(
                2_000,
                "node-1",
                "flannel.1",
                Role::Tunnel,
                Egress,
                &dnatted,
            ));
        }
        let outer = frames::vxlan(&dnatted, 1);
        hops.extend([
            hop(5_000, "node-2", "eth0", Role::Underlay, Ingress, &outer),
            hop(
                5_500,
                "node-2",
                "flannel.1",
                Role::Tunnel,
                Ingress,
                &dnatted,
            ),
            hop(6_500, "node-2", "vethB", Role::PodVeth, Egress, &dnatted),
        ]);
        tell(&Journey::new(hops), &ctx)
    }

    #[test]
    fn a_translation_between_two_nodes_hops_is_told_on_the_earlier_node_out_of_sight() {
        let story = dnatted_in_flight(false);
        assert!(matches!(story.verdict.outcome, Outcome::Delivered { .. }));
        let (hop, step) = story
            .hops
            .iter()
            .find_map(|h| h.nat.first().map(|s| (h, s)))
            .expect("a DNAT step");
        assert_eq!((&*hop.node, &*hop.iface), ("node-2", "eth0"));
        let sight = step.out_of_sight.as_ref().expect("out of sight");
        assert_eq!(sight.node.as_deref(), Some("node-1"));
        assert_eq!(sight.after_hop, "node-1 cni0 ingress");
        let summary = &story.verdict.summary;
        assert!(
            summary.contains(
                "DNAT 10.96.7.8:80 → 10.244.2.2:8080 on node-1, out of sight (its hooks after node-1 cni0 ingress did not trace this packet)"
            ),
            "{summary}"
        );
        assert!(!summary.contains("on node-2 (seen at"), "{summary}");
        assert!(hop.note.contains("out of sight"), "{}", hop.note);

        // Seen on node-1 after the DNAT: told where it was seen.
        let story = dnatted_in_flight(true);
        let (hop, step) = story
            .hops
            .iter()
            .find_map(|h| h.nat.first().map(|s| (h, s)))
            .expect("a DNAT step");
        assert_eq!((&*hop.node, &*hop.iface), ("node-1", "flannel.1"));
        assert_eq!(step.out_of_sight, None);
        assert!(
            story
                .verdict
                .summary
                .contains("on node-1 (seen at flannel.1 egress)"),
            "{}",
            story.verdict.summary
        );
    }

    /// The DNAT on the third hop is placed on no node, between `between`.
    fn told_out_of_sight_between(story: &Story, between: &str) {
        let step = story.hops[2].nat.first().expect("the DNAT step");
        let sight = step.out_of_sight.as_ref().expect("out of sight");
        assert_eq!(sight.node, None);
        let summary = &story.verdict.summary;
        assert!(summary.contains(between), "{summary}");
    }

    #[test]
    fn a_translation_after_a_packet_left_its_node_is_not_pinned_on_that_node() {
        // Seen leaving node-1 untranslated (its netfilter behind it) and
        // arriving translated on node-2: done on the way, by either.
        let (ctx, sent, dnatted) = dnat_to_db_0_learnt(3_000);
        let hops = vec![
            hop(1_000, "node-1", "vethA", Role::PodVeth, Ingress, &sent),
            hop(
                2_000,
                "node-1",
                "eth0",
                Role::Underlay,
                Egress,
                &frames::vxlan(&sent, 1),
            ),
            hop(
                5_000,
                "node-2",
                "eth0",
                Role::Underlay,
                Ingress,
                &frames::vxlan(&dnatted, 1),
            ),
            hop(6_500, "node-2", "vethB", Role::PodVeth, Egress, &dnatted),
        ];
        told_out_of_sight_between(
            &tell(&Journey::new(hops), &ctx),
            "out of sight between node-1 eth0 egress and node-2 eth0 ingress",
        );
    }

    #[test]
    fn a_translation_while_a_packet_was_away_from_its_node_is_not_told_on_that_node() {
        // A hairpin: seen leaving node-1 by eth0 untranslated and arriving
        // back at node-1's eth0 translated, another node (untraced) in
        // between. node-1's netfilter was behind it, then still ahead.
        let (ctx, sent, dnatted) = dnat_to_db_0_learnt(500);
        let hops = vec![
            hop(1_000, "node-1", "vethA", Role::PodVeth, Ingress, &sent),
            hop(2_000, "node-1", "eth0", Role::Underlay, Egress, &sent),
            hop(5_000, "node-1", "eth0", Role::Underlay, Ingress, &dnatted),
        ];
        told_out_of_sight_between(
            &tell(&Journey::new(hops), &ctx),
            "out of sight between node-1 eth0 egress and node-1 eth0 ingress",
        );
        // Within one node (bridge up, then out): told on that node.
        let hops = vec![
            hop(1_000, "node-1", "vethA", Role::PodVeth, Ingress, &sent),
            hop(2_000, "node-1", "eth0", Role::Underlay, Egress, &dnatted),
        ];
        let story = tell(&Journey::new(hops), &ctx);
        assert_eq!(story.hops[1].nat.first().unwrap().out_of_sight, None);
    }

    #[test]
    fn a_packet_translated_while_its_translation_was_learnt_is_not_lost() {
        // Node-2 began tracing db-0's addresses after the packet left
        // node-1: its missing hops there are no loss.
        let story = translated_toward_node_2(6_000);
        assert!(
            matches!(
                story.verdict.outcome,
                Outcome::TranslatedOutOfSight {
                    in_flight: true,
                    ..
                }
            ),
            "{:?}",
            story.verdict
        );
        assert!(
            story.verdict.summary.starts_with("translated by conntrack (DNAT 10.96.7.8:80 → 10.244.2.2:8080), last seen on node-1 eth0 egress: podtrace learnt the translation from conntrack while this packet was in flight"),
            "{}",
            story.verdict.summary
        );
        // Traced everywhere before it was sent: it is lost.
        let story = translated_toward_node_2(500);
        assert!(
            matches!(story.verdict.outcome, Outcome::Vanished { .. }),
            "{:?}",
            story.verdict
        );
    }

    #[test]
    fn a_reply_un_snatted_toward_an_outside_client_left_the_node() {
        // A NodePort's reply: db-0 answers the MASQUERADE address (node-1's
        // bridge, in its pod subnet), un-SNATed and un-DNATed on node-1 to
        // the outside client it leaves toward.
        let mut ctx = ctx();
        ctx.nodes.insert(
            "node-1".into(),
            crate::node::NodeFacts {
                local_pod_subnets: vec!["10.244.1.0/24".parse().unwrap()],
                ..Default::default()
            },
        );
        let mut answered = frames::tcp_syn([10, 244, 1, 2], [10, 244, 1, 1], 8080, 12038);
        let mut restored = frames::tcp_syn([192, 0, 2, 11], [192, 0, 2, 1], 30080, 51442);
        for frame in [&mut answered, &mut restored] {
            frame[14 + 20 + 13] = 0x12;
        }
        let hops = vec![
            hop(1_000, "node-1", "vethA", Role::PodVeth, Ingress, &answered),
            hop(2_000, "node-1", "cni0", Role::Bridge, Ingress, &answered),
            hop(3_000, "node-1", "eth0", Role::Underlay, Egress, &restored),
        ];
        let story = tell(&Journey::new(hops), &ctx);
        assert_eq!(
            story.verdict.outcome,
            Outcome::LeftNode {
                node: "node-1".into(),
                iface: "eth0".into(),
                toward: "192.0.2.1".parse().unwrap()
            },
            "{}",
            story.verdict.summary
        );
        assert!(
            story
                .verdict
                .summary
                .starts_with("left node-1 via eth0 toward 192.0.2.1 (beyond the traced nodes)"),
            "{}",
            story.verdict.summary
        );
    }

    #[test]
    fn same_node_pods_are_bridged() {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 1, 3], 64, 1);
        let hops = vec![
            hop(0, "node-1", "vethA", Role::PodVeth, Ingress, &frame),
            hop(800, "node-1", "vethC", Role::PodVeth, Egress, &frame),
        ];
        let story = tell(&Journey::new(hops), &ctx());
        assert_eq!(story.verdict.path, [PathStep::Bridged]);
        assert!(matches!(story.verdict.outcome, Outcome::Delivered { .. }));
    }
}
