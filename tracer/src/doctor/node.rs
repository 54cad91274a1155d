//! One node's facts, read once for every check family: its links,
//! addresses, routes and neighbours (rtnetlink), its sysctls, firewall and
//! listening sockets (read from inside its network namespace), the files
//! of its root filesystem, and what the API says of it and the others.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Result;

use super::cluster::{ClusterNode, ClusterState};
use crate::{
    cli::DoctorArgs,
    cluster::inventory::Pod,
    node::{host_root::HostRoot, netns, NodeView},
    probe::iptables::{Backend, NodeIptables},
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
    pub tcp: Option<Vec<super::bgp::TcpSocket>>,
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
    /// The addresses the other nodes examined with it hold, by node.
    pub peer_addresses: Vec<(String, Vec<Ipv4Addr>)>,
    /// Their IPv6 addresses, by node (bird6's peers).
    pub peer_addresses6: Vec<(String, Vec<std::net::Ipv6Addr>)>,
    /// `ip -6 route show default`.
    pub ipv6_defaults: Vec<super::ipv6::DefaultRoute6>,
}

impl NodeFacts {
    /// A node of nothing but its files under `root` (for tests).
    #[cfg(test)]
    pub fn of_root(root: &Path) -> Self {
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
            peer_addresses: Vec::new(),
            peer_addresses6: Vec::new(),
            ipv6_defaults: Vec::new(),
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
            .bird_blocks()
            .filter_map(|block| match block {
                ipnet::IpNet::V4(block) => Some(block),
                ipnet::IpNet::V6(_) => None,
            })
            .collect()
    }

    pub fn addresses(&self) -> Vec<Ipv4Addr> {
        self.view.own_addresses().collect()
    }

    /// The pod whose IP a link's route or name points at, for naming.
    pub fn pod_named(&self, ip: Ipv4Addr) -> Option<String> {
        self.pods
            .iter()
            .find(|p| p.ip == Some(ip))
            .map(|p| p.qualified())
    }
}

/// Every node the arguments name: one per --netns, or this one.
pub async fn gather_all(args: &DoctorArgs, cluster: &ClusterState) -> Result<Vec<NodeFacts>> {
    let netns: Vec<Option<String>> = if args.kube.netns.is_empty() {
        vec![None]
    } else {
        args.kube.netns.iter().cloned().map(Some).collect()
    };
    let mut all = Vec::new();
    for (i, ns) in netns.iter().enumerate() {
        let given = args.kube.host_root.get(i).cloned();
        let files = given.is_some() || ns.is_none();
        let root = HostRoot::new(given.unwrap_or_else(|| PathBuf::from("/")));
        let name = args.node.get(i).cloned();
        let path = ns.as_deref().map(netns::resolve);
        let mut facts = read(path.as_deref(), root).await?;
        facts.files = files;
        if files {
            facts.cni_dirs = super::cni_dirs::of_node(&facts.root);
        }
        identify(&mut facts, name, ns.as_deref(), cluster);
        facts.conntrack_max_override = args.conntrack_max_for_testing;
        // From here, outside the node's netns: the API is reached as the
        // CNI plugin reaches it, from the host.
        if files {
            facts.cni_credentials = super::credentials::probe(&facts).await;
            facts.bird = Some(super::bird::ask(&facts.root).await);
            facts.bird6 = Some(super::bird::ask6(&facts.root).await);
        }
        all.push(facts);
    }
    let blocks: Vec<(String, ipnet::Ipv4Net)> = all
        .iter()
        .flat_map(|f| f.own_blocks().into_iter().map(|b| (f.name.clone(), b)))
        .collect();
    let addresses: Vec<(String, Vec<Ipv4Addr>)> = all
        .iter()
        .map(|f| {
            let held = f.addresses().into_iter().filter(|a| !a.is_loopback());
            (f.name.clone(), held.collect())
        })
        .collect();
    let addresses6: Vec<(String, Vec<std::net::Ipv6Addr>)> = all
        .iter()
        .map(|f| {
            (
                f.name.clone(),
                f.view.addresses6.iter().map(|(_, ip)| *ip).collect(),
            )
        })
        .collect();
    for facts in &mut all {
        facts.peer_blocks = of_others(&blocks, &facts.name);
        facts.peer_addresses = of_others(&addresses, &facts.name);
        facts.peer_addresses6 = of_others(&addresses6, &facts.name);
    }
    Ok(all)
}

/// The entries of `by_node` of every node but `me`.
fn of_others<T: Clone>(by_node: &[(String, T)], me: &str) -> Vec<(String, T)> {
    (by_node.iter())
        .filter(|(node, _)| node != me)
        .cloned()
        .collect()
}

