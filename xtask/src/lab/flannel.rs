//! What Flannel's backends share on a node: the cni0 bridge the CNI bridge
//! plugin makes, the pods' veths on it, the veth names and the Node
//! annotations. The vxlan and host-gw files add only how a node reaches
//! the other nodes' pods. Public because tests rewire pods mid-trace (a
//! sandbox recreated, a pod readdressed) exactly as the lab wires them.

use std::net::Ipv4Addr;

use anyhow::Result;
use ipnet::Ipv4Net;
use serde_json::{json, Value};

use super::{cmd, ip, Cni, Lab, LabPod};

/// VNI of Flannel's vxlan backend (also in host-gw's backend-data).
pub const VNI: u32 = 1;

/// How one Flannel backend differs: its name, its pods' MTU, and how a
/// node reaches the other nodes' pod subnets.
pub trait Backend: Sync {
    /// The topology's name (`cargo xtask lab up <name>`).
    fn name(&self) -> &'static str;
    /// As in the `flannel.alpha.coreos.com/backend-type` annotation.
    fn backend_type(&self) -> &'static str;
    fn pod_mtu(&self) -> u16;
    /// Wires node `node` (namespace `ns`, cni0 up) to the other nodes' pods.
    fn routes(&self, lab: &Lab, ns: &str, node: u8) -> Result<()>;
}

/// A Flannel topology: the shared node wiring around one backend.
pub struct Flannel<B>(pub B);

impl<B: Backend> Cni for Flannel<B> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn default_pod_cidr(&self) -> Ipv4Net {
        "10.244.0.0/16".parse().expect("literal")
    }

    /// As the CNI bridge plugin names a pod's host-side veth.
    fn host_iface(&self, pod_netns: &str) -> String {
        format!("veth{:08x}", super::fnv1a(pod_netns) as u32)
    }

    /// cni0, then the backend's routes to the other nodes, then the pods.
    fn build_node(&self, lab: &Lab, node: u8) -> Result<()> {
        let ns = lab.node_netns(node);
        bridge(lab, node)?;
        self.0.routes(lab, &ns, node)?;
        for pod in lab.pods_on(node) {
            cmd::netns_add(&pod.netns)?;
            wire_pod(lab, &pod, self.0.pod_mtu())?;
        }
        Ok(())
    }

    fn node_annotations(&self, _lab: &Lab, node: u8) -> Value {
        let ip = Lab::node_ip(node).to_string();
        json!({
            "flannel.alpha.coreos.com/backend-type": self.0.backend_type(),
            "flannel.alpha.coreos.com/public-ip": ip,
            "flannel.alpha.coreos.com/backend-data": format!("{{\"VNI\":{VNI},\"VtepMAC\":\"{}\"}}", vtep_mac(node)),
        })
    }
}

/// MAC of a node's flannel.1, as Flannel records it in backend-data.
pub fn vtep_mac(node: u8) -> String {
    format!("0a:58:c0:00:02:{:02x}", 10 + node)
}

/// cni0 with the node's gateway address.
fn bridge(lab: &Lab, node: u8) -> Result<()> {
    let ns = lab.node_netns(node);
    let gateway = lab.subnet_host(node, 1);
    // A fixed MAC, as the CNI bridge plugin sets one (0a:58 + the
    // gateway IP); otherwise the bridge borrows its lowest port's MAC.
    let [a, b, c, d] = gateway.octets();
    ip(
        &ns,
        &format!("link add cni0 address 0a:58:{a:02x}:{b:02x}:{c:02x}:{d:02x} type bridge"),
    )?;
    ip(&ns, &format!("addr add {gateway}/24 dev cni0"))?;
    ip(&ns, "link set cni0 up")
}

/// A pod's veth on cni0 (`pod.host_iface`, peer eth0 in `pod.netns`,
/// which must exist), addressed and routed via the node's gateway.
pub fn wire_pod(lab: &Lab, pod: &LabPod, mtu: u16) -> Result<()> {
    let ns = lab.node_netns(pod.node);
    cmd::veth(&ns, &pod.host_iface, &pod.netns, Some(mtu))?;
    ip(&ns, &format!("link set {} master cni0 up", pod.host_iface))?;
    ip(&pod.netns, "link set lo up")?;
    ip(&pod.netns, &format!("link set eth0 mtu {mtu}"))?;
    address_pod(&pod.netns, pod.ip, lab.subnet_host(pod.node, 1))
}

/// Gives a pod's eth0 `ip` in its node's /24, up, with a default route via
/// `gateway` (cni0's address).
pub fn address_pod(pod_netns: &str, ip: Ipv4Addr, gateway: Ipv4Addr) -> Result<()> {
    self::ip(pod_netns, &format!("addr add {ip}/24 dev eth0"))?;
    self::ip(pod_netns, "link set eth0 up")?;
    self::ip(
        pod_netns,
        &format!("route add default via {gateway} dev eth0"),
    )
}
