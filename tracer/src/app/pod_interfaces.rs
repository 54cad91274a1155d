//! The traced pods' host interfaces on a node, the namespaces behind
//! them, and which of the node's interfaces a trace watches for them.

use std::net::IpAddr;

use crate::{
    cni::Backend,
    node::{
        interfaces::{Role, Watched},
        pod_netns, NodeView,
    },
};

/// The host interfaces of the traced pods found on a node, and the
/// namespaces behind them.
#[derive(Default)]
pub(super) struct PodInterfaces {
    /// Each pod's address and host interface.
    pub found: Vec<(IpAddr, String)>,
    /// The inodes of the pods' own namespaces: drops there are the pair's.
    pub namespaces: Vec<u32>,
    /// Local pods whose interface could not be found.
    pub lost: Vec<IpAddr>,
}

/// The host interfaces of the traced pods: by the CNI's own tables, else
/// (for a local pod) from the pod's namespace. Called inside the node's
/// namespace.
pub(super) async fn find_pod_interfaces(
    view: &NodeView,
    cni: &dyn Backend,
    endpoints: &[IpAddr],
    local: &[IpAddr],
) -> PodInterfaces {
    let mut pods = PodInterfaces::default();
    for ip in endpoints {
        let (index, namespace) = match cni.pod_interface(view, *ip) {
            Some(link) => (Some(link.index), pod_netns::behind_veth(link).await),
            None if local.contains(ip) => match pod_netns::host_veth(*ip, view).await {
                Some((index, namespace)) => (Some(index), Some(namespace)),
                None => (None, None),
            },
            None => (None, None),
        };
        match index.and_then(|index| view.link(index)) {
            Some(link) => pods.found.push((*ip, link.name.clone())),
            None if local.contains(ip) => pods.lost.push(*ip),
            None => {}
        }
        pods.namespaces.extend(namespace.map(|n| n.inode));
    }
    pods
}

/// What the trace needs of a node's interfaces: the underlay, bridges and
/// tunnels, and the veths of the traced pods that are local here. A node
/// may have hundreds of pods; attaching to every veth made starting and
/// stopping take seconds. Only when a local traced pod's interface cannot
/// be found is every pod veth watched.
pub(super) fn needed(
    every: Vec<Watched>,
    pod_interfaces: &[(IpAddr, String)],
    lost_pods: &[IpAddr],
    node: &str,
) -> Vec<Watched> {
    if !lost_pods.is_empty() {
        let veths = every.iter().filter(|w| w.role == Role::PodVeth).count();
        let lost: Vec<String> = lost_pods.iter().map(ToString::to_string).collect();
        eprintln!(
            "podtrace: {node}: cannot tell which interface {} is behind; watching all {veths} pod veths",
            lost.join(" and ")
        );
        return every;
    }
    every
        .into_iter()
        .filter(|w| {
            w.role != Role::PodVeth || pod_interfaces.iter().any(|(_, name)| *name == w.name)
        })
        .collect()
}
