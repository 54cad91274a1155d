//! A traced node, set up end to end: its view read, its CNI recognised, its
//! interfaces picked, the probe attached, link changes followed, and rule
//! tracing started. Setting one up returns what was learnt about it
//! ([`NodeFacts`]) instead of writing into a shared context.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr},
};

use anyhow::{Context as _, Result};
use podtrace_common::{drops::MAX_NODES, filter::L4Filter, packet6::FlowKey6, FlowKey};
use tokio::sync::mpsc;

use super::{
    pairs::ipv4_pairs,
    pod_interfaces::{find_pod_interfaces, needed},
};
use crate::model::{conntrack::Entry, netfilter::TracedRule};
use crate::{
    cni::{
        self,
        watch::{select, watch},
        Backend,
    },
    decode::sighting::NodeLinks,
    model::{Name, NodeSubnet},
    node::{
        interfaces::{self, Role, Watched},
        netlink,
        netns::{self, Namespace},
        tunnels::TunnelTrust,
        wireguard, NodeFacts, NodeView,
    },
    probe::{
        conntrack,
        conntrack_stats::ConntrackStats,
        link_watch::{self, LinkChange},
        netfilter::{NodeTrace, SentHere},
        AttachMode, Kernel, NodeProbe, ProbeSpec,
    },
};

/// Settings every node shares.
pub struct Shared<'a> {
    pub kernel: &'a Kernel,
    pub btf: &'a aya::Btf,
    /// Node names and IPs of the cluster, to tell which node a namespace is.
    pub known_nodes: &'a [(String, Ipv4Addr)],
    /// Node names and IPv6 addresses (an IPv6-only node has no IPv4 one).
    pub known_nodes6: &'a [(String, std::net::Ipv6Addr)],
    /// Pod subnets and CNI annotations of the cluster's nodes.
    pub subnets: &'a [NodeSubnet],
    pub flows: &'a [FlowKey],
    /// The traced IPv6 pairs, both directions.
    pub flows6: &'a [FlowKey6],
    pub traced_netns: [u32; MAX_NODES],
    pub mode: AttachMode,
    pub ring_bytes: u32,
    /// Profile mode (`podtrace profile`).
    pub profile: bool,
    /// Profile mode: where the nodes' probes share their packet stamps.
    pub shared_stamps: Option<&'a std::path::Path>,
    /// `--sample N`.
    pub sample: u32,
    /// `--proto`/`--port`, as the kernel reads it.
    pub l4_filter: Option<L4Filter>,
    pub link_tx: mpsc::UnboundedSender<(u32, LinkChange)>,
    /// Where the node's translated conntrack entries go.
    pub conntrack_tx: mpsc::UnboundedSender<(u32, Entry)>,
    /// Where netfilter drops go, when rule tracing is on.
    pub netfilter_tx: Option<mpsc::UnboundedSender<(u32, TracedRule)>>,
    /// The traced address pairs of both families, both directions.
    pub pairs: Vec<(IpAddr, IpAddr)>,
    /// The traced endpoints' nodes, where the pod list says.
    pub endpoint_nodes: Vec<(IpAddr, String)>,
    /// `--node-ip`s: each node takes the one it holds.
    pub node_ips: &'a [Ipv4Addr],
    /// Each traced namespace's own addresses, by node id: where no node
    /// list says which the other nodes are, they tell.
    pub traced_addresses: Vec<Vec<Ipv4Addr>>,
    /// Only one node is traced: a `--node-ip` it does not hold is an error
    /// to report, not someone else's address.
    pub single_node: bool,
}

