//! The lab's second address family. Every topology comes up single-stack;
//! `Lab::dual_stack` then makes it dual-stack as a cluster with IPv6
//! turned on is (flanneld's `EnableIPv6`, Calico's IPv6 pool),
//! IPv4-primary: podIP
//! stays the IPv4 address and podIPs lists IPv4 then IPv6, Kubernetes'
//! order when the cluster's first pod CIDR is IPv4.
//!
//! Whether a lab is dual-stack is a file in its state directory, not a
//! field: `dual_stack` takes `&Lab` (tests hold theirs in a `LabGuard`),
//! and a lab loaded by prefix in another process (`Lab::load`, the API
//! stub) must see it too; `down` forgets it with the rest of the state.
//!
//! The IPv6 plan is fixed, whatever the IPv4 pod CIDR: the pod network
//! fd00:10:244::/56, node N's pods in fd00:10:244:N::/64 (a pod has the
//! host number of its IPv4 address), node N's underlay address
//! fd5a:0:2::1N: flannel's IPv6 subnet as the tests expect flanneld to
//! write it. Concurrent dual-stack labs so share IPv6 addresses: their
//! packets never meet (each lab has namespaces of its own), but what sees
//! every namespace at once (the drop tracepoint) sees both labs' pods.

use std::{
    fs,
    net::{IpAddr, Ipv6Addr},
    path::PathBuf,
};

use anyhow::{bail, Result};
use ipnet::Ipv6Net;

use super::{ip, sysctl, Lab, LabPod};

impl Lab {
    /// Makes the lab dual-stack, where its topology can be (Flannel's
    /// VXLAN, Calico's VXLAN and BGP; host-gw is not wired for IPv6 here).
    /// A lab that is already dual-stack is left as it is.
    pub fn dual_stack(&self) -> Result<()> {
        self.topology.cni().dual_stack(self)
    }

    /// Makes the lab dual-stack with one tunnel device for both families,
    /// as Antrea, OVN-Kubernetes and Cilium have it: the nodes keep an
    /// IPv4-only underlay, and pod IPv6 crosses nodes inside the IPv4
    /// VXLAN device (Flannel's flannel.1 here). A lab already dual-stack
    /// this way is left as it is; one dual-stack over IPv6 is refused.
    pub fn dual_stack_in_ipv4_tunnel(&self) -> Result<()> {
        self.topology.cni().dual_stack_in_ipv4_tunnel(self)
    }

    fn dual_stack_marker(&self) -> PathBuf {
        self.state_dir().join("dual-stack")
    }

    fn in_ipv4_tunnel_marker(&self) -> PathBuf {
        self.state_dir().join("ipv6-in-ipv4-tunnel")
    }

    /// Whether the lab's pod IPv6 crosses nodes inside the IPv4 tunnel
    /// (`dual_stack_in_ipv4_tunnel`): its nodes then have no IPv6
    /// underlay address.
    pub fn ipv6_in_ipv4_tunnel(&self) -> bool {
        self.in_ipv4_tunnel_marker().exists()
    }

    pub fn is_dual_stack(&self) -> bool {
        self.dual_stack_marker().exists()
    }

    /// Records that the lab is now dual-stack, once its nodes and pods
    /// are wired for IPv6, and rewrites the pods and nodes files with
    /// their IPv6 addresses, as the API lists them on such a cluster.
    pub(super) fn record_dual_stack(&self) -> Result<()> {
        fs::create_dir_all(self.state_dir())?;
        fs::write(self.dual_stack_marker(), "")?;
        self.write_inventory()
    }

    /// `record_dual_stack` of a lab made by `dual_stack_in_ipv4_tunnel`.
    pub(super) fn record_dual_stack_in_ipv4_tunnel(&self) -> Result<()> {
        fs::create_dir_all(self.state_dir())?;
        fs::write(self.in_ipv4_tunnel_marker(), "")?;
        self.record_dual_stack()
    }

    /// The cluster's IPv6 pod network (flanneld's FLANNEL_IPV6_NETWORK).
    pub fn pod_network6() -> Ipv6Net {
        Ipv6Net::new(Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, 0), 56).expect("/56")
    }

    /// The node's IPv6 pod subnet: the n-th /64 of the pod network.
    pub fn node_subnet6(node: u8) -> Ipv6Net {
        let base = u128::from(Self::pod_network6().network()) + (u128::from(node) << 64);
        Ipv6Net::new(Ipv6Addr::from(base), 64).expect("/64")
    }

    /// The `host`-th address of the node's IPv6 pod subnet.
    pub fn subnet_host6(node: u8, host: u8) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(Self::node_subnet6(node).network()) + u128::from(host))
    }

    /// A node's underlay IPv6 address (ULA), on its eth0 in a /64.
    pub fn node_ipv6(node: u8) -> Ipv6Addr {
        Ipv6Addr::new(0xfd5a, 0, 2, 0, 0, 0, 0, 0x10 + u16::from(node))
    }

    /// The IPv6 address `pod` has or gets: its own, else the one with the
    /// host number of its IPv4 address (while the lab is made dual-stack,
    /// before `pods()` lists any).
    pub fn ipv6_of(&self, pod: &LabPod) -> Ipv6Addr {
        pod.ipv6.unwrap_or_else(|| {
            let host = u32::from(pod.ip) - u32::from(self.node_subnet(pod.node).network());
            Self::subnet_host6(pod.node, host as u8)
        })
    }

    /// One `ping -6` from inside a pod (`extra`: more ping flags); whether
    /// it was answered.
    pub fn ping6(&self, from_pod: &str, to: Ipv6Addr, extra: &[&str]) -> bool {
        self.ping_ip(from_pod, IpAddr::V6(to), extra)
    }
}

