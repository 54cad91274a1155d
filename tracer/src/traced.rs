//! The traced nodes: setting each one up (its view, interfaces, probe and
//! link watch), following its interface changes, and placing raw sightings
//! on its interfaces as hops.

use std::{collections::HashMap, net::Ipv4Addr, os::unix::fs::MetadataExt, path::Path};

use anyhow::{Context as _, Result};
use podtrace_common::{
    match_kind, sighting_kind, Direction as KernelDirection, FlowKey, KernelLayout, Sighting,
    FIB_NOT_LOOKED_UP, MAX_NODES, NODE_OTHER_NETNS,
};
use tokio::sync::mpsc;

use crate::{
    btf::Btf,
    decode,
    drops::{kernel_layout, ReasonNames, Symbols},
    explain::NodeFacts,
    interfaces::{self, Role, Watched},
    journey::{Direction, DropInfo, Hop, KernelRoute},
    link_watch::{self, LinkChange},
    netfilter::{NodeTrace, TracedDrop},
    netns,
    node::NodeView,
    render::Summary,
    sightings::{AttachMode, NodeProbe, ProbeSpec},
    story::Context,
};

/// What the running kernel says about itself, read once.
pub struct Kernel {
    pub layout: KernelLayout,
    pub reasons: ReasonNames,
    pub symbols: Symbols,
}

impl Kernel {
    pub fn read() -> Result<Self> {
        let btf = Btf::from_sys_fs()?;
        Ok(Self {
            layout: kernel_layout(&btf)?,
            reasons: ReasonNames::from_btf(&btf)?,
            symbols: Symbols::from_kallsyms()?,
        })
    }

    /// The kernel's BTF as aya loads BTF-typed programs with it; only
    /// needed while attaching (it is large: drop it after).
    pub fn typed_btf() -> Result<aya::Btf> {
        aya::Btf::from_sys_fs().context("aya cannot read the kernel's BTF")
    }
}

/// Settings every node shares.
pub struct Shared<'a> {
    pub kernel: &'a Kernel,
    pub btf: &'a aya::Btf,
    /// Node names and IPs of the cluster, to tell which node a namespace is.
    pub known_nodes: &'a [(String, Ipv4Addr)],
    pub flows: &'a [FlowKey],
    pub traced_netns: [u32; MAX_NODES],
    pub node_ip: Option<Ipv4Addr>,
    pub mode: AttachMode,
    pub link_tx: mpsc::UnboundedSender<(u32, LinkChange)>,
    /// Where netfilter drops go, when rule tracing is on.
    pub netfilter_tx: Option<mpsc::UnboundedSender<(u32, TracedDrop)>>,
    /// The traced address pairs, both directions.
    pub pairs: Vec<(Ipv4Addr, Ipv4Addr)>,
}

/// The namespaces to trace: each `--netns`, or podtrace's own.
pub struct Namespace {
    pub arg: Option<String>,
    pub inum: u32,
}

impl Namespace {
    pub fn all(args: &[String]) -> Result<Vec<Self>> {
        if args.len() > MAX_NODES {
            anyhow::bail!("at most {MAX_NODES} --netns in one trace");
        }
        if args.is_empty() {
            return Ok(vec![Self {
                arg: None,
                inum: inode(Path::new("/proc/thread-self/ns/net"))?,
            }]);
        }
        args.iter()
            .map(|arg| {
                let path = netns::resolve(arg);
                let inum = inode(&path).with_context(|| {
                    format!("network namespace {} does not exist", path.display())
                })?;
                Ok(Self {
                    arg: Some(arg.clone()),
                    inum,
                })
            })
            .collect()
    }
}

fn inode(path: &Path) -> Result<u32> {
    Ok(std::fs::metadata(path)?.ino() as u32)
}

pub struct TracedNode {
    pub name: String,
    underlay: u32,
    pub probe: NodeProbe,
    pub interfaces: HashMap<u32, Watched>,
    /// Every link's name, for drops on interfaces that are not watched.
    link_names: HashMap<u32, String>,
    /// Its nft tracing table and monitor; removed when dropped.
    netfilter: Option<NodeTrace>,
}

