//! Flannel's vxlan backend: each node has a flannel.1 VTEP, and reaches a
//! remote pod subnet through it with the route, neighbour and FDB entries
//! flanneld writes (no learning). Pods get the MTU less the 50 B of VXLAN.
//! Made dual-stack (`dual_stack`), each node also has flannel-v6.1, the
//! same for IPv6 over the nodes' underlay IPv6 addresses; made
//! dual-stack in the IPv4 tunnel (`dual_stack_in_ipv4_tunnel`), flannel.1
//! carries pod IPv6 too, over the IPv4 underlay.

use anyhow::{bail, Result};

use super::{
    cmd,
    flannel::{self, Backend},
    ip, ipv6, Lab,
};

/// UDP port of Flannel's vxlan backend (not IANA's 4789).
const PORT: u16 = 8472;

/// flanneld's IPv6 VTEP (`flannel-v6.<VNI>`).
const V6_DEVICE: &str = "flannel-v6.1";

pub struct Vxlan;

impl Backend for Vxlan {
    fn name(&self) -> &'static str {
        "flannel-vxlan"
    }

    fn backend_type(&self) -> &'static str {
        "vxlan"
    }

    fn routes(&self, lab: &Lab, ns: &str, node: u8) -> Result<()> {
        vtep(lab, ns, node)?;
        for remote in lab.remotes(node) {
            route_to(lab, ns, remote)?;
        }
        Ok(())
    }

    fn dual_stack(&self, lab: &Lab) -> Result<()> {
        dual_stack(lab)
    }

    fn dual_stack_in_ipv4_tunnel(&self, lab: &Lab) -> Result<()> {
        dual_stack_in_ipv4_tunnel(lab)
    }
}

/// Re-creates every node's flannel.1 on UDP `port`, as flanneld makes it
/// when the cluster's net-conf.json sets `Backend.Port`: the VTEP, then
/// the routes, neighbours and FDB entries it writes for the other nodes.
/// On a dual-stack lab flannel-v6.1 too: `Backend.Port` is both VTEPs'.
pub fn move_to_port(lab: &Lab, port: u16) -> Result<()> {
    let dual_stack = lab.is_dual_stack();
    for node in lab.nodes() {
        let ns = lab.node_netns(node);
        ip(&ns, "link del flannel.1")?;
        vtep_on(lab, &ns, node, port)?;
        for remote in lab.remotes(node) {
            route_to(lab, &ns, remote)?;
        }
        if lab.ipv6_in_ipv4_tunnel() {
            ipv6_in_vtep(lab, &ns, node)?;
        } else if dual_stack {
            ip(&ns, &format!("link del {V6_DEVICE}"))?;
            vtep6_on(&ns, node, port)?;
            for remote in lab.remotes(node) {
                route6_to(&ns, remote)?;
            }
        }
    }
    Ok(())
}

/// flannel.1 on the node's uplink, with the node subnet's network address.
fn vtep(lab: &Lab, ns: &str, node: u8) -> Result<()> {
    vtep_on(lab, ns, node, PORT)
}

fn vtep_on(lab: &Lab, ns: &str, node: u8, port: u16) -> Result<()> {
    ip(
        ns,
        &format!(
            "link add flannel.1 type vxlan id {} dstport {port} local {} dev eth0 nolearning",
            flannel::VNI,
            Lab::node_ip(node)
        ),
    )?;
    ip(
        ns,
        &format!("link set flannel.1 address {}", flannel::vtep_mac(node)),
    )?;
    ip(
        ns,
        &format!(
            "addr add {}/32 dev flannel.1",
            lab.node_subnet(node).network()
        ),
    )?;
    ip(ns, "link set flannel.1 up")
}

/// The route, neighbour and FDB entry flanneld writes for a remote node.
fn route_to(lab: &Lab, ns: &str, remote: u8) -> Result<()> {
    let remote_subnet = lab.node_subnet(remote);
    let vtep = remote_subnet.network();
    let mac = flannel::vtep_mac(remote);
    ip(
        ns,
        &format!("route add {remote_subnet} via {vtep} dev flannel.1 onlink"),
    )?;
    ip(
        ns,
        &format!("neigh add {vtep} lladdr {mac} dev flannel.1 nud permanent"),
    )?;
    cmd::fdb(
        ns,
        "append",
        &mac,
        "flannel.1",
        &Lab::node_ip(remote).to_string(),
    )
}

/// Makes the lab's flannel dual-stack (`Lab::dual_stack`), as flanneld
/// and the flannel CNI plugin leave a cluster with `EnableIPv6`: on each
/// node an IPv6 subnet in subnet.env, IPv6 forwarding, the node's
/// underlay IPv6 address, flannel-v6.1 over it beside flannel.1 (with the
/// route, neighbour and FDB entry for each other node), cni0's IPv6
/// gateway; on each pod an IPv6 address in its node's /64 with a default
/// route via that gateway. Then the lab says it is dual-stack (the pods'
/// `ipv6`, their podIPs in the pods file). A lab already dual-stack is
/// left as it is.
pub fn dual_stack(lab: &Lab) -> Result<()> {
    if lab.is_dual_stack() {
        return Ok(());
    }
    for node in lab.nodes() {
        node_ipv6(lab, node)?;
    }
    address_pods6(lab)?;
    lab.record_dual_stack()
}

