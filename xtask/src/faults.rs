//! The fault catalogue: failures from real troubleshooting write-ups,
//! reproduced on a lab. Each breaks the path web-0 (node-1) → db-0
//! (node-2) the way it broke for someone at 3 a.m.; `heal` rebuilds the
//! healthy lab.

use anyhow::{bail, Result};

use crate::lab::{fdb, in_netns, ip, run, sysctl, Lab, LabPod, Topology};

mod conntrack;
mod node_files;
mod policy;
mod policy_knp;

pub use conntrack::SNAT_PORT;

/// An address on the underlay that no node holds.
pub const GONE_GATEWAY: &str = "192.0.2.254";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// `-A FORWARD -s <web-0>/32 -j DROP` on node-1.
    IptablesForwardDrop,
    /// The same rule written with `iptables-legacy` on node-1, beside its
    /// iptables-nft rules (a tool or an image that links the other
    /// backend): the kernel runs it, nft's rule tracing cannot see it.
    LegacyForwardDrop,
    /// Calico's per-workload chains on node-2 ending in "Drop if no profiles matched".
    CalicoProfileDrop,
    /// Felix's iptables-mode chains on node-2: db-0's ingress selected by
    /// the NetworkPolicy default/backend-deny-ingress, which allows nothing.
    CalicoPolicyDeny,
    /// The same policy in Felix's nftables mode (table `ip calico`).
    CalicoNftPolicyDeny,
    /// The same policy as kube-router renders it (KUBE-ROUTER-FORWARD,
    /// KUBE-POD-FW-*, KUBE-NWPLCY-*): TCP to db-0 is rejected, ICMP echo
    /// passes.
    KubeRouterPolicyDeny,
    /// kube-network-policies' nftables table on node-2 (db-0 in its
    /// `podips-v4` set), written with `--fail-open=false` and no engine
    /// reading its nfqueue: the kernel drops what it queues.
    KubeNetworkPoliciesFailClosed,
    /// KUBE-MARK-DROP marks 0x8000, KUBE-FIREWALL drops marked packets (node-1).
    KubeFirewallMarkDrop,
    /// node-1 loses `<node-2 subnet> via … dev flannel.1` (the default route stays).
    FlannelRouteMissing,
    /// As flannel-route-missing, and node-1 has no default route either.
    FlannelRouteMissingNoDefault,
    /// cni0 deleted on node-1; the pods' veths are left without a bridge.
    Cni0Deleted,
    /// node-1's flannel.1 loses the FDB entry for node-2's VTEP.
    FlannelFdbMissing,
    /// net.ipv4.ip_forward=0 on node-1.
    IpForwardOff,
    /// net.ipv4.conf.cni0.forwarding=0 on node-1, ip_forward left at 1:
    /// one interface's forwarding turned off (by hand, or a tool that
    /// writes conf.<iface> sysctls), which checking ip_forward misses.
    BridgeForwardingOff,
    /// web-0 gets MTU 1500 over a VXLAN path that carries 1450.
    MtuTooBig,
    /// mtu-too-big, and node-1's firewall drops the ICMP "fragmentation
    /// needed" it sends (`-A OUTPUT -p icmp --icmp-type
    /// fragmentation-needed -j DROP`): a PMTU black hole.
    PmtuBlackHole,
    /// node-1 routes node-2's pod subnet via 192.0.2.254, a gateway that is
    /// gone (nothing answers ARP for it).
    NextHopNoArp,
    /// node-2 keeps a `10-calico.conflist` beside `10-flannel.conflist`
    /// (Calico was replaced by Flannel): it sorts first and Calico is not there.
    StaleCniConflist,
    /// node-2's /opt/cni/bin has no `flannel` binary.
    CniPluginMissing,
    /// node-2's /opt/cni/bin is empty, as when a volume is mounted over it.
    CniBinMasked,
    /// node-2's /run/flannel/subnet.env is gone (flanneld never started).
    SubnetEnvMissing,
    /// node-1's projectcalico.org/IPv4Address names 192.0.2.99, an address
    /// it does not have, and both BIRDs are configured from it: node-2
    /// peers with 192.0.2.99, node-1's sessions cannot bind it; neither
    /// node routes to the other's block.
    CalicoWrongPeerIp,
    /// node-1's BIRD is stopped: node-2 withdraws node-1's block (node-1
    /// keeps its routes, BIRD's `persist`).
    CalicoBirdStopped,
    /// `iptables -P FORWARD DROP` on node-1 (as Docker sets it), nothing
    /// accepting the pod CIDR.
    ForwardPolicyDrop,
    /// node-1's conntrack table in use (kube-proxy's INVALID rule, a few
    /// flows). nf_conntrack_max is read-only outside the initial netns, so
    /// the tests judge it against a small --conntrack-max-for-testing.
    ConntrackFull,
    /// kube-proxy's `--ctstate INVALID -j DROP` on node-1, with
    /// nf_conntrack_tcp_loose=0 and established connections forgotten
    /// after a second idle: a late answer of a connection is INVALID.
    ConntrackInvalid,
    /// node-1 masquerades web-0's UDP to db-0 to one source port
    /// (`--to-ports 40000`): a second flow finds no free tuple and is
    /// dropped at confirm (insert_failed).
    SnatExhausted,
    /// node-1's underlay at MTU 1400 (a VPN, an OpenStack network) under a
    /// flannel.1 of 1450: VXLAN packets no longer fit.
    MtuMismatch,
}

