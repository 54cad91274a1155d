//! Flannel's wireguard backend: per node `flannel-wg` (kind wireguard,
//! UDP 51820, MTU 1420: the underlay's 1500 less WireGuard's 80 over
//! IPv6 or 60 over IPv4, flannel takes 80) holding the node's subnet
//! address, a peer per remote node (its public key, its underlay address
//! as endpoint, its pod subnet as allowed-ips) and one route for the
//! cluster's pod network through the device (cni0's /24 is more specific
//! for the node's own pods). Keys and peers: `wireguard.rs`.

use anyhow::Result;

use super::{flannel::Backend, ip, wireguard, Lab};

pub use super::wireguard::{public_key, PORT};

pub const DEVICE: &str = "flannel-wg";
pub const MTU: u32 = 1420;

pub struct Wireguard;

impl Backend for Wireguard {
    fn name(&self) -> &'static str {
        "flannel-wireguard"
    }

    fn backend_type(&self) -> &'static str {
        "wireguard"
    }

    fn routes(&self, lab: &Lab, ns: &str, node: u8) -> Result<()> {
        wireguard::device(lab, ns, DEVICE, node, None)?;
        for remote in lab.remotes(node) {
            wg_peer(lab, ns, remote)?;
        }
        ip(
            ns,
            &format!("addr add {}/32 dev {DEVICE}", lab.subnet_host(node, 0)),
        )?;
        ip(ns, &format!("link set {DEVICE} mtu {MTU} up"))?;
        ip(
            ns,
            &format!("route add {} dev {DEVICE} scope link", lab.pod_cidr),
        )
    }
}

/// `remote` as a peer of the device in `ns`: its key, its underlay
/// address and port, its pod subnet.
pub fn wg_peer(lab: &Lab, ns: &str, remote: u8) -> Result<()> {
    let allowed = lab.node_subnet(remote).to_string();
    wireguard::peer(ns, DEVICE, remote, &allowed)
}