impl TracedNode {
    /// Sets up one node: reads it, picks its interfaces, attaches.
    pub async fn trace(
        id: u32,
        ns: &Namespace,
        shared: &Shared<'_>,
        ctx: &mut Context,
    ) -> Result<Self> {
        let netns_path = ns.arg.as_deref().map(netns::resolve);
        let _entered = netns_path.as_deref().map(netns::enter).transpose()?;
        let view = NodeView::read().await?;
        // The node is the cluster node whose IP this namespace holds.
        let known = shared
            .known_nodes
            .iter()
            .find(|(_, ip)| view.link_with_address(*ip).is_some())
            .cloned();
        let node_ip = shared.node_ip.or(known.as_ref().map(|(_, ip)| *ip));
        let name = match (&known, ns.arg.as_deref()) {
            (Some((name, _)), _) => name.clone(),
            (None, Some(arg)) => arg.rsplit('/').next().unwrap_or(arg).to_string(),
            (None, None) => hostname(),
        };
        let watched = interfaces::select(&view, node_ip).with_context(|| format!("node {name}"))?;
        let mut endpoints: Vec<Ipv4Addr> = shared.pairs.iter().map(|(src, _)| *src).collect();
        endpoints.dedup();
        for ip in endpoints {
            if let Some(link) = view.pod_interface(ip) {
                eprintln!(
                    "podtrace: {name}: {} is behind {}",
                    ctx.label(ip),
                    link.name
                );
            }
        }
        for route in &view.routes {
            let delivers_locally = route
                .oif
                .and_then(|oif| watched.iter().find(|w| w.index == oif))
                .is_some_and(|w| matches!(w.role, Role::Bridge | Role::PodVeth));
            if delivers_locally && route.destination.prefix_len() > 0 && route.gateway.is_none() {
                ctx.traced_destinations.push(route.destination);
            }
        }
        let spec = ProbeSpec {
            node_id: id,
            netns: netns_path.as_deref(),
            netns_inum: ns.inum,
            traced_netns: &shared.traced_netns,
            layout: &shared.kernel.layout,
            btf: shared.btf,
            flows: shared.flows,
            mode: shared.mode,
        };
        let probe = NodeProbe::attach(&spec, &watched).with_context(|| format!("node {name}"))?;
        // The subscription socket stays bound to the namespace it was opened in.
        link_watch::watch(id, shared.link_tx.clone())?;
        let netfilter = match &shared.netfilter_tx {
            Some(tx) => Some(
                NodeTrace::start(netns_path.as_deref(), id, &shared.pairs, tx.clone())
                    .with_context(|| format!("node {name}"))?,
            ),
            None => None,
        };
        let forwarding = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .map(|v| v.trim() == "1")
            .unwrap_or(true);
        ctx.nodes.insert(
            name.clone(),
            NodeFacts {
                view: view.clone(),
                forwarding,
            },
        );
        let underlay = watched
            .iter()
            .find(|w| w.role == Role::Underlay)
            .map_or(0, |w| w.index);
        Ok(Self {
            name,
            underlay,
            probe,
            interfaces: watched.into_iter().map(|w| (w.index, w)).collect(),
            link_names: view.links.into_iter().map(|l| (l.index, l.name)).collect(),
            netfilter,
        })
    }

    /// Traces a new pair of addresses from now on (a pod moved).
    pub fn follow(&mut self, old: &[FlowKey], new: &[FlowKey]) -> Result<()> {
        self.probe.replace_flows(old, new)?;
        if let Some(netfilter) = &self.netfilter {
            let pairs: Vec<_> = new
                .iter()
                .map(|k| (Ipv4Addr::from(k.src), Ipv4Addr::from(k.dst)))
                .collect();
            netfilter.follow(&pairs)?;
        }
        Ok(())
    }

