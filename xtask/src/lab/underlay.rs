//! The underlay the nodes share, as racks are wired: nodes 1 and 2 on one
//! subnet behind one bridge, a third node (a lab of three) on a second
//! rack's subnet, the underlay namespace routing between them; and what
//! every node gets before its CNI (forwarding, kubelet's chains).

use std::net::Ipv4Addr;

use anyhow::Result;

use super::{cmd, host_root, in_netns, ip, run, sysctl, veth, Lab};

const UNDERLAY_GATEWAY: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// The underlay router's side of the second rack's subnet, where a lab's
/// third node is (`Cni::nodes`).
const SECOND_RACK_GATEWAY: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const SECOND_RACK_FIRST_NODE: u8 = 3;

impl Lab {
    /// A node's underlay address: nodes 1 and 2 share the first rack's
    /// subnet, a third node (a lab of three) sits on a second rack's, one
    /// router hop away.
    pub fn node_ip(node: u8) -> Ipv4Addr {
        let [a, b, c, _] = Self::rack_gateway(node).octets();
        Ipv4Addr::new(a, b, c, 10 + node)
    }

    /// How many nodes a lab has whose CNI wires a node by rack
    /// (`cross_subnet`: the pool's CrossSubnet mode): the two of one rack,
    /// and then the first of a second.
    pub(super) fn nodes_across_racks(cross_subnet: bool) -> u8 {
        if cross_subnet {
            SECOND_RACK_FIRST_NODE
        } else {
            super::NODES
        }
    }

    /// Whether two nodes share their underlay subnet (one rack).
    pub fn same_subnet(a: u8, b: u8) -> bool {
        Self::rack_gateway(a) == Self::rack_gateway(b)
    }

    /// `node`'s rack subnet (a /24), where its underlay address is.
    pub fn node_underlay_subnet(node: u8) -> ipnet::Ipv4Net {
        ipnet::Ipv4Net::new(Self::rack_gateway(node), 24)
            .expect("a /24")
            .trunc()
    }

    /// The underlay router's address on `node`'s rack subnet (a /24).
    fn rack_gateway(node: u8) -> Ipv4Addr {
        if node < SECOND_RACK_FIRST_NODE {
            UNDERLAY_GATEWAY
        } else {
            SECOND_RACK_GATEWAY
        }
    }

    /// The underlay bridge, each node on it, then the CNI's wiring.
    pub(super) fn build(&self) -> Result<()> {
        let ul = self.underlay_netns();
        cmd::netns_add(&ul)?;
        ip(&ul, "link add br0 type bridge")?;
        ip(&ul, &format!("addr add {UNDERLAY_GATEWAY}/24 dev br0"))?;
        ip(&ul, "link set br0 up")?;
        ip(&ul, "link set lo up")?;
        if self.nodes().any(|n| n >= SECOND_RACK_FIRST_NODE) {
            // The second rack: its own bridge, routed to the first.
            ip(&ul, "link add br1 type bridge")?;
            ip(&ul, &format!("addr add {SECOND_RACK_GATEWAY}/24 dev br1"))?;
            ip(&ul, "link set br1 up")?;
            sysctl(&ul, "net.ipv4.ip_forward", "1")?;
        }
        for node in self.nodes() {
            let ns = self.node_netns(node);
            let gateway = Self::rack_gateway(node);
            let bridge = if gateway == UNDERLAY_GATEWAY {
                "br0"
            } else {
                "br1"
            };
            cmd::netns_add(&ns)?;
            veth(&ul, &format!("n{node}"), &ns, None)?;
            ip(&ul, &format!("link set n{node} master {bridge} up"))?;
            ip(&ns, "link set lo up")?;
            ip(
                &ns,
                &format!("addr add {}/24 dev eth0", Self::node_ip(node)),
            )?;
            ip(&ns, "link set eth0 up")?;
            ip(&ns, &format!("route add default via {gateway} dev eth0"))?;
            sysctl(&ns, "net.ipv4.ip_forward", "1")?;
            kubelet_chains(&ns, "iptables-nft", "-N")?;
            host_root::lay_out(self, node)?;
            self.topology.cni().build_node(self, node)?;
        }
        self.topology.cni().settle(self)
    }
}

/// kubelet's chains in the mangle table of the iptables it runs (1.17 and
/// later), by which kube-proxy's iptables-wrapper (and podtrace) tell the
/// node's backend: `-N` makes them with `iptables` (`iptables-nft` or
/// `iptables-legacy`), `-X` removes them.
pub fn kubelet_chains(ns: &str, iptables: &str, verb: &str) -> Result<()> {
    for chain in ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"] {
        run(in_netns(ns, iptables).args(["-t", "mangle", verb, chain]))?;
    }
    Ok(())
}

impl Lab {
    /// Makes `node` an iptables-legacy node, as kubelet on a node whose
    /// `iptables` is legacy leaves it: its chains in legacy's mangle table
    /// and not in nft's.
    pub fn run_iptables_legacy(&self, node: u8) -> Result<()> {
        let ns = self.node_netns(node);
        kubelet_chains(&ns, "iptables-nft", "-X")?;
        kubelet_chains(&ns, "iptables-legacy", "-N")
    }
}