pub struct TracedNode {
    pub name: Name,
    underlay: u32,
    cni: &'static dyn Backend,
    pub probe: NodeProbe,
    pub interfaces: HashMap<u32, Watched>,
    /// Every link's name, for drops on interfaces that are not watched.
    pub link_names: HashMap<u32, String>,
    /// Its nft tracing table and monitor; removed when dropped.
    netfilter: Option<NodeTrace>,
    pub netns: Namespace,
    /// The inodes of the traced pods' own namespaces behind this node's
    /// veths: a drop in any other namespace is not the pair's, whatever
    /// addresses it holds.
    pub pod_namespaces: Vec<u32>,
    /// Conntrack's counters in its namespace, read again at a drop and at
    /// the end (node mode).
    pub conntrack_stats: Option<ConntrackStats>,
    /// Its WireGuard devices, read again before a story that ends going
    /// into one is told (node mode): a peer's allowed-ips or handshake
    /// may have changed since the start.
    pub wireguard_now: Option<wireguard::Reader>,
}

/// Where the traced source is one of the node's own addresses and the
/// node's route to the destination picks another source (flannel.1's or
/// cni0's address, a route's `src`), what the node starts by itself is
/// not the traced pair: said, so that no one waits for packets traced
/// under an address they never carry. Only the asked direction: a node
/// answers from the address it was asked at.
async fn say_own_source(view: &NodeView, node: &str, asked: Option<&(IpAddr, IpAddr)>) {
    let Some((IpAddr::V4(src), IpAddr::V4(dst))) = asked else {
        return;
    };
    if !view.holds(*src) {
        return;
    }
    if let Ok(Some(picked)) = netlink::source_toward(*dst).await {
        if picked != *src {
            eprintln!("podtrace: note: {node} sends to {dst} from {picked} by default (its route there picks that source), not {src}: only its packets sent from {src} (such as `ping -I {src}`) are this pair; trace {picked} for the rest");
        }
    }
}

impl NodeLinks for TracedNode {
    fn name(&self) -> &Name {
        &self.name
    }
    fn watched(&self, ifindex: u32) -> Option<&Watched> {
        self.interfaces.get(&ifindex)
    }
    fn link_name(&self, ifindex: u32) -> Option<&String> {
        self.link_names.get(&ifindex)
    }
}

/// The traced endpoints, and those of them that run on node `name` (by
/// the API's word, or in one of its local pod subnets).
fn endpoints_here(
    shared: &Shared<'_>,
    name: &str,
    local_pod_subnets: &[ipnet::IpNet],
) -> (Vec<IpAddr>, Vec<IpAddr>) {
    let mut endpoints: Vec<IpAddr> = shared.pairs.iter().map(|(src, _)| *src).collect();
    // A Service's client is in one pair per backend: said once.
    endpoints.sort();
    endpoints.dedup();
    let local: Vec<IpAddr> = endpoints
        .iter()
        .copied()
        .filter(|ip| {
            let runs_here = shared
                .endpoint_nodes
                .iter()
                .any(|(e, node)| e == ip && node == name);
            runs_here || local_pod_subnets.iter().any(|n| n.contains(ip))
        })
        .collect();
    (endpoints, local)
}

