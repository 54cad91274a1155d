//! Naming the translations between a journey's hops: [`steps`] compares
//! consecutive hops of one packet and, where its addresses changed, names
//! the translation (DNAT, un-DNAT, SNAT/MASQUERADE, un-SNAT) with both
//! tuples, the rule that did it (from nft rule tracing: only a
//! connection's first packet traverses the nat chains, later ones are
//! translated by conntrack) and the Service and backend pod.

use std::net::IpAddr;

use serde::Serialize;

use super::{
    nat::{ports, NatBook, Through},
    rule_text::{rule_action, NatKind},
};
use crate::{
    decode::{
        hop::{Direction, Hop},
        IpPacket,
    },
    model::netfilter::NetfilterRule,
    model::{Frontend, Name},
    node::interfaces::Role,
};

/// The conntrack side of a translation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct ConntrackState {
    /// `new`: the connection's first packet, translated by a nat rule;
    /// `established`: translated by conntrack from an existing entry.
    pub state: &'static str,
    /// The entry's zone and mark, when conntrack was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mark: Option<u32>,
}

/// One translation seen on a hop (JSON `nat`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct NatStep {
    pub kind: NatKind,
    /// `ip:port` (or `ip` for port-less protocols) before and after.
    pub before: String,
    pub after: String,
    /// The rule, as `table chain: rule text`; `conntrack` when an
    /// existing entry did it.
    pub rule: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The Service's endpoints are known (API, services file, kube-proxy's
    /// rules) and the DNAT's target (the un-DNAT's source) is none of
    /// them: a rule left by an endpoint that is gone, a terminating one
    /// (podtrace lists ready endpoints only), or one not heard of yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unknown_endpoint: bool,
    pub conntrack: ConntrackState,
    /// Set when no traced hook saw the translation: it lies between
    /// hops on two nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_of_sight: Option<OutOfSight>,
}

/// Where a translation was done that no traced hook saw. tc hooks sit
/// outside netfilter, so a translation between the hops of two nodes
/// was done after the earlier node's last traced hop: that node's hooks
/// after it were not traced (its pair was learnt from conntrack while
/// the packet was in flight, or a hook was missing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct OutOfSight {
    /// The node whose netfilter translated the packet, when the hooks
    /// tell it: the earlier hop's, when that hop is an ingress (its
    /// netfilter lay ahead) and the later hop is the next node's ingress
    /// (tc ingress runs before PREROUTING there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<Name>,
    /// The last hop that saw the packet before it: `node-1 cni0 ingress`.
    pub after_hop: String,
    /// The first hop that saw it after: `node-2 eth0 ingress`.
    pub before_hop: String,
}

impl OutOfSight {
    /// `on node-1, out of sight (its hooks after node-1 cni0 ingress did
    /// not trace this packet)`, or, when either
    /// node could have done it, `out of sight between node-1 cni0 ingress
    /// and node-2 eth0 egress`.
    pub fn text(&self) -> String {
        match &self.node {
            Some(node) => format!(
                "on {node}, out of sight (its hooks after {} did not trace this packet)",
                self.after_hop
            ),
            None => format!(
                "out of sight between {} and {}",
                self.after_hop, self.before_hop
            ),
        }
    }
}

/// Marks the translations between two consecutive hops on different
/// nodes as done out of sight (see [`OutOfSight`]).
pub fn out_of_sight(steps: &mut [NatStep], before: &Hop, after: &Hop) {
    if before.node == after.node && !left_and_came_back(before, after) {
        return;
    }
    let seen = |hop: &Hop| format!("{} {} {}", hop.node, hop.iface, hop.direction.label());
    // The earlier node's, only where its netfilter still lay ahead of
    // the packet (seen arriving there) and the later node's did not (an
    // ingress hook there). Seen leaving the earlier node, it was done on
    // the way: either node's, or a third's.
    let both_ingress =
        before.direction == Direction::Ingress && after.direction == Direction::Ingress;
    let node = both_ingress.then(|| before.node.clone());
    for step in steps {
        step.out_of_sight = Some(OutOfSight {
            node: node.clone(),
            after_hop: seen(before),
            before_hop: seen(after),
        });
    }
}

/// Seen leaving its node by the underlay or a tunnel, and next arriving
/// back at the same node from outside: a hairpin through another node
/// (a NodePort of another node that DNATs back here). What translated it
/// on the way was not this node's netfilter, which lay behind the packet
/// at the first hop and ahead of it at the second.
fn left_and_came_back(before: &Hop, after: &Hop) -> bool {
    let outside = |hop: &Hop| matches!(hop.role, Role::Underlay | Role::Tunnel);
    before.direction == Direction::Egress
        && after.direction == Direction::Ingress
        && outside(before)
        && outside(after)
}

/// What a translation to none of a Service's endpoints may be.
pub(super) const STALE_ENDPOINT: &str =
    "a rule left by an endpoint that is gone (the proxy has not synced), a terminating endpoint a Local traffic policy still uses, or one podtrace has not heard of";

