//! A CNI podtrace has no file for: routes to other nodes' pods are named
//! generically, and a local pod's interface is found either way (a /32
//! route, or a bridge port).

use std::net::IpAddr;

use super::backend::Backend;
use crate::{
    model::NodeSubnet,
    node::{Link, NodeView},
};

pub struct Unknown;

impl Backend for Unknown {
    fn name(&self) -> &'static str {
        "unknown"
    }

    fn annotated(&self, _annotations: &serde_json::Value) -> bool {
        false
    }

    fn runs_on(&self, _view: &NodeView) -> bool {
        true
    }

    fn expected_route(&self, remote: &NodeSubnet, underlay: &str) -> String {
        super::backend::via_node_ip(remote, underlay)
    }

    fn pod_interface<'a>(&self, view: &'a NodeView, ip: IpAddr) -> Option<&'a Link> {
        view.host_route_interface(ip)
            .or_else(|| view.bridge_port_of(ip))
    }
}
