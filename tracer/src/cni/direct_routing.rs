//! Tunnelling backends that route a node on their own subnet natively:
//! Calico's pools with `vxlanMode`/`ipipMode: CrossSubnet` and Flannel's
//! VXLAN with `DirectRouting` send the pods of a node reached without a
//! gateway straight to that node over the underlay
//! (`<block> via <node IP> dev eth0`), and tunnel only across subnets.
//!
//! The setting lives in the IP pool or in flannel's net-conf.json, which a
//! node does not show; the routes do. So the mode is read from the traced
//! nodes' own routes to the other nodes of their subnet, and where no
//! such route is left to read, both routes are told.

pub use super::backend::DirectRouting;
use super::{
    backend::{named, to_pods_of},
    Backend,
};
use crate::{
    model::NodeSubnet,
    node::{NodeView, RouteKind, RT_TABLE_MAIN},
};

/// What the traced nodes' routes say of the pods of a node on the same
/// subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SameSubnetMode {
    /// Routed natively, via the node over the underlay.
    Native,
    /// Routed through the tunnel device like any other node's.
    Tunnelled,
    /// No traced node routes a same-subnet node's pods.
    Unseen,
}

/// Reads the mode off every traced node's main-table route toward each
/// other listed node on its own subnet; the first such route through a
/// tunnel, or via that node over the underlay, decides.
pub fn same_subnet_mode<'a>(
    views: impl IntoIterator<Item = &'a NodeView>,
    subnets: &[NodeSubnet],
) -> SameSubnetMode {
    for view in views {
        for remote in subnets {
            let ours = view.link_with_address(remote.node_ip).is_some();
            if ours || view.link_on_subnet_of(remote.node_ip).is_none() {
                continue;
            }
            let route = view.routes.iter().find(|r| {
                r.table == RT_TABLE_MAIN
                    && r.kind == RouteKind::Unicast
                    && r.destination == remote.subnet.into()
            });
            let Some((route, device)) = route.and_then(|r| Some((r, view.link(r.oif?)?))) else {
                continue;
            };
            if device.is_tunnel() {
                return SameSubnetMode::Tunnelled;
            }
            if route.gateway == Some(remote.node_ip.into()) {
                return SameSubnetMode::Native;
            }
        }
    }
    SameSubnetMode::Unseen
}

/// The route `here` needs toward `remote`'s pods: the backend's tunnel
/// route, unless `remote` is on `here`'s subnet and the backend routes
/// such nodes natively, as `mode` shows it or may.
pub fn expected_route(
    backend: &dyn Backend,
    here: &NodeView,
    remote: &NodeSubnet,
    underlay: &str,
    mode: SameSubnetMode,
) -> String {
    let tunnelled = backend.expected_route(remote, underlay);
    let Some(direct) = backend.direct_routing() else {
        return tunnelled;
    };
    // Across subnets every mode tunnels.
    let Some(link) = here.link_on_subnet_of(remote.node_ip) else {
        return tunnelled;
    };
    let native = to_pods_of(remote, remote.node_ip, false, direct.protocol);
    let native = named(&native, &link.name, direct.what, remote);
    let same = format!("{} is on this node's {} subnet", remote.node, link.name);
    match mode {
        SameSubnetMode::Tunnelled => tunnelled,
        SameSubnetMode::Native => format!(
            "{native}, natively: {same}, and the nodes route such pods natively ({})",
            direct.setting
        ),
        SameSubnetMode::Unseen => format!(
            "{tunnelled}; or, with {}, {native} ({same})",
            direct.setting
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{
        fixtures::{flannel_node, route},
        Route,
    };

    fn remote(node: &str, subnet: &str, node_ip: &str) -> NodeSubnet {
        NodeSubnet {
            node: node.into(),
            subnet: subnet.parse().unwrap(),
            node_ip: node_ip.parse().unwrap(),
            cni: None,
            tunnel_ip: None,
        }
    }

    /// node-1 of a flannel-vxlan cluster on 192.0.2.0/24: node-2 on its
    /// subnet, node-3 a router away.
    fn cluster() -> (NodeView, Vec<NodeSubnet>) {
        let mut here = flannel_node();
        here.routes.push(route("192.0.2.0/24", 2));
        let remotes = vec![
            remote("node-2", "10.244.2.0/24", "192.0.2.12"),
            remote("node-3", "10.244.3.0/24", "198.51.100.13"),
        ];
        (here, remotes)
    }

    #[test]
    fn the_mode_is_read_off_the_route_to_a_node_on_the_same_subnet() {
        let (mut here, remotes) = cluster();
        // Through flannel.1, as the fixture routes node-2: Always.
        assert_eq!(
            same_subnet_mode([&here], &remotes),
            SameSubnetMode::Tunnelled
        );
        // Straight to node-2 over eth0: DirectRouting.
        let to_node2 = here.routes.iter_mut().find(|r| r.oif == Some(4)).unwrap();
        *to_node2 = Route {
            gateway: Some("192.0.2.12".parse().unwrap()),
            ..route("10.244.2.0/24", 2)
        };
        assert_eq!(same_subnet_mode([&here], &remotes), SameSubnetMode::Native);
        // node-3's route, across subnets, says nothing of the mode.
        here.routes
            .retain(|r| r.destination != remotes[0].subnet.into());
        assert_eq!(same_subnet_mode([&here], &remotes), SameSubnetMode::Unseen);
    }

    #[test]
    fn a_node_on_the_same_subnet_is_expected_native_only_where_the_nodes_route_so() {
        let (here, remotes) = cluster();
        let flannel = super::super::by_name("flannel-vxlan").unwrap();
        let expect =
            |remote: &NodeSubnet, mode| expected_route(flannel, &here, remote, "eth0", mode);
        let tunnel = "10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink";
        let native = "10.244.2.0/24 via 192.0.2.12 dev eth0 (route -n: ";
        assert!(expect(&remotes[0], SameSubnetMode::Tunnelled).starts_with(tunnel));
        let told = expect(&remotes[0], SameSubnetMode::Native);
        assert!(told.starts_with(native), "{told}");
        assert!(
            told.contains("node-2 is on this node's eth0 subnet"),
            "{told}"
        );
        assert!(told.contains("DirectRouting"), "{told}");
        // Unseen: both, the tunnel first (every backend's default).
        let told = expect(&remotes[0], SameSubnetMode::Unseen);
        assert!(told.starts_with(tunnel), "{told}");
        assert!(
            told.contains(&format!(
                "; or, with flannel's VXLAN DirectRouting, {native}"
            )),
            "{told}"
        );
        // Across subnets, the tunnel in every mode.
        for mode in [SameSubnetMode::Native, SameSubnetMode::Unseen] {
            let told = expect(&remotes[1], mode);
            assert!(
                told.starts_with("10.244.3.0/24 via 10.244.3.0 dev flannel.1 onlink"),
                "{told}"
            );
            assert!(!told.contains("eth0"), "{told}");
        }
        // A backend without a tunnel is unchanged.
        let host_gw = super::super::by_name("flannel-host-gw").unwrap();
        assert_eq!(
            expected_route(host_gw, &here, &remotes[0], "eth0", SameSubnetMode::Unseen),
            host_gw.expected_route(&remotes[0], "eth0")
        );
    }
}
