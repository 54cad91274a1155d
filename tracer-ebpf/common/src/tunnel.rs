//! The tunnels a node's kernel has: which UDP ports are read as VXLAN or
//! Geneve, and the keys of the `TUNNELS` map that decide whether to trust
//! what is read.

use crate::{GENEVE_PORT, VXLAN_PORT_FLANNEL, VXLAN_PORT_IANA};

/// A tunnel this node's kernel encapsulates and decapsulates: a VXLAN or
/// Geneve device's UDP port and VNI, or IPIP. Key of the `TUNNELS` map:
/// a packet is read as a tunnel packet only if its outer header names one
/// of these, so a pod's payload cannot pass for another pair's packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TunnelKey {
    /// UDP destination port (host order); 0 for IPIP.
    pub port: u16,
    /// IP protocol of the outer header (UDP or IPIP).
    pub protocol: u8,
    pub _pad: u8,
    /// The VNI, or [`ANY_VNI`] in the map for a device of any VNI.
    pub vni: u32,
}

/// `TunnelKey::vni` of a map entry that takes every VNI (and of IPIP,
/// which has none).
pub const ANY_VNI: u32 = u32::MAX;

/// VXLAN ports a node's own devices use, beyond the well-known ones, at
/// most.
pub const MAX_NODE_VXLAN_PORTS: usize = 4;

/// The UDP destination ports whose payload is read as a VXLAN or Geneve
/// header: the well-known ones, and the ports of the node's own VXLAN
/// devices (flannel's `Backend.Port`, Calico's `vxlanPort`), which
/// userspace sets at load time. Reading a header is not trusting it: the
/// `TUNNELS`/`NODE_ADDRS`/`TUNNEL_HOOKS` checks still decide.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunnelPorts {
    /// 0: unused.
    pub vxlan: [u16; MAX_NODE_VXLAN_PORTS],
}

/// How a tunnel packet's UDP payload is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdpTunnel {
    Vxlan,
    Geneve,
}

impl TunnelPorts {
    /// The well-known ports only.
    pub const WELL_KNOWN: Self = Self {
        vxlan: [0; MAX_NODE_VXLAN_PORTS],
    };

    /// With the node's VXLAN `ports` (well-known ones and the
    /// surplus past [`MAX_NODE_VXLAN_PORTS`] are left out).
    pub fn with_vxlan(ports: impl IntoIterator<Item = u16>) -> Self {
        let mut this = Self::WELL_KNOWN;
        let mut n = 0;
        for port in ports {
            let known = matches!(port, 0 | VXLAN_PORT_FLANNEL | VXLAN_PORT_IANA | GENEVE_PORT)
                || this.vxlan.contains(&port);
            if !known && n < MAX_NODE_VXLAN_PORTS {
                this.vxlan[n] = port;
                n += 1;
            }
        }
        this
    }

    /// How a packet to UDP `port` is framed, if it may be a tunnel's.
    #[inline(always)]
    pub fn udp_tunnel(&self, port: u16) -> Option<UdpTunnel> {
        match port {
            VXLAN_PORT_FLANNEL | VXLAN_PORT_IANA => Some(UdpTunnel::Vxlan),
            GENEVE_PORT => Some(UdpTunnel::Geneve),
            0 => None,
            _ => {
                let mut i = 0;
                while i < MAX_NODE_VXLAN_PORTS {
                    if self.vxlan[i] == port {
                        return Some(UdpTunnel::Vxlan);
                    }
                    i += 1;
                }
                None
            }
        }
    }
}
