//! Flannel's vxlan backend: pods on the `cni0` bridge; `flannel.<VNI>`
//! (VNI 1, UDP 8472 by default) toward other nodes; per remote node a
//! route `<subnet> via <subnet>.0 dev flannel.1 onlink`, a neighbour entry
//! with the remote VTEP MAC and an FDB entry to the remote node IP.

use std::net::IpAddr;

use super::{
    backend::{annotation, vxlan_device, Backend, TunnelSpec},
    direct_routing::DirectRouting,
};
use crate::{
    model::{bounded, NodeSubnet, NodeSubnet6},
    node::{host_root::HostRoot, Link, NodeView, RouteOrigin},
};

pub struct FlannelVxlan;

/// Flannel writes its backend type on every node it runs on.
pub(super) const BACKEND_TYPE: &str = "flannel.alpha.coreos.com/backend-type";

const TUNNEL: TunnelSpec = TunnelSpec {
    device: "flannel.1",
    port: Some(8472),
    vni: Some(1),
};

/// flanneld's IPv6 VXLAN device with `EnableIPv6` (`flannel-v6.<VNI>`).
const TUNNEL6_DEVICE: &str = "flannel-v6.1";

impl Backend for FlannelVxlan {
    fn name(&self) -> &'static str {
        "flannel-vxlan"
    }

    fn annotated(&self, annotations: &serde_json::Value) -> bool {
        annotation(annotations, BACKEND_TYPE) == Some("vxlan")
    }

    fn runs_on(&self, view: &NodeView) -> bool {
        vxlan_device(view, &TUNNEL).is_some()
            || view
                .links_of_kind("vxlan")
                .any(|l| l.name.starts_with("flannel."))
    }

    fn tunnel(&self) -> Option<TunnelSpec> {
        Some(TUNNEL)
    }

    fn expected_route(&self, remote: &NodeSubnet, _underlay: &str) -> String {
        // Flannel's gateway is the remote VTEP's address, the subnet's .0.
        let route =
            super::backend::to_pods_of(remote, remote.subnet.network(), true, RouteOrigin::Other);
        super::backend::named(&route, TUNNEL.device, "pod subnet", remote)
    }

    fn direct_routing(&self) -> Option<DirectRouting> {
        Some(DirectRouting {
            setting: "flannel's VXLAN DirectRouting",
            what: "pod subnet",
            protocol: RouteOrigin::Other,
        })
    }

    fn expected_route6(&self, remote: &NodeSubnet6, _underlay: Option<&str>) -> String {
        super::backend::via_vtep6(remote, TUNNEL6_DEVICE, "pod subnet")
    }

    fn inferred_pod_cidr(&self, view: &NodeView) -> Option<(ipnet::Ipv4Net, String)> {
        let tunnel = vxlan_device(view, &TUNNEL);
        let bridge = view.link_named(super::backend::FLANNEL_BRIDGE);
        tunnel
            .and_then(|l| super::backend::widened(view, l))
            .or_else(|| super::backend::widened(view, bridge?))
    }

    fn bridge(&self) -> Option<&'static str> {
        Some(super::backend::FLANNEL_BRIDGE)
    }

    fn pod_interface<'a>(&self, view: &'a NodeView, ip: IpAddr) -> Option<&'a Link> {
        view.bridge_port_of(ip)
    }
}

/// FLANNEL_NETWORK from the node's /run/flannel/subnet.env (under its
/// host root), where Flannel runs: the cluster's pod CIDR, written by
/// flanneld on every node.
pub fn subnet_env_network(root: &HostRoot) -> Option<ipnet::Ipv4Net> {
    // Non-blocking, regular files only, and capped: a FIFO or /dev/zero
    // there must not wedge the trace.
    let path = root.path("/run/flannel/subnet.env").ok()?;
    let env = bounded::read_regular_text(&path, 64 << 10).ok()?;
    env.lines()
        .find_map(|l| l.strip_prefix("FLANNEL_NETWORK=")?.trim().parse().ok())
}
