//! Calico without encapsulation (BGP through BIRD): `cali…` veths with
//! proxy ARP and a /32 route per local pod, the node's own block
//! blackholed, and per remote block a route `via <node IP> proto bird`.

use std::net::IpAddr;

use super::backend::{annotation, Backend};
use crate::{
    model::{NodeSubnet, NodeSubnet6},
    node::{Link, NodeView, RouteOrigin},
};

pub struct CalicoBird;

/// calico-node writes the node's address, with its prefix, on every node.
pub(super) const IPV4_ADDRESS: &str = "projectcalico.org/IPv4Address";

impl Backend for CalicoBird {
    fn name(&self) -> &'static str {
        "calico-bird"
    }

    fn annotated(&self, annotations: &serde_json::Value) -> bool {
        annotation(annotations, IPV4_ADDRESS).is_some()
    }

    fn runs_on(&self, view: &NodeView) -> bool {
        view.runs_bird()
    }

    fn expected_route(&self, remote: &NodeSubnet, underlay: &str) -> String {
        let route = super::backend::to_pods_of(remote, remote.node_ip, false, RouteOrigin::Bird);
        super::backend::named(&route, underlay, "pod block", remote)
    }

    fn expected_route6(&self, remote: &NodeSubnet6, underlay: Option<&str>) -> String {
        super::backend::via_node_ip6(remote, underlay, RouteOrigin::Bird, "pod block")
    }

    fn pod_interface<'a>(&self, view: &'a NodeView, ip: IpAddr) -> Option<&'a Link> {
        view.host_route_interface(ip)
    }
}
