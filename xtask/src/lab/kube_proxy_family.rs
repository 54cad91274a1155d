//! kube-proxy on a dual-stack node runs one proxier per address family,
//! each with rules of its own: iptables and ip6tables (iptables mode), or
//! the `ip kube-proxy` and `ip6 kube-proxy` tables (nftables mode), with
//! the same chain names. [`Family`] is what differs between the two; the
//! rule writers (`kube_proxy`, `kube_proxy_nft`) take it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::Result;

use super::{
    kube_proxy::{restore6, LabService, ProxyMode},
    Lab, LabPod,
};

/// One of a dual-stack node's two proxiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    /// A Service's IPv6 ClusterIP (`PreferDualStack`), from its IPv4 one:
    /// the lab's IPv6 Service CIDR is fd00:10:96::/96, and the low 32
    /// bits are the IPv4 ClusterIP's, so that they stay apart per lab as
    /// the IPv4 ones do.
    pub fn service_ipv6(ipv4: Ipv4Addr) -> Ipv6Addr {
        let [a, b, c, d] = ipv4.octets();
        Ipv6Addr::new(
            0xfd00,
            0x10,
            0x96,
            0,
            0,
            0,
            u16::from_be_bytes([a, b]),
            u16::from_be_bytes([c, d]),
        )
    }

    /// The Service's ClusterIP of this family, if it has one.
    pub fn cluster_ip(self, svc: &LabService) -> Option<IpAddr> {
        match self {
            Self::Ipv4 => Some(svc.cluster_ip.into()),
            Self::Ipv6 => svc.cluster_ipv6.map(IpAddr::V6),
        }
    }

    /// A backend pod's address of this family.
    pub fn address(self, lab: &Lab, pod: &LabPod) -> IpAddr {
        match self {
            Self::Ipv4 => pod.ip.into(),
            Self::Ipv6 => lab.ipv6_of(pod).into(),
        }
    }

    /// The cluster's pod network of this family (kube-proxy's
    /// `--cluster-cidr`, which tells traffic from outside the pods).
    pub fn pod_cidr(self, lab: &Lab) -> String {
        match self {
            Self::Ipv4 => lab.pod_cidr.to_string(),
            Self::Ipv6 => Lab::pod_network6().to_string(),
        }
    }

    /// The prefix length of one address.
    pub fn host_len(self) -> u8 {
        match self {
            Self::Ipv4 => 32,
            Self::Ipv6 => 128,
        }
    }

    /// kube-proxy's REJECT of a Service without endpoints.
    pub fn port_unreachable(self) -> &'static str {
        match self {
            Self::Ipv4 => "icmp-port-unreachable",
            Self::Ipv6 => "icmp6-port-unreachable",
        }
    }

    /// The EndpointSlice `addressType`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ipv4 => "IPv4",
            Self::Ipv6 => "IPv6",
        }
    }

    /// The random suffix the EndpointSlice controller gives each slice's
    /// name, one per family.
    pub fn slice_suffix(self) -> &'static str {
        match self {
            Self::Ipv4 => "abcde",
            Self::Ipv6 => "fghij",
        }
    }

    /// nftables' family word and address type: `ip`/`ipv4_addr`,
    /// `ip6`/`ipv6_addr`.
    pub fn nft(self) -> (&'static str, &'static str) {
        match self {
            Self::Ipv4 => ("ip", "ipv4_addr"),
            Self::Ipv6 => ("ip6", "ipv6_addr"),
        }
    }

    /// The loopback network kube-proxy keeps out of NodePorts.
    pub fn loopback(self) -> &'static str {
        match self {
            Self::Ipv4 => "127.0.0.0/8",
            Self::Ipv6 => "::1",
        }
    }
}

impl Lab {
    /// The IPv6 proxier's rules into node `ns` (a dual-stack lab).
    pub(super) fn install_services6(&self, ns: &str, mode: ProxyMode) -> Result<()> {
        match mode {
            ProxyMode::Iptables => restore6(ns, &self.proxier_rules(Family::Ipv6)),
            ProxyMode::IptablesLegacy => super::cmd::feed(
                ns,
                mode.restore_program(true),
                &["--noflush"],
                &self.proxier_rules(Family::Ipv6),
            ),
            ProxyMode::Nftables => super::cmd::feed(
                ns,
                "nft",
                &["-f", "-"],
                &super::kube_proxy_nft::ruleset_of(self, Family::Ipv6),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_cluster_ip_keeps_the_ipv4_ones_low_bits() {
        let ip = Family::service_ipv6(Ipv4Addr::new(10, 96, 104, 7));
        assert_eq!(ip.to_string(), "fd00:10:96::a60:6807");
    }
}
