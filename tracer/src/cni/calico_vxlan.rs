//! Calico in VXLAN mode: `cali…` veths as in BGP mode, and `vxlan.calico`
//! (VNI 4096, UDP 4789) toward other nodes, with a route per remote block
//! `via <remote VTEP address> dev vxlan.calico onlink`.

use std::net::IpAddr;

use super::{
    backend::{annotation, Backend, TunnelSpec},
    direct_routing::DirectRouting,
};
use crate::{
    model::{NodeSubnet, NodeSubnet6},
    node::{Link, NodeView, RouteOrigin},
};

pub struct CalicoVxlan;

/// The VTEP address calico-node gives the node in VXLAN mode.
pub const VXLAN_TUNNEL_ADDR: &str = "projectcalico.org/IPv4VXLANTunnelAddr";

const TUNNEL: TunnelSpec = TunnelSpec {
    device: "vxlan.calico",
    port: Some(4789),
    vni: Some(4096),
};

/// calico-node's IPv6 VXLAN device, for an IPv6 pool in VXLAN mode.
const TUNNEL6_DEVICE: &str = "vxlan-v6.calico";

impl Backend for CalicoVxlan {
    fn name(&self) -> &'static str {
        "calico-vxlan"
    }

    fn annotated(&self, annotations: &serde_json::Value) -> bool {
        annotation(annotations, VXLAN_TUNNEL_ADDR).is_some()
    }

    fn runs_on(&self, view: &NodeView) -> bool {
        view.link_named(TUNNEL.device).is_some()
    }

    fn tunnel(&self) -> Option<TunnelSpec> {
        Some(TUNNEL)
    }

    fn expected_route(&self, remote: &NodeSubnet, _underlay: &str) -> String {
        match remote.tunnel_ip {
            Some(vtep) => {
                let route = super::backend::to_pods_of(remote, vtep, true, RouteOrigin::Felix);
                super::backend::named(&route, TUNNEL.device, "pod block", remote)
            }
            // No route to print in columns without its gateway.
            None => format!(
                "{} via <its VTEP address> dev {} onlink (pod block of {})",
                remote.subnet, TUNNEL.device, remote.node
            ),
        }
    }

    fn direct_routing(&self) -> Option<DirectRouting> {
        Some(DirectRouting {
            setting: "the IP pool's vxlanMode CrossSubnet",
            what: "pod block",
            protocol: RouteOrigin::Felix,
        })
    }

    fn expected_route6(&self, remote: &NodeSubnet6, _underlay: Option<&str>) -> String {
        super::backend::via_vtep6(remote, TUNNEL6_DEVICE, "pod block")
    }

    fn pod_interface<'a>(&self, view: &'a NodeView, ip: IpAddr) -> Option<&'a Link> {
        view.host_route_interface(ip)
    }
}
