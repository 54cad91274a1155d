//! The lab: a two-node Kubernetes-like cluster in network namespaces,
//! wired as Flannel (vxlan, host-gw) or Calico (BGP, VXLAN) wire real nodes.
//!
//! Everything lives in namespaces named `<prefix>-…`; nothing is linked to
//! the root namespace, and `down` deletes every namespace with the prefix.
//!
//! This module holds what every topology shares (the underlay, the nodes,
//! the pods' names and addresses; `inventory.rs` the lists `kubectl`
//! would print, `cni_plugins.rs` the real CNI plugins that make pods,
//! `ipv6.rs` the IPv6 family of a lab made dual-stack);
//! each CNI's wiring is one file that implements [`Cni`] (a Flannel
//! backend implements `flannel::Backend`). A new topology is that file
//! plus one [`Topology`] variant.

pub mod aws_vpc;
pub mod bird;
pub mod bird6;
mod calico;
mod calico_ipip;
mod calico_vxlan;
pub mod calico_wireguard;
mod cmd;
pub mod cni_plugins;
pub mod flannel;
mod flannel_host_gw;
pub mod flannel_vxlan;
pub mod flannel_wireguard;
pub mod host_root;
mod inventory;
mod ipv6;
pub mod kube_proxy;
pub mod kube_proxy_family;
mod kube_proxy_nft;
mod service_traffic;
pub mod services_at_scale;
mod underlay;
pub mod wireguard;

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use ipnet::Ipv4Net;
use serde_json::Value;

pub use cmd::{fdb, feed, in_netns, ip, netns_exists, run, sh, sysctl, veth};
pub use ipv6::address_pod6;
pub use underlay::kubelet_chains;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Topology {
    FlannelVxlan,
    FlannelHostGw,
    /// Flannel's wireguard backend: needs wireguard.ko (the VM matrix's kernels).
    FlannelWireguard,
    Calico,
    CalicoVxlan,
    /// Calico VXLAN with the pool's vxlanMode CrossSubnet: three nodes,
    /// the third on another subnet.
    CalicoVxlanCrossSubnet,
    /// Calico in IPIP mode: needs ipip.ko (the VM matrix's kernels).
    CalicoIpip,
    /// Calico IPIP with the pool's ipipMode CrossSubnet: three nodes, the
    /// third on another subnet; needs ipip.ko.
    CalicoIpipCrossSubnet,
    /// Calico over BGP with WireGuard on (wireguard.cali, table 1): needs
    /// wireguard.ko (the VM matrix's kernels).
    CalicoWireguard,
    AwsVpc,
}

/// An IP pool's `ipipMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpipMode {
    Always,
    CrossSubnet,
}

/// What one CNI decides about a lab: names, addresses and node wiring.
pub trait Cni: Sync {
    fn name(&self) -> &'static str;
    fn default_pod_cidr(&self) -> Ipv4Net;
    /// The host side of a pod's veth, as the CNI names it (15 chars at most).
    fn host_iface(&self, pod_netns: &str) -> String;
    /// Wires one node whose uplink (eth0 on the underlay) is up: its pod
    /// network, the routes to the other nodes' pods, and its pods.
    fn build_node(&self, lab: &Lab, node: u8) -> Result<()>;
    /// The annotations the CNI puts on its Node objects.
    fn node_annotations(&self, lab: &Lab, node: u8) -> Value;
    /// Waits, once every node is wired, for what the nodes learn from
    /// each other (Calico's BGP routes).
    fn settle(&self, _lab: &Lab) -> Result<()> {
        Ok(())
    }
    /// Removes the pods' sandboxes as a runtime does (CNI DEL), before
    /// their namespaces go.
    fn tear_down(&self, _lab: &Lab) {}
    /// How many nodes the lab has: two, or three where the CNI's wiring
    /// differs by rack (the third node on a second rack's subnet).
    fn nodes(&self) -> u8 {
        NODES
    }
    /// Makes the wired lab dual-stack as the CNI does with IPv6 turned on
    /// (`Lab::dual_stack`): each node's IPv6 devices, its routes to the
    /// other nodes' IPv6 pod subnets, and its pods' IPv6 addresses.
    fn dual_stack(&self, _lab: &Lab) -> Result<()> {
        bail!("the lab cannot make {} dual-stack", self.name())
    }
    /// Makes the wired lab dual-stack with pod IPv6 inside its IPv4
    /// tunnel device (`Lab::dual_stack_in_ipv4_tunnel`).
    fn dual_stack_in_ipv4_tunnel(&self, _lab: &Lab) -> Result<()> {
        bail!(
            "the lab cannot carry {}'s IPv6 inside its IPv4 tunnel",
            self.name()
        )
    }
}

