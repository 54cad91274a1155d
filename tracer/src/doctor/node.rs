//! One node's facts, read once for every check family: its links,
//! addresses, routes and neighbours (rtnetlink), its sysctls, firewall and
//! listening sockets (read from inside its network namespace), the files
//! of its root filesystem, and what the API says of it and the others.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::Result;

use super::{
    cluster::ClusterState,
    credentials::{judge, Credentials, State, CNI_KUBECONFIG, KUBECONFIG_MAX},
};
use crate::{
    cli::DoctorArgs,
    model::bounded,
    node::{host_root::HostRoot, netns, NodeView},
    probe::iptables::{Backend, NodeIptables},
};

pub use super::facts::{FilterTable, NodeFacts};

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
            facts.cni_credentials = cni_credentials(&facts).await;
            facts.bird = Some(super::bird::ask(&facts.root).await);
            facts.bird6 = Some(super::bird::ask6(&facts.root).await);
        }
        all.push(facts);
    }
    let blocks: Vec<(String, ipnet::Ipv4Net)> = all
        .iter()
        .flat_map(|f| f.own_blocks().into_iter().map(|b| (f.name.clone(), b)))
        .collect();
    let blocks6: Vec<(String, ipnet::Ipv6Net)> = all
        .iter()
        .flat_map(|f| f.own_blocks6().into_iter().map(|b| (f.name.clone(), b)))
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
        facts.peer_blocks6 = of_others(&blocks6, &facts.name);
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
    keys.extend(view.links.iter().flat_map(|l| {
        ["rp_filter", "forwarding"].map(|key| format!("net/ipv4/conf/{}/{key}", l.name))
    }));
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
            .map(|text| super::tcp_sockets::parse_proc_net_tcp(&text)),
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
        peer_blocks6: Vec::new(),
        peer_addresses: Vec::new(),
        peer_addresses6: Vec::new(),
        ipv6_defaults: super::ipv6_routes::DefaultRoute6::parse(
            &output("ip", &["-6", "route", "show", "default"]).unwrap_or_default(),
        ),
        nfqueue: nfqueues(),
    })
}

/// The queue rules of this thread's namespace and the queues programs
/// read there (the file exists once nfnetlink_queue is loaded).
fn nfqueues() -> Option<super::nfqueue_state::Queues> {
    let ruleset = output("nft", &["-a", "list", "ruleset"]).ok()?;
    let bound = std::fs::read_to_string("/proc/thread-self/net/netfilter/nfnetlink_queue").ok();
    Some(super::nfqueue_state::Queues {
        rules: super::nfqueue_state::parse_ruleset(&ruleset),
        bound: bound.as_deref().map(super::nfqueue_state::parse_bound),
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

/// Reads and judges the CNI kubeconfig in the node's CNI config
/// directory, when there is one.
async fn cni_credentials(facts: &NodeFacts) -> Option<Credentials> {
    let file = format!("{}/{CNI_KUBECONFIG}", facts.cni_dirs.conf);
    let path = facts.path(&file).ok().filter(|p| p.exists())?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let state = match bounded::read_regular_text(&path, KUBECONFIG_MAX) {
        Ok(text) => judge(&text, now).await,
        Err(e) => State::Unusable(e.to_string()),
    };
    Some(Credentials { file, state })
}
