//! Calico in VXLAN mode, as calico-node leaves a node: `cali…` veths and
//! pods as in BGP mode (`calico.rs`), and `vxlan.calico` (VNI 4096, UDP
//! 4789) holding the node's VTEP address, with per remote node a route
//! `<block> via <VTEP> dev vxlan.calico onlink`, a permanent neighbour and
//! an FDB entry to the remote node's IP. Made dual-stack (`dual_stack`),
//! as with an IPv6 pool in VXLAN mode: `vxlan-v6.calico` beside it, the
//! same over the nodes' underlay IPv6 addresses.
//!
//! With the IP pool's `vxlanMode: CrossSubnet`, Felix tunnels only to
//! nodes on another subnet: the lab has a third node on a second rack,
//! and the nodes of one rack route each other's blocks natively,
//! `<block> via <node IP> dev eth0 proto 80`.

use std::net::Ipv6Addr;

use anyhow::Result;
use ipnet::Ipv4Net;
use serde_json::{json, Value};

use super::{
    calico::{self, pods},
    cmd, ip, ipv6, Cni, Lab,
};

const DEVICE: &str = "vxlan.calico";
const V6_DEVICE: &str = "vxlan-v6.calico";
const VNI: u32 = 4096;
const PORT: u16 = 4789;

pub struct CalicoVxlan {
    /// The pool's vxlanMode is CrossSubnet (else Always).
    pub cross_subnet: bool,
}

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
        if self.cross_subnet {
            "calico-vxlan-cross-subnet"
        } else {
            "calico-vxlan"
        }
    }

    fn nodes(&self) -> u8 {
        Lab::nodes_across_racks(self.cross_subnet)
    }

    fn default_pod_cidr(&self) -> Ipv4Net {
        "10.246.0.0/16".parse().expect("literal")
    }

    fn host_iface(&self, pod_netns: &str) -> String {
        calico::Calico.host_iface(pod_netns)
    }

    fn dual_stack(&self, lab: &Lab) -> Result<()> {
        dual_stack(lab)
    }

    fn build_node(&self, lab: &Lab, node: u8) -> Result<()> {
        let ns = lab.node_netns(node);
        ip(
            &ns,
            &format!("route add blackhole {} proto 80", lab.node_subnet(node)),
        )?;
        vtep(lab, &ns, node)?;
        for remote in lab.remotes(node) {
            if self.cross_subnet && Lab::same_subnet(node, remote) {
                let (block, via) = (lab.node_subnet(remote), Lab::node_ip(remote));
                ip(
                    &ns,
                    &format!("route add {block} via {via} dev eth0 proto 80"),
                )?;
            } else {
                route_to(lab, &ns, remote)?;
            }
        }
        // calico-node's pod MTU for VXLAN (CrossSubnet too: the
        // worst case): the underlay's less 50 B.
        pods(lab, &ns, node, Some(1450))
    }

    fn node_annotations(&self, lab: &Lab, node: u8) -> Value {
        let mut annotations = json!({
            "projectcalico.org/IPv4Address": format!("{}/24", Lab::node_ip(node)),
            "projectcalico.org/IPv4VXLANTunnelAddr": vtep_ip(lab, node).to_string(),
        });
        if lab.is_dual_stack() {
            annotations["projectcalico.org/IPv6Address"] =
                format!("{}/64", Lab::node_ipv6(node)).into();
            annotations["projectcalico.org/IPv6VXLANTunnelAddr"] =
                vtep_ip6(node).to_string().into();
        }
        annotations
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

/// The MAC calico-node gives a node's IPv6 VTEP (another than its IPv4
/// one's).
fn vtep_mac6(node: u8) -> String {
    format!("66:c5:7a:00:06:{node:02x}")
}

/// The node's IPv6 VTEP address: the first of its IPv6 block.
fn vtep_ip6(node: u8) -> Ipv6Addr {
    Lab::subnet_host6(node, 0)
}

/// Makes the lab dual-stack (`Lab::dual_stack`) as calico-node and its
/// plugin leave a cluster with an IPv6 pool in VXLAN mode: on each node
/// IPv6 forwarding, the underlay IPv6 address, its IPv6 block
/// blackholed, vxlan-v6.calico with the route, neighbour and FDB entry
/// for each other node, then its pods' IPv6 sides. A lab already
/// dual-stack is left as it is.
pub fn dual_stack(lab: &Lab) -> Result<()> {
    if lab.is_dual_stack() {
        return Ok(());
    }
    for node in lab.nodes() {
        let ns = lab.node_netns(node);
        ipv6::node_underlay(&ns, node)?;
        ip(
            &ns,
            &format!(
                "-6 route add blackhole {} proto 80",
                Lab::node_subnet6(node)
            ),
        )?;
        vtep6(&ns, node)?;
        for remote in lab.remotes(node) {
            route6_to(&ns, remote)?;
        }
        for pod in lab.pods_on(node) {
            calico::pod_ipv6(lab, &ns, &pod)?;
        }
    }
    lab.record_dual_stack()
}

/// vxlan-v6.calico: the VTEP over the node's underlay IPv6 address, with
/// the 70 B of VXLAN over IPv6 off the MTU, and its IPv6 VTEP address.
fn vtep6(ns: &str, node: u8) -> Result<()> {
    ip(
        ns,
        &format!(
            "link add {V6_DEVICE} type vxlan id {VNI} dstport {PORT} local {} dev eth0 nolearning",
            Lab::node_ipv6(node)
        ),
    )?;
    ip(
        ns,
        &format!("link set {V6_DEVICE} address {} mtu 1430", vtep_mac6(node)),
    )?;
    ip(
        ns,
        &format!("-6 addr add {}/128 dev {V6_DEVICE} nodad", vtep_ip6(node)),
    )?;
    ip(ns, &format!("link set {V6_DEVICE} up"))
}

/// route_to's IPv6 twin, for a remote node's IPv6 block (`proto 80`:
/// Felix's own routes).
fn route6_to(ns: &str, remote: u8) -> Result<()> {
    let vtep = super::ipv6::Vtep6 {
        device: V6_DEVICE,
        ip: vtep_ip6(remote),
        mac: &vtep_mac6(remote),
        node: remote,
    };
    vtep.route(ns, Lab::node_subnet6(remote), " proto 80")
}
