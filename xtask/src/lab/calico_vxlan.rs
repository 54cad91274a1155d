//! Calico in VXLAN mode, as calico-node leaves a node: `cali…` veths and
//! pods as in BGP mode (`calico.rs`), and `vxlan.calico` (VNI 4096, UDP
//! 4789) holding the node's VTEP address, with per remote node a route
//! `<block> via <VTEP> dev vxlan.calico onlink`, a permanent neighbour and
//! an FDB entry to the remote node's IP.

use anyhow::Result;
use ipnet::Ipv4Net;
use serde_json::{json, Value};

use super::{calico::pods, cmd, ip, Cni, Lab};

const DEVICE: &str = "vxlan.calico";
const VNI: u32 = 4096;
const PORT: u16 = 4789;

pub struct CalicoVxlan;

/// The MAC calico-node gives a node's VTEP.
fn vtep_mac(node: u8) -> String {
    format!("66:c5:7a:00:00:{node:02x}")
}

/// The node's VTEP address: the first of its block, as Calico's IPAM
/// hands it out.
fn vtep_ip(lab: &Lab, node: u8) -> std::net::Ipv4Addr {
    lab.subnet_host(node, 0)
}

impl Cni for CalicoVxlan {
    fn name(&self) -> &'static str {
        "calico-vxlan"
    }

    fn default_pod_cidr(&self) -> Ipv4Net {
        "10.246.0.0/16".parse().expect("literal")
    }

    fn host_iface(&self, pod_netns: &str) -> String {
        super::calico::Calico.host_iface(pod_netns)
    }

    fn build_node(&self, lab: &Lab, node: u8) -> Result<()> {
        let ns = lab.node_netns(node);
        ip(
            &ns,
            &format!("route add blackhole {} proto 80", lab.node_subnet(node)),
        )?;
        vtep(lab, &ns, node)?;
        for remote in Lab::remotes(node) {
            route_to(lab, &ns, remote)?;
        }
        pods(lab, &ns, node)
    }

    fn node_annotations(&self, lab: &Lab, node: u8) -> Value {
        json!({
            "projectcalico.org/IPv4Address": format!("{}/24", Lab::node_ip(node)),
            "projectcalico.org/IPv4VXLANTunnelAddr": vtep_ip(lab, node).to_string(),
        })
    }
}

/// vxlan.calico on the node's uplink, with the node's VTEP address.
fn vtep(lab: &Lab, ns: &str, node: u8) -> Result<()> {
    ip(
        ns,
        &format!(
            "link add {DEVICE} type vxlan id {VNI} dstport {PORT} local {} dev eth0 nolearning",
            Lab::node_ip(node)
        ),
    )?;
    ip(
        ns,
        &format!("link set {DEVICE} address {} mtu 1450", vtep_mac(node)),
    )?;
    ip(
        ns,
        &format!("addr add {}/32 dev {DEVICE}", vtep_ip(lab, node)),
    )?;
    ip(ns, &format!("link set {DEVICE} up"))
}

/// The route, neighbour and FDB entry calico-node writes for a remote node.
fn route_to(lab: &Lab, ns: &str, remote: u8) -> Result<()> {
    let (vtep, mac) = (vtep_ip(lab, remote), vtep_mac(remote));
    ip(
        ns,
        &format!(
            "route add {} via {vtep} dev {DEVICE} onlink proto 80",
            lab.node_subnet(remote)
        ),
    )?;
    ip(
        ns,
        &format!("neigh add {vtep} lladdr {mac} dev {DEVICE} nud permanent"),
    )?;
    cmd::fdb(
        ns,
        "append",
        &mac,
        DEVICE,
        &Lab::node_ip(remote).to_string(),
    )
}
