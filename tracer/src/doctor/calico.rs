//! Calico on a node: a route for every other node's block (bird writes
//! them from BGP), and the `projectcalico.org/IPv4Address` the node
//! announces must be an address it really has — peers dial it for BGP, so
//! a wrong one (autodetection picked another interface) leaves every
//! remote block unrouted.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::{
    cni_config,
    credentials::{self, Credentials, State},
    node::NodeFacts,
    Check,
};
use crate::{cni, node::RouteKind};

const FAMILY: &str = "calico";

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    if !cni_config::running(facts, "calico") {
        return Vec::new();
    }
    let mut checks = vec![check_peer_ip(facts)];
    if let Some(credentials) = &facts.cni_credentials {
        checks.push(check_credentials(&facts.name, credentials));
    }
    // BGP's sessions themselves: bgp.rs, from BIRD.
    checks.extend(check_routes(facts));
    checks
}

/// Whether the node's CNI config gives pods addresses with calico-ipam
/// (blocks affine to nodes, not the node's podCIDR).
pub fn calico_ipam(facts: &NodeFacts) -> bool {
    cni_config::chosen(facts).is_some_and(|c| c.ipam_types().iter().any(|t| t == "calico-ipam"))
}

/// The other nodes' blocks: with calico-ipam, the blocks the other nodes
/// examined blackhole; else their podCIDRs. None: not known here.
fn remote_blocks(facts: &NodeFacts) -> Option<Vec<(String, Ipv4Net)>> {
    if !calico_ipam(facts) {
        let by_cidr = facts
            .others
            .iter()
            .filter_map(|r| Some((r.name.clone(), *r.pod_cidrs.first()?)));
        return Some(by_cidr.collect());
    }
    (!facts.peer_blocks.is_empty()).then(|| facts.peer_blocks.clone())
}

/// A route for every other node's block: BIRD installs them from BGP;
/// in VXLAN mode (no BGP) Felix writes them from the other nodes' VTEPs.
fn check_routes(facts: &NodeFacts) -> Vec<Check> {
    let annotated = (facts.me.as_ref()).and_then(|m| cni::from_annotations(&m.annotations));
    let felix_routes = cni::detect(&facts.view, annotated).name() == "calico-vxlan";
    let Some(blocks) = remote_blocks(facts) else {
        let own: Vec<String> = facts.own_blocks().iter().map(|b| b.to_string()).collect();
        let why = format!("with calico-ipam the other nodes' blocks are their own `blackhole <block> proto bird` routes, and no other node is examined here (this node's: {})",
            if own.is_empty() { "none".into() } else { own.join(", ") });
        return vec![Check::not_checked(
            FAMILY,
            &facts.name,
            "routes to other nodes' blocks",
            &why,
        )];
    };
    let mut checks = Vec::new();
    for (remote, block) in blocks {
        let route = facts
            .view
            .routes
            .iter()
            .find(|r| r.destination == block.into() && r.kind == RouteKind::Unicast);
        checks.push(Check::judge(FAMILY, &facts.name, &format!("route to {remote}"), route.is_some(),
            match route {
                Some(r) => format!("{} (block of {remote})", facts.view.describe(r)),
                None if felix_routes => format!("no route to {block} ({remote}'s block): Felix on {} has not written it (VXLAN mode routes come from each node's projectcalico.org/IPv4VXLANTunnelAddr, not from BGP)", facts.name),
                None => format!("no route to {block} ({remote}'s block): BGP with {remote} is not established"),
            },
            || if felix_routes {
                format!("read calico-node's Felix log on {} (route table sync) and {remote}'s projectcalico.org/IPv4VXLANTunnelAddr annotation", facts.name)
            } else {
                format!("check BGP: calicoctl node status on {} and {remote}; the peer address each announces (projectcalico.org/IPv4Address)", facts.name)
            }));
    }
    checks
}

