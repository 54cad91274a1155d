//! One home per CNI backend: how it wires a node, so that everything
//! podtrace infers from a node's devices, routes and annotations about the
//! CNI is said in one file per backend.
//!
//! A backend owns:
//! - how it is recognised: from the node's Kubernetes annotations, else
//!   from what the node has (tunnel devices, route protocols, veths);
//! - the tunnel it encapsulates with (device, port, VNI), if any;
//! - the route a node needs toward another node's pods;
//! - how a local pod's host-side interface is found;
//! - the part each interface plays (pod veth, bridge, tunnel).
//!
//! A new CNI is one new file here, one line in [`BACKENDS`], and its lab
//! topology in `xtask/src/lab/`.

mod backend;
mod calico_bird;
mod calico_ipip;
mod calico_vxlan;
pub mod direct_routing;
mod flannel_host_gw;
mod flannel_vxlan;
mod unknown;
pub mod watch;

use crate::node::NodeView;

pub use backend::{role_by_kind, Backend, TunnelSpec};
pub use calico_vxlan::VXLAN_TUNNEL_ADDR;
pub use flannel_vxlan::subnet_env_network;

/// Every backend, most specific first: detection takes the first match,
/// and `unknown` matches every node.
pub const BACKENDS: &[&dyn Backend] = &[
    &flannel_vxlan::FlannelVxlan,
    &calico_vxlan::CalicoVxlan,
    &calico_ipip::CalicoIpip,
    &calico_bird::CalicoBird,
    &flannel_host_gw::FlannelHostGw,
    &unknown::Unknown,
];

/// The backend a node runs: its annotations first (they are what the CNI
/// itself wrote), then its devices and routes.
pub fn detect(view: &NodeView, annotated: Option<&str>) -> &'static dyn Backend {
    annotated
        .and_then(by_name)
        .or_else(|| BACKENDS.iter().copied().find(|b| b.runs_on(view)))
        .unwrap_or_else(unknown)
}

/// The backend for a CNI podtrace has no file for.
pub fn unknown() -> &'static dyn Backend {
    &unknown::Unknown
}

pub fn by_name(name: &str) -> Option<&'static dyn Backend> {
    BACKENDS.iter().copied().find(|b| b.name() == name)
}

/// The backend a node's annotations name, if any.
pub fn from_annotations(annotations: &serde_json::Value) -> Option<&'static str> {
    BACKENDS
        .iter()
        .find(|b| b.annotated(annotations))
        .map(|b| b.name())
}

