//! Why a packet died, in the operator's terms: the route that was missing
//! (as `route -n` shows it), forwarding switched off, a veth without its
//! bridge, a VXLAN device without a forwarding entry, an MTU too small.
//! Pure: it reads the journey and the facts podtrace gathered at start.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::Ipv4Net;
use serde::Serialize;

use crate::{
    cni,
    decode::{
        hop::{Direction, Hop},
        Transport,
    },
    model::NodeSubnet,
    node::{
        interfaces::Role,
        route::table_name,
        rules::{Decision, RuleAction},
        NodeFacts, RouteKind,
    },
    story::{
        journey,
        traced_subnets::{every_remote_subnet, traced_subnet, traced_subnet6},
    },
};

/// The route the packet needed, and the one the kernel used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct RouteCheck {
    pub node: String,
    pub expected: String,
    pub used: String,
    /// The used route's gateway: where a packet that left by it went.
    #[serde(skip)]
    pub used_gateway: Option<IpAddr>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Explanation {
    pub no_route: Option<RouteCheck>,
    pub hint: Option<String>,
    /// For a packet lost past a WireGuard device: what the receiving
    /// node's WireGuard configuration says of it.
    pub wireguard: Option<super::wireguard::WireguardProof>,
}

/// Reasons the kernel gives when the next hop never answered ARP.
const NEIGHBOUR_REASONS: &[&str] = &["NEIGH_FAILED", "NEIGH_QUEUEFULL", "NEIGH_DEAD"];

/// The next hop the packet waited for: the gateway the kernel named when
/// podtrace asked it on this node, else the route's, else the destination
/// itself (on-link).
fn next_hop(hops: &[Hop], facts: &NodeFacts) -> IpAddr {
    let last = &hops[hops.len() - 1];
    // The packet as the dropping device carried it: an encapsulated one's
    // outer header (the underlay asks ARP for the other node's address,
    // not for the tunnel's gateway), else the packet after any
    // translation on the way (a Service's DNAT), which a lookup made
    // before it (tc ingress runs before PREROUTING) did not know of.
    let dst = last
        .packet
        .tunnel
        .map_or(last.packet.packet.dst, |t| t.outer.dst);
    let asked = hops
        .iter()
        .rev()
        .filter(|h| h.node == last.node)
        .find_map(|h| {
            let route = h.route.as_ref()?;
            let same_device = route.dev.as_deref() == Some(&*last.iface);
            (same_device && h.packet.packet.dst == dst).then_some(route)
        });
    match asked {
        // A route without a gateway: the destination is the neighbour.
        Some(route) => route.via.unwrap_or(dst),
        None => facts
            .view
            .route_to(dst)
            .and_then(|r| r.gateway)
            .unwrap_or(dst),
    }
}

/// A next hop that never answered ARP (NDP), or why that is the route's
/// fault.
fn no_neighbour_reply(reason: &str, hops: &[Hop], facts: &NodeFacts) -> String {
    let last = &hops[hops.len() - 1];
    let next_hop = next_hop(hops, facts);
    let state = if reason == "NEIGH_QUEUEFULL" {
        "its queue was full"
    } else {
        "neighbour FAILED"
    };
    let why = off_subnet(next_hop, &last.iface, facts)
        .unwrap_or_else(|| "the next hop is gone or does not answer".into());
    let asked_by = if next_hop.is_ipv6() {
        "neighbour discovery (NDP)"
    } else {
        "ARP"
    };
    format!(
        "no {asked_by} reply from {next_hop} on {} ({state}): {why}",
        last.iface
    )
}

/// Why a failed neighbour is the route's fault rather than the next
/// hop's: a gateway no route of any table reaches directly (a route
/// `onlink` to an address on another subnet) is asked for by ARP on a
/// link where no such host is, however alive it is. Every table's: a
/// policy-routed CNI (AWS VPC) keeps a secondary interface's subnet in
/// its own table.
fn off_subnet(next_hop: IpAddr, dev: &str, facts: &NodeFacts) -> Option<String> {
    let link_local = matches!(next_hop, IpAddr::V6(v6) if v6.is_unicast_link_local());
    let on_a_subnet = facts.view.routes.iter().any(|r| {
        r.kind == RouteKind::Unicast
            && r.gateway.is_none()
            && r.destination.prefix_len() > 0
            && r.destination.contains(&next_hop)
    });
    if link_local || on_a_subnet {
        return None;
    }
    Some(format!(
        "{next_hop} is on none of this node's subnets: the route reaches it onlink, so it is asked for on {dev}, where no such host answers, alive or not: the route is wrong (across subnets, the overlay's tunnel or a router reaches it: ip route get {next_hop})"
    ))
}

/// Reasons the kernel gives when it has no route.
const NO_ROUTE_REASONS: &[&str] = &["IP_INNOROUTES", "IP_OUTNOROUTES"];