/// The annotated peer address is one of the node's own.
fn check_peer_ip(facts: &NodeFacts) -> Check {
    let node = facts.name.as_str();
    let annotated = facts
        .me
        .as_ref()
        .and_then(|m| m.calico_ipv4())
        .map(String::from);
    let Some(annotated) = annotated else {
        return Check::not_checked(
            FAMILY,
            node,
            "peer address",
            match &facts.me {
                Some(_) => "the node has no projectcalico.org/IPv4Address annotation",
                None => "no Node object for this node (no node list) to read its projectcalico.org/IPv4Address from",
            },
        );
    };
    let ip: Option<Ipv4Addr> = annotated.split('/').next().and_then(|a| a.parse().ok());
    let held = ip.and_then(|ip| facts.view.link_with_address(ip));
    let own: Vec<String> = facts
        .view
        .addresses
        .iter()
        .filter(|(_, a)| !a.is_loopback())
        .filter_map(|(i, a)| Some(format!("{a} ({})", facts.view.link(*i)?.name)))
        .collect();
    let evidence = match held {
        Some(link) => format!("projectcalico.org/IPv4Address {annotated} is on {}", link.name),
        None => format!("projectcalico.org/IPv4Address says {annotated}, an address this node does not have (it has {}): BGP peers dial the wrong address and never route to its pods", own.join(", ")),
    };
    Check::judge(
        FAMILY,
        node,
        "peer address",
        held.is_some(),
        evidence,
        || {
            "set IP_AUTODETECTION_METHOD on calico-node (e.g. interface=eth0 or kubernetes-internal-ip) and restart it on this node".into()
        },
    )
}