    /// A link appeared or vanished on this node during the trace.
    pub fn link_changed(&mut self, change: LinkChange, summary: &mut Summary) {
        match change {
            LinkChange::Added(link) if !self.interfaces.contains_key(&link.index) => {
                self.link_names.insert(link.index, link.name.clone());
                let Some(iface) = interfaces::watch(&link, self.underlay) else {
                    return;
                };
                match self.probe.attach_interface(&iface) {
                    Ok(()) => {
                        eprintln!(
                            "podtrace: {}: new interface {}, now traced",
                            self.name, iface.name
                        );
                        summary.interfaces_added += 1;
                        self.interfaces.insert(iface.index, iface);
                    }
                    Err(e) => eprintln!(
                        "podtrace: {}: new interface {} is not traced: {e:#}",
                        self.name, iface.name
                    ),
                }
            }
            LinkChange::Removed(link) if self.interfaces.contains_key(&link.index) => {
                eprintln!(
                    "podtrace: {}: interface {} vanished during the trace; its hooks went with it",
                    self.name, link.name
                );
                summary.interfaces_vanished += 1;
            }
            _ => {}
        }
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
        let mut parts: Vec<String> = named.iter().map(|w| w.name.clone()).collect();
        parts.push(format!("{veths} pod veths"));
        parts.join(", ")
    }
}

/// Turns a raw sighting into a hop on a known node and interface.
pub fn place(
    s: &Sighting,
    nodes: &[TracedNode],
    kernel: &Kernel,
    summary: &mut Summary,
) -> Option<Hop> {
    let is_drop = s.kind == sighting_kind::DROP;
    let node = if s.node_id == NODE_OTHER_NETNS {
        None
    } else {
        Some(nodes.get(s.node_id as usize)?)
    };
    let watched = node.and_then(|n| n.interfaces.get(&s.ifindex));
    let (iface, role) = match (watched, node) {
        (Some(w), _) => (w.name.clone(), w.role),
        // A drop may happen anywhere: name the interface as best we can.
        (None, _) if is_drop => {
            let name = node.and_then(|n| n.link_names.get(&s.ifindex).cloned());
            (
                name.unwrap_or_else(|| {
                    if s.ifindex == 0 {
                        "-".into()
                    } else {
                        format!("if{}", s.ifindex)
                    }
                }),
                Role::Other,
            )
        }
        (None, _) => {
            summary.unknown_interface += 1;
            return None;
        }
    };
    let snapshot = &s.snapshot[..usize::from(s.snapshot_len).min(s.snapshot.len())];
    let Ok(packet) = decode::decode(snapshot, s.has_l2 != 0) else {
        summary.undecodable += 1;
        return None;
    };
    let (direction, drop) = if is_drop {
        let info = DropInfo {
            reason: kernel.reasons.name(s.reason),
            location: kernel.symbols.name(s.location),
            by_socket: s.match_kind == match_kind::SOCKET,
        };
        (Direction::Drop, Some(info))
    } else if s.direction == KernelDirection::Egress as u8 {
        (Direction::Egress, None)
    } else {
        (Direction::Ingress, None)
    };
    let route = (s.fib_result != FIB_NOT_LOOKED_UP).then(|| {
        let route = KernelRoute {
            result: KernelRoute::result_name(s.fib_result),
            dev: None,
            via: None,
        };
        if !route.found() {
            return route;
        }
        let dev = node.and_then(|n| n.link_names.get(&s.fib_ifindex).cloned());
        let via = Ipv4Addr::from(s.fib_nexthop);
        KernelRoute {
            dev,
            via: (via != packet.packet.dst).then_some(via),
            ..route
        }
    });
    Some(Hop {
        ktime_ns: s.ktime_ns,
        node: node.map_or_else(|| netns_name(s.netns_inum), |n| n.name.clone()),
        iface,
        role,
        direction,
        skb_len: s.skb_len,
        mark: s.mark,
        packet,
        drop,
        route,
    })
}

/// A namespace no traced node owns: its `ip netns` name if it has one.
fn netns_name(inum: u32) -> String {
    let named = std::fs::read_dir("/run/netns").ok().and_then(|dir| {
        dir.flatten()
            .find(|e| e.metadata().is_ok_and(|m| m.ino() as u32 == inum))
            .map(|e| e.file_name().to_string_lossy().into_owned())
    });
    match named {
        Some(name) => format!("netns {name}"),
        None => format!("netns {inum}"),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this-node".into())
}
