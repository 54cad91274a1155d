//! Flannel's vxlan backend: each node has a flannel.1 VTEP, and reaches a
//! remote pod subnet through it with the route, neighbour and FDB entries
//! flanneld writes (no learning). Pods get the MTU less the 50 B of VXLAN.

use anyhow::Result;

use super::{
    cmd,
    flannel::{self, Backend},
    ip, Lab,
};

/// UDP port of Flannel's vxlan backend (not IANA's 4789).
const PORT: u16 = 8472;

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
        for remote in Lab::remotes(node) {
            route_to(lab, ns, remote)?;
        }
        Ok(())
    }
}

/// Re-creates every node's flannel.1 on UDP `port`, as flanneld makes it
/// when the cluster's net-conf.json sets `Backend.Port`: the VTEP, then
/// the routes, neighbours and FDB entries it writes for the other nodes.
pub fn move_to_port(lab: &Lab, port: u16) -> Result<()> {
    for node in 1..=super::NODES {
        let ns = lab.node_netns(node);
        ip(&ns, "link del flannel.1")?;
        vtep_on(lab, &ns, node, port)?;
        for remote in Lab::remotes(node) {
            route_to(lab, &ns, remote)?;
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

/// Makes the lab's flannel dual-stack on every node, as flanneld does with
/// `EnableIPv6`: an IPv6 subnet in subnet.env, IPv6 forwarding, the node's
/// underlay IPv6 address, a flannel-v6.1 VTEP over it beside flannel.1,
/// cni0's IPv6 gateway, and the route to each other node's IPv6 subnet.
pub fn dual_stack(lab: &Lab) -> Result<()> {
    for node in 1..=super::NODES {
        let ns = lab.node_netns(node);
        let env = super::cni_plugins::subnet_env(lab, node);
        let mut text = std::fs::read_to_string(&env)?;
        text.push_str(&format!(
            "FLANNEL_IPV6_NETWORK={IPV6_NETWORK}::/56\nFLANNEL_IPV6_SUBNET={}1/64\n",
            ipv6_subnet(node)
        ));
        std::fs::write(&env, text)?;
        super::sysctl(&ns, "net.ipv6.conf.all.forwarding", "1")?;
        ip(
            &ns,
            &format!("-6 addr add {}/64 dev eth0 nodad", node_ipv6(node)),
        )?;
        ip(
            &ns,
            &format!(
                "link add flannel-v6.1 type vxlan id {} dstport {PORT} local {} dev eth0 nolearning",
                flannel::VNI,
                node_ipv6(node)
            ),
        )?;
        ip(
            &ns,
            &format!(
                "-6 addr add {}/128 dev flannel-v6.1 nodad",
                ipv6_subnet(node)
            ),
        )?;
        ip(&ns, "link set flannel-v6.1 up")?;
        ip(
            &ns,
            &format!("-6 addr add {}1/64 dev cni0 nodad", ipv6_subnet(node)),
        )?;
        for remote in Lab::remotes(node) {
            let subnet = ipv6_subnet(remote);
            ip(
                &ns,
                &format!("-6 route add {subnet}/64 via {subnet} dev flannel-v6.1 onlink"),
            )?;
        }
    }
    Ok(())
}

/// The cluster's IPv6 pod network (a /56 of ULA space), and each node's
/// /64 of it.
const IPV6_NETWORK: &str = "fd00:10:244:";

fn ipv6_subnet(node: u8) -> String {
    format!("{IPV6_NETWORK}{node}::")
}

/// A node's underlay IPv6 address (ULA).
fn node_ipv6(node: u8) -> String {
    format!("fd5a:0:2::{}", 10 + node)
}
