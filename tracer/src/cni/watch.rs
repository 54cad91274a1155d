//! Which interfaces of a node podtrace watches: the underlay, and every
//! link the node's CNI backend gives a part.

use super::backend::Backend;
use crate::node::{
    interfaces::{Role, Watched},
    Link, NodeView,
};

/// Picks the interfaces to attach to: the underlay, CNI bridges, overlay
/// devices, and every pod-facing veth.
/// Where policy routing sends pod traffic out of another uplink (the AWS
/// VPC CNI's secondary ENIs), that one is an underlay too.
pub fn select(view: &NodeView, underlay: u32, cni: &dyn Backend) -> Vec<Watched> {
    let mut underlays = view.policy_uplinks();
    underlays.push(underlay);
    view.links
        .iter()
        .filter_map(|link| watch(link, &underlays, cni))
        .collect()
}

/// The link as a watched interface, if it plays a part on the node.
pub fn watch(link: &Link, underlays: &[u32], cni: &dyn Backend) -> Option<Watched> {
    let role = if underlays.contains(&link.index) {
        Role::Underlay
    } else {
        cni.role(link)?
    };
    Some(Watched {
        index: link.index,
        name: link.name.as_str().into(),
        role,
        has_ethernet_header: link.has_ethernet_header,
    })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{
        cni,
        node::{
            fixtures::flannel_node,
            interfaces::{underlay, UnderlayClues},
        },
    };

    fn roles(view: &NodeView, node_ip: Option<Ipv4Addr>) -> Vec<(String, Role)> {
        let cni = cni::detect(view, None);
        let clues = UnderlayClues {
            node_ip,
            ..Default::default()
        };
        let underlay = underlay(view, &clues).unwrap().index;
        select(view, underlay, cni)
            .into_iter()
            .map(|w| (w.name.to_string(), w.role))
            .collect()
    }

    #[test]
    fn the_underlay_is_the_link_with_the_node_ip_even_when_it_is_a_veth() {
        let view = flannel_node();
        let watched = roles(&view, Some("192.0.2.11".parse().unwrap()));
        let expected = [
            ("eth0", Role::Underlay),
            ("cni0", Role::Bridge),
            ("flannel.1", Role::Tunnel),
            ("veth1a2b", Role::PodVeth),
        ];
        assert_eq!(watched, expected.map(|(n, r)| (n.to_string(), r)).to_vec());
    }

    #[test]
    fn a_tunnel_is_watched_once_it_is_up() {
        // The fixture's tunl0 is down, as ipip.ko leaves it in every
        // namespace; Calico in IPIP mode brings it up.
        let mut view = flannel_node();
        let tunl0 = view.links.iter_mut().find(|l| l.name == "tunl0").unwrap();
        tunl0.up = true;
        let watched = roles(&view, Some("192.0.2.11".parse().unwrap()));
        assert!(watched.contains(&("tunl0".to_string(), Role::Tunnel)));
        assert!(!view.link_named("tunl0").unwrap().has_ethernet_header);
    }

    #[test]
    fn without_a_node_ip_the_default_route_names_the_underlay() {
        let mut view = flannel_node();
        view.links[3].vxlan = None;
        assert_eq!(roles(&view, None)[0], ("eth0".to_string(), Role::Underlay));
    }
}