impl NatStep {
    /// `DNAT 10.96.7.7:80 → 10.244.2.3:8080 by nat KUBE-SEP-… (default/db → default/db-1)`.
    pub fn text(&self) -> String {
        let by = if self.conntrack.state == "new" {
            format!("by {}", self.rule)
        } else {
            "(conntrack)".to_string()
        };
        let which = match (&self.service, &self.backend) {
            (Some(s), _) if self.unknown_endpoint => {
                format!(" ({s}, to none of its endpoints: {STALE_ENDPOINT})")
            }
            (Some(s), Some(b)) => format!(" ({s} → {b})"),
            (Some(s), None) => format!(" ({s})"),
            _ => String::new(),
        };
        let sight = self
            .out_of_sight
            .as_ref()
            .map_or_else(String::new, |o| format!(", {}", o.text()));
        format!(
            "{} {} → {} {by}{which}{sight}",
            self.kind.label(),
            self.before,
            self.after
        )
    }
}

fn sock(ip: IpAddr, port: Option<u16>) -> Frontend {
    Frontend {
        ip,
        port: port.unwrap_or(0),
    }
}

fn shown(ip: IpAddr, port: Option<u16>) -> String {
    port.map_or_else(|| ip.to_string(), |port| Frontend { ip, port }.to_string())
}

/// The translations between two consecutive sightings of one packet
/// (none when its addresses and ports did not change).
pub fn steps(
    before: &IpPacket,
    after: &IpPacket,
    rules: &[NetfilterRule],
    book: &NatBook,
) -> Vec<NatStep> {
    let (b, a) = (ports(&before.transport), ports(&after.transport));
    let (bs, bd) = (b.map(|p| p.0), b.map(|p| p.1));
    let (as_, ad) = (a.map(|p| p.0), a.map(|p| p.1));
    let rule_for = |kinds: &[NatKind]| {
        rules
            .iter()
            .find(|r| rule_action(r).is_some_and(|k| kinds.contains(&k)))
    };
    // A connection's first packet is translated by a nat rule, never by
    // an existing entry: without its rule, it is still not "conntrack".
    let opens = before.transport.opens_a_connection();
    let mut out = Vec::new();
    if (before.dst, bd) != (after.dst, ad) {
        let front = sock(before.dst, bd);
        let (kind, rule) = if book.is_front(front) {
            (NatKind::Dnat, rule_for(&[NatKind::Dnat]))
        } else {
            (NatKind::UnSnat, None)
        };
        let t = (kind == NatKind::Dnat)
            .then(|| book.by_front(front, sock(after.dst, ad)))
            .flatten();
        out.push(step(
            kind,
            shown(before.dst, bd),
            shown(after.dst, ad),
            rule,
            opens,
            t.as_ref(),
        ));
    }
    let connection = book.connection_of([before, after]);
    if (before.src, bs) != (after.src, as_) {
        let front = sock(after.src, as_);
        let (kind, rule) = if book.is_front(front) {
            (NatKind::UnDnat, None)
        } else {
            let rule = rule_for(&[NatKind::Masquerade, NatKind::Snat]);
            let kind = rule.and_then(rule_action).unwrap_or(NatKind::Snat);
            (kind, rule)
        };
        let t = (kind == NatKind::UnDnat)
            .then(|| book.by_front(front, sock(before.src, bs)))
            .flatten();
        out.push(step(
            kind,
            shown(before.src, bs),
            shown(after.src, as_),
            rule,
            opens,
            t.as_ref(),
        ));
    }
    for s in &mut out {
        s.conntrack.zone = connection.map(|c| c.zone);
        s.conntrack.mark = connection.map(|c| c.mark);
    }
    out
}

/// What `rule` says of a translation whose rule was not seen on a
/// connection's first packet.
pub const RULE_NOT_SEEN: &str =
    "a nat rule not seen (rule tracing is off, rate-limited, or lagged past the wait)";

/// What `rule` says instead on a node whose iptables-legacy rules rule
/// tracing cannot see: why, not a guess at the rate limit.
pub const RULE_UNSEEN_LEGACY: &str =
    "a nat rule not seen: rule tracing cannot see this node's iptables-legacy rules";

/// Steps whose rule was not seen, on such a node.
pub fn unseen_by_tracing(steps: &mut [NatStep]) {
    for step in steps.iter_mut().filter(|s| s.rule == RULE_NOT_SEEN) {
        step.rule = RULE_UNSEEN_LEGACY.to_string();
    }
}

fn step(
    kind: NatKind,
    before: String,
    after: String,
    rule: Option<&NetfilterRule>,
    opens: bool,
    t: Option<&Through>,
) -> NatStep {
    let (rule, state) = match rule {
        Some(r) => (format!("{} {}: {}", r.table, r.chain, r.rule), "new"),
        // Only DNAT and SNAT/MASQUERADE are a rule's; a reply's undoing is
        // always conntrack's.
        None if opens && matches!(kind, NatKind::Dnat | NatKind::Snat | NatKind::Masquerade) => {
            (RULE_NOT_SEEN.to_string(), "new")
        }
        None => ("conntrack".to_string(), "established"),
    };
    NatStep {
        kind,
        before,
        after,
        rule,
        service: t.and_then(|t| t.service.clone()),
        backend: t.and_then(|t| t.backend.clone()),
        unknown_endpoint: t.is_some_and(|t| t.unknown_endpoint),
        conntrack: ConntrackState {
            state,
            zone: None,
            mark: None,
        },
        out_of_sight: None,
    }
}
