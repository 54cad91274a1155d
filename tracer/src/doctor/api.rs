//! What the API alone tells, with no node access: pods that are not
//! Running or have no IP, their sandbox events classified by the cause
//! kubelet quotes (and confirmed by the node's own check when that node is
//! examined too), node conditions, the CNI each node's annotations name,
//! and node podCIDRs that are missing or overlap.

use super::{
    calico,
    cluster::{needs_events, ClusterNode, ClusterState, PodState},
    node::NodeFacts,
    Check,
};
use crate::cni;

const FAMILY: &str = "api";

/// What a `FailedCreatePodSandBox` message says went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SandboxCause {
    SubnetEnvMissing,
    PluginNotFound(String),
    CniUnauthorized,
    IpamExhausted,
    Other,
}

impl SandboxCause {
    pub fn classify(message: &str) -> Self {
        if message.contains("loadFlannelSubnetEnv failed")
            || message.contains("/run/flannel/subnet.env")
        {
            Self::SubnetEnvMissing
        } else if let Some(rest) = message.split("failed to find plugin \"").nth(1) {
            Self::PluginNotFound(rest.split('"').next().unwrap_or_default().to_string())
        } else if message.contains("Unauthorized") {
            Self::CniUnauthorized
        } else if message.contains("no IP addresses available")
            || message.contains("failed to allocate for range")
        {
            Self::IpamExhausted
        } else {
            Self::Other
        }
    }

    pub fn label(&self) -> String {
        match self {
            Self::SubnetEnvMissing => "flannel's subnet.env is missing".into(),
            Self::PluginNotFound(p) => format!("CNI plugin {p} not found"),
            Self::CniUnauthorized => {
                "the CNI plugin's API credentials are rejected (Unauthorized)".into()
            }
            Self::IpamExhausted => "the node's pod IP range is exhausted".into(),
            Self::Other => "the sandbox cannot be created".into(),
        }
    }

    /// The node check (family, name prefix) that confirms it.
    fn confirming(&self) -> Option<(&'static str, String)> {
        match self {
            Self::SubnetEnvMissing => Some(("flannel", "subnet.env".into())),
            Self::PluginNotFound(p) => Some(("plugins", format!("plugin {p}"))),
            Self::CniUnauthorized => Some(("calico", "CNI credentials".into())),
            Self::IpamExhausted | Self::Other => None,
        }
    }

    fn fix(&self) -> String {
        match self {
            Self::SubnetEnvMissing => "start flanneld on the node (kube-flannel pod); it writes /run/flannel/subnet.env".into(),
            Self::PluginNotFound(p) => format!("install {p} in /opt/cni/bin on the node (restart the CNI DaemonSet pod there)"),
            Self::CniUnauthorized => "restart calico-node on the node: it rewrites /etc/cni/net.d/calico-kubeconfig with a fresh token".into(),
            Self::IpamExhausted => "free the leaked leases (/var/lib/cni/networks/<net>) or give the node a larger podCIDR".into(),
            Self::Other => "read the event in full: kubectl describe pod".into(),
        }
    }
}

pub fn checks(cluster: &ClusterState, examined: &[NodeFacts]) -> Vec<Check> {
    let mut checks = Vec::new();
    for pod in cluster.pods.iter().filter(|p| cluster.is_asked(&p.pod)) {
        if needs_events(&pod.pod) {
            checks.push(check_pod(pod, examined));
        }
    }
    for node in &cluster.nodes {
        let unavailable = node
            .conditions
            .iter()
            .find(|c| c["type"] == "NetworkUnavailable" && c["status"] == "True");
        if let Some(c) = unavailable {
            checks.push(Check::fail(
                FAMILY,
                &node.name,
                "NetworkUnavailable",
                format!(
                    "node condition NetworkUnavailable is True: {} {}",
                    c["reason"].as_str().unwrap_or(""),
                    c["message"].as_str().unwrap_or("")
                ),
                "the CNI has not set the node up: check its DaemonSet pod on the node".into(),
            ));
        }
        checks.push(match cni::from_annotations(&node.annotations) {
            Some(b) => Check::pass(
                FAMILY,
                &node.name,
                "CNI by annotations",
                format!("{b} (node annotations)"),
            ),
            None => Check::not_checked(
                FAMILY,
                &node.name,
                "CNI by annotations",
                "the node has no CNI annotations (flannel.alpha.coreos.com/…, projectcalico.org/…)",
            ),
        });
    }
    checks.extend(check_pod_cidrs(cluster, examined));
    checks
}

