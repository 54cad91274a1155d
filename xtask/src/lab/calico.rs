//! Calico with BGP: per node a real BIRD (`bird.rs`) blackholes the
//! node's IPAM block and learns the other nodes' blocks from its peers;
//! per pod a /32 route to a `cali…` veth that answers ARP for the pods'
//! fake gateway 169.254.1.1 (proxy ARP).

use anyhow::Result;
use ipnet::Ipv4Net;
use serde_json::{json, Value};

use super::{bird, cmd, cni_plugins, ip, sysctl, Cni, Lab, LabPod};

const GATEWAY: &str = "169.254.1.1";
const MAC: &str = "ee:ee:ee:ee:ee:ee";

pub struct Calico;

impl Cni for Calico {
    fn name(&self) -> &'static str {
        "calico"
    }

    fn default_pod_cidr(&self) -> Ipv4Net {
        "10.245.0.0/16".parse().expect("literal")
    }

    fn host_iface(&self, pod_netns: &str) -> String {
        format!("cali{:011x}", super::fnv1a(pod_netns) >> 20)
    }

    fn build_node(&self, lab: &Lab, node: u8) -> Result<()> {
        let ns = lab.node_netns(node);
        pods(lab, &ns, node)?;
        bird::start(lab, node, &bird::announced())
    }

    /// Every node's BIRD has learnt the other nodes' blocks.
    fn settle(&self, lab: &Lab) -> Result<()> {
        bird::wait_routes(lab, |_, _| true)
    }

    fn node_annotations(&self, _lab: &Lab, node: u8) -> Value {
        json!({
            "projectcalico.org/IPv4Address": format!("{}/24", Lab::node_ip(node)),
        })
    }
}

/// Every pod of the node, wired as Calico wires them (BGP or VXLAN mode).
pub(super) fn pods(lab: &Lab, ns: &str, node: u8) -> Result<()> {
    for pod in lab.pods_on(node) {
        cmd::netns_add(&pod.netns)?;
        // Calico's own plugin is not packaged: its veth and routes are
        // made here as it makes them; lo by the real loopback plugin.
        cni_plugins::loopback(lab, &pod)?;
        host_side(ns, &pod)?;
        pod_side(&pod)?;
    }
    Ok(())
}

/// The `cali…` end: Calico's MAC, proxy ARP, and the pod's /32 route.
fn host_side(ns: &str, pod: &LabPod) -> Result<()> {
    cmd::veth(ns, &pod.host_iface, &pod.netns, None)?;
    ip(ns, &format!("link set {} address {MAC} up", pod.host_iface))?;
    sysctl(
        ns,
        &format!("net.ipv4.conf.{}.proxy_arp", pod.host_iface),
        "1",
    )?;
    ip(
        ns,
        &format!("route add {}/32 dev {} scope link", pod.ip, pod.host_iface),
    )
}

/// The pod's eth0: a /32, and a default route via the link-local gateway.
fn pod_side(pod: &LabPod) -> Result<()> {
    ip(&pod.netns, &format!("addr add {}/32 dev eth0", pod.ip))?;
    ip(&pod.netns, "link set eth0 up")?;
    ip(
        &pod.netns,
        &format!("route add {GATEWAY} dev eth0 scope link"),
    )?;
    ip(
        &pod.netns,
        &format!("route add default via {GATEWAY} dev eth0"),
    )?;
    ip(
        &pod.netns,
        &format!("neigh add {GATEWAY} lladdr {MAC} dev eth0 nud permanent"),
    )
}
