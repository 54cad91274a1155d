//! The lab: a two-node Kubernetes-like cluster in network namespaces,
//! wired as Flannel (vxlan, host-gw) or Calico (BGP) wire real nodes.
//!
//! Everything lives in namespaces named `<prefix>-…`; nothing is linked to
//! the root namespace, and `down` deletes every namespace with the prefix.

use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use ipnet::Ipv4Net;
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Topology {
    FlannelVxlan,
    FlannelHostGw,
    Calico,
}

impl Topology {
    pub fn name(self) -> &'static str {
        match self {
            Self::FlannelVxlan => "flannel-vxlan",
            Self::FlannelHostGw => "flannel-host-gw",
            Self::Calico => "calico",
        }
    }

    pub fn default_pod_cidr(self) -> Ipv4Net {
        match self {
            Self::Calico => "10.245.0.0/16".parse().expect("literal"),
            _ => "10.244.0.0/16".parse().expect("literal"),
        }
    }
}

/// VNI and port of Flannel's vxlan backend.
const FLANNEL_VNI: u32 = 1;
const FLANNEL_PORT: u16 = 8472;
const UNDERLAY_GATEWAY: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const CALICO_GATEWAY: &str = "169.254.1.1";
const CALICO_MAC: &str = "ee:ee:ee:ee:ee:ee";
/// Pods per node, and their names: node 1 runs web-*, node 2 db-*.
const PODS_PER_NODE: u8 = 2;
const NODES: u8 = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabPod {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
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

    pub fn node_ip(node: u8) -> Ipv4Addr {
        Ipv4Addr::new(192, 0, 2, 10 + node)
    }

    /// The node's pod subnet: the n-th /24 of the pod CIDR.
    pub fn node_subnet(&self, node: u8) -> Ipv4Net {
        let base = u32::from(self.pod_cidr.network()) + (u32::from(node) << 8);
        Ipv4Net::new(Ipv4Addr::from(base), 24).expect("/24")
    }

    fn subnet_host(&self, node: u8, host: u8) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.node_subnet(node).network()) + u32::from(host))
    }

    /// MAC of a node's flannel.1, as Flannel records it in backend-data.
    pub fn vtep_mac(node: u8) -> String {
        format!("0a:58:c0:00:02:{:02x}", 10 + node)
    }

    pub fn pods(&self) -> Vec<LabPod> {
        let mut pods = Vec::new();
        for node in 1..=NODES {
            let app = if node == 1 { "web" } else { "db" };
            for i in 0..PODS_PER_NODE {
                let name = format!("{app}-{i}");
                let netns = format!("{}-{name}", self.prefix);
                // As the CNIs name them: a hash of the pod, 15 chars at most.
                let host_iface = match self.topology {
                    Topology::Calico => format!("cali{:011x}", fnv1a(&netns) >> 20),
                    _ => format!("veth{:08x}", fnv1a(&netns) as u32),
                };
                pods.push(LabPod {
                    netns,
                    ip: self.subnet_host(node, 2 + i),
                    node,
                    host_iface,
                    name,
                });
            }
        }
        pods
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
        let from = self.pod(from_pod);
        Command::new("ip")
            .args(["netns", "exec", &from.netns, "ping", "-c", "1", "-W", "2"])
            .args(extra)
            .arg(to.to_string())
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    pub fn state_dir(&self) -> PathBuf {
        Path::new("/run/podtrace-lab").join(&self.prefix)
    }

    pub fn pods_file(&self) -> PathBuf {
        self.state_dir().join("pods.json")
    }

    pub fn nodes_file(&self) -> PathBuf {
        self.state_dir().join("nodes.json")
    }

    fn all_netns(&self) -> Vec<String> {
        let mut all = vec![self.underlay_netns()];
        all.extend((1..=NODES).map(|n| self.node_netns(n)));
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
        fs::write(
            self.pods_file(),
            serde_json::to_string_pretty(&self.pod_list())?,
        )?;
        fs::write(
            self.nodes_file(),
            serde_json::to_string_pretty(&self.node_list())?,
        )?;
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
        let topology = [
            Topology::FlannelVxlan,
            Topology::FlannelHostGw,
            Topology::Calico,
        ]
        .into_iter()
        .find(|t| t.name() == topology)
        .with_context(|| format!("lab {prefix} has an unknown topology {topology}"))?;
        let pod_cidr = fs::read_to_string(dir.join("pod-cidr"))?.trim().parse()?;
        Self::new(prefix, topology, Some(pod_cidr))
    }

    /// Deletes every namespace with the lab's prefix, and its state.
    pub fn down(&self) -> Result<()> {
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

    fn build(&self) -> Result<()> {
        let ul = self.underlay_netns();
        sh(&["ip", "netns", "add", &ul])?;
        ip(&ul, "link add br0 type bridge")?;
        ip(&ul, &format!("addr add {UNDERLAY_GATEWAY}/24 dev br0"))?;
        ip(&ul, "link set br0 up")?;
        ip(&ul, "link set lo up")?;
        for node in 1..=NODES {
            let ns = self.node_netns(node);
            sh(&["ip", "netns", "add", &ns])?;
            ip(
                &ul,
                &format!("link add n{node} type veth peer name eth0 netns {ns}"),
            )?;
            ip(&ul, &format!("link set n{node} master br0 up"))?;
            ip(&ns, "link set lo up")?;
            ip(
                &ns,
                &format!("addr add {}/24 dev eth0", Self::node_ip(node)),
            )?;
            ip(&ns, "link set eth0 up")?;
            ip(
                &ns,
                &format!("route add default via {UNDERLAY_GATEWAY} dev eth0"),
            )?;
            sysctl(&ns, "net.ipv4.ip_forward", "1")?;
            match self.topology {
                Topology::Calico => self.build_calico_node(node)?,
                _ => self.build_flannel_node(node)?,
            }
        }
        Ok(())
    }

    fn build_flannel_node(&self, node: u8) -> Result<()> {
        let ns = self.node_netns(node);
        let subnet = self.node_subnet(node);
        // A fixed MAC, as the CNI bridge plugin sets one (0a:58 + the
        // gateway IP); otherwise the bridge borrows its lowest port's MAC.
        let [a, b, c, d] = self.subnet_host(node, 1).octets();
        ip(
            &ns,
            &format!("link add cni0 address 0a:58:{a:02x}:{b:02x}:{c:02x}:{d:02x} type bridge"),
        )?;
        ip(
            &ns,
            &format!("addr add {}/24 dev cni0", self.subnet_host(node, 1)),
        )?;
        ip(&ns, "link set cni0 up")?;
        let vxlan = self.topology == Topology::FlannelVxlan;
        if vxlan {
            ip(&ns, &format!(
                "link add flannel.1 type vxlan id {FLANNEL_VNI} dstport {FLANNEL_PORT} local {} dev eth0 nolearning",
                Self::node_ip(node)
            ))?;
            ip(
                &ns,
                &format!("link set flannel.1 address {}", Self::vtep_mac(node)),
            )?;
            ip(
                &ns,
                &format!("addr add {}/32 dev flannel.1", subnet.network()),
            )?;
            ip(&ns, "link set flannel.1 up")?;
        }
        for remote in (1..=NODES).filter(|r| *r != node) {
            let remote_subnet = self.node_subnet(remote);
            if vxlan {
                let vtep = remote_subnet.network();
                let mac = Self::vtep_mac(remote);
                ip(
                    &ns,
                    &format!("route add {remote_subnet} via {vtep} dev flannel.1 onlink"),
                )?;
                ip(
                    &ns,
                    &format!("neigh add {vtep} lladdr {mac} dev flannel.1 nud permanent"),
                )?;
                sh(&[
                    "bridge",
                    "-n",
                    &ns,
                    "fdb",
                    "append",
                    &mac,
                    "dev",
                    "flannel.1",
                    "dst",
                    &Self::node_ip(remote).to_string(),
                ])?;
            } else {
                ip(
                    &ns,
                    &format!(
                        "route add {remote_subnet} via {} dev eth0",
                        Self::node_ip(remote)
                    ),
                )?;
            }
        }
        // Flannel's vxlan backend lowers the pod MTU by the 50 B of VXLAN.
        let mtu = if vxlan { 1450 } else { 1500 };
        for pod in self.pods().into_iter().filter(|p| p.node == node) {
            sh(&["ip", "netns", "add", &pod.netns])?;
            ip(
                &ns,
                &format!(
                    "link add {} mtu {mtu} type veth peer name eth0 netns {}",
                    pod.host_iface, pod.netns
                ),
            )?;
            ip(&ns, &format!("link set {} master cni0 up", pod.host_iface))?;
            ip(&pod.netns, "link set lo up")?;
            ip(&pod.netns, &format!("link set eth0 mtu {mtu}"))?;
            ip(&pod.netns, &format!("addr add {}/24 dev eth0", pod.ip))?;
            ip(&pod.netns, "link set eth0 up")?;
            ip(
                &pod.netns,
                &format!(
                    "route add default via {} dev eth0",
                    self.subnet_host(node, 1)
                ),
            )?;
        }
        Ok(())
    }

    fn build_calico_node(&self, node: u8) -> Result<()> {
        let ns = self.node_netns(node);
        // Calico's IPAM block: pods get /32s from it, the rest blackholes.
        ip(
            &ns,
            &format!("route add blackhole {} proto bird", self.node_subnet(node)),
        )?;
        for remote in (1..=NODES).filter(|r| *r != node) {
            ip(
                &ns,
                &format!(
                    "route add {} via {} dev eth0 proto bird",
                    self.node_subnet(remote),
                    Self::node_ip(remote)
                ),
            )?;
        }
        for pod in self.pods().into_iter().filter(|p| p.node == node) {
            sh(&["ip", "netns", "add", &pod.netns])?;
            ip(
                &ns,
                &format!(
                    "link add {} type veth peer name eth0 netns {}",
                    pod.host_iface, pod.netns
                ),
            )?;
            ip(
                &ns,
                &format!("link set {} address {CALICO_MAC} up", pod.host_iface),
            )?;
            sysctl(
                &ns,
                &format!("net.ipv4.conf.{}.proxy_arp", pod.host_iface),
                "1",
            )?;
            ip(
                &ns,
                &format!("route add {}/32 dev {} scope link", pod.ip, pod.host_iface),
            )?;
            ip(&pod.netns, "link set lo up")?;
            ip(&pod.netns, &format!("addr add {}/32 dev eth0", pod.ip))?;
            ip(&pod.netns, "link set eth0 up")?;
            ip(
                &pod.netns,
                &format!("route add {CALICO_GATEWAY} dev eth0 scope link"),
            )?;
            ip(
                &pod.netns,
                &format!("route add default via {CALICO_GATEWAY} dev eth0"),
            )?;
            ip(
                &pod.netns,
                &format!("neigh add {CALICO_GATEWAY} lladdr {CALICO_MAC} dev eth0 nud permanent"),
            )?;
        }
        Ok(())
    }

    /// The pods as `kubectl get pods -A -o json` prints them.
    pub fn pod_list(&self) -> Value {
        let items: Vec<Value> = self
            .pods()
            .iter()
            .map(|p| {
                json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": p.name, "namespace": "default", "labels": {"app": p.name.split('-').next()}},
                    "spec": {"nodeName": Self::node_name(p.node), "containers": [{"name": "main", "image": "busybox"}]},
                    "status": {
                        "phase": "Running",
                        "podIP": p.ip.to_string(),
                        "podIPs": [{"ip": p.ip.to_string()}],
                        "hostIP": Self::node_ip(p.node).to_string(),
                    }
                })
            })
            .collect();
        json!({"apiVersion": "v1", "kind": "List", "items": items})
    }

    /// The nodes as `kubectl get nodes -o json` prints them, with the CNI's
    /// annotations.
    pub fn node_list(&self) -> Value {
        let items: Vec<Value> = (1..=NODES)
            .map(|n| {
                let ip = Self::node_ip(n).to_string();
                let annotations = match self.topology {
                    Topology::Calico => json!({
                        "projectcalico.org/IPv4Address": format!("{ip}/24"),
                    }),
                    t => json!({
                        "flannel.alpha.coreos.com/backend-type": if t == Topology::FlannelVxlan { "vxlan" } else { "host-gw" },
                        "flannel.alpha.coreos.com/public-ip": ip,
                        "flannel.alpha.coreos.com/backend-data": format!("{{\"VNI\":{FLANNEL_VNI},\"VtepMAC\":\"{}\"}}", Self::vtep_mac(n)),
                    }),
                };
                json!({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": Self::node_name(n), "annotations": annotations},
                    "spec": {"podCIDR": self.node_subnet(n).to_string(), "podCIDRs": [self.node_subnet(n).to_string()]},
                    "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": Self::node_name(n)}]}
                })
            })
            .collect();
        json!({"apiVersion": "v1", "kind": "List", "items": items})
    }
}

fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Runs `ip -n <ns> <args>`.
pub fn ip(ns: &str, args: &str) -> Result<()> {
    let mut argv = vec!["ip", "-n", ns];
    argv.extend(args.split_whitespace());
    sh(&argv)
}

fn sysctl(ns: &str, key: &str, value: &str) -> Result<()> {
    sh(&[
        "ip",
        "netns",
        "exec",
        ns,
        "sysctl",
        "-qw",
        &format!("{key}={value}"),
    ])
}

/// Runs a command; its stderr becomes the error.
pub fn sh(argv: &[&str]) -> Result<()> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .with_context(|| format!("cannot run {}", argv[0]))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
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
}
