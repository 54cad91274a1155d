//! Judging a journey: how the packet travelled (bridged, routed,
//! encapsulated, decapsulated), where it ended and why (with the
//! explanation from `explain`). The netfilter rule of a drop and the
//! translations on the way are named by `verdict_names`.

use std::net::IpAddr;

use serde::Serialize;

use super::{
    clock::micros,
    explain::explain,
    notes::tunnel_text,
    outcome::{Outcome, PathStep},
    Context,
};
use crate::{
    decode::{
        hop::{Direction, Hop},
        TunnelKind,
    },
    model::netfilter::NetfilterRule,
    node::interfaces::Role,
    story::{explain::RouteCheck, journey::Journey},
};

#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Verdict {
    #[serde(flatten)]
    pub outcome: Outcome,
    pub path: Vec<PathStep>,
    /// First to last hop, in microseconds.
    pub latency_us: f64,
    pub summary: String,
    /// For a netfilter drop: the rule, from nftables tracing.
    pub netfilter: Option<NetfilterRule>,
    /// For a netfilter drop by a NetworkPolicy enforcer's rules: the
    /// policies behind it, read from the rules the packet went through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<super::policy::PolicyVerdict>,
    /// For a netfilter drop whose rule is not named: the hook, as far as
    /// the packet tells (FORWARD when the node had routed it).
    pub netfilter_hook: Option<String>,
    /// For a netfilter drop that was conntrack's doing: which failure
    /// (INVALID, insert_failed, table full, SNAT ports exhausted), what
    /// shows it, and the fix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conntrack: Option<super::conntrack::ConntrackFailure>,
    /// For a packet too big for its path: what became of the ICMP error
    /// the kernel sent its sender about it (a PMTU black hole if dropped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pmtu: Option<super::pmtu_verdict::PmtuVerdict>,
    /// What on the node explains the outcome (forwarding off, a veth
    /// without its bridge, an MTU too small, …).
    pub hint: Option<String>,
    /// For a packet lost past a WireGuard device, where the receiving
    /// node's WireGuard state was read: its peer for the sending node,
    /// whether it allows the source, and its session, as read when the
    /// story was told (else at start: `read_as_told`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wireguard: Option<super::wireguard::WireguardProof>,
    /// For `vanished`, `no_route` and `dropped`: the doctor's failing
    /// checks on that node (`podtrace doctor`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub doctor: Vec<crate::model::Finding>,
}

pub(super) fn judge(journey: &Journey, ctx: &Context) -> Verdict {
    let hops = &journey.hops;
    let (first, last) = (&hops[0], &hops[hops.len() - 1]);
    // Its last hop hands it to the pod (for a fragmented packet, the last
    // fragment's).
    let delivered = journey.ends_delivered();
    let path = path_of(journey, delivered);
    let outcome = outcome_of(journey, delivered, ctx);
    let explanation = explain(hops, &ctx.nodes, &ctx.subnets, &ctx.pod_cidrs);
    let outcome = match explanation.no_route {
        Some(check) => Outcome::NoRoute {
            then: Box::new(left_by_the_used_route(outcome, &check, last, ctx)),
            check,
        },
        None => outcome,
    };
    let latency_us = micros(last.ktime_ns - first.ktime_ns);
    let mut summary = summarise(
        &outcome,
        &how(journey, &path),
        latency_us,
        // After a DNAT, the backend it was delivered to.
        last.packet.packet.dst,
        ctx,
    );
    if let (Outcome::Vanished { .. }, Some((node, ip))) =
        (&outcome, toward_a_traced_node(last, ctx))
    {
        summary.push_str(&format!(
            "; it was sent toward {node} ({ip}), which is traced and never saw it arrive"
        ));
    }
    if let Some((freed, why)) = journey.freed_by_receiver() {
        summary.push_str(&format!(
            "; then freed there by the receiving socket layer: {} in {} ({why})",
            freed.reason, freed.location
        ));
    }
    if let Some(hint) = &explanation.hint {
        summary.push_str(&format!("; {hint}"));
    }
    if journey.records_lost && !matches!(outcome, Outcome::Incomplete { .. }) {
        summary
            .push_str("; records were lost while this packet was in flight: hops may be missing");
    }
    let ipv6 = first.packet.packet.dst.is_ipv6();
    let doctor = super::findings::for_outcome(&outcome, ctx, ipv6);
    summary.push_str(&super::findings::bgp_said(&outcome, &doctor));
    Verdict {
        outcome,
        path,
        latency_us,
        summary,
        netfilter: None,
        policy: None,
        netfilter_hook: None,
        conntrack: None,
        pmtu: None,
        hint: explanation.hint,
        wireguard: explanation.wireguard,
        doctor,
    }
}

