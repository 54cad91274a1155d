//! Calico with WireGuard encryption on (`wireguardEnabled`), over BGP as
//! in `calico.rs`: per node Felix's `wireguard.cali` (UDP 51820, MTU 1440:
//! the underlay's less 60 B over IPv4) with its interface address from the
//! node's block and a peer per remote node (its public key, its underlay
//! address, its block as allowed-ips); the remote blocks routed through
//! the device in routing table 1, and the rule that sends every packet not
//! carrying the device's own mark (0x100000, its encrypted UDP) there:
//! `99: not from all fwmark 0x100000/0x100000 lookup 1`. BIRD's main
//! table routes stay, for the encrypted packets and the nodes themselves.
//!
//! Needs wireguard.ko (`wireguard.rs`): it runs in the VM matrix.

use anyhow::Result;
use ipnet::Ipv4Net;
use serde_json::{json, Value};

use super::{bird, calico, ip, wireguard, Cni, Lab};

pub const DEVICE: &str = "wireguard.cali";
/// Felix's routing table and rule priority for WireGuard (its defaults).
pub const TABLE: u32 = 1;
pub const RULE_PRIORITY: u32 = 99;
/// The mark Felix gives the device, which its encrypted packets carry.
const FWMARK: u32 = 0x100000;
const MTU: u16 = 1440;

pub struct CalicoWireguard;

impl Cni for CalicoWireguard {
    fn name(&self) -> &'static str {
        "calico-wireguard"
    }

    fn default_pod_cidr(&self) -> Ipv4Net {
        "10.249.0.0/16".parse().expect("literal")
    }

    fn host_iface(&self, pod_netns: &str) -> String {
        calico::Calico.host_iface(pod_netns)
    }

    fn build_node(&self, lab: &Lab, node: u8) -> Result<()> {
        let ns = lab.node_netns(node);
        wireguard::device(lab, &ns, DEVICE, node, Some(FWMARK))?;
        for remote in lab.remotes(node) {
            let block = lab.node_subnet(remote).to_string();
            wireguard::peer(&ns, DEVICE, remote, &block)?;
        }
        let address = interface_address(lab, node);
        ip(&ns, &format!("addr add {address}/32 dev {DEVICE}"))?;
        ip(&ns, &format!("link set {DEVICE} mtu {MTU} up"))?;
        for remote in lab.remotes(node) {
            let block = lab.node_subnet(remote);
            ip(
                &ns,
                &format!("route add {block} dev {DEVICE} table {TABLE} proto 80 scope link"),
            )?;
        }
        ip(
            &ns,
            &format!(
                "rule add not from all fwmark {FWMARK:#x}/{FWMARK:#x} lookup {TABLE} priority {RULE_PRIORITY}"
            ),
        )?;
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
            "projectcalico.org/IPv4WireguardInterfaceAddr": interface_address(lab, node).to_string(),
            "projectcalico.org/WireguardPublicKey": wireguard::public_key(node).unwrap_or_default(),
        })
    }
}

/// The address Felix gives wireguard.cali: the first of the node's block.
fn interface_address(lab: &Lab, node: u8) -> std::net::Ipv4Addr {
    lab.subnet_host(node, 0)
}