/// IPv6 on in namespace `ns`, on every device it has and will have (a
/// pod's eth0, a node's cni0 and veths): `all` reaches the existing ones,
/// `default` the ones made later (a pod's sandbox recreated).
pub fn enable(ns: &str) -> Result<()> {
    sysctl(ns, "net.ipv6.conf.all.disable_ipv6", "0")?;
    sysctl(ns, "net.ipv6.conf.default.disable_ipv6", "0")
}

/// Gives a pod's eth0 `address` (its prefix: the pod's on-link network)
/// and a default route via `gateway`. `nodad`: the address is usable at
/// once, and DAD would fail anyway on a hairpin bridge port, which echoes
/// the pod's own neighbour solicitations back (the bridge plugin turns
/// DAD off there for the same reason).
pub fn address_pod6(pod_netns: &str, address: Ipv6Net, gateway: Ipv6Addr) -> Result<()> {
    enable(pod_netns)?;
    ip(pod_netns, &format!("-6 addr add {address} dev eth0 nodad"))?;
    ip(pod_netns, "link set eth0 up")?;
    ip(
        pod_netns,
        &format!("-6 route add default via {gateway} dev eth0"),
    )
}

/// Waits until `dev`'s IPv6 addresses are out of DAD. A node forwards
/// to its pods only once the pod-facing device's link-local address is:
/// the kernel sends no neighbour solicitation without one, so the first
/// packets to a pod would wait seconds. A device made just before (cni0,
/// when `Lab::dual_stack` follows `Lab::up`) is still in DAD for up to 2 s.
pub fn settle(ns: &str, dev: &str) -> Result<()> {
    for _ in 0..50 {
        let listed = |flag: &str| -> Result<bool> {
            let out = std::process::Command::new("ip")
                .args(["-n", ns, "-6", "addr", "show", "dev", dev, flag])
                .output()?;
            anyhow::ensure!(
                out.status.success(),
                "ip -n {ns} addr show dev {dev} failed"
            );
            Ok(!out.stdout.is_empty())
        };
        if listed("dadfailed")? {
            bail!("{dev} in {ns}: an IPv6 address failed DAD");
        }
        if !listed("tentative")? {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    bail!("{dev} in {ns}: IPv6 addresses still in DAD after 5 s")
}

/// `sysctl -w` of a device's IPv6 key in its slash form, which keeps a
/// device name with a dot (`flannel-v6.1`) whole.
pub fn device_sysctl(ns: &str, dev: &str, key: &str, value: &str) -> Result<()> {
    sysctl(ns, &format!("net/ipv6/conf/{dev}/{key}"), value)
}

/// A node's IPv6 as the CNIs' dual-stack setups need it: IPv6 on (for
/// devices made later too), forwarding, and its underlay IPv6 address.
pub(super) fn node_underlay(ns: &str, node: u8) -> Result<()> {
    enable(ns)?;
    sysctl(ns, "net.ipv6.conf.all.forwarding", "1")?;
    ip(
        ns,
        &format!("-6 addr add {}/64 dev eth0 nodad", Lab::node_ipv6(node)),
    )
}

/// A remote node's IPv6 VTEP, as a node's VXLAN device reaches it.
pub(super) struct Vtep6<'a> {
    pub device: &'a str,
    pub ip: Ipv6Addr,
    pub mac: &'a str,
    pub node: u8,
}

impl Vtep6<'_> {
    /// The route to `subnet` via the VTEP (`extra`: more route words), the
    /// permanent neighbour that gives its address its MAC, and the FDB
    /// entry that sends the MAC to the remote node's underlay address, as
    /// flanneld and Felix write them.
    pub(super) fn route(&self, ns: &str, subnet: Ipv6Net, extra: &str) -> Result<()> {
        let Self {
            device,
            ip: vtep,
            mac,
            node,
        } = self;
        ip(
            ns,
            &format!("-6 route add {subnet} via {vtep} dev {device} onlink{extra}"),
        )?;
        ip(
            ns,
            &format!("-6 neigh add {vtep} lladdr {mac} dev {device} nud permanent"),
        )?;
        super::cmd::fdb(
            ns,
            "append",
            mac,
            device,
            &Lab::node_ipv6(*node).to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::Topology;

    #[test]
    fn the_ipv6_plan_is_flannels_dual_stack_one() {
        assert_eq!(Lab::pod_network6().to_string(), "fd00:10:244::/56");
        assert_eq!(Lab::node_subnet6(2).to_string(), "fd00:10:244:2::/64");
        assert_eq!(Lab::subnet_host6(1, 1).to_string(), "fd00:10:244:1::1");
        assert_eq!(Lab::node_ipv6(2).to_string(), "fd5a:0:2::12");
        let lab = Lab::new(
            "t",
            Topology::FlannelVxlan,
            Some("10.100.0.0/16".parse().unwrap()),
        )
        .unwrap();
        // Not dual-stack: no state directory says so.
        let db = lab.pod("db-1");
        assert_eq!(db.ipv6, None);
        assert_eq!(lab.ipv6_of(&db).to_string(), "fd00:10:244:2::3");
    }

    #[test]
    fn a_topology_whose_cni_has_no_ipv6_wiring_refuses_by_its_name() {
        let lab = |topology| Lab::new("t", topology, None).unwrap();
        let refused = lab(Topology::FlannelHostGw).dual_stack().unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the lab cannot make flannel's host-gw backend dual-stack"
        );
        let refused = lab(Topology::CalicoIpip).dual_stack().unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the lab cannot make calico-ipip dual-stack"
        );
        let refused = lab(Topology::Calico)
            .dual_stack_in_ipv4_tunnel()
            .unwrap_err();
        assert!(refused.to_string().contains("calico"), "{refused}");
    }
}