/// The CNI's credential: expired, a CA that does not parse, an API that
/// does not answer and a rejected token are four stories, each its fix.
pub fn check_credentials(node: &str, credentials: &Credentials) -> Check {
    const NAME: &str = "CNI credentials";
    const UNAUTHORIZED: &str =
        "the calico plugin fails every sandbox with \"connection is unauthorized: Unauthorized\"";
    let file = &credentials.file;
    let restart = || {
        format!(
            "restart calico-node on {node}: its install-cni writes {file} again, with a new token"
        )
    };
    match &credentials.state {
        State::Accepted { server } => Check::pass(FAMILY, node, NAME, format!("{file}'s token is accepted by the API at {server}")),
        State::Expired { exp, now } => Check::fail(FAMILY, node, NAME,
            format!("{file}'s token expired since {} ({} ago, by its exp claim; the API was not asked): {UNAUTHORIZED}", credentials::when(*exp), credentials::ago(now.saturating_sub(*exp))),
            format!("{}; if it expires again, calico-node is not renewing it (its logs)", restart())),
        State::Rejected { server, message } => Check::fail(FAMILY, node, NAME,
            format!("{file}'s token is rejected: the API at {server} answers {message}; {UNAUTHORIZED}"),
            format!("{}; if the new one is rejected too, the token's service account was deleted or its signing key rotated (kubectl -n kube-system get sa calico-cni-plugin calico-node)", restart())),
        State::BadCa(why) => Check::fail(FAMILY, node, NAME,
            format!("{file}'s CA does not parse ({why}): the calico plugin cannot open TLS to the API; the token was not sent"),
            format!("{}; it copies the CA from the service account's ca.crt", restart())),
        State::Unusable(why) => Check::fail(FAMILY, node, NAME,
            format!("{file} is not a kubeconfig the calico plugin can use: {why}"),
            restart()),
        State::Unreachable { server, why, expires } => Check {
            fix: Some(format!("if sandboxes fail with a dial or timeout error, {node} cannot reach the API at {server}: check the address in {file} (KUBERNETES_SERVICE_HOST of calico-node), kube-proxy and the route to it")),
            ..Check::not_checked(FAMILY, node, NAME, &format!("the API at {server} cannot be asked ({why}), so the token was never judged; {}", match expires {
                Some(exp) => format!("by its exp claim it is valid until {}", credentials::when(*exp)),
                None => "it carries no exp claim to check offline".into(),
            }))
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::{
        doctor::{api, cluster::ClusterNode, cluster::ClusterState, Status},
        node::{Link, Route, RouteOrigin},
    };

    /// A Calico node as install-cni leaves it (calico-ipam), with no
    /// podCIDR, bird's blackhole for its own block, and `routes` learnt.
    fn calico_node(name: &str, routes: &[(&str, RouteKind)]) -> NodeFacts {
        let root =
            std::env::temp_dir().join(format!("podtrace-calico-{name}-{}", std::process::id()));
        let net_d = root.join("etc/cni/net.d");
        std::fs::create_dir_all(&net_d).unwrap();
        std::fs::write(net_d.join("10-calico.conflist"), r#"{"name": "k8s-pod-network", "cniVersion": "0.3.1",
            "plugins": [{"type": "calico", "ipam": {"type": "calico-ipam"}}, {"type": "portmap"}]}"#).unwrap();
        let mut facts = NodeFacts::of_root(&PathBuf::from(&root));
        facts.name = name.into();
        facts.view.links = vec![Link {
            index: 5,
            name: "cali1234567890a".into(),
            kind: "veth".into(),
            controller: None,
            has_ethernet_header: true,
            mtu: 1500,
            up: true,
            peer_in_other_netns: true,
            peer_netns_id: None,
            peer_index: None,
            vxlan: None,
        }];
        facts.view.routes = routes
            .iter()
            .map(|(dst, kind)| Route {
                protocol: RouteOrigin::Bird,
                onlink: false,
                kind: *kind,
                destination: dst.parse().unwrap(),
                gateway: None,
                oif: None,
                table: 254,
            })
            .collect();
        let other = |name: &str| ClusterNode {
            name: name.into(),
            ..Default::default()
        };
        facts.others = vec![other(if name == "node-1" { "node-2" } else { "node-1" })];
        facts
    }

    fn routes_checks(facts: &NodeFacts) -> Vec<Check> {
        checks(facts)
            .into_iter()
            .filter(|c| c.name.starts_with("route"))
            .collect()
    }

    #[test]
    fn calico_ipam_blocks_come_from_the_nodes_blackholes_not_the_pod_cidr() {
        let node1 = calico_node(
            "node-1",
            &[
                ("10.244.8.0/26", RouteKind::Blackhole),
                ("10.244.9.64/26", RouteKind::Unicast),
            ],
        );
        assert_eq!(node1.own_blocks(), vec!["10.244.8.0/26".parse().unwrap()]);
        let mut node2 = calico_node("node-2", &[("10.244.9.64/26", RouteKind::Blackhole)]);
        node2.peer_blocks = vec![("node-1".into(), "10.244.8.0/26".parse().unwrap())];
        let mut node1 = node1;
        node1.peer_blocks = vec![("node-2".into(), "10.244.9.64/26".parse().unwrap())];
        let on1 = routes_checks(&node1);
        assert_eq!(on1.len(), 1, "{on1:?}");
        assert!(on1[0].ok() && on1[0].name == "route to node-2", "{on1:?}");
        let on2 = routes_checks(&node2);
        assert!(on2[0].failed(), "{on2:?}");
        assert!(
            on2[0]
                .evidence
                .contains("no route to 10.244.8.0/26 (node-1's block)"),
            "{on2:?}"
        );
    }

    #[test]
    fn calico_ipam_with_no_other_node_examined_is_not_checked() {
        let node = calico_node("node-1", &[("10.244.8.0/26", RouteKind::Blackhole)]);
        let routes = routes_checks(&node);
        assert_eq!(routes.len(), 1, "{routes:?}");
        assert_eq!(routes[0].status, Status::NotChecked);
        assert!(
            routes[0].evidence.contains("this node's: 10.244.8.0/26"),
            "{routes:?}"
        );
    }

    #[test]
    fn a_calico_ipam_node_without_a_pod_cidr_has_no_pod_cidr_finding() {
        let examined = [calico_node("node-1", &[]), calico_node("node-2", &[])];
        let node = |name: &str| ClusterNode {
            name: name.into(),
            ..Default::default()
        };
        let cluster = ClusterState {
            nodes: vec![node("node-1"), node("node-2")],
            pods: Vec::new(),
            asked: Vec::new(),
            known: true,
            pods_listed: false,
        };
        let found = api::checks(&cluster, &examined);
        assert!(!found.iter().any(|c| c.name == "podCIDR"), "{found:?}");
        // Not examined, and no Calico annotation: a podCIDR is needed.
        let found = api::checks(&cluster, &[]);
        assert!(
            found.iter().any(|c| c.name == "podCIDR" && c.failed()),
            "{found:?}"
        );
    }
}
