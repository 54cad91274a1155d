//! Calico in IPIP mode (`CALICO_IPV4POOL_IPIP=Always`, the default of
//! Calico's manifest for years): pods and BIRD as in BGP mode
//! (`calico.rs`, `bird.rs`), and the kernel's fallback IPIP device
//! `tunl0`, up with the first address of the node's block, the pods' MTU
//! 20 B under the underlay's, and per remote block the route BIRD
//! installs: `<block> via <node IP> dev tunl0 proto bird onlink`.
//!
//! With the pool's `ipipMode: CrossSubnet`, BIRD tunnels only to peers
//! on another subnet: the lab has a third node on a second rack, and the
//! nodes of one rack route each other's blocks natively (`<block> via
//! <node IP> dev eth0 proto bird`), as confd's template has BIRD do.
//!
//! tunl0 exists once ipip.ko is loaded: this host's kernel has no ipip
//! module, Debian's 5.10, 6.1 and 6.12 do (the VM matrix runs it).

use anyhow::{Context, Result};
use ipnet::Ipv4Net;
use serde_json::{json, Value};

use super::{bird, calico, cmd, ip, Cni, Lab};

const DEVICE: &str = "tunl0";
/// The underlay's 1500 less the outer IPv4 header.
const MTU: u16 = 1480;

pub struct CalicoIpip {
    /// The pool's ipipMode is CrossSubnet (else Always).
    pub cross_subnet: bool,
}

impl Cni for CalicoIpip {
    fn name(&self) -> &'static str {
        if self.cross_subnet {
            "calico-ipip-cross-subnet"
        } else {
            "calico-ipip"
        }
    }

    fn nodes(&self) -> u8 {
        Lab::nodes_across_racks(self.cross_subnet)
    }

    fn default_pod_cidr(&self) -> Ipv4Net {
        "10.248.0.0/16".parse().expect("literal")
    }

    fn host_iface(&self, pod_netns: &str) -> String {
        calico::Calico.host_iface(pod_netns)
    }

    fn build_node(&self, lab: &Lab, node: u8) -> Result<()> {
        let ns = lab.node_netns(node);
        load_ipip()?;
        ip(&ns, &format!("link set {DEVICE} mtu {MTU} up"))?;
        ip(
            &ns,
            &format!("addr add {}/32 dev {DEVICE}", tunnel_ip(lab, node)),
        )?;
        // Calico's plugin sizes both ends of the veth for the tunnel.
        calico::pods(lab, &ns, node, Some(MTU))?;
        bird::start(lab, node, &bird::announced(lab))
    }

    /// Every node's BIRD has learnt the other nodes' blocks.
    fn settle(&self, lab: &Lab) -> Result<()> {
        bird::wait_routes(lab, |_, _| true)
    }

    fn node_annotations(&self, lab: &Lab, node: u8) -> Value {
        json!({
            "projectcalico.org/IPv4Address": format!("{}/24", Lab::node_ip(node)),
            "projectcalico.org/IPv4IPIPTunnelAddr": tunnel_ip(lab, node).to_string(),
        })
    }
}

/// The address calico-node gives tunl0: the first of the node's block.
fn tunnel_ip(lab: &Lab, node: u8) -> std::net::Ipv4Addr {
    lab.subnet_host(node, 0)
}

/// ipip.ko, which gives every namespace its tunl0.
fn load_ipip() -> Result<()> {
    cmd::sh(&["modprobe", "ipip"]).context(
        "the calico-ipip lab needs the ipip kernel module (ipip.ko): this kernel has none; \
         the VM matrix's kernels do (cargo xtask test --kernel 6.1)",
    )
}
