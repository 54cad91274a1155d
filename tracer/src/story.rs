//! From a journey to its story: what happened at each hop, and the verdict.
//! Pure; rendering (text or JSON) is elsewhere.

use std::{collections::HashMap, net::Ipv4Addr};

use ipnet::Ipv4Net;
use serde::Serialize;

use crate::{
    decode::{Decoded, Transport, Tunnel, TunnelKind},
    explain::{explain, NodeFacts, NodeSubnet, RouteCheck},
    interfaces::Role,
    journey::{Direction, DropInfo, Hop, Journey, KernelRoute},
    netfilter::NetfilterRule,
};

/// What podtrace knows about the traced part of the cluster.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// Labels for addresses: pods ("default/web-0") and nodes ("node-1").
    pub names: HashMap<Ipv4Addr, String>,
    /// Pod subnets delivered locally (via a bridge or pod veth) by one of
    /// the traced nodes: a packet heading there must show up again.
    pub traced_destinations: Vec<Ipv4Net>,
    /// What each traced node looked like at start, by node name.
    pub nodes: HashMap<String, NodeFacts>,
    /// Every node's pod subnet (`--nodes-file`).
    pub subnets: Vec<NodeSubnet>,
    /// The cluster's pod CIDRs (`--pod-cidr`).
    pub pod_cidrs: Vec<Ipv4Net>,
}

impl Context {
    pub fn label(&self, ip: Ipv4Addr) -> String {
        match self.names.get(&ip) {
            Some(name) => format!("{ip} ({name})"),
            None => ip.to_string(),
        }
    }

    fn expects_arrival(&self, dst: Ipv4Addr) -> bool {
        self.traced_destinations
            .iter()
            .any(|net| net.contains(&dst))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HopLine {
    /// Microseconds since the journey's first hop.
    pub t_us: f64,
    pub node: String,
    pub iface: String,
    pub role: Role,
    pub direction: Direction,
    pub skb_len: u32,
    pub ttl: u8,
    pub mark: u32,
    pub tunnel: Option<Tunnel>,
    /// The kernel's route for the packet, asked at this hook (ingress).
    pub route: Option<KernelRoute>,
    pub note: String,
}

/// How the packet travelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathStep {
    Bridged,
    Routed,
    Encapsulated,
    Decapsulated,
}

/// Where the packet's journey ended, as far as the traced nodes can see.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Sent out of the destination pod's host-side veth.
    Delivered { node: String, iface: String },
    /// Left the traced nodes through the underlay, toward an untraced node.
    LeftNode {
        node: String,
        iface: String,
        toward: Ipv4Addr,
    },
    /// The node had no route for the destination's pods: the route it
    /// needed, the one it used, and what became of the packet.
    NoRoute {
        check: RouteCheck,
        then: Box<Outcome>,
    },
    /// Freed by the kernel with a drop reason, and seen nowhere after.
    Dropped {
        node: String,
        iface: String,
        reason: String,
        location: String,
    },
    /// Seen at a hook, and never at the next one expected.
    Vanished {
        node: String,
        iface: String,
        direction: Direction,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    #[serde(flatten)]
    pub outcome: Outcome,
    pub path: Vec<PathStep>,
    /// First to last hop, in microseconds.
    pub latency_us: f64,
    pub summary: String,
    /// For a netfilter drop: the rule, from nftables tracing.
    pub netfilter: Option<NetfilterRule>,
    /// For a netfilter drop whose rule is not named: the hook, as far as
    /// the packet tells (FORWARD when the node had routed it).
    pub netfilter_hook: Option<String>,
    /// What on the node explains the outcome (forwarding off, a veth
    /// without its bridge, an MTU too small, …).
    pub hint: Option<String>,
}

/// The reason name of a drop by an iptables / nftables verdict.
pub const NETFILTER_DROP: &str = "NETFILTER_DROP";

impl Story {
    /// Whether the packet was dropped by a netfilter rule.
    pub fn netfilter_drop(&self) -> bool {
        matches!(&self.verdict.outcome, Outcome::Dropped { reason, .. } if reason == NETFILTER_DROP)
    }