/// A pod without an IP: its newest sandbox failure, classified, and the
/// node check that confirms it.
fn check_pod(state: &PodState, examined: &[NodeFacts]) -> Check {
    let pod = &state.pod;
    let node = pod.node.clone().unwrap_or_else(|| "(unscheduled)".into());
    let fix = match sandbox_failure(state) {
        Some(message) => SandboxCause::classify(message).fix(),
        None => "kubectl describe pod; kubectl get events".into(),
    };
    Check::fail(
        FAMILY,
        &node,
        &format!("pod {}", pod.qualified()),
        pod_finding(state, examined),
        fix,
    )
}

/// Kubelet's newest FailedCreatePodSandBox message about the pod.
pub fn sandbox_failure(state: &PodState) -> Option<&str> {
    state
        .events
        .iter()
        .rev()
        .find(|(reason, _)| reason == "FailedCreatePodSandBox")
        .map(|(_, message)| message.as_str())
}

/// The CNI's own words in kubelet's message (after `failed to setup
/// network for sandbox "…": `).
pub fn cni_error(message: &str) -> &str {
    message
        .split_once("failed to setup network for sandbox \"")
        .and_then(|(_, rest)| rest.split_once("\": "))
        .map_or(message, |(_, error)| error)
}

/// `db-0 has no IP: its sandbox fails with "…" (CNI plugin flannel not
/// found); on node-2, /opt/cni/bin has no flannel binary`.
pub fn pod_finding(state: &PodState, examined: &[NodeFacts]) -> String {
    let finding = explain_pod(state, examined).unwrap_or_else(|| match state.events_unread {
        Some(_) => pod_status(state),
        None => format!("{}; no sandbox failure event", pod_status(state)),
    });
    match &state.events_unread {
        Some(why) => format!("{finding}; its events could not be read: {why}"),
        None => finding,
    }
}

/// `db-0 has no IP`, or `db-0 (10.244.2.2) is Pending`.
fn pod_status(state: &PodState) -> String {
    let pod = &state.pod;
    match pod.ip {
        None => format!("{} has no IP", pod.qualified()),
        Some(ip) => format!(
            "{} ({ip}) is {}",
            pod.qualified(),
            pod.phase.as_deref().unwrap_or("?")
        ),
    }
}

/// Why a pod has no IP, when its events or its node tell.
pub fn explain_pod(state: &PodState, examined: &[NodeFacts]) -> Option<String> {
    let pod = &state.pod;
    let node = pod.node.as_deref().unwrap_or("(unscheduled)");
    let status = pod_status(state);
    let Some(message) = sandbox_failure(state) else {
        let on_node = examined.iter().find(|f| f.name == node).and_then(|facts| {
            super::node_checks(facts).into_iter().find(|c| {
                c.failed() && ["cni-config", "plugins", "flannel", "calico"].contains(&c.family)
            })
        });
        return on_node.map(|c| {
            format!(
                "{status} (no sandbox event seen); on {node}, {}",
                c.evidence
            )
        });
    };
    let cause = SandboxCause::classify(message);
    let mut text = format!(
        "{status}: its sandbox fails with {:?} ({})",
        cni_error(message),
        cause.label()
    );
    if let Some(confirmed) = confirmation(&cause, node, examined) {
        text.push_str(&format!("; on {node}, {confirmed}"));
    }
    Some(text)
}

