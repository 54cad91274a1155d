//! The interfaces of a node podtrace watches, and what each one is for.
//! The roles come from the node's CNI backend (`cni::watch` picks them);
//! the underlay is found from what the node has.

use std::net::Ipv4Addr;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::{Link, NodeView};
use crate::model::Name;

/// The part an interface plays on a Kubernetes node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Host side of a pod's veth (Flannel's vethXXX, Calico's caliXXX).
    PodVeth,
    /// The CNI bridge (cni0, cbr0).
    Bridge,
    /// Overlay device: flannel.1, vxlan.calico, tunl0, genev_sys.
    Tunnel,
    /// The interface holding the node IP, where overlay packets leave.
    Underlay,
    /// Not watched (a drop was reported on it).
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watched {
    pub index: u32,
    pub name: Name,
    pub role: Role,
    pub has_ethernet_header: bool,
}

/// The interface that carries traffic between nodes, from the best
/// evidence the node has: the link holding the node's IP (its InternalIP,
/// or `--node-ip`); the device a VXLAN tunnel sends through, or the link
/// holding its `local` address; the route toward another node; and last
/// the default route. Bare-metal nodes often have no default route.
pub fn underlay<'a>(
    view: &'a NodeView,
    node_ip: Option<Ipv4Addr>,
    other_nodes: &[Ipv4Addr],
) -> Result<&'a Link> {
    let by_node_ip = node_ip.and_then(|ip| view.link_with_address(ip));
    let by_tunnel = || {
        view.links_of_kind("vxlan").find_map(|tunnel| {
            let vxlan = tunnel.vxlan?;
            vxlan
                .dev
                .and_then(|dev| view.link(dev))
                .or_else(|| view.link_with_address(vxlan.local?))
        })
    };
    let by_route = |dst: Ipv4Addr| {
        view.route_to(dst)
            .and_then(|r| r.oif)
            .and_then(|oif| view.link(oif))
    };
    let by_other_node = || other_nodes.iter().find_map(|ip| by_route(*ip));
    let by_default = || {
        view.route_to(Ipv4Addr::UNSPECIFIED)
            .filter(|r| r.destination.prefix_len() == 0)
            .and_then(|r| r.oif)
            .and_then(|oif| view.link(oif))
    };
    if let Some(link) = by_node_ip
        .or_else(by_tunnel)
        .or_else(by_other_node)
        .or_else(by_default)
    {
        return Ok(link);
    }
    match node_ip {
        Some(ip) => bail!(
            "no interface holds the node IP {ip}, no tunnel device names one, and there is no route toward another node or default route"
        ),
        None => bail!(
            "cannot find the underlay: no tunnel device names one, no route leads to another node, and there is no default route (name the node IP with --node-ip)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::fixtures::flannel_node;

    #[test]
    fn without_a_default_route_the_tunnel_or_a_route_to_another_node_names_it() {
        let mut view = flannel_node();
        view.routes.retain(|r| r.destination.prefix_len() > 0);
        // flannel.1 says `dev eth0` (and `local 192.0.2.11`).
        assert_eq!(underlay(&view, None, &[]).unwrap().name, "eth0");
        view.links[3].vxlan = None;
        assert!(underlay(&view, None, &[]).is_err());
        // A static route toward the other node.
        view.routes
            .push(crate::node::fixtures::route("192.0.2.0/24", 2));
        let other = ["192.0.2.12".parse().unwrap()];
        assert_eq!(underlay(&view, None, &other).unwrap().name, "eth0");
    }
}
