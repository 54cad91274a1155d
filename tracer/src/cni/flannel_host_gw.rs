//! Flannel's host-gw backend: pods on the `cni0` bridge, no tunnel; per
//! remote node a route `<subnet> via <node IP> dev <underlay>` (the nodes
//! must share an L2 segment).

use std::net::IpAddr;

use super::{
    backend::{annotation, Backend},
    flannel_vxlan::BACKEND_TYPE,
};
use crate::{
    model::NodeSubnet,
    node::{Link, NodeView},
};

pub struct FlannelHostGw;

impl Backend for FlannelHostGw {
    fn name(&self) -> &'static str {
        "flannel-host-gw"
    }

    fn annotated(&self, annotations: &serde_json::Value) -> bool {
        annotation(annotations, BACKEND_TYPE) == Some("host-gw")
    }

    /// A bridge of pod veths and no tunnel: what the bridge plugin builds,
    /// with host-gw routes (only the annotations can tell them apart).
    fn runs_on(&self, view: &NodeView) -> bool {
        view.links_of_kind("bridge").any(|bridge| {
            view.links
                .iter()
                .any(|l| l.controller == Some(bridge.index) && l.peer_in_other_netns)
        })
    }

    fn expected_route(&self, remote: &NodeSubnet, underlay: &str) -> String {
        super::backend::via_node_ip(remote, underlay)
    }

    fn inferred_pod_cidr(&self, view: &NodeView) -> Option<(ipnet::Ipv4Net, String)> {
        super::backend::widened(view, view.link_named(super::backend::FLANNEL_BRIDGE)?)
    }

    fn bridge(&self) -> Option<&'static str> {
        Some(super::backend::FLANNEL_BRIDGE)
    }

    fn pod_interface<'a>(&self, view: &'a NodeView, ip: IpAddr) -> Option<&'a Link> {
        view.bridge_port_of(ip)
    }
}