/// The failing node check behind a cause, on the pod's node, if examined.
pub fn confirmation(cause: &SandboxCause, node: &str, examined: &[NodeFacts]) -> Option<String> {
    let (family, name) = cause.confirming()?;
    let facts = examined.iter().find(|f| f.name == node)?;
    super::node_checks(facts)
        .into_iter()
        .find(|c| c.failed() && c.family == family && c.name.starts_with(&name))
        .map(|c| c.evidence)
}

/// A node without a podCIDR: a failure where its pods' addresses come
/// from it (flannel, host-local), nothing with calico-ipam, and not
/// checked on a Calico node whose CNI config was not read.
fn check_missing_pod_cidr(node: &ClusterNode, examined: &[NodeFacts]) -> Option<Check> {
    if !node.pod_cidrs.is_empty() {
        return None;
    }
    let facts = examined.iter().find(|f| f.name == node.name);
    match facts {
        Some(facts) if calico::calico_ipam(facts) => return None,
        None if cni::from_annotations(&node.annotations)
            .is_some_and(|b| b.starts_with("calico")) =>
        {
            return Some(Check::not_checked(FAMILY, &node.name, "podCIDR", "the node has no podCIDR, which a Calico node needs only with host-local IPAM, and its CNI config was not read (calico-ipam takes blocks instead)"));
        }
        _ => {}
    }
    Some(Check::fail(FAMILY, &node.name, "podCIDR", "the node has no podCIDR: flanneld and host-local cannot give its pods addresses".into(),
        "check kube-controller-manager's --allocate-node-cidrs and --cluster-cidr (is the cluster CIDR exhausted?)".into()))
}

fn check_pod_cidrs(cluster: &ClusterState, examined: &[NodeFacts]) -> Vec<Check> {
    let mut checks = Vec::new();
    for (i, a) in cluster.nodes.iter().enumerate() {
        checks.extend(check_missing_pod_cidr(a, examined));
        for b in &cluster.nodes[i + 1..] {
            let overlap = a
                .pod_cidrs
                .iter()
                .find(|x| b.pod_cidrs.iter().any(|y| x.contains(y) || y.contains(*x)));
            if let Some(cidr) = overlap {
                checks.push(Check::fail(
                    FAMILY,
                    &a.name,
                    "podCIDR",
                    format!(
                        "{}'s podCIDR {cidr} overlaps {}'s {:?}",
                        a.name,
                        b.name,
                        b.pod_cidrs
                            .iter()
                            .map(|c| c.to_string())
                            .collect::<Vec<_>>()
                    ),
                    "delete and re-register one of the nodes so that it gets a podCIDR of its own"
                        .into(),
                ));
            }
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelets_sandbox_messages_are_classified() {
        let wrap = |cni: &str| {
            format!("Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox \"5c1f\": {cni}")
        };
        let subnet = wrap("plugin type=\"flannel\" failed (add): loadFlannelSubnetEnv failed: open /run/flannel/subnet.env: no such file or directory");
        assert_eq!(
            SandboxCause::classify(&subnet),
            SandboxCause::SubnetEnvMissing
        );
        let plugin = wrap("failed to find plugin \"flannel\" in path [/opt/cni/bin]");
        assert_eq!(
            SandboxCause::classify(&plugin),
            SandboxCause::PluginNotFound("flannel".into())
        );
        assert_eq!(
            cni_error(&plugin),
            "failed to find plugin \"flannel\" in path [/opt/cni/bin]"
        );
        let unauthorized = wrap("plugin type=\"calico\" failed (add): error getting ClusterInformation: connection is unauthorized: Unauthorized");
        assert_eq!(
            SandboxCause::classify(&unauthorized),
            SandboxCause::CniUnauthorized
        );
        let ipam = wrap("failed to allocate for range 0: no IP addresses available in range set: 10.244.1.1-10.244.1.254");
        assert_eq!(SandboxCause::classify(&ipam), SandboxCause::IpamExhausted);
        assert_eq!(
            SandboxCause::classify("image pull backoff"),
            SandboxCause::Other
        );
    }
}
