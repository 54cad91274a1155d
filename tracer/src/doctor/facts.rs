//! Everything the checks of one node read, gathered once (`node`).

use std::{collections::BTreeMap, net::Ipv4Addr, path::PathBuf};

use anyhow::Result;

use super::cluster::ClusterNode;
use crate::{
    cluster::inventory::Pod,
    node::{host_root::HostRoot, NodeView},
    probe::iptables::Backend,
};

/// One iptables backend's filter table (`iptables-save` text).
#[derive(Clone, Debug)]
pub struct FilterTable {
    pub backend: Backend,
    /// Whether it is the backend the node runs (kube-proxy's choice).
    pub decided: bool,
    pub text: Result<String, String>,
}

/// Everything the checks of one node read.
#[derive(Clone, Debug)]
pub struct NodeFacts {
    /// Its name (the Node it is), or the namespace it was read in.
    pub name: String,
    pub root: HostRoot,
    /// Whether the node's files can be read: a node in another netns
    /// without its --host-root has none here (this machine's are not its).
    pub files: bool,
    pub view: NodeView,
    /// `/proc/sys/…` values read inside its netns, by path below /proc/sys.
    pub sysctls: BTreeMap<String, String>,
    /// The filter table of the iptables backend the node runs, then of
    /// the other where it holds anything; or why none could be read.
    pub iptables: Result<Vec<FilterTable>, String>,
    /// Where its runtime keeps the CNI config and plugins.
    pub cni_dirs: super::cni_dirs::CniDirs,
    /// `ip -o link show`: flags (UP) by interface.
    pub links_up: BTreeMap<String, bool>,
    /// `bridge fdb show` lines.
    pub fdb: Vec<String>,
    /// The IPv4 TCP sockets of /proc/net/tcp inside the netns.
    pub tcp: Option<Vec<super::tcp_sockets::TcpSocket>>,
    /// BIRD's answer on its control socket under the root (None: the
    /// node's files are not read here).
    pub bird: Option<super::bird::Asked>,
    /// calico-node's bird6 (IPv6 pools), asked as `bird` is.
    pub bird6: Option<super::bird::Asked>,
    /// The Node object it is, and the others.
    pub me: Option<ClusterNode>,
    pub others: Vec<ClusterNode>,
    /// Pods of the cluster (for pod names and the firewall's pod pairs).
    pub pods: Vec<Pod>,
    pub conntrack_max_override: Option<u64>,
    /// The CNI's own kubeconfig in /etc/cni/net.d (Calico's), judged
    /// offline first, then by the API.
    pub cni_credentials: Option<super::credentials::Credentials>,
    /// The addresses of the pods asked about (all pods', when none are).
    pub pair: Vec<Ipv4Addr>,
    /// Calico's IPAM blocks of the other nodes examined with it (their
    /// `blackhole <block> proto bird` routes), by node.
    pub peer_blocks: Vec<(String, ipnet::Ipv4Net)>,
    /// Their IPv6 blocks (a dual-stack or IPv6 pool's), by node.
    pub peer_blocks6: Vec<(String, ipnet::Ipv6Net)>,
    /// The addresses the other nodes examined with it hold, by node.
    pub peer_addresses: Vec<(String, Vec<Ipv4Addr>)>,
    /// Their IPv6 addresses, by node (bird6's peers).
    pub peer_addresses6: Vec<(String, Vec<std::net::Ipv6Addr>)>,
    /// `ip -6 route show default`.
    pub ipv6_defaults: Vec<super::ipv6_routes::DefaultRoute6>,
    /// Its nfqueue rules and the queues programs read (None: nft could
    /// not list the ruleset).
    pub nfqueue: Option<super::nfqueue_state::Queues>,
}

impl NodeFacts {
    /// A node of nothing but its files under `root` (for tests).
    #[cfg(test)]
    pub fn of_root(root: &std::path::Path) -> Self {
        Self {
            name: "node-1".into(),
            root: HostRoot::new(root),
            cni_dirs: super::cni_dirs::of_node(&HostRoot::new(root)),
            files: true,
            view: NodeView::default(),
            sysctls: BTreeMap::new(),
            iptables: Err("not read".into()),
            links_up: BTreeMap::new(),
            fdb: Vec::new(),
            tcp: None,
            bird: None,
            bird6: None,
            me: None,
            others: Vec::new(),
            pods: Vec::new(),
            conntrack_max_override: None,
            cni_credentials: None,
            pair: Vec::new(),
            peer_blocks: Vec::new(),
            peer_blocks6: Vec::new(),
            peer_addresses: Vec::new(),
            peer_addresses6: Vec::new(),
            ipv6_defaults: Vec::new(),
            nfqueue: None,
        }
    }

    pub fn sysctl(&self, key: &str) -> Option<&str> {
        self.sysctls.get(key).map(|v| v.trim())
    }

    /// Where a path of the node is here (`/etc/cni/net.d` →
    /// `<root>/etc/cni/net.d`), its links followed inside the node's root.
    /// An error for a loop of links.
    pub fn path(&self, node_path: &str) -> std::io::Result<PathBuf> {
        if self.files {
            self.root.path(node_path)
        } else {
            Ok(PathBuf::from("/nonexistent/no-host-root").join(node_path.trim_start_matches('/')))
        }
    }

    /// The path as the node itself names it (`/opt/cni/bin`).
    pub fn shown(relative: &str) -> String {
        format!("/{}", relative.trim_start_matches('/'))
    }

    pub fn pod_cidr(&self) -> Option<ipnet::Ipv4Net> {
        self.me.as_ref()?.pod_cidrs.first().copied()
    }

    /// The Calico IPAM blocks this node holds: bird blackholes each
    /// block affine to the node (`blackhole 10.244.8.0/26 proto bird`)
    /// and exports it to its peers.
    pub fn own_blocks(&self) -> Vec<ipnet::Ipv4Net> {
        self.view
            .calico_blocks()
            .filter_map(|block| match block {
                ipnet::IpNet::V4(block) => Some(block),
                ipnet::IpNet::V6(_) => None,
            })
            .collect()
    }

    /// Its IPv6 blocks, blackholed the same way.
    pub fn own_blocks6(&self) -> Vec<ipnet::Ipv6Net> {
        self.view
            .calico_blocks()
            .filter_map(|block| match block {
                ipnet::IpNet::V6(block) => Some(block),
                ipnet::IpNet::V4(_) => None,
            })
            .collect()
    }

    pub fn addresses(&self) -> Vec<Ipv4Addr> {
        self.view.own_addresses().collect()
    }

    /// Each pod of this node (not of the host's network) with one pod of
    /// each other node: a table either routes that node's pods or not,
    /// so one of its pods stands for them all.
    pub fn pod_pairs(&self) -> Vec<(&Pod, &Pod)> {
        let here = |pod: &&Pod| pod.node.as_deref() == Some(self.name.as_str());
        let routed = |pod: &&Pod| pod.ip.is_some() && !pod.host_network;
        let mut seen = std::collections::BTreeSet::new();
        let remote: Vec<&Pod> = (self.pods.iter())
            .filter(|p| routed(p) && !here(p))
            .filter(|p| seen.insert(p.node.clone()))
            .collect();
        (self.pods.iter())
            .filter(|p| routed(p) && here(p))
            .flat_map(|local| remote.iter().map(move |other| (local, *other)))
            .collect()
    }

    /// The pod whose IP a link's route or name points at, for naming.
    pub fn pod_named(&self, ip: Ipv4Addr) -> Option<String> {
        self.pods
            .iter()
            .find(|p| p.ip == Some(ip))
            .map(|p| p.qualified())
    }
}
