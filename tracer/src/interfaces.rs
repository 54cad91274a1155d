//! Which interfaces of a node podtrace watches, and what each one is for.

use std::net::Ipv4Addr;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::node::{Link, NodeView};

/// The part an interface plays on a Kubernetes node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Watched {
    pub index: u32,
    pub name: String,
    pub role: Role,
    pub has_ethernet_header: bool,
}

const TUNNEL_KINDS: &[&str] = &["vxlan", "geneve", "ipip", "wireguard"];

/// Picks the interfaces to attach to: the underlay (the link holding
/// `node_ip`, or else the one the default route leaves by), CNI bridges,
/// overlay devices, and every pod-facing veth.
pub fn select(view: &NodeView, node_ip: Option<Ipv4Addr>) -> Result<Vec<Watched>> {
    let underlay = underlay(view, node_ip)?.index;
    Ok(view
        .links
        .iter()
        .filter_map(|link| watch(link, underlay))
        .collect())
}

/// The link as a watched interface, if it plays a part on the node.
pub fn watch(link: &Link, underlay: u32) -> Option<Watched> {
    let role = if link.index == underlay {
        Role::Underlay
    } else if link.kind == "bridge" {
        Role::Bridge
    } else if TUNNEL_KINDS.contains(&link.kind.as_str()) {
        Role::Tunnel
    } else if link.kind == "veth" {
        Role::PodVeth
    } else {
        return None;
    };
    Some(Watched {
        index: link.index,
        name: link.name.clone(),
        role,
        has_ethernet_header: link.has_ethernet_header,
    })
}

fn underlay(view: &NodeView, node_ip: Option<Ipv4Addr>) -> Result<&Link> {
    if let Some(ip) = node_ip {
        if let Some(link) = view.link_with_address(ip) {
            return Ok(link);
        }
    }
    let default = view
        .route_to(Ipv4Addr::UNSPECIFIED)
        .filter(|r| r.destination.prefix_len() == 0)
        .and_then(|r| r.oif)
        .and_then(|oif| view.link(oif));
    match (default, node_ip) {
        (Some(link), _) => Ok(link),
        (None, Some(ip)) => {
            bail!("no interface holds the node IP {ip} and there is no default route")
        }
        (None, None) => {
            bail!("cannot find the underlay: no default route (name the node IP with --node-ip)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::fixtures::flannel_node;

    #[test]
    fn the_underlay_is_the_link_with_the_node_ip_even_when_it_is_a_veth() {
        let watched = select(&flannel_node(), Some("192.0.2.11".parse().unwrap())).unwrap();
        let roles: Vec<_> = watched.iter().map(|w| (w.name.as_str(), w.role)).collect();
        assert_eq!(
            roles,
            [
                ("eth0", Role::Underlay),
                ("cni0", Role::Bridge),
                ("flannel.1", Role::Tunnel),
                ("veth1a2b", Role::PodVeth),
                ("tunl0", Role::Tunnel),
            ]
        );
        assert!(!watched[4].has_ethernet_header);
    }

    #[test]
    fn without_a_node_ip_the_default_route_names_the_underlay() {
        let watched = select(&flannel_node(), None).unwrap();
        assert_eq!(watched[0].role, Role::Underlay);
        assert_eq!(watched[0].name, "eth0");
    }

    #[test]
    fn no_underlay_is_an_error() {
        let mut view = flannel_node();
        view.routes.clear();
        assert!(select(&view, None).is_err());
    }
}
