//! What a node's kernel treats as a tunnel packet: the tunnels its devices
//! carry (VXLAN/Geneve port and VNI, IPIP), between which addresses (its
//! own and its peers'), on which interfaces (the underlay). The probe
//! reads a packet's inner header only there: elsewhere the same bytes are
//! a payload, and a pod must not be able to forge another pair's story.

use std::net::{IpAddr, Ipv4Addr};

use podtrace_common::{TunnelKey, TunnelPorts, ANY_VNI, GENEVE_PORT, VXLAN_PORT_FLANNEL};

use super::NodeView;

/// IPPROTO_UDP and IPPROTO_IPIP, as the outer header carries them.
const UDP: u8 = 17;
const IPIP: u8 = 4;

/// The node's tunnel facts, for the probe's maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunnelTrust {
    /// Interfaces where encapsulated packets come and go.
    pub hooks: Vec<u32>,
    pub tunnels: Vec<TunnelKey>,
    /// The node's own addresses, of both families (an IPv6 underlay
    /// carries flannel-v6.1's and vxlan-v6.calico's packets).
    pub local: Vec<IpAddr>,
    /// Other nodes' addresses; where none of a family are known, any
    /// address of it may be a peer, but one end must still be the node's
    /// own.
    pub peers: Vec<IpAddr>,
    /// The node's WireGuard devices: a traced packet going into one is
    /// tagged, so that its encrypted leg is known on the underlay.
    pub wireguard_devices: Vec<u32>,
}

impl TunnelTrust {
    /// The UDP ports the probe reads as tunnels: its VXLAN devices' own
    /// (flannel's `Backend.Port`, Calico's `vxlanPort`) beside the
    /// well-known ones (`with_vxlan` leaves those, Geneve's among them, to
    /// the parser's own list).
    pub fn udp_ports(&self) -> TunnelPorts {
        TunnelPorts::with_vxlan(
            self.tunnels
                .iter()
                .filter(|t| t.protocol == UDP)
                .map(|t| t.port),
        )
    }

    /// The high bits of the tags a probe writes into traced packets going
    /// into WireGuard (`podtrace_common::wireguard`): random per probe,
    /// never 0; 0 where the node has no WireGuard device (no tagging).
    pub fn wireguard_tag_prefix(&self) -> u32 {
        use std::hash::{BuildHasher, Hasher};
        if self.wireguard_devices.is_empty() {
            return 0;
        }
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let high = (random as u8).max(1);
        u32::from(high) << 24
    }

    /// From the node's devices, its underlay, and the cluster's node IPs.
    pub fn of(view: &NodeView, underlay: u32, known_nodes: &[Ipv4Addr]) -> Self {
        let mut tunnels = Vec::new();
        for link in &view.links {
            match link.kind.as_str() {
                "vxlan" => {
                    let settings = link.vxlan.unwrap_or_default();
                    tunnels.push(TunnelKey {
                        // The kernel's default when none is set.
                        port: settings
                            .port
                            .filter(|p| *p != 0)
                            .unwrap_or(VXLAN_PORT_FLANNEL),
                        protocol: UDP,
                        _pad: 0,
                        vni: settings.vni.unwrap_or(ANY_VNI),
                    })
                }
                "geneve" => tunnels.push(TunnelKey {
                    port: GENEVE_PORT,
                    protocol: UDP,
                    _pad: 0,
                    vni: ANY_VNI,
                }),
                "ipip" => tunnels.push(TunnelKey {
                    port: 0,
                    protocol: IPIP,
                    _pad: 0,
                    vni: ANY_VNI,
                }),
                _ => {}
            }
        }
        let local: Vec<IpAddr> = (view.own_addresses().map(IpAddr::V4))
            .chain(view.addresses6.iter().map(|(_, ip)| IpAddr::V6(*ip)))
            .collect();
        // An IPIP route's gateway is the peer node itself (Calico: `via
        // <node IP> dev tunl0 onlink`); a VXLAN route's is the remote VTEP's
        // inner address, and its FDB names the node.
        let ipip_devices: Vec<u32> = view.links_of_kind("ipip").map(|l| l.index).collect();
        let via_tunnels = view
            .routes
            .iter()
            .filter(|r| r.oif.is_some_and(|oif| ipip_devices.contains(&oif)))
            .filter_map(|r| r.gateway);
        let mut peers: Vec<IpAddr> = known_nodes
            .iter()
            .map(|ip| IpAddr::V4(*ip))
            .chain(view.fdb_remotes.iter().map(|(_, ip)| *ip))
            .chain(via_tunnels)
            .filter(|ip| !local.contains(ip))
            .collect();
        peers.sort();
        peers.dedup();
        Self {
            hooks: vec![underlay],
            tunnels,
            local,
            peers,
            wireguard_devices: view.links_of_kind("wireguard").map(|l| l.index).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::fixtures::flannel_node;

    #[test]
    fn a_flannel_node_trusts_its_vxlan_between_itself_and_its_peers_on_eth0() {
        let trust = TunnelTrust::of(&flannel_node(), 2, &[]);
        assert_eq!(trust.hooks, [2]);
        let vxlan = TunnelKey {
            port: 8472,
            protocol: UDP,
            _pad: 0,
            vni: 1,
        };
        assert!(trust.tunnels.contains(&vxlan), "{:?}", trust.tunnels);
        assert!(trust.local.contains(&"192.0.2.11".parse().unwrap()));
        // node-2, from flannel.1's FDB entry.
        assert_eq!(trust.peers, ["192.0.2.12".parse::<IpAddr>().unwrap()]);
        // No WireGuard device: nothing is tagged.
        assert_eq!(trust.wireguard_tag_prefix(), 0);
    }

    #[test]
    fn a_node_with_wireguard_tags_under_a_prefix_never_0() {
        let mut node = flannel_node();
        node.links
            .push(crate::node::fixtures::link(9, "flannel-wg", "wireguard"));
        let trust = TunnelTrust::of(&node, 2, &[]);
        assert_eq!(trust.wireguard_devices, [9]);
        for _ in 0..64 {
            let prefix = trust.wireguard_tag_prefix();
            assert_ne!(prefix, 0);
            assert_eq!(prefix & !podtrace_common::wireguard::PREFIX_MASK, 0);
        }
    }
}