impl Topology {
    /// The one place a topology is tied to its wiring.
    pub fn cni(self) -> &'static dyn Cni {
        match self {
            Self::FlannelVxlan => &flannel::Flannel(flannel_vxlan::Vxlan),
            Self::FlannelHostGw => &flannel::Flannel(flannel_host_gw::HostGw),
            Self::FlannelWireguard => &flannel::Flannel(flannel_wireguard::Wireguard),
            Self::Calico => &calico::Calico,
            Self::CalicoVxlan => &calico_vxlan::CalicoVxlan {
                cross_subnet: false,
            },
            Self::CalicoVxlanCrossSubnet => &calico_vxlan::CalicoVxlan { cross_subnet: true },
            Self::CalicoIpip => &calico_ipip::CalicoIpip {
                cross_subnet: false,
            },
            Self::CalicoIpipCrossSubnet => &calico_ipip::CalicoIpip { cross_subnet: true },
            Self::CalicoWireguard => &calico_wireguard::CalicoWireguard,
            Self::AwsVpc => &aws_vpc::AwsVpc,
        }
    }

    pub fn name(self) -> &'static str {
        self.cni().name()
    }

    /// Calico's IPIP mode, where the topology is Calico's over IPIP.
    pub fn ipip_mode(self) -> Option<IpipMode> {
        match self {
            Self::CalicoIpip => Some(IpipMode::Always),
            Self::CalicoIpipCrossSubnet => Some(IpipMode::CrossSubnet),
            _ => None,
        }
    }

    /// Calico's BGP datapath (BIRD), whatever the pool's encapsulation.
    pub fn is_calico_bgp(self) -> bool {
        matches!(self, Self::Calico) || self.ipip_mode().is_some()
    }

    pub fn default_pod_cidr(self) -> Ipv4Net {
        self.cni().default_pod_cidr()
    }
}

/// Pods per node, and their names: node 1 runs web-*, node 2 db-*, a
/// third node cache-*.
const PODS_PER_NODE: u8 = 2;
pub(crate) const NODES: u8 = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabPod {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    /// Its IPv6 address once the lab is dual-stack (`Lab::is_dual_stack`):
    /// the same host number in its node's /64.
    pub ipv6: Option<Ipv6Addr>,
    pub node: u8,
    /// Host-side interface in the node namespace.
    pub host_iface: String,
}

#[derive(Clone, Debug)]
pub struct Lab {
    pub prefix: String,
    pub topology: Topology,
    pub pod_cidr: Ipv4Net,
}

