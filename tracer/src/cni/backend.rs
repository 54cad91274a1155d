//! What every CNI backend is and shares: the trait each one implements,
//! how it encapsulates, and the route and device helpers their
//! expectations are written with.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};

use crate::{
    model::{NodeSubnet, NodeSubnet6},
    node::{interfaces::Role, Link, NodeView, Route, RouteKind, RouteOrigin, RT_TABLE_MAIN},
};

/// The bridge Flannel's CNI config names (the bridge plugin's default).
pub(super) const FLANNEL_BRIDGE: &str = "cni0";

/// How a backend encapsulates traffic between nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunnelSpec {
    /// The device name the backend gives its tunnel (flannel.1 is
    /// `flannel.<VNI>`, Calico's are fixed).
    pub device: &'static str,
    /// UDP port for VXLAN; None for IPIP.
    pub port: Option<u16>,
    pub vni: Option<u32>,
}

/// How a backend names the setting that routes one subnet natively.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectRouting {
    /// The setting, as its users write it.
    pub setting: &'static str,
    /// What the backend calls a node's pod range ("pod block").
    pub what: &'static str,
    /// The protocol of the native routes it installs (BIRD's for Calico
    /// IPIP, Felix's or flanneld's own otherwise).
    pub protocol: RouteOrigin,
}

pub trait Backend: Sync {
    /// e.g. "flannel-vxlan".
    fn name(&self) -> &'static str;

    /// Whether a node's annotations (`metadata.annotations` of a v1.Node)
    /// say it runs this backend.
    fn annotated(&self, annotations: &serde_json::Value) -> bool;

    /// Whether the node's own devices and routes say it runs this backend.
    fn runs_on(&self, view: &NodeView) -> bool;

    /// The tunnel this backend sends other nodes' pod traffic through.
    fn tunnel(&self) -> Option<TunnelSpec> {
        None
    }

    /// The cluster's pod CIDR as this node's devices suggest it, with the
    /// evidence, when nothing better (`--pod-cidr`, the nodes) is known.
    fn inferred_pod_cidr(&self, _view: &NodeView) -> Option<(Ipv4Net, String)> {
        None
    }

    /// The bridge its pods hang off, by the name the CNI gives it.
    fn bridge(&self) -> Option<&'static str> {
        None
    }

    /// The route a node needs toward `remote`'s pods, as `ip route` shows
    /// it. `underlay` names the node's underlay interface.
    fn expected_route(&self, remote: &NodeSubnet, underlay: &str) -> String;

    /// The IPv6 route a node needs toward `remote`'s pods, as `ip -6
    /// route` shows it. `underlay` names the node's link on the subnet of
    /// the remote node's IPv6 address. By default, through the remote
    /// node's IPv6 VTEP where it has one, else via that address (a backend
    /// that routes pods to the node itself, as host-gw).
    fn expected_route6(&self, remote: &NodeSubnet6, underlay: Option<&str>) -> String {
        match &remote.vtep {
            Some(vtep) => via_vtep6(remote, &vtep.device, "pod subnet"),
            None => via_node_ip6(remote, underlay, RouteOrigin::Other, "pod subnet"),
        }
    }

    /// For a tunnelling backend, the setting under which it routes the
    /// pods of a node on its own subnet natively (`direct_routing.rs`).
    fn direct_routing(&self) -> Option<DirectRouting> {
        None
    }

    /// The host-side interface of the local pod with `ip`.
    fn pod_interface<'a>(&self, view: &'a NodeView, ip: IpAddr) -> Option<&'a Link>;

    /// The part `link` plays on a node of this backend (None: not watched).
    /// The underlay is chosen before this is asked.
    fn role(&self, link: &Link) -> Option<Role> {
        role_by_kind(link)
    }
}

/// The VXLAN device of `spec` on this node: by the backend's device name,
/// else by its port (a renamed device still carries the port).
pub(super) fn vxlan_device<'a>(view: &'a NodeView, spec: &TunnelSpec) -> Option<&'a Link> {
    view.links_of_kind("vxlan").find(|l| {
        l.name == spec.device || (spec.port.is_some() && l.vxlan.and_then(|v| v.port) == spec.port)
    })
}