impl TracedNode {
    /// Sets up one node: reads it, picks its interfaces, attaches.
    pub async fn trace(id: u32, ns: &Namespace, shared: &Shared<'_>) -> Result<(Self, NodeFacts)> {
        let _entered = ns.path.as_deref().map(netns::enter).transpose()?;
        let view = NodeView::read().await?;
        let identity = Identity::of(&view, ns, shared);
        let name = identity.name.clone();
        say_own_source(&view, &name, shared.pairs.first()).await;
        let cni = cni::detect(&view, identity.annotated_cni);
        let other_nodes: Vec<Ipv4Addr> = (shared.known_nodes.iter())
            .map(|(_, ip)| *ip)
            .filter(|ip| Some(*ip) != identity.node_ip)
            .collect();
        let underlay = find_underlay(&view, id, identity.node_ip, &other_nodes, shared)
            .with_context(|| format!("node {name}"))?;
        let every = select(&view, underlay, cni);
        let local_pod_subnets = interfaces::local_pod_subnets(&view, &every);
        let (endpoints, local) = endpoints_here(shared, &name, &local_pod_subnets);
        let pods = find_pod_interfaces(&view, cni, &endpoints, &local).await;
        let watched = needed(every, &pods.found, &pods.lost, &name);
        let tunnels = TunnelTrust::of(&view, underlay, &other_nodes);
        let spec = ProbeSpec {
            node_id: id,
            netns: ns,
            traced_netns: &shared.traced_netns,
            layout: &shared.kernel.layout,
            btf: shared.btf,
            flows: shared.flows,
            flows6: shared.flows6,
            mode: shared.mode,
            drop_reasons: shared.kernel.features.drop_reasons,
            tunnels: &tunnels,
            ring_bytes: shared.ring_bytes,
            profile: shared.profile,
            shared_stamps: shared.shared_stamps,
            sample: shared.sample,
            filter: shared.l4_filter.as_ref(),
        };
        let probe = NodeProbe::attach(&spec, &watched).with_context(|| format!("node {name}"))?;
        // The subscription socket stays bound to the namespace it was opened in.
        link_watch::watch(id, shared.link_tx.clone())?;
        // Without conntrack, only the Services' translations are known:
        // worth saying, not worth refusing to trace.
        if let Err(e) = conntrack::watch(id, shared.conntrack_tx.clone()) {
            eprintln!("podtrace: {name}: conntrack is not read ({e:#}); translations are known only from the Services");
        }
        let conntrack_stats = ConntrackStats::open(&name)
            .inspect_err(|e| eprintln!("podtrace: {name}: conntrack's counters are not read ({e:#}): its own drops are told as netfilter's"))
            .ok();
        let netfilter = match &shared.netfilter_tx {
            Some(tx) => Some(
                NodeTrace::start(ns, id, &shared.pairs, sent_here(&view), tx.clone())
                    .with_context(|| format!("node {name}"))?,
            ),
            None => None,
        };
        say_wireguard_unread(&name, &view);
        let facts = NodeFacts {
            forwarding: std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
                .map(|v| v.trim() == "1")
                .unwrap_or(true),
            cni: cni.name(),
            inferred_pod_cidr: cni.inferred_pod_cidr(&view),
            local_pod_subnets,
            pod_interfaces: pods.found,
            view: view.clone(),
        };
        let node = Self {
            name: name.into(),
            underlay,
            cni,
            probe,
            interfaces: watched.into_iter().map(|w| (w.index, w)).collect(),
            wireguard_now: wireguard_reader(&view),
            link_names: view.links.into_iter().map(|l| (l.index, l.name)).collect(),
            netfilter,
            netns: ns.clone(),
            pod_namespaces: pods.namespaces,
            conntrack_stats,
        };
        Ok((node, facts))
    }

    /// Traces a new pair of addresses from now on (a pod moved).
    pub fn follow(&mut self, old: &[FlowKey], new: &[FlowKey]) -> Result<()> {
        self.probe.replace_flows(old, new)?;
        let pairs: Vec<_> = (new.iter())
            .map(|k| (IpAddr::from(k.src), IpAddr::from(k.dst)))
            .collect();
        self.follow_rules(&pairs)
    }

    /// Rule tracing for the ICMP errors the node sends, or forwards, to
    /// `sender` about its packets too big for their path: from the first
    /// such packet on (a sender retransmits what a black hole ate).
    pub fn follow_errors_to(&mut self, sender: IpAddr) -> Result<()> {
        match &mut self.netfilter {
            Some(netfilter) => netfilter.follow_errors_to(sender),
            None => Ok(()),
        }
    }

    /// Rule tracing for the pairs `new` (the kernel filter is
    /// `probe.replace_flows`'s).
    pub fn follow_rules(&mut self, pairs: &[(IpAddr, IpAddr)]) -> Result<()> {
        if let Some(netfilter) = &self.netfilter {
            netfilter.follow(pairs)?;
        }
        Ok(())
    }