    /// Names the netfilter rule that dropped the packet, or says why it
    /// cannot be named.
    pub fn name_rule(&mut self, rule: Option<&NetfilterRule>, why_unnamed: &str) {
        match rule {
            Some(rule) => {
                self.verdict.summary.push_str(&format!(
                    "; by table {} chain {} (hook {}): {}",
                    rule.table, rule.chain, rule.hook, rule.rule
                ));
                self.verdict.netfilter = Some(rule.clone());
            }
            None => {
                let hook = self.netfilter_hook();
                self.verdict.summary.push_str(&format!(
                    "; dropped by netfilter at hook {hook}; the rule is not named: {why_unnamed}"
                ));
                self.verdict.netfilter_hook = Some(hook.to_string());
            }
        }
    }

    /// The netfilter hook of a drop, from the packet alone: routed on the
    /// dropping node (TTL lower than when it arrived there) means FORWARD.
    fn netfilter_hook(&self) -> &'static str {
        let Some(last) = self.hops.last() else {
            return "unknown";
        };
        let arrived = self.hops.iter().find(|h| h.node == last.node);
        match arrived {
            Some(first) if last.ttl < first.ttl => "FORWARD",
            Some(first) if first.direction == Direction::Egress => "OUTPUT or POSTROUTING",
            _ => "PREROUTING or INPUT",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Story {
    pub packet: String,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub src_name: Option<String>,
    pub dst_name: Option<String>,
    pub transport: Transport,
    pub ip_id: u16,
    pub hops: Vec<HopLine>,
    /// Frees after delivery (the pod's own stack, e.g. NO_SOCKET for a ping
    /// reply that only a raw socket wanted): not drops on the path.
    pub freed_after_delivery: Vec<DropInfo>,
    pub verdict: Verdict,
}

pub fn tell(journey: &Journey, ctx: &Context) -> Story {
    let (journey, freed_after_delivery) = split_after_delivery(journey);
    let journey = &journey;
    let first = &journey.hops[0];
    let start = first.ktime_ns;
    let packet = first.packet.packet;
    let hops = journey
        .hops
        .iter()
        .enumerate()
        .map(|(i, hop)| HopLine {
            t_us: micros(hop.ktime_ns - start),
            node: hop.node.clone(),
            iface: hop.iface.clone(),
            role: hop.role,
            direction: hop.direction,
            skb_len: hop.skb_len,
            ttl: hop.packet.packet.ttl,
            mark: hop.mark,
            tunnel: hop.packet.tunnel,
            route: hop.route.clone(),
            note: note(hop, i.checked_sub(1).map(|p| &journey.hops[p]), ctx),
        })
        .collect();
    Story {
        packet: describe_packet(&first.packet),
        src: packet.src,
        dst: packet.dst,
        src_name: ctx.names.get(&packet.src).cloned(),
        dst_name: ctx.names.get(&packet.dst).cloned(),
        transport: packet.transport,
        ip_id: packet.ip_id,
        hops,
        freed_after_delivery,
        verdict: judge(journey, ctx),
    }
}

fn micros(ns: u64) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

fn describe_packet(d: &Decoded) -> String {
    let p = &d.packet;
    match p.transport {
        Transport::Icmp {
            icmp_type: 8,
            id,
            seq,
            ..
        } => format!("ICMP echo request id {id} seq {seq}"),
        Transport::Icmp {
            icmp_type: 0,
            id,
            seq,
            ..
        } => format!("ICMP echo reply id {id} seq {seq}"),
        Transport::Icmp {
            icmp_type, code, ..
        } => format!("ICMP type {icmp_type} code {code}"),
        Transport::Tcp {
            sport,
            dport,
            flags,
            ..
        } => {
            format!("TCP {sport} → {dport} [{}]", tcp_flags(flags))
        }
        Transport::Udp { sport, dport } => format!("UDP {sport} → {dport}"),
        Transport::Other { number } => format!("IP protocol {number}"),
    }
}

fn tcp_flags(flags: u8) -> String {
    const NAMES: [(u8, &str); 6] = [
        (0x02, "SYN"),
        (0x10, "ACK"),
        (0x01, "FIN"),
        (0x04, "RST"),
        (0x08, "PSH"),
        (0x20, "URG"),
    ];
    let set: Vec<_> = NAMES
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    set.join(",")
}

fn tunnel_text(t: &Tunnel) -> String {
    let kind = match t.kind {
        TunnelKind::Vxlan => "VXLAN",
        TunnelKind::Geneve => "Geneve",
        TunnelKind::Ipip => "IPIP",
    };
    let vni = t.vni.map(|v| format!(" VNI {v}")).unwrap_or_default();
    match t.outer.transport {
        Transport::Udp { sport, dport } => {
            format!(
                "{kind}{vni} {}:{sport} → {}:{dport}",
                t.outer.src, t.outer.dst
            )
        }
        _ => format!("{kind} {} → {}", t.outer.src, t.outer.dst),
    }
}

/// What happened at `hop`, given the hop before it.
fn note(hop: &Hop, prev: Option<&Hop>, ctx: &Context) -> String {
    let p = &hop.packet.packet;
    let ttl_drop = prev
        .map(|prev| prev.packet.packet.ttl)
        .filter(|before| *before > p.ttl)
        .map(|before| format!("routed (TTL {before}→{})", p.ttl));
    let what = match (hop.role, hop.direction, &hop.packet.tunnel) {
        (_, Direction::Drop, _) => match &hop.drop {
            Some(d) if d.by_socket => format!(
                "dropped before it had an IP header (matched by its socket): {} in {}",
                d.reason, d.location
            ),
            Some(d) => format!("dropped: {} in {}", d.reason, d.location),
            None => "dropped".to_string(),
        },
        (_, Direction::Egress, Some(t)) => {
            let added = t.outer.total_len.saturating_sub(p.total_len);
            format!("encapsulated {} (+{added} B)", tunnel_text(t))
        }
        (_, Direction::Ingress, Some(t)) => {
            let from = ctx
                .names
                .get(&t.outer.src)
                .map(|n| format!(" from {n}"))
                .unwrap_or_default();
            format!("arrives encapsulated{from}: {}", tunnel_text(t))
        }
        (Role::Tunnel, Direction::Ingress, None) => "decapsulated".to_string(),
        (Role::Tunnel, Direction::Egress, None) => "into the tunnel device".to_string(),
        (Role::PodVeth, Direction::Ingress, None) => format!("sent by {}", ctx.label(p.src)),
        (Role::PodVeth, Direction::Egress, None) => format!("handed to {}", ctx.label(p.dst)),
        (Role::Bridge, Direction::Ingress, None) => "bridge up to the host stack".to_string(),
        (Role::Bridge, Direction::Egress, None) => "host stack down to the bridge".to_string(),
        (Role::Underlay, Direction::Egress, None) => "leaves the node unencapsulated".to_string(),
        (Role::Underlay, Direction::Ingress, None) => "arrives unencapsulated".to_string(),
        (Role::Other, _, None) => "seen".to_string(),
    };
    let what = match &hop.route {
        Some(route) if route.found() => {
            let via = route.via.map(|v| format!(" via {v}")).unwrap_or_default();
            let dev = route.dev.as_deref().unwrap_or("?");
            format!("{what}; kernel route{via} dev {dev}")
        }
        Some(route) => format!("{what}; kernel route lookup: {}", route.result),
        None => what,
    };
    match ttl_drop {
        Some(routed) => format!("{routed}, {what}"),
        None => what,
    }
}

/// Moves drops that follow delivery out of the path.
fn split_after_delivery(journey: &Journey) -> (Journey, Vec<DropInfo>) {
    let mut path = journey.clone();
    let mut freed = Vec::new();
    if let Some(delivered) = journey.delivered_at() {
        let mut i = delivered + 1;
        while i < path.hops.len() {
            if path.hops[i].direction == Direction::Drop {
                freed.extend(path.hops.remove(i).drop);
            } else {
                i += 1;
            }
        }
    }
    (path, freed)
}

fn judge(journey: &Journey, ctx: &Context) -> Verdict {
    let hops = &journey.hops;
    let first = &hops[0];
    let last = &hops[hops.len() - 1];
    let dst = first.packet.packet.dst;

    let mut path = Vec::new();
    let routed = hops
        .windows(2)
        .any(|w| w[1].packet.packet.ttl < w[0].packet.packet.ttl);
    let encap = hops.iter().position(|h| h.packet.tunnel.is_some());
    let decap = encap.and_then(|at| hops[at..].iter().position(|h| h.packet.tunnel.is_none()));
    if routed {
        path.push(PathStep::Routed);
    }
    if encap.is_some() {
        path.push(PathStep::Encapsulated);
    }
    if decap.is_some() {
        path.push(PathStep::Decapsulated);
    }

    let delivered = journey.delivered_at() == Some(hops.len() - 1);
    if delivered && path.is_empty() {
        path.push(PathStep::Bridged);
    }
    let outcome = if let (Direction::Drop, Some(drop)) = (last.direction, &last.drop) {
        Outcome::Dropped {
            node: last.node.clone(),
            iface: last.iface.clone(),
            reason: drop.reason.clone(),
            location: drop.location.clone(),
        }
    } else if delivered {
        Outcome::Delivered {
            node: last.node.clone(),
            iface: last.iface.clone(),
        }
    } else if last.role == Role::Underlay
        && last.direction == Direction::Egress
        && !ctx.expects_arrival(dst)
    {
        let toward = last.packet.tunnel.map_or(dst, |t| t.outer.dst);
        Outcome::LeftNode {
            node: last.node.clone(),
            iface: last.iface.clone(),
            toward,
        }
    } else {
        Outcome::Vanished {
            node: last.node.clone(),
            iface: last.iface.clone(),
            direction: last.direction,
        }
    };

    let explanation = explain(hops, &ctx.nodes, &ctx.subnets, &ctx.pod_cidrs);
    let outcome = match explanation.no_route {
        Some(check) => Outcome::NoRoute {
            check,
            then: Box::new(outcome),
        },
        None => outcome,
    };
    let latency_us = micros(last.ktime_ns - first.ktime_ns);
    let how = path
        .iter()
        .map(|step| match step {
            PathStep::Bridged => "bridged".to_string(),
            PathStep::Routed => "routed".to_string(),
            PathStep::Encapsulated => {
                let t = hops[encap.unwrap_or(0)].packet.tunnel;
                t.map_or("encapsulated".to_string(), |t| {
                    format!("encapsulated ({})", tunnel_text(&t))
                })
            }
            PathStep::Decapsulated => "decapsulated".to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let how = if how.is_empty() {
        String::new()
    } else {
        format!("; {how}")
    };
    let mut summary = match &outcome {
        Outcome::NoRoute { check, then } => format!(
            "no route on {} to {}: expected {}; the kernel used {}{}",
            check.node,
            ctx.label(dst),
            check.expected,
            check.used,
            match then.as_ref() {
                Outcome::Dropped { node, reason, .. } =>
                    format!(" (then dropped on {node}: {reason})"),
                Outcome::LeftNode { node, iface, .. } =>
                    format!(" (the packet left {node} by {iface})"),
                _ => String::new(),
            }
        ),
        Outcome::Delivered { node, iface } => {
            format!(
                "delivered to {} on {node} via {iface}{how}, {latency_us} µs end to end",
                ctx.label(dst)
            )
        }
        Outcome::LeftNode {
            node,
            iface,
            toward,
        } => format!(
            "left {node} via {iface} toward {} (that node is not traced){how}",
            ctx.label(*toward)
        ),
        Outcome::Dropped {
            node,
            iface,
            reason,
            location,
        } => {
            format!("dropped on {node} at {iface}: {reason} in {location}{how}")
        }
        Outcome::Vanished {
            node,
            iface,
            direction,
        } => {
            let dir = direction.label();
            format!("vanished: last seen on {node} {iface} {dir}, never at the next hook{how}")
        }
    };
    if let Some(hint) = &explanation.hint {
        summary.push_str(&format!("; {hint}"));
    }
    Verdict {
        outcome,
        path,
        latency_us,
        summary,
        netfilter: None,
        netfilter_hook: None,
        hint: explanation.hint,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        decode::tests as frames,
        journey::{tests::hop, Direction::*},
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
        Journey {
            key: crate::journey::PacketKey::of(&hops[0].packet),
            hops,
        }
    }

    pub(crate) fn sample_story() -> Story {
        tell(&cross_node_flannel(), &ctx())
    }

    fn ctx() -> Context {
        let mut ctx = Context::default();
        ctx.names
            .insert("10.244.2.2".parse().unwrap(), "default/db-0".into());
        ctx.traced_destinations
            .push("10.244.2.0/24".parse().unwrap());
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

    fn drop_hop(t: u64, node: &str, iface: &str, frame: &[u8], reason: &str) -> Hop {
        crate::journey::tests::drop_hop(t, node, iface, Role::Other, frame, reason)
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

    #[test]
    fn same_node_pods_are_bridged() {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 1, 3], 64, 1);
        let hops = vec![
            hop(0, "node-1", "vethA", Role::PodVeth, Ingress, &frame),
            hop(800, "node-1", "vethC", Role::PodVeth, Egress, &frame),
        ];
        let story = tell(
            &Journey {
                key: crate::journey::PacketKey::of(&hops[0].packet),
                hops,
            },
            &ctx(),
        );
        assert_eq!(story.verdict.path, [PathStep::Bridged]);
        assert!(matches!(story.verdict.outcome, Outcome::Delivered { .. }));
    }
}