pub fn explain(
    hops: &[Hop],
    nodes: &HashMap<String, NodeFacts>,
    subnets: &[NodeSubnet],
    pod_cidrs: &[Ipv4Net],
) -> Explanation {
    if hops.is_empty() {
        return Explanation::default();
    }
    if let Some(check) = missing_route(hops, nodes, subnets, pod_cidrs) {
        return Explanation {
            no_route: Some(check),
            hint: None,
            wireguard: None,
        };
    }
    if let Some(hint) = hint(hops, nodes).or_else(|| tunnel_nobody_took(hops)) {
        return Explanation {
            hint: Some(hint),
            ..Explanation::default()
        };
    }
    let (hint, wireguard) = super::wireguard::lost_after_encryption(hops, nodes, subnets).unzip();
    Explanation {
        no_route: None,
        hint,
        wireguard: wireguard.flatten(),
    }
}

/// No route: the kernel said so, or the packet for another node's pods
/// left a node by its default route, unencapsulated.
fn missing_route(
    hops: &[Hop],
    nodes: &HashMap<String, NodeFacts>,
    subnets: &[NodeSubnet],
    pod_cidrs: &[Ipv4Net],
) -> Option<RouteCheck> {
    let last = hops.last()?;
    let dst = last.packet.packet.dst; // translated, as the node last saw it
    let reason = last.drop.as_ref().map(|d| d.reason.as_str());
    let left_by_default = hops.iter().rev().find_map(|h| {
        let leaves_plain = h.role == Role::Underlay
            && h.direction == Direction::Egress
            && h.packet.tunnel.is_none();
        // The route decision of the hops that leave plain only: every
        // story of a line-rate flow comes through here.
        if !leaves_plain {
            return None;
        }
        let facts = nodes.get(&*h.node)?;
        // A default route a rule of the CNI's chose (the AWS VPC CNI's
        // per-ENI table) is how it reaches other nodes' pods: the VPC
        // routes them.
        let decision = facts.view.decide(&h.flow());
        let by_main = decision.rule.is_some_and(|r| r.is_default());
        let route = decision.route?;
        (by_main && route.destination.prefix_len() == 0).then_some(h)
    });
    // ip_error frees a packet its route rejects (NOT_SPECIFIED, where no
    // reason is named): a no-route where the node's rules and tables
    // give it a reject route, or none.
    let rejected_here = || {
        let facts = nodes.get(&*last.node)?;
        let in_ip_error = ["ip_error", "ip6_pkt_"].iter().any(|f| {
            last.drop
                .as_ref()
                .is_some_and(|d| d.location.starts_with(f))
        });
        let decision = facts.view.decide(&last.flow());
        (in_ip_error && (decision.route.is_none() || decision.rejected().is_some())).then_some(last)
    };
    let dst_v4 = ipv4_of(dst);
    let dst_is_pod = dst_v4.is_some_and(|dst| {
        subnets.iter().any(|s| s.subnet.contains(&dst))
            || pod_cidrs.iter().any(|c| c.contains(&dst))
    }) || nodes.values().any(|facts| {
        facts.local_pod_subnets.iter().any(|n| n.contains(&dst))
            || dst_v4.is_some_and(|dst| {
                facts
                    .inferred_pod_cidr
                    .as_ref()
                    .is_some_and(|(c, _)| c.contains(&dst))
            })
    });
    let routing_hop = match (reason, left_by_default) {
        (Some(r), _) if NO_ROUTE_REASONS.contains(&r) => last,
        _ if rejected_here().is_some() => last,
        (_, Some(h)) if dst_is_pod => h,
        _ => return None,
    };
    let facts = nodes.get(&*routing_hop.node)?;
    let decision = facts.view.decide(&routing_hop.flow());
    let used_route = decision.route;
    let used = used_route.map_or("no route at all".to_string(), |r| facts.view.describe(r))
        + &decision.policy();
    Some(RouteCheck {
        node: routing_hop.node.to_string(),
        expected: match (policy_table(&decision), dst) {
            (Some((table, rule)), _) => format!(
                "a route to {dst} in table {}, where rule {rule} sends the packet",
                table_name(table)
            ),
            (None, IpAddr::V4(dst)) => {
                expected_route(dst, subnets, pod_cidrs, nodes, &routing_hop.node)
            }
            (None, IpAddr::V6(dst)) => expected_route6(dst, nodes, &routing_hop.node),
        },
        used,
        used_gateway: used_route.and_then(|r| r.gateway),
    })
}

/// The table a rule other than the kernel's own sent the packet to, and
/// that rule, where the lookup ended there without a usable route.
fn policy_table(decision: &Decision) -> Option<(u32, String)> {
    let rule = decision.rule.as_ref().filter(|r| !r.is_default())?;
    match rule.action {
        RuleAction::Lookup(table) if decision.rejected().is_some() => {
            Some((table, rule.to_string()))
        }
        _ => None,
    }
}

