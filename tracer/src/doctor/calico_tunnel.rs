//! Calico's tunnel device on a node. calico-node annotates the Node with
//! the tunnel address it gave the device (`projectcalico.org/
//! IPv4IPIPTunnelAddr` on tunl0 in IPIP mode, `IPv4VXLANTunnelAddr` on
//! vxlan.calico): an annotated node whose device is missing, down or
//! without that address sends its pods' cross-node traffic nowhere,
//! while BIRD keeps routing the other nodes' blocks through it.

use std::net::Ipv4Addr;

use super::{node::NodeFacts, Check};

const FAMILY: &str = "calico";

/// A tunnel Calico may run: its annotation, its device, and what brings
/// the device back.
struct Tunnel {
    annotation: &'static str,
    device: &'static str,
    missing_fix: &'static str,
}

const TUNNELS: [Tunnel; 2] = [
    Tunnel {
        annotation: "projectcalico.org/IPv4IPIPTunnelAddr",
        device: "tunl0",
        missing_fix: "modprobe ipip (tunl0 is the ipip module's own device; add ipip to /etc/modules-load.d), then restart calico-node on this node",
    },
    Tunnel {
        annotation: "projectcalico.org/IPv4VXLANTunnelAddr",
        device: "vxlan.calico",
        missing_fix: "restart calico-node on this node (Felix creates vxlan.calico) and read its log for the VXLAN manager's errors",
    },
];

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    let Some(me) = &facts.me else {
        return Vec::new();
    };
    TUNNELS
        .iter()
        .filter_map(|tunnel| {
            let address = me.annotations[tunnel.annotation].as_str()?;
            Some(check(facts, tunnel, address))
        })
        .collect()
}

fn check(facts: &NodeFacts, tunnel: &Tunnel, address: &str) -> Check {
    let name = format!("{} device", tunnel.device);
    let device = tunnel.device;
    let annotated = format!("{}={address}", tunnel.annotation);
    let Some(link) = facts.view.link_named(device) else {
        return Check::fail(
            FAMILY,
            &facts.name,
            &name,
            format!("there is no {device} on this node, which is annotated {annotated}: pods' traffic to other nodes has no tunnel"),
            tunnel.missing_fix.into(),
        );
    };
    if !link.up {
        return Check::fail(
            FAMILY,
            &facts.name,
            &name,
            format!("{device} is down (annotated {annotated}): BIRD's routes through it lead nowhere"),
            format!("ip link set {device} up; Felix keeps it up, so read calico-node's log for why it did not"),
        );
    }
    let held = address
        .parse::<Ipv4Addr>()
        .is_ok_and(|ip| facts.view.addresses.contains(&(link.index, ip)));
    Check::judge(
        FAMILY,
        &facts.name,
        &name,
        held,
        if held {
            format!(
                "{device} is up with {address} ({}), MTU {}",
                tunnel.annotation, link.mtu
            )
        } else {
            format!("{device} is up without its annotated address {address} ({annotated}): replies to what the node sends through it go astray")
        },
        || {
            format!("ip addr add {address}/32 dev {device}, or restart calico-node on this node so that Felix sets it")
        },
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        doctor::{cluster::ClusterNode, Status},
        node::{fixtures::link, Link},
    };

    fn ipip_node(tunl0: Option<Link>, address: Option<&str>) -> NodeFacts {
        let mut facts = NodeFacts::of_root(&std::env::temp_dir());
        facts.name = "node-1".into();
        facts.me = Some(ClusterNode {
            name: "node-1".into(),
            annotations: json!({"projectcalico.org/IPv4IPIPTunnelAddr": "10.248.1.0"}),
            ..Default::default()
        });
        facts.view.links = tunl0.into_iter().collect();
        if let Some(address) = address {
            facts.view.addresses = vec![(3, address.parse().unwrap())];
        }
        facts
    }

    fn tunl0(up: bool) -> Link {
        Link {
            up,
            mtu: 1480,
            ..link(3, "tunl0", "ipip")
        }
    }

    #[test]
    fn an_ipip_node_with_tunl0_up_and_its_address_passes() {
        let checks = checks(&ipip_node(Some(tunl0(true)), Some("10.248.1.0")));
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].status, Status::Pass, "{:?}", checks[0]);
        assert_eq!(
            checks[0].evidence,
            "tunl0 is up with 10.248.1.0 (projectcalico.org/IPv4IPIPTunnelAddr), MTU 1480"
        );
    }

    #[test]
    fn tunl0_missing_down_or_without_its_address_fails_with_its_fix() {
        let missing = &checks(&ipip_node(None, None))[0];
        assert_eq!(missing.status, Status::Fail);
        assert!(
            missing.evidence.starts_with("there is no tunl0"),
            "{missing:?}"
        );
        assert!(missing.fix.as_deref().unwrap().starts_with("modprobe ipip"));
        let down = &checks(&ipip_node(Some(tunl0(false)), Some("10.248.1.0")))[0];
        assert_eq!(down.status, Status::Fail);
        assert!(down.evidence.starts_with("tunl0 is down"), "{down:?}");
        let bare = &checks(&ipip_node(Some(tunl0(true)), None))[0];
        assert_eq!(bare.status, Status::Fail);
        assert!(
            bare.fix
                .as_deref()
                .unwrap()
                .starts_with("ip addr add 10.248.1.0/32 dev tunl0"),
            "{bare:?}"
        );
    }

    #[test]
    fn a_node_without_a_tunnel_annotation_has_no_tunnel_check() {
        let mut facts = ipip_node(None, None);
        facts.me.as_mut().unwrap().annotations = json!({});
        assert!(checks(&facts).is_empty());
    }
}