/// How the packet travelled: a TTL that went down means routed; a tunnel
/// header, encapsulated; a hop without one after it, decapsulated.
fn path_of(journey: &Journey, delivered: bool) -> Vec<PathStep> {
    let hops = &journey.hops;
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
    // Bridged only as far as seen from the sender's veth: a packet first
    // seen later (its earlier hops untraced) may have come any way.
    let sent_by_a_pod = hops[0].role == Role::PodVeth && hops[0].direction == Direction::Ingress;
    if delivered && path.is_empty() && sent_by_a_pod {
        path.push(PathStep::Bridged);
    }
    path
}

/// Where the journey ended, from its last hop.
fn outcome_of(journey: &Journey, delivered: bool, ctx: &Context) -> Outcome {
    let last = &journey.hops[journey.hops.len() - 1];
    // Where the packet was going when last seen: after an un-SNAT (a
    // NodePort's reply to its outside client) the address it was sent to
    // is a traced node's own, the one it left with is the client's.
    let dst = last.packet.packet.dst;
    if journey.freed_by_receiver().is_some() {
        Outcome::Delivered {
            node: last.node.to_string(),
            iface: last.iface.to_string(),
        }
    } else if let (Direction::Drop, Some(drop)) = (last.direction, &last.drop) {
        Outcome::Dropped {
            node: last.node.to_string(),
            iface: last.iface.to_string(),
            reason: drop.reason.clone(),
            location: drop.location.clone(),
        }
    } else if delivered {
        Outcome::Delivered {
            node: last.node.to_string(),
            iface: last.iface.to_string(),
        }
    } else if last.role == Role::Underlay
        && last.direction == Direction::Egress
        && !ctx.expects_arrival(dst)
        && toward_a_traced_node(last, ctx).is_none()
    {
        let toward = last.packet.tunnel.map_or(dst, |t| t.outer.dst);
        Outcome::LeftNode {
            node: last.node.to_string(),
            iface: last.iface.to_string(),
            toward,
        }
    } else if let Some(lost) = super::lost_agents::behind(journey, ctx) {
        Outcome::Incomplete {
            node: last.node.to_string(),
            iface: last.iface.to_string(),
            direction: last.direction,
            cause: lost.what.clone(),
        }
    } else if journey.records_lost {
        Outcome::Incomplete {
            node: last.node.to_string(),
            iface: last.iface.to_string(),
            direction: last.direction,
            cause: "records were lost while this packet was in flight".into(),
        }
    } else if let Some((translation, in_flight)) = translated_unseen(last, ctx) {
        Outcome::TranslatedOutOfSight {
            node: last.node.to_string(),
            iface: last.iface.to_string(),
            direction: last.direction,
            translation,
            in_flight,
        }
    } else if to_its_own_stack(last, ctx) {
        Outcome::Delivered {
            node: last.node.to_string(),
            iface: last.iface.to_string(),
        }
    } else {
        Outcome::Vanished {
            node: last.node.to_string(),
            iface: last.iface.to_string(),
            direction: last.direction,
        }
    }
}

/// A packet not seen again because a translation was learnt late: the
/// translation, and whether the packet had been through it already
/// (learnt while it was in flight: the hooks further on began tracing its
/// new addresses after it passed). Not where its own node's stack took it.
fn translated_unseen(last: &Hop, ctx: &Context) -> Option<(String, bool)> {
    let (packet, seen_ns) = (&last.packet.packet, last.ktime_ns);
    if let Some(translation) = ctx.nat.translated_out_of_sight(packet, seen_ns) {
        return Some((translation, false));
    }
    if to_its_own_stack(last, ctx) {
        return None;
    }
    let translation = ctx.nat.translated_before_sight(packet, seen_ns)?;
    Some((translation, true))
}

/// Where the packet leaving by `hop` was sent, when that is a traced
/// node's own address (its tunnel endpoint, or the node itself): the
/// node, and the address. Its arrival there would have been seen.
fn toward_a_traced_node<'a>(hop: &Hop, ctx: &'a Context) -> Option<(&'a str, IpAddr)> {
    if hop.role != Role::Underlay || hop.direction != Direction::Egress {
        return None;
    }
    let toward = hop
        .packet
        .tunnel
        .map_or(hop.packet.packet.dst, |t| t.outer.dst);
    Some((ctx.node_holding(toward)?, toward))
}