/// `<subnet> via <node IP> dev <underlay>`: the route of every backend
/// that routes pod traffic to the node itself, without a tunnel.
pub(super) fn via_node_ip(remote: &NodeSubnet, underlay: &str) -> String {
    let route = to_pods_of(remote, remote.node_ip, false, RouteOrigin::Other);
    named(&route, underlay, "pod subnet", remote)
}

/// The route toward `remote`'s pods through `gateway`, as its backend
/// installs it (`onlink` for a tunnel's, `protocol` bird for Calico's).
pub(super) fn to_pods_of(
    remote: &NodeSubnet,
    gateway: Ipv4Addr,
    onlink: bool,
    protocol: RouteOrigin,
) -> Route {
    to_subnet(remote.subnet.into(), Some(gateway.into()), onlink, protocol)
}

/// A main-table unicast route to `destination`, of either family.
fn to_subnet(
    destination: IpNet,
    gateway: Option<IpAddr>,
    onlink: bool,
    protocol: RouteOrigin,
) -> Route {
    Route {
        protocol,
        onlink,
        kind: RouteKind::Unicast,
        destination,
        gateway,
        oif: None,
        table: RT_TABLE_MAIN,
    }
}

/// `route` out of `dev` in `ip route` and `route -n` terms, then whose
/// subnet it leads to (`what`: Flannel's "pod subnet", Calico's "pod
/// block").
pub(super) fn named(route: &Route, dev: &str, what: &str, remote: &NodeSubnet) -> String {
    named_on(route, Some(dev), what, &remote.node)
}

fn named_on(route: &Route, dev: Option<&str>, what: &str, node: &str) -> String {
    format!("{} ({what} of {node})", route.describe_on(dev))
}

/// `<subnet> via <node IPv6> dev <underlay>`: the IPv6 route of a backend
/// that routes pods to the node itself, BIRD's (`protocol` bird) or
/// host-gw's.
pub(super) fn via_node_ip6(
    remote: &NodeSubnet6,
    underlay: Option<&str>,
    protocol: RouteOrigin,
    what: &str,
) -> String {
    let gateway = remote.node_ip.map(IpAddr::V6);
    let route = to_subnet(remote.subnet.trunc().into(), gateway, false, protocol);
    named_on(&route, underlay, what, &remote.node)
}

/// `<subnet> via <VTEP IPv6> dev <device> onlink`: the IPv6 route of a
/// VXLAN backend, through the remote node's IPv6 VTEP as flanneld and
/// Felix write it. `device` is the backend's IPv6 tunnel device, named
/// where the remote node shows no VTEP.
pub(super) fn via_vtep6(remote: &NodeSubnet6, device: &str, what: &str) -> String {
    match &remote.vtep {
        Some(vtep) => {
            let gateway = Some(IpAddr::V6(vtep.ip));
            let route = to_subnet(
                remote.subnet.trunc().into(),
                gateway,
                true,
                RouteOrigin::Other,
            );
            named_on(&route, Some(&vtep.device), what, &remote.node)
        }
        // No route to print in columns without its gateway.
        None => format!(
            "{} via <its VTEP address> dev {device} onlink ({what} of {})",
            remote.subnet.trunc(),
            remote.node
        ),
    }
}

/// The /16 around `address` of `link`: Flannel hands each node a /24 (its
/// default SubnetLen) out of the cluster's Network, a /16 by default.
pub(super) fn widened(view: &NodeView, link: &Link) -> Option<(Ipv4Net, String)> {
    let (_, address) = view.addresses.iter().find(|(i, _)| *i == link.index)?;
    let cidr = Ipv4Net::new(*address, 16).ok()?.trunc();
    Some((cidr, format!("{}'s {address}", link.name)))
}

/// Annotation value as a string, if present.
pub(super) fn annotation<'a>(annotations: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    annotations[key].as_str()
}

/// Roles every backend shares: bridges, tunnel devices, and veths whose
/// other end is in another namespace (a pod's). A veth with both ends on
/// the host (cilium_host/cilium_net, the lab's underlay) is no pod's.
pub fn role_by_kind(link: &Link) -> Option<Role> {
    match link.kind.as_str() {
        "bridge" => Some(Role::Bridge),
        // A tunnel that is down carries nothing (a CNI brings its own up):
        // once it goes up, the link watch sees it again.
        _ if link.is_tunnel() && link.up => Some(Role::Tunnel),
        "veth" if link.peer_in_other_netns => Some(Role::PodVeth),
        _ => None,
    }
}
