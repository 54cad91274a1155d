//! The wording of a story: what happened at each hop, the packet in one
//! line, a tunnel in one phrase.

use std::fmt::{self, Write};

use crate::decode::{
    hop::{Direction, Hop, KernelRoute},
    Decoded, KnownBy, Transport, Tunnel, TunnelKind, TCP_RST,
};
use crate::node::{
    interfaces::Role, route::table_name, rules::Decision, Route, RouteKind, RouteOrigin,
    RT_TABLE_MAIN,
};

use super::{context::Shown, Context};

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
        Transport::Icmpv6 {
            icmp_type: 128,
            id,
            seq,
            ..
        } => format!("ICMPv6 echo request id {id} seq {seq}"),
        Transport::Icmpv6 {
            icmp_type: 129,
            id,
            seq,
            ..
        } => format!("ICMPv6 echo reply id {id} seq {seq}"),
        Transport::Icmpv6 {
            icmp_type, code, ..
        } => format!("ICMPv6 type {icmp_type} code {code}"),
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

/// "VXLAN VNI 1 192.0.2.11:41000 → 192.0.2.12:8472".
pub(super) fn tunnel_text(t: &Tunnel) -> String {
    TunnelText(t).to_string()
}

/// A tunnel in one phrase, written in place (see [`tunnel_text`]).
struct TunnelText<'a>(&'a Tunnel);

impl fmt::Display for TunnelText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.0;
        let kind = match t.kind {
            TunnelKind::Vxlan => "VXLAN",
            TunnelKind::Geneve => "Geneve",
            TunnelKind::Ipip => "IPIP",
            TunnelKind::Wireguard => "WireGuard",
        };
        match t.outer.transport {
            Transport::Udp { sport, dport } => {
                f.write_str(kind)?;
                if let Some(vni) = t.vni {
                    write!(f, " VNI {vni}")?;
                }
                let (src, dst) = (Shown(t.outer.src), Shown(t.outer.dst));
                if t.outer.src.is_ipv6() {
                    write!(f, " [{src}]:{sport} → [{dst}]:{dport}")?;
                } else {
                    write!(f, " {src}:{sport} → {dst}:{dport}")?;
                }
                match t.wireguard {
                    Some(w) => write!(f, " (receiver {:08x}, counter {})", w.receiver, w.counter),
                    None => Ok(()),
                }
            }
            _ => write!(f, "{kind} {} → {}", Shown(t.outer.src), Shown(t.outer.dst)),
        }
    }
}

/// "; the packet (1500 B, DF) is larger than dev's MTU 1450": what the
/// kernel's FRAG_NEEDED answer means for this packet.
fn larger_than_mtu(out: &mut String, hop: &Hop, dev: &str, ctx: &Context) -> fmt::Result {
    let p = &hop.packet.packet;
    let mtu = ctx
        .nodes
        .get(&*hop.node)
        .and_then(|facts| facts.view.link_named(dev))
        .map(|link| link.mtu);
    let then = if p.dst.is_ipv6() {
        "IPv6 routers never fragment: the kernel drops it and answers ICMPv6 packet too big"
    } else if p.dont_fragment {
        "DF is set: the kernel drops it and answers ICMP fragmentation needed"
    } else {
        "the kernel fragments it"
    };
    write!(
        out,
        "; the packet ({} B) is larger than {dev}'s MTU",
        p.total_len
    )?;
    if let Some(mtu) = mtu {
        write!(out, " {mtu}")?;
    }
    write!(out, ": {then}")
}

/// A TCP reset with a traced local pod's address as its source, first
/// seen leaving a hook other than that pod's veth: the node's own stack
/// made it in the pod's name (`REJECT --reject-with tcp-reset` answers
/// with the rejected packet's destination as source), for a reset the pod
/// sent would have crossed its veth first, as the same pair. Only resets:
/// any other packet first seen past the veth may have been translated on
/// the way (a Service's DNAT) from a pair not traced. Said on the hop, or
/// the story reads as if the pod had refused.
pub(super) fn made_by_the_node(first: &Hop, ctx: &Context) -> Option<String> {
    let reset = matches!(first.packet.packet.transport, Transport::Tcp { flags, .. } if flags & TCP_RST != 0);
    if first.direction != Direction::Egress || !reset {
        return None;
    }
    let src = first.packet.packet.src;
    let facts = ctx.nodes.get(&*first.node)?;
    let (_, veth) = facts.pod_interfaces.iter().find(|(ip, _)| *ip == src)?;
    if first.iface == veth.as_str() {
        return None;
    }
    Some(format!(
        "made by {}'s own stack in {}'s name, not sent by the pod (never seen at its veth {veth}'s ingress): a REJECT --reject-with tcp-reset answers so",
        first.node,
        ctx.label(src)
    ))
}

/// What happened at `hop`, given the hop before it. Written into one
/// buffer: a note per hop at line rate, where a String per phrase was a
/// good part of what telling cost.
pub(super) fn note(hop: &Hop, prev: Option<&Hop>, ctx: &Context) -> String {
    let mut out = String::with_capacity(64);
    write_note(&mut out, hop, prev, ctx).expect("writing to a String");
    out
}