    /// Watches the veth of a pod the trace learnt of while it ran (a
    /// Service's backend, from conntrack), if the pod is on this node.
    pub async fn watch_pod(&mut self, ip: IpAddr) -> Result<()> {
        let _entered = self.netns.path.as_deref().map(netns::enter).transpose()?;
        let view = NodeView::read().await?;
        let every = select(&view, self.underlay, self.cni);
        let local: Vec<IpAddr> = interfaces::local_pod_subnets(&view, &every)
            .iter()
            .any(|net| net.contains(&ip))
            .then_some(ip)
            .into_iter()
            .collect();
        let pods = find_pod_interfaces(&view, self.cni, &[ip], &local).await;
        self.pod_namespaces.extend(pods.namespaces);
        for (_, name) in pods.found {
            let Some(iface) = every.iter().find(|w| w.name == name) else {
                continue;
            };
            if self.interfaces.contains_key(&iface.index) {
                continue;
            }
            self.probe.attach_interface(iface)?;
            eprintln!("podtrace: {}: {ip} is behind {name}", self.name);
            self.interfaces.insert(iface.index, iface.clone());
        }
        Ok(())
    }

    /// A link appeared or vanished on this node during the trace. Returns
    /// the change in attached hooks, for the summary.
    pub fn link_changed(&mut self, change: LinkChange) -> LinkOutcome {
        match change {
            LinkChange::Added(link) if !self.interfaces.contains_key(&link.index) => {
                self.link_names.insert(link.index, link.name.clone());
                let Some(iface) = watch(&link, &[self.underlay], self.cni) else {
                    return LinkOutcome::Ignored;
                };
                match self.probe.attach_interface(&iface) {
                    Ok(()) => {
                        eprintln!(
                            "podtrace: {}: new interface {}, now traced",
                            self.name, iface.name
                        );
                        self.interfaces.insert(iface.index, iface);
                        LinkOutcome::Added
                    }
                    Err(e) => {
                        eprintln!(
                            "podtrace: {}: new interface {} is not traced: {e:#}",
                            self.name, iface.name
                        );
                        LinkOutcome::Ignored
                    }
                }
            }
            LinkChange::Removed(link) if self.interfaces.contains_key(&link.index) => {
                eprintln!(
                    "podtrace: {}: interface {} vanished during the trace; its hooks went with it",
                    self.name, link.name
                );
                self.interfaces.remove(&link.index);
                LinkOutcome::Vanished
            }
            _ => LinkOutcome::Ignored,
        }
    }

    /// Hooks attached now (two per watched interface).
    pub fn hooks(&self) -> usize {
        self.interfaces.len() * 2
    }

    /// "eth0, cni0, flannel.1, 2 pod veths".
    pub fn watched_list(&self) -> String {
        let mut named: Vec<&Watched> = self
            .interfaces
            .values()
            .filter(|w| w.role != Role::PodVeth)
            .collect();
        named.sort_by_key(|w| w.index);
        let veths = self.interfaces.len() - named.len();
        let mut parts: Vec<String> = named.iter().map(|w| w.name.to_string()).collect();
        parts.push(match veths {
            1 => "1 pod veth".to_string(),
            n => format!("{n} pod veths"),
        });
        parts.join(", ")
    }
}

/// What became of a link change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkOutcome {
    Added,
    Vanished,
    Ignored,
}

/// The underlay of traced node `id`, from its tables and what the other
/// traced namespaces and the traced pairs tell.
fn find_underlay(
    view: &NodeView,
    id: u32,
    node_ip: Option<Ipv4Addr>,
    other_nodes: &[Ipv4Addr],
    shared: &Shared<'_>,
) -> Result<u32> {
    let other_traced: Vec<Ipv4Addr> = (shared.traced_addresses.iter().enumerate())
        .filter(|(other, _)| *other != id as usize)
        .flat_map(|(_, addresses)| addresses.iter().copied())
        .collect();
    let traced: Vec<Ipv4Addr> = (ipv4_pairs(&shared.pairs).into_iter())
        .flat_map(|(src, dst)| [src, dst])
        .collect();
    let clues = interfaces::UnderlayClues {
        node_ip,
        other_nodes,
        other_traced: &other_traced,
        traced: &traced,
    };
    Ok(interfaces::underlay(view, &clues)?.index)
}

