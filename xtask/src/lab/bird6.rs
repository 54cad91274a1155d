//! The Calico BGP lab made dual-stack as calico-node runs an IPv6 pool
//! without encapsulation: a second BIRD per node, `bird6`, with its own
//! config (`bird6.cfg`) and control socket (`bird6.ctl`), blackholes the
//! node's IPv6 block and exports it to the kernel (`proto bird`), in an
//! iBGP mesh between the nodes' IPv6 addresses (`Mesh_fd5a_0_2__12`, as
//! confd names the sessions of bird6.cfg). The other nodes' IPv6 blocks
//! are then routed `via` their IPv6 address on the underlay, learnt over
//! BGP, with no tunnel; each pod gets a /128 to its `cali…` end.

use anyhow::Result;

use super::{
    bird::{self, Daemon},
    calico, ipv6, Lab, NODES,
};

/// Makes a Calico BGP lab dual-stack (`Lab::dual_stack`): on each node
/// IPv6 forwarding and its underlay IPv6 address, its pods' IPv6 sides,
/// then its bird6; done once every node has a `proto bird` route to every
/// other node's IPv6 block. A lab already dual-stack is left as it is.
pub fn dual_stack(lab: &Lab) -> Result<()> {
    if lab.is_dual_stack() {
        return Ok(());
    }
    for node in 1..=NODES {
        let ns = lab.node_netns(node);
        ipv6::node_underlay(&ns, node)?;
        for pod in lab.pods_on(node) {
            calico::pod_ipv6(lab, &ns, &pod)?;
        }
        bird::start_daemon(lab, node, Daemon::Bird6, &config(lab, node))?;
    }
    wait_routes(lab)?;
    lab.record_dual_stack()
}

/// `node`'s bird6.cfg: bird.cfg's shape over IPv6 (the router id stays
/// the node's IPv4 address, as calico-node sets it for bird6 too).
pub fn config(lab: &Lab, node: u8) -> String {
    bird::render(&bird::Plan {
        daemon: Daemon::Bird6,
        log: bird::log_file(lab, node, Daemon::Bird6),
        router_id: Lab::node_ip(node),
        me: Lab::node_ipv6(node).into(),
        peers: (lab.remotes(node))
            .map(|peer| (peer, Lab::node_ipv6(peer).into()))
            .collect(),
        block: Lab::node_subnet6(node).into(),
        pods: Lab::pod_network6().into(),
        // Calico has no IPv6 IPIP: an IPv6 pool is routed or VXLAN.
        tunnel: None,
    })
}

/// Stops `node`'s bird6 (its sessions closed with a notification) and
/// waits until the other nodes have withdrawn their routes to its IPv6
/// block: a fault as calico-node's bird6 dying makes it.
pub fn withdraw(lab: &Lab, node: u8) -> Result<()> {
    bird::stop_daemon(lab, node, Daemon::Bird6)?;
    wait_routes_where(lab, |_, remote| remote != node)
}

/// Waits until every node has a `proto bird` route to every other node's
/// IPv6 block.
fn wait_routes(lab: &Lab) -> Result<()> {
    wait_routes_where(lab, |_, _| true)
}

/// Waits until each node's routes to the other nodes' IPv6 blocks are
/// as `expected(node, remote)` says (present or gone).
fn wait_routes_where(lab: &Lab, expected: impl Fn(u8, u8) -> bool) -> Result<()> {
    bird::wait_blocks(
        lab,
        Daemon::Bird6,
        |n| Lab::node_subnet6(n).into(),
        expected,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::Topology;

    #[test]
    fn the_config_has_calicos_bird6_shape() {
        let lab = Lab::new("t", Topology::Calico, None).unwrap();
        let node1 = config(&lab, 1);
        for line in [
            "router id 192.0.2.11;",
            "route fd00:10:244:1::/64 blackhole;",
            "source address fd5a:0:2::11;",
            "protocol bgp Mesh_fd5a_0_2__12 from bgp_template {\n  neighbor fd5a:0:2::12 as 64512;\n  passive on;",
        ] {
            assert!(node1.contains(line), "{line}\n{node1}");
        }
        assert!(config(&lab, 2).contains("neighbor fd5a:0:2::11 as 64512;\n}"));
    }
}