/// cni0's IPv6 address, the node's pods' gateway (`::1` of its /64).
fn cni0_gateway6(ns: &str, node: u8) -> Result<()> {
    let gateway = Lab::subnet_host6(node, 1);
    ip(ns, &format!("-6 addr add {gateway}/64 dev cni0 nodad"))
}

/// Every pod's IPv6 address, then cni0 out of DAD on every node.
fn address_pods6(lab: &Lab) -> Result<()> {
    for pod in lab.pods() {
        flannel::address_pod_ipv6(lab, &pod)?;
    }
    for node in lab.nodes() {
        ipv6::settle(&lab.node_netns(node), "cni0")?;
    }
    Ok(())
}

/// One node's IPv6 side, as flanneld sets it up.
fn node_ipv6(lab: &Lab, node: u8) -> Result<()> {
    let ns = lab.node_netns(node);
    let env = super::cni_plugins::subnet_env(lab, node);
    let mut text = std::fs::read_to_string(&env)?;
    text.push_str(&format!(
        "FLANNEL_IPV6_NETWORK={}\nFLANNEL_IPV6_SUBNET={}/64\n",
        Lab::pod_network6(),
        Lab::subnet_host6(node, 1)
    ));
    std::fs::write(&env, text)?;
    // cni0 and the pods' veths carry pod IPv6 too, those made later also.
    ipv6::node_underlay(&ns, node)?;
    vtep6_on(&ns, node, PORT)?;
    cni0_gateway6(&ns, node)?;
    for remote in lab.remotes(node) {
        route6_to(&ns, remote)?;
    }
    Ok(())
}

/// flannel-v6.1, flannel.1's IPv6 twin: same VNI and port, over the
/// node's underlay IPv6 address, its own MAC, router advertisements off
/// (flanneld sets accept_ra 0 on it), the node subnet's network address
/// as a /128.
fn vtep6_on(ns: &str, node: u8, port: u16) -> Result<()> {
    ip(
        ns,
        &format!(
            "link add {V6_DEVICE} type vxlan id {} dstport {port} local {} dev eth0 nolearning",
            flannel::VNI,
            Lab::node_ipv6(node)
        ),
    )?;
    ip(
        ns,
        &format!("link set {V6_DEVICE} address {}", flannel::vtep_mac6(node)),
    )?;
    ipv6::device_sysctl(ns, V6_DEVICE, "accept_ra", "0")?;
    ip(
        ns,
        &format!(
            "-6 addr add {}/128 dev {V6_DEVICE} nodad",
            Lab::node_subnet6(node).network()
        ),
    )?;
    ip(ns, &format!("link set {V6_DEVICE} up"))
}

/// route_to's IPv6 twin: the route to a remote node's IPv6 subnet via its
/// VTEP address (the subnet's network address), and the neighbour and FDB
/// entries that take it to the remote node.
fn route6_to(ns: &str, remote: u8) -> Result<()> {
    let subnet = Lab::node_subnet6(remote);
    let vtep = super::ipv6::Vtep6 {
        device: V6_DEVICE,
        ip: subnet.network(),
        mac: &flannel::vtep_mac6(remote),
        node: remote,
    };
    vtep.route(ns, subnet, "")
}

/// Makes the lab dual-stack with flannel.1 carrying both families
/// (`Lab::dual_stack_in_ipv4_tunnel`), as a CNI with one tunnel device
/// for both leaves a cluster: on each node IPv6 on and forwarding,
/// cni0's IPv6 gateway and flannel.1's IPv6 side (`ipv6_in_vtep`), no
/// IPv6 underlay address and no flannel-v6.1; on each pod its IPv6
/// address, as `dual_stack` gives it. subnet.env keeps IPv4 alone: no
/// flanneld wrote an IPv6 subnet.
pub fn dual_stack_in_ipv4_tunnel(lab: &Lab) -> Result<()> {
    if lab.is_dual_stack() {
        if lab.ipv6_in_ipv4_tunnel() {
            return Ok(());
        }
        bail!("the lab is already dual-stack over an IPv6 underlay");
    }
    for node in lab.nodes() {
        let ns = lab.node_netns(node);
        ipv6::enable(&ns)?;
        super::sysctl(&ns, "net.ipv6.conf.all.forwarding", "1")?;
        cni0_gateway6(&ns, node)?;
        ipv6_in_vtep(lab, &ns, node)?;
    }
    address_pods6(lab)?;
    lab.record_dual_stack_in_ipv4_tunnel()
}

/// flannel.1's IPv6 side where it carries both families: the node IPv6
/// subnet's network address as a /128, and per remote node the route to
/// its IPv6 subnet via its VTEP's IPv6 address (that subnet's network
/// address) onlink, with a permanent neighbour giving that address the
/// remote flannel.1's MAC, which flannel.1's IPv4 FDB entry already sends
/// to the remote node's IPv4 address.
fn ipv6_in_vtep(lab: &Lab, ns: &str, node: u8) -> Result<()> {
    ip(
        ns,
        &format!(
            "-6 addr add {}/128 dev flannel.1 nodad",
            Lab::node_subnet6(node).network()
        ),
    )?;
    for remote in lab.remotes(node) {
        let subnet = Lab::node_subnet6(remote);
        let vtep = subnet.network();
        ip(
            ns,
            &format!("-6 route add {subnet} via {vtep} dev flannel.1 onlink"),
        )?;
        ip(
            ns,
            &format!(
                "-6 neigh add {vtep} lladdr {} dev flannel.1 nud permanent",
                flannel::vtep_mac(remote)
            ),
        )?;
    }
    Ok(())
}
