//! Calico on a node: a route for every other node's block (bird writes
//! them from BGP), and the `projectcalico.org/IPv4Address` the node
//! announces must be an address it really has — peers dial it for BGP, so
//! a wrong one (autodetection picked another interface) leaves every
//! remote block unrouted.

use std::net::Ipv4Addr;

use super::{
    cni_config,
    credentials::{self, Credentials, State},
    node::NodeFacts,
    Check,
};
use crate::node::RouteKind;

const FAMILY: &str = "calico";
const BGP_PORT: u16 = 179;

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    if !cni_config::running(facts, "calico") {
        return Vec::new();
    }
    let mut checks = vec![check_peer_ip(facts)];
    if let Some(credentials) = &facts.cni_credentials {
        checks.push(check_credentials(&facts.name, credentials));
    }
    for remote in facts.others.iter().filter(|r| !r.pod_cidrs.is_empty()) {
        let block = remote.pod_cidrs[0];
        let route = facts
            .view
            .routes
            .iter()
            .find(|r| r.destination == block && r.kind == RouteKind::Unicast);
        checks.push(Check::judge(FAMILY, &facts.name, &format!("route to {}", remote.name), route.is_some(),
            match route {
                Some(r) => format!("{} (block of {})", facts.view.describe(r), remote.name),
                None => format!("no route to {block} ({}'s block): BGP with {} is not established", remote.name, remote.name),
            },
            || format!("check BGP: calicoctl node status on {} and {}; the peer address each announces (projectcalico.org/IPv4Address)", facts.name, remote.name)));
    }
    if let Some(listening) = &facts.tcp_listening {
        if listening.contains(&BGP_PORT) {
            checks.push(Check::pass(
                FAMILY,
                &facts.name,
                "BGP port",
                format!("bird listens on TCP {BGP_PORT}"),
            ));
        }
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