/// Each namespace's own addresses, in node id order.
pub async fn addresses_of(namespaces: &[Namespace]) -> Result<Vec<Vec<Ipv4Addr>>> {
    let mut all = Vec::new();
    for ns in namespaces {
        let _entered = ns.path.as_deref().map(netns::enter).transpose()?;
        all.push(NodeView::read().await?.own_addresses().collect());
    }
    Ok(all)
}

/// Who a namespace is in the cluster: its node's name, IP and the CNI its
/// annotations name.
struct Identity {
    name: String,
    node_ip: Option<Ipv4Addr>,
    annotated_cni: Option<&'static str>,
}

impl Identity {
    fn of(view: &NodeView, ns: &Namespace, shared: &Shared<'_>) -> Self {
        // The node is the cluster node whose IP this namespace holds.
        let known = shared
            .known_nodes
            .iter()
            .find(|(_, ip)| view.link_with_address(*ip).is_some())
            .cloned();
        let held = shared
            .node_ips
            .iter()
            .copied()
            .find(|ip| view.link_with_address(*ip).is_some());
        let only_given = match shared.node_ips {
            [ip] if shared.single_node => Some(*ip),
            _ => None,
        };
        let node_ip = held.or(known.as_ref().map(|(_, ip)| *ip)).or(only_given);
        let known6 = (shared.known_nodes6.iter())
            .find(|(_, ip)| view.link_with_address(*ip).is_some())
            .map(|(name, _)| name.clone());
        let known_name = known.as_ref().map(|(name, _)| name.clone()).or(known6);
        let name = match (known_name, ns.arg.as_deref()) {
            (Some(name), _) => name,
            (None, Some(arg)) => arg.rsplit('/').next().unwrap_or(arg).to_string(),
            (None, None) => hostname(),
        };
        let annotated_cni = shared
            .subnets
            .iter()
            .find(|s| s.node == name)
            .and_then(|s| s.cni);
        Self {
            name,
            node_ip,
            annotated_cni,
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this-node".into())
}

/// What tells the rule tracer a packet was sent by the node itself.
fn sent_here(view: &NodeView) -> SentHere {
    SentHere {
        own_addresses: (view.own_addresses().map(IpAddr::V4))
            .chain(view.addresses6.iter().map(|(_, ip)| IpAddr::V6(*ip)))
            .collect(),
        // kube-proxy's IPVS mode holds its Service addresses there.
        ipvs: view.link_named("kube-ipvs0").is_some(),
    }
}

/// A reader of the node's WireGuard devices, opened in its namespace
/// (entered by the caller); none where it has none, or where reading
/// failed at start (already said).
fn wireguard_reader(view: &NodeView) -> Option<wireguard::Reader> {
    if view.wireguard.unread.is_some() {
        return None;
    }
    let devices: Vec<(u32, &str, bool)> = (view.wireguard.devices.iter())
        .map(|d| (d.index, d.name.as_str(), d.up))
        .collect();
    (!devices.is_empty())
        .then(|| wireguard::Reader::open(&devices).ok())
        .flatten()
}

/// Said at start where the node's WireGuard state could not be read
/// (no CAP_NET_ADMIN): the trace goes on without it.
fn say_wireguard_unread(node: &str, view: &NodeView) {
    if let Some(why) = &view.wireguard.unread {
        eprintln!("podtrace: {node}: WireGuard's state is not read ({why}): a packet lost past its WireGuard device is told without it");
    }
}