/// IP forwarding off where the packet came in: the whole node's
/// (`ip_forward`, which sets every interface's), or, where that is on
/// and the kernel's lookup still said forwarding_disabled, only that
/// interface's own `conf.<iface>.forwarding` (someone turned it off for
/// one device: checking ip_forward would show 1).
fn forwarding_off(last: &Hop, at: Option<&Hop>, node_forwards: bool, dst: IpAddr) -> String {
    let family = if dst.is_ipv6() { "ipv6" } else { "ipv4" };
    match at {
        // IPv6 forwards by the node's `all` switch (ip6_forward), which
        // ip_forward does not set: the facts read IPv4's alone.
        Some(hop) if dst.is_ipv6() => format!(
            "IPv6 forwarding is off on {node} (the kernel's route lookup at {iface} {dir} said forwarding_disabled): net.ipv6.conf.all.forwarding, or {iface}'s own, is 0, and IPv4's ip_forward does not forward IPv6; fix: sysctl -w net.ipv6.conf.all.forwarding=1",
            node = last.node,
            iface = hop.iface,
            dir = hop.direction.label(),
        ),
        Some(hop) if node_forwards => format!(
            "IP forwarding is off for {iface} on {node}: the kernel's route lookup at {iface} {dir} said forwarding_disabled, and net.ipv4.ip_forward was 1 when podtrace started, so net.{family}.conf.{iface}.forwarding is 0 (or ip_forward was turned off since); it does not route what arrives on {iface}; fix: sysctl -w net.{family}.conf.{iface}.forwarding=1",
            iface = hop.iface,
            node = last.node,
            dir = hop.direction.label(),
        ),
        Some(_) => format!(
            "IP forwarding is off on {} (net.ipv4.ip_forward = 0, and the kernel's route lookup said forwarding_disabled): it does not route pod traffic",
            last.node
        ),
        None => format!(
            "IP forwarding is off on {} (net.ipv4.ip_forward = 0): it does not route pod traffic",
            last.node
        ),
    }
}

/// What on the dropping node explains the drop.
fn hint(hops: &[Hop], nodes: &HashMap<String, NodeFacts>) -> Option<String> {
    let last = hops.last()?;
    // As the dropping node saw it: after any translation on the way.
    let dst = last.packet.packet.dst;
    let reason = last.drop.as_ref().map(|d| d.reason.as_str());
    // The kernel's own answer at ingress, where podtrace asked it: the
    // lookup judges the forwarding of the device the packet came in on.
    // The last such hop: a bridge's port (a pod's veth) is asked too,
    // but the kernel routes what arrives on the bridge by the bridge's.
    let forwarding_disabled_at = hops.iter().rev().find(|h| {
        h.node == last.node
            && h.route
                .as_ref()
                .is_some_and(|r| r.result == "forwarding_disabled")
    });
    let by_socket = last.drop.as_ref().is_some_and(|d| d.by_socket);
    match (reason, nodes.get(&*last.node)) {
        (Some(r), _) if by_socket && NO_ROUTE_REASONS.contains(&r) => Some(format!(
            "the sender {} has no route to {dst} in its own network namespace ({}): the packet never left it",
            hops[0].packet.packet.src, last.node
        )),
        (Some("IP_INADDRERRORS"), Some(facts))
            if !facts.forwarding || forwarding_disabled_at.is_some() =>
        {
            Some(forwarding_off(last, forwarding_disabled_at, facts.forwarding, dst))
        }
        // ip_forward's IP_INHDR is also its verdict on a TTL run out.
        (Some("IP_INHDR"), _) if ttl_ran_out(last) => {
            let ttl = if dst.is_ipv6() { "hop limit" } else { "TTL" };
            Some(format!(
                "the packet reached {} with {ttl} {}: no router forwards it further (the kernel answers ICMP time exceeded, as traceroute expects); the sender set it that low, or a routing loop used it up",
                last.node, last.packet.packet.ttl
            ))
        }
        // A netfilter drop is the rule's, whatever the veth hangs off.
        (Some(r), Some(facts)) if last.role == Role::PodVeth && r != journey::NETFILTER_DROP => {
            let veth = facts.view.link_named(&last.iface);
            let bridge = pod_bridge(facts)?;
            veth.filter(|l| l.controller.is_none()).map(|_| {
                let bridge = facts.view.link_named(&bridge).map_or(format!(" (there is no {bridge} on this node)"), |_| String::new());
                format!("{} is not attached to any bridge{bridge}: the pod's frames reach the host addressed to a bridge that is gone", last.iface)
            })
        }
        (Some("NO_TX_TARGET"), Some(facts)) if facts.view.link_named(&last.iface).is_some_and(|l| l.kind == "vxlan") => Some(format!(
            "{} has no forwarding entry (FDB) for the next hop's VTEP: the kernel does not know which node to send the encapsulated packet to (bridge fdb show dev {})",
            last.iface, last.iface
        )),
        // A VXLAN device asks no one on the wire: its CNI agent (flannel,
        // Felix) writes each other node's VTEP as a permanent neighbour
        // and FDB entry. A failed neighbour there is a missing entry, or a
        // route toward an address no node's VTEP has; not a dead peer.
        (Some(r), Some(facts))
            if matches!(r, "NEIGH_FAILED" | "NEIGH_DEAD")
                && facts.view.link_named(&last.iface).is_some_and(|l| l.kind == "vxlan") =>
        {
            let next_hop = next_hop(hops, facts);
            let dev = &last.iface;
            Some(format!(
                "{dev} has no neighbour entry for {next_hop} (neighbour FAILED): a VXLAN device's CNI agent writes one, permanent, for each other node's VTEP, with its FDB entry; none is there, or the route points at an address no node's VTEP has (ip neigh show dev {dev}; bridge fdb show dev {dev}; the route to {dst})"
            ))
        }
        (Some(r), Some(facts)) if NEIGHBOUR_REASONS.contains(&r) => {
            Some(no_neighbour_reply(r, hops, facts))
        }
        (Some("PKT_TOO_BIG"), Some(facts)) => facts.view.route_to(dst).and_then(|r| r.oif).and_then(|oif| facts.view.link(oif)).map(|dev| {
            // IPv6 has no DF bit: no router fragments it, only its sender.
            let unfragmentable = if dst.is_ipv6() { "IPv6, which routers never fragment" } else { "with DF set" };
            format!(
                "the packet is {} B {unfragmentable}; the route to {dst} leaves by {} with MTU {}",
                last.packet.packet.total_len, dev.name, dev.mtu
            )
        }),
        _ => None,
    }
}