fn write_note(out: &mut String, hop: &Hop, prev: Option<&Hop>, ctx: &Context) -> fmt::Result {
    let p = &hop.packet.packet;
    if let Some(before) = prev
        .map(|prev| prev.packet.packet.ttl)
        .filter(|before| *before > p.ttl)
    {
        write!(out, "routed (TTL {before}→{}), ", p.ttl)?;
    }
    match (p.fragment, p.transport) {
        (true, Transport::Fragment { offset, .. }) => write!(out, "fragment @{offset}: ")?,
        (true, _) => out.push_str("first fragment: "),
        (false, _) => {}
    }
    write_what(out, hop, ctx)?;
    write_route(out, hop, ctx)
}

/// What the hook saw, by where it is and what the packet carries.
fn write_what(out: &mut String, hop: &Hop, ctx: &Context) -> fmt::Result {
    let p = &hop.packet.packet;
    if hop.role == Role::Tunnel && hop.packet.tunnel.is_none() {
        if let Some(note) = super::wireguard::device_note(hop, &ctx.nodes) {
            return out.write_str(&note);
        }
    }
    let said = match (hop.role, hop.direction, &hop.packet.tunnel) {
        (_, Direction::Drop, _) => match &hop.drop {
            Some(d) if d.by_socket => {
                return write!(
                    out,
                    "dropped before it had an IP header (matched by its socket): {} in {}",
                    d.reason, d.location
                )
            }
            Some(d) => {
                out.push_str("dropped");
                // The UDP packet WireGuard sent with this one inside.
                if let Some(t) = (hop.packet.tunnel).filter(|t| t.kind == TunnelKind::Wireguard) {
                    write!(out, " encrypted ({})", TunnelText(&t))?;
                    if t.wireguard
                        .is_some_and(|w| w.known_by == KnownBy::ReceiverAndCounter)
                    {
                        out.push_str(", known by the receiver index and counter its sending node saw it leave with");
                    }
                }
                return write!(out, ": {} in {}", d.reason, d.location);
            }
            None => "dropped",
        },
        (_, Direction::Egress, Some(t)) => {
            let added = t.outer.total_len.saturating_sub(p.total_len);
            let (done, how) = match t.kind {
                // Nothing of the packet is readable in it: say how it is
                // known to be this one.
                TunnelKind::Wireguard => (
                    "encrypted",
                    ", the packet known by the tag in its flow hash, which WireGuard keeps",
                ),
                _ => ("encapsulated", ""),
            };
            return write!(out, "{done} {} (+{added} B){how}", TunnelText(t));
        }
        (_, Direction::Ingress, Some(t)) => {
            out.push_str("arrives encapsulated");
            if let Some(name) = ctx.names.get(&t.outer.src) {
                write!(out, " from {name}")?;
            }
            return write!(out, ": {}", TunnelText(t));
        }
        (Role::Tunnel, Direction::Ingress, None) => "decapsulated",
        (Role::Tunnel, Direction::Egress, None) => "into the tunnel device",
        (Role::PodVeth, Direction::Ingress, None) => {
            return write!(out, "sent by {}", ctx.label(p.src))
        }
        (Role::PodVeth, Direction::Egress, None) => {
            return write!(out, "handed to {}", ctx.label(p.dst))
        }
        (Role::Bridge, Direction::Ingress, None) => "bridge up to the host stack",
        (Role::Bridge, Direction::Egress, None) => "host stack down to the bridge",
        (Role::Underlay, Direction::Egress, None) => "leaves the node unencapsulated",
        (Role::Underlay, Direction::Ingress, None) => "arrives unencapsulated",
        (Role::Other, _, None) => "seen",
    };
    out.push_str(said);
    Ok(())
}

