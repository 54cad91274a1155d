//! Calico on a node: a route for every other node's block (bird writes
//! them from BGP), and the `projectcalico.org/IPv4Address` the node
//! announces must be an address it really has — peers dial it for BGP, so
//! a wrong one (autodetection picked another interface) leaves every
//! remote block unrouted.

use std::net::Ipv4Addr;

use super::{cni_config, node::NodeFacts, Check};
use crate::{model::bounded, node::RouteKind};

const FAMILY: &str = "calico";
const BGP_PORT: u16 = 179;

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    if !cni_config::running(facts, "calico") {
        return Vec::new();
    }
    let mut checks = vec![check_peer_ip(facts)];
    if let Some((file, answer)) = &facts.cni_credentials {
        checks.push(Check::judge(FAMILY, &facts.name, "CNI credentials", answer.is_ok(),
            match answer {
                Ok(server) => format!("{file}'s token is accepted by the API at {server}"),
                Err(why) => format!("{file}'s token is rejected: {why}; the calico plugin fails every sandbox with \"connection is unauthorized: Unauthorized\""),
            },
            || format!("restart calico-node on {}: it rewrites {file} with a fresh service account token", facts.name)));
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
        return Check::pass(
            FAMILY,
            node,
            "peer address",
            "no projectcalico.org/IPv4Address to check".into(),
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

/// Calico's CNI kubeconfig, as the plugin uses it.
pub const CNI_KUBECONFIG: &str = "etc/cni/net.d/calico-kubeconfig";
/// A kubeconfig is kilobytes: a larger file is not one.
const KUBECONFIG_MAX: u64 = 1 << 20;

/// Asks the API for its version with the CNI's own kubeconfig (when there
/// is one): the plugin's `Unauthorized` is a token the API rejects.
pub async fn probe_credentials(root: &std::path::Path) -> Option<(String, Result<String, String>)> {
    let path = root.join(CNI_KUBECONFIG);
    if !path.exists() {
        return None;
    }
    let shown = NodeFacts::shown(CNI_KUBECONFIG);
    let answer = async {
        // Non-blocking, regular files only, and capped: a FIFO or
        // /dev/zero there must not wedge the doctor or an agent.
        let text = bounded::read_regular_text(&path, KUBECONFIG_MAX).map_err(|e| e.to_string())?;
        let file =
            kube::config::Kubeconfig::from_yaml(&text).map_err(|e| format!("unreadable: {e}"))?;
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .map_err(|e| format!("not a usable kubeconfig: {e}"))?;
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        let asked = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.apiserver_version(),
        )
        .await;
        match asked {
            Ok(Ok(_)) => Ok(server),
            Ok(Err(kube::Error::Api(status))) => Err(format!(
                "the API at {server} answers {} {}",
                status.code, status.message
            )),
            Ok(Err(e)) => Err(format!("the API at {server} cannot be reached: {e}")),
            Err(_) => Err(format!("the API at {server} did not answer within 5 s")),
        }
    }
    .await;
    Some((shown, answer))
}
