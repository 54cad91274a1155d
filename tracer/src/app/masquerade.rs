//! Node mode's pairs traced ahead of a MASQUERADE of the traced pair, so
//! that its first packet is joined across the translation too.

use std::net::Ipv4Addr;

use anyhow::Result;
use podtrace_common::FlowKey;

use super::{pairs::flow_ips, trace::Trace};

/// At most this many (node address, peer) pairs are traced ahead of a
/// MASQUERADE: the kernel filter holds 1024 pairs.
const MAX_MASQUERADE_PAIRS: usize = 128;

/// Where a MASQUERADE of the traced pair may take it, traced from the
/// start, so that its first packet is seen after the translation too: a
/// MASQUERADE takes an address of the node (the way out's), the peer is a
/// Service backend (hairpin, a NodePort from another node) or the
/// destination outside the cluster. Only to join: traffic between them is
/// told only as part of the traced pair's (conntrack then says which
/// port). Node mode; cluster mode learns these from conntrack.
pub(super) fn trace_masquerade_sources(trace: &mut Trace) -> Result<()> {
    let (targets, ctx) = (&trace.targets, &trace.ctx);
    let node_addresses: Vec<Ipv4Addr> = ctx
        .nodes
        .values()
        .flat_map(|facts| facts.view.own_addresses())
        .filter(|ip| !ip.is_loopback())
        .collect();
    let in_the_cluster = |ip: Ipv4Addr| {
        ctx.expects_arrival(ip.into())
            || ctx
                .subnets
                .iter()
                .any(|s| s.subnet.contains(&ip) || s.node_ip == ip)
            || ctx.pod_cidrs.iter().any(|net| net.contains(&ip))
            || node_addresses.contains(&ip)
    };
    // (An IPv6 destination outside the cluster is not followed through a
    // masquerade: clusters NAT IPv6 egress rarely.)
    let outside = targets.dst.pod.is_none()
        && targets.service.is_none()
        && targets.dst.ipv4().is_some_and(|dst| !in_the_cluster(dst));
    let mut peers: Vec<std::net::IpAddr> = targets
        .nat
        .translations
        .iter()
        .filter(|t| !t.source)
        .map(|t| t.back.ip)
        .chain(outside.then_some(targets.dst.ip))
        .collect();
    peers.sort();
    peers.dedup();
    // The node's IPv4 addresses are masqueraded to: IPv4 peers only.
    let pairs: Vec<(Ipv4Addr, Ipv4Addr)> = node_addresses
        .iter()
        .flat_map(|a| peers.iter().map(move |p| (*a, *p)))
        .filter_map(|(a, p)| match p {
            std::net::IpAddr::V4(p) if a != p => Some((a, p)),
            _ => None,
        })
        .collect();
    if pairs.is_empty() || pairs.len() > MAX_MASQUERADE_PAIRS {
        return Ok(());
    }
    let flows: Vec<FlowKey> = pairs.iter().flat_map(|pair| flow_ips(*pair)).collect();
    for node in &mut trace.nodes {
        node.probe.replace_flows(&[], &flows)?;
    }
    let learnt = pairs
        .iter()
        .flat_map(|(a, b)| [((*a).into(), (*b).into()), ((*b).into(), (*a).into())]);
    trace.learnt_pairs.extend(learnt);
    trace.joining_only.extend(pairs);
    Ok(())
}