/// The kernel's route for the packet, when this hook asked for it, in
/// the node's routing table's terms where that table shows it.
fn write_route(out: &mut String, hop: &Hop, ctx: &Context) -> fmt::Result {
    let Some(route) = &hop.route else {
        return Ok(());
    };
    let dst = hop.packet.packet.dst;
    let view = ctx.nodes.get(&*hop.node).map(|facts| &facts.view);
    // The route the node's rules and tables give this packet, as the
    // kernel's lookup (which follows `ip rule`) found it.
    let decision = view.map(|v| v.decide(&hop.flow()));
    let table_route = decision.as_ref().and_then(|d| d.route);
    if route.found() {
        out.push_str("; kernel route");
        if let Some(via) = route.via {
            write!(out, " via {via}")?;
        }
        let dev = route.dev.as_deref().unwrap_or("?");
        write!(out, " dev {dev}")?;
        // Who installed it, when the table's route is the one the
        // kernel took (policy routing may have taken another).
        let took = |r: &&Route| {
            r.oif
                .and_then(|i| view?.link(i))
                .is_some_and(|l| l.name == dev)
        };
        if let Some(taken) = table_route.filter(took) {
            if taken.protocol == RouteOrigin::Bird {
                out.push_str(" proto bird");
            }
            if taken.table != RT_TABLE_MAIN {
                write!(out, " table {}", table_name(taken.table))?;
            }
            out.push_str(&decision.as_ref().map(Decision::policy).unwrap_or_default());
        }
        if route.result == KernelRoute::FRAG_NEEDED {
            larger_than_mtu(out, hop, dev, ctx)?;
        }
        return Ok(());
    }
    // The kernel's answer without a route: as `ip route` and `route -n`
    // print the route that gave it.
    let kind = match route.result.as_str() {
        "blackhole" => Some(RouteKind::Blackhole),
        "unreachable" => Some(RouteKind::Unreachable),
        "prohibit" => Some(RouteKind::Prohibit),
        _ => None,
    };
    let said_by = decision
        .as_ref()
        .filter(|d| kind.is_some() && d.rejected() == kind);
    match (said_by, view) {
        (Some(decision), Some(view)) => {
            let route = (decision.route).map_or(route.result.clone(), |r| view.describe(r));
            write!(out, "; kernel route lookup: {route}{}", decision.policy())
        }
        // Its own address is not forwarded either: delivered to itself.
        _ if route.result == KernelRoute::NOT_FORWARDED && view.is_some_and(|v| v.holds(dst)) => {
            write!(out, "; addressed to {} itself", hop.node)
        }
        // A Service's virtual address needs no route of its own: the
        // lookup at the pod's veth comes before kube-proxy's DNAT.
        _ if route.result == KernelRoute::NOT_FORWARDED && ctx.nat.is_frontend(dst) => write!(
            out,
            "; no route to {dst} itself (a Service address: routed only after a DNAT to a backend)"
        ),
        _ if route.result == KernelRoute::NOT_FORWARDED => {
            write!(out, "; kernel route lookup: no route")
        }
        _ => write!(out, "; kernel route lookup: {}", route.result),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decode::{hop::tests::hop, tests as frames},
        node::{
            fixtures::{flannel_node, route},
            NodeFacts,
        },
    };

    /// The note of a packet for `dst` arriving on node-1's eth0, where
    /// the kernel's lookup answered `result` (by `dev`, when found).
    fn arriving_note(dst: [u8; 4], result: &str, dev: Option<&str>, routes: Vec<Route>) -> String {
        let frame = frames::icmp_echo([10, 244, 9, 2], dst, 64, 1);
        let mut arriving = hop(
            1,
            "node-1",
            "eth0",
            Role::Underlay,
            Direction::Ingress,
            &frame,
        );
        arriving.route = Some(KernelRoute {
            result: result.into(),
            dev: dev.map(Into::into),
            via: None,
        });
        let mut view = flannel_node();
        view.routes.extend(routes);
        let mut ctx = Context::default();
        let facts = NodeFacts {
            view,
            ..Default::default()
        };
        ctx.nodes.insert("node-1".into(), facts);
        note(&arriving, None, &ctx)
    }

    #[test]
    fn a_failed_lookup_reads_no_route_and_the_nodes_own_address_reads_so() {
        let note = arriving_note([10, 99, 0, 1], "not_forwarded", None, vec![]);
        assert_eq!(
            note,
            "arrives unencapsulated; kernel route lookup: no route"
        );
        let note = arriving_note([192, 0, 2, 11], "not_forwarded", None, vec![]);
        assert_eq!(note, "arrives unencapsulated; addressed to node-1 itself");
    }

    #[test]
    fn a_route_bird_learnt_says_proto_bird() {
        let learnt = Route {
            protocol: RouteOrigin::Bird,
            gateway: Some("192.0.2.42".parse().unwrap()),
            ..route("10.247.2.0/24", 2)
        };
        let note = arriving_note(
            [10, 247, 2, 3],
            "success",
            Some("eth0"),
            vec![learnt.clone()],
        );
        assert_eq!(
            note,
            "arrives unencapsulated; kernel route dev eth0 proto bird"
        );
        // The kernel took another device (policy routing): not this route.
        let note = arriving_note([10, 247, 2, 3], "success", Some("flannel.1"), vec![learnt]);
        assert_eq!(note, "arrives unencapsulated; kernel route dev flannel.1");
    }

    #[test]
    fn a_blackhole_is_named_as_ip_route_and_route_n_print_it() {
        let blackhole = Route {
            kind: RouteKind::Blackhole,
            protocol: RouteOrigin::Bird,
            oif: None,
            ..route("10.247.1.0/26", 0)
        };
        let note = arriving_note([10, 247, 1, 7], "blackhole", None, vec![blackhole]);
        assert_eq!(
            note,
            "arrives unencapsulated; kernel route lookup: blackhole 10.247.1.0/26 proto bird \
             (route -n: 10.247.1.0 0.0.0.0 255.255.255.192 U *)"
        );
    }
}
