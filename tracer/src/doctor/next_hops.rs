//! The next hop to the other nodes' pods, by the route the kernel picks
//! for a local pod's packet (`ip rule`, then the table). Where the kernel
//! asked that next hop for its MAC and had no answer (neighbour FAILED),
//! every packet to it is dropped, while the routes, the rules and the
//! CNI's own settings all look right.

use std::{collections::BTreeSet, net::IpAddr};

use super::{node::NodeFacts, Check};
use crate::node::{rules::Flow, RouteKind};

const FAMILY: &str = "kernel";
const NAME: &str = "next hops";

/// None where no local pod has a route to another node's pod.
pub fn check(facts: &NodeFacts) -> Option<Check> {
    let view = &facts.view;
    let mut judged = BTreeSet::new();
    let mut failures = Vec::new();
    let mut on_tunnel = false;
    for (local, other) in facts.pod_pairs() {
        let (Some(src), Some(dst)) = (local.ip, other.ip) else {
            continue;
        };
        let (src, dst) = (IpAddr::V4(src), IpAddr::V4(dst));
        let decision = view.decide(&Flow::forwarded_from_pod(src, dst));
        let Some(route) = decision.route.filter(|r| r.kind == RouteKind::Unicast) else {
            continue;
        };
        let Some(oif) = route.oif else {
            continue;
        };
        // A route without a gateway: the destination is the neighbour.
        let next_hop = route.gateway.unwrap_or(dst);
        if !judged.insert((oif, next_hop)) {
            continue;
        }
        if view.failed_neighbours.contains(&(oif, next_hop)) {
            let link = view.link(oif);
            let dev = link.map_or("?", |l| l.name.as_str());
            on_tunnel |= link.is_some_and(|l| l.is_tunnel());
            failures.push(format!(
                "{} → {} ({dst}): {}{}: neighbour {next_hop} dev {dev} FAILED (asked, never answered)",
                local.qualified(),
                other.qualified(),
                view.describe(route),
                decision.policy()
            ));
        }
    }
    if judged.is_empty() {
        return None;
    }
    let hops: Vec<String> = judged
        .iter()
        .map(|(oif, hop)| format!("{hop} dev {}", view.link(*oif).map_or("?", |l| &l.name)))
        .collect();
    Some(Check::judge(
        FAMILY,
        &facts.name,
        NAME,
        failures.is_empty(),
        if failures.is_empty() {
            format!(
                "no next hop to the other nodes' pods is a FAILED neighbour ({})",
                hops.join(", ")
            )
        } else {
            failures.truncate(3);
            failures.join("; ")
        },
        || {
            if on_tunnel {
                "a tunnel device's CNI agent writes a permanent neighbour (and FDB entry) for each other node's VTEP: see why it did not (its logs, the node annotations it reads; ip neigh show dev <dev>)".into()
            } else {
                "the next hop does not answer ARP/NDP on that device: is it up, and on that link's subnet (ip neigh show dev <dev>; arping -I <dev> <next hop>)? Or give the route a next hop that answers".into()
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        doctor::policy_routing::tests::facts as eks_facts,
        node::{fixtures::link, rules::tests::via_eth1},
    };

    /// node-1 of an EKS pair: web-0 routed by `1536: from 10.245.1.0/24
    /// lookup 100`, whose default route is via 192.0.2.22 on eth1, and
    /// db-0 on node-2.
    fn facts() -> NodeFacts {
        let mut facts = eks_facts(via_eth1());
        facts.view.links = vec![link(2, "eth0", ""), link(3, "eth1", "")];
        facts
    }

    #[test]
    fn a_rule_tables_gateway_that_never_answered_fails_naming_route_rule_and_neighbour() {
        let mut facts = facts();
        let healthy = check(&facts).unwrap();
        assert!(healthy.ok(), "{}", healthy.evidence);
        assert!(
            healthy.evidence.contains("192.0.2.22 dev eth1"),
            "{}",
            healthy.evidence
        );
        // The main table's gateway failing is no failure of this path:
        // the rule sends the pod's packets to table 100.
        facts.view.failed_neighbours = vec![(2, "192.0.2.1".parse().unwrap())];
        assert!(check(&facts).unwrap().ok());
        facts
            .view
            .failed_neighbours
            .push((3, "192.0.2.22".parse().unwrap()));
        let failed = check(&facts).unwrap();
        assert!(failed.failed());
        assert_eq!(
            failed.evidence,
            "default/web-0 → default/db-0 (10.245.2.7): default via 192.0.2.22 dev eth1 table 100 (route -n: 0.0.0.0 192.0.2.22 0.0.0.0 UG eth1) (rule 1536: from 10.245.1.0/24 lookup 100): neighbour 192.0.2.22 dev eth1 FAILED (asked, never answered)"
        );
    }

    #[test]
    fn no_pod_on_another_node_is_nothing_to_check() {
        let mut facts = facts();
        facts.pods.retain(|p| p.name == "web-0");
        assert!(check(&facts).is_none());
    }
}
