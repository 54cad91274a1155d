//! A node's pod subnet, as the cluster's nodes say (IPv4), or as a traced
//! node shows it (IPv6).

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use super::interned::StaticStr;

/// A node's pod subnet, from the Kubernetes nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSubnet {
    pub node: String,
    pub subnet: Ipv4Net,
    pub node_ip: Ipv4Addr,
    /// The CNI backend its annotations name (`cni::Backend::name`).
    #[serde(deserialize_with = "crate::model::interned::leak_opt_str")]
    pub cni: Option<StaticStr>,
    /// Its VXLAN VTEP address, where the CNI annotates one (Calico).
    pub tunnel_ip: Option<Ipv4Addr>,
}

/// Another node's IPv6 pod subnet, as that traced node shows it: what a
/// CNI backend writes its IPv6 route toward (`cni::Backend::expected_route6`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSubnet6 {
    pub node: String,
    pub subnet: Ipv6Net,
    /// Its IPv6 address on an underlay the routing node shares, if any.
    pub node_ip: Option<Ipv6Addr>,
    /// Its IPv6 VTEP, where a tunnel device of its carries IPv6.
    pub vtep: Option<Vtep6>,
}

/// A tunnel device that carries IPv6 (flannel-v6.1, vxlan-v6.calico, or
/// an IPv4 VXLAN device with an IPv6 address of its own), and that address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vtep6 {
    /// Its name on the routing node: CNIs name the device alike on every
    /// node.
    pub device: String,
    pub ip: Ipv6Addr,
}