/// The backend whose tunnel listens on UDP `port`, on any node.
pub fn by_tunnel_port(port: u16) -> Option<&'static dyn Backend> {
    BACKENDS
        .iter()
        .copied()
        .find(|b| b.tunnel().and_then(|t| t.port) == Some(port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::NodeSubnet,
        node::{
            fixtures::{flannel_node, link, route},
            interfaces::Role,
            RouteOrigin,
        },
    };

    fn subnet(backend: &str) -> NodeSubnet {
        NodeSubnet {
            node: "node-2".into(),
            subnet: "10.244.2.0/24".parse().unwrap(),
            node_ip: "192.0.2.12".parse().unwrap(),
            cni: Some(by_name(backend).unwrap().name()),
            tunnel_ip: None,
        }
    }

    #[test]
    fn a_node_is_recognised_by_its_annotations_then_by_its_devices_and_routes() {
        let flannel = flannel_node();
        assert_eq!(detect(&flannel, None).name(), "flannel-vxlan");
        assert_eq!(
            detect(&flannel, Some("flannel-host-gw")).name(),
            "flannel-host-gw"
        );

        let mut calico = flannel_node();
        calico
            .links
            .retain(|l| l.kind != "vxlan" && l.kind != "bridge");
        calico.routes.push(crate::node::Route {
            protocol: RouteOrigin::Bird,
            gateway: Some("192.0.2.12".parse().unwrap()),
            ..route("10.245.2.0/24", 2)
        });
        assert_eq!(detect(&calico, None).name(), "calico-bird");

        let mut calico_vxlan = calico.clone();
        calico_vxlan.links.push(link(9, "vxlan.calico", "vxlan"));
        assert_eq!(detect(&calico_vxlan, None).name(), "calico-vxlan");

        let annotations = serde_json::json!({
            "flannel.alpha.coreos.com/backend-type": "host-gw",
        });
        assert_eq!(from_annotations(&annotations), Some("flannel-host-gw"));
        let annotations = serde_json::json!({
            "projectcalico.org/IPv4Address": "192.0.2.12/24",
            "projectcalico.org/IPv4VXLANTunnelAddr": "10.245.2.0",
        });
        assert_eq!(from_annotations(&annotations), Some("calico-vxlan"));
    }

    #[test]
    fn each_backend_names_the_route_a_node_needs_in_its_own_terms() {
        let route = |b: &str| by_name(b).unwrap().expected_route(&subnet(b), "eth0");
        assert_eq!(
            route("flannel-vxlan"),
            "10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink (route -n: 10.244.2.0 10.244.2.0 255.255.255.0 UG flannel.1) (pod subnet of node-2)"
        );
        assert_eq!(
            route("flannel-host-gw"),
            "10.244.2.0/24 via 192.0.2.12 dev eth0 (route -n: 10.244.2.0 192.0.2.12 255.255.255.0 UG eth0) (pod subnet of node-2)"
        );
        assert_eq!(
            route("calico-bird"),
            "10.244.2.0/24 via 192.0.2.12 dev eth0 proto bird (route -n: 10.244.2.0 192.0.2.12 255.255.255.0 UG eth0) (pod block of node-2)"
        );
        assert!(route("calico-vxlan").contains("dev vxlan.calico onlink"));
        assert!(route("calico-ipip").contains("dev tunl0 proto bird onlink (route -n: "));
    }

    #[test]
    fn each_backend_names_the_ipv6_route_a_node_needs_in_its_own_terms() {
        let subnet6 = |vtep: Option<&str>| crate::model::NodeSubnet6 {
            node: "node-2".into(),
            subnet: "fd00:10:244:2::/64".parse().unwrap(),
            node_ip: Some("fd5a:0:2::12".parse().unwrap()),
            vtep: vtep.map(|device| crate::model::Vtep6 {
                device: device.into(),
                ip: "fd00:10:244:2::".parse().unwrap(),
            }),
        };
        let route = |b: &str, vtep| {
            let backend = by_name(b).unwrap();
            backend.expected_route6(&subnet6(vtep), Some("eth0"))
        };
        let onlink = "fd00:10:244:2::/64 via fd00:10:244:2:: dev flannel-v6.1 onlink";
        assert!(route("flannel-vxlan", Some("flannel-v6.1")).starts_with(onlink));
        assert!(route("flannel-vxlan", Some("flannel-v6.1")).ends_with("(pod subnet of node-2)"));
        // IPv6 inside flannel.1: the VTEP the node shows, not the usual name.
        assert!(route("flannel-vxlan", Some("flannel.1")).contains("dev flannel.1 onlink"));
        assert_eq!(
            route("flannel-vxlan", None),
            "fd00:10:244:2::/64 via <its VTEP address> dev flannel-v6.1 onlink (pod subnet of node-2)"
        );
        assert!(route("calico-vxlan", None).contains("dev vxlan-v6.calico onlink (pod block"));
        let bird = "fd00:10:244:2::/64 via fd5a:0:2::12 dev eth0 proto bird (route -6 -n: ";
        assert!(route("calico-bird", None).starts_with(bird));
        // Calico has no IPIP for IPv6: BIRD routes the IPv6 pool natively.
        assert!(route("calico-ipip", None).starts_with(bird));
        assert!(route("flannel-host-gw", None)
            .starts_with("fd00:10:244:2::/64 via fd5a:0:2::12 dev eth0 (route -6 -n: "));
        assert!(route("flannel-host-gw", None).ends_with("(pod subnet of node-2)"));
    }

    #[test]
    fn a_local_pods_host_interface_is_found_by_route_or_by_bridge_fdb() {
        // Flannel: the neighbour entry on cni0 gives the MAC, the FDB the port.
        let view = flannel_node();
        let flannel = by_name("flannel-vxlan").unwrap();
        let found = flannel.pod_interface(&view, "10.244.1.2".parse().unwrap());
        assert_eq!(found.unwrap().name, "veth1a2b");
        assert!(flannel
            .pod_interface(&view, "10.244.1.9".parse().unwrap())
            .is_none());
        // Calico: the /32 route's device.
        let mut calico = flannel_node();
        calico.links.push(link(7, "cali12345", "veth"));
        calico.routes.push(route("10.245.1.2/32", 7));
        let found = by_name("calico-bird")
            .unwrap()
            .pod_interface(&calico, "10.245.1.2".parse().unwrap());
        assert_eq!(found.unwrap().name, "cali12345");
        // Not knowing the CNI, either way works.
        let unknown = by_name("unknown").unwrap();
        assert!(unknown
            .pod_interface(&calico, "10.245.1.2".parse().unwrap())
            .is_some());
        assert!(unknown
            .pod_interface(&view, "10.244.1.2".parse().unwrap())
            .is_some());
    }

    #[test]
    fn a_veth_with_both_ends_on_the_host_is_no_pods() {
        let mut cilium_host = link(8, "cilium_host", "veth");
        cilium_host.peer_in_other_netns = false;
        assert_eq!(role_by_kind(&cilium_host), None);
        assert_eq!(
            role_by_kind(&link(5, "veth1a2b", "veth")),
            Some(Role::PodVeth)
        );
    }
}
