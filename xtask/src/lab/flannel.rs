//! What Flannel's backends share on a node: the pods, made on cni0 by the
//! bridge plugin Flannel delegates to, their veth names and the Node
//! annotations. The vxlan and host-gw files add only how a node reaches
//! the other nodes' pods. Public because tests rewire pods mid-trace (a
//! sandbox recreated, a pod readdressed) exactly as the lab wires them.

use std::net::Ipv4Addr;

use anyhow::{bail, Result};
use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::{json, Value};

use super::{cmd, cni_plugins, ip, Cni, Lab, LabPod};

/// VNI of Flannel's vxlan backend (also in host-gw's backend-data).
pub const VNI: u32 = 1;

/// How one Flannel backend differs: its name, and how a node reaches the
/// other nodes' pod subnets (its pods' MTU is in subnet.env).
pub trait Backend: Sync {
    /// The topology's name (`cargo xtask lab up <name>`).
    fn name(&self) -> &'static str;
    /// As in the `flannel.alpha.coreos.com/backend-type` annotation.
    fn backend_type(&self) -> &'static str;
    /// Wires node `node` (namespace `ns`, cni0 up) to the other nodes' pods.
    fn routes(&self, lab: &Lab, ns: &str, node: u8) -> Result<()>;
    /// `Cni::dual_stack`, as this backend does it.
    fn dual_stack(&self, _lab: &Lab) -> Result<()> {
        bail!(
            "the lab cannot make flannel's {} backend dual-stack",
            self.backend_type()
        )
    }
    /// `Cni::dual_stack_in_ipv4_tunnel`, as this backend does it.
    fn dual_stack_in_ipv4_tunnel(&self, _lab: &Lab) -> Result<()> {
        bail!(
            "flannel's {} backend has no IPv4 tunnel to carry IPv6 in",
            self.backend_type()
        )
    }
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

    /// The pods, in their order (host-local hands out addresses in it),
    /// by the plugins; then the backend's routes to the other nodes. Pods
    /// first: the first pod's ADD makes cni0, which so comes before the
    /// backend's devices in the node's interface order, as the docs show.
    fn build_node(&self, lab: &Lab, node: u8) -> Result<()> {
        for pod in lab.pods_on(node) {
            cmd::netns_add(&pod.netns)?;
            let made = wire_pod(lab, &pod, None)?;
            name_host_end(lab, &pod, &made)?;
        }
        self.0.routes(lab, &lab.node_netns(node), node)
    }

    fn dual_stack(&self, lab: &Lab) -> Result<()> {
        self.0.dual_stack(lab)
    }

    fn dual_stack_in_ipv4_tunnel(&self, lab: &Lab) -> Result<()> {
        self.0.dual_stack_in_ipv4_tunnel(lab)
    }

    /// Each pod's sandbox removed by the plugins (best effort: the lab's
    /// namespaces and host roots go next, which frees whatever a failed
    /// DEL left, as with a fault's missing plugin).
    fn tear_down(&self, lab: &Lab) {
        for pod in lab.pods() {
            let _ = unwire_pod(lab, &pod);
        }
    }

    /// With `EnableIPv6`, flanneld adds the IPv6 VTEP's twins.
    fn node_annotations(&self, lab: &Lab, node: u8) -> Value {
        let ip = Lab::node_ip(node).to_string();
        let mut annotations = json!({
            "flannel.alpha.coreos.com/backend-type": self.0.backend_type(),
            "flannel.alpha.coreos.com/public-ip": ip,
            "flannel.alpha.coreos.com/backend-data": format!("{{\"VNI\":{VNI},\"VtepMAC\":\"{}\"}}", vtep_mac(node)),
        });
        // flannel-v6.1's VTEP, over the node's IPv6 underlay address.
        if lab.is_dual_stack() && !lab.ipv6_in_ipv4_tunnel() {
            annotations["flannel.alpha.coreos.com/public-ipv6"] =
                Lab::node_ipv6(node).to_string().into();
            annotations["flannel.alpha.coreos.com/backend-v6-data"] =
                format!("{{\"VNI\":{VNI},\"VtepMAC\":\"{}\"}}", vtep_mac6(node)).into();
        }
        annotations
    }
}

/// MAC of a node's flannel.1, as Flannel records it in backend-data.
pub fn vtep_mac(node: u8) -> String {
    format!("0a:58:c0:00:02:{:02x}", 10 + node)
}

/// MAC of a node's flannel-v6.1 (backend-v6-data). flanneld gives each
/// VTEP a MAC of its own; the lab's are stable, so that tests name them:
/// flannel.1's with the node's underlay IPv4 address in it, this one
/// with its IPv6 address's (fd5a:…:2::1N).
pub fn vtep_mac6(node: u8) -> String {
    format!("0a:58:fd:5a:02:{:02x}", 10 + node)
}

/// A pod's sandbox made by the real plugins (`cni_plugins.rs`): the
/// bridge plugin makes cni0 with the node's gateway address when it is
/// not there yet, the pod's veth on it (subnet.env's MTU), and asks host-local
/// for the pod's address; `address` is the one to ask for (a sandbox
/// recreated keeps its pod's), else host-local hands out the next free
/// one, which must be the pod's as the lab lists it. Returns the host
/// end's name, as the plugin chose it.
pub fn wire_pod(lab: &Lab, pod: &LabPod, address: Option<Ipv4Addr>) -> Result<String> {
    let made = cni_plugins::add_flannel_pod(lab, pod, address)?;
    if made.address.addr() != pod.ip {
        bail!(
            "host-local gave {} {} where the lab lists {}",
            pod.name,
            made.address,
            pod.ip
        );
    }
    if lab.is_dual_stack() {
        address_pod_ipv6(lab, pod)?;
    }
    Ok(made.host_iface)
}

/// A pod's IPv6 address on a dual-stack lab, in its node's /64 (the host
/// number of its IPv4 one), with a default route via cni0's IPv6 gateway
/// (`::1`), as the bridge plugin sets a pod up from flannel's IPv6
/// subnet. Made here rather than by host-local: the plugin would wait out
/// DAD, and the pods were made before the lab became dual-stack.
pub fn address_pod_ipv6(lab: &Lab, pod: &LabPod) -> Result<()> {
    let address = Ipv6Net::new(lab.ipv6_of(pod), 64)?;
    super::address_pod6(&pod.netns, address, Lab::subnet_host6(pod.node, 1))
}

/// The bridge plugin names a pod's host end `veth` and 8 random hex
/// digits; the lab renames it, before anything watches the node, to the
/// one derived from the pod's namespace (same shape), so that tests,
/// faults and the inventory name it without asking the node.
fn name_host_end(lab: &Lab, pod: &LabPod, made: &str) -> Result<()> {
    if made == pod.host_iface {
        return Ok(());
    }
    let ns = lab.node_netns(pod.node);
    ip(&ns, &format!("link set {made} down"))?;
    ip(&ns, &format!("link set {made} name {}", pod.host_iface))?;
    ip(&ns, &format!("link set {} up", pod.host_iface))
}

/// A pod's sandbox torn down by the plugins, as a runtime removes it:
/// its address goes back to host-local, its veth goes.
pub fn unwire_pod(lab: &Lab, pod: &LabPod) -> Result<()> {
    cni_plugins::del_flannel_pod(lab, pod)
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
