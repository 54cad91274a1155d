//! The other nodes' pod subnets as the traced nodes show them to each
//! other, where no node list says: the IPAM block Calico blackholes, else
//! the widest subnet a node delivers locally; with the address node
//! `here` reaches that node by, its VTEP, and its CNI backend. What the
//! expected routes of `explain.rs` are written toward.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::IpNet;

use crate::{
    cni,
    model::{NodeSubnet, NodeSubnet6, Vtep6},
    node::NodeFacts,
};

/// The IPv6 pod subnet holding `dst` on another traced node, with what
/// node `here` reaches it by: the node's IPv6 address on an underlay they
/// share, and its IPv6 VTEP; and the node's CNI backend.
pub(super) fn traced_subnet6(
    dst: Ipv6Addr,
    nodes: &HashMap<String, NodeFacts>,
    here: &str,
) -> Option<(NodeSubnet6, Option<&'static dyn cni::Backend>)> {
    let here_view = &nodes.get(here)?.view;
    pod_subnets_elsewhere(dst.into(), nodes, here).find_map(|(name, facts, subnet)| {
        let ipnet::IpNet::V6(subnet) = subnet else {
            return None;
        };
        let view = &facts.view;
        let node_ip = (view.addresses6.iter())
            .map(|(_, ip)| *ip)
            .find(|ip| here_view.link_on_subnet_of(*ip).is_some());
        let vtep = ipv6_vtep(view).map(|(device, ip)| Vtep6 {
            // Named as this node has it: CNIs name it alike on every node.
            device: here_view
                .link_named(device)
                .map_or(device, |l| &l.name)
                .to_string(),
            ip,
        });
        let remote = NodeSubnet6 {
            node: name.clone(),
            subnet,
            node_ip,
            vtep,
        };
        Some((remote, cni::by_name(facts.cni)))
    })
}

/// A node's IPv6 VTEP: a tunnel device with an IPv6 address of its own,
/// preferring one over an IPv6 underlay (flannel-v6.1, vxlan-v6.calico)
/// to an IPv4 one that also carries IPv6 (flannel.1 in some dual-stack
/// setups).
fn ipv6_vtep(view: &crate::node::NodeView) -> Option<(&str, Ipv6Addr)> {
    let vteps = view
        .links
        .iter()
        .filter(|l| l.is_tunnel())
        .filter_map(|link| {
            let (_, ip) = (view.addresses6.iter()).find(|(index, _)| *index == link.index)?;
            let over_ipv6 = (link.vxlan.and_then(|v| v.local)).is_some_and(|l| l.is_ipv6());
            Some((over_ipv6, link.name.as_str(), *ip))
        });
    let best = vteps.max_by_key(|(over_ipv6, ..)| *over_ipv6)?;
    Some((best.1, best.2))
}

/// Each other traced node (not `here`) with a pod subnet holding `dst`,
/// and the narrowest such subnet: its IPAM blocks (Calico blackholes
/// them, `proto bird`) and the subnets it delivers locally (cni0's).
fn pod_subnets_elsewhere<'a>(
    dst: IpAddr,
    nodes: &'a HashMap<String, NodeFacts>,
    here: &'a str,
) -> impl Iterator<Item = (&'a String, &'a NodeFacts, ipnet::IpNet)> {
    let others = nodes.iter().filter(move |(name, _)| name.as_str() != here);
    others.filter_map(move |(name, facts)| {
        let subnet = (facts.view.calico_blocks())
            .chain(facts.local_pod_subnets.iter().copied())
            .filter(|net| net.contains(&dst))
            .min_by_key(|net| net.prefix_len())?;
        Some((name, facts, subnet))
    })
}

/// The IPv4 address of the link a node's default route leaves by.
fn default_route_address(view: &crate::node::NodeView) -> Option<Ipv4Addr> {
    let link = view.default_route_link()?.index;
    (view.addresses.iter()).find_map(|(index, ip)| (*index == link).then_some(*ip))
}

/// Every other node's pod subnet, as the node list gives them, else as
/// the traced nodes show them to each other: what a backend's routing of
/// a node on the same subnet is read from (`cni::direct_routing`).
pub(super) fn every_remote_subnet(
    subnets: &[NodeSubnet],
    nodes: &HashMap<String, NodeFacts>,
) -> Vec<NodeSubnet> {
    if !subnets.is_empty() {
        return subnets.to_vec();
    }
    let mut all = Vec::new();
    for here in nodes.keys() {
        for (_, facts) in nodes.iter().filter(|(name, _)| *name != here) {
            let pods = facts.view.calico_blocks();
            let inside =
                (pods.chain(facts.local_pod_subnets.iter().copied())).find_map(|net| match net {
                    IpNet::V4(v4) => Some(v4.network()),
                    IpNet::V6(_) => None,
                });
            all.extend(inside.and_then(|ip| traced_subnet(ip, nodes, here)));
        }
    }
    all
}

/// The pod subnet holding `dst` as another traced node shows it, where no
/// node list says: its IPAM block (Calico blackholes it, `proto bird`),
/// else the widest subnet it delivers locally (cni0's); its node IP is its
/// address on a subnet node `here` reaches directly.
pub(super) fn traced_subnet(
    dst: Ipv4Addr,
    nodes: &HashMap<String, NodeFacts>,
    here: &str,
) -> Option<NodeSubnet> {
    let here_view = &nodes.get(here)?.view;
    pod_subnets_elsewhere(dst.into(), nodes, here).find_map(|(name, facts, subnet)| {
        let ipnet::IpNet::V4(subnet) = subnet else {
            return None;
        };
        let view = &facts.view;
        // A node on another subnet is reached by its address on the link
        // of its default route.
        let node_ip = (view.own_addresses())
            .find(|ip| here_view.link_on_subnet_of(*ip).is_some())
            .or_else(|| default_route_address(view))?;
        let backend = cni::by_name(facts.cni);
        // Its VTEP: the address on its backend's tunnel device.
        let tunnel = backend
            .and_then(|b| b.tunnel())
            .and_then(|t| view.link_named(t.device));
        let tunnel_ip = tunnel.and_then(|l| {
            let on_tunnel = view.addresses.iter().find(|(index, _)| *index == l.index);
            on_tunnel.map(|(_, ip)| *ip)
        });
        Some(NodeSubnet {
            node: name.clone(),
            subnet,
            node_ip,
            cni: Some(facts.cni),
            tunnel_ip,
        })
    })
}
