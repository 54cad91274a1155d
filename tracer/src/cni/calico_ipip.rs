//! Calico in IPIP mode: `cali…` veths as in BGP mode, and the kernel's
//! `tunl0` toward other nodes, with a route per remote block
//! `via <node IP> dev tunl0 onlink proto bird`.

use std::net::IpAddr;

use super::{
    backend::{annotation, Backend, TunnelSpec},
    direct_routing::DirectRouting,
};
use crate::{
    model::{NodeSubnet, NodeSubnet6},
    node::{Link, NodeView, RouteOrigin},
};

pub struct CalicoIpip;

/// The tunnel address calico-node gives tunl0 in IPIP mode.
const IPIP_TUNNEL_ADDR: &str = "projectcalico.org/IPv4IPIPTunnelAddr";

const TUNNEL: TunnelSpec = TunnelSpec {
    device: "tunl0",
    port: None,
    vni: None,
};

impl Backend for CalicoIpip {
    fn name(&self) -> &'static str {
        "calico-ipip"
    }

    fn annotated(&self, annotations: &serde_json::Value) -> bool {
        annotation(annotations, IPIP_TUNNEL_ADDR).is_some()
    }

    /// tunl0 exists wherever the ipip module is loaded; Calico's mark is
    /// BIRD routes through it.
    fn runs_on(&self, view: &NodeView) -> bool {
        let Some(tunl0) = view.link_named(TUNNEL.device) else {
            return false;
        };
        view.routes
            .iter()
            .any(|r| r.protocol == RouteOrigin::Bird && r.oif == Some(tunl0.index))
    }

    fn tunnel(&self) -> Option<TunnelSpec> {
        Some(TUNNEL)
    }

    fn expected_route(&self, remote: &NodeSubnet, _underlay: &str) -> String {
        let route = super::backend::to_pods_of(remote, remote.node_ip, true, RouteOrigin::Bird);
        super::backend::named(&route, TUNNEL.device, "pod block", remote)
    }

    fn direct_routing(&self) -> Option<DirectRouting> {
        Some(DirectRouting {
            setting: "the IP pool's ipipMode CrossSubnet",
            what: "pod block",
            protocol: RouteOrigin::Bird,
        })
    }

    /// Calico has no IPIP for IPv6: an IPv6 pool beside an IPIP one is
    /// routed natively, by BIRD, as in BGP mode.
    fn expected_route6(&self, remote: &NodeSubnet6, underlay: Option<&str>) -> String {
        super::backend::via_node_ip6(remote, underlay, RouteOrigin::Bird, "pod block")
    }

    fn pod_interface<'a>(&self, view: &'a NodeView, ip: IpAddr) -> Option<&'a Link> {
        view.host_route_interface(ip)
    }
}
