//! The wording of a story: what happened at each hop, the packet in one
//! line, a tunnel in one phrase.

use crate::decode::{
    hop::{Direction, Hop, KernelRoute},
    Decoded, Transport, Tunnel, TunnelKind,
};
use crate::node::interfaces::Role;

use super::Context;

pub(super) fn describe_packet(d: &Decoded) -> String {
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
        Transport::Fragment { number, offset } => {
            format!("IP protocol {number}, a fragment at byte {offset} (no transport header)")
        }
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

pub(super) fn tunnel_text(t: &Tunnel) -> String {
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

/// "; the packet (1500 B, DF) is larger than dev's MTU 1450": what the
/// kernel's FRAG_NEEDED answer means for this packet.
fn larger_than_mtu(hop: &Hop, dev: &str, ctx: &Context) -> String {
    let p = &hop.packet.packet;
    let mtu = ctx
        .nodes
        .get(&hop.node)
        .and_then(|facts| facts.view.link_named(dev))
        .map_or(String::new(), |link| format!(" {}", link.mtu));
    let then = if p.dont_fragment {
        "DF is set: the kernel drops it and answers ICMP fragmentation needed"
    } else {
        "the kernel fragments it"
    };
    format!(
        "; the packet ({} B) is larger than {dev}'s MTU{mtu}: {then}",
        p.total_len
    )
}

/// What happened at `hop`, given the hop before it.
pub(super) fn note(hop: &Hop, prev: Option<&Hop>, ctx: &Context) -> String {
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
            let too_big = if route.result == KernelRoute::FRAG_NEEDED {
                larger_than_mtu(hop, dev, ctx)
            } else {
                String::new()
            };
            format!("{what}; kernel route{via} dev {dev}{too_big}")
        }
        Some(route) => format!("{what}; kernel route lookup: {}", route.result),
        None => what,
    };
    let what = match (p.fragment, p.transport) {
        (true, Transport::Fragment { offset, .. }) => format!("fragment @{offset}: {what}"),
        (true, _) => format!("first fragment: {what}"),
        (false, _) => what,
    };
    match ttl_drop {
        Some(routed) => format!("{routed}, {what}"),
        None => what,
    }
}
