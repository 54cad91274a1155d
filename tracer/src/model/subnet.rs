//! A node's pod subnet, as the cluster's nodes say.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
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