/// After a missing route, a packet last seen leaving the node plainly by
/// the route the kernel used instead went to that route's gateway, not to
/// the node whose pods it was for: when the gateway is no traced node,
/// the packet left what podtrace sees there, rather than vanished.
fn left_by_the_used_route(
    outcome: Outcome,
    check: &RouteCheck,
    last: &Hop,
    ctx: &Context,
) -> Outcome {
    let leaves_plain = last.role == Role::Underlay
        && last.direction == Direction::Egress
        && last.packet.tunnel.is_none()
        && *last.node == *check.node;
    match (&outcome, check.used_gateway) {
        (Outcome::Vanished { .. }, Some(gateway))
            if leaves_plain && ctx.node_holding(gateway).is_none() =>
        {
            Outcome::LeftNode {
                node: last.node.to_string(),
                iface: last.iface.to_string(),
                toward: gateway,
            }
        }
        _ => outcome,
    }
}

/// The packet arrived at a traced node addressed to that node itself: no
/// pod's veth follows, the node's own stack took it.
fn to_its_own_stack(hop: &Hop, ctx: &Context) -> bool {
    hop.direction == Direction::Ingress
        && hop.packet.tunnel.is_none()
        && ctx.node_holding(hop.packet.packet.dst) == Some(&*hop.node)
}

/// "; routed, encapsulated (VXLAN …), decapsulated", or nothing.
fn how(journey: &Journey, path: &[PathStep]) -> String {
    let encap = journey.hops.iter().find_map(|h| h.packet.tunnel);
    // WireGuard's encapsulation is its encryption: said so.
    let encrypted = encap.is_some_and(|t| t.kind == TunnelKind::Wireguard);
    let how = path
        .iter()
        .map(|step| match step {
            PathStep::Bridged => "bridged".to_string(),
            PathStep::Routed => "routed".to_string(),
            PathStep::Encapsulated => encap.map_or("encapsulated".to_string(), |t| {
                let done = if encrypted {
                    "encrypted"
                } else {
                    "encapsulated"
                };
                format!("{done} ({})", tunnel_text(&t))
            }),
            PathStep::Decapsulated if encrypted => "decrypted".to_string(),
            PathStep::Decapsulated => "decapsulated".to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if how.is_empty() {
        String::new()
    } else {
        format!("; {how}")
    }
}

/// A no-route verdict in one line: the route missing, the one used, and
/// what became of the packet.
fn no_route_summary(check: &RouteCheck, then: &Outcome, dst: IpAddr, ctx: &Context) -> String {
    let then = match then {
        Outcome::Dropped { node, reason, .. } => format!(" (then dropped on {node}: {reason})"),
        Outcome::LeftNode { node, iface, .. } => format!(" (the packet left {node} by {iface})"),
        _ => String::new(),
    };
    format!(
        "no route on {} to {}: expected {}; the kernel used {}{then}",
        check.node,
        ctx.label(dst),
        check.expected,
        check.used,
    )
}

/// The verdict in one line.
fn summarise(outcome: &Outcome, how: &str, latency_us: f64, dst: IpAddr, ctx: &Context) -> String {
    match outcome {
        Outcome::NoRoute { check, then } => no_route_summary(check, then, dst, ctx),
        Outcome::Delivered { node, iface } => {
            let to = if ctx.node_holding(dst) == Some(node.as_str()) {
                format!("{node}'s own address {dst} via {iface}, to its own stack")
            } else {
                format!("{} on {node} via {iface}", ctx.label(dst))
            };
            format!("delivered to {to}{how}, {latency_us} µs end to end")
        }
        Outcome::LeftNode {
            node,
            iface,
            toward,
        } => {
            let beyond = if ctx.names.contains_key(toward) {
                "that node is not traced"
            } else {
                "beyond the traced nodes"
            };
            format!(
                "left {node} via {iface} toward {} ({beyond}){how}",
                ctx.label(*toward)
            )
        }
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
        Outcome::TranslatedOutOfSight {
            node,
            iface,
            direction,
            translation,
            in_flight: false,
        } => {
            let dir = direction.label();
            format!("translated by conntrack on {node} ({translation}) after {iface} {dir}: podtrace learnt the translation from conntrack only after this packet had passed, so its hops under the new addresses were not traced{how}")
        }
        Outcome::TranslatedOutOfSight {
            node,
            iface,
            direction,
            translation,
            in_flight: true,
        } => {
            let dir = direction.label();
            format!("translated by conntrack ({translation}), last seen on {node} {iface} {dir}: podtrace learnt the translation from conntrack while this packet was in flight, so the hooks that began tracing the new addresses after it passed did not see it{how}")
        }
        Outcome::Incomplete {
            node,
            iface,
            direction,
            cause,
        } => {
            let dir = direction.label();
            format!("incomplete: {cause}; last seen on {node} {iface} {dir}{how}")
        }
    }
}