/// Which Node this is: --node, else the one whose InternalIP it holds.
fn identify(facts: &mut NodeFacts, name: Option<String>, ns: Option<&str>, cluster: &ClusterState) {
    let me = match &name {
        Some(name) => cluster.node_named(name),
        None => cluster.node_holding(&facts.addresses()),
    };
    // Without a node list, the pods' hostIP names the node.
    let by_pod = cluster
        .pods
        .iter()
        .find(|p| {
            p.pod
                .host_ip
                .is_some_and(|ip| facts.addresses().contains(&ip))
        })
        .and_then(|p| p.pod.node.clone());
    facts.name = name
        .or_else(|| me.map(|n| n.name.clone()))
        .or(by_pod)
        .or_else(|| ns.map(|n| format!("netns {n}")))
        .unwrap_or_else(|| "this node".into());
    facts.me = me.cloned();
    facts.others = cluster
        .nodes
        .iter()
        .filter(|n| n.name != facts.name)
        .cloned()
        .collect();
    facts.pods = cluster.pods.iter().map(|p| p.pod.clone()).collect();
    facts.pair = cluster
        .pods
        .iter()
        .filter(|p| cluster.is_asked(&p.pod))
        .filter_map(|p| p.pod.ip)
        .collect();
}

/// Reads a node from inside its network namespace.
async fn read(netns_path: Option<&Path>, root: HostRoot) -> Result<NodeFacts> {
    let _inside = netns_path.map(netns::enter).transpose()?;
    let view = NodeView::read().await?;
    let mut sysctls = BTreeMap::new();
    let mut keys: Vec<String> = [
        "net/ipv4/ip_forward",
        "net/ipv4/conf/all/rp_filter",
        "net/bridge/bridge-nf-call-iptables",
        "net/netfilter/nf_conntrack_count",
        "net/netfilter/nf_conntrack_max",
        "net/netfilter/nf_conntrack_tcp_loose",
        "net/netfilter/nf_conntrack_tcp_be_liberal",
        "net/netfilter/nf_conntrack_tcp_timeout_established",
    ]
    .iter()
    .map(|k| k.to_string())
    .collect();
    keys.extend(
        view.links
            .iter()
            .map(|l| format!("net/ipv4/conf/{}/rp_filter", l.name)),
    );
    keys.extend(super::ipv6::sysctl_keys(
        view.links.iter().map(|l| l.name.as_str()),
    ));
    for key in keys {
        if let Ok(value) = std::fs::read_to_string(Path::new("/proc/sys").join(&key)) {
            sysctls.insert(key, value);
        }
    }
    Ok(NodeFacts {
        root,
        files: false,
        view,
        sysctls,
        iptables: filter_tables(),
        cni_dirs: Default::default(),
        links_up: links_up(),
        fdb: output("bridge", &["fdb", "show"])
            .map(|t| t.lines().map(String::from).collect())
            .unwrap_or_default(),
        tcp: std::fs::read_to_string("/proc/thread-self/net/tcp")
            .ok()
            .map(|text| super::bgp::parse_proc_net_tcp(&text)),
        bird: None,
        bird6: None,
        name: String::new(),
        me: None,
        others: Vec::new(),
        pods: Vec::new(),
        conntrack_max_override: None,
        cni_credentials: None,
        pair: Vec::new(),
        peer_blocks: Vec::new(),
        peer_addresses: Vec::new(),
        peer_addresses6: Vec::new(),
        ipv6_defaults: super::ipv6::DefaultRoute6::parse(
            &output("ip", &["-6", "route", "show", "default"]).unwrap_or_default(),
        ),
    })
}

/// The filter tables of this thread's namespace: of the backend the node
/// runs, then of the other where it holds rules or a policy that drops
/// (the kernel runs both on every packet).
fn filter_tables() -> Result<Vec<FilterTable>, String> {
    let node = NodeIptables::detect();
    let decided = node.backend.ok_or(node.decided_by)?;
    let other = match decided {
        Backend::Nft => Backend::Legacy,
        Backend::Legacy => Backend::Nft,
    };
    let mut tables = vec![FilterTable {
        backend: decided,
        decided: true,
        text: decided
            .save_table(false, "filter")
            .ok_or_else(|| format!("{} -t filter failed", decided.save_program(false))),
    }];
    let holds_anything = |text: &String| {
        let table = super::firewall::parse(text);
        !table.rules.is_empty() || table.policies.values().any(|p| p != "ACCEPT")
    };
    if let Some(text) = other.save_table(false, "filter").filter(holds_anything) {
        tables.push(FilterTable {
            backend: other,
            decided: false,
            text: Ok(text),
        });
    }
    Ok(tables)
}

/// A command's stdout, run in this thread's namespace, or why not.
fn output(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether each link is administratively up (`ip -o link`'s flags).
fn links_up() -> BTreeMap<String, bool> {
    let text = output("ip", &["-o", "link", "show"]).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split(": ");
            let name = parts.nth(1)?.split('@').next()?.to_string();
            let flags = parts.next()?;
            Some((name, flags.contains(",UP") || flags.contains("<UP")))
        })
        .collect()
}
