//! A packet last seen entering a WireGuard device (Flannel's flannel-wg,
//! Calico's wireguard.cali, Cilium's cilium_wg0). WireGuard encrypts it
//! into UDP to its peer: nothing of the packet is left to follow on the
//! underlay, and where the other node's device takes it back, WireGuard
//! itself frees what it will not hand on (a source outside the sending
//! peer's allowed-ips, no session) without the kernel's drop tracepoint.
//! So "never at the next hook" needs saying what podtrace cannot see,
//! and where to look.

use std::{collections::HashMap, net::IpAddr};

use crate::{
    decode::hop::{Direction, Hop},
    model::NodeSubnet,
    node::NodeFacts,
};

const KIND: &str = "wireguard";

/// What to say of a journey whose last hop is the way into a WireGuard
/// device; None for any other.
pub(super) fn lost_after_encryption(
    hops: &[Hop],
    nodes: &HashMap<String, NodeFacts>,
    subnets: &[NodeSubnet],
) -> Option<String> {
    let last = hops.last()?;
    let facts = nodes.get(&*last.node)?;
    let device = facts.view.link_named(&last.iface)?;
    if device.kind != KIND || last.direction != Direction::Egress {
        return None;
    }
    let (src, dst) = (last.packet.packet.src, last.packet.packet.dst);
    let here = format!(
        "{} on {} is a WireGuard device: it encrypts the packet into UDP to its peer, which podtrace cannot follow on the underlay",
        last.iface, last.node
    );
    let Some(there) = node_of(dst, subnets, nodes) else {
        return Some(here);
    };
    let Some(remote) = nodes.get(there) else {
        return Some(format!(
            "{here}; trace {there} too, to see whether its WireGuard device hands it on"
        ));
    };
    let Some(remote_device) = remote.view.links_of_kind(KIND).next() else {
        return Some(format!(
            "{here}; {there} has no WireGuard device to take it back"
        ));
    };
    let dev = &remote_device.name;
    Some(format!(
        "{here}; {there}'s {dev} never handed it on: WireGuard there frees a decrypted packet whose source is outside the allowed-ips of the peer that sent it ({}'s peer must allow {src}: wg show {dev} allowed-ips on {there}), or one from a peer it has no session with (wg show {dev} latest-handshakes)",
        last.node
    ))
}

/// The node whose pod subnet holds `ip`: by the node list, else the
/// traced node that delivers it locally.
fn node_of<'a>(
    ip: IpAddr,
    subnets: &'a [NodeSubnet],
    nodes: &'a HashMap<String, NodeFacts>,
) -> Option<&'a str> {
    let listed = subnets
        .iter()
        .find(|s| matches!(ip, IpAddr::V4(v4) if s.subnet.contains(&v4)))
        .map(|s| s.node.as_str());
    listed.or_else(|| {
        (nodes.iter())
            .find(|(_, facts)| facts.local_pod_subnets.iter().any(|net| net.contains(&ip)))
            .map(|(name, _)| name.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decode::{hop::tests::hop, tests as frames},
        node::{fixtures::link, interfaces::Role, NodeView},
    };

    fn wireguard_node() -> NodeFacts {
        NodeFacts {
            view: NodeView {
                links: vec![link(2, "eth0", ""), link(7, "flannel-wg", "wireguard")],
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn subnets() -> Vec<NodeSubnet> {
        (1..=2)
            .map(|n| NodeSubnet {
                node: format!("node-{n}"),
                subnet: format!("10.244.{n}.0/24").parse().unwrap(),
                node_ip: format!("192.0.2.1{n}").parse().unwrap(),
                cni: None,
                tunnel_ip: None,
            })
            .collect()
    }

    fn into_flannel_wg() -> Vec<Hop> {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
        vec![hop(
            5,
            "node-1",
            "flannel-wg",
            Role::Tunnel,
            Direction::Egress,
            &frame,
        )]
    }

    #[test]
    fn a_packet_lost_after_encryption_names_the_other_nodes_allowed_ips_and_handshake() {
        let nodes = HashMap::from([
            ("node-1".to_string(), wireguard_node()),
            ("node-2".to_string(), wireguard_node()),
        ]);
        let said = lost_after_encryption(&into_flannel_wg(), &nodes, &subnets()).unwrap();
        assert!(said.starts_with("flannel-wg on node-1 is a WireGuard device: it encrypts the packet into UDP to its peer"), "{said}");
        assert!(
            said.contains("node-2's flannel-wg never handed it on"),
            "{said}"
        );
        assert!(
            said.contains(
                "node-1's peer must allow 10.244.1.2: wg show flannel-wg allowed-ips on node-2"
            ),
            "{said}"
        );
    }

    #[test]
    fn without_a_node_list_the_node_delivering_the_pod_locally_is_the_other_end() {
        let mut node_2 = wireguard_node();
        node_2.local_pod_subnets = vec!["10.244.2.0/24".parse().unwrap()];
        let nodes = HashMap::from([
            ("node-1".to_string(), wireguard_node()),
            ("node-2".to_string(), node_2),
        ]);
        let said = lost_after_encryption(&into_flannel_wg(), &nodes, &[]).unwrap();
        assert!(
            said.contains("node-2's flannel-wg never handed it on"),
            "{said}"
        );
    }

    #[test]
    fn with_the_other_node_untraced_it_asks_for_it() {
        let nodes = HashMap::from([("node-1".to_string(), wireguard_node())]);
        let said = lost_after_encryption(&into_flannel_wg(), &nodes, &subnets()).unwrap();
        assert!(
            said.ends_with("; trace node-2 too, to see whether its WireGuard device hands it on"),
            "{said}"
        );
    }

    #[test]
    fn a_packet_last_seen_on_another_device_is_not_wireguards() {
        let nodes = HashMap::from([("node-1".to_string(), wireguard_node())]);
        let mut hops = into_flannel_wg();
        hops[0].iface = "eth0".into();
        assert_eq!(lost_after_encryption(&hops, &nodes, &subnets()), None);
        hops[0].iface = "flannel-wg".into();
        hops[0].direction = Direction::Ingress;
        assert_eq!(lost_after_encryption(&hops, &nodes, &subnets()), None);
    }
}