/// Dropped by the forwarding path with a TTL (hop limit) of 1 or 0.
fn ttl_ran_out(hop: &Hop) -> bool {
    let in_forward = hop.drop.as_ref().is_some_and(|d| {
        d.location.starts_with("ip_forward") || d.location.starts_with("ip6_forward")
    });
    in_forward && hop.packet.packet.ttl <= 1
}

/// The bridge this node's pod veths hang off, where its CNI bridges them:
/// the backend's (flannel's cni0), else the one its other veths are on
/// (the bridge plugin, by any name). None where pods are routed (Calico).
fn pod_bridge(facts: &NodeFacts) -> Option<String> {
    if let Some(bridge) = cni::by_name(facts.cni).and_then(|b| b.bridge()) {
        return Some(bridge.to_string());
    }
    let view = &facts.view;
    view.links
        .iter()
        .filter(|l| l.kind == "veth")
        .filter_map(|l| view.link(l.controller?))
        .find(|controller| controller.kind == "bridge")
        .map(|bridge| bridge.name.clone())
}

/// An encapsulated packet freed with NO_SOCKET where it arrived: no VXLAN
/// device listens on its port.
fn tunnel_nobody_took(hops: &[Hop]) -> Option<String> {
    let last = hops.last()?;
    let tunnel = last.packet.tunnel?;
    let port = match tunnel.outer.transport {
        Transport::Udp { dport, .. } => dport,
        _ => return None,
    };
    let device = cni::by_tunnel_port(port)
        .and_then(|b| b.tunnel())
        .map_or("VXLAN device".to_string(), |t| {
            format!("VXLAN device ({})", t.device)
        });
    (last.drop.as_ref()?.reason == "NO_SOCKET").then(|| {
        format!(
            "nothing listens on UDP {port} on {}: its {device} is down or missing",
            last.node
        )
    })
}

/// The route node `here` should have had for `dst`, in the terms of the
/// CNI backend: the remote node's (the node list's, else a traced node's
/// own), else this node's.
fn expected_route(
    dst: Ipv4Addr,
    subnets: &[NodeSubnet],
    pod_cidrs: &[Ipv4Net],
    nodes: &HashMap<String, NodeFacts>,
    here: &str,
) -> String {
    let Some(facts) = nodes.get(here) else {
        return format!("a route for {dst}");
    };
    let view = &facts.view;
    let listed = subnets.iter().find(|s| s.subnet.contains(&dst)).cloned();
    if let Some(remote) = listed.or_else(|| traced_subnet(dst, nodes, here)) {
        // The link holding this node's listed IP, else the one on whose
        // subnet the remote node's address is.
        let underlay = view
            .addresses
            .iter()
            .find_map(|(index, ip)| {
                let listed = subnets.iter().any(|s| s.node_ip == *ip);
                listed.then(|| view.link(*index)).flatten()
            })
            .or_else(|| view.link_on_subnet_of(remote.node_ip));
        let underlay = underlay.map_or("<underlay>", |l| l.name.as_str());
        let backend = remote
            .cni
            .and_then(cni::by_name)
            .or_else(|| cni::by_name(facts.cni))
            .unwrap_or_else(cni::unknown);
        let views = nodes.values().map(|f| &f.view);
        let remotes = every_remote_subnet(subnets, nodes);
        let mode = cni::direct_routing::same_subnet_mode(views, &remotes);
        return cni::direct_routing::expected_route(backend, view, &remote, underlay, mode);
    }
    if let Some(cidr) = pod_cidrs.iter().find(|c| c.contains(&dst)) {
        return format!("a route for {dst} inside the pod CIDR {cidr}, not the default route");
    }
    match &facts.inferred_pod_cidr {
        Some((cidr, evidence)) if cidr.contains(&dst) => format!(
            "a route for {dst} inside the pod CIDR {cidr} (inferred from {evidence}), not the default route"
        ),
        _ => format!("a route for {dst}"),
    }
}

