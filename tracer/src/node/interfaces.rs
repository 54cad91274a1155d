//! The interfaces of a node podtrace watches, and what each one is for.
//! The roles come from the node's CNI backend (`cni::watch` picks them);
//! the underlay is found from what the node has.

use std::net::Ipv4Addr;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::{Link, NodeView};
use crate::model::Name;

/// The part an interface plays on a Kubernetes node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
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

/// What a node's underlay can be told from, besides its own tables.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnderlayClues<'a> {
    /// The node's IP: its InternalIP, or `--node-ip`.
    pub node_ip: Option<Ipv4Addr>,
    /// The other nodes' IPs, from the node list.
    pub other_nodes: &'a [Ipv4Addr],
    /// The addresses the other traced namespaces hold (other nodes, when
    /// no node list says which they are).
    pub other_traced: &'a [Ipv4Addr],
    /// The traced addresses: where the node routes them via a gateway,
    /// that route leaves by the underlay.
    pub traced: &'a [Ipv4Addr],
}

/// The interface that carries traffic between nodes, from the best
/// evidence the node has: the link holding the node's IP; the device a
/// VXLAN tunnel sends through, or the link holding its `local` address;
/// the route toward another node; the subnet holding another traced
/// namespace's address; the route via a gateway toward a traced address
/// (a BGP node's `via <node> dev eth0 proto bird`); and last the default
/// route. Bare-metal and BGP nodes often have no default route.
pub fn underlay<'a>(view: &'a NodeView, clues: &UnderlayClues<'_>) -> Result<&'a Link> {
    let by_node_ip = clues.node_ip.and_then(|ip| view.link_with_address(ip));
    let by_tunnel = || {
        view.links_of_kind("vxlan").find_map(|tunnel| {
            let vxlan = tunnel.vxlan?;
            vxlan
                .dev
                .and_then(|dev| view.link(dev))
                .or_else(|| view.link_with_address(vxlan.local?))
        })
    };
    let by_route = |dst: &Ipv4Addr| {
        view.route_to(*dst)
            .and_then(|r| r.oif)
            .and_then(|oif| view.link(oif))
    };
    let by_other_node = || clues.other_nodes.iter().find_map(by_route);
    let by_other_traced = || {
        let addresses = clues.other_traced.iter();
        addresses
            .filter(|ip| !view.holds(**ip))
            .find_map(|ip| view.link_on_subnet_of(*ip))
    };
    let by_traced_route = || {
        let addresses = clues.traced.iter();
        addresses
            .filter(|ip| !view.holds(**ip))
            .find_map(|ip| view.link_toward_gateway(*ip))
    };
    let by_default = || view.default_route_link();
    if let Some(link) = by_node_ip
        .or_else(by_tunnel)
        .or_else(by_other_node)
        .or_else(by_other_traced)
        .or_else(by_traced_route)
        .or_else(by_default)
    {
        return Ok(link);
    }
    match clues.node_ip {
        Some(ip) => bail!(
            "no interface holds the node IP {ip}, no tunnel device names one, and there is no route toward another node or default route"
        ),
        None => bail!(
            "cannot find the underlay: no tunnel device names one, no route leads to another node or via a gateway toward a traced address, and there is no default route (name the node IP with --node-ip)"
        ),
    }
}

/// Subnets the node delivers locally, through a bridge or a pod veth: a
/// packet heading there must show up again on this node.
pub fn local_pod_subnets(view: &NodeView, watched: &[Watched]) -> Vec<ipnet::IpNet> {
    view.routes
        .iter()
        .filter(|route| {
            let delivers_locally = route
                .oif
                .and_then(|oif| watched.iter().find(|w| w.index == oif))
                .is_some_and(|w| matches!(w.role, Role::Bridge | Role::PodVeth));
            delivers_locally && route.destination.prefix_len() > 0 && route.gateway.is_none()
        })
        .map(|route| route.destination)
        .collect()
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
        let none = UnderlayClues::default();
        assert_eq!(underlay(&view, &none).unwrap().name, "eth0");
        view.links[3].vxlan = None;
        assert!(underlay(&view, &none).is_err());
        // A static route toward the other node.
        view.routes
            .push(crate::node::fixtures::route("192.0.2.0/24", 2));
        let other = ["192.0.2.12".parse().unwrap()];
        let clues = UnderlayClues {
            other_nodes: &other,
            ..none
        };
        assert_eq!(underlay(&view, &clues).unwrap().name, "eth0");
    }

    #[test]
    fn a_bgp_node_without_a_default_route_finds_its_underlay_from_what_is_traced() {
        let view = crate::node::fixtures::calico_bgp_node(1);
        let none = UnderlayClues::default();
        let told = underlay(&view, &none).unwrap_err().to_string();
        assert!(told.starts_with("cannot find the underlay"), "{told}");
        // The local pod is reached without a gateway: no underlay there.
        let local_pod = ["10.247.1.5".parse().unwrap()];
        let clues = UnderlayClues {
            traced: &local_pod,
            ..none
        };
        assert!(underlay(&view, &clues).is_err());
        // The route to the traced pod on node-2 names it.
        let pair = ["10.247.1.5".parse().unwrap(), "10.247.2.3".parse().unwrap()];
        let clues = UnderlayClues {
            traced: &pair,
            ..none
        };
        assert_eq!(underlay(&view, &clues).unwrap().name, "ens3");
        // Through tunl0 (IPIP), the gateway's subnet names it.
        let mut ipip = view.clone();
        let to_node_2 = ipip.routes.last_mut().unwrap();
        (to_node_2.oif, to_node_2.onlink) = (Some(3), true);
        assert_eq!(underlay(&ipip, &clues).unwrap().name, "ens3");
        // Without that route, node-2's own address, on ens3's subnet.
        let mut unrouted = view.clone();
        unrouted.routes.pop();
        let node_2 = ["127.0.0.1".parse().unwrap(), "192.0.2.42".parse().unwrap()];
        let clues = UnderlayClues {
            other_traced: &node_2,
            traced: &pair,
            ..none
        };
        assert_eq!(underlay(&unrouted, &clues).unwrap().name, "ens3");
    }
}
