//! Calico with BGP: per node a real BIRD (`bird.rs`) blackholes the
//! node's IPAM block and learns the other nodes' blocks from its peers;
//! per pod a /32 route to a `cali…` veth that answers ARP for the pods'
//! fake gateway 169.254.1.1 (proxy ARP).

use std::net::Ipv6Addr;

use anyhow::Result;
use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::{json, Value};

use super::{bird, cmd, cni_plugins, ip, ipv6, sysctl, Cni, Lab, LabPod};

const GATEWAY: &str = "169.254.1.1";
const MAC: &str = "ee:ee:ee:ee:ee:ee";
/// The pods' IPv6 gateway: the link-local address the `cali…` end's MAC
/// gives it (EUI-64 of ee:ee:ee:ee:ee:ee), so the node answers the pod's
/// neighbour solicitations itself, as it does ARP for GATEWAY.
const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xecee, 0xeeff, 0xfeee, 0xeeee);

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
        pods(lab, &ns, node, None)?;
        bird::start(lab, node, &bird::announced(lab))
    }

    /// Every node's BIRD has learnt the other nodes' blocks.
    fn settle(&self, lab: &Lab) -> Result<()> {
        bird::wait_routes(lab, |_, _| true)
    }

    fn node_annotations(&self, lab: &Lab, node: u8) -> Value {
        let mut annotations = json!({
            "projectcalico.org/IPv4Address": format!("{}/24", Lab::node_ip(node)),
        });
        if lab.is_dual_stack() {
            annotations["projectcalico.org/IPv6Address"] =
                format!("{}/64", Lab::node_ipv6(node)).into();
        }
        annotations
    }

    fn dual_stack(&self, lab: &Lab) -> Result<()> {
        super::bird6::dual_stack(lab)
    }
}

/// Every pod of the node, wired as Calico wires them (BGP or VXLAN mode).
/// The pods of `node`, their veths at the pod MTU calico-node chose for
/// the pool's encapsulation (`mtu`; None: the underlay's).
pub(super) fn pods(lab: &Lab, ns: &str, node: u8, mtu: Option<u16>) -> Result<()> {
    for pod in lab.pods_on(node) {
        cmd::netns_add(&pod.netns)?;
        // Calico's own plugin is not packaged: its veth and routes are
        // made here as it makes them; lo by the real loopback plugin.
        cni_plugins::loopback(lab, &pod)?;
        host_side(ns, &pod, mtu)?;
        pod_side(&pod)?;
        if let Some(mtu) = mtu {
            ip(&pod.netns, &format!("link set eth0 mtu {mtu}"))?;
        }
    }
    Ok(())
}

/// The `cali…` end: Calico's MAC, proxy ARP, and the pod's /32 route.
fn host_side(ns: &str, pod: &LabPod, mtu: Option<u16>) -> Result<()> {
    cmd::veth(ns, &pod.host_iface, &pod.netns, mtu)?;
    // No DAD on the link-local address the MAC gives (GATEWAY6), as
    // Calico's plugin turns it off: it chose the MAC, the address is
    // unique, and a tentative gateway would not answer the pod's first
    // neighbour solicitations once the lab is dual-stack.
    ipv6::device_sysctl(ns, &pod.host_iface, "accept_dad", "0")?;
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

/// A pod's IPv6 side on a dual-stack lab, as Calico's plugin wires it
/// from an IPv6 pool: a /128 on eth0 with a default route via GATEWAY6,
/// and the node's /128 route to it over the `cali…` end (router
/// advertisements off there, as Felix sets it).
pub(super) fn pod_ipv6(lab: &Lab, ns: &str, pod: &LabPod) -> Result<()> {
    let address = lab.ipv6_of(pod);
    super::address_pod6(&pod.netns, Ipv6Net::new(address, 128)?, GATEWAY6)?;
    ipv6::device_sysctl(ns, &pod.host_iface, "accept_ra", "0")?;
    ip(
        ns,
        &format!("-6 route add {address}/128 dev {}", pod.host_iface),
    )
}