/// The firewall rule of a PMTU black hole: the node's own "fragmentation
/// needed" never leaves it.
const FRAG_NEEDED_DROP: &str = "-A OUTPUT -p icmp --icmp-type fragmentation-needed -j DROP";

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Self::IptablesForwardDrop => "iptables-forward-drop",
            Self::LegacyForwardDrop => "legacy-forward-drop",
            Self::CalicoProfileDrop => "calico-profile-drop",
            Self::CalicoPolicyDeny => "calico-policy-deny",
            Self::CalicoNftPolicyDeny => "calico-nft-policy-deny",
            Self::KubeRouterPolicyDeny => "kube-router-policy-deny",
            Self::KubeNetworkPoliciesFailClosed => "kube-network-policies-fail-closed",
            Self::KubeFirewallMarkDrop => "kube-firewall-mark-drop",
            Self::FlannelRouteMissing => "flannel-route-missing",
            Self::FlannelRouteMissingNoDefault => "flannel-route-missing-no-default",
            Self::Cni0Deleted => "cni0-deleted",
            Self::FlannelFdbMissing => "flannel-fdb-missing",
            Self::IpForwardOff => "ip-forward-off",
            Self::BridgeForwardingOff => "bridge-forwarding-off",
            Self::MtuTooBig => "mtu-too-big",
            Self::PmtuBlackHole => "pmtu-black-hole",
            Self::NextHopNoArp => "next-hop-no-arp",
            Self::StaleCniConflist => "stale-cni-conflist",
            Self::CniPluginMissing => "cni-plugin-missing",
            Self::CniBinMasked => "cni-bin-masked",
            Self::SubnetEnvMissing => "subnet-env-missing",
            Self::CalicoWrongPeerIp => "calico-wrong-peer-ip",
            Self::CalicoBirdStopped => "calico-bird-stopped",
            Self::ForwardPolicyDrop => "forward-policy-drop",
            Self::ConntrackFull => "conntrack-full",
            Self::MtuMismatch => "mtu-mismatch",
            Self::ConntrackInvalid => "conntrack-invalid",
            Self::SnatExhausted => "snat-exhausted",
        }
    }

    /// The topology the fault belongs to.
    pub fn topology(self) -> Topology {
        match self {
            Self::CalicoProfileDrop
            | Self::CalicoPolicyDeny
            | Self::CalicoNftPolicyDeny
            | Self::CalicoWrongPeerIp
            | Self::CalicoBirdStopped => Topology::Calico,
            _ => Topology::FlannelVxlan,
        }
    }

    pub fn apply(self, lab: &Lab) -> Result<()> {
        if lab.topology != self.topology() {
            bail!(
                "fault {} needs the {} lab",
                self.name(),
                self.topology().name()
            );
        }
        let (node1, node2) = (lab.node_netns(1), lab.node_netns(2));
        let web = lab.pod("web-0");

        match self {
            Self::IptablesForwardDrop => {
                iptables(&node1, &format!("-A FORWARD -s {}/32 -j DROP", web.ip))?
            }
            Self::LegacyForwardDrop => run(in_netns(&node1, "iptables-legacy").args([
                "-A",
                "FORWARD",
                "-s",
                &format!("{}/32", web.ip),
                "-j",
                "DROP",
            ]))?,
            Self::CalicoProfileDrop => calico_profile_drop(&node2, &lab.pod("db-0"))?,
            Self::CalicoPolicyDeny => policy::calico_iptables(&node2, &lab.pod("db-0"))?,
            Self::CalicoNftPolicyDeny => policy::calico_nftables(&node2, &lab.pod("db-0"))?,
            Self::KubeRouterPolicyDeny => policy::kube_router(&node2, &lab.pod("db-0"))?,
            Self::KubeNetworkPoliciesFailClosed => {
                policy_knp::fail_closed(&node2, &lab.pod("db-0"))?
            }
            Self::KubeFirewallMarkDrop => kube_firewall_mark_drop(&node1, &web)?,
            Self::FlannelRouteMissing => {
                ip(&node1, &format!("route del {}", lab.node_subnet(2)))?;
            }
            Self::NextHopNoArp => {
                let subnet = lab.node_subnet(2);
                ip(
                    &node1,
                    &format!("route replace {subnet} via {GONE_GATEWAY} dev eth0"),
                )?;
            }
            Self::FlannelRouteMissingNoDefault => {
                ip(&node1, &format!("route del {}", lab.node_subnet(2)))?;
                ip(&node1, "route del default")?;
            }
            Self::Cni0Deleted => {
                // The pod has talked before: its neighbour entry for the
                // gateway is still there, so its packets do leave it.
                let gateway = lab.node_subnet(1).hosts().next().expect("a gateway");
                if !lab.ping("web-0", gateway, &[]) {
                    bail!("web-0 cannot reach its gateway {gateway}");
                }
                ip(
                    &web.netns,
                    &format!("neigh change {gateway} dev eth0 nud permanent"),
                )?;
                ip(&node1, "link del cni0")?;
            }
            Self::FlannelFdbMissing => {
                fdb(
                    &node1,
                    "del",
                    &Lab::vtep_mac(2),
                    "flannel.1",
                    &Lab::node_ip(2).to_string(),
                )?;
            }
            Self::IpForwardOff | Self::BridgeForwardingOff => forwarding_off(self, &node1)?,
            Self::MtuTooBig | Self::PmtuBlackHole => {
                ip(&node1, &format!("link set {} mtu 1500", web.host_iface))?;
                ip(&web.netns, "link set eth0 mtu 1500")?;
                if matches!(self, Self::PmtuBlackHole) {
                    iptables(&node1, FRAG_NEEDED_DROP)?;
                }
            }
            Self::ConntrackInvalid | Self::SnatExhausted => conntrack::apply(self, lab)?,
            _ => node_files::apply(self, lab)?,
        }
        Ok(())
    }

    /// Every fault of the catalogue.
    pub fn all() -> &'static [Self] {
        <Self as clap::ValueEnum>::value_variants()
    }
}