impl Lab {
    pub fn new(prefix: &str, topology: Topology, pod_cidr: Option<Ipv4Net>) -> Result<Self> {
        let pod_cidr = pod_cidr.unwrap_or_else(|| topology.default_pod_cidr());
        if pod_cidr.prefix_len() > 16 {
            bail!(
                "pod CIDR {pod_cidr} is too small: the lab needs a /16 or larger, one /24 per node"
            );
        }
        if prefix.is_empty()
            || prefix.len() > 20
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            bail!("lab prefix {prefix:?} must be 1-20 characters of [A-Za-z0-9-]");
        }
        Ok(Self {
            prefix: prefix.into(),
            topology,
            pod_cidr,
        })
    }

    pub fn underlay_netns(&self) -> String {
        format!("{}-underlay", self.prefix)
    }

    pub fn node_netns(&self, node: u8) -> String {
        format!("{}-node{node}", self.prefix)
    }

    pub fn node_name(node: u8) -> String {
        format!("node-{node}")
    }

    /// The lab's nodes, numbered from 1.
    pub fn nodes(&self) -> std::ops::RangeInclusive<u8> {
        1..=self.topology.cni().nodes()
    }

    /// The other nodes, the ones `node` routes to.
    pub fn remotes(&self, node: u8) -> impl Iterator<Item = u8> {
        self.nodes().filter(move |r| *r != node)
    }

    /// The node's pod subnet: the n-th /24 of the pod CIDR.
    pub fn node_subnet(&self, node: u8) -> Ipv4Net {
        let base = u32::from(self.pod_cidr.network()) + (u32::from(node) << 8);
        Ipv4Net::new(Ipv4Addr::from(base), 24).expect("/24")
    }

    /// The `host`-th address of the node's pod subnet.
    pub fn subnet_host(&self, node: u8, host: u8) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.node_subnet(node).network()) + u32::from(host))
    }

    /// MAC of a node's flannel.1, as Flannel records it in backend-data.
    pub fn vtep_mac(node: u8) -> String {
        flannel::vtep_mac(node)
    }

    pub fn pods(&self) -> Vec<LabPod> {
        // Asked once: the answer is a file in the state directory.
        let dual_stack = self.is_dual_stack();
        let mut pods = Vec::new();
        for node in self.nodes() {
            let app = ["web", "db", "cache"][usize::from(node - 1)];
            for i in 0..PODS_PER_NODE {
                let name = format!("{app}-{i}");
                let netns = format!("{}-{name}", self.prefix);
                pods.push(LabPod {
                    host_iface: self.topology.cni().host_iface(&netns),
                    netns,
                    ip: self.subnet_host(node, 2 + i),
                    ipv6: dual_stack.then(|| Self::subnet_host6(node, 2 + i)),
                    node,
                    name,
                });
            }
        }
        pods
    }

    /// The pods that run on `node`.
    pub fn pods_on(&self, node: u8) -> impl Iterator<Item = LabPod> {
        self.pods().into_iter().filter(move |p| p.node == node)
    }

    pub fn pod(&self, name: &str) -> LabPod {
        self.pods()
            .into_iter()
            .find(|p| p.name == name)
            .expect("a lab pod")
    }

    /// One ping from inside a pod (`extra`: more ping flags); whether it
    /// was answered.
    pub fn ping(&self, from_pod: &str, to: Ipv4Addr, extra: &[&str]) -> bool {
        self.ping_ip(from_pod, to.into(), extra)
    }

    /// `ping` and `ping6`: `ping -6` for an IPv6 destination.
    fn ping_ip(&self, from_pod: &str, to: IpAddr, extra: &[&str]) -> bool {
        let from = self.pod(from_pod);
        let family: &[&str] = if to.is_ipv6() { &["-6"] } else { &[] };
        in_netns(&from.netns, "ping")
            .args(family)
            .args(["-c", "1", "-W", "2"])
            .args(extra)
            .arg(to.to_string())
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    pub fn state_dir(&self) -> PathBuf {
        Path::new("/run/podtrace-lab").join(&self.prefix)
    }

    /// Writes the pods and nodes files as the API would list them now.
    fn write_inventory(&self) -> Result<()> {
        fs::write(
            self.pods_file(),
            serde_json::to_string_pretty(&self.pod_list())?,
        )?;
        fs::write(
            self.nodes_file(),
            serde_json::to_string_pretty(&self.node_list())?,
        )?;
        Ok(())
    }

    pub fn pods_file(&self) -> PathBuf {
        self.state_dir().join("pods.json")
    }

    /// A node's root filesystem (`/host` of a debug pod on a real node):
    /// etc/cni/net.d, opt/cni/bin, run/flannel.
    pub fn host_root(&self, node: u8) -> PathBuf {
        self.state_dir().join(Self::node_name(node)).join("root")
    }

    pub fn nodes_file(&self) -> PathBuf {
        self.state_dir().join("nodes.json")
    }

    fn all_netns(&self) -> Vec<String> {
        let mut all = vec![self.underlay_netns()];
        all.extend(self.nodes().map(|n| self.node_netns(n)));
        all.extend(self.pods().into_iter().map(|p| p.netns));
        all
    }

    /// Brings the lab up; a lab that is already up is left as it is.
    pub fn up(&self) -> Result<()> {
        let marker = self.state_dir().join("topology");
        if fs::read_to_string(&marker).is_ok_and(|t| t == self.topology.name())
            && self.all_netns().iter().all(|ns| netns_exists(ns))
        {
            return Ok(());
        }
        self.down()?;
        self.build().inspect_err(|_| {
            let _ = self.down();
        })?;
        fs::create_dir_all(self.state_dir())?;
        self.write_inventory()?;
        fs::write(self.state_dir().join("pod-cidr"), self.pod_cidr.to_string())?;
        fs::write(marker, self.topology.name())?;
        Ok(())
    }

    /// The lab that is up under `prefix`, as `up` recorded it.
    pub fn load(prefix: &str) -> Result<Self> {
        let dir = Path::new("/run/podtrace-lab").join(prefix);
        let topology = fs::read_to_string(dir.join("topology")).with_context(|| {
            format!("no lab {prefix} is up (cargo xtask lab up … --prefix {prefix})")
        })?;
        let topology = <Topology as clap::ValueEnum>::value_variants()
            .iter()
            .copied()
            .find(|t| t.name() == topology)
            .with_context(|| format!("lab {prefix} has an unknown topology {topology}"))?;
        let pod_cidr = fs::read_to_string(dir.join("pod-cidr"))?.trim().parse()?;
        Self::new(prefix, topology, Some(pod_cidr))
    }

    /// The kubeconfig of the lab's API (`lab up --api`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.state_dir().join("kubeconfig")
    }

    /// Starts the lab's API stub as a server of its own (`xtask api-stub`,
    /// started detached by `program`), with its kubelet running `podtrace`;
    /// its pid goes in the state directory, its kubeconfig too.
    pub fn start_api(&self, program: &Path, podtrace: &Path) -> Result<PathBuf> {
        use std::os::unix::process::CommandExt;
        self.stop_api();
        fs::create_dir_all(self.state_dir())?;
        let kubeconfig = self.kubeconfig();
        let _ = fs::remove_file(&kubeconfig);
        let log = fs::File::create(self.state_dir().join("api.log"))?;
        let child = std::process::Command::new(program)
            .args(["api-stub", "--prefix", &self.prefix, "--podtrace"])
            .arg(podtrace)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("cannot start the API stub")?;
        fs::write(self.state_dir().join("api.pid"), child.id().to_string())?;
        for _ in 0..100 {
            if kubeconfig.exists() {
                return Ok(kubeconfig);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bail!(
            "the API stub did not start: see {}",
            self.state_dir().join("api.log").display()
        )
    }

    /// Stops the lab's API stub, if it runs (its kubelet stops the agents).
    pub fn stop_api(&self) {
        let pid_file = self.state_dir().join("api.pid");
        let Some(pid) = fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        else {
            return;
        };
        let _ = sh(&["kill", "-TERM", &pid.to_string()]);
        for _ in 0..150 {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = fs::remove_file(pid_file);
    }

    /// Deletes every namespace with the lab's prefix, and its state.
    pub fn down(&self) -> Result<()> {
        self.stop_api();
        self.stop_listeners();
        // Before the namespaces go: a daemon in one would keep it alive.
        bird::stop_all(self);
        self.topology.cni().tear_down(self);
        let owned = format!("{}-", self.prefix);
        if let Ok(entries) = fs::read_dir("/run/netns") {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(&owned) {
                    sh(&["ip", "netns", "del", &name])?;
                }
            }
        }
        let _ = fs::remove_dir_all(self.state_dir());
        Ok(())
    }
}

/// A short stable hash of a pod, for interface names as the CNIs make them.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// Takes the lab down when dropped, so a test that fails halfway leaves
/// nothing behind.
pub struct LabGuard(pub Lab);

impl LabGuard {
    pub fn up(prefix: &str, topology: Topology, pod_cidr: Option<Ipv4Net>) -> Result<Self> {
        let lab = Lab::new(prefix, topology, pod_cidr)?;
        let guard = Self(lab);
        guard.0.up()?;
        Ok(guard)
    }
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Err(e) = self.0.down() {
            eprintln!("lab {}: cannot take it down: {e:#}", self.0.prefix);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cidr_is_a_parameter() {
        let lab = Lab::new(
            "t",
            Topology::FlannelVxlan,
            Some("10.100.0.0/16".parse().unwrap()),
        )
        .unwrap();
        assert_eq!(lab.node_subnet(2).to_string(), "10.100.2.0/24");
        assert_eq!(lab.pod("db-0").ip, Ipv4Addr::new(10, 100, 2, 2));
        assert!(Lab::new("t", Topology::Calico, Some("10.1.2.0/24".parse().unwrap())).is_err());
        let calico = Lab::new("t", Topology::Calico, None).unwrap();
        assert_eq!(calico.pod("web-1").ip, Ipv4Addr::new(10, 245, 1, 3));
        assert!(calico
            .pods()
            .iter()
            .all(|p| p.host_iface.starts_with("cali") && p.host_iface.len() <= 15));
    }

    #[test]
    fn every_topology_loads_back_by_its_name() {
        for t in <Topology as clap::ValueEnum>::value_variants() {
            let name = clap::ValueEnum::to_possible_value(t).unwrap();
            assert_eq!(name.get_name(), t.name());
        }
    }
}
