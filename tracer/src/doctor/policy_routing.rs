//! Policy routing on a node: where `ip rule` sends a local pod's packets
//! to a table of their own (the AWS VPC CNI's `from <pod> lookup N`),
//! that table must route them to the other nodes' pods.

use std::net::IpAddr;

use super::{node::NodeFacts, Check};
use crate::node::rules::Flow;

const FAMILY: &str = "kernel";
const NAME: &str = "policy routing";

/// None where no rule of the node's own selects a local pod's packets.
pub fn check(facts: &NodeFacts) -> Option<Check> {
    let node = facts.name.as_str();
    let mut policy_routed = false;
    let mut failures = Vec::new();
    for (local, other) in facts.pod_pairs() {
        let (Some(src), Some(dst)) = (local.ip, other.ip) else {
            continue;
        };
        let flow = Flow::forwarded_from_pod(IpAddr::V4(src), IpAddr::V4(dst));
        let decision = facts.view.decide(&flow);
        if decision.policy().is_empty() {
            continue;
        }
        policy_routed = true;
        if decision.route.is_none() || decision.rejected().is_some() {
            let said = decision
                .route
                .map_or("no route".into(), |r| facts.view.describe(r));
            failures.push(format!(
                "{} → {} ({dst}): {said}{}",
                local.qualified(),
                other.qualified(),
                decision.policy()
            ));
        }
    }
    if !policy_routed {
        return None;
    }
    Some(Check::judge(
        FAMILY,
        node,
        NAME,
        failures.is_empty(),
        if failures.is_empty() {
            "the tables ip rule sends local pods' packets to route them to the other nodes' pods"
                .into()
        } else {
            failures.truncate(3);
            failures.join("; ")
        },
        || {
            "give the table the rule looks up a route to the other nodes' pods (ip route show table <N>; the AWS VPC CNI's is a default route via the VPC router over the pod's ENI)".into()
        },
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use super::*;
    use crate::{
        cluster::inventory::pod_from_json,
        node::{
            fixtures::route,
            rules::tests::{eks_node, via_eth1},
            Route, RouteKind,
        },
    };

    /// node-1 of an EKS pair: web-0 (10.245.1.5) routed by `1536: from
    /// 10.245.1.0/24 lookup 100`, db-0 on node-2.
    pub(crate) fn facts(table_100: Route) -> NodeFacts {
        let mut facts = NodeFacts::of_root(Path::new("/nonexistent"));
        facts.name = "node-1".into();
        facts.view = eks_node(table_100);
        facts.pods = [
            ("web-0", "10.245.1.5", "node-1"),
            ("db-0", "10.245.2.7", "node-2"),
        ]
        .into_iter()
        .map(|(name, ip, node)| {
            pod_from_json(serde_json::json!({
                "metadata": {"namespace": "default", "name": name},
                "spec": {"nodeName": node},
                "status": {"podIP": ip},
            }))
            .unwrap()
        })
        .collect();
        facts
    }

    #[test]
    fn a_table_that_rejects_the_other_nodes_pods_fails_naming_rule_and_route() {
        assert!(check(&facts(via_eth1())).unwrap().ok());
        let unreachable = Route {
            kind: RouteKind::Unreachable,
            oif: None,
            table: 100,
            ..route("10.245.2.0/24", 0)
        };
        let failed = check(&facts(unreachable)).unwrap();
        assert!(!failed.ok());
        assert_eq!(
            failed.evidence,
            "default/web-0 → default/db-0 (10.245.2.7): unreachable 10.245.2.0/24 table 100 (route -n: 10.245.2.0 - 255.255.255.0 ! -) (rule 1536: from 10.245.1.0/24 lookup 100)"
        );
        // A node without rules of its own has nothing to check.
        let mut plain = facts(via_eth1());
        plain.view.rules.clear();
        assert!(check(&plain).is_none());
    }
}