/// The address `ip` is, if it is an IPv4 one (the node list's subnets and
/// the pod CIDRs are IPv4).
fn ipv4_of(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => None,
    }
}

/// The IPv6 route node `here` should have had for `dst`, in the terms of
/// the CNI backend of the other traced node whose pod subnet holds it
/// (its IPAM block where Calico blackholes one, `proto bird`). In `ip -6
/// route` and `route -6 -n` terms.
fn expected_route6(dst: Ipv6Addr, nodes: &HashMap<String, NodeFacts>, here: &str) -> String {
    let Some(facts) = nodes.get(here) else {
        return format!("a route for {dst}");
    };
    let Some((remote, backend)) = traced_subnet6(dst, nodes, here) else {
        return format!("a route for {dst}");
    };
    let view = &facts.view;
    let underlay = (remote.node_ip).and_then(|ip| view.link_on_subnet_of(ip));
    let backend = backend
        .or_else(|| cni::by_name(facts.cni))
        .unwrap_or_else(cni::unknown);
    backend.expected_route6(&remote, underlay.map(|l| l.name.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decode::{
            hop::tests::{drop_hop, hop},
            tests as frames,
        },
        node::{fixtures::flannel_node, NodeView, Route, RouteOrigin},
    };

    fn node_1(view: NodeView, forwarding: bool) -> HashMap<String, NodeFacts> {
        let facts = NodeFacts {
            cni: crate::cni::detect(&view, None).name(),
            view,
            forwarding,
            ..Default::default()
        };
        HashMap::from([("node-1".to_string(), facts)])
    }

    fn subnets() -> Vec<NodeSubnet> {
        vec![NodeSubnet {
            node: "node-2".into(),
            subnet: "10.244.2.0/24".parse().unwrap(),
            node_ip: "192.0.2.12".parse().unwrap(),
            cni: Some("flannel-vxlan"),
            tunnel_ip: None,
        }]
    }

    fn dropped(iface: &str, role: Role, reason: &str, frame: &[u8]) -> Hop {
        drop_hop(9, "node-1", iface, role, frame, reason)
    }

    #[test]
    fn a_failed_neighbour_is_the_translated_packets_and_an_off_subnet_gateway_is_the_routes_fault()
    {
        use crate::decode::hop::{tests::hop, Direction, KernelRoute};
        let looked_up = |mut hop: Hop, via: &str, dev: &str| {
            hop.route = Some(KernelRoute {
                result: "success".into(),
                dev: Some(dev.into()),
                via: Some(via.parse().unwrap()),
            });
            hop
        };
        let at_veth = |frame: &[u8]| {
            hop(
                1,
                "node-1",
                "veth1a2b",
                Role::PodVeth,
                Direction::Ingress,
                frame,
            )
        };
        let said = |hops: &[Hop], view: NodeView| {
            explain(hops, &node_1(view, true), &subnets(), &[])
                .hint
                .unwrap()
        };
        // web-0 → a ClusterIP: looked up at its veth before the DNAT (via
        // the default route), dropped waiting for a dead endpoint's ARP.
        let sent = frames::icmp_echo([10, 244, 1, 2], [10, 96, 0, 10], 64, 1);
        let dnatted = frames::icmp_echo([10, 244, 1, 2], [10, 244, 1, 9], 64, 1);
        let veth = at_veth(&sent);
        let hops = [
            looked_up(veth, "192.0.2.1", "eth0"),
            dropped("cni0", Role::Bridge, "NEIGH_FAILED", &dnatted),
        ];
        let hint = said(&hops, flannel_node());
        assert!(
            hint.starts_with(
                "no ARP reply from 10.244.1.9 on cni0 (neighbour FAILED): the next hop is gone"
            ),
            "{hint}"
        );
        // A route onlink via a node on another subnet: ARP on eth0 cannot
        // reach it, alive or not.
        let mut view = flannel_node();
        view.routes
            .push(crate::node::fixtures::route("192.0.2.0/24", 2));
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 246, 3, 5], 64, 1);
        let at_eth0 = |via| {
            let veth = at_veth(&frame);
            [
                looked_up(veth, via, "eth0"),
                dropped("eth0", Role::Underlay, "NEIGH_FAILED", &frame),
            ]
        };
        let hint = said(&at_eth0("198.51.100.13"), view.clone());
        assert!(
            hint.contains(
                "198.51.100.13 is on none of this node's subnets: the route reaches it onlink"
            ) && hint.contains("the route is wrong"),
            "{hint}"
        );
        let hint = said(&at_eth0("192.0.2.13"), view.clone());
        assert!(
            hint.ends_with("the next hop is gone or does not answer"),
            "{hint}"
        );
        // Through the overlay: the underlay asked ARP for the other node's
        // address (the outer header's), not for the tunnel's gateway.
        let inner = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
        let veth = at_veth(&inner);
        let hops = [
            looked_up(veth, "10.244.2.0", "flannel.1"),
            dropped(
                "eth0",
                Role::Underlay,
                "NEIGH_FAILED",
                &frames::vxlan(&inner, 1),
            ),
        ];
        let hint = said(&hops, view);
        assert!(
            hint.starts_with(
                "no ARP reply from 192.0.2.12 on eth0 (neighbour FAILED): the next hop is gone"
            ),
            "{hint}"
        );
    }

    #[test]
    fn a_ttl_run_out_in_ip_forward_is_said_as_such() {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 1, 1);
        let mut last = dropped("cni0", Role::Bridge, "IP_INHDR", &frame);
        last.drop.as_mut().unwrap().location = "ip_forward+0x1c5".into();
        let node = &node_1(flannel_node(), true);
        let hint = explain(&[last.clone()], node, &subnets(), &[])
            .hint
            .unwrap();
        assert!(
            hint.starts_with("the packet reached node-1 with TTL 1: no router forwards it further"),
            "{hint}"
        );
        // A header the kernel found broken elsewhere is not a TTL.
        last.drop.as_mut().unwrap().location = "ip_rcv_core+0x2a0".into();
        assert_eq!(explain(&[last], node, &subnets(), &[]).hint, None);
    }

    #[test]
    fn a_missing_pod_subnet_route_names_the_expected_and_the_used_route() {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let mut view = flannel_node();
        view.routes
            .retain(|r| r.destination.to_string() != "10.244.2.0/24");
        let node = &node_1(view, true);
        let hops = vec![
            hop(
                1,
                "node-1",
                "cni0",
                Role::Bridge,
                Direction::Ingress,
                &frame,
            ),
            hop(
                2,
                "node-1",
                "eth0",
                Role::Underlay,
                Direction::Egress,
                &frame,
            ),
        ];
        let check = explain(&hops, node, &subnets(), &[]).no_route.unwrap();
        assert_eq!(
            check.expected,
            "10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink (route -n: 10.244.2.0 10.244.2.0 255.255.255.0 UG flannel.1) (pod subnet of node-2)"
        );
        assert_eq!(
            check.used,
            "default via 192.0.2.1 dev eth0 (route -n: 0.0.0.0 192.0.2.1 0.0.0.0 UG eth0)"
        );
        // Without the nodes, the pod CIDR still tells it is pod traffic.
        let check = explain(&hops, node, &[], &["10.244.0.0/16".parse().unwrap()])
            .no_route
            .unwrap();
        assert!(
            check.expected.contains("inside the pod CIDR 10.244.0.0/16"),
            "{}",
            check.expected
        );
        // With neither, leaving by the default route may be right…
        assert!(explain(&hops, node, &[], &[]).no_route.is_none());
        // …unless the node's CNI devices tell the pod CIDR.
        let mut inferred = node.clone();
        let facts = inferred.get_mut("node-1").unwrap();
        facts.inferred_pod_cidr = crate::cni::by_name("flannel-vxlan")
            .unwrap()
            .inferred_pod_cidr(&facts.view);
        assert_eq!(
            facts.inferred_pod_cidr.as_ref().unwrap().0.to_string(),
            "10.244.0.0/16"
        );
        let check = explain(&hops, &inferred, &[], &[]).no_route.unwrap();
        assert!(
            check
                .expected
                .contains("inside the pod CIDR 10.244.0.0/16 (inferred from"),
            "{}",
            check.expected
        );

        let no_default = vec![dropped("cni0", Role::Bridge, "IP_INNOROUTES", &frame)];
        let no_routes = node_1(
            NodeView {
                routes: vec![],
                ..flannel_node()
            },
            true,
        );
        let check = explain(&no_default, &no_routes, &subnets(), &[])
            .no_route
            .unwrap();
        assert_eq!(check.used, "no route at all");
    }

    /// Traced nodes with their facts, and no node list: node-1 lost its
    /// route toward node-2's pods.
    fn traced_pair(
        cni: &'static str,
        mut views: [NodeView; 2],
        pod_subnets: [&str; 2],
        lost: &str,
    ) -> HashMap<String, NodeFacts> {
        views[0]
            .routes
            .retain(|r| r.destination.to_string() != lost);
        let facts = views
            .into_iter()
            .zip(pod_subnets)
            .map(|(view, subnet)| NodeFacts {
                cni,
                view,
                forwarding: true,
                local_pod_subnets: vec![subnet.parse().unwrap()],
                ..Default::default()
            });
        ["node-1", "node-2"]
            .map(String::from)
            .into_iter()
            .zip(facts)
            .collect()
    }

    #[test]
    fn without_a_node_list_the_expected_route_is_what_the_other_traced_node_shows() {
        use crate::node::fixtures::calico_bgp_node;
        // Calico: node-2 blackholes its block; its pod has a /32.
        let frame = frames::icmp_echo([10, 247, 1, 5], [10, 247, 2, 3], 64, 1);
        let views = [calico_bgp_node(1), calico_bgp_node(2)];
        let nodes = traced_pair(
            "calico-bird",
            views,
            ["10.247.1.5/32", "10.247.2.5/32"],
            "10.247.2.0/24",
        );
        let hops = [dropped(
            "cali1f2e3d4c5b6",
            Role::PodVeth,
            "IP_INNOROUTES",
            &frame,
        )];
        let check = explain(&hops, &nodes, &[], &[]).no_route.unwrap();
        assert_eq!(
            check.expected,
            "10.247.2.0/24 via 192.0.2.42 dev ens3 proto bird (route -n: 10.247.2.0 192.0.2.42 255.255.255.0 UG ens3) (pod block of node-2)"
        );
        assert_eq!(check.used, "no route at all");
        // Flannel: node-2's cni0 subnet, reached through flannel.1.
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let connected = Route {
            protocol: RouteOrigin::Kernel,
            ..crate::node::fixtures::route("192.0.2.0/24", 2)
        };
        let [mut node_1, mut node_2] = [flannel_node(), flannel_node()];
        node_1.routes.push(connected.clone());
        node_2.routes.push(connected);
        node_2.addresses = vec![
            (2, "192.0.2.12".parse().unwrap()),
            (3, "10.244.2.1".parse().unwrap()),
        ];
        // node-2 reaches node-1's pods through flannel.1 too: no
        // DirectRouting, though the nodes share a subnet.
        for route in &mut node_2.routes {
            if route.destination == "10.244.1.0/24".parse().unwrap() {
                *route = Route {
                    gateway: Some("10.244.1.0".parse().unwrap()),
                    onlink: true,
                    ..crate::node::fixtures::route("10.244.1.0/24", 4)
                };
            }
        }
        let nodes = traced_pair(
            "flannel-vxlan",
            [node_1, node_2],
            ["10.244.1.0/24", "10.244.2.0/24"],
            "10.244.2.0/24",
        );
        let hops = [dropped("cni0", Role::Bridge, "IP_INNOROUTES", &frame)];
        let check = explain(&hops, &nodes, &[], &[]).no_route.unwrap();
        assert_eq!(
            check.expected,
            "10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink (route -n: 10.244.2.0 10.244.2.0 255.255.255.0 UG flannel.1) (pod subnet of node-2)"
        );
    }

    #[test]
    fn hints_for_forwarding_bridges_fdb_and_mtu() {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let hint = |hop: Hop, forwarding: bool| {
            explain(&[hop], &node_1(flannel_node(), forwarding), &subnets(), &[])
                .hint
                .unwrap_or_default()
        };
        assert!(hint(
            dropped("cni0", Role::Bridge, "IP_INADDRERRORS", &frame),
            false
        )
        .starts_with("IP forwarding is off on node-1"));
        assert_eq!(
            hint(
                dropped("cni0", Role::Bridge, "IP_INADDRERRORS", &frame),
                true
            ),
            ""
        );
        // ip_forward on, but the lookup at cni0 said forwarding_disabled:
        // only cni0's own setting is off, and the hint names it.
        let mut at_cni0 = hop(
            1,
            "node-1",
            "cni0",
            Role::Bridge,
            Direction::Ingress,
            &frame,
        );
        at_cni0.route = Some(crate::decode::hop::KernelRoute {
            result: "forwarding_disabled".into(),
            dev: None,
            via: None,
        });
        let hops = [
            at_cni0,
            dropped("cni0", Role::Bridge, "IP_INADDRERRORS", &frame),
        ];
        let said = explain(&hops, &node_1(flannel_node(), true), &subnets(), &[])
            .hint
            .unwrap_or_default();
        assert!(
            said.starts_with("IP forwarding is off for cni0 on node-1: the kernel's route lookup at cni0 ingress said forwarding_disabled, and net.ipv4.ip_forward was 1 when podtrace started, so net.ipv4.conf.cni0.forwarding is 0"),
            "{said}"
        );
        assert!(
            said.ends_with("fix: sysctl -w net.ipv4.conf.cni0.forwarding=1"),
            "{said}"
        );
        assert!(hint(
            dropped("flannel.1", Role::Tunnel, "NO_TX_TARGET", &frame),
            true
        )
        .starts_with("flannel.1 has no forwarding entry (FDB)"));
        // A VXLAN device's neighbours are its agent's to write: a failed
        // one is a missing entry, not a peer that does not answer ARP.
        let said = hint(
            dropped("flannel.1", Role::Tunnel, "NEIGH_FAILED", &frame),
            true,
        );
        assert!(
            said.starts_with("flannel.1 has no neighbour entry for ")
                && said.contains("bridge fdb show dev flannel.1"),
            "{said}"
        );
        assert!(hint(
            dropped("eth0", Role::Underlay, "NEIGH_FAILED", &frame),
            true
        )
        .starts_with("no ARP reply from "),);
        assert!(
            hint(dropped("cni0", Role::Bridge, "PKT_TOO_BIG", &frame), true)
                .ends_with("leaves by flannel.1 with MTU 1450")
        );
        // IPv6 has no DF bit: its routers never fragment.
        let mut frame6 = Vec::new();
        etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv6(
                "fd00:10:244:1::2"
                    .parse::<std::net::Ipv6Addr>()
                    .unwrap()
                    .octets(),
                "fd00:10:244:2::2"
                    .parse::<std::net::Ipv6Addr>()
                    .unwrap()
                    .octets(),
                64,
            )
            .icmpv6_echo_request(1, 1)
            .write(&mut frame6, &[0; 1460])
            .unwrap();
        let mut view = flannel_node();
        let tunnel = view.link_named("flannel.1").unwrap().index;
        view.routes
            .push(crate::node::fixtures::route("fd00:10:244:2::/64", tunnel));
        let too_big = dropped("cni0", Role::Bridge, "PKT_TOO_BIG", &frame6);
        let text = explain(&[too_big], &node_1(view, true), &subnets(), &[])
            .hint
            .unwrap_or_default();
        assert!(
            text.starts_with("the packet is 1508 B IPv6, which routers never fragment; the route to fd00:10:244:2::2 leaves by flannel.1 with MTU 1450"),
            "{text}"
        );
        // The fixture's veth is on cni0: no hint. Off the bridge: one.
        assert_eq!(
            hint(
                dropped("veth1a2b", Role::PodVeth, "OTHERHOST", &frame),
                true
            ),
            ""
        );
        let mut view = flannel_node();
        view.links.retain(|l| l.name != "cni0");
        view.links.iter_mut().for_each(|l| l.controller = None);
        let bridgeless = node_1(view, true);
        let text = explain(
            &[dropped("veth1a2b", Role::PodVeth, "OTHERHOST", &frame)],
            &bridgeless,
            &[],
            &[],
        )
        .hint
        .unwrap();
        assert!(
            text.starts_with(
                "veth1a2b is not attached to any bridge (there is no cni0 on this node)"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_routed_veth_or_a_named_rule_gets_no_bridge_hint() {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let hint = |cni: &'static str, view: NodeView, reason: &str| {
            let facts = NodeFacts {
                cni,
                view,
                forwarding: true,
                ..Default::default()
            };
            let nodes = HashMap::from([("node-1".to_string(), facts)]);
            let dropped = dropped("cali1a2b", Role::PodVeth, reason, &frame);
            explain(&[dropped], &nodes, &[], &[]).hint
        };
        // Calico routes its cali* veths: none is ever on a bridge.
        let mut calico = flannel_node();
        calico.links.retain(|l| l.kind != "bridge");
        calico.links.iter_mut().for_each(|l| l.controller = None);
        calico
            .links
            .push(crate::node::fixtures::link(7, "cali1a2b", "veth"));
        assert_eq!(hint("calico-bird", calico.clone(), "NETFILTER_DROP"), None);
        assert_eq!(hint("calico-bird", calico, "OTHERHOST"), None);
        // On a bridging CNI, a netfilter drop is the rule's, not the bridge's.
        let mut flannel = flannel_node();
        flannel
            .links
            .push(crate::node::fixtures::link(7, "cali1a2b", "veth"));
        assert_eq!(
            hint("flannel-vxlan", flannel.clone(), "NETFILTER_DROP"),
            None
        );
        assert!(hint("flannel-vxlan", flannel.clone(), "OTHERHOST")
            .unwrap()
            .starts_with("cali1a2b is not attached to any bridge:"));
        // The bridge plugin under an unknown name: its other veths tell.
        flannel
            .links
            .iter_mut()
            .filter(|l| l.name == "cni0")
            .for_each(|l| l.name = "br-pods".into());
        assert!(hint("unknown", flannel, "OTHERHOST")
            .unwrap()
            .starts_with("cali1a2b is not attached to any bridge:"));
    }
}