/// Calico's per-workload chains on node-2 for `db`, ending in "Drop if
/// no profiles matched", as Felix writes them.
fn calico_profile_drop(node2: &str, db: &LabPod) -> Result<()> {
    let tw = format!("cali-tw-{}", db.host_iface);
    for chain in [
        "cali-FORWARD",
        "cali-from-wl-dispatch",
        "cali-to-wl-dispatch",
        &tw,
    ] {
        iptables(node2, &format!("-N {chain}"))?;
    }
    for rule in [
        r#"-A FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD"#.to_string(),
        r#"-A cali-FORWARD -m comment --comment "cali:vjrMJCRpqwy5oRoX" -j MARK --set-xmark 0x0/0xe0000"#.to_string(),
        r#"-A cali-FORWARD -i cali+ -m comment --comment "cali:A_sPAO0mcxbT9mOV" -j cali-from-wl-dispatch"#.to_string(),
        r#"-A cali-FORWARD -o cali+ -m comment --comment "cali:8ZoYfO5HKXWbB3pk" -j cali-to-wl-dispatch"#.to_string(),
        format!(r#"-A cali-to-wl-dispatch -o {} -m comment --comment "cali:lSj8x5fXYVtbL3Kq" -g {tw}"#, db.host_iface),
        format!(r#"-A {tw} -m comment --comment "cali:Pm-1Bm8LtZKnFmxV" -j MARK --set-xmark 0x0/0x10000"#),
        format!(r#"-A {tw} -m comment --comment "cali:s4tXYq2MQ2b8zM1b" -m comment --comment "Drop if no profiles matched" -j DROP"#),
    ] {
        iptables(node2, &rule)?;
    }
    Ok(())
}

/// The whole node's forwarding off, or only its bridge's.
fn forwarding_off(fault: Fault, node1: &str) -> Result<()> {
    let key = match fault {
        Fault::BridgeForwardingOff => "net.ipv4.conf.cni0.forwarding",
        _ => "net.ipv4.ip_forward",
    };
    sysctl(node1, key, "0")
}

/// kube-proxy's mark-then-drop pair, marking `web`'s forwarded packets.
fn kube_firewall_mark_drop(node1: &str, web: &LabPod) -> Result<()> {
    iptables(node1, "-N KUBE-MARK-DROP")?;
    iptables(node1, "-N KUBE-FIREWALL")?;
    iptables(node1, "-A KUBE-MARK-DROP -j MARK --set-xmark 0x8000/0x8000")?;
    iptables(
        node1,
        r#"-A KUBE-FIREWALL -m comment --comment "kubernetes firewall for dropping marked packets" -m mark --mark 0x8000/0x8000 -j DROP"#,
    )?;
    iptables(
        node1,
        &format!("-A FORWARD -s {}/32 -j KUBE-MARK-DROP", web.ip),
    )?;
    iptables(node1, "-A FORWARD -j KUBE-FIREWALL")?;
    Ok(())
}

/// Runs `iptables <rule>` inside a namespace.
pub(crate) fn iptables(ns: &str, rule: &str) -> Result<()> {
    run(in_netns(ns, "iptables").args(shell_words(rule)))
}

/// Splits a rule on spaces, keeping "double-quoted words" together.
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_comments_stay_one_word() {
        assert_eq!(
            shell_words(r#"-A X -m comment --comment "Drop if no profiles matched" -j DROP"#),
            [
                "-A",
                "X",
                "-m",
                "comment",
                "--comment",
                "Drop if no profiles matched",
                "-j",
                "DROP"
            ]
        );
    }
}
