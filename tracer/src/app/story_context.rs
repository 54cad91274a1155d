//! What the stories are told with: the names and subnets the targets
//! give, each traced end's node, and how long a journey is waited for.

use std::{net::IpAddr, time::Duration};

use super::targets::Targets;
use crate::{cli::Args, cni, node::host_root::HostRoot, story::Context};

/// A journey is done once nothing joined it for this long.
pub(super) const JOURNEY_IDLE: Duration = Duration::from_millis(250);
/// …or this long, while it is still under way (ARP retries after 1 s).
pub(super) const JOURNEY_PATIENCE: Duration = Duration::from_millis(1500);
/// …or this long, while it waits for ARP: the kernel frees it with
/// NEIGH_FAILED after its probes (ucast 3 + mcast 3, 1 s apart).
pub(super) const ARP_PATIENCE: Duration = Duration::from_millis(6500);

/// What the targets tell of names and subnets, for the stories.
pub(super) fn context_of(args: &Args, targets: &Targets) -> Context {
    let mut ctx = Context::default();
    for pod in &targets.inventory.pods {
        let ipv4 = pod.ip.map(IpAddr::V4);
        for ip in ipv4
            .into_iter()
            .chain(pod.ipv6.iter().map(|ip| (*ip).into()))
        {
            ctx.names.insert(ip, pod.qualified());
        }
    }
    for endpoint in [&targets.src, &targets.dst] {
        if let Some(name) = endpoint.name() {
            let ipv6 = targets.ipv6_of(endpoint).map(IpAddr::V6);
            for ip in ipv6.into_iter().chain([endpoint.ip]) {
                ctx.names.insert(ip, name.clone());
            }
        }
    }
    for (node, ip) in targets.known_nodes() {
        ctx.names.insert(ip.into(), node);
    }
    for (node, ip) in targets.known_nodes6() {
        ctx.names.insert(ip.into(), node);
    }
    for t in &targets.nat.translations {
        if let Some(pod) = &t.backend {
            ctx.names.entry(t.back.ip).or_insert_with(|| pod.clone());
        }
    }
    ctx.nat = targets.nat.clone();
    ctx.policies = targets.policies.clone();
    ctx.subnets = targets.subnets.clone();
    ctx.pod_cidrs = args.pod_cidr.clone();
    // The node's file, not the container's (an agent's --host-root).
    let root = args.kube.host_root.first().cloned();
    let root = HostRoot::new(root.unwrap_or_else(|| "/".into()));
    ctx.pod_cidrs.extend(cni::subnet_env_network(&root));
    ctx
}

/// Each traced end's addresses (of both families) and the node it runs
/// on, where known.
pub(super) fn endpoint_nodes(targets: &Targets) -> Vec<(IpAddr, String)> {
    let addresses =
        |e: &crate::cluster::inventory::Endpoint| [Some(e.ip), targets.ipv6_of(e).map(IpAddr::V6)];
    [&targets.src, &targets.dst]
        .into_iter()
        .filter_map(|e| Some((addresses(e), Targets::node_of(e)?)))
        .flat_map(|(ips, node)| ips.into_iter().flatten().map(|ip| (ip, node.to_string())))
        .collect()
}
